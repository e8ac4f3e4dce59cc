"""The client side of the wire contract: frame decoding and the reference state model.

:func:`decode_server_frame` turns a server frame's text into typed structs;
:class:`Reducer` turns those frames into one session's state (PROTOCOL
sections 3-8). Both are sans-IO, so a terminal UI, the benchmarks and the tests
share them whatever transport they use.
"""

from gateway.client.codec import decode_server_frame
from gateway.client.reducer import (
    Reducer,
    StreamingBlock,
    StreamingMessage,
    ToolOutcome,
    TurnState,
)

__all__ = [
    "Reducer",
    "StreamingBlock",
    "StreamingMessage",
    "ToolOutcome",
    "TurnState",
    "decode_server_frame",
]

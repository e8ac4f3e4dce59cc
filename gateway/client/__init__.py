"""The client side of the wire contract: the client library, the reference state model, the codec.

- :class:`GatewayClient` (:mod:`gateway.client.api`): the HTTP API of
  docs/protocol.md §2, and :meth:`~GatewayClient.open_session`, a
  :class:`Session` whose state is kept for you as its stream arrives.
- :mod:`gateway.client.files`: a session's files (``GatewayClient.upload``,
  ``download``) and the blocks a turn names them by (:func:`file_block`,
  :func:`image_block`, :func:`document_block`).
- :class:`Subscription` (:mod:`gateway.client.stream`): one session's frames,
  resumed after every drop, answered pings, missed pongs noticed (section 3).
- :class:`Reducer` (:mod:`gateway.client.reducer`): server frames in, one
  session's state out (sections 3-8); :func:`decode_server_frame`
  (:mod:`gateway.client.codec`): a frame's text into typed structs. Both are
  sans-IO, so a terminal UI, the benchmarks and the tests share them whatever
  transport they use.
- ``gateway attach`` and ``gateway chat`` (:mod:`gateway.client.attach`,
  :mod:`gateway.client.chat`) are built on the library.
"""

from gateway.client.api import (
    AgentInfo,
    AgentList,
    Chunk,
    GatewayClient,
    Session,
    ToolRun,
    Update,
)
from gateway.client.codec import decode_server_frame
from gateway.client.files import document_block, file_block, image_block
from gateway.client.reducer import (
    Reducer,
    StreamingBlock,
    StreamingMessage,
    ToolOutcome,
    TurnState,
)
from gateway.client.stream import Backoff, Heartbeat, Notice, Received, Subscription
from gateway.protocol.http import (
    FileStored,
    MessagePage,
    SessionAttach,
    SessionCreated,
    SessionList,
    SessionListing,
    TurnAccepted,
)

__all__ = [
    "AgentInfo",
    "AgentList",
    "Backoff",
    "Chunk",
    "FileStored",
    "GatewayClient",
    "Heartbeat",
    "MessagePage",
    "Notice",
    "Received",
    "Reducer",
    "Session",
    "SessionAttach",
    "SessionCreated",
    "SessionList",
    "SessionListing",
    "StreamingBlock",
    "StreamingMessage",
    "Subscription",
    "ToolOutcome",
    "ToolRun",
    "TurnAccepted",
    "TurnState",
    "Update",
    "decode_server_frame",
    "document_block",
    "file_block",
    "image_block",
]

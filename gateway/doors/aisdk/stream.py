"""One AI SDK chat response, fed from the session's hub like any client (docs/doors/aisdk.md).

The response's subscriber (:class:`ResponseSubscriber`, a
:class:`~gateway.doors.oneway.OneWayQueue`: the seam, the bound of
``[stream] queue_max_events`` and the slow-client rule, as every client of a
session has) is subscribed before the turn is submitted or its approvals
decided, or with a replay of the turn from its start, so no event of the turn
is missed. :func:`respond` writes the response through the one-way streams'
:func:`~gateway.doors.oneway.pump`: its ``start``, then what the response's
:class:`~gateway.doors.aisdk.mapping.ChatMapper` makes of what arrives
(:class:`ChatReader`), encoded for the transport: server-sent events
(:func:`sse`, the ``DefaultChatTransport``'s stream) or the WebSocket's
``chunk`` frames (gateway.doors.aisdk.ws). The stream going away ends this writer
only: the turn is never cancelled by it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

from gateway.doors.aisdk import chunks as ui
from gateway.doors.aisdk.mapping import ChatMapper
from gateway.doors.oneway import (
    OneWayQueue,
    Send,
    TypedReader,
    close_named,
    direct_reader,
    pump,
)
from gateway.protocol.events import Envelope

DONE = b"data: [DONE]\n\n"
"""The end of a UI message stream over SSE."""

HEADERS = [("x-vercel-ai-ui-message-stream", "v1")]
"""What marks a response as a UI message stream (the ``ai`` package's own header)."""

Encode = Callable[[list[ui.Chunk]], bytes]
"""Chunks as the transport's bytes (:func:`sse`, or the WebSocket's frames)."""


class ResponseSubscriber(OneWayQueue):
    """An AI SDK response's side of the hub and the seam (module docstring): ``aisdk-N``."""

    queue_name = "AI SDK response queue"
    closes_how = "ending the response"
    prefix = "aisdk"
    left_as = "response_finished"


def sse(chunks: Iterable[ui.Chunk]) -> bytes:
    """``data: JSON`` blocks, one per chunk."""
    return b"".join(b"data: " + ui.encode(c) + b"\n\n" for c in chunks)


class ChatReader(TypedReader):
    """The response's part of the pump: the events through its mapper, encoded.

    A queue closed for another reason than slowness (the session deleted, this
    node no longer its owner's relay) ends the response with an ``error``
    chunk naming the close (``session_deleted: The session was deleted.``),
    and ``finish``.
    """

    def __init__(self, mapper: ChatMapper, encode: Encode) -> None:
        self.mapper = mapper
        self.encode = encode

    @property
    def finished(self) -> bool:
        return self.mapper.finished

    def events(self, events: list[Envelope[Any]], replayed: bool) -> bytes:
        return self.encode([c for event in events for c in self.mapper.receive(event)])

    def pause(self) -> bytes:
        return self.encode(self.mapper.pause())

    def closed(self, code: str | None) -> bytes:
        name, message = close_named(code)
        return self.encode(self.mapper.closed(f"{name}: {message}"))


async def respond(
    sub: ResponseSubscriber,
    mapper: ChatMapper,
    encode: Encode,
    send: Send,
    idle_s: float = math.inf,
    error: str | None = None,
) -> None:
    """The response: ``start``, then its chunks until it finishes (module docstring).

    ``idle_s`` without a write sends the SSE heartbeat. With ``error`` (the
    turn cannot be streamed) the response ends at once, saying so.

    Raises:
        SlowClient: the response's queue overflowed (the slow-client rule).
        trio.BrokenResourceError: the client went away (the turn goes on).
    """
    opening = encode(mapper.start())
    if error is None:
        reader = direct_reader(sub, ChatReader(mapper, encode), send)
        await pump(sub, reader, send, idle_s, opening)
        return
    await send(opening)
    await send(encode(mapper.closed(error)))

"""One AI SDK chat response, fed from the session's hub like any client (docs/protocol.md §14).

The response's subscriber (:class:`ResponseSubscriber`, an AG-UI run's
:class:`~gateway.agui.sse.RunSubscriber` under its own name: the
seam, the bound of ``[stream] queue_max_events`` and the slow-client rule, as
every client of a session has) is subscribed before the turn is submitted or
its approvals decided, or with a replay of the turn from its start, so no
event of the turn is missed. :func:`pump` maps what arrives with the
response's :class:`~gateway.aisdk.mapping.ChatMapper` and hands the chunks to
the transport: server-sent events (:func:`sse`, the ``DefaultChatTransport``'s
stream) or the WebSocket's ``chunk`` frames (gateway.aisdk.ws). The stream
going away ends this writer only: the turn is never cancelled by it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable

import trio

from gateway.doors.agui.sse import RunSubscriber, SlowClient
from gateway.doors.aisdk import chunks as ui
from gateway.doors.aisdk.mapping import ChatMapper
from gateway.protocol.closes import CLOSES
from gateway.session.hub import FrameBatch
from gateway.session.seam import Gate

PING = b": ping\n\n"
"""The heartbeat of an idle SSE response: a comment, which every SSE parser skips."""

DONE = b"data: [DONE]\n\n"
"""The end of a UI message stream over SSE."""

HEADERS = [("x-vercel-ai-ui-message-stream", "v1")]
"""What marks a response as a UI message stream (the ``ai`` package's own header)."""


class ResponseSubscriber(RunSubscriber):
    """An AI SDK response's side of the hub and the seam (module docstring): ``aisdk-N``."""

    queue_name = "AI SDK response queue"
    closes_how = "ending the response"
    prefix = "aisdk"


def sse(chunks: Iterable[ui.Chunk]) -> bytes:
    """``data: JSON`` blocks, one per chunk."""
    return b"".join(b"data: " + ui.encode(c) + b"\n\n" for c in chunks)


Emit = Callable[[list[ui.Chunk]], Awaitable[None]]


async def pump(
    sub: RunSubscriber,
    mapper: ChatMapper,
    emit: Emit,
    idle: Callable[[], Awaitable[None]] | None = None,
    idle_s: float = 15.0,
) -> None:
    """Map the response's events until it finishes (module docstring).

    ``idle`` is called after ``idle_s`` without a chunk (the SSE heartbeat).

    A response whose queue is closed for another reason than its slowness (its
    session deleted, or this node no longer its owner's relay) ends with an
    ``error`` chunk naming the close, and ``finish``.

    Raises:
        SlowClient: the response's queue overflowed (the slow-client rule).
        trio.BrokenResourceError: the client went away (the turn goes on).
    """
    try:
        while not mapper.finished:
            item: FrameBatch | Gate | None = None
            with trio.move_on_after(idle_s if idle is not None else float("inf")):
                try:
                    item = await sub.rx.receive()
                except trio.EndOfChannel:
                    await _closed(sub, mapper, emit)
                    return
            if item is None:
                assert idle is not None
                await idle()
                continue
            out: list[ui.Chunk] = []
            for events, _ in await sub.drain(item):
                for event in events:
                    out += mapper.receive(event)
            out += mapper.pause()
            if sub.too_slow:
                raise SlowClient("the AI SDK response's queue overflowed")
            if out:
                await emit(out)
    finally:
        if sub.subscribed:
            sub.leave("response_finished" if mapper.finished else "client_closed")


async def _closed(sub: RunSubscriber, mapper: ChatMapper, emit: Emit) -> None:
    """The response's queue was closed: too slow, or the session went (deleted, moved).

    Too slow is the slow-client rule (the transport closes the connection);
    any other close ends the response with an ``error`` chunk naming it
    (``session_deleted: The session was deleted.``) and ``finish``.
    """
    code = sub.closing or "internal_error"
    if code == "client_too_slow":
        raise SlowClient("the AI SDK response's queue overflowed")
    close = CLOSES.get(code)
    await emit(mapper.closed(f"{code}: {close.message if close else code}"))

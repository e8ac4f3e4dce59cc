"""One AG-UI run's SSE stream, fed from the session's hub like any client (issue 14).

The run's :class:`RunSubscriber` goes through the seam
(:func:`gateway.session.seam.subscribe`, live mode) *before* the turn is
submitted or resumed, so no event of the turn is missed, and gets the same
shared batches every WebSocket client gets, into one bounded queue
(``[stream] queue_max_events``). Enqueueing never blocks the session: a
batch that would overflow the bound applies the slow-client rule as for a
WebSocket (``bus.handler_warning``, unsubscribed) and the SSE stream is cut
(the turn goes on; the client can watch it on the gateway's own stream).

:func:`stream_run` writes the run: the opening events, then each event the
:class:`~gateway.agui.mapping.RunMapper` makes of what arrives, a ``: ping``
comment after ``ping_interval_s`` without a write (so proxies keep an idle
stream open), until the run has finished. The HTTP connection dropping
ends this writer only: the turn is never cancelled by it.
"""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable, Iterable

import trio

from gateway.agui import shapes as ag
from gateway.agui.mapping import RunMapper
from gateway.client.codec import decode_server_frame
from gateway.ids import now_ms
from gateway.protocol.frames import EventFrame
from gateway.session.hub import FrameBatch, Group
from gateway.session.seam import Gate
from gateway.session.session import Session

PING = b": ping\n\n"
"""The heartbeat: an SSE comment, which every SSE parser skips."""

_names = itertools.count(1)


class SlowClient(trio.BrokenResourceError):
    """The run's queue overflowed: the transport closes the connection (module docstring)."""


class RunSubscriber:
    """A run's side of the hub and the seam: its bounded queue (module docstring).

    Args:
        session: the session (the thread).
        max_events: the bound (``[stream] queue_max_events``).
    """

    def __init__(self, session: Session, max_events: int) -> None:
        self.session = session
        self.name = f"agui-{next(_names)}"
        self.max_events = max_events
        self.queued = 0
        self.subscribed = False
        self.too_slow = False
        self._tx, self.rx = trio.open_memory_channel[FrameBatch | Gate](max_events + 16)
        self.cut = 0  # the seam's cut, once the gate opened (live: 0)

    # the seam's side (SeamSubscriber)

    def enqueue(self, item: Gate) -> None:
        self._tx.send_nowait(item)

    def registered(self, group: Group | None) -> None:
        self.subscribed = group is not None

    # the hub's side (Subscriber)

    def deliver(self, batch: FrameBatch, now: float) -> bool:
        if self.too_slow:
            return True  # already cut: nothing more is kept
        if self.queued and self.queued + batch.n > self.max_events:
            return False
        try:
            self._tx.send_nowait(batch)
        except trio.WouldBlock:
            return False
        self.queued += batch.n
        return True

    def deliver_short(self, batch: FrameBatch, sent: int, now: float) -> bool:
        return self.deliver(batch, now)  # never direct: the hub always delivers

    def overflowed(self) -> None:
        """The slow-client rule (PROTOCOL section 3), as a WebSocket's, once."""
        if self.too_slow:
            return
        self.too_slow = True
        self.session.hub.unsubscribe(self)
        self.subscribed = False
        self._tx.close()
        self.session.warn(
            self.name,
            "client_too_slow",
            f"AG-UI run queue exceeded queue_max_events={self.max_events}; closing the stream",
        )

    def request_close(self, code: str) -> None:
        """End the run's stream now (this node lost the session's live feed: gateway.cluster)."""
        self.session.hub.unsubscribe(self)
        self.subscribed = False
        self._tx.close()

    def leave(self, reason: str) -> None:
        """Off the hub, however the run ended (``bus.subscriber_unregistered``)."""
        self.subscribed = False
        self.session.unregistered(self, reason)

    def events(self, batch: FrameBatch) -> Iterable[EventFrame]:
        """The events of a batch above the cut, decoded with the client codec."""
        for frame, seq in zip(batch.frames, batch.seqs, strict=True):
            if seq <= self.cut:
                continue
            decoded = decode_server_frame(_payload(frame))
            if isinstance(decoded, EventFrame):
                yield decoded


def _payload(frame: bytes) -> bytes:
    """The JSON of a server-to-client text frame (unmasked; RFC 6455 section 5.2)."""
    size = frame[1] & 0x7F
    return frame[2 if size < 126 else 4 if size == 126 else 10 :]


def sse(events: Iterable[ag.AguiEvent]) -> bytes:
    """``data: JSON`` blocks, one per event (the AG-UI HTTP transport's SSE encoding)."""
    return b"".join(b"data: " + ag.encode(e) + b"\n\n" for e in events)


async def stream_run(
    sub: RunSubscriber,
    mapper: RunMapper,
    opening: list[ag.AguiEvent],
    send: Callable[[bytes], Awaitable[None]],
    ping_interval_s: float,
) -> None:
    """Write one run until it finishes (module docstring).

    Raises:
        SlowClient: the queue overflowed.
        trio.BrokenResourceError: the client went away (the turn goes on).
    """
    try:
        await send(sse(opening))
        while not mapper.finished:
            item: FrameBatch | Gate | None = None
            with trio.move_on_after(ping_interval_s):
                try:
                    item = await sub.rx.receive()
                except trio.EndOfChannel:
                    raise SlowClient("the AG-UI run's queue overflowed") from None
            if item is None:
                await send(PING)
                continue
            out: list[ag.AguiEvent] = []
            while item is not None:
                if isinstance(item, Gate):
                    await item.ready.wait()
                    sub.cut = item.cut
                else:
                    sub.queued -= item.n
                    for frame in sub.events(item):
                        out += mapper.receive(frame.event)
                try:
                    item = sub.rx.receive_nowait()
                except (trio.WouldBlock, trio.EndOfChannel):
                    item = None
            out += mapper.pause(now_ms())
            if sub.too_slow:
                raise SlowClient("the AG-UI run's queue overflowed")
            if out:
                await send(sse(out))
    finally:
        if sub.subscribed:
            sub.leave("run_finished" if mapper.finished else "client_closed")

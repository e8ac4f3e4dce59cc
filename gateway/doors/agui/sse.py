"""One AG-UI run's SSE stream, fed from the session's hub like any client.

The run's :class:`RunSubscriber` goes through the seam
(:func:`gateway.session.seam.subscribe`, live mode) *before* the turn is
submitted or resumed, so no event of the turn is missed, and gets the same
shared batches every WebSocket client gets, through the same bounded
:class:`~gateway.session.delivery.DeliveryQueue` (``[stream]
queue_max_events``). Enqueueing never blocks the session: a batch that would
overflow the bound applies the slow-client rule as for a WebSocket (counted,
logged, ``bus.handler_warning``, unsubscribed) and the SSE stream is cut (the
turn goes on; the client can watch it on the gateway's own stream).

:func:`stream_run` writes the run: the opening events, then each event the
:class:`~gateway.agui.mapping.RunMapper` makes of what arrives (each event's
JSON as the session emitted it, read into its payload struct: never the
WebSocket frames), a ``: ping`` comment after ``ping_interval_s`` without a
write (so proxies keep an idle stream open), until the run has finished. The
HTTP connection dropping ends this writer only: the turn is never cancelled
by it.
"""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import msgspec
import trio

from gateway.config import StreamConfig
from gateway.doors.agui import shapes as ag
from gateway.doors.agui.resume import RunFeed, Tagged, event_id
from gateway.ids import now_ms
from gateway.logs import client_label
from gateway.metrics import Metrics
from gateway.protocol.closes import CLOSES
from gateway.protocol.events import EVENT_TYPES, Envelope
from gateway.session.delivery import DeliveryQueue
from gateway.session.hub import Emitted, FrameBatch
from gateway.session.seam import Gate, past_cut
from gateway.session.session import Session

PING = b": ping\n\n"
"""The heartbeat: an SSE comment, which every SSE parser skips."""

_names = itertools.count(1)

# Each event type's envelope, its payload read into the type's struct.
_decoders: dict[str, msgspec.json.Decoder[Envelope[Any]]] = {
    type_: msgspec.json.Decoder(Envelope[spec.payload])  # type: ignore[name-defined]
    for type_, spec in EVENT_TYPES.items()
}


class SlowClient(trio.BrokenResourceError):
    """The run's queue overflowed: the transport closes the connection (module docstring)."""


class RunSubscriber(DeliveryQueue[Gate]):
    """A run's side of the hub and the seam: its delivery queue (module docstring).

    Args:
        session: the session (the thread).
        config: ``[stream]`` (the bound: ``queue_max_events``).
        metrics: where queue depths and slow clients are counted.
        address: the client's address, for the log (``host:port``; empty if unknown).
    """

    queue_name = "AG-UI run queue"
    closes_how = "closing the stream"
    prefix = "agui"  # its subscription's name: agui-N
    close_code = None  # no WebSocket: the HTTP connection is closed

    def __init__(
        self, session: Session, config: StreamConfig, metrics: Metrics, address: str = ""
    ) -> None:
        name = f"{self.prefix}-{next(_names)}"
        super().__init__(
            session, name, config.queue_max_events, metrics, client=client_label(name, address)
        )
        self._open()
        assert self._rx is not None
        self.rx = self._rx  # the stream's end of the queue (stream_run)
        self.cut = 0  # the seam's cut, once the gate opened (live: 0)

    @property
    def too_slow(self) -> bool:
        """The slow-client rule cut this run."""
        return self.closing == "client_too_slow"

    def request_close(self, code: str) -> None:
        """End the run's stream: too slow, deleted, or this node lost the session's feed."""
        self.end_stream(code)

    def leave(self, reason: str) -> None:
        """Off the hub, however the run ended (``bus.subscriber_unregistered``)."""
        self.subscribed = False
        self.session.unregistered(self, reason)

    def take(self, batch: FrameBatch) -> list[Envelope[Any]]:
        """Take a batch off the queue: its events above the seam's cut, read."""
        self.taken(batch.n)
        live = past_cut(batch, self.cut)
        return [] if live is None else [e for e in map(_read, live.events) if e is not None]

    async def drain(self, item: FrameBatch | Gate) -> list[tuple[list[Envelope[Any]], bool]]:
        """``item`` and everything queued behind it, read: each piece's events, and
        whether the seam replayed them (a gate, waited for; its cut kept) or they are live."""
        pieces: list[tuple[list[Envelope[Any]], bool]] = []
        queued: FrameBatch | Gate | None = item
        while queued is not None:
            if isinstance(queued, Gate):
                await queued.ready.wait()
                self.cut = queued.cut
                pieces.append((self.replayed(queued), True))
            else:
                pieces.append((self.take(queued), False))
            try:
                queued = self.rx.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel):
                queued = None
        return pieces

    def replayed(self, gate: Gate) -> list[Envelope[Any]]:
        """The events of a replay the seam put in the gate (its WebSocket frames, read back)."""
        out: list[Envelope[Any]] = []
        for payload in _frames(gate.payload):
            if payload.startswith(EVENT_FRAME_HEAD):
                data = payload[len(EVENT_FRAME_HEAD) : -1]
                decoder = _decoders.get(_typed.decode(data).type)
                if decoder is not None:
                    out.append(decoder.decode(data))
        return out


EVENT_FRAME_HEAD = b'{"type":"event","event":'
"""How an event frame begins (gateway.protocol.framing.event_frame splices the event after it)."""


class _Typed(msgspec.Struct):
    type: str


_typed = msgspec.json.Decoder(_Typed)


def _frames(data: bytes) -> list[bytes]:
    """The payloads of unmasked WebSocket text frames laid end to end (RFC 6455 section 5.2)."""
    out: list[bytes] = []
    at = 0
    while at < len(data):
        size, at = data[at + 1] & 0x7F, at + 2
        if size == 126:
            size, at = int.from_bytes(data[at : at + 2]), at + 2
        elif size == 127:
            size, at = int.from_bytes(data[at : at + 8]), at + 8
        out.append(data[at : at + size])
        at += size
    return out


def _read(emitted: Emitted) -> Envelope[Any] | None:
    """An event's JSON, its payload in its type's struct (None: a type this node lacks)."""
    decoder = _decoders.get(emitted.type)
    return None if decoder is None else decoder.decode(emitted.data)


def sse(events: Iterable[ag.AguiEvent]) -> bytes:
    """``data: JSON`` blocks, one per event (the AG-UI HTTP transport's SSE encoding)."""
    return b"".join(b"data: " + ag.encode(e) + b"\n\n" for e in events)


def tagged_sse(events: Iterable[Tagged]) -> bytes:
    """Each event with its ``id:`` line (:func:`gateway.agui.resume.event_id`), then its data."""
    return b"".join(
        b"id: " + event_id(pos).encode() + b"\ndata: " + ag.encode(e) + b"\n\n" for pos, e in events
    )


async def stream_run(
    sub: RunSubscriber,
    feed: RunFeed,
    opening: list[Tagged],
    send: Callable[[bytes], Awaitable[None]],
    ping_interval_s: float,
) -> None:
    """Write one run until it finishes (module docstring).

    A queue closed for another reason than slowness (the session deleted,
    this node's relay of it lost) ends the run with ``RUN_ERROR`` whose
    ``code`` is the close's name.

    Raises:
        SlowClient: the queue overflowed.
        trio.BrokenResourceError: the client went away (the turn goes on).
    """
    try:
        await send(tagged_sse(opening))
        while not feed.finished:
            item: FrameBatch | Gate | None = None
            with trio.move_on_after(ping_interval_s):
                try:
                    item = await sub.rx.receive()
                except trio.EndOfChannel:
                    if sub.too_slow:
                        raise SlowClient("the AG-UI run's queue overflowed") from None
                    code = sub.closing or "internal_error"
                    close = CLOSES.get(code)
                    ended = feed.closed(code, close.message if close else code, now_ms())
                    await send(tagged_sse(ended))
                    return
            if item is None:
                await send(PING)
                continue
            out: list[Tagged] = []
            for events, replayed in await sub.drain(item):
                if replayed:
                    out += feed.replayed(events, now_ms())
                else:
                    for event in events:
                        out += feed.receive(event)
            out += feed.pause(now_ms())
            if sub.too_slow:
                raise SlowClient("the AG-UI run's queue overflowed")
            if out:
                await send(tagged_sse(out))
    finally:
        if sub.subscribed:
            sub.leave("run_finished" if feed.finished else "client_closed")

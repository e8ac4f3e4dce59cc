"""One consumer of the delivery queue for every one-way stream (docs/protocol.md §3, §14).

A one-way stream (the native stream as server-sent events, ``GET
/sessions/{id}/events``; an AG-UI run; an AI SDK response, over SSE or as a
request on the AI SDK's WebSocket) is a client of a session's hub like a
WebSocket: its :class:`OneWayQueue` goes through the seam
(:func:`gateway.session.seam.subscribe`) before anything of what it streams
happens, and takes the hub's shared batches through the same bounded
:class:`~gateway.session.delivery.DeliveryQueue` (``[stream]
queue_max_events``) and its slow-client rule. Enqueueing never blocks the
session.

:func:`pump` is the consumer of each of them: it waits for what is queued
(writing a ``: ping`` comment after ``idle_s`` without a write, so proxies
keep an idle stream open), takes everything queued at once, passing the
seam's gate (waited for; from then on only the events above its cut), and
hands each piece to the stream's :class:`Reader`, the door's part: what a
live batch, a replay, a pause (the queue momentarily empty) and a close
become, as the bytes to write. What a drain made is written in one ``send``.
The pump ends when the reader has finished, or when the queue ends (a close:
the reader's last bytes; the slow-client rule cuts a stream whose queue says
so, :attr:`OneWayQueue.slow_cuts`, by raising :class:`SlowClient` for its
transport to close). The stream going away ends this writer only: a turn is
never cancelled by it.

A door that maps events (AG-UI, the AI SDK) reads them with a
:class:`TypedReader`: each event's JSON as the session emitted it, read into
its payload's struct (never the WebSocket frames), and a replay's frames read
back the same way. The WebSocket's own writer
(:class:`gateway.doors.websocket.outbound.Outbound`) is not one of these: it is
two-way, writes straight from the fan-out when it can, and sends control
frames between the batches.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from typing import Any, ClassVar, Protocol

import msgspec
import trio

from gateway.config import StreamConfig
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

Send = Callable[[bytes], Awaitable[None]]


class SlowClient(trio.BrokenResourceError):
    """The stream's queue overflowed: the transport closes the connection (module docstring)."""


class Reader(Protocol):
    """A door's part of a one-way stream: what the pump's pieces become (module docstring)."""

    @property
    def finished(self) -> bool:
        """The stream has said all it will: the pump stops."""
        ...

    def live(self, events: Sequence[Emitted]) -> bytes:
        """A batch's events above the seam's cut."""
        ...

    def replay(self, frames: bytes) -> bytes:
        """What opened the seam's gate: server text frames laid end to end."""
        ...

    def pause(self) -> bytes:
        """The queue is momentarily empty (after each drain)."""
        ...

    def closed(self, code: str | None) -> bytes | None:
        """The queue ended (``code``: the close's name; None: no close); None: nothing to write."""
        ...


class OneWayQueue(DeliveryQueue[Gate]):
    """A one-way stream's side of the hub and the seam: its delivery queue (module docstring).

    A door subclasses it to name it (the class attributes word the log and
    the slow-client warning).

    Args:
        session: the session it streams.
        config: ``[stream]`` (the bound: ``queue_max_events``).
        metrics: where queue depths and slow clients are counted.
        address: the client's address, for the log (``host:port``; empty if unknown).
    """

    prefix: ClassVar[str] = "stream"  # its subscription's name: {prefix}-N
    close_code = None  # no WebSocket: the door writes its close, or the connection is closed
    slow_cuts: ClassVar[bool] = True  # too slow: SlowClient (False: the reader writes the close)
    left_as: ClassVar[str | None] = None  # pump leaves the hub with this reason once finished
    _names: ClassVar[Iterator[int]] = itertools.count(1)

    def __init__(
        self, session: Session, config: StreamConfig, metrics: Metrics, address: str = ""
    ) -> None:
        name = f"{self.prefix}-{next(self._names)}"
        super().__init__(
            session, name, config.queue_max_events, metrics, client=client_label(name, address)
        )
        self._open()
        assert self._rx is not None
        self.rx = self._rx  # the pump's end of the queue
        self.cut = 0  # the seam's cut, once the gate opened (live: 0)
        # Once a close is decided, every write must be done within close_grace_s:
        # a client that reads nothing must not hold its slot (and its session) on
        # a write blocked forever (:meth:`send`).
        self._grace_s = config.close_grace_s
        self._close_by = math.inf
        self._writing: trio.CancelScope | None = None

    def request_close(self, code: str) -> None:
        """End the stream: too slow, deleted, shutdown, or this node lost the session's feed."""
        self.end_stream(code)
        if self._close_by == math.inf:
            self._close_by = trio.current_time() + self._grace_s
            if self._writing is not None:
                self._writing.deadline = self._close_by

    async def send(self, send: Send, data: bytes) -> None:
        """``send(data)``, bounded by the close's grace once a close is decided.

        Raises:
            SlowClient: the write did not finish within the grace (the client
                reads nothing): the transport closes the connection.
        """
        with trio.move_on_at(self._close_by) as scope:
            self._writing = scope
            try:
                await send(data)
            finally:
                self._writing = None
        if scope.cancelled_caught:
            raise SlowClient(f"the {self.queue_name}'s close did not reach its client in time")

    @property
    def too_slow(self) -> bool:
        """The slow-client rule cut this stream."""
        return self.closing == "client_too_slow"

    def leave(self, reason: str) -> None:
        """Off the hub, however the stream ended (``bus.subscriber_unregistered``)."""
        self.subscribed = False
        self.session.unregistered(self, reason)

    def take(self, batch: FrameBatch) -> Sequence[Emitted]:
        """Take a batch off the queue: its events above the seam's cut."""
        self.taken(batch.n)
        live = past_cut(batch, self.cut)
        return [] if live is None else live.events

    async def drain(self, item: FrameBatch | Gate, reader: Reader) -> bytes:
        """``item`` and everything queued behind it, through ``reader``; a gate is
        waited for, and its cut kept."""
        parts: list[bytes] = []
        queued: FrameBatch | Gate | None = item
        while queued is not None:
            if isinstance(queued, Gate):
                await queued.ready.wait()
                self.cut = queued.cut
                parts.append(reader.replay(queued.payload))
            else:
                parts.append(reader.live(self.take(queued)))
            try:
                queued = self.rx.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel):
                queued = None
        return b"".join(parts)


async def pump(
    queue: OneWayQueue,
    reader: Reader,
    send: Send,
    idle_s: float = math.inf,
    opening: bytes | None = None,
) -> None:
    """Write the stream until its reader has finished or its queue ends (module docstring).

    ``opening`` is written first (a door's start: ``RUN_STARTED``, ``start``).

    Raises:
        SlowClient: the queue overflowed, and the queue's door cuts a slow stream.
        trio.BrokenResourceError: the client went away (what it streamed goes on).
    """
    try:
        if opening is not None:
            await queue.send(send, opening)
        while not reader.finished:
            item: FrameBatch | Gate | None = None
            with trio.move_on_after(idle_s):
                try:
                    item = await queue.rx.receive()
                except trio.EndOfChannel:
                    await _closed(queue, reader, send)
                    return
            if item is None:
                await queue.send(send, PING)
                continue
            data = await queue.drain(item, reader)
            data += reader.pause()
            if queue.too_slow and queue.slow_cuts:
                raise SlowClient(f"the {queue.queue_name} overflowed")
            if data:
                await queue.send(send, data)
    finally:
        if queue.left_as is not None and queue.subscribed:
            queue.leave(queue.left_as if reader.finished else "client_closed")


async def _closed(queue: OneWayQueue, reader: Reader, send: Send) -> None:
    if queue.too_slow and queue.slow_cuts:
        raise SlowClient(f"the {queue.queue_name} overflowed")
    data = reader.closed(queue.closing)
    if data is not None:
        await queue.send(send, data)


def close_named(code: str | None) -> tuple[str, str]:
    """A queue's close as a door names it to its client: the close's name and its message."""
    code = code or "internal_error"
    close = CLOSES.get(code)
    return code, close.message if close else code


# --- the events, read ---------------------------------------------------------------------

# Each event type's envelope, its payload read into the type's struct.
_decoders: dict[str, msgspec.json.Decoder[Envelope[Any]]] = {
    type_: msgspec.json.Decoder(Envelope[spec.payload])  # type: ignore[name-defined]
    for type_, spec in EVENT_TYPES.items()
}

EVENT_FRAME_HEAD = b'{"type":"event","event":'
"""How an event frame begins (gateway.protocol.framing.event_frame splices the event after it)."""


class _Typed(msgspec.Struct):
    type: str


_typed = msgspec.json.Decoder(_Typed)


def read_events(events: Iterable[Emitted]) -> list[Envelope[Any]]:
    """Each event's JSON, its payload in its type's struct (a type this node lacks: left out)."""
    out: list[Envelope[Any]] = []
    for emitted in events:
        decoder = _decoders.get(emitted.type)
        if decoder is not None:
            out.append(decoder.decode(emitted.data))
    return out


def replayed_events(frames: bytes) -> list[Envelope[Any]]:
    """The events of a replay the seam put in the gate (its WebSocket frames, read back)."""
    out: list[Envelope[Any]] = []
    for payload in frame_payloads(frames):
        if payload.startswith(EVENT_FRAME_HEAD):
            data = payload[len(EVENT_FRAME_HEAD) : -1]
            decoder = _decoders.get(_typed.decode(data).type)
            if decoder is not None:
                out.append(decoder.decode(data))
    return out


def frame_payloads(frames: bytes) -> list[bytes]:
    """The payloads of server text frames laid end to end (what opened a seam gate).

    Only what :func:`gateway.protocol.framing.text_frame` builds: unmasked,
    whole, with a 7, 16 or 64-bit length (RFC 6455 section 5.2).
    """
    out: list[bytes] = []
    at = 0
    while at < len(frames):
        size, at = frames[at + 1] & 0x7F, at + 2
        if size == 126:
            size, at = int.from_bytes(frames[at : at + 2]), at + 2
        elif size == 127:
            size, at = int.from_bytes(frames[at : at + 8]), at + 8
        out.append(frames[at : at + size])
        at += size
    return out


class TypedReader:
    """A :class:`Reader` of a door that maps events: they come read (module docstring).

    A subclass gives :meth:`events`, :meth:`pause`, :meth:`closed` and
    :attr:`finished`.
    """

    @property
    def finished(self) -> bool:
        raise NotImplementedError

    def events(self, events: list[Envelope[Any]], replayed: bool) -> bytes:
        """The bytes of events read from a live batch, or from a replay (``replayed``)."""
        raise NotImplementedError

    def pause(self) -> bytes:
        raise NotImplementedError

    def closed(self, code: str | None) -> bytes | None:
        raise NotImplementedError

    def live(self, events: Sequence[Emitted]) -> bytes:
        return self.events(read_events(events), False)

    def replay(self, frames: bytes) -> bytes:
        return self.events(replayed_events(frames), True)

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

**The direct path** (docs/performance.md "Doors"): a stream whose transport
body can lend its socket (:class:`gateway.http.body.StreamBody`) and whose
door encodes a batch the same for every client of a filter (the native
stream: :meth:`OneWayQueue.direct_through`) is written like an idle
WebSocket: while nothing is queued for it, the pump holds nothing it has
not written, the seam's gate is passed and no close is decided, the hub
writes the batch's shared bytes (encoded and framed once per batch, for
every such client: :func:`gateway.session.hub.encoded`) straight to its
socket from the fan-out, and the pump's task sleeps. The queue, and so the
bound and the slow-client rule, exists only for a client with a backlog: a
write the kernel takes only in part leaves its rest owed to the body and
wakes the pump, which writes it first; from then on batches are queued until
the pump has written everything (:meth:`OneWayQueue._update_direct`).

A door that maps events (AG-UI, the AI SDK) reads them with a
:class:`TypedReader`: each event's JSON as the session emitted it, read into
its payload's struct (never the WebSocket frames), and a replay's frames read
back the same way. The WebSocket's own writer
(:class:`gateway.doors.websocket.outbound.Outbound`) is not one of these: it is
two-way, writes straight from the fan-out when it can, and sends control
frames between the batches.
"""

from __future__ import annotations

import contextlib
import itertools
import math
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from typing import Any, ClassVar, Protocol

import msgspec
import trio

from gateway.config import StreamConfig
from gateway.doors.shared import Mapped
from gateway.http.body import StreamBody, chunk
from gateway.http.timers import coarse
from gateway.logs import client_label
from gateway.metrics import Metrics
from gateway.protocol.closes import CLOSES
from gateway.protocol.events import EVENT_TYPES, Envelope
from gateway.session.delivery import DeliveryQueue
from gateway.session.hub import Emitted, Encoder, FrameBatch, Group, encoded
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


class Lender(Protocol):
    """A body that lends its socket to the fan-out (:class:`gateway.http.body.StreamBody`)."""

    direct: Any  # a gateway.session.hub.DirectWriter, or None while it is not lent
    on_direct_change: Callable[[], None] | None
    chunked: bool

    @property
    def owes(self) -> bool: ...

    def owe(self, rest: bytes) -> None: ...


class OneWayQueue(DeliveryQueue[Gate | bytes]):
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
        # The direct path (module docstring): the body lent, the door's encoder of
        # a whole batch as the body writes it, and whether the pump holds a piece.
        self._body: Lender | None = None
        self._encode: Encoder | None = None
        self.shared: Encoder | None = None  # a live batch's bytes, unframed, shared
        self._direct: object | None = None  # what the hub was last lent
        self._group: Group | None = None
        self.busy = False
        self._mapped: Mapped | None = None  # a mapping door's reader (gateway.doors.shared)

    def direct_through(self, body: Lender, shared: Encoder, framed: Encoder) -> None:
        """Let the hub write to this stream through ``body``'s socket while it is idle.

        ``shared`` makes a whole live batch's bytes (for the pump: what it writes
        of a batch the cut leaves whole); ``framed`` the same bytes framed as
        ``body`` writes them (for the hub). Both made once per batch
        (:func:`~gateway.session.hub.encoded`).
        """
        self._body = body
        self.shared = shared
        self._encode = framed
        body.on_direct_change = self._update_direct
        self._update_direct()

    def share_through(self, body: Lender, reader: Reader) -> Reader:
        """Let the hub write to this stream through ``body``'s socket while it is idle,
        mapping with the share of its state (:mod:`gateway.doors.shared`); the pump's reader.
        """
        self._mapped = Mapped(reader, chunk if body.chunked else bytes)
        self._body = body
        body.on_direct_change = self._update_direct
        self._update_direct()
        return self._mapped

    def wake(self) -> None:
        """Wake the pump (its share's mapping has finished: the response ends)."""
        if self._tx is not None:
            with contextlib.suppress(trio.WouldBlock, trio.ClosedResourceError):
                self._tx.send_nowait(b"")

    @property
    def owes(self) -> bool:
        """The rest of a direct write waits: the pump writes (even nothing) to send it."""
        return self._body is not None and self._body.owes

    def hold(self, busy: bool) -> None:
        """The pump took a piece off the queue (True), or wrote everything it took (False)."""
        self.busy = busy
        self._update_direct()

    def _update_direct(self) -> None:
        """Tell the hub whether it may write to this stream straight from the fan-out.

        It may when the body lends its socket (no write in progress, nothing
        owed, not over), the stream is subscribed and no close is decided,
        the pump holds nothing and nothing is queued (the seam's gate, every
        batch behind it and any rest owed written first), and a mapping door's
        response has not finished. Called,
        synchronously, on every change of any of these.
        """
        body = self._body
        if body is None:
            return
        idle = (
            self.subscribed
            and self.closing is None
            and not self.busy
            and self.rx.statistics().current_buffer_used == 0
            and not (self._mapped is not None and self._mapped.finished)
        )
        writer = body.direct if idle else None
        if writer is self._direct:
            return
        self._direct = writer
        encode = self._encode
        mapped = self._mapped
        if mapped is not None:
            if writer is None or self._group is None:
                mapped.leave(self)
            elif mapped.share is None:
                kind = (type(mapped.inner), mapped.frame)
                encode = self._encode = mapped.join(self, self._group.shares, kind)
        self.session.hub.set_direct(self, writer, encode)

    def registered(self, group: Group | None) -> None:
        self._group = group
        self.subscribed = group is not None
        self._update_direct()

    def _enqueued(self) -> None:
        if self._direct is not None:
            self._update_direct()

    def deliver_short(self, batch: FrameBatch, sent: int, now: float) -> bool:
        """A direct write took only ``sent`` bytes: the rest is owed, the pump writes it.

        A failed one (-1) owes the whole: the pump's write of it says the
        stream is broken (the batch is never mapped twice).
        """
        if self._body is None or self._encode is None:
            return self.deliver(batch, now)
        self._body.owe(encoded(batch, self._encode)[max(sent, 0) :])
        try:
            self.enqueue(b"")  # wakes the pump
        except trio.WouldBlock:
            return False
        except trio.ClosedResourceError:
            pass
        return True

    def last_direct(self) -> float:
        """Trio time of the last direct write to this stream's group (-inf: none)."""
        if self._direct is not None and self._group is not None:
            return self._group.written_at
        return -math.inf

    def request_close(self, code: str) -> None:
        """End the stream: too slow, deleted, shutdown, or this node lost the session's feed."""
        self.end_stream(code)
        self._update_direct()
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
        self._update_direct()
        self.session.unregistered(self, reason)

    def take(self, batch: FrameBatch) -> Sequence[Emitted]:
        """Take a batch off the queue: its events above the seam's cut."""
        self.taken(batch.n)
        live = past_cut(batch, self.cut)
        return [] if live is None else live.events

    async def drain(self, item: FrameBatch | Gate | bytes, reader: Reader) -> bytes:
        """``item`` and everything queued behind it, through ``reader``; a gate is
        waited for, and its cut kept."""
        parts: list[bytes] = []
        queued: FrameBatch | Gate | bytes | None = item
        while queued is not None:
            if isinstance(queued, Gate):
                await queued.ready.wait()
                self.cut = queued.cut
                parts.append(reader.replay(queued.payload))
            elif isinstance(queued, FrameBatch):
                if self.shared is not None and queued.events[0].seq > self.cut:
                    self.taken(queued.n)  # whole past the cut: the bytes every client shares
                    parts.append(encoded(queued, self.shared))
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
            item: FrameBatch | Gate | bytes | None = None
            due = trio.current_time() + idle_s
            while item is None:
                with trio.move_on_at(coarse(due, idle_s)):  # one clock for every stream
                    try:
                        item = await queue.rx.receive()
                    except trio.EndOfChannel:
                        await _closed(queue, reader, send)
                        return
                if item is None:  # direct writes count: a ping after idle_s without any
                    due = queue.last_direct() + idle_s
                    if due <= trio.current_time():
                        break
            if item is None:
                await queue.send(send, PING)
                continue
            queue.hold(True)
            try:
                data = await queue.drain(item, reader)
                data += reader.pause()
                if queue.too_slow and queue.slow_cuts:
                    raise SlowClient(f"the {queue.queue_name} overflowed")
                if data or queue.owes:
                    await queue.send(send, data)
            finally:
                queue.hold(False)
    finally:
        if queue.left_as is not None and queue.subscribed:
            queue.leave(queue.left_as if reader.finished else "client_closed")


async def _closed(queue: OneWayQueue, reader: Reader, send: Send) -> None:
    if queue.too_slow and queue.slow_cuts:
        raise SlowClient(f"the {queue.queue_name} overflowed")
    data = reader.closed(queue.closing)
    if data is not None:
        await queue.send(send, data)


def direct_reader(queue: OneWayQueue, reader: Reader, send: Send) -> Reader:
    """The pump's reader for a mapping door: shared on the direct path when ``send``
    is an HTTP body that can lend its socket (:meth:`OneWayQueue.share_through`)."""
    if isinstance(send, StreamBody):
        return queue.share_through(send, reader)
    return reader


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

"""Fan-out: one session's subscriptions, grouped by distinct filter (docs/protocol.md §3).

The hot path of the gateway. An emitted batch of events is matched once per
*distinct* filter (not once per client), the matching events' frames (each
encoded and framed once, for every client) are wrapped in one shared
:class:`FrameBatch`. A subscriber with nothing queued and no write in flight
is *direct*: the hub writes the batch straight to its socket through the
:class:`DirectWriter` its connection lends it, one non-blocking write and
nothing else per client (the loop the CPU per event is made of). A one-way
SSE stream (native, AI SDK, AG-UI) is direct the same way, through its HTTP
body's writer (:class:`gateway.http.body.StreamBody`): what is written to it
is the batch as its door encodes it (an :data:`Encoder`, made once per batch
for every client that shares it: :func:`encoded`). The hub
holds no socket: the server side owns the writer, and takes it back. Every
other subscriber gets the batch with one non-blocking ``deliver`` into its
bounded queue. Nothing blocks the session: a subscriber
whose queue would overflow says so, and the session applies the slow-client
rule (``bus.handler_warning``, close 1008) after the fan-out.

A worker session's hub forwards every batch to its parent's hub, where only
subscriptions with ``include_worker_sessions`` match it (docs/protocol.md §5),
but for its ``permission.*`` events, which every ancestor's subscriptions take
(:data:`gateway.protocol.filters.TO_ANCESTORS`).

The hub also keeps the session's :class:`Backlog`: how many events its
clients' writers have been handed and not yet taken, the signal the
translator task batches on (:mod:`gateway.session.call`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import trio

from gateway.metrics import Metrics
from gateway.protocol.filters import FilterKey

log = logging.getLogger("gateway.hub")


@dataclass(slots=True)
class Emitted:
    """One event as emitted: its sequence number, routing facts and wire bytes.

    ``data`` is the event's JSON (what the trace store keeps); ``frame`` is the
    complete WebSocket text frame of ``{"type": "event", "event": data}``.
    ``parts``: for a delta rolled up from several (docs/protocol.md §3 "Delta
    rollup", :mod:`gateway.session.rollup`), the deltas it stands for; else empty.
    """

    seq: int
    type: str
    actor: str
    session_id: str
    turn_id: str | None
    ts: int
    data: bytes
    frame: bytes
    parts: tuple[Emitted, ...] = ()


class FrameBatch:
    """Consecutive matching events, shared by every client of one filter.

    ``events`` are the events as emitted (a client that reads them rather
    than sending their frames takes them from here: AG-UI); ``blob`` is every
    event's frame joined, once for all the clients that send this batch
    whole; ``n`` is how many events it holds. ``encoded`` keeps the batch as
    another door writes it (an :data:`Encoder`'s bytes, made once for every
    client of that door: :func:`encoded`).
    """

    __slots__ = ("blob", "encoded", "events", "n")

    def __init__(self, events: Sequence[Emitted]) -> None:
        self.events = events
        self.n = n = len(events)
        self.blob = events[0].frame if n == 1 else b"".join([e.frame for e in events])
        self.encoded: dict[Encoder, bytes] | None = None

    def __len__(self) -> int:
        return self.n


Encoder = Callable[[FrameBatch], bytes]
"""How a door other than the WebSocket writes a batch (an SSE door: its events as SSE, framed)."""


def encoded(batch: FrameBatch, encode: Encoder) -> bytes:
    """``encode(batch)``, made once per batch for every client that writes it so."""
    cache = batch.encoded
    if cache is None:
        cache = batch.encoded = {}
    blob = cache.get(encode)
    if blob is None:
        blob = cache[encode] = encode(batch)
    return blob


class Subscriber(Protocol):
    """A connection's side of a subscription."""

    name: str

    def deliver(self, batch: FrameBatch, now: float) -> bool:
        """Enqueue without blocking; ``False`` when the bounded queue would overflow.

        ``now`` is the trio clock at the fan-out (read once for all clients).
        """
        ...

    def deliver_short(self, batch: FrameBatch, sent: int, now: float) -> bool:
        """A direct write of ``batch.blob`` took only ``sent`` bytes (-1: it failed).

        The subscriber takes care of the rest (and stops being direct, see
        :meth:`Hub.set_direct`); ``False`` as for :meth:`deliver`.
        """
        ...

    def overflowed(self) -> None:
        """Apply the slow-client rule to this subscription (called after the fan-out).

        The rule itself lives with the bound it enforces:
        :meth:`gateway.session.delivery.DeliveryQueue.overflowed`.
        """
        ...

    def request_close(self, code: str) -> None:
        """Close the client with the close named ``code`` (gateway.protocol.closes)."""
        ...


class DirectWriter(Protocol):
    """A socket a connection lends the fan-out while nothing else writes to it.

    Made and owned by the server side (:class:`gateway.http.websocket.SocketWriter`);
    the hub only calls it, from the fan-out, between :meth:`Hub.set_direct`
    calls that lend it and take it back.
    """

    def try_write(self, blob: bytes, /) -> int:
        """Write without blocking: the bytes the socket took.

        Raises, as ``os.write`` on a non-blocking socket does:
            BlockingIOError: none fit now.
            OSError: the socket failed.
        """
        ...


class Coalescer(Protocol):
    """A group's delta rollup, sans-IO (:class:`gateway.session.rollup.Rollup`)."""

    @property
    def deadline(self) -> float:
        """When the hub's timer must send what it holds (``math.inf``: it holds nothing)."""
        ...

    def feed(self, events: Sequence[Emitted], now: float) -> list[Emitted]:
        """What of ``events`` (and of what it held) goes out now."""
        ...

    def due(self, now: float) -> Emitted | None:
        """What it holds, if its window ended by ``now``."""
        ...


class Timer(Protocol):
    """Calls back at a deadline (:class:`gateway.session.rollup.RollupClock`)."""

    def at(self, deadline: float, call: Callable[[float], None], /) -> object:
        """Call ``call(now)`` once ``deadline`` has passed; a handle for :meth:`cancel`."""
        ...

    def cancel(self, handle: object, /) -> None:
        """Do not make the call of ``handle`` (made already: nothing)."""
        ...


class Group:
    """The subscribers of one distinct filter and window, split by how they are written to.

    ``direct`` maps each subscriber that may be written to straight from the
    fan-out (nothing queued for it, no write in flight) to its socket's
    :meth:`DirectWriter.try_write`; ``queued`` holds the others, which get
    :meth:`Subscriber.deliver`; ``encoding`` maps each direct subscriber of
    another door (SSE) to its :data:`Encoder` and its socket's ``try_write``.
    ``written_at`` is the trio time of the last direct write to the group: the
    heartbeat clock of its direct subscribers (docs/protocol.md §3).
    ``coalesce_ms`` is the group's rollup window and ``rollup`` its
    :class:`Coalescer` (None: 0, no rollup; docs/protocol.md §3 "Delta rollup"),
    ``timed`` the deadline its timer was last set for (``timer``: its handle). ``shares`` is what a
    mapping door shares between the group's direct clients, by the door's kind
    (:mod:`gateway.doors.shared`: a mapping per batch for the clients in one
    state), kept here so that it lives and dies with the group.
    """

    __slots__ = (
        "coalesce_ms", "direct", "encoding", "key", "queued", "rollup", "shares", "timed", "timer",
        "written_at",
    )  # fmt: skip

    def __init__(self, key: FilterKey, coalesce_ms: int = 0) -> None:
        self.key = key
        self.coalesce_ms = coalesce_ms
        self.rollup: Coalescer | None = None
        self.timed = math.inf
        self.timer: object = None
        self.direct: dict[Subscriber, Callable[[bytes], int]] = {}  # each one's try_write
        self.encoding: dict[Subscriber, tuple[Encoder, Callable[[bytes], int]]] = {}
        self.queued: dict[Subscriber, None] = {}
        self.shares: dict[Hashable, list[Any]] = {}
        self.written_at = -math.inf

    def __len__(self) -> int:
        return len(self.direct) + len(self.encoding) + len(self.queued)


class Backlog:
    """Events handed to a session's writers and not yet taken by them: the batching signal.

    A writer takes what is queued for its client all at once and hands it to
    the kernel in one write; while some writer has not, a batch emitted now
    would queue behind it anyway, so the translator task waits (at most
    ``batch_window_ms``) and sends more in one batch (:mod:`gateway.session.call`).
    A worker session's backlog counts with its parent's: its events reach the
    parent's clients too.
    """

    __slots__ = ("_drained", "events", "parent")

    def __init__(self, parent: Backlog | None = None) -> None:
        self.parent = parent
        self.events = 0
        self._drained = trio.Event()
        self._drained.set()

    def add(self, n: int) -> None:
        """``n`` events were queued for a writer."""
        if self.events <= 0:
            self.events = 0
            self._drained = trio.Event()
        self.events += n

    def take(self, n: int) -> None:
        """``n`` queued events were taken by their writer (or dropped with its queue)."""
        self.events -= n
        if self.events <= 0:
            self._drained.set()

    async def drained(self) -> None:
        """Return once every writer of this session (and of its parents) has taken its backlog.

        Always lets the other tasks run once first, so that what a provider
        has ready already is in the batch.
        """
        await trio.lowlevel.checkpoint()
        backlog: Backlog | None = self
        while backlog is not None:
            while backlog.events > 0:
                await backlog._drained.wait()
            backlog = backlog.parent


class Hub:
    """The subscriptions of one session, and their parent hub for worker sessions.

    Args:
        parent: the parent session's hub, for a worker session.
        counter: counts the event frames written straight from the fan-out.
        rollup: makes a group's :class:`Coalescer` for a window in seconds
            (None: every window is 0, no rollup).
        timer: wakes the hub when a group's window ends (with ``rollup``).
    """

    def __init__(
        self,
        parent: Hub | None = None,
        counter: Metrics | None = None,
        rollup: Callable[[float], Coalescer] | None = None,
        timer: Timer | None = None,
    ) -> None:
        self.parent = parent
        self._groups: dict[tuple[FilterKey, int], Group] = {}
        self._rollup = rollup if timer is not None else None
        self._timer = timer
        self._group_of: dict[Subscriber, Group] = {}
        self._counter = counter
        self.backlog: Backlog = Backlog(parent.backlog if parent is not None else None)

    def __len__(self) -> int:
        return len(self._group_of)

    def subscribe(self, sub: Subscriber, key: FilterKey, coalesce_ms: int = 0) -> Group:
        """Add ``sub`` to the group of ``key`` and ``coalesce_ms`` (clients of one filter
        and one window share the rolled-up bytes), queued until :meth:`set_direct`
        says otherwise."""
        if self._rollup is None:
            coalesce_ms = 0
        group = self._groups.get((key, coalesce_ms))
        if group is None:
            group = self._groups[(key, coalesce_ms)] = Group(key, coalesce_ms)
            if coalesce_ms and self._rollup is not None:
                group.rollup = self._rollup(coalesce_ms / 1000)
        group.queued[sub] = None
        self._group_of[sub] = group
        return group

    def set_direct(
        self, sub: Subscriber, writer: DirectWriter | None, encode: Encoder | None = None
    ) -> None:
        """Write to ``sub`` straight from the fan-out through ``writer``; None: through deliver.

        The subscriber calls this synchronously whenever that changes, and
        with None before its socket is closed: the hub never writes through a
        writer it was not lent, or after it was taken back. ``encode``: what
        is written is ``encode(batch)`` (made once per batch, :func:`encoded`),
        not the batch's WebSocket frames.
        """
        group = self._group_of.get(sub)
        if group is None:
            return
        if writer is not None:
            group.queued.pop(sub, None)
            if encode is None:
                group.direct[sub] = writer.try_write  # looked up once, not per write
            else:
                group.encoding[sub] = (encode, writer.try_write)
        elif sub in group.direct:
            del group.direct[sub]
            group.queued[sub] = None
        elif sub in group.encoding:
            del group.encoding[sub]
            group.queued[sub] = None

    def subscribers(self) -> list[Subscriber]:
        """Every subscriber of this hub (a copy: closing one may unsubscribe it)."""
        return list(self._group_of)

    def unsubscribe(self, sub: Subscriber) -> bool:
        """Remove ``sub``; ``True`` if it was subscribed."""
        group = self._group_of.pop(sub, None)
        if group is None:
            return False
        group.direct.pop(sub, None)
        group.encoding.pop(sub, None)
        group.queued.pop(sub, None)
        if not group:
            del self._groups[(group.key, group.coalesce_ms)]
            if group.timer is not None and self._timer is not None:
                self._timer.cancel(group.timer)  # what it held goes nowhere now
                group.timer = None
        return True

    def publish(
        self, events: list[Emitted], now: float, *, from_worker: bool = False
    ) -> list[Subscriber]:
        """Fan a batch out to every matching subscription, here and up the parent chain.

        Per distinct filter: one non-blocking write of the shared batch to each
        direct subscriber (a short one is handed to the subscriber), then
        :meth:`Subscriber.deliver` to each queued one. A group with a rollup
        window sends what its :class:`Coalescer` lets out now (docs/protocol.md
        §3 "Delta rollup"); its timer sends the rest when the window ends.

        Args:
            events: one emitted batch, in id order.
            now: the trio clock, read once by the caller for every client.

        Returns:
            The subscribers whose queue overflowed (still subscribed: the
            caller applies the slow-client rule).
        """
        overflowed: list[Subscriber] = []
        written = 0
        for group in self._groups.values():  # (a filter in two windows: matched twice)
            batch = _select(events, group.key, from_worker)
            if batch is None:
                continue
            rollup = group.rollup
            if rollup is not None:
                out = rollup.feed(batch.events, now)
                self._time(group, rollup)
                if not out:
                    continue
                batch = FrameBatch(out)
            written += _send(group, batch, now, overflowed)
        if written and self._counter is not None:
            self._counter.frames_sent += written
        if self.parent is not None:
            overflowed += self.parent.publish(events, now, from_worker=True)
        return overflowed

    def _time(self, group: Group, rollup: Coalescer) -> None:
        """Set the group's timer for its window's end, if not set already; a window an
        event closed first has its timer cancelled (the clock is not woken for it)."""
        deadline = rollup.deadline
        timer = self._timer
        if deadline == group.timed or timer is None:
            return
        if group.timer is not None:
            timer.cancel(group.timer)
            group.timer = None
        group.timed = deadline
        if deadline != math.inf:
            group.timer = timer.at(deadline, lambda now: self._due(group, deadline, now))

    def _due(self, group: Group, deadline: float, now: float) -> None:
        """A group's window ended: what it holds goes out (the slow-client rule applied).

        A timer set for an earlier window (closed since by an event) does nothing.
        """
        rollup = group.rollup
        if deadline != group.timed or rollup is None:
            return
        group.timed, group.timer = math.inf, None
        if self._groups.get((group.key, group.coalesce_ms)) is not group:
            return
        rolled = rollup.due(now)
        self._time(group, rollup)
        if rolled is None:
            return
        overflowed: list[Subscriber] = []
        written = _send(group, FrameBatch([rolled]), now, overflowed)
        if written and self._counter is not None:
            self._counter.frames_sent += written
        for sub in overflowed:
            sub.overflowed()


def _send(group: Group, batch: FrameBatch, now: float, overflowed: list[Subscriber]) -> int:
    """One batch to one group: a non-blocking write to each direct subscriber (a short
    one handed to the subscriber), :meth:`Subscriber.deliver` to each queued one.

    Returns:
        The event frames written straight to sockets; ``overflowed`` gets the
        subscribers whose queue would overflow.
    """
    written = 0
    queued = list(group.queued)  # before a short write moves someone there
    direct = group.direct
    if direct:
        blob = batch.blob
        size = len(blob)
        short: list[tuple[Subscriber, int]] = []
        for sub, try_write in direct.items():
            try:
                sent = try_write(blob)
            except BlockingIOError:
                sent = 0
            except OSError:
                sent = -1
            if sent != size:
                short.append((sub, sent))
        group.written_at = now
        written = (len(direct) - len(short)) * batch.n
        for sub, sent in short:
            if not _guarded(sub.deliver_short, batch, sent, now):
                overflowed.append(sub)
    if group.encoding:
        _write_encoded(group, batch, now, overflowed)  # (not WebSocket frames: uncounted)
    for sub in queued:
        if not _guarded(sub.deliver, batch, now):
            overflowed.append(sub)
    return written


def _write_encoded(
    group: Group, batch: FrameBatch, now: float, overflowed: list[Subscriber]
) -> None:
    """:meth:`Hub.publish`'s direct writes to the group's other doors (SSE)."""
    short: list[tuple[Subscriber, int]] = []
    for sub, (encode, try_write) in group.encoding.items():
        blob = encoded(batch, encode)
        try:
            sent = try_write(blob)
        except BlockingIOError:
            sent = 0
        except OSError:
            sent = -1
        if sent != len(blob):
            short.append((sub, sent))
    group.written_at = now
    for sub, sent in short:
        if not _guarded(sub.deliver_short, batch, sent, now):
            overflowed.append(sub)


def _guarded(deliver: Callable[..., bool], *args: object) -> bool:
    """One subscriber's delivery; a subscriber that raises is one that cannot keep up.

    A failure in one connection never reaches the others of the fan-out, nor
    the session: it is logged, and the slow-client rule closes that one.
    """
    try:
        return deliver(*args)
    except Exception:
        subscriber = getattr(deliver, "__self__", None)
        log.exception(
            "fan-out: a subscriber failed to take a batch; closing it",
            extra={
                "event": "fanout_subscriber_failed",
                "fields": {"client": getattr(subscriber, "name", None)},
            },
        )
        return False


def _select(events: list[Emitted], key: FilterKey, from_worker: bool) -> FrameBatch | None:
    chosen = key.select(events, from_worker)
    if not chosen:
        return None
    return FrameBatch(chosen)

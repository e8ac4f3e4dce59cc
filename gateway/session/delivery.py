"""A client's bounded delivery queue, and the slow-client rule (docs/protocol.md §3).

Every client of a session's hub takes the hub's shared batches
(:class:`~gateway.session.hub.FrameBatch`) through one :class:`DeliveryQueue`:
a WebSocket connection (:class:`gateway.doors.websocket.outbound.Outbound`) and an
AG-UI run's SSE stream (:class:`gateway.doors.agui.sse.RunSubscriber`) alike. What
differs is only how each one's consumer writes what it takes, and how it
closes.

**The bound**: ``[stream] queue_max_events`` events, plus a little slack for
what is not an event (the seam's gate; a WebSocket's acks, pongs and errors).
Delivering never blocks the session: a batch that would overflow the bound
is refused, and the hub reports the client (a batch larger than the bound
still fits an empty queue).

**The slow-client rule** (:meth:`DeliveryQueue.overflowed`), once per client
however many fan-outs report it: the client is unsubscribed, counted
(``gateway_slow_client_closes_total``), logged (``slow_client_closed``) and
closed with ``client_too_slow`` (a WebSocket with 1008, an SSE stream cut),
and the session emits ``bus.handler_warning``. Its queue is dropped: it
resumes with replay. The other clients of the session never notice.

The consumer takes what it dequeues off the count with
:meth:`DeliveryQueue.taken`, and passes the seam's gate
(:class:`~gateway.session.seam.Gate`) with
:func:`~gateway.session.seam.past_cut`.
"""

from __future__ import annotations

import logging
from typing import ClassVar, Generic, TypeVar

import trio

from gateway.logs import event
from gateway.metrics import Metrics
from gateway.protocol.closes import CLOSES
from gateway.session.hub import Backlog, FrameBatch, Group
from gateway.session.session import Session

SLACK = 64
"""Room beyond the event bound for what is not an event (the gate, control frames)."""

log = logging.getLogger("gateway.stream")

Item = TypeVar("Item")
"""What a transport queues besides the hub's batches (a gate at least)."""


class DeliveryQueue(Generic[Item]):
    """A client's bounded queue and its slow-client rule (module docstring).

    A transport subclasses it with its consumer and its close
    (:meth:`request_close`); the class attributes word its slow-client log
    line and warning.

    Args:
        session: the session the client is attached to.
        name: the client's name (in warnings, and its tasks' names).
        max_events: the bound (``[stream] queue_max_events``).
        metrics: where queue depths and slow clients are counted.
        client: the log's ``client`` field (the name, and the address where known).
        backlog: the session's :class:`~gateway.session.hub.Backlog`, for a
            client whose writer the translator batches on; ``None``: not counted.
    """

    queue_name: ClassVar[str] = "outbound queue"
    closes_how: ClassVar[str] = "closing with 1008"
    close_code: ClassVar[int | None] = 1008  # the log's ``code`` field

    def __init__(
        self,
        session: Session,
        name: str,
        max_events: int,
        metrics: Metrics,
        *,
        client: str = "",
        backlog: Backlog | None = None,
    ) -> None:
        self.session = session
        self.name = name
        self.client = client or name
        self.max_events = max_events
        self._metrics = metrics
        self._backlog = backlog
        self.queued = 0  # events queued, not yet taken by the consumer
        self.subscribed = False  # past the seam's registration (gateway.session.seam)
        self.closing: str | None = None  # the close's name, once a close is decided
        self._tx: trio.MemorySendChannel[FrameBatch | Item] | None = None
        self._rx: trio.MemoryReceiveChannel[FrameBatch | Item] | None = None

    # --- the hub's side (gateway.session.hub.Subscriber) ---------------------------

    def deliver(self, batch: FrameBatch, now: float) -> bool:
        n = batch.n
        if self.queued and self.queued + n > self.max_events:
            return False  # (a batch larger than the bound still fits an empty queue)
        try:
            self.enqueue(batch)
        except trio.WouldBlock:
            return False
        except trio.ClosedResourceError:
            return True  # the consumer's stream is over: nothing more is kept
        self.queued += n
        if self._backlog is not None:
            self._backlog.add(n)
        self._metrics.outbound_queue_depth.observe(self.queued)
        return True

    def deliver_short(self, batch: FrameBatch, sent: int, now: float) -> bool:
        """Never direct: the hub always delivers (a transport that writes direct overrides)."""
        return self.deliver(batch, now)

    def overflowed(self) -> None:
        """The slow-client rule (module docstring), once per client.

        One warning, one close, one count, however many fan-outs (a nested
        one among them: the warning is itself emitted) report the overflow.
        """
        if self.closing is not None:
            return
        self.session.hub.unsubscribe(self)
        self._metrics.slow_clients.inc()
        bound = f"queue_max_events={self.max_events}"
        event(
            log, logging.WARNING, "slow_client_closed",
            f"{self.client}: {self.queue_name} over {bound}; {self.closes_how}",
            session_id=self.session.id, client=self.client, code=self.close_code,
            queued=self.queued,
        )  # fmt: skip
        self.request_close("client_too_slow")
        self.session.warn(
            self.name, "client_too_slow", f"{self.queue_name} exceeded {bound}; {self.closes_how}"
        )

    def request_close(self, code: str) -> None:
        """Close the client with the close named ``code`` (:mod:`gateway.protocol.closes`)."""
        raise NotImplementedError

    def end_stream(self, code: str) -> None:
        """:meth:`request_close` of a one-way stream (SSE: the native one, AG-UI, the AI SDK).

        Off the hub at once; what is queued is kept for the reader if the
        close's row says it drains, else dropped; then the queue ends, so the
        reader ends once it has taken what is left (and writes the close its
        own way).
        """
        if self.closing is not None:
            return
        self.closing = code
        self.session.hub.unsubscribe(self)
        self.subscribed = False
        if not CLOSES[code].drains:
            self.discard()
        self.end_queue()

    def end_queue(self) -> None:
        """No more is queued: the reader ends once it has taken what is."""
        if self._tx is not None:
            self._tx.close()

    # --- the seam's side (gateway.session.seam.SeamSubscriber) ---------------------

    def registered(self, group: Group | None) -> None:
        self.subscribed = group is not None

    def enqueue(self, item: FrameBatch | Item) -> None:
        """Queue an item for the consumer (:meth:`_enqueued` then wakes it).

        Raises:
            trio.WouldBlock: the queue is full.
            trio.ClosedResourceError: the consumer's stream is over.
        """
        tx = self._tx
        if tx is None:
            tx = self._open()
        tx.send_nowait(item)
        self._enqueued()

    # --- the consumer's side ------------------------------------------------------

    def _open(self) -> trio.MemorySendChannel[FrameBatch | Item]:
        """A new queue (the bound and its slack); its sending end."""
        self._tx, self._rx = trio.open_memory_channel[FrameBatch | Item](self.max_events + SLACK)
        return self._tx

    def _enqueued(self) -> None:
        """An item was queued: a transport whose consumer is not always running starts it."""

    def taken(self, n: int) -> None:
        """The consumer took (or dropped) ``n`` queued events."""
        self.queued -= n
        if self._backlog is not None:
            self._backlog.take(n)

    def discard(self) -> None:
        """Drop everything queued (a slow client resumes with replay)."""
        rx = self._rx
        while rx is not None:
            try:
                item = rx.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel):
                return
            if isinstance(item, FrameBatch):
                self.taken(item.n)

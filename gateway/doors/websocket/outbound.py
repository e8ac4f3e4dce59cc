"""A WebSocket client's outbound side: its writer, its direct writes, its close.

**The queue** (docs/protocol.md §3) is the client's
:class:`~gateway.session.delivery.DeliveryQueue`: the bound of
``queue_max_events`` events (plus slack for control frames: acks, pongs,
errors) and the slow-client rule, one copy for every transport. The
session's hub hands each client the shared
:class:`~gateway.session.hub.FrameBatch` without ever blocking:

- a client with nothing queued and no write in flight is *direct*: the hub
  writes the batch straight to its socket (one non-blocking write, no task
  switch, no call into this class); the outbound tells the hub, synchronously,
  whenever that stops or starts being true (:meth:`Outbound._update_direct`);
- otherwise the batch goes into the queue (:meth:`Outbound.deliver`) and a
  writer task, started if none runs, takes everything queued and writes it in
  one ``send_all``, then ends once the queue is empty; a direct write the
  kernel takes only part of hands the rest to a writer the same way
  (:meth:`Outbound.deliver_short`).

A batch that would overflow the bound makes the client a slow one
(:meth:`~gateway.session.delivery.DeliveryQueue.overflowed`): for a
WebSocket, the close 1008 ``client_too_slow``.

**The close** (:meth:`Outbound.request_close`): the close policy is the table
of :mod:`gateway.protocol.closes`; a close that *drains* sends what is queued
first, any other drops it; either way the writing left gets at most
``close_grace_s``, then the close frame.

Task, inside the connection's nursery::

    ws-writer <name>    only while the client has a backlog: drains the queue,
                        one send_all per drain (with the WebSocket's pongs and
                        the rest of a frame a direct write left half-sent,
                        which go first), passing seam gates as they open
"""

from __future__ import annotations

import math

import trio

from gateway.config import StreamConfig
from gateway.http.websocket import ConnectionClosed, SocketWriter, WebSocket
from gateway.metrics import Metrics
from gateway.protocol.closes import CLOSES, close_reason
from gateway.protocol.frames import encode
from gateway.protocol.framing import text_frame
from gateway.session.delivery import SLACK, DeliveryQueue
from gateway.session.hub import FrameBatch, Group
from gateway.session.seam import Gate, past_cut
from gateway.session.session import Session


class _Close:
    """The writer's marker: close after what was queued before me."""


_CLOSE = _Close()

_Control = bytes | Gate | _Close  # what the outbound queue carries besides batches


class Outbound(DeliveryQueue[_Control]):
    """A connection's writer over its delivery queue (module docstring).

    Args:
        session: the session the client is attached to.
        ws: the client's WebSocket.
        name: the connection's name (in warnings and task names).
        config: ``[stream]``.
        metrics: where frames sent and slow-client closes are counted.
        client: the log's ``client`` field (the name, and the address where known).
    """

    def __init__(
        self,
        session: Session,
        ws: WebSocket,
        name: str,
        config: StreamConfig,
        metrics: Metrics,
        *,
        client: str = "",
    ) -> None:
        super().__init__(
            session,
            name,
            config.queue_max_events,
            metrics,
            client=client,
            backlog=session.hub.backlog,
        )
        self.ws = ws
        self._config = config
        # The queue and its writer task exist only while there is a backlog:
        # an idle client is written to straight from the fan-out, so 10,000
        # idle connections hold neither (see deliver).
        self._writer_running = False
        # The writer runs under one scope (no scope per write: the hot path);
        # a close gives it a deadline of close_grace_s.
        self._writer_scope = trio.CancelScope()
        self._close_deadline = math.inf
        self._writing = False  # between taking frames and having written them
        self.last_write = 0.0  # trio time of the last frame a writer or a direct short wrote
        self._direct: SocketWriter | None = None  # what the hub was last lent (Hub.set_direct)
        self._group: Group | None = None  # the hub group, whose clock counts while direct
        ws.on_direct_change = self._update_direct
        ws.on_control = self._control_waiting
        self._nursery: trio.Nursery | None = None
        self._controls = 0  # control frames queued (acks, pongs, errors): at most SLACK

    def bind(self, nursery: trio.Nursery) -> None:
        """Where a writer starts, when there is a backlog (the connection's nursery)."""
        self._nursery = nursery
        self.last_write = trio.current_time()

    def release(self) -> None:
        """The connection is over: off the hub's direct list, its backlog no longer awaited."""
        self.subscribed = False
        self._update_direct()
        self.ws.on_direct_change = self.ws.on_control = None  # no cycle left between the two
        self.taken(self.queued)

    # --- the hub's side (gateway.session.hub.Subscriber) ---------------------------

    def deliver_short(self, batch: FrameBatch, sent: int, now: float) -> bool:
        if sent < 0:  # broken: queued instead, the writer's send_all says so
            return self.deliver(batch, now)
        self._metrics.frames_sent += batch.n
        self.last_write = now
        # The kernel's buffer is full. The rest belongs to the WebSocket (it goes
        # before any other byte, a pong or a close included); a writer sends it.
        self.ws.owe(batch.blob[sent:])
        try:
            self.enqueue(b"")
        except trio.WouldBlock:  # nothing fits: a slow client (the close sends the rest first)
            return False
        return True

    # --- the seam's side (gateway.session.seam.SeamSubscriber) ---------------------

    def registered(self, group: Group | None) -> None:
        self._group = group
        self.subscribed = group is not None
        self._update_direct()

    def _enqueued(self) -> None:
        """Start a writer if none runs."""
        if not self._writer_running and self._nursery is not None:
            self._writer_running = True
            try:
                self._nursery.start_soon(self._writer, name=f"ws-writer {self.name}")
            except RuntimeError:  # the connection is over: nobody to write to
                self._writer_running = False
            self._update_direct()

    # --- direct writes ---------------------------------------------------------------

    def _update_direct(self) -> None:
        """Tell the hub whether it may write to this client straight from the fan-out.

        It may when nothing is queued and nothing is in flight (no writer), the
        seam is passed (a gate is only ever passed by a writer, which ends once
        it has drained everything behind it), no close is decided, and the
        WebSocket has the socket free (:attr:`WebSocket.direct`). Called,
        synchronously, on every change of any of these.
        """
        eligible = not self._writer_running and self.subscribed and self.closing is None
        writer = self.ws.direct if eligible else None
        if writer is self._direct:
            return
        if writer is None and self._group is not None:  # off the group's clock: keep its last
            self.last_write = max(self.last_write, self._group.written_at)
        self._direct = writer
        self.session.hub.set_direct(self, writer)

    def last_outbound(self) -> float:
        """Trio time of the last frame written to this client (the heartbeat's clock)."""
        if self._direct is not None and self._group is not None:
            return max(self.last_write, self._group.written_at)
        return self.last_write

    # --- control frames and the close --------------------------------------------------

    def enqueue(self, item: FrameBatch | _Control) -> None:
        """:meth:`DeliveryQueue.enqueue`; control frames have a slack of their own.

        At most ``SLACK`` of them are queued, however few events are
        (docs/protocol.md §3 "Backpressure"): a client that pings and reads
        nothing is a slow client once 64 pongs wait, not 1,064.

        Raises:
            trio.WouldBlock: the queue is full, or its control frames are.
        """
        if isinstance(item, bytes):
            if self._controls >= SLACK:
                raise trio.WouldBlock
            super().enqueue(item)
            self._controls += 1
        else:
            super().enqueue(item)

    def discard(self) -> None:
        super().discard()
        self._controls = 0

    def put(self, frame: bytes) -> None:
        """Queue a control frame (already framed); a full queue is a slow client."""
        try:
            self.enqueue(frame)
        except trio.WouldBlock:
            self.overflowed()

    def send(self, obj: object) -> None:
        """Queue a server frame (:mod:`gateway.protocol.frames`) other than an event."""
        self.put(text_frame(encode(obj)))

    def _control_waiting(self) -> None:
        """A pong waits in the WebSocket: a writer sends it, before any queued frame."""
        self.put(b"")

    def request_close(self, code: str) -> None:
        """Close the connection with the close named ``code`` (:mod:`gateway.protocol.closes`).

        A close that drains first sends what is queued (a turn's
        ``turn.cancelled`` must reach the client before the 1001); any other
        close drops the queue (a slow client resumes with replay). Either way
        the writing left gets at most ``close_grace_s``, then the close frame.
        """
        if self.closing is not None:
            return
        self.closing = code  # from now on, only a writer writes
        self._update_direct()
        self._close_deadline = trio.current_time() + self._config.close_grace_s
        if not CLOSES[code].drains:
            self.discard()
        try:
            self.enqueue(_CLOSE)
        except trio.WouldBlock:  # no room even for the marker: drop the queue
            self.discard()
            self.enqueue(_CLOSE)
        if self._writer_running:  # a write in progress is finished, within the grace
            self._writer_scope.deadline = self._close_deadline

    # --- the writer --------------------------------------------------------------------

    async def _writer(self) -> None:
        """Write the backlog; end when it is drained, or close the connection at ``_CLOSE``."""
        closed = False
        try:
            self._writer_scope = trio.CancelScope(deadline=self._close_deadline)
            with self._writer_scope:
                closed = await self._write_loop()
            if self._writer_scope.cancelled_caught:
                raise ConnectionClosed("a write was abandoned after close_grace_s")
            if closed:
                ws_code, reason = close_reason(self.closing or "normal")
                await self.ws.close(ws_code, reason, grace_s=self._config.close_grace_s)
        except ConnectionClosed:  # broken, or a write cut short: no close frame can follow
            closed = True
            await self.ws.aclose()
        finally:
            self._writer_running = self._writing = False
            self._update_direct()
            if closed and self._nursery is not None:
                self._nursery.cancel_scope.cancel()

    async def _write_loop(self) -> bool:
        """Take everything queued, write it in one ``send_all``; again, until none is left.

        Returns:
            True once the close marker was reached; False when drained (the
            queue is released: the next backlog gets a new one).
        """
        rx = self._rx
        assert rx is not None
        cut = 0
        while True:
            try:
                item = rx.receive_nowait()
            except trio.WouldBlock:
                self._tx = self._rx = None
                return False
            self._writing = True
            cut = await self._drain(item, cut)
            del item  # nothing it has sent stays referenced
            self._writing = False
            if cut < 0:
                return True

    async def _drain(self, item: FrameBatch | _Control, cut: int) -> int:
        """Write ``item`` and everything queued behind it; the new cut, or -1 to stop.

        A :class:`~gateway.session.seam.Gate` is waited for, then passed: what
        opened it goes out, and from there on only events above its cut.
        """
        rx = self._rx
        assert rx is not None
        parts: list[bytes] = []
        events = 0
        while True:
            if isinstance(item, _Close):
                if parts:
                    await self._write(b"".join(parts))
                return -1
            if isinstance(item, FrameBatch):
                self.taken(item.n)
                live = past_cut(item, cut)
                if live is not None:
                    parts.append(live.blob)
                    events += item.n
            elif isinstance(item, Gate):
                if parts:
                    await self._write(b"".join(parts))
                    parts = []
                await item.ready.wait()
                parts.append(item.payload)
                cut = item.cut
            else:
                self._controls -= 1
                parts.append(item)
            try:
                item = rx.receive_nowait()
            except trio.WouldBlock:
                break
        if parts:
            await self._write(parts[0] if len(parts) == 1 else b"".join(parts))
            self._metrics.frames_sent += events
        return cut

    async def _write(self, data: bytes) -> None:
        await self.ws.send_all(data)
        self.last_write = trio.current_time()

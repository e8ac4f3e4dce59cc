"""One client's WebSocket on a session stream (PROTOCOL section 3).

Task tree of a connection::

    ws <name>               StreamConnection.run: the reader (client frames:
    │                       subscribe, cancel, ping, pong; the subscribe
    │                       deadline and the heartbeat, whose clock is the
    │                       hub group's last direct write while direct)
    └── ws-writer <name>    only while the client has a backlog: drains the
                            outbound channel, one send_all per drain (with
                            the WebSocket's pongs and the rest of a frame a
                            direct write left half-sent, which go first)

The outbound channel is the connection's one bounded queue
(``queue_max_events``). The session's hub hands each client the shared
:class:`FrameBatch` without ever blocking. A client with nothing queued and
no write in flight is *direct*: the hub writes the batch straight to its
socket (one non-blocking write, no task switch, no call into this class),
and the connection tells the hub, synchronously, whenever that stops or
starts being true (:meth:`StreamConnection._update_direct`). Otherwise the
batch goes into the channel and a writer task (started if none runs) takes
everything queued and writes it in one ``send_all``, then ends once the
channel is empty; a direct write the kernel takes only part of hands the
rest to a writer the same way. When a batch would overflow the bound, the hub
reports it and the slow-client rule applies: ``bus.handler_warning``, then
close 1008 ``client_too_slow`` (queued events are dropped: the client resumes
with replay).

**The seam.** A ``subscribe`` first puts a :class:`Gate` in the channel, then
registers with the hub, then computes the snapshot or replay. Live batches
that arrive meanwhile queue up behind the gate. When the gate opens, the
writer sends the ack and the snapshot or replay, then every queued event with
an id above the gate's cut, so each event reaches the client exactly once, in
id order.
"""

from __future__ import annotations

import itertools
import logging
import math
import secrets
import sys

import trio

from gateway.errors import ApiError, FrameRejected, SubscribeRejected
from gateway.protocol.filters import FilterKey, resolve_filter
from gateway.protocol.frames import (
    Cancel,
    ErrorFrame,
    Ping,
    Pong,
    Subscribe,
    SubscribeAck,
    SubscribeError,
    close_reason,
    decode_client_frame,
    encode,
)
from gateway.server.websocket import ConnectionClosed, Idle, WebSocket, text_frame
from gateway.session.hub import FrameBatch, Group
from gateway.session.session import Session

log = logging.getLogger("gateway.stream")

_names = itertools.count(1)
_CONTROL_SLACK = 64  # control frames (acks, pongs, errors) beyond the event bound


class _Close:
    """The writer's marker: close after what was queued before me."""


_CLOSE = _Close()
_DRAINING_CLOSES = frozenset({"shutdown", "normal"})


class Gate:
    """The seam marker in the outbound channel (module docstring)."""

    __slots__ = ("cut", "payload", "ready")

    def __init__(self) -> None:
        self.ready = trio.Event()
        self.payload = b""
        self.cut = 0

    def open(self, payload: bytes, cut: int) -> None:
        self.payload, self.cut = payload, cut
        self.ready.set()


_Item = bytes | FrameBatch | Gate | _Close  # what the outbound channel carries


class Heartbeat:
    """Ping bookkeeping (PROTOCOL section 3 "Heartbeat"), sans-IO.

    The reader calls :meth:`on_idle` after ``ping_interval_s`` without an
    outbound frame: it answers a nonce to ping with, or ``None`` when
    ``ping_max_missed`` pings in a row went unanswered (close 1001). Any pong
    carrying the nonce of an outstanding ping resets the count.
    """

    def __init__(self, max_missed: int) -> None:
        self.max_missed = max_missed
        self.outstanding: list[str] = []

    def on_idle(self) -> str | None:
        if len(self.outstanding) >= self.max_missed:
            return None
        nonce = secrets.token_hex(6)
        self.outstanding.append(nonce)
        return nonce

    def on_pong(self, nonce: str) -> bool:
        if nonce in self.outstanding:
            self.outstanding.clear()
            return True
        return False


class StreamConnection:
    """A client attached to one session's stream."""

    def __init__(self, session: Session, ws: WebSocket) -> None:
        self.session = session
        self.node = session.node
        self.ws = ws
        self._metrics = session.node.metrics
        self.name = f"ws-{next(_names)}"
        stream = self.node.config.stream
        self.max_events: int = stream.queue_max_events
        # The outbound channel and its writer task exist only while there is
        # a backlog: an idle client is written to straight from the fan-out,
        # so 10,000 idle connections hold neither (see deliver).
        self._tx: trio.MemorySendChannel[_Item] | None = None
        self._rx: trio.MemoryReceiveChannel[_Item] | None = None
        self._writer_running = False
        self.queued = 0
        self.key: FilterKey | None = None
        self.closing: str | None = None  # the close code name, once a close is decided
        self.heartbeat = Heartbeat(stream.ping_max_missed)
        # The writer runs under one scope (no scope per write: the hot path);
        # a close gives it a deadline of close_grace_s.
        self._writer_scope = trio.CancelScope()
        self._close_deadline = math.inf
        self._writing = False  # between taking frames and having written them
        self.last_write = 0.0  # trio time of the last frame a writer or a direct short wrote
        self._direct_fd = -1  # what the hub was last told (Hub.set_direct)
        self._group: Group | None = None  # the hub group, whose clock counts while direct
        ws.on_direct_change = self._update_direct
        ws.on_control = self._control_waiting
        self._nursery: trio.Nursery | None = None

    # --- Subscriber (the hub's side) ----------------------------------------------

    def deliver(self, batch: FrameBatch, now: float) -> bool:
        n = batch.n
        if self.queued and self.queued + n > self.max_events:
            return False  # (a batch larger than the bound still fits an empty queue)
        try:
            self._enqueue(batch)
        except trio.WouldBlock:
            return False
        self.queued += n
        return True

    def deliver_short(self, batch: FrameBatch, sent: int, now: float) -> bool:
        if sent < 0:  # broken: queued instead, the writer's send_all says so
            return self.deliver(batch, now)
        self._metrics.frames_sent += batch.n
        self.last_write = now
        # The kernel's buffer is full. The rest belongs to the WebSocket (it goes
        # before any other byte, a pong or a close included); a writer sends it.
        self.ws.owe(batch.blob[sent:])
        try:
            self._enqueue(b"")
        except trio.WouldBlock:  # nothing fits: a slow client (the close sends the rest first)
            return False
        return True

    def _update_direct(self) -> None:
        """Tell the hub whether it may write to this client straight from the fan-out.

        It may when nothing is queued and nothing is in flight (no writer), the
        seam is passed (a gate is only ever passed by a writer, which ends once
        it has drained everything behind it), no close is decided, and the
        WebSocket has the socket free (:attr:`WebSocket.direct_fd`). Called,
        synchronously, on every change of any of these.
        """
        eligible = not self._writer_running and self.key is not None and self.closing is None
        fd = self.ws.direct_fd if eligible else -1
        if fd == self._direct_fd:
            return
        if fd < 0 and self._group is not None:  # off the group's clock: keep its last write
            self.last_write = max(self.last_write, self._group.written_at)
        self._direct_fd = fd
        self.session.hub.set_direct(self, fd)

    def _last_outbound(self) -> float:
        """Trio time of the last frame written to this client (the heartbeat's clock)."""
        if self._direct_fd >= 0 and self._group is not None:
            return max(self.last_write, self._group.written_at)
        return self.last_write

    def _enqueue(self, item: _Item) -> None:
        """Hand an item to the writer, starting one if none runs.

        Raises:
            trio.WouldBlock: the channel is full.
        """
        if self._tx is None:
            self._tx, self._rx = trio.open_memory_channel[_Item](self.max_events + _CONTROL_SLACK)
        self._tx.send_nowait(item)
        if not self._writer_running and self._nursery is not None:
            self._writer_running = True
            try:
                self._nursery.start_soon(self._writer, name=f"ws-writer {self.name}")
            except RuntimeError:  # the connection is over: nobody to write to
                self._writer_running = False
            self._update_direct()

    def _discard_queue(self) -> None:
        """Drop everything queued (a slow client resumes with replay)."""
        rx = self._rx
        while rx is not None:
            try:
                item = rx.receive_nowait()
            except trio.WouldBlock:
                return
            if isinstance(item, FrameBatch):
                self.queued -= len(item)

    def overflowed(self) -> None:
        """The slow-client rule (PROTOCOL section 3), once per connection.

        One warning, one close, one count, however many fan-outs (a nested
        one among them: the warning is itself emitted) report the overflow.
        """
        if self.closing is not None:
            return
        self.session.hub.unsubscribe(self)
        self._metrics.slow_clients.inc()
        self.request_close("client_too_slow")
        self.session.warn(
            self.name,
            "client_too_slow",
            f"outbound queue exceeded queue_max_events={self.max_events}; closing with 1008",
        )

    # --- life ----------------------------------------------------------------------------

    async def run(self) -> None:
        metrics = self.node.metrics
        metrics.ws_connections.inc()
        try:
            self.last_write = trio.current_time()
            async with trio.open_nursery() as nursery:
                self._nursery = nursery  # where a writer starts, when there is a backlog
                await self._reader()  # in this task
        finally:
            metrics.ws_connections.dec()
            reason = self.closing or "client_closed"
            metrics.ws_closed.labels(reason).inc()
            self.key = None
            self._update_direct()
            self.ws.on_direct_change = self.ws.on_control = None  # no cycle left between the two
            self.session.unregistered(self, reason)
            self.node.connections.discard(self)
            self.node.notify()

    def request_close(self, code: str) -> None:
        """Close the connection with ``code`` (a :data:`~gateway.protocol.frames.CLOSES` name).

        A shutdown or normal close first sends what is queued (a turn's
        ``turn.cancelled`` must reach the client before the 1001); any other
        close drops the queue (a slow client resumes with replay). Either way
        the writing left gets at most ``close_grace_s``, then the close frame.
        """
        if self.closing is not None:
            return
        self.closing = code  # from now on, only a writer writes
        self._update_direct()
        self._close_deadline = trio.current_time() + self.node.config.stream.close_grace_s
        if code not in _DRAINING_CLOSES:
            self._discard_queue()
        try:
            self._enqueue(_CLOSE)
        except trio.WouldBlock:  # no room even for the marker: drop the queue
            self._discard_queue()
            self._enqueue(_CLOSE)
        if self._writer_running:  # a write in progress is finished, within the grace
            self._writer_scope.deadline = self._close_deadline

    def _put(self, frame: bytes) -> None:
        """Queue a control frame (already framed); a full queue is a slow client."""
        try:
            self._enqueue(frame)
        except trio.WouldBlock:
            self.overflowed()

    def _control_waiting(self) -> None:
        """A pong waits in the WebSocket: a writer sends it, before any queued frame."""
        self._put(b"")

    def _send_frame(self, obj: object) -> None:
        self._put(text_frame(encode(obj)))

    # --- reader --------------------------------------------------------------------------

    async def _reader(self) -> None:
        """Client frames, and the connection's two clocks (PROTOCOL section 3).

        The reader is idle nearly all the time, so it also keeps the subscribe
        deadline and the heartbeat: after ``ping_interval_s`` without an
        outbound frame it pings, and closes 1001 after ``ping_max_missed``.
        """
        config = self.node.config.stream
        interval = config.ping_interval_s
        subscribe_by = trio.current_time() + config.subscribe_timeout_s
        while True:
            wake_at = self._last_outbound() + interval
            if self.key is None:
                wake_at = min(wake_at, subscribe_by)
            # The clock counts only while the reader waits for bytes: what
            # came is handled whole (gateway.server.websocket, module docstring).
            message = await self.ws.receive(wake_at if self.closing is None else math.inf)
            if isinstance(message, Idle):
                self._on_timer(subscribe_by, interval)
                continue
            if message is None:
                break
            if self.closing is not None:
                continue
            if isinstance(message, bytes):
                self._send_frame(ErrorFrame("invalid_frame", "binary frames are not accepted"))
                continue
            try:
                frame = decode_client_frame(message)
                if isinstance(frame, Subscribe):
                    await self._subscribe(frame)
                elif isinstance(frame, Ping):
                    self._send_frame(Pong(frame.nonce))
                elif isinstance(frame, Pong):
                    self.heartbeat.on_pong(frame.nonce)
                elif isinstance(frame, Cancel):
                    self._cancel(frame)
            except FrameRejected as exc:
                self._send_frame(ErrorFrame(exc.code, exc.message))
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()

    async def _subscribe(self, frame: Subscribe) -> None:
        if self.key is not None:
            raise FrameRejected("already_subscribed", "this connection is already subscribed")
        session = self.session
        config = self.node.config.stream
        try:
            resolved, key = resolve_filter(frame.filter)
        except SubscribeRejected as exc:
            self._send_frame(SubscribeError(exc.code, exc.message))  # type: ignore[arg-type]
            return
        gate = Gate()
        self._enqueue(gate)  # the slack always has room for it
        self._group = session.hub.subscribe(self, key)
        self.key = key
        self._update_direct()
        try:
            if frame.snapshot:
                snap, cut = await session.snapshot_durable(config.snapshot_messages)
                ack = SubscribeAck(resolved, None, True, 0)
                gate.open(text_frame(encode(ack)) + text_frame(encode(snap)), cut)
            elif frame.since is not None:
                replay = await session.replay(frame.since, key, config.replay_max_events)
                ack = SubscribeAck(resolved, frame.since, False, len(replay.frames))
                gate.open(text_frame(encode(ack)) + b"".join(replay.frames), replay.cut)
                self.node.metrics.replays.inc(len(replay.frames))
            else:
                gate.open(text_frame(encode(SubscribeAck(resolved, None, False, 0))), 0)
        except SubscribeRejected as exc:
            session.hub.unsubscribe(self)
            self.key = None
            self._update_direct()
            error = SubscribeError(exc.code, exc.message)  # type: ignore[arg-type]
            gate.open(text_frame(encode(error)), sys.maxsize)  # drop what queued behind it

    def _cancel(self, frame: Cancel) -> None:
        if self.key is None:
            raise FrameRejected("subscribe_required", "subscribe before sending cancel")
        try:
            self.session.cancel_turn(frame.turn_id, frame.reason or "user", self.name)
        except ApiError as exc:
            raise FrameRejected(exc.code, exc.message) from None

    # --- writer --------------------------------------------------------------------------

    def _on_timer(self, subscribe_by: float, interval: float) -> None:
        now = trio.current_time()
        if self.key is None and now >= subscribe_by:
            self.request_close("subscribe_timeout")
        elif now >= self._last_outbound() + interval:
            nonce = self.heartbeat.on_idle()
            if nonce is None:
                self.request_close("heartbeat_timeout")
            else:
                self._put(text_frame(encode(Ping(nonce))))
                self.last_write = now

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
                await self.ws.close(ws_code, reason, grace_s=self.node.config.stream.close_grace_s)
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
            channel is released: the next backlog gets a new one).
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

    async def _drain(self, item: _Item, cut: int) -> int:
        """Write ``item`` and everything queued behind it; the new cut, or -1 to stop."""
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
                self.queued -= len(item)
                data = item.blob if item.seqs[0] > cut else item.after(cut)
                if data:
                    parts.append(data)
                    events += len(item)
            elif isinstance(item, Gate):
                if parts:
                    await self._write(b"".join(parts))
                    parts = []
                await item.ready.wait()
                parts.append(item.payload)
                cut = item.cut
            else:
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

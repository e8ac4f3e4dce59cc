"""One client's WebSocket on a session stream (PROTOCOL section 3).

Task tree of a connection::

    ws <name>               StreamConnection.run: the reader (client frames:
    │                       subscribe, cancel, ping, pong) and the connection's
    │                       two clocks, the subscribe deadline and the heartbeat
    └── ws-writer <name>    only while the client has a backlog
                            (gateway.server.outbound)

Where the rest of a connection lives: its bound, writer, slow-client rule and
close in :mod:`gateway.server.outbound`; what a ``subscribe`` does (register,
cut, replay or snapshot, then live) in :mod:`gateway.session.seam`; the close
codes in :mod:`gateway.protocol.closes`.
"""

from __future__ import annotations

import itertools
import logging
import math
import secrets

import trio

from gateway.errors import ApiError, FrameRejected, SubscribeRejected
from gateway.protocol.filters import resolve_filter
from gateway.protocol.frames import (
    Cancel,
    ErrorFrame,
    Ping,
    Pong,
    Subscribe,
    SubscribeError,
    decode_client_frame,
    encode,
)
from gateway.protocol.framing import text_frame
from gateway.server.outbound import Outbound
from gateway.server.websocket import Idle, WebSocket
from gateway.session import seam
from gateway.session.session import Session

log = logging.getLogger("gateway.stream")

_names = itertools.count(1)


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
        self.ws = ws
        self.name = f"ws-{next(_names)}"
        self.config = session.node.config.stream
        self.outbound = Outbound(session, ws, self.name, self.config, session.node.metrics)
        self.heartbeat = Heartbeat(self.config.ping_max_missed)

    @property
    def closing(self) -> str | None:
        """The name of the close decided for this connection, if any."""
        return self.outbound.closing

    @property
    def subscribed(self) -> bool:
        return self.outbound.subscribed

    def request_close(self, code: str) -> None:
        """Close with the close named ``code`` (:meth:`Outbound.request_close`)."""
        self.outbound.request_close(code)

    async def run(self) -> None:
        metrics = self.session.node.metrics
        metrics.ws_connections.inc()
        try:
            async with trio.open_nursery() as nursery:
                self.outbound.bind(nursery)
                await self._reader()  # in this task
                nursery.cancel_scope.cancel()  # the client is gone: so is a writer
        finally:
            metrics.ws_connections.dec()
            reason = self.outbound.closing or "client_closed"
            metrics.ws_closed.labels(reason).inc()
            self.outbound.release()
            self.session.unregistered(self.outbound, reason)

    # --- reader --------------------------------------------------------------------------

    async def _reader(self) -> None:
        """Client frames, and the connection's two clocks (PROTOCOL section 3).

        The reader is idle nearly all the time, so it also keeps the subscribe
        deadline and the heartbeat: after ``ping_interval_s`` without an
        outbound frame it pings, and closes 1001 after ``ping_max_missed``.
        """
        out = self.outbound
        interval = self.config.ping_interval_s
        subscribe_by = trio.current_time() + self.config.subscribe_timeout_s
        while True:
            wake_at = out.last_outbound() + interval
            if not out.subscribed:
                wake_at = min(wake_at, subscribe_by)
            # The clock counts only while the reader waits for bytes: what
            # came is handled whole (gateway.server.websocket, module docstring).
            message = await self.ws.receive(wake_at if out.closing is None else math.inf)
            if isinstance(message, Idle):
                self._on_timer(subscribe_by, interval)
                continue
            if message is None:
                break
            if out.closing is not None:
                continue
            if isinstance(message, bytes):
                out.send(ErrorFrame("invalid_frame", "binary frames are not accepted"))
                continue
            try:
                frame = decode_client_frame(message)
                if isinstance(frame, Subscribe):
                    await self._subscribe(frame)
                elif isinstance(frame, Ping):
                    out.send(Pong(frame.nonce))
                elif isinstance(frame, Pong):
                    self.heartbeat.on_pong(frame.nonce)
                elif isinstance(frame, Cancel):
                    self._cancel(frame)
            except FrameRejected as exc:
                out.send(ErrorFrame(exc.code, exc.message))

    async def _subscribe(self, frame: Subscribe) -> None:
        if self.outbound.subscribed:
            raise FrameRejected("already_subscribed", "this connection is already subscribed")
        try:
            resolved, key = resolve_filter(frame.filter)
        except SubscribeRejected as exc:
            self.outbound.send(SubscribeError(exc.code, exc.message))  # type: ignore[arg-type]
            return
        await seam.subscribe(self.session, self.outbound, frame, resolved, key, self.config)

    def _cancel(self, frame: Cancel) -> None:
        if not self.outbound.subscribed:
            raise FrameRejected("subscribe_required", "subscribe before sending cancel")
        try:
            self.session.cancel_turn(frame.turn_id, frame.reason or "user", self.name)
        except ApiError as exc:
            raise FrameRejected(exc.code, exc.message) from None

    def _on_timer(self, subscribe_by: float, interval: float) -> None:
        out = self.outbound
        now = trio.current_time()
        if not out.subscribed and now >= subscribe_by:
            out.request_close("subscribe_timeout")
        elif now >= out.last_outbound() + interval:
            nonce = self.heartbeat.on_idle()
            if nonce is None:
                out.request_close("heartbeat_timeout")
            else:
                out.put(text_frame(encode(Ping(nonce))))
                out.last_write = now

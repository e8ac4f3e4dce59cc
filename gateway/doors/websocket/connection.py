"""One client's WebSocket on a session stream (docs/protocol.md §3).

Task tree of a connection::

    ws <name>               StreamConnection.run: the reader (client frames:
    │                       subscribe, cancel, ping, pong) and the connection's
    │                       two clocks, the subscribe deadline and the heartbeat
    └── ws-writer <name>    only while the client has a backlog
                            (gateway.doors.websocket.outbound)

Where the rest of a connection lives: its bound, writer, slow-client rule and
close in :mod:`gateway.doors.websocket.outbound`; what a ``subscribe`` does (register,
cut, replay or snapshot, then live) in :mod:`gateway.session.seam`; the close
codes in :mod:`gateway.protocol.closes`.
"""

from __future__ import annotations

import itertools
import logging
import math
import secrets

import trio

from gateway.doors.websocket.outbound import Outbound
from gateway.errors import FrameRejected, Refused, SubscribeRejected
from gateway.http.timers import coarse
from gateway.http.websocket import Idle, WebSocket
from gateway.logs import client_label, event
from gateway.metrics import close_code_label
from gateway.protocol.closes import CLOSES
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
from gateway.session import seam
from gateway.session.session import Session

log = logging.getLogger("gateway.stream")

_names = itertools.count(1)


class Heartbeat:
    """Ping bookkeeping (docs/protocol.md §3 "Heartbeat"), sans-IO.

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
    """A client attached to one session's stream.

    Args:
        session: the session it attached to.
        ws: its WebSocket, past the handshake.
        address: the client's address, for the log (``host:port``; empty if unknown).
    """

    def __init__(self, session: Session, ws: WebSocket, address: str = "") -> None:
        self.session = session
        self.ws = ws
        self.name = f"ws-{next(_names)}"
        self.client = client_label(self.name, address)  # the log's ``client`` field
        self.config = session.node.config.stream
        self.outbound = Outbound(
            session, ws, self.name, self.config, session.node.metrics, client=self.client
        )
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
        opened = trio.current_time()
        event(
            log, logging.INFO, "client_attached",
            f"{self.client} attached to {self.session.id}",
            session_id=self.session.id, client=self.client,
        )  # fmt: skip
        try:
            async with trio.open_nursery() as nursery:
                self.outbound.bind(nursery)
                if self.session.node.shutting_down:  # attached while the gateway drains
                    self.request_close("shutdown")
                elif self.session.deleted:  # attached while it was deleted (gateway.node.deletion)
                    self.request_close("session_deleted")
                await self._reader()  # in this task
                nursery.cancel_scope.cancel()  # the client is gone: so is a writer
        finally:
            metrics.ws_connections.dec()
            reason, code = self._how_closed()
            metrics.ws_closed.labels(reason, close_code_label(code)).inc()
            self.outbound.release()
            self.session.unregistered(self.outbound, reason)
            event(
                log, logging.INFO, "client_closed",
                f"{self.client} closed ({reason}, {code}) after"
                f" {round(trio.current_time() - opened, 3)} s",
                session_id=self.session.id, client=self.client, code=code, reason=reason,
                duration_ms=round((trio.current_time() - opened) * 1000),
            )  # fmt: skip

    def _how_closed(self) -> tuple[str, int | None]:
        """The close's name and WebSocket code (docs/protocol.md §3), for the metric and log.

        The code is the first close frame sent or received (1006: none, the
        connection dropped); a close the gateway decided but had no time to
        send is the table's code.
        """
        closing = self.outbound.closing
        code = self.ws.close_code
        if code is None and closing is not None:
            code = CLOSES[closing].ws_code
        if closing is not None:
            return closing, code
        if code == CLOSES["frame_too_large"].ws_code:  # the WebSocket closed it by itself
            return "frame_too_large", code
        return "client_closed", code

    # --- reader --------------------------------------------------------------------------

    async def _reader(self) -> None:
        """Client frames, and the connection's two clocks (docs/protocol.md §3).

        The reader is idle nearly all the time, so it also keeps the subscribe
        deadline and the heartbeat: after ``ping_interval_s`` without an
        outbound frame it pings, and closes 1001 after ``ping_max_missed``.
        """
        out = self.outbound
        interval = self.config.ping_interval_s
        subscribe_by = trio.current_time() + self.config.subscribe_timeout_s
        while True:
            wake_at = coarse(out.last_outbound() + interval, interval)  # one clock for all
            if not out.subscribed:
                wake_at = min(wake_at, subscribe_by)
            # The clock counts only while the reader waits for bytes: what
            # came is handled whole (gateway.http.websocket, module docstring).
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
                    await self._cancel(frame)
            except FrameRejected as exc:
                out.send(ErrorFrame(exc.code, exc.message))

    async def _subscribe(self, frame: Subscribe) -> None:
        if self.outbound.subscribed:
            raise FrameRejected("already_subscribed", "this connection is already subscribed")
        try:
            resolved, key = resolve_filter(frame.filter)
        except SubscribeRejected as exc:
            self.outbound.send(SubscribeError(exc.code, exc.message))  # type: ignore[arg-type]
            self._log_subscribe_refused(exc)
            return
        done = await seam.subscribe(self.session, self.outbound, frame, resolved, key, self.config)
        if done.error is not None:
            self._log_subscribe_refused(done.error)
            return
        event(
            log, logging.INFO, "client_subscribed",
            f"{self.client} subscribed to {self.session.id} ({done.mode})",
            session_id=self.session.id, client=self.client, mode=done.mode,
            filter=frame.filter if isinstance(frame.filter, str) else "custom",
            since=frame.since, replayed=done.replayed if done.mode == "replay" else None,
        )  # fmt: skip

    def _log_subscribe_refused(self, exc: SubscribeRejected) -> None:
        event(
            log, logging.INFO, "client_subscribe_refused",
            f"{self.client}: subscribe refused: {exc.code}: {exc.message}",
            session_id=self.session.id, client=self.client, code=exc.code,
        )  # fmt: skip

    async def _cancel(self, frame: Cancel) -> None:
        if not self.outbound.subscribed:
            raise FrameRejected("subscribe_required", "subscribe before sending cancel")
        try:
            await self.session.node.cancel_turn(  # on whichever node runs the session
                self.session, frame.turn_id, frame.reason or "user", self.name
            )
        except Refused as exc:  # an error frame of the same code (gateway.http.refusals)
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

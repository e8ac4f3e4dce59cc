"""The soak's clients, each a task that owns its sockets: stayers, churners, slow clients, killers.

They are independent of the daemon: trio-websocket over a socket the client
opens itself (so it can shrink its receive buffer), httpx for the attach
token (``GET /sessions/{id}``, docs/protocol.md §2), the reference codec and
reducer to read what arrives (:mod:`bench.soak.audit`). The killers speak raw
TCP, since what they do is what no library would: stop mid-handshake or
mid-frame, then reset the socket.

- :class:`Stayer`: attached from before the first turn to after the last;
  must receive every event of its session once, in order. The session's turn
  runner (:mod:`bench.soak.run`) watches the turns through it, and sends
  ``cancel`` frames over it.
- :func:`churn`: attach, read a while, close (cleanly or by dropping the
  TCP connection), come back with ``since`` = the last event id received.
- :func:`stall`: subscribe, stop reading until the server closes the
  connection with 1008 ``client_too_slow`` (docs/protocol.md §3), then read the
  rest and come back with ``since``.
- :func:`kill`: half a handshake, half a frame, then a TCP reset.
- :func:`replay_ids`: a replay from a cursor, for the *lost* check.
"""

from __future__ import annotations

import json
import random
import socket
import struct
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx
import trio
from trio_websocket import (
    ConnectionClosed,
    HandshakeError,
    WebSocketConnection,
    wrap_client_stream,
)

from bench.soak.audit import REPLAYABLE, StreamAudit
from bench.wire import client_frame
from gateway.client import decode_server_frame
from gateway.errors import FrameRejected
from gateway.protocol.events import BusHandlerWarning, Event
from gateway.protocol.frames import (
    ErrorFrame,
    EventFrame,
    Ping,
    ServerFrame,
    Snapshot,
    SubscribeAck,
    SubscribeError,
)

TURN_ENDS = ("turn.completed", "turn.cancelled")
# What a client meets when the server closes on it, refuses it, or is gone.
CONNECT_ERRORS = (
    ConnectionClosed, HandshakeError, OSError, trio.BrokenResourceError, httpx.HTTPError
)  # fmt: skip


def subscribe_frame(since: str | None, *, snapshot: bool = False) -> str:
    """A ``subscribe`` for every event (docs/protocol.md §3, ``preset:full``)."""
    return json.dumps(
        {"type": "subscribe", "filter": "preset:full", "since": since, "snapshot": snapshot}
    )


async def attach_url(http: httpx.AsyncClient, session_id: str) -> str:
    """The session's ``ws_url`` with a fresh attach token (docs/protocol.md §2)."""
    answer = await http.get(f"/sessions/{session_id}")
    answer.raise_for_status()
    return str(answer.json()["ws_url"])


@dataclass
class Conn:
    """An open client WebSocket and the TCP stream under it."""

    ws: WebSocketConnection
    stream: trio.SocketStream
    dropped: bool = False

    async def drop(self) -> None:
        """Close the TCP connection without a WebSocket close frame."""
        self.dropped = True
        await trio.aclose_forcefully(self.stream)

    async def recv(self) -> ServerFrame:
        """The next server frame, decoded; a server ``ping`` is answered on the way."""
        while True:
            frame = decode_server_frame(await self.ws.get_message())
            if isinstance(frame, Ping):
                await self.ws.send_message(json.dumps({"type": "pong", "nonce": frame.nonce}))
                continue
            return frame


@asynccontextmanager
async def connect(
    http: httpx.AsyncClient, session_id: str, *, rcvbuf: int = 0, read_size: int = 65536
) -> AsyncIterator[Conn]:
    """A WebSocket to ``session_id``'s stream, on a socket of our own.

    Leaving the block normally closes with 1000 and the close handshake; leaving
    it with an exception (a cancel included) drops the TCP connection.

    Args:
        rcvbuf: ``SO_RCVBUF`` before connecting (small: a stalled client backs
            up into the server's queue sooner).
        read_size: bytes per read of the socket.
    """
    url = urlsplit(await attach_url(http, session_id))
    assert url.hostname is not None and url.port is not None
    sock = trio.socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        if rcvbuf:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        await sock.connect((url.hostname, url.port))
    except BaseException:
        sock.close()
        raise
    stream = trio.SocketStream(sock)
    try:
        async with trio.open_nursery() as nursery:
            ws = await wrap_client_stream(
                nursery, stream, url.netloc, f"{url.path}?{url.query}",
                message_queue_size=1, receive_buffer_size=read_size,
            )  # fmt: skip
            conn = Conn(ws, stream)
            try:
                yield conn
            except BaseException:
                await conn.drop()
                raise
            if not conn.dropped:
                with trio.move_on_after(5):
                    await ws.aclose()
            await trio.aclose_forcefully(stream)
    except BaseExceptionGroup as group:
        raise _single(group) from None
    finally:
        await trio.aclose_forcefully(stream)


def _single(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The one exception a nursery wrapped (the body's, or its reader task's)."""
    leaves: list[BaseException] = []
    stack: list[BaseException] = [group]
    while stack:
        exc = stack.pop()
        if isinstance(exc, BaseExceptionGroup):
            stack.extend(exc.exceptions)
        else:
            leaves.append(exc)
    return leaves[0] if len(leaves) == 1 else group


# --- stayers ------------------------------------------------------------------------


class Stayer:
    """The client that stays attached to one session for the whole soak.

    It subscribes with a snapshot before the session's first turn, so every
    event of the session after ``since0`` must reach it once, in order
    (:class:`~bench.soak.audit.StreamAudit` with ``keep_replayable``). Events
    are also kept by turn id until the session's runner takes them.
    """

    def __init__(self, http: httpx.AsyncClient, session_id: str) -> None:
        self.http = http
        self.session_id = session_id
        self.audit = StreamAudit(session_id, keep_replayable=True)
        self.turns: dict[str, list[Event]] = {}
        self.slow_warnings = 0  # bus.handler_warning client_too_slow seen
        self.error_frames: list[str] = []
        self.since0 = ""  # the snapshot's event id: the cursor every audit starts from
        self.dropped: str | None = None  # why the server closed it, if it did
        self._conn: Conn | None = None
        self._closing = False
        self._changed = trio.Event()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with connect(self.http, self.session_id) as conn:
            self._conn = conn
            await conn.ws.send_message(subscribe_frame(None, snapshot=True))
            ack, snapshot = await conn.recv(), await conn.recv()
            if not isinstance(ack, SubscribeAck) or not isinstance(snapshot, Snapshot):
                raise RuntimeError(f"stayer of {self.session_id}: got {ack!r}, {snapshot!r}")
            if snapshot.snapshot_at_event_id is None:
                raise RuntimeError("snapshot_at_event_id is null: the node has issued no event")
            self.since0 = snapshot.snapshot_at_event_id
            self.audit.feed(snapshot)
            task_status.started()
            try:
                while True:
                    self._take(await conn.recv())
            except ConnectionClosed as exc:
                if not self._closing:
                    self.dropped = f"closed by the server: {exc.reason}"
            except FrameRejected as exc:
                self.dropped = f"undecodable frame: {exc}"
            except CONNECT_ERRORS as exc:
                if not self._closing:
                    self.dropped = f"connection lost: {exc!r}"

    def _take(self, frame: ServerFrame) -> None:
        self.audit.feed(frame)
        if isinstance(frame, EventFrame):
            event = frame.event
            if event.turn_id is not None:
                self.turns.setdefault(event.turn_id, []).append(event)
            payload = event.payload
            if isinstance(payload, BusHandlerWarning) and payload.reason == "client_too_slow":
                self.slow_warnings += 1
        elif isinstance(frame, ErrorFrame | SubscribeError):
            self.error_frames.append(f"{self.session_id}: {frame!r}")
        self._changed.set()
        self._changed = trio.Event()

    async def wait(self, done: Callable[[], bool], timeout_s: float) -> bool:
        """Wait until ``done()`` holds after some frame (False after ``timeout_s``)."""
        with trio.move_on_after(timeout_s):
            while not done():
                if self.dropped is not None:
                    return False
                await self._changed.wait()
            return True
        return False

    async def send(self, frame: dict[str, Any]) -> None:
        assert self._conn is not None
        await self._conn.ws.send_message(json.dumps(frame))

    async def close(self) -> None:
        """Close cleanly (1000): the soak is over."""
        self._closing = True
        if self._conn is not None:
            await self._conn.ws.aclose()


# --- churn, slow clients, killers -------------------------------------------------------


@dataclass
class ChurnStats:
    """What the churning and stalling clients saw, all sessions together."""

    connections: int = 0
    connect_errors: int = 0
    subscribe_errors: list[str] = field(default_factory=list)
    snapshots_after_error: int = 0
    audits: dict[tuple[int, str], StreamAudit] = field(default_factory=dict)
    # slow clients
    stalls: int = 0
    closed_too_slow: int = 0
    stalls_without_overflow: int = 0
    other_closes: list[str] = field(default_factory=list)

    def audit(self, client: int, session_id: str) -> StreamAudit:
        key = (client, session_id)
        if key not in self.audits:
            self.audits[key] = StreamAudit(session_id)
        return self.audits[key]


async def _subscribe(conn: Conn, audit: StreamAudit, stats: ChurnStats) -> bool:
    """Subscribe from the audit's cursor (a snapshot the first time); True once acked.

    A cursor the server refuses (``cursor_expired``, ``replay_too_large``)
    is counted, and the client falls back to a snapshot, as a real one would.
    """
    since = audit.last_id
    audit.resubscribed()
    await conn.ws.send_message(subscribe_frame(since, snapshot=since is None))
    answer = await conn.recv()
    if isinstance(answer, SubscribeError):
        stats.subscribe_errors.append(f"{audit.session_id} since {since}: {answer.code}")
        audit.restart()
        audit.last_id = None
        stats.snapshots_after_error += 1
        await conn.ws.send_message(subscribe_frame(None, snapshot=True))
        answer = await conn.recv()
    if not isinstance(answer, SubscribeAck):
        stats.subscribe_errors.append(f"{audit.session_id}: answered {answer!r}"[:300])
        return False
    return True


async def churn(
    http: httpx.AsyncClient,
    sessions: list[str],
    index: int,
    stats: ChurnStats,
    rng: random.Random,
    *,
    read_s: tuple[float, float],
    pause_s: tuple[float, float],
) -> None:
    """Attach, read, close, come back with ``since``: forever (module docstring).

    Client ``index`` visits the sessions in turn; a third of its closes drop
    the TCP connection instead of closing the WebSocket.
    """
    visit = index
    while True:
        session_id = sessions[visit % len(sessions)]
        visit += 1
        audit = stats.audit(index, session_id)
        try:
            async with connect(http, session_id) as conn:
                stats.connections += 1
                if await _subscribe(conn, audit, stats):
                    with trio.move_on_after(rng.uniform(*read_s)):
                        while True:
                            audit.feed(await conn.recv())
                if rng.random() < 1 / 3:
                    await conn.drop()
        except CONNECT_ERRORS:
            stats.connect_errors += 1
        await trio.sleep(rng.uniform(*pause_s))


async def stall(
    http: httpx.AsyncClient,
    stayer: Stayer,
    index: int,
    stats: ChurnStats,
    stalled: Callable[[bool], None],
    *,
    max_stall_s: float,
    pause_s: float,
) -> None:
    """A client of ``stayer``'s session that stops reading, forever (module docstring).

    It knows the server gave up on it from the session's stream: the stayer
    sees ``bus.handler_warning`` (``client_too_slow``), which the server emits
    on overflow. ``stalled(True)`` tells the session's runner to stream text
    meanwhile, so the overflow comes within seconds.
    """
    session_id = stayer.session_id
    audit = stats.audit(-1 - index, session_id)
    while True:
        try:
            async with connect(http, session_id, rcvbuf=4096, read_size=4096) as conn:
                stats.connections += 1
                if await _subscribe(conn, audit, stats):
                    await _stall_once(conn, stayer, audit, stats, stalled, max_stall_s)
        except CONNECT_ERRORS:
            stats.connect_errors += 1
        await trio.sleep(pause_s)


async def _stall_once(
    conn: Conn,
    stayer: Stayer,
    audit: StreamAudit,
    stats: ChurnStats,
    stalled: Callable[[bool], None],
    max_stall_s: float,
) -> None:
    warnings = stayer.slow_warnings
    stats.stalls += 1
    stalled(True)
    try:
        overflowed = await stayer.wait(lambda: stayer.slow_warnings > warnings, max_stall_s)
    finally:
        stalled(False)
    code = await _read_to_close(conn, audit, 10.0 if overflowed else 1.0)
    if code == "client_too_slow":
        stats.closed_too_slow += 1
    elif not overflowed:
        stats.stalls_without_overflow += 1
    else:
        stats.other_closes.append(f"{audit.session_id}: {code or 'not closed'}")


async def _read_to_close(conn: Conn, audit: StreamAudit, within_s: float) -> str:
    """Read what is left; the close reason's code ("" when the server did not close)."""
    with trio.move_on_after(within_s):
        try:
            while True:
                audit.feed(await conn.recv())
        except ConnectionClosed as exc:
            if exc.reason is None:
                return "closed without a reason"
            reason = exc.reason.reason or ""
            try:
                return str(json.loads(reason).get("code", reason))
            except ValueError:
                return f"{exc.reason.code} {reason}"
    return ""


KILLS = ("connect_reset", "half_handshake", "half_subscribe", "half_frame_live")


async def kill(host: str, port: int, http: httpx.AsyncClient, session_id: str, kind: str) -> None:
    """One client that dies mid-frame or mid-handshake: a TCP reset (SO_LINGER 0).

    - ``connect_reset``: connects and resets at once;
    - ``half_handshake``: half of the upgrade request, then the reset;
    - ``half_subscribe``: the handshake, then half of a masked ``subscribe`` frame;
    - ``half_frame_live``: subscribed, reading live events, then half a ``ping`` frame.
    """
    sock = trio.socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        await sock.connect((host, port))
        if kind != "connect_reset":
            url = urlsplit(await attach_url(http, session_id))
            request = (
                f"GET {url.path}?{url.query} HTTP/1.1\r\nHost: {url.netloc}\r\n"
                "Upgrade: websocket\r\nConnection: Upgrade\r\n"
                "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
            ).encode()
            if kind == "half_handshake":
                await sock.send(request[: len(request) // 2])
                await trio.sleep(0.2)
                return
            await sock.send(request)
            await _read_until(sock, b"\r\n\r\n")
            frame = client_frame(subscribe_frame(None).encode())
            if kind == "half_subscribe":
                await sock.send(frame[: len(frame) // 2])
                await trio.sleep(0.2)
                return
            await sock.send(frame)
            with trio.move_on_after(0.5):
                while await sock.recv(65536):
                    pass
            ping = client_frame(json.dumps({"type": "ping", "nonce": "x" * 40}).encode())
            await sock.send(ping[: len(ping) // 2])
            await trio.sleep(0.1)
    finally:
        sock.close()  # SO_LINGER 0: a reset


async def _read_until(sock: trio.socket.SocketType, marker: bytes) -> None:
    data = b""
    with trio.fail_after(10):
        while marker not in data:
            chunk = await sock.recv(4096)
            if not chunk:
                raise ConnectionError("closed during the handshake")
            data += chunk


# --- the lost check -----------------------------------------------------------------


async def replay_ids(http: httpx.AsyncClient, session_id: str, since: str) -> list[str]:
    """The replayable event ids of a replay after ``since`` (docs/protocol.md §3).

    Raises:
        RuntimeError: the server refused the cursor.
    """
    async with connect(http, session_id) as conn:
        await conn.ws.send_message(subscribe_frame(since))
        ack = await conn.recv()
        if not isinstance(ack, SubscribeAck):
            raise RuntimeError(f"replay of {session_id} since {since}: {ack!r}"[:300])
        ids: list[str] = []
        count = 0
        while count < ack.replay_event_count:
            frame = await conn.recv()
            if isinstance(frame, EventFrame):
                count += 1
                if frame.event.type in REPLAYABLE:
                    ids.append(frame.event.id)
        return ids

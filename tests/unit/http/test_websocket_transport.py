"""The WebSocket transport (gateway.http.websocket, and the upgrade in gateway.http.server).

Test rules: the framing and the close handshake are checked against an
independent parser, wsproto's client side, over ``memory_stream_pair`` under
``autojump_clock`` (grace periods pass in virtual time). The upgrade through
:func:`serve_connection` is driven on real sockets by a second independent
implementation, trio-websocket's client. Close codes and reasons are asserted
exactly (docs/protocol.md §3).
"""

from __future__ import annotations

import base64
import collections
import contextlib
import logging
from collections.abc import AsyncIterator
from functools import partial

import msgspec
import pytest
import trio
import trio.testing
import trio_websocket
from wsproto.connection import Connection, ConnectionType
from wsproto.events import (
    BytesMessage,
    CloseConnection,
    Event,
    Message,
    Ping,
    Pong,
    TextMessage,
)
from wsproto.utilities import generate_accept_token

from gateway.http.server import (
    HttpLimits,
    Request,
    Response,
    WebSocketAccept,
    error_response,
    serve_connection,
)
from gateway.http.websocket import IDLE, ConnectionClosed, WebSocket
from gateway.protocol.closes import close_reason
from gateway.protocol.framing import text_frame

# --- text_frame --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("size", "header"),
    [
        (0, b"\x81\x00"),
        (125, b"\x81\x7d"),
        (126, b"\x81\x7e\x00\x7e"),
        (65535, b"\x81\x7e\xff\xff"),
        (65536, b"\x81\x7f\x00\x00\x00\x00\x00\x01\x00\x00"),
        (100000, b"\x81\x7f\x00\x00\x00\x00\x00\x01\x86\xa0"),
    ],
)
def test_text_frame_round_trips_through_wsproto(size: int, header: bytes) -> None:
    payload = bytes(ord("a") + i % 26 for i in range(size))
    frame = text_frame(payload)
    assert frame == header + payload

    client = Connection(ConnectionType.CLIENT)
    client.receive_data(frame)
    events = list(client.events())
    assert all(isinstance(event, TextMessage) for event in events)
    assert "".join(event.data for event in events) == payload.decode()
    assert events[-1].message_finished


# --- WebSocket against a wsproto client, in memory --------------------------------------


class WsClient:
    """The client side of an upgraded connection: wsproto over a memory stream."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.conn = Connection(ConnectionType.CLIENT)
        self.pending: collections.deque[Event] = collections.deque()

    async def send(self, event: Event) -> None:
        await self.stream.send_all(self.conn.send(event))

    async def next_event(self) -> Event | None:
        """The next event from the server, or None at EOF."""
        while not self.pending:
            data = await self.stream.receive_some(65536)
            if not data:
                return None
            self.conn.receive_data(data)
            self.pending.extend(self.conn.events())
        return self.pending.popleft()

    async def expect_close(self) -> CloseConnection:
        event = await self.next_event()
        assert isinstance(event, CloseConnection)
        return event


LIMIT = 1024
TOO_LARGE = close_reason("frame_too_large")


@pytest.fixture
def pair() -> tuple[WebSocket, WsClient]:
    client_end, server_end = trio.testing.memory_stream_pair()
    return WebSocket(server_end, max_message_bytes=LIMIT), WsClient(client_end)


async def test_receive_returns_text_as_str_and_binary_as_bytes(
    pair: tuple[WebSocket, WsClient],
) -> None:
    ws, client = pair
    await client.send(TextMessage(data="h\xe9llo"))
    await client.send(BytesMessage(data=b"\x00\xff"))
    assert await ws.receive() == "h\xe9llo"
    assert await ws.receive() == b"\x00\xff"


async def test_fragments_are_reassembled_up_to_the_limit(
    pair: tuple[WebSocket, WsClient],
) -> None:
    ws, client = pair
    await client.send(Message(data="\xe9" * 300, message_finished=False))  # 600 UTF-8 bytes
    await client.send(Message(data="b" * 424, message_finished=True))
    assert await ws.receive() == "\xe9" * 300 + "b" * 424
    assert not ws.closed


async def test_message_over_the_limit_closes_1009(
    autojump_clock: trio.testing.MockClock, pair: tuple[WebSocket, WsClient]
) -> None:
    ws, client = pair
    await client.send(Message(data=b"x" * 600, message_finished=False))
    await client.send(Message(data=b"x" * 425, message_finished=True))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(client.send, TextMessage(data="dropped after the close"))
        assert await ws.receive() is None
        close = await client.expect_close()
        assert (close.code, close.reason) == TOO_LARGE
        assert await client.next_event() is None  # the server waited 5 s, then dropped
    assert trio.current_time() == pytest.approx(5.0)
    assert (ws.close_code, ws.close_reason) == TOO_LARGE
    assert await ws.receive() is None


async def test_1009_close_ends_at_the_client_reply(pair: tuple[WebSocket, WsClient]) -> None:
    ws, client = pair
    await client.send(BytesMessage(data=b"x" * (LIMIT + 1)))

    async def reply() -> None:
        close = await client.expect_close()
        await client.send(close.response())
        assert await client.next_event() is None

    async with trio.open_nursery() as nursery:
        nursery.start_soon(reply)
        with trio.fail_after(1):
            assert await ws.receive() is None
    assert ws.close_code == 1009


async def test_ping_is_answered_with_pong(pair: tuple[WebSocket, WsClient]) -> None:
    ws, client = pair
    async with trio.open_nursery() as nursery:
        nursery.start_soon(ws.receive)
        await client.send(Ping(payload=b"abc"))
        assert await client.next_event() == Pong(payload=b"abc")
        nursery.cancel_scope.cancel()


async def test_a_pong_goes_to_whoever_writes_next_when_asked_for(
    autojump_clock: trio.testing.MockClock, pair: tuple[WebSocket, WsClient]
) -> None:
    """With ``on_control`` set, the reader never writes: the next send_all carries the pong."""
    ws, client = pair
    asked: list[int] = []
    ws.on_control = lambda: asked.append(1)
    await client.send(Ping(payload=b"abc"))
    assert await ws.receive(trio.current_time() + 1) is IDLE  # it read the ping
    assert asked == [1] and ws.owes
    await ws.send_all(text_frame(b'{"n":1}'))
    assert await client.next_event() == Pong(payload=b"abc")  # before the data
    assert await client.next_event() == TextMessage(data='{"n":1}')
    assert not ws.owes


async def test_a_ping_flood_while_the_writer_waits_holds_one_pong(
    autojump_clock: trio.testing.MockClock, pair: tuple[WebSocket, WsClient]
) -> None:
    """A client that pings and reads nothing cannot make the server hold a pong per ping.

    The writer is stuck on that client (``on_control`` asks it for a write it
    cannot make yet), and the reader keeps reading: each pong kept would cost
    what its ping did, without bound. Only the latest is owed (RFC 6455
    section 5.5.3: a pong for only the most recently processed ping).
    """
    ws, client = pair
    ws.on_control = lambda: None  # the writer: busy with a client that reads nothing
    pings = 2000
    for n in range(pings):
        await client.send(Ping(payload=b"%04d" % n + b"x" * 121))  # 125 bytes, the most
    while await ws.receive(trio.current_time() + 1) is not IDLE:
        pass  # (the reader has read every ping)
    await ws.send_all(text_frame(b'{"n":1}'))
    assert await client.next_event() == Pong(payload=b"%04d" % (pings - 1) + b"x" * 121)
    assert await client.next_event() == TextMessage(data='{"n":1}')


async def test_receive_deadline_bounds_only_the_wait_for_bytes(
    autojump_clock: trio.testing.MockClock, pair: tuple[WebSocket, WsClient]
) -> None:
    ws, client = pair
    assert await ws.receive(trio.current_time() + 5) is IDLE
    assert await ws.receive(trio.current_time() - 1) is IDLE  # already passed: no wait
    await client.send(TextMessage(data="late"))
    assert await ws.receive(trio.current_time() + 5) == "late"  # nothing was lost


async def test_peer_close_is_echoed_and_the_stream_closed(
    pair: tuple[WebSocket, WsClient],
) -> None:
    ws, client = pair
    await client.send(TextMessage(data="last words"))
    await client.send(CloseConnection(code=4000, reason="bye"))
    assert await ws.receive() == "last words"  # data before the close is still delivered
    assert await ws.receive() is None
    echo = await client.expect_close()
    assert (echo.code, echo.reason) == (4000, "")
    assert await client.next_event() is None
    assert ws.closed
    assert (ws.close_code, ws.close_reason) == (4000, "bye")


async def test_close_waits_for_the_reply_then_closes_the_stream(
    autojump_clock: trio.testing.MockClock, pair: tuple[WebSocket, WsClient]
) -> None:
    ws, client = pair
    reason = close_reason("subscribe_timeout")[1]

    async def reply() -> None:
        close = await client.expect_close()
        assert (close.code, close.reason) == (1008, reason)
        await trio.sleep(1)
        await client.send(close.response())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(reply)
        await ws.close(1008, reason)
        assert trio.current_time() == pytest.approx(1.0)
    assert await client.next_event() is None
    assert (ws.close_code, ws.close_reason) == (1008, reason)


async def test_close_gives_up_on_a_silent_peer_after_grace(
    autojump_clock: trio.testing.MockClock, pair: tuple[WebSocket, WsClient]
) -> None:
    ws, client = pair
    await ws.close(1001, grace_s=2.0)
    assert trio.current_time() == pytest.approx(2.0)
    assert (await client.expect_close()).code == 1001
    assert await client.next_event() is None


async def test_close_is_shielded_from_outer_cancellation(
    autojump_clock: trio.testing.MockClock, pair: tuple[WebSocket, WsClient]
) -> None:
    ws, client = pair
    with trio.CancelScope() as scope:
        scope.cancel()
        await ws.close(1001, "going")
    assert trio.current_time() == pytest.approx(5.0)
    close = await client.expect_close()
    assert (close.code, close.reason) == (1001, "going")


async def test_close_is_idempotent(
    autojump_clock: trio.testing.MockClock, pair: tuple[WebSocket, WsClient]
) -> None:
    ws, client = pair
    await ws.close(1000)
    await ws.close(1011)
    assert (await client.expect_close()).code == 1000
    assert await client.next_event() is None
    assert ws.close_code == 1000


async def test_close_from_a_writer_ends_a_blocked_reader(
    pair: tuple[WebSocket, WsClient],
) -> None:
    ws, client = pair
    received: list[str | bytes | None] = []

    async def reader() -> None:
        received.append(await ws.receive())

    async def client_replies() -> None:
        await client.send(TextMessage(data="in flight"))  # crosses our close frame
        close = await client.expect_close()
        await client.send(close.response())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(reader)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(client_replies)
        with trio.fail_after(1):
            await ws.close(1000)
    assert received in (["in flight"], [None])
    assert await ws.receive() is None
    assert ws.close_code == 1000


async def test_send_all_after_close_raises_connection_closed(
    autojump_clock: trio.testing.MockClock, pair: tuple[WebSocket, WsClient]
) -> None:
    ws, _ = pair
    await ws.close(1000, grace_s=0.1)
    with pytest.raises(ConnectionClosed):
        await ws.send_all(text_frame(b"{}"))


async def test_send_all_on_a_broken_stream_raises_connection_closed(
    pair: tuple[WebSocket, WsClient],
) -> None:
    ws, client = pair
    await client.stream.aclose()
    with pytest.raises(ConnectionClosed):
        await ws.send_all(text_frame(b"{}"))
    assert ws.closed
    assert ws.close_code == 1006
    assert await ws.receive() is None


async def test_send_all_writes_joined_frames_in_one_go(pair: tuple[WebSocket, WsClient]) -> None:
    ws, client = pair
    await ws.send_all(text_frame(b'{"n": 1}') + text_frame(b'{"n": 2}'))
    first, second = await client.next_event(), await client.next_event()
    assert isinstance(first, TextMessage) and first.data == '{"n": 1}'
    assert isinstance(second, TextMessage) and second.data == '{"n": 2}'


async def test_eof_ends_receive_with_1006(pair: tuple[WebSocket, WsClient]) -> None:
    ws, client = pair
    await client.stream.send_eof()
    assert await ws.receive() is None
    assert ws.closed
    assert ws.close_code == 1006


async def test_invalid_utf8_fails_the_connection_with_1007(
    pair: tuple[WebSocket, WsClient],
) -> None:
    ws, client = pair
    masked_zero_key = b"\x00\x00\x00\x00"
    await client.stream.send_all(b"\x81\x82" + masked_zero_key + b"\xff\xfe")
    assert await ws.receive() is None
    assert (await client.expect_close()).code == 1007
    assert await client.next_event() is None
    assert ws.close_code == 1007


async def test_aclose_drops_the_stream_without_a_close_frame(
    pair: tuple[WebSocket, WsClient],
) -> None:
    ws, client = pair
    await ws.aclose()
    assert await client.next_event() is None
    assert ws.closed
    assert ws.close_code == 1006


# --- direct: when the fan-out may write straight to the socket ------------------------------


async def _drain(sock: trio.socket.SocketType, count: int) -> bytes:
    got = bytearray()
    while len(got) < count:
        got += await sock.recv(65536)
    return bytes(got)


async def test_direct_is_the_socket_only_while_no_write_holds_the_send_lock() -> None:
    """A direct write while a locked write is half done would interleave two frames."""
    ours, theirs = trio.socket.socketpair()
    ours.setsockopt(trio.socket.SOL_SOCKET, trio.socket.SO_SNDBUF, 4096)
    ws = WebSocket(trio.SocketStream(ours))
    assert ws.direct is not None and ws.direct.fd == ours.fileno()
    big = text_frame(b"x" * 1_000_000)  # far more than the kernel buffers hold
    async with trio.open_nursery() as nursery:
        nursery.start_soon(ws.send_all, big)
        await trio.testing.wait_all_tasks_blocked()  # send_all waits for room
        assert ws.direct is None
        assert await _drain(theirs, len(big)) == big
    assert ws.direct is not None  # the write is done: direct writes again
    await ws.aclose()
    assert ws.direct is None
    theirs.close()


async def test_direct_is_gone_once_a_close_frame_is_sent(
    autojump_clock: trio.testing.MockClock,
) -> None:
    ours, theirs = trio.socket.socketpair()
    ws = WebSocket(trio.SocketStream(ours))
    await ws.close(1000, "bye", grace_s=5)  # no reply comes: it gives up after the grace
    assert ws.closed and ws.direct is None
    assert (await theirs.recv(100)).startswith(b"\x88")  # the close frame went out
    theirs.close()


# --- the upgrade through serve_connection ----------------------------------------------


class App:
    """Toy routes: ``/echo`` echoes text, ``/forbidden`` refuses the handshake with a 403."""

    def __init__(self) -> None:
        self.sockets: list[WebSocket] = []
        self.finished = trio.Event()

    async def handler(self, request: Request) -> Response | WebSocketAccept:
        if request.path == "/forbidden":
            return error_response(403, "forbidden", "The attach token is not valid.")
        if request.path == "/echo":
            return WebSocketAccept(self.echo)
        if request.path == "/crash":
            return WebSocketAccept(self.crash)
        if request.path == "/leave":
            return WebSocketAccept(self.leave)
        return error_response(404, "not_found", "No such route.")

    async def echo(self, ws: WebSocket) -> None:
        self.sockets.append(ws)
        try:
            while (message := await ws.receive()) is not None:
                if message == "close-me":
                    await ws.close(*close_reason("subscribe_timeout"))
                    return
                text = message if isinstance(message, str) else message.decode()
                await ws.send_all(text_frame(text.encode()))
        finally:
            self.finished.set()

    async def crash(self, ws: WebSocket) -> None:
        raise RuntimeError("session bug")

    async def leave(self, ws: WebSocket) -> None:
        await ws.send_all(text_frame(b"bye"))


@pytest.fixture
def app() -> App:
    return App()


@pytest.fixture
async def port(nursery: trio.Nursery, app: App) -> int:
    limits = HttpLimits(max_client_frame_bytes=LIMIT)

    async def on_connection(stream: trio.SocketStream) -> None:
        await serve_connection(stream, app.handler, limits)

    listeners = await nursery.start(partial(trio.serve_tcp, on_connection, 0, host="127.0.0.1"))
    bound: int = listeners[0].socket.getsockname()[1]
    return bound


@contextlib.asynccontextmanager
async def websocket_client(
    port: int, path: str
) -> AsyncIterator[trio_websocket.WebSocketConnection]:
    """trio-websocket's client over a socket this test owns and closes.

    ``open_websocket_url`` (trio-websocket 0.12) never closes its socket when the
    server closes first or refuses the handshake, which ``filterwarnings = error``
    turns into failures of unrelated tests; the protocol side is the same client.
    """
    async with (
        await trio.open_tcp_stream("127.0.0.1", port) as stream,
        trio.open_nursery() as nursery,
    ):
        ws = await trio_websocket.wrap_client_stream(nursery, stream, f"127.0.0.1:{port}", path)
        try:
            yield ws
        finally:
            with trio.fail_after(5):
                await ws.aclose()


async def test_upgrade_and_echo(port: int) -> None:
    async with websocket_client(port, "/echo") as ws:
        await ws.send_message("hello")
        assert await ws.get_message() == "hello"
        await ws.send_message("x" * LIMIT)  # exactly the limit is fine
        assert await ws.get_message() == "x" * LIMIT


async def test_oversized_message_is_closed_with_1009(port: int) -> None:
    async with websocket_client(port, "/echo") as ws:
        await ws.send_message("x" * (LIMIT + 1))
        with pytest.raises(trio_websocket.ConnectionClosed) as raised:
            await ws.get_message()
    assert raised.value.reason is not None
    assert (raised.value.reason.code, raised.value.reason.reason) == TOO_LARGE


async def test_websocket_ping_gets_a_pong(port: int) -> None:
    async with websocket_client(port, "/echo") as ws:
        with trio.fail_after(5):
            await ws.ping(b"are you there")
        await ws.send_message("still open")
        assert await ws.get_message() == "still open"


async def test_client_close_is_answered(port: int, app: App) -> None:
    async with websocket_client(port, "/echo") as ws:
        await ws.send_message("hi")
        assert await ws.get_message() == "hi"
        with trio.fail_after(5):
            await ws.aclose(4001, "done")
        assert ws.closed is not None
        assert ws.closed.code == 4001  # the server echoed the code
    with trio.fail_after(5):
        await app.finished.wait()
    [server_side] = app.sockets
    assert (server_side.close_code, server_side.close_reason) == (4001, "done")


async def test_server_close_reaches_the_client_with_code_and_reason(port: int) -> None:
    async with websocket_client(port, "/echo") as ws:
        await ws.send_message("close-me")
        with pytest.raises(trio_websocket.ConnectionClosed) as raised:
            await ws.get_message()
    assert raised.value.reason is not None
    code, reason = close_reason("subscribe_timeout")
    assert (raised.value.reason.code, raised.value.reason.reason) == (code, reason)
    assert msgspec.json.decode(reason) == {
        "code": "subscribe_timeout",
        "message": "No subscribe frame in time.",
    }


async def test_refused_handshake_is_an_http_403(port: int) -> None:
    with pytest.RaisesGroup(trio_websocket.ConnectionRejected) as raised:
        async with websocket_client(port, "/forbidden"):
            pytest.fail("the handshake should have been refused")
    [rejected] = raised.value.exceptions
    assert isinstance(rejected, trio_websocket.ConnectionRejected)
    assert rejected.status_code == 403
    assert rejected.body is not None
    assert msgspec.json.decode(rejected.body) == {
        "error": {"code": "forbidden", "message": "The attach token is not valid."}
    }


async def test_run_that_crashes_closes_with_1011(
    port: int, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR, logger="gateway.http"):
        async with websocket_client(port, "/crash") as ws:
            with pytest.raises(trio_websocket.ConnectionClosed) as raised:
                await ws.get_message()
    assert raised.value.reason is not None
    assert (raised.value.reason.code, raised.value.reason.reason) == close_reason("internal_error")
    assert [r.getMessage() for r in caplog.records] == ["WebSocket handler failed on /crash"]


async def test_run_that_returns_without_closing_closes_with_1000(port: int) -> None:
    async with websocket_client(port, "/leave") as ws:
        assert await ws.get_message() == "bye"
        with pytest.raises(trio_websocket.ConnectionClosed) as raised:
            await ws.get_message()
    assert raised.value.reason is not None
    assert (raised.value.reason.code, raised.value.reason.reason) == close_reason("normal")


# --- handshake validation, raw bytes in memory ------------------------------------------

KEY = base64.b64encode(b"0123456789abcdef").decode()


def upgrade_request(
    *,
    method: str = "GET",
    connection: str = "Upgrade",
    upgrade: str = "websocket",
    version: str = "13",
    key: str = KEY,
) -> bytes:
    lines = [
        f"{method} /echo HTTP/1.1",
        "Host: t",
        f"Connection: {connection}",
        f"Upgrade: {upgrade}",
        f"Sec-WebSocket-Version: {version}",
        f"Sec-WebSocket-Key: {key}",
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


async def exchange(app: App, request: bytes) -> bytes:
    """Send ``request`` on a fresh in-memory connection; return everything the server sends."""
    client, server = trio.testing.memory_stream_pair()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(partial(serve_connection, server, app.handler, HttpLimits()))
        await client.send_all(request)
        await client.send_eof()
        data = b""
        while chunk := await client.receive_some(65536):
            data += chunk
    return data


def status_and_headers(raw: bytes) -> tuple[int, dict[str, str]]:
    head = raw.partition(b"\r\n\r\n")[0].decode("latin-1")
    status_line, *lines = head.split("\r\n")
    headers = (line.split(": ", 1) for line in lines)
    return int(status_line.split(" ")[1]), {name.lower(): value for name, value in headers}


def error_code(raw: bytes) -> str:
    code: str = msgspec.json.decode(raw.partition(b"\r\n\r\n")[2])["error"]["code"]
    return code


async def test_websocket_route_without_upgrade_headers_is_426(app: App) -> None:
    raw = await exchange(app, b"GET /echo HTTP/1.1\r\nHost: t\r\n\r\n")
    status, headers = status_and_headers(raw)
    assert status == 426
    assert headers["upgrade"] == "websocket"
    assert error_code(raw) == "upgrade_required"


async def test_unsupported_version_is_426_naming_version_13(app: App) -> None:
    raw = await exchange(app, upgrade_request(version="8"))
    status, headers = status_and_headers(raw)
    assert status == 426
    assert headers["sec-websocket-version"] == "13"
    assert error_code(raw) == "unsupported_websocket_version"


@pytest.mark.parametrize(
    "request_bytes",
    [
        upgrade_request(key="too-short"),
        upgrade_request(key="not base64 at all!!!!!!!"),
        upgrade_request(method="POST"),
    ],
    ids=["short key", "bad base64", "not GET"],
)
async def test_invalid_handshake_is_400(app: App, request_bytes: bytes) -> None:
    raw = await exchange(app, request_bytes)
    assert status_and_headers(raw)[0] == 400
    assert error_code(raw) == "invalid_websocket_handshake"


async def test_upgrade_tokens_match_case_insensitively_in_lists(
    autojump_clock: trio.testing.MockClock, app: App
) -> None:
    first_frame = Connection(ConnectionType.CLIENT).send(TextMessage(data="early"))
    request = upgrade_request(connection="keep-alive, UPGRADE", upgrade="WebSocket")
    raw = await exchange(app, request + first_frame)  # the frame rides with the handshake
    status, headers = status_and_headers(raw)
    assert status == 101
    assert headers["sec-websocket-accept"] == generate_accept_token(KEY.encode()).decode()
    assert "sec-websocket-extensions" not in headers
    after_head = raw.partition(b"\r\n\r\n")[2]
    assert after_head.startswith(text_frame(b"early"))  # h11's trailing data reached wsproto

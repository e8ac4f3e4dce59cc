"""The HTTP/1.1 transport (gateway.http.server, docs/protocol.md §2).

Test rules: behaviour that is about sockets (keep-alive, lingering error
answers, a crash not killing the listener) runs on real sockets on 127.0.0.1
port 0; anything about time runs on ``memory_stream_pair`` under
``autojump_clock``, so no test sleeps in real time. Every answer is checked
byte-exactly where the contract fixes it (status, error code, Connection).
"""

from __future__ import annotations

import logging
from functools import partial

import h11
import msgspec
import pytest
import trio
import trio.testing

from gateway.errors import ApiError
from gateway.http.server import (
    HttpLimits,
    Request,
    Response,
    WebSocketAccept,
    error_response,
    json_response,
    serve_connection,
)

SMALL = HttpLimits(max_body_bytes=1024)


async def toy_handler(request: Request) -> Response | WebSocketAccept:
    if request.path == "/echo":
        return json_response(
            200,
            {
                "method": request.method,
                "query": request.query,
                "headers": request.headers,
                "body": request.body.decode(),
                "client": request.client,
            },
        )
    if request.path == "/busy":
        raise ApiError(409, "turn_in_progress", "A turn is already running.")
    if request.path == "/only-get":
        raise ApiError(405, "method_not_allowed", "Use GET.", headers=(("allow", "GET"),))
    if request.path == "/crash":
        raise RuntimeError("boom")
    return error_response(404, "not_found", f"No route for {request.path}.")


# --- helpers ---------------------------------------------------------------------


@pytest.fixture
async def port(nursery: trio.Nursery) -> int:
    """Serve ``toy_handler`` with :data:`SMALL` limits on 127.0.0.1, port 0."""

    async def on_connection(stream: trio.SocketStream) -> None:
        host, port = stream.socket.getpeername()[:2]
        await serve_connection(stream, toy_handler, SMALL, client=f"{host}:{port}")

    listeners = await nursery.start(partial(trio.serve_tcp, on_connection, 0, host="127.0.0.1"))
    bound: int = listeners[0].socket.getsockname()[1]
    return bound


class HttpClient:
    """A tiny h11 client over any stream: one request at a time, keep-alive aware."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.conn = h11.Connection(h11.CLIENT)

    async def request(
        self, method: str, target: str, body: bytes = b""
    ) -> tuple[h11.Response, bytes]:
        if self.conn.our_state is h11.DONE:
            self.conn.start_next_cycle()
        headers = [("host", "test"), ("content-length", str(len(body)))]
        data = self.conn.send(h11.Request(method=method, target=target, headers=headers))
        data += self.conn.send(h11.Data(data=body)) + self.conn.send(h11.EndOfMessage())
        await self.stream.send_all(data)
        response: h11.Response | None = None
        content = b""
        while True:
            event = self.conn.next_event()
            if event is h11.NEED_DATA:
                self.conn.receive_data(await self.stream.receive_some(65536))
            elif isinstance(event, h11.Response):
                response = event
            elif isinstance(event, h11.Data):
                content += event.data
            elif isinstance(event, h11.EndOfMessage):
                assert response is not None
                return response, content


async def read_until_eof(stream: trio.abc.ReceiveStream) -> bytes:
    data = b""
    while chunk := await stream.receive_some(65536):
        data += chunk
    return data


def parse_response(raw: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, body = raw.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in header_lines)
    return int(status_line.split(" ")[1]), headers, body


def error_of(body: bytes) -> dict[str, str]:
    decoded: dict[str, dict[str, str]] = msgspec.json.decode(body)
    return decoded["error"]


def header(response: h11.Response, name: bytes) -> bytes | None:
    return next((value for key, value in response.headers if key == name), None)


# --- real sockets ------------------------------------------------------------------


async def connect(port: int) -> trio.SocketStream:
    return await trio.open_tcp_stream("127.0.0.1", port)


async def test_keep_alive_serves_two_requests_on_one_connection(port: int) -> None:
    async with await connect(port) as stream:
        client = HttpClient(stream)
        first, body = await client.request("POST", "/echo?a=1&a=2&b=x%20y", b'{"x": 1}')
        assert first.status_code == 200
        assert header(first, b"content-type") == b"application/json"
        assert header(first, b"content-length") == str(len(body)).encode()
        assert header(first, b"connection") is None
        echoed = msgspec.json.decode(body)
        assert echoed["method"] == "POST"
        assert echoed["query"] == {"a": "1", "b": "x y"}
        assert echoed["body"] == '{"x": 1}'
        assert echoed["client"] == f"127.0.0.1:{stream.socket.getsockname()[1]}"

        second, body = await client.request("GET", "/nowhere")
        assert second.status_code == 404
        assert error_of(body) == {"code": "not_found", "message": "No route for /nowhere."}


async def test_head_gets_the_headers_without_the_body_and_keeps_the_connection(
    port: int,
) -> None:
    """RFC 9110 section 9.3.2; the old transport raised in h11 and dropped the connection."""
    async with await connect(port) as stream:
        client = HttpClient(stream)
        _, get_body = await client.request("GET", "/nowhere")
        head, head_body = await client.request("HEAD", "/nowhere")
        assert (head.status_code, head_body) == (404, b"")
        assert header(head, b"content-length") == str(len(get_body)).encode()
        assert header(head, b"connection") is None
        # the h11 client would take a stray body for the next answer: there is none
        again, body = await client.request("GET", "/echo")
        assert again.status_code == 200 and msgspec.json.decode(body)["method"] == "GET"


@pytest.mark.parametrize(
    ("extra", "status"),
    [
        (b"Content-Length: 5000\r\n", 413),
        (b"X-Big: " + b"a" * 20_000 + b"\r\n", 431),
        (
            b"Content-Length: 1\r\n",
            400,
        ),  # the body never comes (found by the fuzz test)
    ],
)
async def test_a_head_refused_before_its_handler_gets_the_refusal_without_a_body(
    port: int, caplog: pytest.LogCaptureFixture, extra: bytes, status: int
) -> None:
    """The refusals the transport makes itself: h11 raised on their body, and dropped the socket."""
    async with await connect(port) as stream:
        with caplog.at_level(logging.ERROR, logger="gateway.http"):
            await stream.send_all(b"HEAD /echo HTTP/1.1\r\nHost: t\r\n" + extra + b"\r\n")
            await stream.send_eof()
            raw = await read_until_eof(stream)
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 %d " % status), raw[:200]
    assert body == b""
    assert b"\r\ncontent-length: " in head and b"\r\nconnection: close" in head
    assert [r.getMessage() for r in caplog.records if r.name == "gateway.http"] == []


async def test_api_error_becomes_its_json_error_body(port: int) -> None:
    async with await connect(port) as stream:
        response, body = await HttpClient(stream).request("POST", "/busy")
    assert response.status_code == 409
    assert error_of(body) == {"code": "turn_in_progress", "message": "A turn is already running."}
    assert header(response, b"connection") is None  # an ApiError keeps the connection


async def test_api_error_headers_are_sent(port: int) -> None:
    async with await connect(port) as stream:
        response, body = await HttpClient(stream).request("POST", "/only-get")
    assert response.status_code == 405
    assert header(response, b"allow") == b"GET"
    assert error_of(body) == {"code": "method_not_allowed", "message": "Use GET."}


async def test_handler_crash_is_500_and_the_server_survives(
    port: int, caplog: pytest.LogCaptureFixture
) -> None:
    async with await connect(port) as stream:
        with caplog.at_level(logging.ERROR, logger="gateway.http"):
            response, body = await HttpClient(stream).request("GET", "/crash")
        assert response.status_code == 500
        assert header(response, b"connection") == b"close"
        assert error_of(body) == {"code": "internal_error", "message": "Internal server error."}
        assert await stream.receive_some(1) == b""  # that connection is closed
    [record] = [r for r in caplog.records if r.name == "gateway.http"]
    assert record.exc_info is not None
    assert isinstance(record.exc_info[1], RuntimeError)

    async with await connect(port) as stream:
        response, _ = await HttpClient(stream).request("GET", "/echo")
    assert response.status_code == 200


async def test_body_at_the_limit_is_accepted(port: int) -> None:
    async with await connect(port) as stream:
        response, body = await HttpClient(stream).request("POST", "/echo", b"x" * 1024)
    assert response.status_code == 200
    assert msgspec.json.decode(body)["body"] == "x" * 1024


async def test_content_length_over_the_limit_is_413_without_reading_the_body(port: int) -> None:
    async with await connect(port) as stream:
        await stream.send_all(b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 1025\r\n\r\n")
        status, headers, body = parse_response(await read_until_eof(stream))
    assert status == 413
    assert headers["connection"] == "close"
    assert error_of(body) == {
        "code": "body_too_large",
        "message": "The request body is over 1024 bytes.",
    }


async def test_413_reaches_a_client_still_sending_its_body(port: int) -> None:
    # The server drains before closing: closing with unread input would reset the
    # connection under the client's feet (and maybe under the 413 answer).
    size = 10_000_000
    async with await connect(port) as stream:
        await stream.send_all(
            f"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: {size}\r\n\r\n".encode()
        )
        async with trio.open_nursery() as nursery:
            nursery.start_soon(stream.send_all, b"z" * size)
            raw = await read_until_eof(stream)
    assert parse_response(raw)[0] == 413


async def test_chunked_body_growing_over_the_limit_is_413(port: int) -> None:
    chunk = b"400\r\n" + b"y" * 0x400 + b"\r\n"  # each chunk alone is exactly the limit
    async with await connect(port) as stream:
        await stream.send_all(
            b"POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
            + chunk * 8
            + b"0\r\n\r\n"
        )
        status, headers, body = parse_response(await read_until_eof(stream))
    assert status == 413
    assert headers["connection"] == "close"
    assert error_of(body)["code"] == "body_too_large"


async def test_garbage_is_400_and_closes(port: int) -> None:
    async with await connect(port) as stream:
        await stream.send_all(b"\x00\x01 this is not HTTP\r\n\r\n")
        status, headers, body = parse_response(await read_until_eof(stream))
    assert status == 400
    assert headers["connection"] == "close"
    assert error_of(body)["code"] == "malformed_request"


@pytest.mark.parametrize("size", [20_000, 100_000])  # one read, and many reads
async def test_huge_headers_are_431(port: int, size: int) -> None:
    async with await connect(port) as stream:
        await stream.send_all(
            b"GET /echo HTTP/1.1\r\nHost: t\r\nX-Big: " + b"a" * size + b"\r\n\r\n"
        )
        status, headers, body = parse_response(await read_until_eof(stream))
    assert status == 431
    assert headers["connection"] == "close"
    assert error_of(body) == {
        "code": "headers_too_large",
        "message": "The request head is too large.",
    }


# --- memory streams, virtual time ------------------------------------------------------


@pytest.fixture
def client(nursery: trio.Nursery) -> trio.abc.Stream:
    """The client end of an in-memory connection served with :data:`SMALL` limits."""
    client_end, server_end = trio.testing.memory_stream_pair()
    nursery.start_soon(partial(serve_connection, server_end, toy_handler, SMALL))
    return client_end


async def test_fresh_connection_that_sends_nothing_is_closed_silently(
    autojump_clock: trio.testing.MockClock, client: trio.abc.Stream
) -> None:
    assert await read_until_eof(client) == b""
    assert trio.current_time() == pytest.approx(10.0)


async def test_partial_request_is_408_after_read_timeout(
    autojump_clock: trio.testing.MockClock, client: trio.abc.Stream
) -> None:
    await trio.sleep(4)
    await client.send_all(b"GET /echo HTTP/1.1\r\nHost: t\r\n")  # no blank line yet
    first = await client.receive_some(65536)
    assert trio.current_time() == pytest.approx(10.0)  # the first request's clock starts at accept
    status, headers, body = parse_response(first + await read_until_eof(client))
    assert status == 408
    assert headers["connection"] == "close"
    assert error_of(body) == {
        "code": "request_timeout",
        "message": "The request did not arrive in time.",
    }


async def test_later_request_gets_read_timeout_from_its_first_byte(
    autojump_clock: trio.testing.MockClock, client: trio.abc.Stream
) -> None:
    response, _ = await HttpClient(client).request("GET", "/echo")
    assert response.status_code == 200
    await trio.sleep(30)  # idle, but within keepalive_timeout_s
    await client.send_all(b"GET /echo HTTP/1.1\r\n")
    raw = await read_until_eof(client)
    assert trio.current_time() == pytest.approx(40.0)
    assert parse_response(raw)[0] == 408


async def test_idle_keep_alive_connection_is_closed_silently(
    autojump_clock: trio.testing.MockClock, client: trio.abc.Stream
) -> None:
    await trio.sleep(3)
    response, _ = await HttpClient(client).request("GET", "/echo")
    assert response.status_code == 200
    assert await read_until_eof(client) == b""
    assert trio.current_time() == pytest.approx(63.0)


async def test_pipelined_requests_are_answered_in_order(
    autojump_clock: trio.testing.MockClock, client: trio.abc.Stream
) -> None:
    await client.send_all(
        b"GET /a HTTP/1.1\r\nHost: t\r\n\r\nGET /b HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"
    )
    raw = await read_until_eof(client)
    assert raw.count(b"HTTP/1.1 404 Not Found\r\n") == 2
    assert raw.index(b"No route for /a.") < raw.index(b"No route for /b.")
    assert trio.current_time() == 0.0  # closed at once after the second answer


async def test_expect_100_continue_is_honoured(
    autojump_clock: trio.testing.MockClock, client: trio.abc.Stream
) -> None:
    await client.send_all(
        b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\nExpect: 100-continue\r\n\r\n"
    )
    assert await client.receive_some(65536) == b"HTTP/1.1 100 Continue\r\n\r\n"
    await client.send_all(b"hi")
    status, _, body = parse_response(await client.receive_some(65536))
    assert status == 200
    assert msgspec.json.decode(body)["body"] == "hi"


async def test_request_headers_are_lowercased_and_repeats_joined(
    autojump_clock: trio.testing.MockClock, client: trio.abc.Stream
) -> None:
    await client.send_all(
        b"GET /echo HTTP/1.1\r\nHost: t\r\nX-Tag: one\r\nx-tag: two\r\nX-Latin: caf\xe9\r\n"
        b"Connection: close\r\n\r\n"
    )
    status, _, body = parse_response(await read_until_eof(client))
    assert status == 200
    headers = msgspec.json.decode(body)["headers"]
    assert headers == {
        "host": "t",
        "x-tag": "one, two",
        "x-latin": "caf\xe9",
        "connection": "close",
    }

"""A client that stops reading an answer (docs/protocol.md §2 "Files", "Limits"): an
answer may be a 20 MiB file, and a client that asks for it and never reads would hold
it in the gateway's memory for as long as its connection lives (a TCP peer with a shut
window is alive forever). A piece of an answer the client has not taken within
``body_timeout_s`` closes the connection; a client that reads, however slowly, is served."""

from __future__ import annotations

import socket
from functools import partial

import pytest
import trio
import trio.testing

from gateway.http.server import HttpLimits, Request, Response, WebSocketAccept, serve_connection

LIMITS = HttpLimits(max_body_bytes=1024, body_timeout_s=60.0)
BIG = b"x" * (32 << 20)


async def handler(request: Request) -> Response | WebSocketAccept:
    return Response(200, BIG, "application/octet-stream")


async def test_a_client_that_never_reads_its_answer_is_let_go(
    autojump_clock: trio.testing.MockClock,
) -> None:
    done = trio.Event()

    async def on_connection(stream: trio.SocketStream) -> None:
        try:
            await serve_connection(stream, handler, LIMITS)
        finally:
            done.set()

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, on_connection, 0, host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        sock = trio.socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        await sock.connect(("127.0.0.1", port))
        client = trio.SocketStream(sock)
        started = trio.current_time()
        await client.send_all(b"GET /file HTTP/1.1\r\nHost: t\r\n\r\n")
        with trio.fail_after(600):
            await done.wait()  # the client never reads a byte
        assert trio.current_time() - started == pytest.approx(60.0, abs=1.0)
        await client.aclose()
        nursery.cancel_scope.cancel()


async def test_a_client_that_reads_slowly_gets_its_whole_answer(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(
            partial(trio.serve_tcp, partial(serve_connection, handler=handler, limits=LIMITS), 0)
        )
        port = listeners[0].socket.getsockname()[1]
        client = await trio.open_tcp_stream("127.0.0.1", port)
        await client.send_all(b"GET /file HTTP/1.1\r\nHost: t\r\n\r\n")
        received = 0
        while received < len(BIG):
            chunk = await client.receive_some(256 * 1024)
            assert chunk, received  # never cut off: it takes a piece within the timeout
            received += len(chunk)
            await trio.sleep(5)  # a slow reader: minutes for the whole answer
        await client.aclose()
        nursery.cancel_scope.cancel()

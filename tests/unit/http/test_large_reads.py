"""The large bodies a process holds at once (docs/protocol.md §2 "Files", "Limits"): a
body over ``max_body_bytes`` holds one of ``HttpLimits.large_reads`` until its handler has
answered, not only while it is read, so that what large bodies hold in memory is bounded
whoever sends them, however slow what the handler does with one (a decode, a store)."""

from __future__ import annotations

import gc
import re
from collections.abc import Awaitable, Callable
from functools import partial

import trio

from gateway.http.server import (
    HttpLimits,
    LargeBody,
    Request,
    Response,
    StreamingResponse,
    WebSocketAccept,
    json_response,
    serve_connection,
)

LIMITS = HttpLimits(
    max_body_bytes=1024,
    large_bodies=(LargeBody(re.compile("/big"), 1 << 20, "file_too_large"),),
)


def post(size: int) -> bytes:
    head = f"POST /big HTTP/1.1\r\nHost: t\r\nContent-Length: {size}\r\n\r\n".encode()
    return head + b"x" * size


async def answer(stream: trio.SocketStream) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = await stream.receive_some(65536)
        assert chunk, data
        data += chunk
    return data


async def test_a_large_body_holds_its_slot_until_it_is_answered() -> None:
    holding = 0
    go_on, eight = trio.Event(), trio.Event()

    async def handler(request: Request) -> Response | WebSocketAccept:
        nonlocal holding
        holding += 1  # the body is in memory for as long as this runs
        if holding == 8:
            eight.set()
        await go_on.wait()
        return json_response(201, {"size": len(request.body)})

    async def on_connection(stream: trio.SocketStream) -> None:
        await serve_connection(stream, handler, LIMITS)

    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            listeners = await nursery.start(
                partial(trio.serve_tcp, on_connection, 0, host="127.0.0.1")
            )
            port = listeners[0].socket.getsockname()[1]
            streams = []
            for _ in range(8):
                stream = await trio.open_tcp_stream("127.0.0.1", port)
                streams.append(stream)
                await stream.send_all(post(4096))
            await eight.wait()
            ninth = await trio.open_tcp_stream("127.0.0.1", port)
            await ninth.send_all(post(4096))
            refused = await answer(ninth)
            assert refused.startswith(b"HTTP/1.1 503 "), refused
            assert b"over_capacity" in refused or b"Retry-After" in refused
            assert holding == 8
            go_on.set()
            for stream in streams:
                assert (await answer(stream)).startswith(b"HTTP/1.1 201 ")
            assert LIMITS.large_reads.value == 8  # every slot given back
            # A small body to the same route takes none.
            small = await trio.open_tcp_stream("127.0.0.1", port)
            await small.send_all(post(10))
            assert (await answer(small)).startswith(b"HTTP/1.1 201 ")
            assert LIMITS.large_reads.value == 8
            for stream in [*streams, ninth, small]:
                await stream.aclose()
            nursery.cancel_scope.cancel()


async def test_a_stream_keeps_none_of_its_request() -> None:
    # A run of AG-UI or the AI SDK may bring a 20 MiB file inline and stream for minutes:
    # its body is the handler's to keep (it kept the file), not the transport's.
    streaming, go_on = trio.Event(), trio.Event()

    async def handler(request: Request) -> StreamingResponse:
        async def run(send: Callable[[bytes], Awaitable[None]]) -> None:
            await send(b"data: 1\n\n")
            streaming.set()
            await go_on.wait()

        return StreamingResponse(run)

    async def on_connection(stream: trio.SocketStream) -> None:
        await serve_connection(stream, handler, LIMITS)

    def requests() -> list[Request]:
        gc.collect()
        return [o for o in gc.get_objects() if isinstance(o, Request) and o.path == "/big"]

    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            listeners = await nursery.start(
                partial(trio.serve_tcp, on_connection, 0, host="127.0.0.1")
            )
            port = listeners[0].socket.getsockname()[1]
            async with await trio.open_tcp_stream("127.0.0.1", port) as client:
                await client.send_all(post(300_000))
                assert (await answer(client)).startswith(b"HTTP/1.1 200 ")
                await streaming.wait()
                assert requests() == []
                go_on.set()
            nursery.cancel_scope.cancel()

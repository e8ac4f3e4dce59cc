"""Large bodies at the transport (docs/protocol.md §2 "Files"): a file's Host, Origin and
key are checked from the request's head before a byte of its body is read, and the large
bodies read at once are bounded, whoever sends them."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import trio

from tests.conftest import make_config, running_gateway
from tests.integration.boundary.test_boundary_http import Answer, _answer

KEY = "sk-files-test-key-000000000000"


async def polled(done: Callable[[], bool]) -> None:
    """Until ``done()``: the server's reading happens in its own tasks, signalled by nothing
    a client sees (the test's ``fail_after`` bounds it)."""
    for _ in range(2000):
        if done():
            return
        await trio.sleep(0.01)
    raise AssertionError("never done")


def head(
    path: str, length: int, *, key: str | None = None, host: str = "127.0.0.1", origin: str = ""
) -> bytes:
    lines = [
        f"POST {path} HTTP/1.1",
        f"Host: {host}",
        "Content-Type: image/png",
        f"Content-Length: {length}",
    ]
    if key is not None:
        lines.append(f"Authorization: Bearer {key}")
    if origin:
        lines.append(f"Origin: {origin}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


async def test_a_large_body_without_its_key_is_refused_before_it_is_read(tmp_path: Path) -> None:
    config = make_config(tmp_path, **{"auth.api_keys": [KEY]})
    with trio.fail_after(20):
        async with running_gateway(config) as gw:
            port = gw.gateway.port
            for key, status in [(None, 401), ("sk-wrong-key-000000000000000000", 403)]:
                stream = await trio.open_tcp_stream("127.0.0.1", port)
                async with stream:
                    # 10 MiB announced, not one byte of it sent: the answer comes anyway.
                    await stream.send_all(head("/sessions/sess_x/files", 10 << 20, key=key))
                    answer = Answer(*await _answer(stream), False)
                assert answer.status == status, answer.body


async def test_a_large_body_from_another_site_is_refused_before_it_is_read(
    tmp_path: Path,
) -> None:
    # No keys: a page of another site may send a file as a "simple" POST (no preflight);
    # its Origin (or a rebound name's Host) is refused from the head, as a key is, not
    # after up to 20 MiB of it are read into one of the large bodies' slots.
    config = make_config(tmp_path, **{"server.body_timeout_s": 2.0})
    with trio.fail_after(20):
        async with running_gateway(config) as gw:
            for host, origin, status in [
                ("127.0.0.1", "https://evil.example", 403),
                ("127.0.0.1", "null", 403),
                ("evil.example", "", 421),
            ]:
                stream = await trio.open_tcp_stream("127.0.0.1", gw.gateway.port)
                async with stream:
                    path = "/sessions/sess_x/files"
                    await stream.send_all(head(path, 10 << 20, host=host, origin=origin))
                    answer = Answer(*await _answer(stream), False)
                assert answer.status == status, (host, origin, answer.body)


async def test_large_bodies_read_at_once_are_bounded(tmp_path: Path) -> None:
    config = make_config(tmp_path, **{"server.max_body_bytes": 1024})
    with trio.fail_after(20):
        async with running_gateway(config) as gw:
            port = gw.gateway.port
            slots = gw.gateway.limits.large_reads
            streams = []
            try:
                # Each holds a slot: past max_body_bytes, short of its end.
                for _ in range(8):
                    stream = await trio.open_tcp_stream("127.0.0.1", port)
                    streams.append(stream)
                    await stream.send_all(head("/sessions/sess_x/files", 1 << 20) + b"x" * 4096)
                await polled(lambda: slots.value == 0)  # each read past max_body_bytes
                stream = await trio.open_tcp_stream("127.0.0.1", port)
                async with stream:
                    await stream.send_all(head("/sessions/sess_x/files", 1 << 20) + b"x" * 4096)
                    answer = Answer(*await _answer(stream), False)
                assert answer.status == 503 and answer.code == "over_capacity"
                assert answer.headers["retry-after"] == "1"
            finally:
                for stream in streams:
                    await stream.aclose()
            await polled(lambda: slots.value == 8)  # given back as their connections end


async def test_a_small_body_to_a_large_route_keeps_the_read_timeout(tmp_path: Path) -> None:
    # A body no larger than max_body_bytes has what is left of read_timeout_s, whatever
    # the route: its key is not checked before it is read, so body_timeout_s would give
    # any client, keyless, a minute per connection to trickle a few bytes.
    config = make_config(
        tmp_path,
        **{
            "auth.api_keys": [KEY],
            "server.read_timeout_s": 0.5,
            "server.body_timeout_s": 60.0,
        },
    )
    with trio.fail_after(20):
        async with running_gateway(config) as gw:
            for path in ("/agui", "/ai-sdk/chat", "/sessions/sess_x/turns", "/sessions/x/files"):
                stream = await trio.open_tcp_stream("127.0.0.1", gw.gateway.port)
                async with stream:
                    await stream.send_all(head(path, 100) + b"{")  # 99 bytes never come
                    started = trio.current_time()
                    answer = Answer(*await _answer(stream), False)
                    waited = trio.current_time() - started
                assert answer.status == 408, (path, answer.body)
                assert waited < 5, (path, waited)

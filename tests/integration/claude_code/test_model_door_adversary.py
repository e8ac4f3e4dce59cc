"""The Claude Code CLIs' model API door, as an adversary meets it (docs/protocol.md §11 "The key").

Found by an adversarial review and fixed here:
- a target ``urlsplit`` could not parse (``//[x/v1/messages``), sent with
  no credential by any local process, raised out of the connection into the
  node's nursery and stopped the daemon: now 404 on that connection, and any
  failure of one connection ends that connection only;
- the upstream URL was the configured base and the target joined as
  strings, so ``x.evil.example://y/v1/messages`` sent the operator's key to
  a host the requester chose, and ``/v1/messages/../../v1/files`` reached
  any endpoint: now the target is one of two exact paths and a plain query,
  and the host is the configured one's;
- a connection could hold a descriptor for ten minutes without a word, and
  any number could: now its first head must come within ``HEAD_TIMEOUT_S``
  and at most ``MAX_CONNECTIONS`` are open.

Real sockets on 127.0.0.1: the door, a stand-in upstream that records what
it is sent, and a sibling task standing for the node's other work.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import pytest
import trio
import trio.testing

from gateway.providers import model_proxy
from gateway.providers.model_proxy import ModelProxy, model_call, upstream_url
from tests.integration.claude_code.test_model_proxy import raw_exchange

KEY = "sk-ant-the-operators-real-key"


@pytest.mark.parametrize(
    ("target", "call"),
    [
        ("/v1/messages", ("/v1/messages", "")),
        ("/v1/messages?beta=true", ("/v1/messages", "beta=true")),
        ("/v1/messages/count_tokens?beta=true", ("/v1/messages/count_tokens", "beta=true")),
        ("//[x/v1/messages", None),
        ("x.evil.example://y/v1/messages", None),
        ("http://evil.example/v1/messages", None),
        ("/v1/messages/../../v1/files", None),
        ("/v1/messages/%2e%2e/files", None),
        ("/v1/messages/batches", None),
        ("/v1/messages?x=a/../b", None),
        ("/v1/messages?@evil.example", None),
        ("/v1/files", None),
        ("", None),
    ],
)
def test_only_the_two_model_paths_pass(target: str, call: tuple[str, str] | None) -> None:
    assert model_call("POST", target) == call
    assert model_call("GET", "/v1/messages") is None


def test_the_host_is_never_the_requests() -> None:
    url = upstream_url("http://proxy.internal:8080/tenant-a/anthropic/", "/v1/messages", "beta=1")
    assert str(url) == "http://proxy.internal:8080/tenant-a/anthropic/v1/messages?beta=1"
    assert str(upstream_url("https://api.anthropic.com", "/v1/messages", "")) == (
        "https://api.anthropic.com/v1/messages"
    )


class Upstream:
    """A model API that records each request's head and answers one small JSON body
    (``chunked``: as a stream is, its end the last chunk)."""

    def __init__(self, chunked: bool = False) -> None:
        self.heads: list[bytes] = []
        self.port = 0
        self.chunked = chunked

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        task_status.started()
        await trio.serve_listeners(self._one, listeners)

    async def _one(self, stream: trio.SocketStream) -> None:
        got = b""
        async with stream:
            while b"\r\n\r\n" not in got:
                chunk = await stream.receive_some(65536)
                if not chunk:
                    return
                got += chunk
            head, _, rest = got.partition(b"\r\n\r\n")
            self.heads.append(head)
            length = re.search(rb"(?im)^content-length: *(\d+)", head)
            while length and len(rest) < int(length[1]):  # the whole body, then the answer
                chunk = await stream.receive_some(65536)
                if not chunk:
                    return
                rest += chunk
            body = b'{"ok": true}'
            if self.chunked:
                await stream.send_all(
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                    b"transfer-encoding: chunked\r\nconnection: close\r\n\r\n"
                    + f"{len(body):x}\r\n".encode()
                    + body
                    + b"\r\n0\r\n\r\n"
                )
                return
            await stream.send_all(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                + f"content-length: {len(body)}\r\nconnection: close\r\n\r\n".encode()
                + body
            )


@asynccontextmanager
async def door(chunked: bool = False) -> AsyncIterator[tuple[ModelProxy, Upstream, trio.Event]]:
    """The door and an upstream in one nursery, with a sibling that must outlive any request."""
    proxy, upstream, sibling_ran = ModelProxy(), Upstream(chunked), trio.Event()

    async def sibling() -> None:
        await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        await nursery.start(upstream.serve)
        nursery.start_soon(sibling)
        proxy.attach(nursery)
        await proxy.ensure_running()
        yield proxy, upstream, sibling_ran
        nursery.cancel_scope.cancel()


def post(target: str, token: str, body: bytes = b"{}") -> bytes:
    return (
        f"POST {target} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nx-api-key: {token}\r\n"
        f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
    ).encode() + body


async def test_a_target_that_cannot_be_parsed_is_404_and_the_node_goes_on() -> None:
    async with door() as (proxy, upstream, _):
        for target in ("//[x/v1/messages", "x.evil.example://y/v1/messages", "/%zz"):
            answer = await raw_exchange(proxy.base_url, post(target, "nothing"))
            assert answer.startswith(b"HTTP/1.1 404 "), answer[:80]
        token = proxy.issue("sess_a", f"http://127.0.0.1:{upstream.port}/prefix", KEY)
        answer = await raw_exchange(proxy.base_url, post("/v1/messages?beta=true", token))
        assert answer.startswith(b"HTTP/1.1 200 ") and b'{"ok": true}' in answer


async def test_the_key_goes_only_to_the_configured_host_and_path() -> None:
    async with door() as (proxy, upstream, _):
        token = proxy.issue("sess_a", f"http://127.0.0.1:{upstream.port}/tenant-a", KEY)
        for target in (
            "x.evil.example://y/v1/messages",
            "/v1/messages/../../tenant-b/v1/files",
            "/v1/messages?x=1/../../v1/files",
        ):
            answer = await raw_exchange(proxy.base_url, post(target, token))
            assert answer.startswith(b"HTTP/1.1 404 "), (target, answer[:80])
        assert upstream.heads == []  # nothing of those left the door
        answer = await raw_exchange(proxy.base_url, post("/v1/messages?beta=true", token))
        assert answer.startswith(b"HTTP/1.1 200 ")
        (head,) = upstream.heads
        assert head.startswith(b"POST /tenant-a/v1/messages?beta=true HTTP/1.1\r\n")
        assert f"x-api-key: {KEY}".encode() in head and token.encode() not in head
        assert KEY.encode() not in answer


async def test_a_connection_that_says_nothing_is_closed(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    async with door() as (proxy, _, _):
        port = int(proxy.base_url.rsplit(":", 1)[1])
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        async with stream:
            start = trio.current_time()
            assert await stream.receive_some(100) == b""  # closed, unanswered
            assert trio.current_time() - start == pytest.approx(model_proxy.HEAD_TIMEOUT_S, 0.1)
    # A timeout, not a failure: nothing any local process can write to the error log.
    assert not [r for r in caplog.records if r.levelname == "ERROR"]


async def test_an_idle_connection_after_a_call_is_closed_not_answered_twice(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    async with door() as (proxy, upstream, _):
        token = proxy.issue("sess_a", f"http://127.0.0.1:{upstream.port}", KEY)
        port = int(proxy.base_url.rsplit(":", 1)[1])
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        async with stream:
            request = post("/v1/messages", token).replace(b"Connection: close\r\n", b"")
            await stream.send_all(request)
            got = b""
            while b'{"ok": true}' not in got:
                got += await stream.receive_some(65536)
            start = trio.current_time()
            while chunk := await stream.receive_some(65536):
                got += chunk
            assert trio.current_time() - start == pytest.approx(model_proxy.IDLE_TIMEOUT_S, 0.1)
        assert got.count(b"HTTP/1.1 ") == 1 and len(upstream.heads) == 1
    assert not [r for r in caplog.records if r.levelname == "ERROR"]


async def test_framing_both_ways_is_refused_and_connection_named_headers_stay_here() -> None:
    async with door() as (proxy, upstream, _):
        token = proxy.issue("sess_a", f"http://127.0.0.1:{upstream.port}", KEY)
        both = post("/v1/messages", token).replace(
            b"content-length: 2\r\n", b"content-length: 2\r\ntransfer-encoding: chunked\r\n"
        )
        assert (await raw_exchange(proxy.base_url, both)).startswith(b"HTTP/1.1 400 ")
        named = post("/v1/messages", token).replace(
            b"Connection: close\r\n", b"Connection: close, x-private\r\nx-private: secret\r\n"
        )
        assert (await raw_exchange(proxy.base_url, named)).startswith(b"HTTP/1.1 200 ")
        (head,) = upstream.heads
        assert b"x-private" not in head.lower()


async def test_what_a_client_sends_during_a_call_is_bounded() -> None:
    """A call in flight keeps what the client sends next only up to a head's size."""
    proxy, slow = ModelProxy(), trio.Event()

    async def stalling(stream: trio.SocketStream) -> None:
        async with stream:
            await stream.receive_some(65536)
            await slow.wait()  # never answers: the call stays in flight

    async with trio.open_nursery() as nursery:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        up = listeners[0].socket.getsockname()[1]
        nursery.start_soon(trio.serve_listeners, stalling, listeners)
        proxy.attach(nursery)
        await proxy.ensure_running()
        token = proxy.issue("sess_a", f"http://127.0.0.1:{up}", KEY)
        port = int(proxy.base_url.rsplit(":", 1)[1])
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        async with stream:
            await stream.send_all(post("/v1/messages", token))
            sent = 0
            with trio.move_on_after(10), contextlib.suppress(trio.BrokenResourceError):
                while sent < 8 * model_proxy.MAX_HEAD_BYTES:
                    await stream.send_all(b"x" * 65536)
                    sent += 65536
            with trio.fail_after(10):  # cut: the connection ends
                while await stream.receive_some(65536):
                    pass
        nursery.cancel_scope.cancel()


async def test_the_next_request_sent_as_the_answer_ends_is_answered_whole(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A CLI sends its next call on the same connection as soon as it has the whole answer
    (Claude Code's query after a task's notification, a body past a head's size): the
    door has stopped watching for a hangup by then, so none of it is taken for one, nor
    lost. It used to be: the watcher, still running while the answer's upstream closed,
    read it, dropped the chunk past ``MAX_HEAD_BYTES`` and the call waited for a body
    that never came (``BODY_TIMEOUT_S``)."""
    closing = httpx.Response.aclose

    async def slow_close(self: httpx.Response) -> None:
        await trio.sleep(0.5)  # the answer is out; its upstream still closing
        await closing(self)

    monkeypatch.setattr(httpx.Response, "aclose", slow_close)
    async with door(chunked=True) as (proxy, upstream, _):
        token = proxy.issue("sess_a", f"http://127.0.0.1:{upstream.port}", KEY)
        port = int(proxy.base_url.rsplit(":", 1)[1])
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        async with stream:
            first = post("/v1/messages", token).replace(b"Connection: close\r\n", b"")
            big = b'{"x": "' + b"y" * (2 * model_proxy.MAX_HEAD_BYTES) + b'"}'
            second = post("/v1/messages", token, big).replace(b"Connection: close\r\n", b"")
            await stream.send_all(first)
            got = b""
            with trio.fail_after(5):
                while got.count(b"\r\n0\r\n\r\n") < 1:  # the answer's end: the last chunk
                    got += await stream.receive_some(65536)
                await stream.send_all(second)
                while got.count(b"\r\n0\r\n\r\n") < 2:
                    got += await stream.receive_some(65536)
        assert got.count(b"HTTP/1.1 200 ") == 2 and len(upstream.heads) == 2


async def test_connections_past_the_cap_are_closed_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(model_proxy, "MAX_CONNECTIONS", 3)
    async with door() as (proxy, upstream, _):
        port = int(proxy.base_url.rsplit(":", 1)[1])
        held = [await trio.open_tcp_stream("127.0.0.1", port) for _ in range(3)]
        await trio.testing.wait_all_tasks_blocked()
        extra = await trio.open_tcp_stream("127.0.0.1", port)
        async with extra:
            with trio.fail_after(5):
                assert await extra.receive_some(100) == b""
        for stream in held:
            await stream.aclose()
        await trio.testing.wait_all_tasks_blocked()
        token = proxy.issue("sess_a", f"http://127.0.0.1:{upstream.port}", KEY)
        answer = await raw_exchange(proxy.base_url, post("/v1/messages", token))
        assert answer.startswith(b"HTTP/1.1 200 ")  # the held ones gone: served again

"""The ``[limits]`` that keep one client from starving the rest (docs/protocol.md §2, §15).

docs/reference.md ``[limits]``, 0 = no limit, each refusal a clear error:

- ``max_connections`` and ``max_connections_per_key``: 503 ``over_capacity`` at
  the stream handshake, before the upgrade, naming the limit; the slot comes
  back when the stream ends, whichever way (a clean close, a client that
  vanishes, an upgrade the transport refuses). The key of a stream is its
  session's owner.
- ``max_sessions_per_key``: 429 ``too_many_sessions``, counted from the store
  at start-up (so a restart does not reset it), never over the limit however
  many requests race for the last slot; workers (``delegate``) count against
  their owner's limit (docs/protocol.md §15; tests/integration/tenancy/test_turn_limits.py).
- ``turns_per_minute_per_key``: 429 ``rate_limited`` with ``Retry-After``, the
  whole seconds until a turn is accepted again, over a sliding minute on
  Trio's clock (tested under ``autojump_clock``).

Test rules: a real gateway on 127.0.0.1 port 0 with independent clients, on
the real clock under ``fail_after``, waiting for the event that says a thing
happened (a turn's end, the node's ``changed`` after a connection closed);
time-dependent rules on :class:`gateway.tenancy.Limits` under
``autojump_clock``.
"""

from __future__ import annotations

import json
import urllib.parse
from contextlib import AsyncExitStack
from pathlib import Path

import pytest
import trio
import trio.testing
from wsproto import ConnectionType, WSConnection
from wsproto.events import AcceptConnection, Request, TextMessage

from gateway.config import LimitsConfig
from gateway.errors import ApiError
from gateway.tenancy import Limits, key_id
from tests.conftest import Client, Harness, open_ws
from tests.integration.doors.rest.test_http_api import accepted, assert_error, rejected
from tests.integration.tenancy.test_tenants import tenants


async def streams_back_to(gw: Harness, count: int) -> None:
    """Wait until ``count`` streams are counted open (a closing one notifies the node)."""
    with trio.fail_after(10):
        while gw.node.limits.streams != count:
            await gw.node.changed()


async def raw_request(url: str, head: str) -> tuple[trio.SocketStream, bytes]:
    """Send ``head`` (the request line and headers, ``{resource}`` and ``{host}`` filled in)
    over a new TCP connection to ``url``'s host; the stream and the answer's first bytes."""
    parts = urllib.parse.urlsplit(url)
    assert parts.hostname and parts.port
    stream = await trio.open_tcp_stream(parts.hostname, parts.port)
    resource = f"{parts.path}?{parts.query}"
    await stream.send_all(head.format(resource=resource, host=parts.netloc).encode())
    answer = b""
    with trio.fail_after(10):
        while b"\r\n\r\n" not in answer:
            chunk = await stream.receive_some(4096)
            assert chunk, answer
            answer += chunk
    return stream, answer


UPGRADE = (
    "GET {resource} HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    "Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
)


# --- connections ------------------------------------------------------------------------


async def test_max_connections_is_503_before_the_upgrade_and_released_on_close(
    tmp_path: Path,
) -> None:
    async with tenants(tmp_path, **{"limits.max_connections": 2}) as (a, b):
        mine, theirs = await a.create_session(), await b.create_session()
        async with a.client(mine) as first, b.client(theirs) as second:
            await first.subscribe()
            await second.subscribe()
            assert a.node.limits.streams == 2
            for tenant, sid in ((a, mine), (b, theirs)):
                url = await tenant.ws_url(sid)
                assert await rejected(url) == (503, "over_capacity")
            r = await refused_body(await a.ws_url(mine))
            assert "max_connections (2)" in r["message"], r
        await streams_back_to(a, 0)
        await accepted(await a.ws_url(mine), mine)
        await accepted(await b.ws_url(theirs), theirs)


async def refused_body(url: str) -> dict[str, str]:
    """The error of a handshake refused with a status."""
    stream, answer = await raw_request(url, UPGRADE)
    try:
        head, _, body = answer.partition(b"\r\n\r\n")
        fields = dict(line.split(b":", 1) for line in head.split(b"\r\n")[1:])
        length = int({k.lower(): v for k, v in fields.items()}[b"content-length"])
        with trio.fail_after(10):
            while len(body) < length:
                body += await stream.receive_some(4096)
    finally:
        await stream.aclose()
    error: dict[str, str] = json.loads(body)["error"]
    return error


async def subscribed_then_gone(url: str) -> None:
    """A client that upgrades, subscribes, reads its ack, then drops its TCP connection
    without a close frame (a laptop lid shut, a process killed)."""
    parts = urllib.parse.urlsplit(url)
    assert parts.hostname and parts.port
    ws = WSConnection(ConnectionType.CLIENT)
    with trio.fail_after(10):
        stream = await trio.open_tcp_stream(parts.hostname, parts.port)
        try:
            await stream.send_all(
                ws.send(Request(host=parts.netloc, target=f"{parts.path}?{parts.query}"))
            )
            subscribe = {"type": "subscribe", "filter": "preset:full"}
            acked = False
            while not acked:
                ws.receive_data(await stream.receive_some(4096))
                for event in ws.events():
                    if isinstance(event, AcceptConnection):
                        await stream.send_all(ws.send(TextMessage(json.dumps(subscribe))))
                    elif isinstance(event, TextMessage):
                        assert json.loads(event.data)["type"] == "subscribe_ack", event.data
                        acked = True
        finally:
            await stream.aclose()


async def test_max_connections_per_key_counts_each_key_apart(tmp_path: Path) -> None:
    async with tenants(tmp_path, **{"limits.max_connections_per_key": 1}) as (a, b):
        mine, also_mine, theirs = (
            await a.create_session(),
            await a.create_session(),
            await b.create_session(),
        )
        async with a.client(mine) as first:
            await first.subscribe()
            # the key of a stream is its session's owner: A's other session is A's too
            assert await rejected(await a.ws_url(also_mine)) == (503, "over_capacity")
            error = await refused_body(await a.ws_url(mine))
            assert "max_connections_per_key (1)" in error["message"], error
            await accepted(await b.ws_url(theirs), theirs)  # B has its own
            assert a.node.limits.streams_by_key == {key_id("key-a"): 1}
        await streams_back_to(a, 0)
        await accepted(await a.ws_url(also_mine), also_mine)


async def test_a_client_that_vanishes_gives_its_slot_back(tmp_path: Path) -> None:
    async with tenants(tmp_path, **{"limits.max_connections": 1}) as (a, _b):
        sid = await a.create_session()
        # upgraded, then gone without a close frame
        stream, answer = await raw_request(await a.ws_url(sid), UPGRADE)
        assert answer.startswith(b"HTTP/1.1 101"), answer
        assert a.node.limits.streams == 1
        await stream.aclose()
        await streams_back_to(a, 0)
        # a subscribed client whose TCP connection just drops
        await subscribed_then_gone(await a.ws_url(sid))
        await streams_back_to(a, 0)
        await accepted(await a.ws_url(sid), sid)


async def test_an_upgrade_the_transport_refuses_gives_its_slot_back(tmp_path: Path) -> None:
    async with tenants(tmp_path, **{"limits.max_connections": 1}) as (a, _b):
        sid = await a.create_session()
        # the route admits it (token, capacity), then the transport refuses the upgrade
        plain_get = "GET {resource} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
        stream, answer = await raw_request(await a.ws_url(sid), plain_get)
        await stream.aclose()
        assert answer.startswith(b"HTTP/1.1 426"), answer
        assert a.node.limits.streams == 0
        old_version = UPGRADE.replace("Version: 13", "Version: 8")
        stream, answer = await raw_request(await a.ws_url(sid), old_version)
        await stream.aclose()
        assert answer.startswith(b"HTTP/1.1 426"), answer
        assert a.node.limits.streams == 0
        await accepted(await a.ws_url(sid), sid)


async def test_no_limit_by_default(tmp_path: Path) -> None:
    async with tenants(tmp_path) as (a, _b):
        sid = await a.create_session()
        async with AsyncExitStack() as stack:
            for _ in range(5):
                ws = await stack.enter_async_context(open_ws(await a.ws_url(sid)))
                await Client(ws, sid).subscribe()
            assert a.node.limits.streams == 5
            for _ in range(5):
                await a.create_session()
            async with a.client(sid) as watcher:
                await watcher.subscribe()
                for _ in range(3):
                    await a.submit(sid, "again")
                    await watcher.until_turn_ends()


# --- sessions ------------------------------------------------------------------------------


async def test_max_sessions_per_key_is_429_and_survives_a_restart(tmp_path: Path) -> None:
    overrides = {"limits.max_sessions_per_key": 2}
    async with tenants(tmp_path, **overrides) as (a, b):
        r = await a.http.post("/sessions", json={"workspace_path": str(tmp_path / "nope")})
        assert_error(r, 422, "invalid_workspace")  # a refused create takes no slot
        await a.create_session()
        await a.create_session()
        r = await a.http.post("/sessions", json={})
        error = assert_error(r, 429, "too_many_sessions")
        assert "max_sessions_per_key is 2" in error["message"]
        first = await b.create_session()  # B has its own count

        # a worker counts against its owner's limit (docs/protocol.md §15)
        task = {"rounds": [[{"tool_use": {"name": "delegate", "input": {"task": "go"}}}]]}
        async with b.client(first) as watcher:
            await watcher.subscribe()
            await b.submit(first, {"script": task})
            events = await watcher.until_turn_ends()
        assert "delegate.completed" in [e.type for e in events]
    async with tenants(tmp_path, **overrides) as (a, b):
        assert_error(await a.http.post("/sessions", json={}), 429, "too_many_sessions")
        assert a.node.limits.sessions_by_key == {key_id("key-a"): 2, key_id("key-b"): 2}
        assert_error(await b.http.post("/sessions", json={}), 429, "too_many_sessions")


async def test_racing_creates_never_pass_the_limit(tmp_path: Path) -> None:
    async with tenants(tmp_path, **{"limits.max_sessions_per_key": 3}) as (a, _b):
        statuses: list[int] = []

        async def create() -> None:
            statuses.append((await a.http.post("/sessions", json={})).status_code)

        async with trio.open_nursery() as nursery:
            for _ in range(8):
                nursery.start_soon(create)
        assert sorted(statuses) == [201] * 3 + [429] * 5
        assert len((await a.http.get("/sessions")).json()["sessions"]) == 3


# --- turns -----------------------------------------------------------------------------------


async def test_turns_per_minute_per_key_is_429_with_retry_after(tmp_path: Path) -> None:
    overrides = {"limits.turns_per_minute_per_key": 2}
    async with tenants(tmp_path, **overrides) as (a, b):
        sid = await a.create_session()
        async with a.client(sid) as watcher:
            await watcher.subscribe()
            slow = {"script": {"delay_ms": 20, "rounds": [[{"lorem": 20}]]}}
            await a.submit(sid, slow)
            r = await a.http.post(f"/sessions/{sid}/turns", json={"content": "too soon"})
            assert_error(r, 409, "turn_in_progress")  # refused: it does not count
            await watcher.until_turn_ends()
            await a.submit(sid, "second")
            await watcher.until_turn_ends()
            r = await a.http.post(f"/sessions/{sid}/turns", json={"content": "third"})
            error = assert_error(r, 429, "rate_limited")
            assert "turns_per_minute_per_key (2)" in error["message"]
            retry_after = int(r.headers["retry-after"])
            assert 1 <= retry_after <= 60
            assert f"in {retry_after} s" in error["message"]
        theirs = await b.create_session()  # B's turns are B's own
        await b.submit(theirs, "mine")


async def test_the_turn_window_slides(autojump_clock: trio.testing.MockClock) -> None:
    limits = Limits(LimitsConfig(turns_per_minute_per_key=3))
    start = trio.current_time()
    for at in (0, 10, 20):
        await trio.sleep_until(start + at)
        await limits.check_turn("k")
        await limits.count_turn("k")
    await limits.check_turn("other")  # each key has its own window
    for at, retry_after in ((30, 30), (59.5, 1), (59.999, 1)):
        await trio.sleep_until(start + at)
        with pytest.raises(ApiError) as info:
            await limits.check_turn("k")
        assert (info.value.status, info.value.code) == (429, "rate_limited")
        assert info.value.headers == (("Retry-After", str(retry_after)),)
    await trio.sleep_until(start + 60)  # the turn of 0 s has left the window
    await limits.check_turn("k")
    counted = await limits.count_turn("k")
    with pytest.raises(ApiError) as info:
        await limits.count_turn("k")
    assert info.value.headers == (("Retry-After", "10"),)  # the turn of 10 s leaves at 70
    await limits.refund_turn("k", counted)  # the turn of 60 s, refused after all
    await limits.count_turn("k")
    await trio.sleep_until(start + 200)  # all gone, and the key's window with them
    await limits.check_turn("k")
    assert "k" not in limits._turns


async def test_limits_unit_streams_and_sessions() -> None:
    limits = Limits(LimitsConfig(max_connections=3, max_connections_per_key=2))
    release_a = await limits.open_stream("a", "websocket")
    await limits.open_stream("a", "websocket")
    with pytest.raises(ApiError) as info:
        await limits.open_stream("a", "websocket")
    assert (info.value.status, info.value.code) == (503, "over_capacity")
    await limits.open_stream("b", "websocket")
    with pytest.raises(ApiError, match=r"max_connections \(3\)"):
        await limits.open_stream("c", "websocket")
    release_a()
    release_a()  # once only: a second call gives nothing back
    assert (limits.streams, dict(limits.streams_by_key)) == (2, {"a": 1, "b": 1})

    sessions = Limits(LimitsConfig(max_sessions_per_key=1))
    sessions.count_sessions({"a": 1})
    with pytest.raises(ApiError, match="max_sessions_per_key is 1"):
        async with sessions.new_session("a", "s1"):
            pass
    with pytest.raises(ValueError):
        async with sessions.new_session("b", "s2"):
            raise ValueError("the create failed")
    async with sessions.new_session("b", "s3"):
        pass
    assert dict(sessions.sessions_by_key) == {"a": 1, "b": 1}
    sessions.session_deleted("b")  # DELETE /sessions/{id} gives the slot back
    sessions.session_deleted("b")  # never below zero
    async with sessions.new_session("b", "s4"):
        pass
    assert dict(sessions.sessions_by_key) == {"a": 1, "b": 1}

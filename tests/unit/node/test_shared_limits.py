"""The per-key limits handed to Redis (gateway.node.limits; docs/protocol.md §15).

Without Redis: :class:`gateway.tenancy.Limits` with a scripted
:class:`~gateway.tenancy.SharedLimits` (what it asks, what it answers), and
:class:`gateway.node.limits.RedisKeyLimits` on a scripted Redis client (what it
sends, and what it does when Redis does not answer). The Lua scripts run
against a real Redis in tests/system/cluster/test_limits_cluster.py.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
import trio.testing

from gateway.config import LimitsConfig
from gateway.errors import ApiError, Refused, StoreError
from gateway.node.limits import RedisKeyLimits
from gateway.tenancy import Limits


class Shared:
    """A scripted :class:`gateway.tenancy.SharedLimits`."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.refuse: int | None = None  # the count a refusal names
        self.wait = 0.0  # a turn's wait: > 0 refuses it
        self.down = False  # Redis does not answer

    def _answer(self, *call: Any) -> None:
        self.calls.append(call)
        if self.down:
            raise Refused("store_unavailable", "redis is away", retry_after_s=1)

    async def reserve_session(self, key: str, session_id: str, limit: int) -> int | None:
        self._answer("reserve", key, session_id, limit)
        return self.refuse

    async def unreserve_session(self, key: str, session_id: str) -> None:
        self.calls.append(("unreserve", key, session_id))

    async def turn(self, key: str, limit: int, *, count: bool) -> tuple[str | None, float]:
        self._answer("turn", key, limit, count)
        return (None, self.wait) if self.wait else ("tok" if count else "", 0.0)

    async def refund_turn(self, key: str, token: str) -> None:
        self.calls.append(("refund", key, token))

    async def open_stream(self, key: str, limit: int) -> int | None:
        self._answer("open", key, limit)
        return self.refuse

    def close_stream(self, key: str) -> None:
        self.calls.append(("close", key))


def shared_limits(**config: int) -> tuple[Limits, Shared]:
    limits, shared = Limits(LimitsConfig(**config)), Shared()
    limits.share(shared)
    return limits, shared


async def test_streams_per_key_are_asked_of_the_deployment_and_the_total_stays_the_nodes() -> None:
    limits, shared = shared_limits(max_connections=2, max_connections_per_key=5)
    release = await limits.open_stream("k", "websocket")
    assert shared.calls == [("open", "k", 5)]
    release()
    release()  # once only
    assert shared.calls[1:] == [("close", "k")]
    assert limits.streams == 0
    await limits.open_stream("k", "websocket")
    await limits.open_stream("k", "websocket")
    with pytest.raises(ApiError, match=r"max_connections \(2\)"):  # this node's own
        await limits.open_stream("other", "websocket")
    assert len(shared.calls) == 4  # not asked: refused here first


async def test_a_stream_refused_by_the_deployment_holds_nothing_here() -> None:
    limits, shared = shared_limits(max_connections_per_key=3)
    shared.refuse = 3
    with pytest.raises(ApiError) as info:
        await limits.open_stream("k", "websocket")
    assert (info.value.status, info.value.code) == (503, "over_capacity")
    assert "max_connections_per_key (3)" in str(info.value)
    shared.refuse, shared.down = None, True
    with pytest.raises(Refused) as refused:  # Redis away: refused, never waived
        await limits.open_stream("k", "websocket")
    assert refused.value.code == "store_unavailable"
    assert (limits.streams, dict(limits.streams_by_key)) == (0, {})
    assert ("close", "k") not in shared.calls  # nothing was counted there either


async def test_no_per_key_limit_asks_nothing() -> None:
    limits, shared = shared_limits(max_connections=1)
    release = await limits.open_stream("k", "websocket")
    release()
    await limits.check_turn("k")
    assert await limits.count_turn("k") is None
    async with limits.new_session("k", "s1"):
        pass
    assert shared.calls == []


async def test_sessions_reserve_and_a_failed_create_gives_its_slot_back() -> None:
    limits, shared = shared_limits(max_sessions_per_key=2)
    async with limits.new_session("k", "s1"):
        pass
    await limits.session_stored("k", "s1")  # durable: the store counts it
    with pytest.raises(ValueError):
        async with limits.new_session("k", "s2"):
            raise ValueError("422 before anything was made")
    assert shared.calls == [
        ("reserve", "k", "s1", 2),
        ("unreserve", "k", "s1"),
        ("reserve", "k", "s2", 2),
        ("unreserve", "k", "s2"),
    ]
    shared.refuse = 2
    with pytest.raises(ApiError, match="owns 2 sessions, its max_sessions_per_key is 2"):
        async with limits.new_session("k", "s3"):
            raise AssertionError("not reached")
    shared.refuse, shared.down = None, True
    with pytest.raises(Refused, match="redis is away"):
        async with limits.new_session("k", "s4"):
            raise AssertionError("not reached")


async def test_turns_are_counted_by_the_deployment_with_its_retry_after() -> None:
    limits, shared = shared_limits(turns_per_minute_per_key=4)
    await limits.check_turn("k")
    token = await limits.count_turn("k")
    assert token == "tok"
    await limits.refund_turn("k", token)
    assert shared.calls == [("turn", "k", 4, False), ("turn", "k", 4, True), ("refund", "k", "tok")]
    shared.wait = 12.2
    for attempt in (limits.check_turn, limits.count_turn):
        with pytest.raises(ApiError) as info:
            await attempt("k")
        assert (info.value.status, info.value.code) == (429, "rate_limited")
        assert info.value.headers == (("Retry-After", "13"),)
    shared.wait = 0.004
    with pytest.raises(ApiError) as info:
        await limits.count_turn("k")
    assert info.value.headers == (("Retry-After", "1"),)  # at least 1


# --- RedisKeyLimits on a scripted client -----------------------------------------------


class Pipeline:
    def __init__(self, sent: list[tuple[Any, ...]]) -> None:
        self._sent = sent

    def eval(self, script: str, keys: list[str], args: list[object]) -> None:
        self._sent.append(("eval", keys, args))


class Client:
    """What RedisKeyLimits sends, answered ``answer`` (a script's number)."""

    def __init__(self) -> None:
        self.sent: list[tuple[Any, ...]] = []
        self.answer = -1

    async def eval(self, script: str, keys: list[str], args: list[object]) -> int:
        self.sent.append(("eval", keys, args))
        return self.answer

    async def zrem(self, key: str, members: list[str]) -> int:
        self.sent.append(("zrem", key, members))
        return 1

    @asynccontextmanager
    async def pipeline(self, transaction: bool) -> AsyncIterator[Pipeline]:
        yield Pipeline(self.sent)


def redis_limits() -> tuple[RedisKeyLimits, Client, list[bool]]:
    client, down = Client(), [False]

    async def call(command: Callable[[Any], Awaitable[Any]]) -> Any:
        if down[0]:
            raise StoreError("cluster: Redis: connection refused")
        return await command(client)

    return RedisKeyLimits(call, "gw:", "node1", 3.0, ("gw:s:{", "}"), "gw:owner:"), client, down


async def test_a_stream_writes_the_nodes_own_count_and_a_close_is_written_at_once() -> None:
    limits, client, _ = redis_limits()
    async with trio.open_nursery() as nursery:
        await nursery.start(limits.run)
        assert await limits.open_stream("k", 2) is None
        assert await limits.open_stream("k", 2) is None
        assert [s[2] for s in client.sent[-2:]] == [["node1", 1, 2, 3000], ["node1", 2, 2, 3000]]
        client.answer = 2
        assert await limits.open_stream("k", 2) == 2  # refused: how many are open
        assert limits.streams == {"k": 2}
        client.sent.clear()
        limits.close_stream("k")
        await trio.testing.wait_all_tasks_blocked()
        assert client.sent == [("eval", ["gw:lim:c:k"], ["node1", 1, 0, 3000])]
        nursery.cancel_scope.cancel()
    assert client.sent[-1] == ("eval", ["gw:lim:c:k"], ["node1", 0, 0, 3000])  # stopping: none


async def test_redis_away_refuses_checks_and_keeps_closes_due(
    autojump_clock: trio.testing.MockClock,
) -> None:
    limits, client, down = redis_limits()
    assert await limits.open_stream("k", 2) is None
    down[0] = True
    for check in (
        limits.open_stream("k", 2),
        limits.reserve_session("k", "s1", 2),
        limits.turn("k", 2, count=True),
    ):
        with pytest.raises(Refused) as info:
            await check
        assert (info.value.code, info.value.retry_after_s) == ("store_unavailable", 1)
    await limits.refund_turn("k", "tok")  # a refund that cannot be written: it expires anyway
    await limits.unreserve_session("k", "s1")
    async with trio.open_nursery() as nursery:
        await nursery.start(limits.run)
        client.sent.clear()
        limits.close_stream("k")
        await trio.sleep(0.1)
        assert client.sent == []  # not written: still due
        down[0] = False
        await trio.sleep(1.0)  # the next refresh (lease_s / 3) writes it
        assert ("eval", ["gw:lim:c:k"], ["node1", 0, 0, 3000]) in client.sent
        nursery.cancel_scope.cancel()


async def test_sessions_and_turns_send_their_keys() -> None:
    limits, client, _ = redis_limits()
    assert await limits.reserve_session("k", "s1", 3) is None
    assert client.sent[-1] == (
        "eval",
        ["gw:lim:s:k", "gw:owner:k"],
        [3, 60000, "s1", "gw:s:{", "}"],
    )
    token, wait = await limits.turn("k", 5, count=True)
    assert token and wait == 0.0
    assert client.sent[-1] == ("eval", ["gw:lim:t:k"], [5, 60000, token])
    client.answer = 1500
    assert await limits.turn("k", 5, count=False) == (None, 1.5)
    assert await limits.reserve_session("k", "s2", 3) == 1500

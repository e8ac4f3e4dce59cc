"""Session leases (gateway/store/lease.py) and lease-aware recovery (docs/scale-out.md).

Rules of these tests:

- Redis leases run against a real redis-server (tests/redis_support.py), each
  test under a key prefix of its own; Redis expires keys in real time, so
  their lease times are tiny (200 ms) and the waits are capped with
  ``trio.fail_after``.
- The keeper's own timing (renew every third of the lease time, give a lease
  up after a whole lease time without an answer) runs under Trio's
  ``MockClock`` against a scripted ``Leases``.
- Whole gateways on Redis get a redis-server of their own (their keys are
  under the default ``gw:`` prefix).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from trio_websocket import ConnectionClosed

from gateway.errors import StoreError
from gateway.ids import format_event_id
from gateway.protocol.events import CATALOG_TYPES
from gateway.store import SqliteStore
from gateway.store.lease import LeaseKeeper, Taken, new_node_id
from gateway.store.redis.leases import RedisLeases
from gateway.store.redis.store import RedisStore
from gateway.store.sqlite.leases import LocalLeases
from tests.conftest import make_config, running_gateway
from tests.redis_support import RedisServer, own_redis, redis_server
from tests.system.store.test_redis_store import SLEEPY, command, crash_copy

__all__ = ["own_redis", "redis_server"]  # fixtures


async def leases_on(server: RedisServer, prefix: str, *nodes: str, ttl_ms: int = 200) -> Any:
    store = RedisStore(server.url, prefix=prefix)
    await store.open()
    return store, [store.leases(node, ttl_ms) for node in nodes]


# --- Redis leases ------------------------------------------------------------------


@pytest.mark.slow  # a real redis-server: its TTLs run on the real clock
async def test_a_lease_is_one_nodes_until_it_releases_it(redis_server: RedisServer) -> None:
    prefix = redis_server.new_prefix()
    store, (a, b) = await leases_on(redis_server, prefix, "node_a", "node_b", ttl_ms=60_000)
    assert isinstance(a, RedisLeases)
    taken = await a.acquire("sess_1")
    assert taken is not None and taken.new
    assert await b.acquire("sess_1") is None
    again = await a.acquire("sess_1")  # its own: still its own, not new
    assert again == Taken()
    assert await a.holder("sess_1") == "node_a"
    assert await b.renew(["sess_1"]) == ["sess_1"]  # not b's to renew
    assert await a.renew(["sess_1", "sess_2"]) == ["sess_2"]  # sess_2 was never a's
    await b.release(["sess_1"])  # not b's to release
    assert await a.holder("sess_1") == "node_a"
    await a.release(["sess_1"])
    assert await a.holder("sess_1") is None
    assert await b.acquire("sess_1") is not None
    assert command(redis_server.port, "GET", f"{prefix}lease:{{sess_1}}") == b"node_b"
    await store.aclose()


@pytest.mark.slow  # a real redis-server: its TTLs run on the real clock
async def test_a_lease_not_renewed_expires_and_another_node_takes_it(
    redis_server: RedisServer,
) -> None:
    """The lease time is the failover time: a dead holder's lease lapses by itself."""
    store, (a, b) = await leases_on(redis_server, redis_server.new_prefix(), "node_a", "node_b")
    assert await a.acquire("sess_1") is not None
    with trio.fail_after(5):
        for _ in range(6):  # renewed every 100 ms for 600 ms: held throughout
            await trio.sleep(0.1)
            assert await a.renew(["sess_1"]) == []
            assert await b.acquire("sess_1") is None
        await trio.sleep(0.25)  # not renewed for longer than its 200 ms
        assert await b.acquire("sess_1") is not None
        assert await a.renew(["sess_1"]) == ["sess_1"]  # a learns it lost it
    await store.aclose()


@pytest.mark.slow  # a real redis-server: its TTLs run on the real clock
async def test_a_lease_taken_reads_the_id_counter(redis_server: RedisServer) -> None:
    """The counter read with the lease bounds the ids its previous holder issued."""
    store, (a,) = await leases_on(redis_server, redis_server.new_prefix(), "node_a")
    grants: list[int] = []
    store.reserve_event_ids(1000, grants.append)
    await store.flush()
    taken = await a.acquire("sess_1")
    assert taken == Taken(counter=1000, new=True)
    await store.aclose()


async def test_sqlite_leases_are_all_the_nodes_own(tmp_path: Path) -> None:
    store = SqliteStore(str(tmp_path / "gateway.db"))
    await store.open()
    leases = store.leases("node_a", 200)
    assert isinstance(leases, LocalLeases) and not leases.shared
    assert await leases.acquire("sess_1") == Taken()
    assert await leases.renew(["sess_1"]) == []
    assert await leases.holder("sess_1") == "node_a"
    await store.aclose()


def test_node_ids_are_unique() -> None:
    assert len({new_node_id() for _ in range(100)}) == 100


# --- the keeper (MockClock) -----------------------------------------------------------


class ScriptedLeases:
    """Leases whose store answers as the test says."""

    shared = True
    node_id = "node_a"
    ttl_ms = 9000

    def __init__(self) -> None:
        self.renewals: list[tuple[float, list[str]]] = []
        self.taken_elsewhere: set[str] = set()
        self.down = False

    async def acquire(self, session_id: str) -> Taken | None:
        return None if session_id in self.taken_elsewhere else Taken(7, new=True)

    async def renew(self, session_ids: Sequence[str]) -> list[str]:
        if self.down:
            raise StoreError("Redis is down")
        self.renewals.append((trio.current_time(), list(session_ids)))
        return [s for s in session_ids if s in self.taken_elsewhere]

    async def release(self, session_ids: Sequence[str]) -> None:
        return None

    async def holder(self, session_id: str) -> str | None:
        return None


async def test_the_keeper_renews_every_third_of_the_lease_and_reports_a_lost_one(
    autojump_clock: trio.testing.MockClock,
) -> None:
    leases = ScriptedLeases()
    lost: list[str] = []
    keeper = LeaseKeeper(leases, lost.append)
    async with trio.open_nursery() as nursery:
        await nursery.start(keeper.run)
        assert await keeper.take("sess_1") == Taken(7, new=True)
        assert await keeper.take("sess_1") == Taken()  # held: no store round trip
        await keeper.take("sess_2")
        await trio.sleep(6.5)
        assert [when for when, _ in leases.renewals] == [3.0, 6.0]
        assert leases.renewals[0][1] == ["sess_1", "sess_2"]
        leases.taken_elsewhere.add("sess_2")  # another node has it now
        await trio.sleep(3)
        assert lost == ["sess_2"] and not keeper.holds("sess_2") and keeper.holds("sess_1")
        assert await keeper.take("sess_2") is None
        nursery.cancel_scope.cancel()


async def test_a_store_that_does_not_answer_costs_the_leases_after_a_whole_lease_time(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Until then the lease may still be this node's; after it another node may have it."""
    leases = ScriptedLeases()
    lost: list[str] = []
    errors: list[StoreError] = []
    keeper = LeaseKeeper(leases, lost.append, errors.append)
    async with trio.open_nursery() as nursery:
        await nursery.start(keeper.run)
        await keeper.take("sess_1")
        await trio.sleep(3.5)  # renewed at 3
        leases.down = True
        await trio.sleep(6)  # failed at 6 and 9: 6 s since the last renewal
        assert len(errors) == 2 and lost == []
        await trio.sleep(3)  # failed at 12: 9 s, the whole lease time
        assert lost == ["sess_1"] and not keeper.held
        nursery.cancel_scope.cancel()


# --- a gateway's leases and recovery ----------------------------------------------------


def redis_config(tmp_path: Path, server: RedisServer, db: int = 0, **more: Any) -> Any:
    overrides: dict[str, Any] = {
        "store.backend": "redis",
        "store.url": f"redis://127.0.0.1:{server.port}/{db}",
        "tools.enabled": ["sleep"],
        "store.lease_s": 0.3,
        **more,
    }
    return make_config(tmp_path, **overrides)


@pytest.mark.slow  # a real redis-server: its TTLs run on the real clock
async def test_a_gateway_holds_its_sessions_leases_and_lets_them_go_at_shutdown(
    tmp_path: Path, own_redis: RedisServer
) -> None:
    with trio.fail_after(30):
        async with running_gateway(redis_config(tmp_path, own_redis)) as gw:
            sid = await gw.create_session()
            node_id = gw.node.node_id
            assert command(own_redis.port, "GET", f"gw:lease:{{{sid}}}") == node_id.encode()
            await trio.sleep(1)  # three lease times: renewed by the lease-keeper meanwhile
            assert command(own_redis.port, "GET", f"gw:lease:{{{sid}}}") == node_id.encode()
            ttl = command(own_redis.port, "PTTL", f"gw:lease:{{{sid}}}")
            assert 0 < ttl <= 300
    assert command(own_redis.port, "EXISTS", f"gw:lease:{{{sid}}}") == 0  # released


@pytest.mark.slow  # a real redis-server: its TTLs run on the real clock
async def test_a_gateway_that_loses_a_lease_says_so(
    tmp_path: Path, own_redis: RedisServer, caplog: Any
) -> None:
    """Another node holds it now: the keeper's next round reports it (log and metric)."""
    with trio.fail_after(30):
        async with running_gateway(redis_config(tmp_path, own_redis)) as gw:
            sid = await gw.create_session()
            command(own_redis.port, "SET", f"gw:lease:{{{sid}}}", "node_other", "PX", "60000")
            await trio.sleep(0.5)  # renewed every 100 ms
            assert not gw.node.leases.holds(sid)
            failures = gw.node.metrics.registry.get_sample_value(
                "gateway_session_failures_total", {"component": "lease"}
            )
            assert failures == 1
            assert any(getattr(r, "event", "") == "lease_lost" for r in caplog.records)
    # Not released at shutdown: it is not this node's.
    assert command(own_redis.port, "GET", f"gw:lease:{{{sid}}}") == b"node_other"


@pytest.mark.slow  # a real redis-server: its TTLs run on the real clock
async def test_a_turn_whose_lease_a_live_node_holds_is_left_alone_until_it_lapses(
    tmp_path: Path, own_redis: RedisServer
) -> None:
    """Lease-aware recovery (docs/protocol.md §9 with several nodes).

    A node starting on a deployment where another node's turn is in flight
    does not close it while that node's lease holds; once the lease lapses
    (its node died), the recovery task closes the turn with
    ``server_restart``, and the session's next ids are above the old ones.
    """
    with trio.fail_after(30):
        async with running_gateway(redis_config(tmp_path, own_redis)) as gw:
            sid = await gw.create_session()
            async with gw.client(sid) as live:
                await live.subscribe()
                await gw.submit(sid, SLEEPY)
                await live.until(lambda e: e.type == "tool.called")
                crash_copy(own_redis)  # db 1: what a kill -9 of this node leaves
                before = gw.node.sequencer.last
    lease = f"gw:lease:{{{sid}}}"
    # In db 1 a live node (not this test's) holds the session's lease for now.
    command(own_redis.port, "SET", lease, "node_alive", "PX", "60000", db=1)

    with trio.fail_after(30):
        async with running_gateway(redis_config(tmp_path, own_redis, db=1)) as gw:
            await trio.sleep(1)  # start-up and three recovery rounds
            assert command(own_redis.port, "SMEMBERS", "gw:open", db=1) == [sid.encode()]
            assert command(own_redis.port, "GET", lease, db=1) == b"node_alive"
            assert sid not in gw.node.sessions  # not even loaded

            command(own_redis.port, "DEL", lease, db=1)  # that node died; its lease lapsed
            for _ in range(100):  # the next recovery round, within lease_s
                if not command(own_redis.port, "SCARD", "gw:open", db=1):
                    break
                await trio.sleep(0.05)
            assert command(own_redis.port, "SCARD", "gw:open", db=1) == 0
            assert command(own_redis.port, "GET", lease, db=1) == gw.node.node_id.encode()
            async with gw.client(sid) as again:
                await again.subscribe(since=format_event_id(before))
                closing = await again.until(lambda e: e.type == "turn.cancelled")
            assert closing[-1].payload.reason == "server_restart"
            assert all(int(e.id[4:]) > before for e in closing)


@pytest.mark.slow  # a real redis-server: its TTLs run on the real clock
async def test_a_request_for_a_session_whose_lease_lapsed_closes_its_turn_before_a_new_one(
    tmp_path: Path, own_redis: RedisServer
) -> None:
    """A node takes a free lease at the first request for the session, and closes the dead
    holder's turn then, before the request's own turn can start (no recovery pass needed)."""
    with trio.fail_after(30):
        async with running_gateway(redis_config(tmp_path, own_redis)) as gw:
            sid = await gw.create_session()
            async with gw.client(sid) as live:
                await live.subscribe()
                await gw.submit(sid, SLEEPY)
                await live.until(lambda e: e.type == "tool.called")
                crash_copy(own_redis)
                cursor = live.events[-1].id
    lease = f"gw:lease:{{{sid}}}"
    command(own_redis.port, "SET", lease, "node_dead", "PX", "60000", db=1)

    # lease_s 60: no recovery pass runs during the test; only the request can close the turn.
    with trio.fail_after(30):
        async with running_gateway(
            redis_config(tmp_path, own_redis, db=1, **{"store.lease_s": 60})
        ) as gw:
            assert command(own_redis.port, "SCARD", "gw:open", db=1) == 1  # held: left alone
            command(own_redis.port, "DEL", lease, db=1)  # its holder is dead: the lease lapsed
            await gw.submit(sid, "hello again")
            assert command(own_redis.port, "GET", lease, db=1) == gw.node.node_id.encode()
            async with gw.client(sid) as again:
                await again.subscribe(since=cursor)
                events = await again.until(lambda e: e.type == "turn.completed")
            kinds = [e.type for e in events]
            assert kinds.index("turn.cancelled") < kinds.index("turn.started"), kinds
            closing = events[kinds.index("turn.cancelled")]
            assert closing.payload.reason == "server_restart"


@pytest.mark.slow  # a real redis-server: its TTLs run on the real clock
async def test_a_turn_for_a_session_whose_holder_does_not_answer_is_503_with_retry_after(
    tmp_path: Path, own_redis: RedisServer
) -> None:
    """Turns run only on the lease holder (sent there: gateway.cluster).

    So no turn starts beside one a live node runs, and after a crash a turn
    sent before the dead holder's lease lapses waits for it (503, Retry-After:
    the lease time) instead of running and leaving the interrupted turn open
    for good.
    """
    with trio.fail_after(30):
        async with running_gateway(redis_config(tmp_path, own_redis)) as gw:
            sid = await gw.create_session()
            lease = f"gw:lease:{{{sid}}}"
            command(own_redis.port, "SET", lease, "node_alive", "PX", "60000")
            await trio.sleep(0.5)  # the keeper's next round: this node no longer holds it
            r = await gw.http.post(f"/sessions/{sid}/turns", json={"content": "hi"})
            assert r.status_code == 503, r.text
            assert r.json()["error"]["code"] == "session_owner_unreachable"  # nobody listens
            assert r.headers["retry-after"] == "1"  # ceil(lease_s = 0.3)
            command(own_redis.port, "DEL", lease)  # that node is gone: the lease lapsed
            r = await gw.http.post(f"/sessions/{sid}/turns", json={"content": "hi"})
            assert r.status_code == 202, r.text
            assert command(own_redis.port, "GET", lease) == gw.node.node_id.encode()


@pytest.mark.slow  # a real redis-server: its TTLs run on the real clock
async def test_a_node_whose_writes_the_lease_fences_shows_them_to_no_client(
    tmp_path: Path, own_redis: RedisServer
) -> None:
    """docs/protocol.md §9: every catalog event is durable before any client receives it.

    This node stalled past its lease (a pause, a partition from Redis) and
    another node took the session meanwhile; its keeper has not yet said so
    (lease_s 60: its next round is 20 s away). The store drops the turn's
    writes (the lease fences them): no client may be shown them, and the
    request is not told the turn was accepted.
    """
    with trio.fail_after(30):
        async with running_gateway(
            redis_config(tmp_path, own_redis, **{"store.lease_s": 60})
        ) as gw:
            sid = await gw.create_session()
            lease = f"gw:lease:{{{sid}}}"
            async with gw.client(sid) as live:
                await live.subscribe()
                command(own_redis.port, "SET", lease, "node_other", "PX", "60000")
                r = await gw.http.post(f"/sessions/{sid}/turns", json={"content": "hello"})
                with trio.move_on_after(3):  # the turn's events, if any come, or the close
                    with contextlib.suppress(ConnectionClosed):
                        await live.until_turn_ends()
            stored = command(own_redis.port, "ZRANGE", f"gw:e:{{{sid}}}", "0", "-1", "WITHSCORES")
            stored_ids = {format_event_id(int(score)) for score in stored[1::2]}
            shown = [e for e in live.events if e.type in CATALOG_TYPES]
            assert [e.type for e in shown if e.id not in stored_ids] == []
            assert r.status_code != 202, r.text
            assert not gw.node.leases.holds(sid)
    assert command(own_redis.port, "GET", lease) == b"node_other"

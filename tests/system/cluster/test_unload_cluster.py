"""Unloading on two nodes of one Redis (docs/protocol.md §13).

The owner keeps a family another node's clients watch; once they are gone
(its probe reaches no node) it unloads it and gives its lease back at once,
so the other node takes the session's next turn without waiting ``lease_s``.
A replica without clients unloads too. Ids go on above every earlier one.
"""

# ruff: noqa: ASYNC110 (the nodes' state is polled)

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from gateway.node import unloading
from tests.conftest import Harness
from tests.redis_support import RedisServer, own_redis
from tests.system.cluster.test_replica import two_nodes

pytestmark = pytest.mark.slow  # redis-server

__all__ = ["own_redis"]  # fixture

FAR = 10.0**9


async def idle_here(h: Harness, sid: str) -> None:
    """Wait until the node finds the family idle (each look probes its watchers)."""
    while sid not in [s.id for s in unloading.idle_families(h.node, FAR, 1.0)]:
        await trio.sleep(0.05)


async def test_the_owner_unloads_once_no_node_watches_and_gives_its_lease_back(
    tmp_path: Path, own_redis: RedisServer
) -> None:
    with trio.fail_after(60):
        async with two_nodes(tmp_path, own_redis, **{"store.lease_s": 30}) as (a, b):
            sid = await a.create_session()
            async with b.client(sid) as on_b:
                await on_b.subscribe()
                await a.submit(sid, "first")
                before = await on_b.until_turn_ends()
                await a.node.wait_durable()
                # B's client watches it: the owner keeps it (and B its replica).
                for _ in range(5):
                    assert unloading.idle_families(a.node, FAR, 1.0) == []
                    await trio.sleep(0.05)
            await idle_here(a, sid)  # B's client left: a probe reaches nobody
            await unloading.unload(a.node, [a.node.sessions[sid]])
            assert sid not in a.node.sessions
            assert await a.node.leases.leases.holder(sid) is None  # given back, not lapsing
            await idle_here(b, sid)
            await unloading.unload(b.node, [b.node.sessions[sid]])
            assert sid not in b.node.sessions
            assert sid not in b.node.cluster.watched  # type: ignore[union-attr]

            # Its next turn, on B: B takes the free lease at once and runs it.
            async with b.client(sid) as on_b:
                await on_b.subscribe()
                await b.submit(sid, "second")
                after = await on_b.until_turn_ends()
            assert b.node.runs_here(sid)
            assert min(e.id for e in after) > max(e.id for e in before)
            r = await b.http.get(f"/sessions/{sid}/messages")
            assert [m["role"] for m in r.json()["messages"]] == ["user", "assistant"] * 2

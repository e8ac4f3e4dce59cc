"""Two nodes, two doors, one client-chosen id: one tenant's session (docs/protocol.md §14).

Issue 38's race across nodes: tenant A on node 1's ``POST /agui`` with
``threadId`` X, tenant B on node 2's ``POST /ai-sdk/chat`` with ``id`` X,
released together (tests/named_race.py). No node-local bookkeeping can see
the other node's creation: the store's insert-if-absent
(``Store.insert_session``, one Lua script on Redis) decides. 200 pairs: each
name is one tenant's (its 200; the other 404), and what each key reads of it
on either node is that tenant's alone; then again after both nodes restarted
on the same Redis, where only the store remembers whose each session is.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cluster_support import CONFIG, running_cluster
from tests.named_race import KEYS, check_one_owner, race
from tests.redis_support import ensure_redis_server

# slow: redis-server and gateway serve processes
pytestmark = pytest.mark.slow

TENANTS = CONFIG + f"[auth]\napi_keys = {list(KEYS)!r}\n".replace("'", '"')


async def test_two_nodes_racing_for_one_name_make_one_session(tmp_path: Path) -> None:
    with running_cluster(ensure_redis_server(), tmp_path, 2, TENANTS) as cluster:
        one, two = cluster.live
        results = await race(200, ("agui", one.port), ("aisdk", two.port))
        won = await check_one_owner(results, [one.base, two.base])
        assert sum(won.values()) == 200 and all(won.values()), won  # both tenants won some
        for node in cluster.live:
            node.stop()
        cluster.ensure(2)
        await check_one_owner(results, [node.base for node in cluster.live])

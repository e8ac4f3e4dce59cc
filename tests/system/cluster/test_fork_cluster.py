"""A fork on two nodes of one Redis (docs/protocol.md §2, "Forks": "Several nodes").

The fork is made on the node that runs the source (the ``Fork`` operation),
whichever node the request reached: there its workspace is copied, there the
fork runs first; the other node answers with what the owner answered, its
refusals included (409 ``turn_in_progress``, 404 ``message_not_found``, 429
``too_many_sessions`` counted for the deployment), and its client sees the
fork's copied history and runs its turns on the owner.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from tests.conftest import Harness
from tests.integration.doors.rest.test_http_api import assert_error
from tests.redis_support import RedisServer, own_redis
from tests.system.cluster.test_replica import APPROVAL, two_nodes

pytestmark = pytest.mark.slow  # redis-server

__all__ = ["own_redis"]  # fixture


async def turn(node: Harness, sid: str, content: str) -> None:
    async with node.client(sid) as client:
        await client.subscribe()
        await node.submit(sid, content)
        events = await client.until_turn_ends()
    assert events[-1].type == "turn.completed"


async def test_a_fork_sent_to_another_node_is_made_where_the_source_runs(
    tmp_path: Path, own_redis: RedisServer
) -> None:
    with trio.fail_after(60):
        limits = {"limits.max_sessions_per_key": 3, "tools.require_approval": ["sleep"]}
        async with two_nodes(tmp_path, own_redis, **limits) as (a, b):
            source = await a.create_session()  # a holds its lease
            await turn(a, source, "alpha")
            workspace = Path(
                a.node.workspaces.host_path(a.node.sessions[source].record.workspace_path)
            )
            (workspace / "notes.txt").write_text("on a")
            rows = (await b.http.get(f"/sessions/{source}/messages")).json()["messages"]
            r = await b.http.post(f"/sessions/{source}/fork", json={})
            assert r.status_code == 201, r.text
            fork = r.json()["session_id"]
            assert r.json()["forked_from"]["at_message_id"] == rows[-1]["id"]
            assert a.node.runs_here(fork) and fork in a.node.sessions
            copy = Path(a.node.workspaces.host_path(a.node.sessions[fork].record.workspace_path))
            assert (copy / "notes.txt").read_text() == "on a"
            copied = (await b.http.get(f"/sessions/{fork}/messages")).json()["messages"]
            assert [m["id"] for m in copied] == [m["id"] for m in rows]
            await turn(b, fork, "beta")  # sent to b, run on a
            assert len((await a.http.get(f"/sessions/{fork}/messages")).json()["messages"]) == 4
            # The owner's refusals, answered by b as a would.
            unknown = await b.http.post(
                f"/sessions/{source}/fork", json={"at_message_id": "msg_00000000000000000000"}
            )
            assert_error(unknown, 404, "message_not_found")
            async with a.client(source) as on_a:
                await on_a.subscribe()
                await b.submit(source, APPROVAL)  # sleep waits for approval: a turn in flight
                await on_a.until(lambda e: e.type == "permission.requested")
                busy = await b.http.post(f"/sessions/{source}/fork", json={})
                assert_error(busy, 409, "turn_in_progress")
                turn_id = a.node.sessions[source].turn.id  # type: ignore[union-attr]
                await b.http.post(f"/sessions/{source}/turns/{turn_id}/cancel", json={})
                await on_a.until_turn_ends()
            assert (await b.http.post(f"/sessions/{source}/fork", json={})).status_code == 201
            full = await b.http.post(f"/sessions/{source}/fork", json={})  # the key's fourth
            error = assert_error(full, 429, "too_many_sessions")
            assert "max_sessions_per_key is 3" in error["message"]

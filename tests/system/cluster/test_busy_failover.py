"""kill -9 of a busy session's owner (docs/protocol.md §2 "A busy session": queued turns
survive a failover and go on at the new owner, in order, once each).

Two real ``gateway serve`` processes on one redis-server (tests/cluster_support.py,
``lease_s`` = 1 s). The session's owner runs a turn stopped in a tool, with two
turns queued and a steer waiting (sent through the other node: forwarded to the
owner); then the owner is killed. The survivor closes the turn
(``server_restart``), turns the steer into a queued turn of its own, and runs
the three, in order, each once.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio

from gateway.protocol.events import Event
from tests.cluster_support import ENDS, LEASE_S, Node, leaf, peers, running_cluster
from tests.redis_support import ensure_redis_server

pytestmark = pytest.mark.slow  # redis-server and gateway serve processes, one killed

SLEEPY = {"script": {"rounds": [[{"tool_use": {"name": "sleep", "input": {"seconds": 60}}}]]}}


def turn_kinds(events: list[Event]) -> list[tuple[str, str | None]]:
    return [(e.type, e.turn_id) for e in events if e.type.startswith("turn.")]


async def busy_then_killed(nodes: list[Node]) -> tuple[list[str], list[Event], list[Event]]:
    owner = nodes[0]
    with trio.fail_after(20 + 4 * LEASE_S):
        async with peers(nodes) as (a, b):
            sid = await a.create_session()
            async with b.watch(sid) as seen:
                running = await a.submit(sid, SLEEPY)
                await seen.until_type("tool.called")
                turns = f"/sessions/{sid}/turns"
                queued = []
                for text in ("B", "C"):
                    r = await b.http.post(turns, json={"content": text, "if_busy": "queue"})
                    assert r.status_code == 202, r.text
                    queued.append(r.json()["turn_id"])
                r = await b.http.post(turns, json={"content": "S", "if_busy": "steer"})
                assert r.json() == {"turn_id": running, "steered": True}, r.text
                await seen.until(lambda e: e.type == "turn.queued" and e.turn_id == queued[1])
                owner.kill()
            async with b.watch(sid, since=seen.events[-1].id) as after:
                with trio.fail_after(10 + 4 * LEASE_S):
                    while sum(e.type in ENDS for e in after.events) < 4:
                        await after.until(lambda e: e.type in ENDS)
                await trio.sleep(2 * LEASE_S)  # a turn run twice would show by now
            everything = await b.replay(sid)
    return [running, *queued], after.events, everything


def test_queued_turns_and_a_steer_go_on_at_the_new_owner_once_each(tmp_path: Path) -> None:
    with running_cluster(ensure_redis_server(), tmp_path, 2) as cluster:
        try:
            ids, after, everything = trio.run(busy_then_killed, cluster.live)
        except BaseExceptionGroup as group:
            raise leaf(group) from None
        survivor = next(n for n in cluster.live if n.alive)
        errors = [e for e in survivor.log_events() if e.get("level") in ("error", "ERROR")]
    running, b, c = ids
    kinds = turn_kinds(after)
    assert kinds[0] == ("turn.cancelled", running), kinds
    assert after[[e.type for e in after].index("turn.cancelled")].payload.reason == (
        "server_restart"
    )
    [(_, steer)] = [k for k in kinds if k[0] == "turn.queued"]
    assert kinds[1:] == [
        ("turn.queued", steer),
        ("turn.started", b),
        ("turn.completed", b),
        ("turn.started", c),
        ("turn.completed", c),
        ("turn.started", steer),
        ("turn.completed", steer),
    ], kinds
    started = [e.turn_id for e in everything if e.type == "turn.started"]
    assert sorted(started) == sorted([running, b, c, steer])  # once each, in the store too
    users = [e.payload.user_message.content[0].text for e in everything if e.type == "turn.started"]
    assert users == [json.dumps(SLEEPY), "B", "C", "S"]
    assert not errors, errors

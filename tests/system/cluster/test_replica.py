"""Two nodes in one process on one Redis: replicas, routing to the owner, live relay.

gateway/cluster/ and the replica paths of gateway/node/placement.py and
gateway/session/seam.py, with two whole gateways (``running_gateway``) on a
redis-server of the test's own. Cheaper than processes, and each node's state
can be looked at; tests/system/cluster/test_cluster.py runs separate processes (and kill -9).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from gateway.protocol.events import CATALOG_TYPES
from gateway.protocol.frames import Snapshot, SubscribeAck
from tests.conftest import TOOL_SCRIPT, Client, Harness, make_config, running_gateway, types
from tests.redis_support import RedisServer, own_redis
from tests.system.store.test_redis_store import command

# slow: redis-server
pytestmark = pytest.mark.slow

__all__ = ["own_redis"]  # fixture

SLEEPY = {"script": {"rounds": [[{"tool_use": {"name": "sleep", "input": {"seconds": 60}}}]]}}
APPROVAL = {"script": {"rounds": [[{"tool_use": {"name": "sleep", "input": {"seconds": 0}}}]]}}


def node_config(tmp_path: Path, server: RedisServer, name: str, **more: Any) -> Any:
    overrides: dict[str, Any] = {
        "store.backend": "redis",
        "store.url": server.url,
        "tools.enabled": ["sleep"],
        "store.lease_s": 1.0,
        **more,
    }
    (tmp_path / name).mkdir(exist_ok=True)
    return make_config(tmp_path / name, **overrides)


@asynccontextmanager
async def two_nodes(
    tmp_path: Path, server: RedisServer, **more: Any
) -> AsyncIterator[tuple[Harness, Harness]]:
    async with (
        running_gateway(node_config(tmp_path, server, "a", **more)) as a,
        running_gateway(node_config(tmp_path, server, "b", **more)) as b,
    ):
        yield a, b


async def closing_of(client: Client) -> Exception:
    """Receive until the connection closes; what ended it (its close reason in ``str()``)."""
    try:
        while True:
            await client.recv()
    except Exception as exc:  # the close
        return exc


def ids_and_types(events: list[Any]) -> list[tuple[str, str]]:
    return [(e.id, e.type) for e in events]


async def test_a_turn_sent_to_a_replica_runs_on_the_owner_and_both_nodes_clients_see_it(
    tmp_path: Path, own_redis: RedisServer
) -> None:
    with trio.fail_after(30):
        async with two_nodes(tmp_path, own_redis) as (a, b):
            sid = await a.create_session()  # a holds its lease
            assert a.node.runs_here(sid)
            async with a.client(sid) as on_a, b.client(sid) as on_b:  # token from a, b
                await on_a.subscribe()
                await on_b.subscribe()
                assert not b.node.runs_here(sid)  # a replica on b
                await b.submit(sid, TOOL_SCRIPT)  # sent to b: runs on a
                seen_a = await on_a.until_turn_ends()
                seen_b = await on_b.until_turn_ends()
            assert a.node.sessions[sid].turn is None and b.node.sessions[sid].turn is None
            assert "tool.completed" in types(seen_a)
            assert ids_and_types(seen_b) == ids_and_types(seen_a)
            assert [e.payload for e in seen_b] == [e.payload for e in seen_a]
            assert not b.node.runs_here(sid)
            cluster = a.node.cluster
            assert cluster is not None and cluster.published > 0
            # Feedback and the messages page through b act on the owner's session.
            messages = (await b.http.get(f"/sessions/{sid}/messages")).json()["messages"]
            assert messages == (await a.http.get(f"/sessions/{sid}/messages")).json()["messages"]
            assert len(messages) == 4 and messages[-1]["status"] == "complete"
            r = await b.http.post(
                f"/sessions/{sid}/feedback", json={"message_id": messages[-1]["id"], "rating": 1}
            )
            assert r.status_code == 202, r.text
            r = await b.http.post(
                f"/sessions/{sid}/feedback", json={"message_id": "msg_nope", "rating": 1}
            )
            assert (r.status_code, r.json()["error"]["code"]) == (404, "message_not_found")


async def test_cancel_and_permission_sent_to_a_replica_act_on_the_owner(
    tmp_path: Path, own_redis: RedisServer
) -> None:
    with trio.fail_after(30):
        async with two_nodes(tmp_path, own_redis, **{"tools.require_approval": ["sleep"]}) as (
            a,
            b,
        ):
            sid = await a.create_session()
            async with b.client(sid) as on_b:
                await on_b.subscribe()
                await b.submit(sid, APPROVAL)
                asked = await on_b.until(lambda e: e.type == "permission.requested")
                perm_id = asked[-1].payload.perm_id
                state = (await b.http.get("/sessions")).json()["sessions"]
                assert state[0]["session"]["id"] == sid
                r = await b.http.post(
                    f"/sessions/{sid}/permissions/{perm_id}", json={"decision": "allow"}
                )
                assert r.status_code == 202, r.text
                await on_b.until_turn_ends()
                assert "tool.completed" in types(on_b.events)

                turn_id = await b.submit(sid, SLEEPY)
                await on_b.until(lambda e: e.type == "tool.called")
                r = await b.http.post(f"/sessions/{sid}/turns/{turn_id}/cancel", json={})
                assert r.status_code == 202, r.text
                end = await on_b.until_turn_ends()
                assert end[-1].type == "turn.cancelled"
                r = await b.http.post(f"/sessions/{sid}/turns/{turn_id}/cancel", json={})
                assert (r.status_code, r.json()["error"]["code"]) == (409, "turn_not_in_flight")


async def test_snapshot_and_since_on_a_node_that_never_saw_the_session(
    tmp_path: Path, own_redis: RedisServer
) -> None:
    """The owner computes the cut; the replica's live feed joins it with no gap or duplicate."""
    with trio.fail_after(30):
        async with two_nodes(tmp_path, own_redis) as (a, b):
            sid = await a.create_session()
            async with a.client(sid) as on_a:
                await on_a.subscribe()
                await a.submit(sid, TOOL_SCRIPT)
                first = await on_a.until_turn_ends()
                cut = next(i for i, e in enumerate(first) if e.type == "tool.called")
                assert sid not in b.node.sessions
                async with b.client(sid) as snap, b.client(sid) as resumed:
                    ack = await snap.subscribe(snapshot=True)
                    assert isinstance(ack, SubscribeAck)
                    frame = await snap.recv()
                    assert isinstance(frame, Snapshot)
                    assert [m.role for m in frame.messages][-1] == "assistant"
                    assert frame.snapshot_at_event_id is not None
                    assert frame.snapshot_at_event_id >= first[-1].id

                    ack = await resumed.subscribe(since=first[cut].id)
                    assert isinstance(ack, SubscribeAck)
                    for _ in range(ack.replay_event_count):
                        await resumed.recv()
                    catalog_after = [e.id for e in first[cut + 1 :] if e.type in CATALOG_TYPES]
                    replayed = [e.id for e in resumed.events if e.type in CATALOG_TYPES]
                    assert replayed[: len(catalog_after)] == catalog_after
                    assert "message.complete" in types(resumed.events)

                    await a.submit(sid, "and again")  # live through the relay, after the cut
                    seen_a = await on_a.until_turn_ends()
                    seen_snap = await snap.until_turn_ends()
                    seen_resumed = await resumed.until_turn_ends()
                    assert ids_and_types(seen_snap) == ids_and_types(seen_a)
                    assert ids_and_types(seen_resumed)[-len(seen_a) :] == ids_and_types(seen_a)
                    ids = [e.id for e in resumed.events]
                    assert ids == sorted(set(ids))  # once each, in id order


async def test_a_lost_relay_batch_closes_the_replicas_clients_to_resume(
    tmp_path: Path, own_redis: RedisServer
) -> None:
    with trio.fail_after(30):
        async with two_nodes(tmp_path, own_redis) as (a, b):
            sid = await a.create_session()
            async with b.client(sid) as on_b:
                await on_b.subscribe()
                await a.submit(sid, "one")
                await on_b.until_turn_ends()
                cluster = a.node.cluster
                assert cluster is not None
                cluster._batch_no[sid] += 5  # five batches lost on the way
                await a.submit(sid, "two")
                assert "relay_gap" in str(await closing_of(on_b))


async def test_attach_tokens_are_single_use_across_nodes(
    tmp_path: Path, own_redis: RedisServer
) -> None:
    with trio.fail_after(30):
        async with two_nodes(tmp_path, own_redis) as (a, b):
            sid = await a.create_session()
            token = (await a.http.get(f"/sessions/{sid}")).json()["attach_token"]
            other = await a.create_session()
            bad = await b.http.get(f"/sessions/{other}/stream?attach={token}")
            assert bad.status_code == 403
            assert bad.json()["error"]["code"] == "attach_token_invalid"
            # not used up by that attempt: still good on its own session (docs/protocol.md §15)
            r = await b.http.get(f"/sessions/{sid}/stream?attach={token}")
            assert r.status_code != 403, r.text
            fresh = (await a.http.get(f"/sessions/{sid}")).json()["attach_token"]
            r = await b.http.get(f"/sessions/{sid}/stream?attach={fresh}")
            assert r.status_code != 403  # redeemed on b (not an upgrade: 4xx of its own)
            again = await a.http.get(f"/sessions/{sid}/stream?attach={fresh}")
            assert again.json()["error"]["code"] == "attach_token_invalid"


async def test_a_node_that_loses_a_lease_stops_the_turn_and_the_holder_closes_it(
    tmp_path: Path, own_redis: RedisServer
) -> None:
    """Fencing: the old owner emits nothing more; the new one closes the turn (section 9)."""
    with trio.fail_after(30):
        async with two_nodes(tmp_path, own_redis) as (a, b):
            sid = await a.create_session()
            async with a.client(sid) as on_a, b.client(sid) as on_b:
                await on_a.subscribe()
                await on_b.subscribe()
                await a.submit(sid, SLEEPY)
                await on_b.until(lambda e: e.type == "tool.called")
                # a's lease lapses (a paused past it, say) and b takes it: b
                # closes the turn a left open, live to b's client (section 9).
                command(own_redis.port, "DEL", f"gw:lease:{{{sid}}}")
                await b.node.get_session(sid)
                assert b.node.runs_here(sid)
                await on_b.until(lambda e: e.type == "turn.cancelled")
                closing = on_b.events[-1]
                assert closing.payload.reason == "server_restart"
                assert closing.payload.phase == "tools"
                # a learns at its next renewal: its client is closed to resume,
                # its turn stops without a further event.
                assert "relay_gap" in str(await closing_of(on_a))
                assert not any(e.type == "turn.cancelled" for e in on_a.events)
                session = a.node.sessions[sid]
                while session.turn is not None or session.fenced:
                    await a.node.changed()  # Session._stopped_here notifies
                assert not a.node.runs_here(sid)
                await a.submit(sid, "after")  # sent to a: runs on b now
                await on_b.until_turn_ends()
                assert b.node.sessions[sid].messages[-1].status == "complete"


async def test_the_cluster_link_survives_its_pub_sub_connections_being_killed(
    tmp_path: Path, own_redis: RedisServer
) -> None:
    """Redis drops every subscriber: both nodes subscribe again; routing and relay go on."""
    with trio.fail_after(30):
        async with two_nodes(tmp_path, own_redis) as (a, b):
            sid = await a.create_session()
            async with b.client(sid) as on_b:
                await on_b.subscribe()
                await b.submit(sid, "one")
                await on_b.until_turn_ends()
                assert command(own_redis.port, "CLIENT", "KILL", "TYPE", "pubsub") == 2
                for _ in range(100):  # routed through a again once its channel is back
                    r = await b.http.post(f"/sessions/{sid}/turns", json={"content": "two"})
                    if r.status_code == 202:
                        break
                    assert r.json()["error"]["code"] == "session_owner_unreachable", r.text
                    await trio.sleep(0.05)
                assert r.status_code == 202, r.text
            async with b.client(sid) as again:  # a fresh client: live again through the relay
                await again.subscribe(since=on_b.events[-1].id)
                await again.until(lambda e: e.type == "turn.completed")
                await b.submit(sid, "three")
                end = await again.until_turn_ends()
                assert end[-1].payload.stop_reason == "end_turn"


async def test_the_owner_publishes_only_while_another_node_watches(
    tmp_path: Path, own_redis: RedisServer
) -> None:
    """A batch nobody would receive costs nothing (gateway.cluster ``heard``)."""
    with trio.fail_after(30):
        async with two_nodes(tmp_path, own_redis) as (a, b):
            cluster = a.node.cluster
            assert cluster is not None
            sid = await a.create_session()
            async with a.client(sid) as on_a:
                await on_a.subscribe()
                await a.submit(sid, "alone")
                await on_a.until_turn_ends()
                assert cluster.published == 0 and sid not in cluster.audience
                async with b.client(sid) as on_b:
                    await on_b.subscribe()  # b watches: a is told before the cut
                    assert sid in cluster.audience
                    await a.submit(sid, "watched")
                    seen = await on_b.until_turn_ends()
                    assert ids_and_types(seen) == ids_and_types(await on_a.until_turn_ends())
                    assert cluster.published > 0
                # b's client left: b lets go at the next batch, and a stops publishing
                # once a PUBLISH reaches nobody.
                for _ in range(3):
                    await a.submit(sid, "alone again")
                    await on_a.until_turn_ends()
                assert sid not in cluster.audience
                published = cluster.published
                await a.submit(sid, "unwatched")
                await on_a.until_turn_ends()
                assert cluster.published == published


async def dies_after_an_unpublished_commit(owner: Harness, redis: RedisServer, sid: str) -> None:
    """``owner`` commits an event (a ``feedback.recorded``) that it never publishes, then
    dies: the window between a commit and its PUBLISH, aimed by dropping its publishes;
    its lease is gone, so the next request on another node takes the session."""
    cluster = owner.node.cluster
    assert cluster is not None
    cluster.publish = lambda *args, **kw: None  # type: ignore[method-assign]
    reply = owner.node.sessions[sid].messages[-1].id
    r = await owner.http.post(f"/sessions/{sid}/feedback", json={"message_id": reply, "rating": 1})
    assert r.status_code == 202, r.text  # committed, published nowhere
    owner.node.leases.held.clear()
    command(redis.port, "DEL", f"gw:lease:{{{sid}}}")


async def completed_or_closed(watch: Client) -> Exception | None:
    """Wait (5 s at most) for ``watch``'s next ``turn.completed``; the close that came
    instead, if one did."""
    with trio.move_on_after(5):
        try:
            await watch.until(lambda e: e.type == "turn.completed")
        except Exception as exc:  # the close
            return exc
    return None


async def test_a_batch_its_dead_owner_committed_but_never_published_reaches_the_replicas_clients(
    tmp_path: Path, own_redis: RedisServer
) -> None:
    """docs/protocol.md §9 "Redis and several nodes": a node that loses some of the live
    batches closes its clients with relay_gap, so that no event is lost for a client.

    The owner committed a batch and died before publishing it (the window between a
    commit and its PUBLISH; aimed here by dropping a's publishes). The replica that
    takes the session over must not leave its clients without that event: they get it,
    or are closed to resume with ``since``.
    """
    with trio.fail_after(30):
        async with two_nodes(tmp_path, own_redis) as (a, b):
            sid = await a.create_session()
            async with b.client(sid) as on_b:
                await on_b.subscribe()
                await a.submit(sid, "one")
                await on_b.until_turn_ends()
                await dies_after_an_unpublished_commit(a, own_redis, sid)
                await b.submit(sid, "two")  # b takes the session at a request
                assert b.node.runs_here(sid)
                closed = await completed_or_closed(on_b)
                seen = types(on_b.events)
                assert "feedback.recorded" in seen or "relay_gap" in str(closed), seen


async def test_a_batch_its_dead_owner_never_published_reaches_a_third_nodes_clients(
    tmp_path: Path, own_redis: RedisServer
) -> None:
    """As above, for a node that only watches: the new owner's batches are another
    node's numbering, so the batch the dead owner committed and never published must
    be found in the store before they go out (or the clients resume with ``since``)."""
    with trio.fail_after(30):
        async with (
            two_nodes(tmp_path, own_redis) as (a, b),
            running_gateway(node_config(tmp_path, own_redis, "c")) as c,
        ):
            sid = await a.create_session()
            async with c.client(sid) as on_c:
                await on_c.subscribe()
                await a.submit(sid, "one")
                await on_c.until_turn_ends()
                await dies_after_an_unpublished_commit(a, own_redis, sid)
                await b.submit(sid, "two")
                assert b.node.runs_here(sid)
                closed = await completed_or_closed(on_c)
                seen = types(on_c.events)
                assert "turn.started" in seen[2:] or closed is not None  # b's batches came
                assert "feedback.recorded" in seen or "relay_gap" in str(closed), seen

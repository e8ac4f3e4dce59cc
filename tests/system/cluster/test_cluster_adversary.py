"""Several nodes on one Redis, attacked (docs/scale-out.md; docs/protocol.md sections 3, 8, 9).

Two in-process nodes on a redis-server of the test's own (``two_nodes`` of
tests/system/cluster/test_replica.py). Two kinds of test:

- **Bugs found by trying to break the cluster**, each reproduced where it
  happens (they were strict expected failures until fixed): a batch lost
  while the pub/sub connection reconnects, a replica's forwarded warning
  dropped when it took the free lease on the way, an unwatch racing a watch,
  and a turn sent while the recovery pass takes the lease starting before the
  interrupted turn's closing. The final assertions are made outside the
  nodes' nurseries, and each names what went wrong.
- **Pins**: behaviour that works and no other test covered (foreign messages
  on the cluster channels, two nodes racing for one free lease, a slow client
  of a replica, an AG-UI run through a replica, workers' events on a replica).
"""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio
from trio_websocket import ConnectionClosed

from gateway.cluster import ops
from gateway.cluster.link import LiveBatch, Reply, Request
from gateway.node import recovery
from gateway.protocol.events import CATALOG_TYPES
from tests.conftest import Harness
from tests.integration.doors.agui.test_agui_http import LONG_NAP, TEXT, agui, run_all, run_input
from tests.integration.doors.websocket.test_slow_client import _subscribed_raw
from tests.integration.doors.websocket.test_subscribe import FilteredClient
from tests.redis_support import RedisServer, own_redis
from tests.system.cluster.test_replica import SLEEPY, two_nodes
from tests.system.store.test_redis_store import command

# slow: redis-server; real Redis pub/sub and TTLs run on the real clock
pytestmark = pytest.mark.slow

__all__ = ["own_redis"]  # fixture

_pack = msgspec.msgpack.encode


def _op(value: Any) -> msgspec.Raw:
    """An operation as a Request carries it (gateway.cluster.ops), well-formed or not."""
    return msgspec.Raw(_pack(value))


def lease_key(sid: str) -> str:
    return f"gw:lease:{{{sid}}}"


def live_channel(sid: str) -> str:
    return f"gw:live:{{{sid}}}"


def subscribers(server: RedisServer, channel: str) -> int:
    """How many pub/sub connections Redis counts on ``channel`` (PUBSUB NUMSUB)."""
    return int(command(server.port, "PUBSUB", "NUMSUB", channel)[1])


# --- bugs (expected failures) ---------------------------------------------------------


async def test_a_batch_lost_while_the_pub_sub_connection_reconnects_closes_the_clients(
    tmp_path: Path, own_redis: RedisServer
) -> None:
    """gateway/cluster/link.py: "What was published meanwhile is lost: the clients of every
    watched family are told (on_gap) and resume" (docs/protocol.md §3, close relay_gap)."""
    with trio.fail_after(20):
        async with two_nodes(tmp_path, own_redis) as (a, b):
            sid = await a.create_session()
            async with b.client(sid) as on_b:
                await on_b.subscribe()
                await b.submit(sid, "one")
                await on_b.until_turn_ends()
                messages = (await a.http.get(f"/sessions/{sid}/messages")).json()["messages"]
                if not a.node.runs_here(sid):  # a loaded machine: a's lease lapsed, b took it
                    pytest.skip("the session moved to b, the client's node (timing)")
                assert a.node.cluster is not None
                published = a.node.cluster.published
                # Redis drops every subscriber (a network blip, a proxy restart)...
                assert command(own_redis.port, "CLIENT", "KILL", "TYPE", "pubsub") == 2
                # ...and the owner publishes one batch (the last for a while) meanwhile.
                r = await a.http.post(
                    f"/sessions/{sid}/feedback",
                    json={"message_id": messages[-1]["id"], "rating": 1},
                )
                assert r.status_code == 202, r.text
                while a.node.cluster.published == published:  # noqa: ASYNC110 (a counter)
                    await trio.sleep(0.001)
                if subscribers(own_redis, live_channel(sid)):  # coredis waits >= 0.1 s first
                    pytest.skip("b subscribed again before the batch was published (timing)")
                while not subscribers(own_redis, live_channel(sid)):  # noqa: ASYNC110 (Redis)
                    await trio.sleep(0.01)  # b's pub/sub connection is back
                told = False
                with trio.move_on_after(0.3):
                    try:
                        await on_b.until(lambda e: e.type == "feedback.recorded")
                        told = True  # not lost after all
                    except ConnectionClosed as exc:
                        told = "relay_gap" in str(exc.reason)
    assert told, "b's client was neither sent the batch nor closed with relay_gap"


async def test_a_warning_forwarded_by_a_replica_that_takes_the_free_lease_is_emitted(
    tmp_path: Path, own_redis: RedisServer
) -> None:
    """docs/protocol.md sections 3 and 8: a slow client's ``bus.handler_warning`` is emitted (and
    persisted); docs/scale-out.md: a replica sends it to the owner, which may be itself."""
    with trio.fail_after(20):
        async with two_nodes(tmp_path, own_redis) as (a, b):
            sid = await a.create_session()
            async with b.client(sid) as on_b:
                await on_b.subscribe()
                command(own_redis.port, "DEL", lease_key(sid))  # a died (its lease lapsed)
                session = b.node.sessions[sid]
                assert not b.node.runs_here(sid)
                session.warn("ws-x", "client_too_slow", "outbound queue exceeded")  # forwarded
                with trio.move_on_after(0.3):
                    await on_b.until(lambda e: e.type == "bus.handler_warning")
                took = b.node.runs_here(sid)  # the forward took the lease
                warned = [e for e in on_b.events if e.type == "bus.handler_warning"]
    assert took
    assert warned, "the warning was dropped"


async def test_a_watch_racing_the_lazy_unwatch_stays_subscribed(
    tmp_path: Path, own_redis: RedisServer
) -> None:
    """docs/scale-out.md "Receivers": a replica subscribes when a client subscribes and lets
    go lazily (a batch with no client left). Here a batch for a family with no client left
    here (``ClusteredPlacement.on_live`` calls ``unwatch``) meets a client subscribing
    (``Node.watch``)."""
    with trio.fail_after(20):
        async with two_nodes(tmp_path, own_redis) as (a, b):
            sid = await a.create_session()
            cluster = b.node.cluster
            assert cluster is not None
            async with b.client(sid) as on_b:
                await on_b.subscribe()
                assert subscribers(own_redis, live_channel(sid)) == 1
                cluster.unwatch(sid)  # what _on_live does with no client left
                await b.node.watch(b.node.sessions[sid])  # a new client's subscribe
                await trio.sleep(0.1)  # the unwatch task has run
                watched = sid in cluster.watched
                count = subscribers(own_redis, live_channel(sid))
    assert watched
    assert count == 1, "b believes it watches the family; Redis sends it nothing"


async def test_a_turn_sent_while_the_recovery_pass_takes_the_lease_comes_after_the_closing(
    tmp_path: Path, own_redis: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/protocol.md §9 and docs/scale-out.md: the turn a dead holder left in flight is
    closed (``server_restart``) before any new turn starts; "a pass and a request taking the
    same lease never close a turn twice" (and, here, never zero times). The recovery pass's
    store read (``Failover.took_over``) is held open to land the request in that window; the
    pass is run by the test rather than waited for (``recovery`` runs it every lease_s / 2)."""
    with trio.fail_after(20):
        async with two_nodes(tmp_path, own_redis) as (a, b):
            sid = await a.create_session()

            close_interrupted_turns = recovery.close_interrupted_turns

            async def only_b(node: Any) -> None:  # a (which loses the lease) stays out of it
                if node is b.node:
                    await close_interrupted_turns(node)

            monkeypatch.setattr(recovery, "close_interrupted_turns", only_b)
            entered, release = trio.Event(), trio.Event()
            took_over = b.node.failover.took_over

            async def slow_took_over(session: Any, taken: Any) -> None:
                entered.set()
                await release.wait()  # a slow store read
                await took_over(session, taken)

            monkeypatch.setattr(b.node.failover, "took_over", slow_took_over)
            answers: list[Any] = []

            async def post() -> None:
                answers.append(await b.http.post(f"/sessions/{sid}/turns", json={"content": "x"}))

            async with b.client(sid) as ws:
                on_b = FilteredClient(ws.ws, sid)
                await on_b.subscribe()
                old = await a.submit(sid, SLEEPY)
                await on_b.until(lambda e: e.type == "tool.called")
                command(own_redis.port, "DEL", lease_key(sid))  # a "died": its lease lapsed
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(close_interrupted_turns, b.node)  # b's recovery pass
                    await entered.wait()  # it took the lease and reads the store
                    nursery.start_soon(post)  # a request for the session meanwhile
                    await trio.sleep(0.1)
                    release.set()
                new = answers[0].json().get("turn_id")
                if new is not None:
                    await on_b.until(lambda e: e.type == "turn.completed" and e.turn_id == new)
                ends = [
                    (e.type, e.turn_id)
                    for e in on_b.events
                    if e.type in ("turn.started", "turn.completed", "turn.cancelled")
                ]
    assert answers[0].status_code == 202, answers[0].text
    assert ends[-3:] == [
        ("turn.cancelled", old),
        ("turn.started", new),
        ("turn.completed", new),
    ], ends


# --- pins: works, not tested elsewhere ------------------------------------------------


async def test_foreign_and_malformed_messages_on_the_cluster_channels_are_dropped(
    tmp_path: Path, own_redis: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """gateway/cluster/link.py: what arrives never ends the listener. Redis access is trusted
    (anyone with it can forge a Request or a LiveBatch), but garbage is logged and dropped,
    a request the owner cannot serve is answered with an error, and both nodes go on."""
    with trio.fail_after(20):
        async with two_nodes(tmp_path, own_redis) as (a, b):
            sid = await a.create_session()
            async with a.client(sid) as on_a, b.client(sid) as on_b:
                await on_a.subscribe()
                await on_b.subscribe()
                na, nb = a.node.node_id, b.node.node_id
                to_a, live = f"gw:node:{na}", live_channel(sid)
                junk: list[tuple[str, bytes]] = [
                    (to_a, b"\xff\x00 not MessagePack"),
                    (f"gw:node:{nb}", b""),
                    (live, b"\xc1"),
                    (live, _pack(["b", "wrong", "shape"])),
                    (live, _pack(LiveBatch("node_forged", 1, sid, []))),  # no events
                    (live, _pack(LiveBatch("node_forged", 2, "sess_nope", []))),
                    (to_a, _pack(Request(1, nb, sid, _op({"type": "no_such_op"})))),
                    (to_a, _pack(Request(2, nb, sid, _op({"type": "cancel"})))),
                    (to_a, _pack(Request(3, nb, sid, _op([1, 2, 3, 4, 5])))),
                    (to_a, _pack(Request(4, nb, sid, _op(ops.Replay(b"{}", 5))))),
                    (to_a, _pack(Request(5, nb, sid, _op({"type": "snapshot", "limit": "ten"})))),
                    (to_a, _pack(Request(6, nb, "sess_nope", _op(ops.Compact())))),
                    (to_a, _pack(Request(7, "x" * 10_000, sid, _op(ops.State())))),
                    (f"gw:node:{nb}", _pack(Reply(10**9, ops.Done()))),  # nobody waits for it
                ]
                for channel, data in junk:
                    assert command(own_redis.port, "PUBLISH", channel, data) == 1
                await b.submit(sid, "after the junk")  # routed to a, relayed to b
                seen_a = await on_a.until_turn_ends()
                seen_b = await on_b.until_turn_ends()
                assert [(e.id, e.type) for e in seen_b] == [(e.id, e.type) for e in seen_a]
                assert seen_b[-1].type == "turn.completed"
    dropped = [r for r in caplog.records if "undecodable" in r.getMessage()]
    assert len(dropped) == 4
    refused = [r for r in caplog.records if "cluster: serving" in r.getMessage()]
    assert len(refused) == 5  # logged with the traceback; the sender was refused


async def test_two_nodes_racing_for_a_free_lease_run_one_turn(
    tmp_path: Path, own_redis: RedisServer
) -> None:
    """docs/scale-out.md "Where a request goes": turns sent to two nodes at once for a
    session nobody holds: one node takes the lease and runs one of them, the other is
    forwarded there and refused 409 ``turn_in_progress`` (docs/protocol.md §2)."""
    with trio.fail_after(20):
        async with two_nodes(tmp_path, own_redis, **{"store.lease_s": 0.3}) as (a, b):
            sid = await a.create_session()
            command(own_redis.port, "DEL", lease_key(sid))  # a's lease lapsed...
            session = a.node.sessions[sid]
            while a.node.leases.holds(sid) or session.fenced:  # noqa: ASYNC110
                await trio.sleep(0.01)  # ...and a noticed (its next renewal)
            answers: list[tuple[int, str]] = []

            async def post(h: Harness) -> None:
                r = await h.http.post(
                    f"/sessions/{sid}/turns", json={"content": json.dumps(SLEEPY)}
                )
                answers.append((r.status_code, r.json().get("error", {}).get("code", "")))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(post, a)
                nursery.start_soon(post, b)
            assert sorted(answers) == [(202, ""), (409, "turn_in_progress")], answers
            runs = [h for h in (a, b) if h.node.runs_here(sid)]
            assert len(runs) == 1
            holder = command(own_redis.port, "GET", lease_key(sid))
            assert holder == runs[0].node.node_id.encode()
            assert runs[0].node.sessions[sid].turn is not None
            other = b if runs[0] is a else a
            assert sid not in other.node.sessions or other.node.sessions[sid].turn is None


def _server_text_frames(data: bytes) -> list[dict[str, Any]]:
    """The unmasked text frames a server sent (RFC 6455 section 5.2), as JSON."""
    out: list[dict[str, Any]] = []
    i = 0
    while i + 2 <= len(data):
        opcode, n = data[i] & 0x0F, data[i + 1] & 0x7F
        i += 2
        if n >= 126:
            width = 2 if n == 126 else 8
            n = int.from_bytes(data[i : i + width], "big")
            i += width
        if i + n > len(data):
            break
        if opcode == 1:
            out.append(json.loads(data[i : i + n]))
        i += n
    return out


LOREM = {"script": {"delay_ms": 1, "rounds": [[{"lorem": 200}]]}}


async def test_a_slow_client_of_a_replica_is_warned_once_on_every_node_in_id_order(
    tmp_path: Path, own_redis: RedisServer
) -> None:
    """docs/protocol.md §3 "Backpressure" across nodes (docs/scale-out.md "A slow client of
    a replica"): the replica closes it and the owner emits the one ``bus.handler_warning``,
    which every client on both nodes gets once, in id order.

    The replica's other client reads raw bytes: a decoding client in this one process
    cannot keep up with a relay's catch-up bursts and is rightly closed too.
    """
    more = {"stream.queue_max_events": 20, "server.send_buffer_bytes": 4096}
    with trio.fail_after(20):
        async with two_nodes(tmp_path, own_redis, **more) as (a, b):
            sid = await a.create_session()
            slow = await _subscribed_raw(await b.ws_url(sid))  # never reads again
            slow.socket.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            fast = await _subscribed_raw(await b.ws_url(sid))
            got = bytearray()

            async def drain() -> None:
                while b'"turn.completed"' not in got[-2000:]:
                    chunk = await fast.receive_some(1 << 20)
                    assert chunk, "the replica's fast client was closed"
                    got.extend(chunk)

            async with a.client(sid) as on_a, trio.open_nursery() as nursery:
                await on_a.subscribe()
                nursery.start_soon(drain)
                await b.submit(sid, LOREM)
                seen_a = await on_a.until_turn_ends()
            await slow.aclose()
            await fast.aclose()
    warnings = [e for e in seen_a if e.type.startswith("bus.")]
    assert [(w.type, w.payload.reason) for w in warnings] == [
        ("bus.handler_warning", "client_too_slow")
    ]
    ids_a = [e.id for e in seen_a]
    assert ids_a == sorted(set(ids_a))
    ids_b = [f["event"]["id"] for f in _server_text_frames(bytes(got)) if f["type"] == "event"]
    assert ids_b == ids_a  # the same sequence on the replica, the warning included


async def test_an_agui_run_and_its_cancel_through_a_replica(
    tmp_path: Path, own_redis: RedisServer
) -> None:
    """docs/scale-out.md: AG-UI runs and their cancels act on the node that runs the thread
    (``POST /agui``, ``POST /agui/{id}/cancel``, docs/doors/agui.md)."""
    with trio.fail_after(20):
        async with two_nodes(tmp_path, own_redis) as (a, b):
            thread = "t-replica"
            first = await run_all(a, run_input(thread, TEXT))  # created on a: a runs it
            assert first[-1]["type"] == "RUN_FINISHED"
            second = await run_all(b, run_input(thread, TEXT))
            assert second[1]["type"] == "MESSAGES_SNAPSHOT"  # a's history, read on b
            assert second[-1]["type"] == "RUN_FINISHED"
            assert not b.node.runs_here(thread)
            body = run_input(thread, LONG_NAP)
            async with agui(b, body) as sse:
                await sse.until("TOOL_CALL_START")
                r = await b.http.post(f"/agui/{thread}/cancel", json={"runId": body["runId"]})
                assert r.status_code == 202, r.text
                assert (await sse.rest())[-1]["type"] == "RUN_FINISHED"
            assert a.node.sessions[thread].turn is None


DELEGATE = {
    "script": {
        "rounds": [
            [{"tool_use": {"name": "delegate", "input": {"task": "say hi"}}}],
            [{"text": "delegated"}],
        ]
    }
}
WORKERS = {"event_types": None, "actors": None, "include_worker_sessions": True}


async def test_workers_events_reach_a_replicas_clients_live_and_in_a_replay(
    tmp_path: Path, own_redis: RedisServer
) -> None:
    """docs/protocol.md §5 (``include_worker_sessions``) across nodes: a worker the replica
    never loaded reaches its clients through the parent's relay, and a replay on the
    replica (the owner's) carries the workers' events."""
    tools = {"tools.enabled": ["sleep", "delegate"]}
    with trio.fail_after(20):
        async with two_nodes(tmp_path, own_redis, **tools) as (a, b):
            sid = await a.create_session()
            async with a.client(sid) as ws_a, b.client(sid) as ws_b:
                on_a, on_b = FilteredClient(ws_a.ws, sid), FilteredClient(ws_b.ws, sid)
                await on_a.subscribe(filter=WORKERS)
                await on_b.subscribe(filter=WORKERS)
                await b.submit(sid, DELEGATE)

                def done(e: Any) -> bool:
                    return bool(e.type == "turn.completed" and e.session_id == sid)

                seen_a = await on_a.until(done)
                seen_b = await on_b.until(done)
            assert [(e.id, e.type) for e in seen_b] == [(e.id, e.type) for e in seen_a]
            workers = {e.session_id for e in seen_a} - {sid}
            assert len(workers) == 1
            assert not workers & set(b.node.sessions)  # never loaded on b
            async with b.client(sid) as ws:
                later = FilteredClient(ws.ws, sid)
                ack = await later.subscribe(filter=WORKERS, since=seen_a[0].id)
                replayed = [(await later.recv()).event for _ in range(ack.replay_event_count)]
            assert {e.session_id for e in replayed} - {sid} == workers
            ids = [e.id for e in replayed]
            assert ids == sorted(set(ids))
            catalog = {e.id for e in seen_a[1:] if e.type in CATALOG_TYPES}
            assert catalog <= set(ids)  # (and the two clients' bus.subscriber_unregistered)

"""Redis restarted under load, and Redis unreachable at start-up (docs/scale-out.md).

tests/system/store/test_redis_store.py has the store's side (a batch held while Redis is
down and landing when it is back; what a ``kill -9`` of Redis keeps; an
unreachable Redis at start-up, in process and as ``gateway serve``), and
tests/unit/store/test_lease.py the leases'. Here: a whole gateway on a redis-server of
this module's own (``appendonly yes``, ``appendfsync everysec``), several
sessions with turns streaming and clients attached, and redis-server
restarted under them (``SIGTERM``, and ``kill -9``: same port, same
directory).

What "fail cleanly" means (decided here; docs/protocol.md §9 is the rule it
follows: a client receives an event only once it is durable):

- A turn in flight is not failed by an outage shorter than ``lease_s``: its
  agent loop runs on, its events are held in order until Redis takes them,
  its clients see a pause (their connections stay open) and then the rest of
  the turn, which ends as it would have. Clean means: every turn in flight
  ends with its terminal event (``turn.completed``, or ``turn.cancelled``
  with the sequence of docs/protocol.md §8), none is left open, no event is
  delivered twice or out of order, and every catalog event a client held
  before the restart is still in the store after it.
- An outage longer than ``lease_s``: the node cannot renew its leases and says
  so (``lease_lost``); the session's turn is then stopped and closed with
  ``reason: "server_restart"`` by the node that takes the lease (the recovery
  pass, here the same node), or, where a lost lease does not stop the turn,
  it ends here. Either way it ends, and the next turn runs once Redis is back.
- What a node had queued for a session whose lease another node took while
  Redis was away is dropped, not written under the new owner's closing of
  the turn (the store's fencing, gateway/store/redis/store.py).
- The writer retries with backoff (50 ms doubling to 5 s: one
  ``store_write_failed`` line per attempt, never a tight loop) and says once
  that Redis is back (``store_reconnected``, with the attempts and how long).
- A request that waits for a commit (``POST /sessions``, ``POST .../turns``)
  answers 503 ``store_unavailable`` after ``commit_timeout_s``, never a hang
  or a 500. A ``POST .../turns`` so answered has put its turn in memory: the
  turn runs once Redis is back (a retry meanwhile is 409
  ``turn_in_progress``), so a 503 there does not say "not done".
- A request that needs a store read answers 503 ``store_unavailable`` at once
  (the HTTP layer maps a ``StoreError`` to it), and ``GET /sessions`` waits
  for the commits before it at most ``commit_timeout_s``.
- Redis unreachable at start-up: one line naming the URL and why, and a
  non-zero exit, within ``OPEN_TIMEOUT_S`` even when something accepts the
  connection and never answers.

Real clock, real sockets, ``fail_after`` caps; every wait is for the event
that says it happened, with short ``commit_timeout_s`` and ``lease_s`` so the
module takes a few seconds.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from trio_websocket import ConnectionClosed

import gateway.store.group_commit as group_commit
import gateway.store.redis.client as redis_client
import gateway.store.redis.store as redis_store
from gateway.errors import StoreError
from gateway.ids import format_event_id, parse_event_id
from gateway.protocol.events import CATALOG_TYPES, Event
from gateway.protocol.frames import SubscribeAck
from gateway.protocol.shapes import Message, TextBlock
from gateway.store import SessionRecord, StoredEvent, StoredMessage
from gateway.store.redis.store import RedisStore
from tests.conftest import Client, Harness, make_config, running_gateway, types
from tests.redis_support import RedisServer, ensure_redis_server

# slow: redis-server, restarted
pytestmark = pytest.mark.slow

COMMIT_TIMEOUT_S = 0.3

# A turn whose catalog events interleave with its streaming ones: text, a tool
# (llm.call_completed, tool.called, tool.completed), then more text.
TURN = {
    "script": {
        "delay_ms": 8,
        "rounds": [
            [
                {"text": "one two three four five six"},
                {"tool_use": {"name": "sleep", "input": {"seconds": 0.05}}},
            ],
            [{"lorem": 40}],
        ],
    }
}


@pytest.fixture(scope="module")
def redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """One redis-server for the module, restarted by its tests; emptied before each."""
    server = RedisServer(ensure_redis_server(), tmp_path_factory.mktemp("redis-restart"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def fresh(redis: RedisServer, caplog: pytest.LogCaptureFixture) -> RedisServer:
    if redis.process is None:  # a test that failed with Redis down
        redis.start()
    _command(redis.port, b"FLUSHALL")
    caplog.set_level(logging.INFO, logger="gateway")
    return redis


def _command(port: int, line: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(line + b"\r\n")
        return sock.recv(256)


def _config(tmp_path: Path, redis: RedisServer, *, lease_s: float = 30.0) -> Any:
    return make_config(
        tmp_path,
        **{
            "store.backend": "redis",
            "store.url": redis.url,
            "store.lease_s": lease_s,
            "store.commit_timeout_s": COMMIT_TIMEOUT_S,
            "tools.enabled": ["sleep"],
        },
    )


def _down(redis: RedisServer, how: str) -> None:
    if how == "SIGKILL":
        # appendfsync everysec may postpone the AOF write behind a slow fsync (up
        # to 2 s, docs/operating.md "Redis backend"): kill once what it answered is written.
        redis.wait_aof_written()
        redis.kill()  # what its AOF has is what survives (the kernel has the file's pages)
    else:
        redis.stop()  # SIGTERM: Redis fsyncs its AOF and exits


@contextmanager
def _seen(name: str) -> Iterator[trio.Event]:
    """An event set when the gateway logs the event ``name``."""
    seen = trio.Event()

    class Handler(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if getattr(record, "event", "") == name:
                seen.set()

    handler = Handler()
    logging.getLogger("gateway").addHandler(handler)
    try:
        yield seen
    finally:
        logging.getLogger("gateway").removeHandler(handler)


def _records(caplog: pytest.LogCaptureFixture, name: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if getattr(r, "event", "") == name]


async def _timed_post(
    http: httpx.AsyncClient, path: str, body: Any
) -> tuple[httpx.Response, float]:
    started = time.monotonic()
    with trio.fail_after(COMMIT_TIMEOUT_S + 3):  # a hang fails here
        response = await http.post(path, json=body)
    return response, time.monotonic() - started


async def _stored_ids(redis: RedisServer, sid: str) -> set[str]:
    """The ids of the session's events in Redis, read by a store of the test's own."""
    store = RedisStore(redis.url)
    await store.open()
    try:
        return {format_event_id(e.seq) for e in await store.events_after([sid], 0, 100_000)}
    finally:
        await store.aclose()


async def _replayed(gw: Harness, sid: str, since: str) -> list[Event]:
    """What a new client gets with ``since``, up to the end of the session's last turn."""
    async with gw.client(sid) as client:
        ack = await client.subscribe(since=since)
        assert isinstance(ack, SubscribeAck), ack
        for _ in range(ack.replay_event_count):
            await client.recv()
        return client.events


def _check_stream(events: list[Event]) -> None:
    """docs/protocol.md §1: each event once, in id order."""
    seqs = [parse_event_id(e.id) for e in events]
    assert all(s is not None for s in seqs)
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs), [e.id for e in events]


async def _to_the_turns_end(gw: Harness, sid: str, client: Client) -> list[Event]:
    """Every event of the client's stream up to the end of the turn in flight.

    A node that lost the session's live feed closes its clients with 1001
    ``relay_gap`` (reconnect with ``since``): the client does, as the contract
    says, and the events of both connections are returned.
    """
    try:
        with trio.fail_after(8):  # none hangs
            await client.until_turn_ends()
        return client.events
    except ConnectionClosed as closed:
        reason = closed.reason
        assert reason.code == 1001 and "relay_gap" in (reason.reason or ""), reason
    events = list(client.events)
    async with gw.client(sid) as again:
        ack = await again.subscribe(since=events[-1].id)
        assert isinstance(ack, SubscribeAck), ack
        with trio.fail_after(8):
            await again.until_turn_ends()
        return events + again.events


def _through_turn_end(events: list[Event]) -> list[Event]:
    ends = [i for i, e in enumerate(events) if e.type in ("turn.completed", "turn.cancelled")]
    return events[: ends[0] + 1]


@pytest.mark.parametrize("how", ["SIGTERM", "SIGKILL"])
async def test_turns_in_flight_live_through_a_redis_restart(
    tmp_path: Path, fresh: RedisServer, caplog: pytest.LogCaptureFixture, how: str
) -> None:
    """Three sessions streaming, a client on each; Redis restarted mid-turn (lease_s 30).

    The writer reconnects with backoff and says so; every turn ends normally;
    a POST during the outage is 503 ``store_unavailable`` within
    ``commit_timeout_s``; every catalog event a client held before the
    restart is in Redis after it, and a ``since`` replay gives each client's
    catalog events again; new turns run.
    """
    redis = fresh
    with trio.fail_after(20):
        async with running_gateway(_config(tmp_path, redis)) as gw:
            sids = [await gw.create_session() for _ in range(3)]
            async with (
                gw.client(sids[0]) as c0,
                gw.client(sids[1]) as c1,
                gw.client(sids[2]) as c2,
            ):
                clients = [c0, c1, c2]
                for client in clients:
                    await client.subscribe()
                for sid in sids:
                    await gw.submit(sid, TURN)
                for client in clients:  # each turn is streaming its first LLM call
                    await client.until(lambda e: e.type == "text.delta")

                _down(redis, how)
                held = [list(c.events) for c in clients]
                response, took = await _timed_post(gw.http, "/sessions", {})
                assert response.status_code == 503, response.text
                assert response.json()["error"]["code"] == "store_unavailable"
                assert took < COMMIT_TIMEOUT_S + 1
                redis.start()  # same port, same directory

                seen = [
                    await _to_the_turns_end(gw, s, c) for s, c in zip(sids, clients, strict=True)
                ]
            for events in seen:
                assert events[-1].type == "turn.completed", types(events)
                assert events[-1].payload.stop_reason == "end_turn"
                _check_stream(events)

            # Nothing durable was lost: what each client held is in Redis after the
            # restart (nobody writes those events again), and so is the rest.
            for sid, events, before in zip(sids, seen, held, strict=True):
                stored = await _stored_ids(redis, sid)
                catalog = [e.id for e in events if e.type in CATALOG_TYPES]
                assert {e.id for e in before if e.type in CATALOG_TYPES} <= stored
                assert set(catalog) <= stored
                # A client that comes back with since gets the same catalog events.
                first = parse_event_id(events[0].id)
                assert first is not None
                replayed = _through_turn_end(await _replayed(gw, sid, format_event_id(first - 1)))
                assert [e.id for e in replayed if e.type in CATALOG_TYPES] == catalog

            # The writer's side of the outage, in the log.
            failed = [
                r
                for r in _records(caplog, "store_write_failed")
                if "cannot write to store" in r.getMessage()
            ]
            reconnected = _records(caplog, "store_reconnected")
            assert failed and len(reconnected) == 1, [r.getMessage() for r in caplog.records]
            assert reconnected[0].created >= failed[-1].created
            fields: dict[str, Any] = getattr(reconnected[0], "fields", {})
            assert fields["attempts"] == len(failed)
            # Backoff, not a tight loop: attempts at least 50 ms apart and no more
            # than a doubling from 50 ms allows in the time Redis was away.
            gaps = [b.created - a.created for a, b in itertools.pairwise(failed)]
            assert all(gap >= 0.045 for gap in gaps), gaps
            away_s = fields["outage_ms"] / 1000
            assert len(failed) <= math.log2(away_s / 0.05 + 1) + 2, (len(failed), away_s)
            assert any("connection refused" in r.getMessage() for r in failed)

            # Redis is back: new turns run, and their clients see them.
            for sid in sids:
                await _next_turn_runs(gw, sid)


async def _next_turn_runs(gw: Harness, sid: str) -> None:
    """A new turn is accepted (after 409/503 while the old one is being closed) and ends."""
    async with gw.client(sid) as client:
        await client.subscribe()
        with trio.fail_after(8):
            while True:
                r = await gw.http.post(f"/sessions/{sid}/turns", json={"content": "next"})
                if r.status_code == 202:
                    break
                assert r.status_code in (409, 503), r.text
                await trio.sleep(0.1)
            turn_id = r.json()["turn_id"]
            events = await client.until(
                lambda e: e.type == "turn.completed" and e.payload.turn_id == turn_id
            )
    assert [e.payload.turn_id for e in events if e.type == "turn.started"] == [turn_id]
    _check_stream(client.events)


async def test_an_outage_longer_than_the_lease_ends_the_turn_and_the_next_one_runs(
    tmp_path: Path, fresh: RedisServer
) -> None:
    """lease_s 0.6, Redis away for longer: ``lease_lost``; the turn still ends, never open.

    It ends ``turn.completed`` where a lost lease does not stop the turn, or
    ``turn.cancelled`` with ``reason: "server_restart"`` where it does (the
    recovery pass then closes it); the node takes the lease again and the next
    turn runs on it.
    """
    redis = fresh
    with trio.fail_after(20):
        async with running_gateway(_config(tmp_path, redis, lease_s=0.6)) as gw:
            sid = await gw.create_session()
            async with gw.client(sid) as client:
                await client.subscribe()
                await gw.submit(sid, TURN)
                await client.until(lambda e: e.type == "text.delta")
                with _seen("lease_lost") as lost:
                    redis.kill()
                    with trio.fail_after(5):  # renewals fail for a whole lease time
                        await lost.wait()
                assert not gw.node.leases.holds(sid)
                redis.start()
                events = await _to_the_turns_end(gw, sid, client)
            last = events[-1]
            if last.type == "turn.cancelled":
                assert last.payload.reason == "server_restart", last
            else:
                assert last.type == "turn.completed", types(events)
            _check_stream(events)
            await _next_turn_runs(gw, sid)
            assert gw.node.leases.holds(sid)


def _check_history(events: list[Event]) -> None:
    """A turn's story told once: each LLM call ends once, each message completes once."""
    calls: dict[str, list[str]] = {}
    completed: list[str] = []
    for e in events:
        if e.type in ("llm.call_completed", "llm.call_failed"):
            calls.setdefault(e.payload.call_id, []).append(e.type)
        elif e.type == "message.complete":
            completed.append(e.payload.message_id)
    twice = {call: ends for call, ends in calls.items() if len(ends) > 1}
    assert not twice, (twice, [(e.id, e.type) for e in events])
    assert len(completed) == len(set(completed)), [(e.id, e.type) for e in events]


async def test_a_turn_closed_after_an_outage_longer_than_the_lease_is_told_once(
    tmp_path: Path, fresh: RedisServer
) -> None:
    """The closing a node writes after taking a lease back follows what it wrote before.

    Redis comes back just after a failed write of the node's writer, so the
    writer's next attempt is far (its backoff), and the recovery pass comes
    first: it must not close the turn from the store as it was before the
    outage while the node's own later events are still queued.
    """
    redis = fresh
    with trio.fail_after(20):
        async with running_gateway(_config(tmp_path, redis, lease_s=0.6)) as gw:
            sid = await gw.create_session()
            async with gw.client(sid) as client:
                await client.subscribe()
                await gw.submit(sid, TURN)
                await client.until(lambda e: e.type == "text.delta")
                with _seen("lease_lost") as lost:
                    redis.kill()
                    with trio.fail_after(5):
                        await lost.wait()
                with _seen("store_write_failed") as failed, trio.fail_after(5):
                    await failed.wait()  # the writer's next attempt is 0.8 s or more away
                redis.start()
                events = await _to_the_turns_end(gw, sid, client)
            _check_stream(events)
            _check_history(events)


async def test_a_turn_stopped_by_a_lost_lease_is_still_closed_when_its_writes_land_first(
    tmp_path: Path, fresh: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The node's writer reaches Redis before any recovery pass: the turn must still end.

    (The writer retries every 20 ms here, so it is first once Redis is back.)
    The store must never say "no turn in flight" for a turn whose terminal
    event it does not have: that turn would stay open for every client.
    """
    redis = fresh
    for module in (redis_client, group_commit):  # the client's reconnects, the writer's retries
        monkeypatch.setattr(module, "RETRY_FIRST_S", 0.02)
        monkeypatch.setattr(module, "RETRY_MAX_S", 0.02)
    with trio.fail_after(20):
        async with running_gateway(_config(tmp_path, redis, lease_s=0.6)) as gw:
            sid = await gw.create_session()
            async with gw.client(sid) as client:
                await client.subscribe()
                turn_id = await gw.submit(sid, TURN)
                await client.until(lambda e: e.type == "text.delta")
                with _seen("lease_lost") as lost:
                    redis.kill()
                    with trio.fail_after(5):
                        await lost.wait()
                redis.start()
                store = RedisStore(redis.url)
                await store.open()
                try:
                    for _ in range(60):  # until the store says the turn is over
                        record = await store.get_session(sid)
                        if record is not None and record.current_turn_id is None:
                            break
                        await trio.sleep(0.05)
                    else:
                        pytest.fail("the turn is still in flight in the store after 3 s")
                    stored = await store.events_after([sid], 0, 10_000)
                finally:
                    await store.aclose()
    ends = [e for e in stored if e.type in ("turn.completed", "turn.cancelled")]
    assert [json.loads(e.data)["turn_id"] for e in ends] == [turn_id], [e.type for e in stored]


async def test_a_turn_sent_while_redis_is_away_is_503_and_the_session_goes_on(
    tmp_path: Path, fresh: RedisServer
) -> None:
    """``POST .../turns`` with Redis away: 503 ``store_unavailable`` after commit_timeout_s.

    ``/readyz`` is 503 ``store_unavailable`` meanwhile, and 200 once commits land.

    Whatever became of that turn, the stream stays whole: every turn that
    started has ended once Redis is back, and the session takes the next one.
    """
    redis = fresh
    with trio.fail_after(20):
        async with running_gateway(_config(tmp_path, redis)) as gw:
            sid = await gw.create_session()
            async with gw.client(sid) as client:
                await client.subscribe()
                redis.kill()
                response, took = await _timed_post(
                    gw.http, f"/sessions/{sid}/turns", {"content": "while away"}
                )
                assert response.status_code == 503, response.text
                assert response.json()["error"]["code"] == "store_unavailable"
                assert COMMIT_TIMEOUT_S <= took < COMMIT_TIMEOUT_S + 1
                # Commits fail: not ready (docs/protocol.md §15), a load balancer stops sending.
                ready = await gw.http.get("/readyz")
                assert ready.status_code == 503
                assert ready.json()["error"]["code"] == "store_unavailable"
                redis.start()

                with trio.fail_after(8):
                    while True:
                        r = await gw.http.post(f"/sessions/{sid}/turns", json={"content": "next"})
                        if r.status_code == 202:
                            break
                        # 409: the 503'd turn runs; 503: the writer's backoff has not seen
                        # Redis back yet (that turn too runs, once it has).
                        assert r.status_code in (409, 503), r.text
                        await trio.sleep(0.05)
                    await client.until(
                        lambda e: (
                            e.type == "turn.completed" and e.payload.turn_id == r.json()["turn_id"]
                        )
                    )
                started = [e.payload.turn_id for e in client.events if e.type == "turn.started"]
                ended = [
                    e.payload.turn_id
                    for e in client.events
                    if e.type in ("turn.completed", "turn.cancelled")
                ]
                assert started == ended, types(client.events)
                _check_stream(client.events)
                assert (await gw.http.get("/readyz")).json() == {"status": "ready"}  # it landed


async def test_requests_that_need_the_store_are_503_while_it_is_away(
    tmp_path: Path, fresh: RedisServer
) -> None:
    """No request hangs or is a 500 because Redis is away: 503 ``store_unavailable``."""
    redis = fresh
    unknown = "sess_" + "0" * 20  # the node must read Redis to know it does not exist
    answers: dict[str, Any] = {}
    with trio.fail_after(20):
        async with running_gateway(_config(tmp_path, redis)) as gw:
            redis.kill()
            try:
                probes = [
                    ("POST /sessions", "POST", "/sessions", {}),  # leaves a write pending
                    ("GET /sessions", "GET", "/sessions", None),
                    ("GET /sessions/{unknown}", "GET", f"/sessions/{unknown}", None),
                    (
                        "POST /sessions/{unknown}/turns",
                        "POST",
                        f"/sessions/{unknown}/turns",
                        {"content": "x"},
                    ),
                ]
                for name, method, path, body in probes:
                    with trio.move_on_after(COMMIT_TIMEOUT_S + 0.5):
                        r = await gw.http.request(method, path, json=body)
                        answers[name] = (r.status_code, r.json()["error"]["code"])
                        continue
                    answers[name] = "no answer"
            finally:
                redis.start()
    assert answers == dict.fromkeys(answers, (503, "store_unavailable"))


# --- a node's writes after it lost a lease (fencing) ----------------------------------


async def test_a_nodes_writes_for_a_session_whose_lease_another_node_took_are_dropped(
    fresh: RedisServer,
) -> None:
    """What a node queued while Redis was away must not land over the new owner's history.

    Redis restarted: every node's writes wait in its writer, each retrying on
    its own backoff. The node that ran a turn loses the lease meanwhile;
    another takes it as soon as Redis is back, reads the store and closes the
    turn (docs/protocol.md §9). The first node's queued writes (events with
    ids below the closing, the message and the session record as it had
    them) would land after that closing, under it: a history that says a call
    both completed and failed, a record that reopens the turn. So each write
    of a session's keys lands only while no other node holds its lease, in
    the same transaction (the store's fencing); a dropped one is reported,
    and the ticket still moves on (nothing waits for it forever).
    """
    redis = fresh
    a, b = RedisStore(redis.url), RedisStore(redis.url)
    for store in (a, b):
        await store.open()
    a_leases, b_leases = a.leases("node_a", 60_000), b.leases("node_b", 60_000)
    dropped: list[StoreError] = []
    a.on_write_error = dropped.append
    try:
        assert await a_leases.acquire("sess_f") is not None
        a.put_session(_record("sess_f", turn="turn_1"))
        a.put_event(_event(1, "sess_f"))
        await a.flush()
        assert not dropped

        _command(redis.port, b"DEL gw:lease:{sess_f}")  # A's lease lapsed ...
        assert await b_leases.acquire("sess_f") is not None  # ... and B took it
        b.put_session(_record("sess_f"))  # B closed the turn
        b.put_event(_event(1_000_001, "sess_f"))
        await b.flush()

        a.put_session(_record("sess_f", turn="turn_1"))  # what A had queued
        a.put_event(_event(2, "sess_f"))
        a.put_message(_message("msg_1", "sess_f"))
        ticket = a.ticket()
        await a.flush()
        assert a.committed >= ticket
        reports = sorted(e.message for e in dropped)
        assert len(reports) == 3 and all("its lease is node_b's" in m for m in reports), reports
        assert await a.get_session("sess_f") == _record("sess_f")  # B's, not reopened
        assert [e.seq for e in await a.events_after(["sess_f"], 0, 10)] == [1, 1_000_001]
        assert await a.load_messages("sess_f") == []
        assert [r.id for r in await a.open_turns()] == []

        # A session nobody else holds is written as before (a lease that lapsed
        # with nobody taking it, a store that has no node).
        await b_leases.release(["sess_f"])
        a.put_event(_event(3, "sess_f"))
        await a.flush()
        assert [e.seq for e in await b.events_after(["sess_f"], 0, 10)] == [1, 3, 1_000_001]
        assert len(dropped) == 3
    finally:
        for store in (a, b):
            await store.aclose()


def _record(sid: str, turn: str | None = None) -> SessionRecord:
    return SessionRecord(
        id=sid,
        created_at=1,
        workspace_path="/w",
        active_model="scripted:echo",
        metadata={},
        parent_session_id=None,
        routing_policy_version="v1",
        current_turn_id=turn,
    )


def _event(seq: int, sid: str) -> StoredEvent:
    data = b'{"id":"%s","type":"turn.started"}' % format_event_id(seq).encode()
    return StoredEvent(seq=seq, session_id=sid, type="turn.started", ts=1000, data=data)


def _message(mid: str, sid: str) -> StoredMessage:
    m = Message(
        id=mid,
        session_id=sid,
        turn_id="turn_1",
        role="user",
        content=[TextBlock("hi")],
        status="complete",
        created_at=1,
    )
    return StoredMessage(m, None)


# --- Redis unreachable at start-up ----------------------------------------------------


async def test_a_redis_that_accepts_and_never_answers_is_one_line_within_the_open_timeout(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Something listens on the port but never answers (a hung Redis, a wrong service).

    The store says so within ``OPEN_TIMEOUT_S`` (5 s; 0.3 s here): coredis turns
    the deadline's cancellation into a ConnectionError of its own, which must
    not pass for "connection refused"; and coredis's own "Connection attempt
    failed unexpectedly!" with its traceback must not come before the line
    (``gateway serve`` printed it on stderr).
    """
    monkeypatch.setattr(redis_store, "OPEN_TIMEOUT_S", 0.3)
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        url = f"redis://127.0.0.1:{silent.getsockname()[1]}/0"
        started = time.monotonic()
        with trio.fail_after(3), pytest.raises(StoreError) as info:
            await RedisStore(url).open()
    assert time.monotonic() - started < 2
    assert info.value.message == f"cannot open store {url}: Redis did not answer within 0.3 s"
    assert [r.getMessage() for r in caplog.records if r.name.startswith("coredis")] == []


async def test_an_unknown_redis_host_is_one_line_that_says_why() -> None:
    url = "redis://no-such-host.invalid:6379/0"
    with trio.fail_after(10), pytest.raises(StoreError) as info:
        await RedisStore(url).open()
    message = info.value.message
    assert message.startswith(f"cannot open store {url}: "), message
    assert "\n" not in message
    # The system's reason too (resolvers word it differently), not only coredis's line.
    assert message.startswith(
        f"cannot open store {url}: Unable to establish a connection to no-such-host.invalid:6379: "
    ), message

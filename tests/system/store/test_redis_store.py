"""The Redis store's own behaviour (tests/unit/store/test_store.py runs the shared contract on it).

Rules of these tests:

- Redis is Debian's redis-server on a free loopback port (tests/redis_support.py),
  with ``appendonly yes`` and ``appendfsync everysec``. Tests that kill or
  restart Redis, or run a whole gateway (whose keys are under the default
  ``gw:`` prefix), get a server of their own; the others share the run's
  server, each under a key prefix of its own.
- "A crash of Redis" is ``kill -9`` of redis-server: what survives is what its
  append-only file has. "A crash of the gateway" is an atomic copy, in Redis
  itself, of every key of the deployment into another database at one instant:
  what a ``kill -9`` of the gateway would leave (tests/integration/store/test_restart.py does the
  same with SQLite's online backup).
- Real clock with ``fail_after`` caps: Redis is a real socket.
"""

from __future__ import annotations

import itertools
import json
import os
import socket
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

from gateway.errors import StoreError
from gateway.ids import format_event_id
from gateway.protocol.events import CATALOG_TYPES
from gateway.protocol.frames import SubscribeAck
from gateway.protocol.shapes import Message, TextBlock
from gateway.session.sequencer import EventSequencer
from gateway.store import SessionRecord, StoredEvent, StoredMessage
from gateway.store.group_commit import CLOSE_RETRY_S
from gateway.store.lease import LeaseKeeper
from gateway.store.redis.client import redacted
from gateway.store.redis.store import RedisStore
from tests.conftest import TOOL_SCRIPT, free_port, make_config, running_gateway, types
from tests.redis_support import RedisServer, own_redis, redis_server

# slow: redis-server
pytestmark = pytest.mark.slow

__all__ = ["own_redis", "redis_server"]  # fixtures

SLEEPY = {"script": {"rounds": [[{"tool_use": {"name": "sleep", "input": {"seconds": 60}}}]]}}


def session(sid: str, created_at: int = 1, **changes: Any) -> SessionRecord:
    fields: dict[str, Any] = {
        "id": sid,
        "created_at": created_at,
        "workspace_path": "/w",
        "active_model": "scripted:echo",
        "metadata": {},
        "parent_session_id": None,
        "routing_policy_version": "v1",
    }
    return SessionRecord(**(fields | changes))


def event(seq: int, sid: str = "sess_a", ts: int = 1000) -> StoredEvent:
    data = b'{"id":"%s","type":"turn.started"}' % format_event_id(seq).encode()
    return StoredEvent(seq=seq, session_id=sid, type="turn.started", ts=ts, data=data)


def message(mid: str, sid: str = "sess_a") -> StoredMessage:
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


def command(port: int, *args: str | bytes, db: int = 0) -> Any:
    """One command over a plain blocking socket (RESP2): the test's view of Redis, not coredis's.

    Blocking on purpose where it is used: nothing else of the test's Trio loop
    runs meanwhile, so what it reads or copies is one instant.
    """

    def encode(*parts: str | bytes) -> bytes:
        out = b"*%d\r\n" % len(parts)
        for part in parts:
            raw = part.encode() if isinstance(part, str) else part
            out += b"$%d\r\n%s\r\n" % (len(raw), raw)
        return out

    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as sock,
        sock.makefile("rb") as stream,
    ):
        sock.sendall(encode("SELECT", str(db)) + encode(*args))

        def read() -> Any:
            line = stream.readline().rstrip(b"\r\n")
            kind, rest = line[:1], line[1:]
            if kind == b"+":
                return rest.decode()
            if kind == b"-":
                raise AssertionError(rest.decode())
            if kind == b":":
                return int(rest)
            if kind == b"$":
                n = int(rest)
                return None if n < 0 else stream.read(n + 2)[:-2]
            assert kind == b"*", line
            return [read() for _ in range(int(rest))]

        read()  # SELECT's +OK
        return read()


# Every key of the prefix, copied into another database in one atomic script.
_COPY_ALL = """
for _, key in ipairs(redis.call('KEYS', ARGV[1] .. '*')) do
    redis.call('COPY', key, key, 'DB', ARGV[2], 'REPLACE')
end
return 1
"""


def crash_copy(server: RedisServer, *, prefix: str = "gw:", to_db: int = 1) -> None:
    """What a kill -9 of the gateway at this instant leaves: every committed write."""
    command(server.port, "EVAL", _COPY_ALL, "0", prefix, str(to_db))


async def open_store(server: RedisServer, prefix: str) -> RedisStore:
    store = RedisStore(server.url, prefix=prefix)
    await store.open()
    return store


# --- durability ------------------------------------------------------------------


async def test_what_was_committed_survives_a_crash_of_redis(own_redis: RedisServer) -> None:
    """Committed = answered EXEC = in the AOF (appendfsync everysec: docs/operating.md).

    On a busy machine a slow fsync makes Redis postpone writing what it
    answered (up to 2 s: docs/operating.md says so); the kill waits for that write.
    """
    store = await open_store(own_redis, "gw:")
    store.put_session(session("sess_a", current_turn_id="turn_1", current_turn_seq=3))
    store.put_message(message("msg_1"))
    store.put_event(event(3))
    store.reserve_event_ids(50, lambda top: None)
    await store.flush()
    assert store.committed == 4
    await store.aclose()

    own_redis.wait_aof_written()  # at once, unless a slow fsync postponed it (up to 2 s)
    own_redis.kill()  # kill -9: no shutdown, no final fsync of Redis's own
    own_redis.start()

    again = RedisStore(own_redis.url)
    state = await again.open()
    assert state.event_ceiling == 50
    assert await again.get_session("sess_a") == session(
        "sess_a", current_turn_id="turn_1", current_turn_seq=3
    )
    assert [r.id for r in await again.open_turns()] == ["sess_a"]
    assert await again.load_messages("sess_a") == [message("msg_1")]
    assert await again.events_after(["sess_a"], 0, 10) == [event(3)]
    await again.aclose()


async def test_while_redis_is_down_the_batch_is_held_and_lands_when_it_returns(
    own_redis: RedisServer,
) -> None:
    """Never dropped, never reported committed early: retried with backoff until Redis is back."""
    store = await open_store(own_redis, "gw:")
    errors: list[StoreError] = []
    failed = trio.Event()

    def on_error(exc: StoreError) -> None:
        errors.append(exc)
        failed.set()

    store.on_write_error = on_error
    async with trio.open_nursery() as nursery:
        await nursery.start(store.run)
        own_redis.kill()
        store.put_event(event(1))
        store.put_session(session("sess_a"))
        with trio.fail_after(10):
            await failed.wait()
        assert store.committed == 0
        assert own_redis.url.split("//")[1].split("/")[0] in errors[0].message
        own_redis.start()  # same port, same directory
        with trio.fail_after(15):
            await store.wait_committed(store.ticket())
        assert await store.events_after(["sess_a"], 0, 10) == [event(1)]
        assert await store.get_session("sess_a") == session("sess_a")
        await store.aclose()


async def test_a_close_while_redis_is_down_gives_up_and_says_what_was_lost(
    own_redis: RedisServer,
) -> None:
    """A shutdown during an outage: the close insists for ``CLOSE_RETRY_S``, then the
    retries end (the writer task's too) and it says how many writes were not made
    durable (gateway.store.group_commit; ``gateway serve`` exits 1 with that line)."""
    store = await open_store(own_redis, "gw:")
    failed = trio.Event()
    store.on_write_error = lambda exc: failed.set()
    with trio.fail_after(CLOSE_RETRY_S + 20):
        async with trio.open_nursery() as nursery:
            await nursery.start(store.run)
            own_redis.kill()
            store.put_event(event(1))
            store.put_session(session("sess_a"))
            await failed.wait()  # the writer task holds the batch, retrying
            started = trio.current_time()
            with pytest.raises(StoreError, match="2 writes could not be made durable"):
                await store.aclose()
    assert trio.current_time() - started >= CLOSE_RETRY_S


async def test_a_command_redis_refuses_costs_only_its_row(redis_server: RedisServer) -> None:
    """A key of the prefix holding something else (WRONGTYPE): that row reported, the rest lands."""
    prefix = redis_server.new_prefix()
    command(redis_server.port, "SET", f"{prefix}e:{{sess_bad}}", "not a sorted set")
    store = await open_store(redis_server, prefix)
    errors: list[StoreError] = []
    store.on_write_error = errors.append
    store.put_event(event(1, sid="sess_bad"))
    store.put_session(session("sess_a"))
    store.put_event(event(2, sid="sess_a"))
    await store.flush()
    assert store.committed == 3
    assert await store.get_session("sess_a") == session("sess_a")
    assert [e.seq for e in await store.events_after(["sess_a"], 0, 10)] == [2]
    assert [e.message for e in errors if "refused events 1..1 of sess_bad" in e.message]
    assert all("wrong kind of value" in e.message for e in errors)
    await store.aclose()


async def test_every_key_is_under_the_prefix(redis_server: RedisServer) -> None:
    """One Redis can hold other data: the store writes nothing outside its prefix."""
    prefix = redis_server.new_prefix()
    store = await open_store(redis_server, prefix)
    store.put_session(session("sess_p", owner="k1"))
    store.put_session(session("sess_w", parent_session_id="sess_p", current_turn_id="t"))
    store.put_message(message("msg_1", sid="sess_w"))
    store.put_event(event(1, sid="sess_w", ts=5))
    await store.flush()
    assert await store.purge_before(10) == 1
    await store.aclose()
    keys = command(redis_server.port, "KEYS", "*")
    mine = [k for k in keys if k.startswith(prefix.encode())]
    assert len(mine) >= 8
    assert all(not k.startswith(b"gw:") for k in keys)  # nothing under the default prefix


# --- event ids across nodes (docs/protocol.md §1) ------------------------------------


async def test_two_nodes_allocating_at_once_never_get_overlapping_blocks(
    redis_server: RedisServer,
) -> None:
    """Each block is an atomic increment of the deployment's counter, whoever asks."""
    prefix = redis_server.new_prefix()
    nodes = [await open_store(redis_server, prefix) for _ in range(2)]
    granted: list[list[int]] = [[], []]

    async def allocate(store: RedisStore, tops: list[int], block: int) -> None:
        for _ in range(40):
            store.reserve_event_ids(block, tops.append)
            store.reserve_event_ids(block, tops.append)  # two in one transaction too
            await store.flush()

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            for store in nodes:
                await nursery.start(store.run)
            async with trio.open_nursery() as both:
                both.start_soon(allocate, nodes[0], granted[0], 1000)
                both.start_soon(allocate, nodes[1], granted[1], 700)
            for store in nodes:
                await store.aclose()  # and its run() returns
        ranges = [(top - 1000 + 1, top) for top in granted[0]]
        ranges += [(top - 700 + 1, top) for top in granted[1]]
        assert len(ranges) == 160
        ranges.sort()
        assert all(a[1] < b[0] for a, b in itertools.pairwise(ranges))
        assert ranges[-1][1] == 80 * 1000 + 80 * 700  # nothing skipped either

        # A restart (a new node) starts above every block granted before it.
        again = RedisStore(redis_server.url, prefix=prefix)
        assert (await again.open()).event_ceiling == ranges[-1][1]
        later: list[int] = []
        again.reserve_event_ids(10, later.append)
        await again.flush()
        assert later == [ranges[-1][1] + 10]
        await again.aclose()


async def test_a_sessions_ids_increase_across_a_failover(redis_server: RedisServer) -> None:
    """A second node takes a dead node's session: its next ids are above every id it had.

    Node B was granted its block first (lower ids); node A, granted the next
    block, runs the session and dies. B takes the session's lease once it
    expires, and its ids for the session are above A's, though its own block is
    below them (gateway.node.Node.ids_above).
    """
    prefix = redis_server.new_prefix()
    a_store, b_store = [await open_store(redis_server, prefix) for _ in range(2)]
    b_ids = EventSequencer(b_store.reserve_event_ids, block=1000)
    await b_store.flush()
    a_ids = EventSequencer(a_store.reserve_event_ids, block=1000)
    await a_store.flush()
    a = LeaseKeeper(a_store.leases("node_a", 200), on_lost=lambda sid: None)
    b = LeaseKeeper(b_store.leases("node_b", 200), on_lost=lambda sid: None)

    assert await a.take("sess_f") is not None
    a_issued = [a_ids.next() for _ in range(5)]
    assert min(a_issued) > b_ids.last + 1  # B's block is below A's
    assert await b.take("sess_f") is None  # A is alive (its lease holds)
    await a_store.aclose()  # A dies: nothing released, nothing renewed

    await trio.sleep(0.25)  # Redis expires the 200 ms lease in real time
    taken = await b.take("sess_f")
    assert taken is not None and taken.new and taken.counter >= max(a_issued)
    while b_ids.needs_block_above(taken.counter):  # what Node.ids_above does
        b_ids.renew()
        await b_store.flush()
    assert b_ids.next() > max(a_issued)
    await b_store.aclose()


# --- opening ----------------------------------------------------------------------


async def test_an_unreachable_redis_is_a_store_error_within_seconds() -> None:
    url = f"redis://:s3cret@127.0.0.1:{free_port()}/0"
    with trio.fail_after(10), pytest.raises(StoreError) as info:
        await RedisStore(url).open()
    message = info.value.message
    assert message.startswith(f"cannot open store redis://:***@127.0.0.1:{url.split(':')[3]}")
    assert "s3cret" not in message


async def test_another_layout_version_is_refused(redis_server: RedisServer) -> None:
    prefix = redis_server.new_prefix()
    command(redis_server.port, "SET", f"{prefix}version", "99")
    with pytest.raises(StoreError, match=f"layout version 99 under '{prefix}version'"):
        await RedisStore(redis_server.url, prefix=prefix).open()


def test_a_password_is_never_shown() -> None:
    assert redacted("redis://:pw@h:1/0") == "redis://:***@h:1/0"
    assert redacted("redis://me:pw@h/0") == "redis://me:***@h/0"
    assert redacted("redis://h:1/0") == "redis://h:1/0"


async def test_gateway_serve_with_redis_unreachable_is_one_line_and_exit_1(tmp_path: Path) -> None:
    """docs/reference.md "Command line": Redis unreachable: one line naming it, no traceback."""
    url = f"redis://127.0.0.1:{free_port()}/0"
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}  # config keys
    env |= {"GATEWAY_STORE_BACKEND": "redis", "GATEWAY_STORE_URL": url}
    with trio.fail_after(20):
        result = await trio.run_process(
            [sys.executable, "-m", "gateway", "serve", "--port", "0"],
            cwd=tmp_path,
            env=env,
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    assert result.returncode == 1 and result.stdout == b""
    lines = result.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"gateway: cannot open store {url}"), lines


# --- a whole gateway on Redis ---------------------------------------------------------


async def test_a_gateway_on_redis_runs_a_turn_replays_and_restarts(
    tmp_path: Path, own_redis: RedisServer
) -> None:
    """One node on Redis, end to end: a tool turn, a since replay, a crash and a restart.

    The restarted node (another Gateway on the crash copy) finds the session and
    its messages, closes the turn left in flight with ``server_restart``
    (docs/protocol.md §9) once the dead node's lease on it has expired (a
    restarted process is another node), and takes the next turn with ids above
    every old one.
    """
    overrides: dict[str, Any] = {
        "store.backend": "redis",
        "tools.enabled": ["sleep"],
        "store.lease_s": 0.5,
    }
    config = make_config(tmp_path, **overrides, **{"store.url": own_redis.url})
    with trio.fail_after(30):
        async with running_gateway(config) as gw:
            sid = await gw.create_session()
            async with gw.client(sid) as live:
                await live.subscribe()
                await gw.submit(sid, TOOL_SCRIPT)
                first = await live.until_turn_ends()
                assert "tool.completed" in types(first)
                assert first[-1].payload.stop_reason == "end_turn"

            # A client that saw the turn up to its tool call resumes with since.
            cut = next(i for i, e in enumerate(first) if e.type == "tool.called")
            async with gw.client(sid) as resumed:
                ack = await resumed.subscribe(since=first[cut].id)
                assert isinstance(ack, SubscribeAck)
                for _ in range(ack.replay_event_count):
                    await resumed.recv()
            # (After the turn: the first client's bus.subscriber_unregistered.)
            replayed = resumed.events[: types(resumed.events).index("turn.completed") + 1]
            catalog_after = [e.id for e in first[cut + 1 :] if e.type in CATALOG_TYPES]
            assert [e.id for e in replayed if e.type in CATALOG_TYPES] == catalog_after
            assert "message.complete" in types(replayed)  # rebuilt from the message store

            # A second turn, cut while its tool runs.
            async with gw.client(sid) as live:
                await live.subscribe()
                await gw.submit(sid, SLEEPY)
                await live.until(lambda e: e.type == "tool.called")
                crash_copy(own_redis)  # no await since: the node is where it was
                received = list(live.events)
                before = gw.node.sequencer.last

    # What the live client held is in the copy (durable before delivered).
    stored = {
        json.loads(raw)["id"]
        for raw in _event_bytes(
            command(own_redis.port, "ZRANGE", f"gw:e:{{{sid}}}", "0", "-1", db=1)
        )
    }
    assert all(e.id in stored for e in received if e.type in CATALOG_TYPES)

    config = make_config(tmp_path, **overrides, **{"store.url": own_redis.url[:-1] + "1"})
    with trio.fail_after(30):
        async with running_gateway(config) as gw:
            listed = (await gw.http.get("/sessions")).json()["sessions"]
            assert [s["session"]["id"] for s in listed] == [sid]
            async with gw.client(sid) as again:
                ack = await again.subscribe(since=received[-1].id)
                assert isinstance(ack, SubscribeAck)
                for _ in range(ack.replay_event_count):
                    await again.recv()
                # The dead node's lease (in the copy) expires within lease_s; this
                # node then closes the turn: live to this client (the recovery
                # task), or in its replay (the subscribe waited for the lease,
                # its owner being dead, and took it: gateway.node.node.Node.ask_owner).
                if "turn.cancelled" not in types(again.events):
                    await again.until(lambda e: e.type == "turn.cancelled")
                closing = next(e for e in again.events if e.type == "turn.cancelled")
                assert (closing.payload.reason, closing.payload.phase) == (
                    "server_restart",
                    "tools",
                )
                assert all(int(e.id[4:]) > before for e in again.events)

                messages = (await gw.http.get(f"/sessions/{sid}/messages")).json()["messages"]
                assert [m["role"] for m in messages][:2] == ["user", "assistant"]
                assert all(m["status"] != "in_progress" for m in messages)

                await gw.submit(sid, "hello again")
                events = await again.until_turn_ends()
                assert events[-1].payload.stop_reason == "end_turn"
    assert command(own_redis.port, "SCARD", "gw:open", db=1) == 0


def _event_bytes(members: list[bytes]) -> list[bytes]:
    """The wire bytes of stored events (each member is MessagePack [seq, type, ts, data])."""
    import msgspec

    decode = msgspec.msgpack.Decoder(tuple[int, str, int, bytes]).decode
    return [decode(m)[3] for m in members]


async def test_a_store_closed_without_being_opened_closes_at_once() -> None:
    store = RedisStore(f"redis://127.0.0.1:{free_port()}/0")
    with trio.fail_after(1):
        await store.aclose()
    with pytest.raises(StoreError, match="is closed"):
        store.put_event(event(1))

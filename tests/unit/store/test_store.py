"""The trace store (gateway/store): one contract, run against both backends.

Rules of these tests:

- The tests that take ``backend`` (or ``store``) are the contract of
  :class:`gateway.store.base.Store`: each runs twice, on SQLite and on Redis
  (a real redis-server, tests/redis_support.py). The ones at the end that
  name :class:`SqliteStore` are about SQLite itself (its schema, its file, its
  threads); tests/system/store/test_redis_store.py has Redis's own.
- Every test uses a fresh store: a new database file under ``tmp_path``, or a
  key prefix of its own on the run's redis-server. "Survives a restart" means
  ``aclose`` then a new store on the same file or prefix.
- The SQLite store runs in worker threads, and a Trio ``MockClock`` jumps while
  a thread works (and Redis is a real socket), so these tests use the real
  clock and never wait on it: the writer's gathering interval is either
  irrelevant (``flush`` writes directly) or an hour, so that only what the
  test does can write.
- Where the test waits for the writer, ``trio.fail_after`` caps the wait.
"""

from __future__ import annotations

import inspect
import sqlite3
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from gateway.errors import StoreError
from gateway.ids import format_event_id
from gateway.protocol.shapes import Message, TextBlock, Usage
from gateway.session.sequencer import EventSequencer
from gateway.store import (
    SessionRecord,
    SqliteStore,
    Store,
    StoredEvent,
    StoredMessage,
    StoreState,
)
from gateway.store.base import PushConfig, QueuedTurn, Rewind
from gateway.store.group_commit import CLOSE_RETRY_S, RETRY_FIRST_S, RETRY_MAX_S
from gateway.store.redis.store import RedisStore
from tests.redis_support import RedisServer, redis_server

__all__ = ["redis_server"]  # the fixture, used through Backend

HOUR = 3600.0


@pytest.fixture
def db_path(tmp_path: Path) -> str:
    return str(tmp_path / "gateway.db")


class Backend:
    """Where one test's store lives: new stores on the same data, and a way to break writes."""

    def __init__(self, name: str, db_path: str, redis: RedisServer | None) -> None:
        self.name = name
        self.db_path = db_path
        self.redis = redis
        self.prefix = redis.new_prefix() if redis is not None else ""

    def new(self, **options: Any) -> Store:
        """A store (not opened) on this test's data."""
        if self.redis is not None:
            return RedisStore(self.redis.url, prefix=self.prefix, **options)
        return SqliteStore(self.db_path, **options)

    def break_writes(
        self, store: Store, monkeypatch: pytest.MonkeyPatch, failure: Callable[[], str | None]
    ) -> None:
        """Make each write of ``store`` fail as a transient failure would while ``failure()``
        says why (a message), and land once it says ``None``."""
        if isinstance(store, RedisStore):
            real_apply = store._apply

            async def apply(batch: Any) -> list[str]:
                why = failure()
                if why is not None:
                    raise StoreError(f"cannot write to store: {why}")
                return await real_apply(batch)

            monkeypatch.setattr(store, "_apply", apply)
            return
        assert isinstance(store, SqliteStore)
        db: Any = store._database()
        real_write = db.write

        def write(batch: Any) -> None:
            why = failure()
            if why is not None:
                raise StoreError(f"cannot write to store: {why}") from sqlite3.OperationalError(why)
            real_write(batch)

        monkeypatch.setattr(db, "write", write)


# The Redis backend needs a redis-server: slow (tests/conftest.py).
@pytest.fixture(params=["sqlite", pytest.param("redis", marks=pytest.mark.slow)])
def backend(request: pytest.FixtureRequest, db_path: str) -> Backend:
    redis = request.getfixturevalue("redis_server") if request.param == "redis" else None
    return Backend(request.param, db_path, redis)


@pytest.fixture
async def store(backend: Backend) -> AsyncIterator[Store]:
    s = backend.new()
    await s.open()
    yield s
    await s.aclose()


def session(sid: str, created_at: int, **changes: Any) -> SessionRecord:
    fields: dict[str, Any] = {
        "id": sid,
        "created_at": created_at,
        "workspace_path": "/work/space",
        "active_model": "scripted:echo",
        "metadata": {"owner": "ana", "tags": ["a", "b"]},
        "parent_session_id": None,
        "routing_policy_version": "v1",
    }
    return SessionRecord(**(fields | changes))


def message(mid: str, sid: str = "sess_a", **changes: Any) -> Message:
    fields: dict[str, Any] = {
        "id": mid,
        "session_id": sid,
        "turn_id": "turn_1",
        "role": "user",
        "content": [TextBlock(f"text of {mid}")],
        "status": "complete",
        "created_at": 1000,
    }
    return Message(**(fields | changes))


def event(seq: int, sid: str = "sess_a", ts: int = 1000) -> StoredEvent:
    data = b'{"id":"%s","type":"turn.started"}' % format_event_id(seq).encode()
    return StoredEvent(seq=seq, session_id=sid, type="turn.started", ts=ts, data=data)


async def restart(store: Store, backend: Backend) -> StoreState:
    """Close the store, open its data again, and say what the new store found."""
    await store.aclose()
    again = backend.new()
    state = await again.open()
    await again.aclose()
    return state


# --- round trips -------------------------------------------------------------


async def test_a_new_store_starts_at_zero(backend: Backend) -> None:
    store = backend.new()
    state = await store.open()
    await store.aclose()
    assert (state.event_ceiling, state.retention_floor) == (0, 0)


async def test_session_round_trip_and_upsert(store: Store) -> None:
    rec = session("sess_a", 1000, parent_session_id="sess_p", cost_so_far_usd=0.25, turn_count=2)
    store.put_session(rec)
    await store.flush()
    assert await store.get_session("sess_a") == rec
    assert await store.get_session("sess_unknown") is None

    updated = session("sess_a", 1000, active_model="anthropic:x", turn_count=3)
    store.put_session(updated)
    await store.flush()
    assert await store.get_session("sess_a") == updated


async def test_releasing_memory_keeps_everything_readable(store: Store) -> None:
    """What unloading calls after each batch (docs/protocol.md §13): a cache, not data."""
    rec = session("sess_a", 1000)
    store.put_session(rec)
    await store.flush()
    assert await store.get_session("sess_a") == rec
    await store.release_memory()
    assert await store.get_session("sess_a") == rec
    store.put_session(session("sess_b", 2000))
    await store.flush()
    assert await store.get_session("sess_b") is not None


def _sqlite_memory_used() -> Callable[[], int] | None:
    """SQLite's own count of the memory it holds, where its library exports it."""
    import _sqlite3
    import ctypes

    try:
        used = ctypes.CDLL(_sqlite3.__file__).sqlite3_memory_used
    except (OSError, AttributeError):
        return None
    used.restype = ctypes.c_int64
    return lambda: int(used())


async def test_sqlite_gives_its_page_caches_back(db_path: str) -> None:
    memory_used = _sqlite_memory_used()
    if memory_used is None:
        pytest.skip("this Python's SQLite does not export sqlite3_memory_used")
    store = SqliteStore(db_path)
    await store.open()
    try:
        for i in range(2000):  # some 2 MiB of records: the page caches fill as they are read
            store.put_session(session(f"sess_{i:05}", i, workspace_path="/w/" + "x" * 1000))
        await store.flush()
        for i in range(0, 2000, 7):
            await store.get_session(f"sess_{i:05}")
        full = memory_used()
        await store.release_memory()
        assert memory_used() < full - 500_000, (full, memory_used())
    finally:
        await store.aclose()


async def test_message_round_trip(store: Store) -> None:
    user = StoredMessage(message("msg_1"), None)
    assistant = StoredMessage(
        message(
            "msg_2",
            role="assistant",
            model="scripted:echo",
            usage=Usage(input_tokens=3, output_tokens=5, cost_usd=0.01),
        ),
        format_event_id(7),
        "end_turn",
        1234,
    )
    store.put_message(user)
    store.put_message(assistant)
    await store.flush()
    assert await store.load_messages("sess_a") == [user, assistant]
    assert await store.load_messages("sess_other") == []


async def test_an_in_progress_message_is_rewritten_as_complete_in_place(store: Store) -> None:
    partial = message("msg_2", role="assistant", status="in_progress", content=[TextBlock("He")])
    store.put_message(StoredMessage(message("msg_1"), None))
    store.put_message(StoredMessage(partial, None))
    store.put_message(StoredMessage(message("msg_3"), None))
    await store.flush()

    done = message("msg_2", role="assistant", status="complete", content=[TextBlock("Hello")])
    store.put_message(StoredMessage(done, format_event_id(42), "end_turn", 5000))
    await store.flush()

    loaded = await store.load_messages("sess_a")
    assert [m.message.id for m in loaded] == ["msg_1", "msg_2", "msg_3"]
    assert loaded[1] == StoredMessage(done, format_event_id(42), "end_turn", 5000)


async def test_a_sessions_stored_size_is_known_as_it_is_written(store: Store) -> None:
    """``max_session_mb`` (docs/protocol.md §15): a put says the bytes of the message as
    stored, and ``event_bytes`` a session's events, read once when it is loaded."""
    small, large = message("msg_1"), message("msg_2", content=[TextBlock("x" * 10_000)])
    small_size = store.put_message(StoredMessage(small, None))
    large_size = store.put_message(StoredMessage(large, None))
    assert 0 < small_size < 1000 and 10_000 < large_size < 11_000
    for seq in (1, 2, 3):
        store.put_event(event(seq))
    store.put_event(event(4, sid="sess_other"))
    await store.flush()
    mine = sum(len(e.data) for e in await store.events_after(["sess_a"], 0, 10))
    size = await store.event_bytes("sess_a")
    # SQLite: exact; Redis: its own (sampled) estimate of the set, overhead included
    assert size == mine if isinstance(store, SqliteStore) else mine <= size < 2 * mine + 4096
    assert await store.event_bytes("sess_none") == 0


async def test_event_round_trip_keeps_the_wire_bytes(store: Store) -> None:
    ev = StoredEvent(seq=5, session_id="sess_a", type="tool.called", ts=77, data=b'{"x": 1 }')
    store.put_event(ev)
    await store.flush()
    assert await store.events_after(["sess_a"], 0, 10) == [ev]


# --- paging ------------------------------------------------------------------


async def test_list_sessions_pages_newest_first(store: Store) -> None:
    # Two sessions share created_at 200: id descending breaks the tie.
    for sid, created in [("sess_a", 100), ("sess_b", 200), ("sess_c", 200), ("sess_d", 300)]:
        store.put_session(session(sid, created))
    await store.flush()

    page, more = await store.list_sessions(limit=2, before=None)
    assert ([s.id for s in page], more) == (["sess_d", "sess_c"], True)
    page, more = await store.list_sessions(limit=2, before="sess_c")
    assert ([s.id for s in page], more) == (["sess_b", "sess_a"], False)
    page, more = await store.list_sessions(limit=10, before=None)
    assert ([s.id for s in page], more) == (["sess_d", "sess_c", "sess_b", "sess_a"], False)
    assert await store.list_sessions(limit=2, before="sess_a") == ([], False)


async def test_list_sessions_with_an_unknown_cursor_is_an_empty_page(store: Store) -> None:
    store.put_session(session("sess_a", 100))
    await store.flush()
    assert await store.list_sessions(limit=5, before="sess_nope") == ([], False)


async def test_events_after_filters_by_sessions_with_a_limit(store: Store) -> None:
    for seq, sid in [(1, "sess_a"), (2, "sess_b"), (3, "sess_c"), (4, "sess_a"), (5, "sess_b")]:
        store.put_event(event(seq, sid))
    await store.flush()

    async def seqs(sids: list[str], after: int, limit: int) -> list[int]:
        return [e.seq for e in await store.events_after(sids, after, limit)]

    assert await seqs(["sess_a", "sess_b"], 0, 10) == [1, 2, 4, 5]
    assert await seqs(["sess_a", "sess_b"], 1, 2) == [2, 4]
    assert await seqs(["sess_c"], 3, 10) == []
    assert await seqs([], 0, 10) == []


async def test_a_negative_limit_is_refused(store: Store) -> None:
    with pytest.raises(ValueError, match="limit must be >= 0"):
        await store.events_after(["sess_a"], 0, -1)


# --- event ceiling and retention floor ---------------------------------------


async def test_blocks_of_event_ids_follow_each_other_and_survive_a_restart(
    store: Store, backend: Backend
) -> None:
    """Each block lies above the last; the ceiling is the last block's top, durable with a flush."""
    grants: list[int] = []
    store.reserve_event_ids(100, grants.append)
    store.reserve_event_ids(50, grants.append)
    await store.flush()
    assert grants == [100, 150]
    store.reserve_event_ids(80, grants.append)
    await store.flush()  # Redis grants it only once its transaction answered; SQLite at once
    assert grants == [100, 150, 230]
    assert (await restart(store, backend)).event_ceiling == 230
    again = backend.new()
    await again.open()
    again.reserve_event_ids(10, grants.append)  # after a restart: above every block before it
    await again.flush()
    await again.aclose()
    assert grants[-1] == 240


async def test_event_ceiling_covers_events_stored_above_it(store: Store, backend: Backend) -> None:
    store.reserve_event_ids(10, lambda top: None)
    store.put_event(event(12))
    assert (await restart(store, backend)).event_ceiling == 12


class Blocks:
    """A store's block allocation, granted when the test says (Redis) or at once (SQLite)."""

    def __init__(self, *, at_once: bool, start: int = 0) -> None:
        self.at_once = at_once
        self.counter = start
        self.asked: list[tuple[int, Callable[[int], None]]] = []

    def reserve(self, block: int, granted: Callable[[int], None]) -> None:
        if self.at_once:
            self.counter += block
            granted(self.counter)
        else:
            self.asked.append((block, granted))

    def grant(self, *, taken_by_others: int = 0) -> int:
        """Answer the oldest request, after ``taken_by_others`` ids went to other nodes."""
        block, granted = self.asked.pop(0)
        self.counter += taken_by_others + block
        granted(self.counter)
        return self.counter


def test_the_sequencer_on_sqlite_issues_the_same_ids_as_before() -> None:
    """Contiguous blocks, the next one reserved when half of the current one is used."""
    blocks = Blocks(at_once=True, start=1000)
    seq = EventSequencer(blocks.reserve, block=10)
    assert (seq.ready, seq.last, seq.ceiling, blocks.counter) == (True, 1000, 1010, 1010)
    issued = [seq.next() for _ in range(5)]
    assert blocks.counter == 1010  # half used: not yet
    issued.append(seq.next())
    assert blocks.counter == 1020  # past half: the next block reserved (and durable at once)
    issued += [seq.next() for _ in range(20)]
    assert issued == list(range(1001, 1027))
    assert blocks.counter == 1040  # 1016 and 1026 were past half of theirs too


@pytest.mark.parametrize("block", [10, 7, 1_000_000])
def test_the_sequencer_on_sqlite_reserves_exactly_as_the_previous_one(block: int) -> None:
    """Id for id and reservation for reservation, against the sequencer before blocks."""

    class Previous:  # gateway/session/sequencer.py before event ids came in blocks
        def __init__(self, ceiling: int, reserve: Callable[[int], None], block: int) -> None:
            self.last, self._block, self._reserve = ceiling, block, reserve
            self.ceiling = ceiling + block
            reserve(self.ceiling)

        def next(self) -> int:
            self.last += 1
            if self.last > self.ceiling - self._block // 2:
                self.ceiling += self._block
                self._reserve(self.ceiling)
            return self.last

    before: list[object] = []
    previous = Previous(123, lambda c: before.append(("reserve", c)), block)
    before += [previous.next() for _ in range(3000)]
    now: list[object] = []
    ceiling = [123]

    def reserve(size: int, granted: Callable[[int], None]) -> None:
        ceiling[0] += size
        now.append(("reserve", ceiling[0]))
        granted(ceiling[0])

    current = EventSequencer(reserve, block=block)
    now += [current.next() for _ in range(3000)]
    assert now == before


def test_the_sequencer_on_redis_skips_what_other_nodes_were_granted() -> None:
    blocks = Blocks(at_once=False)
    seq = EventSequencer(blocks.reserve, block=10)
    assert not seq.ready
    blocks.grant()  # 1..10
    issued = [seq.next() for _ in range(6)]
    assert len(blocks.asked) == 1  # past half: asked, not granted yet
    blocks.grant(taken_by_others=20)  # 11..30 went to other nodes: this one gets 31..40
    issued += [seq.next() for _ in range(6)]
    assert issued == [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 31, 32]


def test_the_sequencer_counts_past_a_block_not_granted_in_time_then_continues_above() -> None:
    """Redis not answering for half a block's worth of ids: said, and the ids keep increasing."""
    blocks = Blocks(at_once=False)
    overruns: list[int] = []
    seq = EventSequencer(blocks.reserve, block=10, on_overrun=overruns.append)
    blocks.grant()
    issued = [seq.next() for _ in range(12)]
    assert issued == list(range(1, 13)) and overruns == [11]  # told once
    blocks.grant(taken_by_others=10)  # 21..30: continue there, above the overrun
    assert [seq.next() for _ in range(2)] == [21, 22]
    blocks = Blocks(at_once=False)
    seq = EventSequencer(blocks.reserve, block=10, on_overrun=overruns.append)
    blocks.grant()
    assert [seq.next() for _ in range(12)][-1] == 12
    blocks.grant()  # 11..20: nobody else took them; 11 and 12 were this node's after all
    assert seq.next() == 13


def test_a_node_taking_over_a_session_issues_its_ids_above_the_previous_holders() -> None:
    """needs_block_above and renew (gateway.node.Node.ids_above drives them)."""
    blocks = Blocks(at_once=False)
    seq = EventSequencer(blocks.reserve, block=10)
    blocks.grant()  # 1..10, this node's
    assert seq.next() == 1
    assert not seq.needs_block_above(10)  # nobody allocated since: every other id is below
    assert seq.needs_block_above(50)  # others were granted up to 50: this block is too low
    seq.renew()
    blocks.counter = 50
    blocks.grant()  # 51..60, used at once
    assert not seq.needs_block_above(50)
    assert seq.next() == 51
    # A block granted ahead that is high enough is used at once, without asking.
    for _ in range(5):
        seq.next()
    blocks.grant(taken_by_others=5)  # 66..75, ahead
    assert not seq.needs_block_above(65)
    assert seq.next() == 66


async def test_purge_before_deletes_old_events_and_raises_the_floor(
    store: Store, backend: Backend
) -> None:
    for seq, ts in [(1, 100), (2, 200), (3, 300), (4, 400)]:
        store.put_event(event(seq, ts=ts))
    await store.flush()

    assert await store.purge_before(300) == 2
    assert [e.seq for e in await store.events_after(["sess_a"], 0, 10)] == [3, 4]
    assert await store.purge_before(50) == 2  # nothing purged: unchanged

    state = await restart(store, backend)
    assert (state.retention_floor, state.event_ceiling) == (2, 4)


# --- the writer ----------------------------------------------------------------


async def test_reads_see_only_flushed_writes(backend: Backend) -> None:
    store = backend.new(flush_interval_s=HOUR)
    await store.open()
    async with trio.open_nursery() as nursery:
        await nursery.start(store.run)
        store.put_session(session("sess_a", 1))
        store.put_message(StoredMessage(message("msg_1"), None))
        assert await store.get_session("sess_a") is None
        assert await store.load_messages("sess_a") == []
        await store.flush()
        assert await store.get_session("sess_a") == session("sess_a", 1)
        assert [m.message.id for m in await store.load_messages("sess_a")] == ["msg_1"]
        await store.aclose()


async def test_an_event_is_committed_without_waiting_for_the_gathering(backend: Backend) -> None:
    """Clients wait for an event's commit (docs/protocol.md §9): the writer does not gather."""
    store = backend.new(flush_interval_s=HOUR)
    await store.open()
    commits: list[int] = []
    committed = trio.Event()

    def on_commit(ticket: int) -> None:
        commits.append(ticket)
        committed.set()

    store.on_commit = on_commit
    async with trio.open_nursery() as nursery:
        await nursery.start(store.run)
        store.put_session(session("sess_a", 1))
        store.put_event(event(1))
        with trio.fail_after(10):  # not the hour
            await committed.wait()
        assert commits == [2]
        assert [e.seq for e in await store.events_after(["sess_a"], 0, 10)] == [1]
        await store.aclose()


async def within_real_seconds(seconds: float, ready: Callable[[], bool | Awaitable[bool]]) -> bool:
    """Whether ``ready()`` (awaited if it must be) comes true within ``seconds`` of real
    time (the loop's clock may stand still); looking does not ask the store for anything
    (a read is no wait for a commit)."""
    for _ in range(round(seconds / 0.01)):
        if await holds(ready):
            return True
        await trio.to_thread.run_sync(time.sleep, 0.01)
    return await holds(ready)


async def holds(ready: Callable[[], bool | Awaitable[bool]]) -> bool:
    answer = ready()
    return await answer if inspect.isawaitable(answer) else answer


async def landed(store: Store, messages: int) -> bool:
    """Whether ``messages`` of sess_a are in the file (read, not waited for)."""
    return len(await store.load_messages("sess_a")) >= messages


async def test_a_write_nobody_waits_for_lands_without_waking_the_loop(
    db_path: str, mock_clock: trio.testing.MockClock
) -> None:
    """A batch of messages alone (a streaming message's checkpoint) lands in the writer's
    thread and its answer waits for the loop to be awake anyway (gateway.store.answer):
    here, a wait for its commit. A batch with an event is answered at once."""
    store = SqliteStore(db_path)  # on a clock that stands still: the answer's patience holds
    await store.open()
    commits: list[int] = []
    store.on_commit = commits.append
    async with trio.open_nursery() as nursery:
        await nursery.start(store.run)
        store.put_message(StoredMessage(message("msg_1"), None))
        assert await within_real_seconds(10, lambda: landed(store, 1))  # in the file...
        await trio.testing.wait_all_tasks_blocked()
        assert store.committed == 0 and commits == []  # ...the loop not told
        await store.wait_committed(store.ticket())
        assert store.committed == 1 and commits == [1]
        store.put_event(event(1))
        assert await within_real_seconds(10, lambda: len(commits) >= 2)  # told at once
        store.put_message(StoredMessage(message("msg_2"), None))
        assert await within_real_seconds(10, lambda: landed(store, 2))
        await store.aclose()  # a close wants the answer: it does not wait for the patience
    assert commits[:3] == [1, 2, 3] and set(commits) == {1, 2, 3}


async def test_the_write_that_ends_an_outage_is_answered_at_once(
    db_path: str, mock_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``failure`` (``/readyz`` 503) lasts until a write lands again (docs/protocol.md §15),
    not until someone next asks the store: the retry that lands after failed attempts
    is answered at once even when nobody waits for its batch (a checkpoint alone)."""
    store = SqliteStore(db_path)  # on a clock that stands still: the answer's patience holds
    await store.open()
    failures = iter(["database or disk is full"])
    Backend("sqlite", db_path, None).break_writes(store, monkeypatch, lambda: next(failures, None))
    failed = trio.Event()
    store.on_write_error = lambda exc: failed.set()
    async with trio.open_nursery() as nursery:
        await nursery.start(store.run)
        store.put_message(StoredMessage(message("msg_1"), None))  # nobody waits for it
        assert await within_real_seconds(5, failed.is_set)  # a failure is answered at once
        assert store.failure is not None
        mock_clock.jump(RETRY_FIRST_S)  # the retry, which lands
        ready = await within_real_seconds(5, lambda: store.failure is None)
        rows, committed = await store.load_messages("sess_a"), store.committed
        await store.aclose()  # asks for the answer in any case: the writer leaves
    assert rows and ready, "the write landed, yet the store still says it fails (/readyz 503)"
    assert committed == 1


async def test_many_puts_then_one_flush_land_in_order(store: Store) -> None:
    for seq in range(1, 2501):
        store.put_event(event(seq, sid="sess_a" if seq % 2 else "sess_b"))
    await store.flush()
    stored = await store.events_after(["sess_a", "sess_b"], 0, 5000)
    assert stored == [event(seq, sid="sess_a" if seq % 2 else "sess_b") for seq in range(1, 2501)]


async def test_a_put_is_encoded_when_enqueued(store: Store) -> None:
    msg = message("msg_1")
    store.put_message(StoredMessage(msg, None))
    msg.status = "error"  # a later mutation of the caller's struct is not stored
    await store.flush()
    assert [m.message.status for m in await store.load_messages("sess_a")] == ["complete"]


class Recorder:
    """What the store's connections did: every statement's thread, every event insert's size."""

    def __init__(self) -> None:
        self.threads: list[threading.Thread] = []
        self.event_batches: list[int] = []
        self.events_inserted = trio.Event()
        self.token: trio.lowlevel.TrioToken | None = None  # the test's loop, set by the test


class RecordingConnection(sqlite3.Connection):
    recorder: Recorder

    def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:
        self.recorder.threads.append(threading.current_thread())
        return super().execute(sql, *args)

    def executemany(self, sql: str, rows: Any) -> sqlite3.Cursor:
        self.recorder.threads.append(threading.current_thread())
        rows = list(rows)
        cursor = super().executemany(sql, rows)
        if "INSERT INTO events" in sql and rows:
            self.recorder.event_batches.append(len(rows))
            # The writer's thread is the store's own (gateway.store.answer): named, Trio's.
            trio.from_thread.run_sync(
                self.recorder.events_inserted.set, trio_token=self.recorder.token
            )
        return cursor


@pytest.fixture
def recorder(monkeypatch: pytest.MonkeyPatch) -> Recorder:
    """Make every connection the store opens a RecordingConnection."""
    recorder = Recorder()
    real_connect = sqlite3.connect

    def connect(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        conn = real_connect(*args, factory=RecordingConnection, **kwargs)
        assert isinstance(conn, RecordingConnection)
        conn.recorder = recorder
        return conn

    monkeypatch.setattr(sqlite3, "connect", connect)
    return recorder


async def test_the_writer_batches_and_never_uses_the_main_thread(
    db_path: str, recorder: Recorder
) -> None:
    recorder.token = trio.lowlevel.current_trio_token()
    store = SqliteStore(db_path, flush_interval_s=HOUR, max_batch=3)
    await store.open()
    async with trio.open_nursery() as nursery:
        await nursery.start(store.run)
        for seq in (1, 2, 3):  # reaching max_batch wakes the writer before the hour is up
            store.put_event(event(seq))
        with trio.fail_after(10):
            await recorder.events_inserted.wait()
        assert recorder.event_batches == [3]  # written by run(), in one batch
        await store.flush()  # waits for that batch's commit; writes nothing itself
        assert recorder.event_batches == [3]
        assert [e.seq for e in await store.events_after(["sess_a"], 0, 10)] == [1, 2, 3]
        store.put_event(event(4))
        await store.aclose()  # and run() returns once it has seen the close
    assert recorder.event_batches == [3, 1]
    assert recorder.threads
    assert all(t is not threading.main_thread() for t in recorder.threads)


async def test_the_writer_batches_what_is_pending(backend: Backend) -> None:
    """A group commit (Store.run): what is pending when the writer wakes is one commit."""
    store = backend.new(flush_interval_s=HOUR, max_batch=3)
    await store.open()
    flushes: list[int] = []
    committed = trio.Event()

    def on_flush(seconds: float, rows: int) -> None:
        flushes.append(rows)
        committed.set()

    store.on_flush = on_flush
    async with trio.open_nursery() as nursery:
        await nursery.start(store.run)
        store.put_session(session("sess_a", 1))
        store.put_message(StoredMessage(message("msg_1"), None))
        store.reserve_event_ids(10, lambda top: None)  # max_batch reached: no more gathering
        with trio.fail_after(10):
            await store.wait_committed(store.ticket())
            await committed.wait()
        assert flushes == [3] and store.committed == 3
        await store.flush()  # nothing pending: nothing written
        assert flushes == [3]
        store.put_event(event(4))
        await store.aclose()  # and run() returns once it has seen the close
    assert flushes == [3, 1]


async def test_sessions_are_listed_for_their_owner(store: Store) -> None:
    """docs/protocol.md §2: a key sees its own sessions and the ownerless ones, paged."""
    for sid, created, owner in [
        ("sess_a", 100, "k1"),
        ("sess_b", 200, ""),
        ("sess_c", 300, "k2"),
        ("sess_d", 400, "k1"),
    ]:
        store.put_session(session(sid, created, owner=owner))
    store.put_session(session("sess_w", 500, owner="k1", parent_session_id="sess_d"))
    await store.flush()

    async def ids(visible_to: str | None, before: str | None, limit: int) -> Any:
        page, more = await store.list_sessions(limit=limit, before=before, visible_to=visible_to)
        return [s.id for s in page], more

    assert await ids("k1", None, 2) == (["sess_w", "sess_d"], True)
    assert await ids("k1", "sess_d", 5) == (["sess_b", "sess_a"], False)
    assert await ids("k2", None, 5) == (["sess_c", "sess_b"], False)
    assert await ids("", None, 5) == (["sess_b"], False)
    assert await ids(None, "sess_c", 1) == (["sess_b"], True)
    assert await ids("k1", None, 0) == ([], True)
    # Workers are counted against their owner (max_sessions_per_key, docs/protocol.md §15).
    assert await store.sessions_per_owner() == {"": 1, "k1": 3, "k2": 1}


async def test_aclose_flushes_pending_writes_from_a_cancelled_scope(backend: Backend) -> None:
    store = backend.new(flush_interval_s=HOUR)
    await store.open()
    with trio.CancelScope() as scope:
        async with trio.open_nursery() as nursery:
            await nursery.start(store.run)
            store.put_session(session("sess_a", 1))
            store.put_event(event(1))
            scope.cancel()
            try:
                await trio.sleep_forever()
            finally:
                await store.aclose()
    assert scope.cancelled_caught

    again = backend.new()
    await again.open()
    assert await again.get_session("sess_a") == session("sess_a", 1)
    assert [e.seq for e in await again.events_after(["sess_a"], 0, 10)] == [1]
    await again.aclose()


async def test_aclose_is_idempotent_and_puts_after_it_are_refused(store: Store) -> None:
    await store.aclose()
    await store.aclose()
    with pytest.raises(StoreError, match="is closed"):
        store.put_event(event(1))


async def test_a_row_the_schema_refuses_is_skipped_and_the_rest_lands(db_path: str) -> None:
    store = SqliteStore(db_path)
    await store.open()
    errors: list[StoreError] = []
    store.on_write_error = errors.append
    store.put_event(event(1))
    await store.flush()
    store.put_event(event(1))  # the same seq again: the primary key refuses it
    store.put_session(session("sess_a", 1))  # in the same batch: lands all the same
    store.put_event(event(2))
    await store.flush()
    assert [e.seq for e in await store.events_after(["sess_a"], 0, 10)] == [1, 2]
    assert await store.get_session("sess_a") == session("sess_a", 1)
    assert any("UNIQUE constraint failed" in e.message for e in errors)
    assert any("refused event 1 (turn.started)" in e.message for e in errors)
    store.put_event(event(3))  # and the store goes on
    await store.flush()
    assert [e.seq for e in await store.events_after(["sess_a"], 2, 10)] == [3]
    await store.aclose()


async def test_a_transient_failure_is_retried_until_the_batch_lands(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full disk, a busy database, a lost connection lose nothing: the batch waits, retried."""
    store = backend.new()
    await store.open()
    errors: list[StoreError] = []
    store.on_write_error = errors.append
    commits: list[int] = []
    store.on_commit = commits.append
    failures = iter(["database or disk is full"] * 2)
    backend.break_writes(store, monkeypatch, lambda: next(failures, None))
    async with trio.open_nursery() as nursery:
        await nursery.start(store.run)
        store.put_session(session("sess_a", 1))
        store.put_event(event(1))
        ticket = store.ticket()
        assert ticket == 2 and store.committed == 0
        with trio.fail_after(10):
            await store.wait_committed(ticket)
        assert [e.message for e in errors] == [
            "cannot write to store: database or disk is full"
        ] * 2
        assert commits[-1] == store.committed == 2
        assert [e.seq for e in await store.events_after(["sess_a"], 0, 10)] == [1]
        await store.aclose()


async def test_a_close_during_an_outage_ends_and_says_what_was_lost(
    db_path: str, autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full disk at shutdown: the writer task is retrying its batch when the store is
    closed. The close insists for ``CLOSE_RETRY_S``, then the retries end (the writer
    task's too), the close says how many writes were lost, a task still waiting for
    one of them learns it, and the daemon exits."""
    store = SqliteStore(db_path, inline=True)  # Trio's clock drives it all
    await store.open()
    Backend("sqlite", db_path, None).break_writes(
        store, monkeypatch, lambda: "database or disk is full"
    )
    failed = trio.Event()
    store.on_write_error = lambda exc: failed.set()
    with trio.fail_after(CLOSE_RETRY_S + 2 * RETRY_MAX_S):
        async with trio.open_nursery() as nursery:
            await nursery.start(store.run)
            store.put_session(session("sess_a", 1))
            store.put_event(event(1))
            await failed.wait()  # the writer task holds the batch, retrying
            waiter_told: list[str] = []

            async def wait_for_it(ticket: int) -> None:
                with pytest.raises(StoreError) as told:
                    await store.wait_committed(ticket)
                waiter_told.append(told.value.message)

            nursery.start_soon(wait_for_it, store.ticket())
            started = trio.current_time()
            with pytest.raises(StoreError, match="2 writes could not be made durable"):
                await store.aclose()
        # the writer task has ended on its own: nothing cancelled it
    assert CLOSE_RETRY_S <= trio.current_time() - started <= CLOSE_RETRY_S + RETRY_MAX_S
    assert waiter_told == [f"store {db_path!r} closed before the write was made durable"]


async def test_a_close_during_an_outage_lands_what_it_can_once_the_outage_ends(
    db_path: str, autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The disk frees up while the store closes: everything lands, nothing is said lost."""
    store = SqliteStore(db_path, inline=True)
    await store.open()
    ends = trio.current_time() + CLOSE_RETRY_S / 2

    def full() -> str | None:
        return "database or disk is full" if trio.current_time() < ends else None

    Backend("sqlite", db_path, None).break_writes(store, monkeypatch, full)
    async with trio.open_nursery() as nursery:
        await nursery.start(store.run)
        store.put_session(session("sess_a", 1))
        store.put_event(event(1))
        await trio.sleep(1)  # failing, retried
        store.put_event(event(2))
        await store.aclose()
    again = SqliteStore(db_path, inline=True)
    await again.open()
    assert [e.seq for e in await again.events_after(["sess_a"], 0, 10)] == [1, 2]
    await again.aclose()


async def test_a_cancelled_flush_puts_its_batch_back(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = backend.new()
    await store.open()
    failing = True
    backend.break_writes(store, monkeypatch, lambda: "database is locked" if failing else None)
    store.put_event(event(1))
    with trio.move_on_after(0.3):
        await store.flush()  # keeps retrying until cancelled
    assert store.committed == 0
    failing = False
    store.put_event(event(2))
    await store.flush()
    assert [e.seq for e in await store.events_after(["sess_a"], 0, 10)] == [1, 2]
    await store.aclose()


async def test_open_turns_and_workers_are_found(store: Store) -> None:
    store.put_session(session("sess_a", 1, current_turn_id="turn_x", current_turn_seq=7))
    store.put_session(session("sess_b", 2, parent_session_id="sess_a"))
    store.put_session(session("sess_c", 3, parent_session_id="sess_a"))
    await store.flush()
    assert [(r.id, r.current_turn_id, r.current_turn_seq) for r in await store.open_turns()] == [
        ("sess_a", "turn_x", 7)
    ]
    assert await store.worker_ids("sess_a") == ["sess_b", "sess_c"]
    store.put_session(session("sess_a", 1))  # the turn ended
    await store.flush()
    assert await store.open_turns() == []


async def test_queued_turns_and_rewinds_round_trip_and_queued_turns_are_open(
    store: Store,
) -> None:
    """docs/protocol.md §2 "A busy session": a queued turn is found at a restart."""
    queued = [QueuedTurn("turn_q1", message("msg_q1", turn_id="turn_q1"), {"traceparent": "x"})]
    rewinds = [Rewind("msg_u1", "turn_2")]
    rec = session("sess_a", 1, queued_turns=queued, rewinds=rewinds)
    store.put_session(rec)
    store.put_session(session("sess_b", 2))
    await store.flush()
    assert await store.get_session("sess_a") == rec
    assert [r.id for r in await store.open_turns()] == ["sess_a"]
    store.put_session(session("sess_a", 1, rewinds=rewinds))  # the queued turn started
    await store.flush()
    assert await store.open_turns() == []
    assert (await store.get_session("sess_a")) == session("sess_a", 1, rewinds=rewinds)


async def test_a_sessions_push_configs_are_kept_with_it_and_go_with_it(store: Store) -> None:
    """docs/doors/a2a.md "Push notifications": a task's configs are the session record's."""
    configs = [PushConfig("pc_1", "turn_1", "https://hooks.example.com/a", "tok")]
    rec = session("sess_p", 1, push_configs=configs)
    store.put_session(rec)
    await store.flush()
    assert (await store.get_session("sess_p")) == rec
    store.put_session(session("sess_p", 1))  # deleted
    await store.flush()
    assert (await store.get_session("sess_p")).push_configs == []  # type: ignore[union-attr]


async def test_a_version_1_store_is_upgraded_and_its_open_turns_found(db_path: str) -> None:
    conn = sqlite3.connect(db_path)
    with conn:
        conn.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL)")
        conn.execute("INSERT INTO meta VALUES ('schema_version', 1)")
        conn.execute(
            """CREATE TABLE sessions (id TEXT PRIMARY KEY, created_at INTEGER NOT NULL,
            workspace_path TEXT NOT NULL, active_model TEXT NOT NULL, metadata BLOB NOT NULL,
            parent_session_id TEXT, routing_policy_version TEXT NOT NULL,
            cost_so_far_usd REAL NOT NULL, turn_count INTEGER NOT NULL)"""
        )
        conn.execute("CREATE INDEX sessions_by_age ON sessions (created_at, id)")
        conn.execute(
            """CREATE TABLE messages (ord INTEGER PRIMARY KEY, session_id TEXT NOT NULL,
            id TEXT NOT NULL, data BLOB NOT NULL, complete_event_id TEXT, stop_reason TEXT,
            complete_ts INTEGER, UNIQUE (session_id, id))"""
        )
        conn.execute(
            """CREATE TABLE events (seq INTEGER PRIMARY KEY, session_id TEXT NOT NULL,
            type TEXT NOT NULL, ts INTEGER NOT NULL, data BLOB NOT NULL)"""
        )
        for sid in ("sess_open", "sess_done"):
            conn.execute(
                "INSERT INTO sessions VALUES"
                " (?, 1, '/w', 'scripted:echo', x'7b7d', NULL, 's', 0, 1)",
                (sid,),
            )
        rows = [
            (1, "sess_open", "turn.started", b'{"type":"turn.started","turn_id":"turn_o"}'),
            (2, "sess_done", "turn.started", b'{"type":"turn.started","turn_id":"turn_d"}'),
            (3, "sess_done", "turn.completed", b'{"type":"turn.completed","turn_id":"turn_d"}'),
            (4, "sess_open", "llm.call_started", b'{"type":"llm.call_started","turn_id":"turn_o"}'),
        ]
        conn.executemany("INSERT INTO events VALUES (?, ?, ?, 1000, ?)", rows)
    conn.close()
    store = SqliteStore(db_path)
    state = await store.open()
    assert state.event_ceiling == 4
    assert [(r.id, r.current_turn_id, r.current_turn_seq) for r in await store.open_turns()] == [
        ("sess_open", "turn_o", 1)
    ]
    await store.aclose()


# --- opening -------------------------------------------------------------------


async def test_a_missing_directory_is_a_store_error(tmp_path: Path) -> None:
    path = str(tmp_path / "missing" / "gateway.db")
    with pytest.raises(StoreError, match="does not exist") as info:
        await SqliteStore(path).open()
    assert path in str(info.value)


async def test_a_file_that_is_not_a_database_is_a_store_error(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_bytes(b"these are not the pages of a database\n" * 200)
    with pytest.raises(StoreError, match="file is not a database") as info:
        await SqliteStore(str(path)).open()
    assert str(path) in str(info.value)


def make_foreign_database(path: str, *, schema_version: int | None) -> None:
    conn = sqlite3.connect(path)
    with conn:
        if schema_version is None:
            conn.execute("CREATE TABLE recipes (name TEXT)")
        else:
            conn.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL)")
            conn.execute("INSERT INTO meta VALUES ('schema_version', ?)", (schema_version,))
    conn.close()


async def test_another_applications_database_is_a_store_error(db_path: str) -> None:
    make_foreign_database(db_path, schema_version=None)
    with pytest.raises(StoreError, match="not a gateway store"):
        await SqliteStore(db_path).open()


async def test_an_unknown_schema_version_is_a_store_error(db_path: str) -> None:
    make_foreign_database(db_path, schema_version=99)
    with pytest.raises(StoreError, match="schema version 99, this gateway reads version 6"):
        await SqliteStore(db_path).open()


async def test_memory_is_refused() -> None:
    with pytest.raises(StoreError, match="needs a file"):
        await SqliteStore(":memory:").open()


async def test_a_database_error_that_is_no_rows_fault_holds_the_batch(
    db_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A corrupt or unreadable file is not "a bad row": nothing is skipped, nothing reported."""
    store = SqliteStore(db_path)
    await store.open()
    db: Any = store._database()
    real_write = db.write
    failing = True

    def write(batch: Any) -> None:
        if failing:
            raise StoreError("corrupt") from sqlite3.DatabaseError(
                "database disk image is malformed"
            )
        real_write(batch)

    monkeypatch.setattr(db, "write", write)
    store.put_event(event(1))
    with trio.move_on_after(0.3):
        await store.flush()
    assert store.committed == 0  # held, not skipped
    failing = False
    await store.flush()
    assert [e.seq for e in await store.events_after(["sess_a"], 0, 10)] == [1]
    await store.aclose()

"""A session's files in the store (docs/protocol.md §2 "Files"): one contract, both backends.

Each test takes ``backend`` or ``store`` from tests/unit/store/test_store.py and
runs twice, on SQLite and on a real redis-server (its rules: a fresh database
or key prefix a test, the real clock, ``trio.fail_after`` on every wait). What
is checked is :meth:`gateway.store.base.Store.put_file` and its neighbours:
stored once per session and counted once; ``max_per_session``; an owner's
quota across its sessions, and across two stores on one Redis racing for its
last bytes; nothing lands in a session that is not (or no longer) there;
``delete_sessions`` takes the files and gives the owner's bytes back; a fork's
copy; a file of another session is no file here.
"""

from __future__ import annotations

import hashlib

import msgspec
import trio

from gateway.ids import file_id_of
from gateway.store import Store
from gateway.store.base import FileRecord, FileRefusal
from gateway.store.sqlite.store import SqliteStore
from tests.unit.store.test_store import (
    HOUR,
    Backend,
    backend,
    db_path,
    redis_server,
    session,
    store,
)
from tests.webhook_support import redis_command

__all__ = ["backend", "db_path", "redis_server", "store"]  # fixtures

UNLIMITED = {"max_per_session": 0, "owner_quota_bytes": 0}


def file_of(sid: str, data: bytes, owner: str = "ana") -> FileRecord:
    digest = hashlib.sha256(data).hexdigest()
    return FileRecord(file_id_of(digest), sid, owner, digest, "text/plain", len(data), 1000)


async def new_session(store: Store, sid: str, owner: str = "ana") -> None:
    store.put_session(session(sid, 1000, owner=owner))
    with trio.fail_after(10):
        await store.flush()


async def put(
    store: Store, sid: str, data: bytes, owner: str = "ana", *, most: int = 0, quota: int = 0
) -> FileRecord | FileRefusal:
    with trio.fail_after(10):
        return await store.put_file(
            file_of(sid, data, owner), data, max_per_session=most, owner_quota_bytes=quota
        )


def fbytes(backend: Backend, owner: str) -> int | None:
    """Redis's own count of ``owner``'s bytes (``gw:fbytes``), read from redis-server."""
    assert backend.redis is not None
    got = redis_command(backend.redis.port, "HGET", f"{backend.prefix}fbytes", owner)
    return None if got is None else int(got)


async def test_a_file_is_stored_answered_and_read_back(store: Store) -> None:
    await new_session(store, "sess_a")
    data = b"hello, file"
    rec = file_of("sess_a", data)
    assert await put(store, "sess_a", data) == rec
    assert await store.get_file("sess_a", rec.file_id) == (rec, data)
    assert await store.files_of("sess_a") == [rec]
    assert await store.get_file("sess_a", "file_" + "0" * 32) is None


async def test_the_same_id_again_answers_the_stored_record_and_counts_once(store: Store) -> None:
    await new_session(store, "sess_a")
    data = b"twice"
    first = await put(store, "sess_a", data, quota=len(data))
    again = msgspec.structs.replace(file_of("sess_a", data), created_at=9)
    with trio.fail_after(10):
        answer = await store.put_file(again, data, max_per_session=1, owner_quota_bytes=len(data))
    assert answer == first and isinstance(first, FileRecord) and first.created_at == 1000
    assert len(await store.files_of("sess_a")) == 1
    # counted once: the quota (exactly the file's size) still takes it a third time
    assert await put(store, "sess_a", data, quota=len(data)) == first


async def test_a_session_holds_at_most_max_per_session_files(store: Store) -> None:
    await new_session(store, "sess_a")
    await new_session(store, "sess_b")
    for n in range(3):
        assert isinstance(await put(store, "sess_a", b"file %d" % n, most=3), FileRecord)
    assert await put(store, "sess_a", b"file 3", most=3) == "too_many_files"
    assert isinstance(await put(store, "sess_a", b"file 0", most=3), FileRecord)  # already there
    assert isinstance(await put(store, "sess_b", b"file 3", most=3), FileRecord)  # per session
    assert len(await store.files_of("sess_a")) == 3


async def test_an_owners_quota_counts_across_its_sessions(store: Store) -> None:
    await new_session(store, "sess_a")
    await new_session(store, "sess_b")
    await new_session(store, "sess_c", owner="bob")
    assert isinstance(await put(store, "sess_a", b"x" * 60, quota=100), FileRecord)
    assert await put(store, "sess_b", b"y" * 41, quota=100) == "quota_exceeded"
    assert isinstance(await put(store, "sess_b", b"y" * 40, quota=100), FileRecord)  # exactly
    # the same bytes in another session are another file of the owner's
    assert await put(store, "sess_b", b"x" * 60, quota=100) == "quota_exceeded"
    assert isinstance(await put(store, "sess_c", b"z" * 100, "bob", quota=100), FileRecord)
    assert await store.files_of("sess_b") == [file_of("sess_b", b"y" * 40)]


async def test_racing_puts_past_the_quota_land_exactly_what_fits(backend: Backend) -> None:
    """20 puts of 10 bytes at once against a quota of 75: 7 land, 13 are refused. On
    Redis from two stores (two nodes) on the same Redis, half each."""
    stores = [backend.new(), backend.new()] if backend.redis is not None else [backend.new()]
    for s in stores:
        await s.open()
    try:
        await new_session(stores[0], "sess_a")
        await new_session(stores[0], "sess_b")
        answers: list[FileRecord | FileRefusal] = []

        async def one(n: int) -> None:
            sid = "sess_a" if n % 2 else "sess_b"
            answers.append(await put(stores[n % len(stores)], sid, b"%09d\n" % n, quota=75))

        async with trio.open_nursery() as nursery:
            for n in range(20):
                nursery.start_soon(one, n)
        landed = [a for a in answers if isinstance(a, FileRecord)]
        assert len(landed) == 7 and answers.count("quota_exceeded") == 13
        stored = [*await stores[-1].files_of("sess_a"), *await stores[-1].files_of("sess_b")]
        assert sorted(r.file_id for r in stored) == sorted(r.file_id for r in landed)
        if backend.redis is not None:
            assert fbytes(backend, "ana") == 70
    finally:
        for s in stores:
            await s.aclose()


async def test_nothing_lands_in_a_session_that_is_not_there(backend: Backend) -> None:
    s = backend.new()
    await s.open()
    try:
        assert await put(s, "sess_never", b"lost", quota=1000) == "session_not_found"
        await new_session(s, "sess_a")
        await s.delete_sessions(["sess_a"])
        assert await put(s, "sess_a", b"late", quota=1000) == "session_not_found"
        assert await s.files_of("sess_a") == []
        assert await s.files_of("sess_never") == []
        if backend.redis is not None:
            assert fbytes(backend, "ana") in (None, 0)
            keys = redis_command(backend.redis.port, "KEYS", f"{backend.prefix}f*")
            assert keys in ([], [f"{backend.prefix}fbytes".encode()])
    finally:
        await s.aclose()


async def test_deleting_sessions_takes_their_files_and_gives_the_bytes_back(
    backend: Backend,
) -> None:
    s = backend.new()
    await s.open()
    try:
        for sid in ("sess_a", "sess_b", "sess_c"):
            await new_session(s, sid)
        await put(s, "sess_a", b"a" * 30, quota=100)
        await put(s, "sess_a", b"A" * 20, quota=100)
        await put(s, "sess_b", b"b" * 40, quota=100)
        await put(s, "sess_c", b"c" * 10, quota=100)
        assert await put(s, "sess_c", b"C", quota=100) == "quota_exceeded"
        if backend.redis is not None:
            assert fbytes(backend, "ana") == 100
        await s.delete_sessions(["sess_a", "sess_b"])
        assert await s.files_of("sess_a") == [] and await s.files_of("sess_b") == []
        assert await s.get_file("sess_a", file_of("sess_a", b"a" * 30).file_id) is None
        assert [r.size for r in await s.files_of("sess_c")] == [10]
        if backend.redis is not None:
            assert fbytes(backend, "ana") == 10  # exactly what remains
        # the bytes given back are the owner's again: 90 more fit, not 91
        assert await put(s, "sess_c", b"d" * 91, quota=100) == "quota_exceeded"
        assert isinstance(await put(s, "sess_c", b"d" * 90, quota=100), FileRecord)
        await s.delete_sessions(["sess_c"])
        if backend.redis is not None:
            assert fbytes(backend, "ana") in (None, 0)
    finally:
        await s.aclose()


async def test_a_fork_gets_a_copy_counted_against_its_owner(backend: Backend) -> None:
    s = backend.new()
    await s.open()
    try:
        await new_session(s, "sess_a")
        await new_session(s, "sess_f")
        one, two = b"first file", b"second file!"
        await put(s, "sess_a", one)
        await put(s, "sess_a", two)
        await put(s, "sess_f", two)  # the fork already has one: not copied twice
        await s.copy_files("sess_a", "sess_f", "ana")
        forked = await s.files_of("sess_f")
        assert sorted(r.file_id for r in forked) == sorted(
            [file_of("sess_a", one).file_id, file_of("sess_a", two).file_id]
        )
        assert all(r.session_id == "sess_f" and r.owner == "ana" for r in forked)
        got = await s.get_file("sess_f", file_of("sess_a", one).file_id)
        assert got is not None and got[1] == one
        assert got[0] == file_of("sess_f", one)
        if backend.redis is not None:
            assert fbytes(backend, "ana") == 2 * len(one) + 2 * len(two)
        await s.delete_sessions(["sess_a"])  # the fork's copies stay
        assert len(await s.files_of("sess_f")) == 2
        if backend.redis is not None:
            assert fbytes(backend, "ana") == len(one) + len(two)
    finally:
        await s.aclose()


async def test_a_refused_forks_copies_go_with_it_though_its_record_never_came(
    backend: Backend,
) -> None:
    """A fork's files are copied before its record is stored (gateway.node.forking): one
    refused after the copy is deleted with no record of it, and its copies, and the
    owner's bytes they counted, must go all the same."""
    s = backend.new()
    await s.open()
    try:
        await new_session(s, "sess_a")
        data = b"the source's file"
        await put(s, "sess_a", data)
        await s.copy_files("sess_a", "sess_never", "ana")
        assert len(await s.files_of("sess_never")) == 1
        await s.delete_sessions(["sess_never"])
        assert await s.files_of("sess_never") == []
        assert await s.get_file("sess_never", file_of("sess_a", data).file_id) is None
        if backend.redis is not None:
            assert fbytes(backend, "ana") == len(data)  # the source's, no more
        # what the copy counted is the owner's again
        assert isinstance(await put(s, "sess_a", b"x" * 83, quota=100), FileRecord)
    finally:
        await s.aclose()


async def test_a_file_of_another_session_is_no_file_here(store: Store) -> None:
    await new_session(store, "sess_a")
    await new_session(store, "sess_b", owner="bob")
    rec = await put(store, "sess_a", b"a's own")
    assert isinstance(rec, FileRecord)
    assert await store.get_file("sess_b", rec.file_id) is None
    assert await store.files_of("sess_b") == []


async def test_a_stored_file_survives_a_restart(backend: Backend) -> None:
    """Durable when ``put_file`` answers: no flush, no group commit needed."""
    s = backend.new(flush_interval_s=HOUR)  # only what the test does is written
    await s.open()
    await new_session(s, "sess_a")
    data = bytes(range(256)) * 64  # every byte value
    rec = await put(s, "sess_a", data)
    await s.aclose()
    again = backend.new()
    await again.open()
    try:
        assert await again.get_file("sess_a", file_of("sess_a", data).file_id) == (rec, data)
        assert await again.files_of("sess_a") == [rec]
    finally:
        await again.aclose()


async def test_a_forks_copies_a_crash_kept_from_their_record_go_when_sqlite_opens(
    db_path: str,
) -> None:
    """The process dies between a fork's copy of its files and its record's commit: the
    next open of the store (one process's) removes copies of a session that never was,
    and gives back the owner's bytes they counted."""
    s = SqliteStore(db_path)
    await s.open()
    await new_session(s, "sess_a")
    data = b"the source's file"
    await put(s, "sess_a", data)
    await s.copy_files("sess_a", "sess_never", "ana")
    await s.aclose()  # what a crash leaves: the copies, no record
    again = SqliteStore(db_path)
    await again.open()
    try:
        assert await again.files_of("sess_never") == []
        assert [r.file_id for r in await again.files_of("sess_a")] == [
            file_of("sess_a", data).file_id
        ]
        assert isinstance(await put(again, "sess_a", b"x" * 83, quota=100), FileRecord)
    finally:
        await again.aclose()

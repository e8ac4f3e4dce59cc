"""The trace store's embedded SQLite backend (docs/reference.md ``[store] backend = "sqlite"``).

Two layers:

- :class:`gateway.store.sqlite.database.Database` is plain synchronous SQL over
  two connections, one for writes and one for reads (WAL lets a reader and the
  writer run at once). It knows nothing of Trio. Its tables and migrations are
  :mod:`gateway.store.sqlite.schema`'s, a batch's rows and the statements that
  write them :mod:`gateway.store.sqlite.batch`'s; the idempotency records and
  the webhook outbox have tables of their own (:mod:`gateway.store.sqlite.requests`,
  :mod:`gateway.store.sqlite.outbox`).
- :class:`SqliteStore` is the Trio side: the queue of pending writes, the
  batching writer, and the rule that SQLite is never touched on the event loop.
  Every call into the ``Database`` goes through ``trio.to_thread.run_sync``,
  or, for a batch's write, :class:`gateway.store.answer.QuietAnswer`'s thread
  (``inline=True`` runs it on the loop instead: only for tests under Trio's
  ``MockClock``, whose autojump would otherwise jump while a thread works);
  a ``trio.Lock`` keeps the write connection to one thread at a time, a
  ``trio.CapacityLimiter(1)`` the read connection.

Decisions where the contract is silent:

- A page cursor (``before``) that the store does not know gives an empty page,
  ``([], False)``, rather than an error: the HTTP layer decides what that means.
- The event ceiling reported by :meth:`SqliteStore.open` is the larger of the
  reserved ceiling and the highest stored ``seq``, so an event persisted without
  a reservation can still never be reused.
- A batch holds everything pending when the writer takes it: ``max_batch`` is
  when the writer stops gathering, and puts that arrive during a write join the
  next batch, which may then exceed it.
- ``events`` is also indexed by ``ts`` so that the periodic purge does not scan
  the whole table while it holds the write connection.
- A failed write never loses the batch (docs/protocol.md §9: what a client was
  shown is durable). A transient failure (``SQLITE_BUSY``, a full disk, an I/O
  error: ``sqlite3.OperationalError``) is retried with backoff (0.05 s doubling
  to 5 s) until it lands; everything after it waits, in order. A batch that
  fails because a row breaks a constraint (a gateway bug) is written row by
  row, each refused row logged and skipped, so one bad row costs only itself.
  Any other failure (a corrupt file included) holds the batch and is retried:
  nothing is ever reported committed that is not. Each failure is reported to
  ``on_write_error``; the first write that lands after failed ones is logged
  once (``store_reconnected``: how many attempts failed, over how long), as
  the Redis store does. While writes fail, :attr:`SqliteStore.failure` says
  why (``/readyz`` answers 503 meanwhile). Puts after :meth:`SqliteStore.aclose`
  raise: a write that cannot land must be loud.
- The store is its file (docs/protocol.md §15, "The store is the truth"). The
  identity (``st_dev``, ``st_ino``) of the database file and of its ``-wal``
  is recorded at open and compared in the writer's thread before and after
  every write transaction (two ``os.stat`` calls, microseconds a batch). Should
  either file be gone or another one (an operator's ``rm``, a ``mv`` of another
  database over it), SQLite would go on writing into the unlinked file, which
  a restart never sees: the write is not reported committed (a batch that
  landed in the dead file is not durable), ``store_file_replaced`` is logged
  once, naming the path and what changed, and the store refuses every write
  from then on (:attr:`SqliteStore.refusing`): nothing is committed, requests
  that wait for a commit get 503 ``store_unavailable``, and reads go on from
  the open (dead) file. It never reopens the path by itself, even once a file
  is back there: a file put back is another store (a backup, with lower ids
  and fewer sessions), and taking it is the operator's decision, by a
  restart. The ``-shm`` file is not checked: it is rebuilt from the WAL.
- The daemon's event ids never start below the wall clock in microseconds at
  open (:func:`id_floor`, ``ids_above_clock``): the ceiling a restart resumes
  above is the larger of the stored one and that floor. So ids do not go
  backwards even across a store that was lost (a restart on an empty file),
  as long as the node issued fewer than a million ids a second on average
  (restarts included: each skips the rest of a block of a million), and the
  clock did not step back. (About 1.8e15 today: 20 digits hold it, SQLite's
  64-bit integers until the year 2262; ids are still strictly increasing and
  compared as strings.)
- Writes run on a thread limiter of their own, so a write never queues
  behind other blocking work of the process (file tools, path look-ups).
- ``":memory:"`` is refused: each of the two connections would get its own
  empty database.
"""

from __future__ import annotations

import secrets
import sqlite3
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import trio

from gateway.errors import StoreError
from gateway.store.base import (
    FileRecord,
    FileRefusal,
    SessionRecord,
    StoredEvent,
    StoredMessage,
    StoreState,
)
from gateway.store.group_commit import GroupCommit, WritesRefused
from gateway.store.idempotency import Claim, Claimed
from gateway.store.outbox import Lane, OutboxEntry
from gateway.store.sqlite import files, outbox, requests
from gateway.store.sqlite.batch import SqliteBatch
from gateway.store.sqlite.database import ROW_ERRORS, Database, FileReplaced, insert_new_session
from gateway.store.sqlite.leases import LocalLeases

_T = TypeVar("_T")


def id_floor() -> int:
    """The lowest ceiling a store opens with: the wall clock in microseconds (module docstring)."""
    return time.time_ns() // 1000


class SqliteStore(GroupCommit[SqliteBatch]):
    """The SQLite trace store: implements :class:`gateway.store.base.Store`.

    The group commit is :class:`gateway.store.group_commit.GroupCommit`'s: this
    class applies a batch as one SQLite transaction in a worker thread and
    reads. Reads see only committed data.

    Args:
        path: the database file; its directory must exist.
        flush_interval_s: the longest the writer gathers a batch.
        max_batch: the pending count at which the writer stops gathering.
        inline: run SQLite on the event loop, not in a worker thread (tests
            under ``MockClock`` only: it blocks the loop for every statement).
        ids_above_clock: take event ids above :func:`id_floor` too (module
            docstring; the daemon's store does, through ``open_store``).
    """

    def __init__(
        self,
        path: str,
        *,
        flush_interval_s: float = 0.0,
        max_batch: int = 1000,
        inline: bool = False,
        ids_above_clock: bool = False,
    ) -> None:
        super().__init__(
            f"store {path!r}",
            {"path": path},
            flush_interval_s=flush_interval_s,
            max_batch=max_batch,
        )
        self._path = path
        self._ids_above_clock = ids_above_clock
        self._inline = inline
        self._db: Database | None = None
        self._ceiling = 0  # the top of the last block of event ids allocated
        self._write_limiter = trio.CapacityLimiter(1)  # its own thread: never queued behind others
        self._read_limiter = trio.CapacityLimiter(1)  # the read connection: one thread at a time
        self._process = secrets.token_hex(8)  # this process's idempotency holders

    # --- lifecycle ----------------------------------------------------------

    async def open(self) -> StoreState:
        self._db, state = await self._offload(Database.open, self._path)
        # Never below the clock (module docstring): what the store says stays as
        # it is, the next block is taken above both.
        self._ceiling = max(state.event_ceiling, id_floor() if self._ids_above_clock else 0)
        return state

    async def aclose(self) -> None:
        db = self._db

        async def release() -> None:
            if db is not None:
                async with self._writer():
                    await self._offload(db.close_writer, limiter=self._write_limiter)
                await self._offload(db.close_reader, limiter=self._read_limiter)

        await self._close_writer(release, drain=db is not None)

    # --- writes -------------------------------------------------------------

    def _new_batch(self) -> SqliteBatch:
        return SqliteBatch()

    def reserve_event_ids(self, block: int, granted: Callable[[int], None]) -> None:
        # One node: the next block above the ceiling is this node's at once.
        def take(batch: SqliteBatch) -> None:
            self._ceiling += block
            batch.raise_ceiling(self._ceiling)

        self._enqueue(take)
        granted(self._ceiling)

    def leases(self, node_id: str, ttl_ms: int) -> LocalLeases:
        return LocalLeases(node_id, ttl_ms)

    async def flush(self) -> None:
        self._database()  # a store that is not open says so
        await super().flush()

    async def release_memory(self) -> None:
        db = self._database()
        async with self._writer():
            await self._offload(db.shrink_writer, limiter=self._write_limiter)
        await self._offload(db.shrink_reader, limiter=self._read_limiter)

    async def purge_before(self, ts_ms: int) -> int:
        db = self._database()
        async with self._writer():
            self._check_writable()
            try:
                return await self._offload(db.purge_before, ts_ms, limiter=self._write_limiter)
            except FileReplaced as exc:
                self._refuse(exc)
                raise

    async def delete_sessions(self, session_ids: Sequence[str]) -> None:
        db = self._database()
        await self.flush()  # what was enqueued before lands first: nothing comes back after
        async with self._writer():
            self._check_writable()
            try:
                await self._offload(db.delete_sessions, session_ids, limiter=self._write_limiter)
            except FileReplaced as exc:
                self._refuse(exc)
                raise

    # --- idempotency records (gateway.store.idempotency) ---------------------

    async def insert_session(self, rec: SessionRecord) -> SessionRecord | None:
        return await self._transaction(lambda w: insert_new_session(w, rec))

    async def claim_request(self, owner: str, key: str, claim: Claim, now_ms: int) -> Claimed:
        return await self._transaction(
            lambda w: requests.claim_request(w, owner, key, claim, now_ms, self._process)
        )

    async def settle_request(
        self, owner: str, key: str, holder: str, status: int | None, body: bytes
    ) -> None:
        await self._transaction(
            lambda w: requests.settle_request(w, owner, key, holder, status, body)
        )

    # --- files (gateway.store.sqlite.files) ----------------------------------

    async def put_file(
        self, rec: FileRecord, data: bytes, *, max_per_session: int, owner_quota_bytes: int
    ) -> FileRecord | FileRefusal:
        return await self._transaction(
            lambda w: files.put_file(w, rec, data, max_per_session, owner_quota_bytes)
        )

    async def get_file(self, session_id: str, file_id: str) -> tuple[FileRecord, bytes] | None:
        return await self._read(
            lambda db: db.read(lambda r: files.get_file(r, session_id, file_id))
        )

    async def files_of(self, session_id: str) -> list[FileRecord]:
        return await self._read(lambda db: db.read(lambda r: files.files_of(r, session_id)))

    async def copy_files(self, source_id: str, target_id: str, owner: str) -> None:
        await self._transaction(lambda w: files.copy_files(w, source_id, target_id, owner))

    # --- the webhook outbox (gateway.store.outbox) ----------------------------

    async def outbox_lanes(self) -> list[Lane]:
        return await self._read(lambda db: db.read(outbox.lanes))

    async def outbox_lane(self, lane: Lane, after_seq: int, limit: int) -> list[OutboxEntry]:
        _check_limit(limit)
        return await self._read(
            lambda db: db.read(lambda r: outbox.entries(r, lane, after_seq, limit))
        )

    async def outbox_depth(self) -> int:
        return await self._read(lambda db: db.read(outbox.depth))

    async def outbox_delete(self, done: Sequence[OutboxEntry]) -> None:
        await self._transaction(lambda w: outbox.delete(w, done))

    async def outbox_claim(
        self, lanes: Sequence[Lane], node_id: str, ttl_ms: int, *, renew: bool = False
    ) -> list[Lane]:
        return list(lanes)  # one node: every lane is its own

    async def outbox_release(self, lanes: Sequence[Lane], node_id: str) -> None:
        return None

    async def _transaction(self, action: Callable[[sqlite3.Connection], _T]) -> _T:
        db = self._database()
        async with self._writer():
            self._check_writable()
            try:
                return await self._offload(db.transaction, action, limiter=self._write_limiter)
            except FileReplaced as exc:
                self._refuse(exc)
                raise

    async def _apply(self, batch: SqliteBatch) -> list[str]:
        """One transaction; a batch a row breaks is written row by row (module docstring)."""
        db = self._database()
        try:
            await self._write(db.write, batch)
            return []
        except StoreError as exc:
            if isinstance(exc, WritesRefused) or not isinstance(exc.__cause__, ROW_ERRORS):
                raise
            self._report(exc)  # a row the schema refuses: the rest lands without it
            refused: list[str] = await self._write(db.write_row_by_row, batch)
            return refused

    async def _write(self, fn: Callable[[SqliteBatch], _T], batch: SqliteBatch) -> _T:
        """``fn(batch)`` in the writer's thread, its answer taken quietly unless wanted
        (gateway.store.group_commit's docstring)."""
        if self._inline:
            return await self._offload(fn, batch)
        with self._answer_for(batch) as answer:
            result: _T = await answer.run(
                lambda: fn(batch), limiter=self._write_limiter, name="gateway store write"
            )
            return result

    async def _offload(
        self, fn: Callable[..., _T], *args: Any, limiter: trio.CapacityLimiter | None = None
    ) -> _T:
        if self._inline:
            await trio.lowlevel.checkpoint()
            return fn(*args)
        return await trio.to_thread.run_sync(fn, *args, limiter=limiter)

    # --- reads --------------------------------------------------------------

    async def get_session(self, session_id: str) -> SessionRecord | None:
        return await self._read(lambda db: db.get_session(session_id))

    async def list_sessions(
        self, *, limit: int, before: str | None, visible_to: str | None = None
    ) -> tuple[list[SessionRecord], bool]:
        _check_limit(limit)
        return await self._read(lambda db: db.list_sessions(limit, before, visible_to))

    async def sessions_per_owner(self) -> dict[str, int]:
        return await self._read(lambda db: db.sessions_per_owner())

    async def event_bytes(self, session_id: str) -> int:
        return await self._read(lambda db: db.event_bytes(session_id))

    async def load_messages(self, session_id: str) -> list[StoredMessage]:
        return await self._read(lambda db: db.load_messages(session_id))

    async def open_turns(self) -> list[SessionRecord]:
        return await self._read(lambda db: db.open_turns())

    async def worker_ids(self, parent_id: str) -> list[str]:
        return await self._read(lambda db: db.worker_ids(parent_id))

    async def events_after(
        self, session_ids: Sequence[str], after_seq: int, limit: int
    ) -> list[StoredEvent]:
        _check_limit(limit)
        return await self._read(lambda db: db.events_after(session_ids, after_seq, limit))

    async def _read(self, query: Callable[[Database], _T]) -> _T:
        return await self._offload(query, self._database(), limiter=self._read_limiter)

    def _database(self) -> Database:
        if self._db is None:
            raise StoreError(f"store {self._path!r} is not open")
        return self._db


def _check_limit(limit: int) -> None:
    # SQLite reads a negative LIMIT as "no limit": refuse it rather than return everything.
    if limit < 0:
        raise ValueError(f"limit must be >= 0, not {limit}")

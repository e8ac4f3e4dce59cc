"""The SQL of the SQLite store, synchronous: it knows nothing of Trio.

Two connections, one for writes and one for reads (WAL lets a reader and the
writer run at once); :class:`gateway.store.sqlite.store.SqliteStore` calls each
method in a worker thread. Every write transaction runs on the file opened,
and only there (:meth:`Database.check_files`; why: "The store is its file" in
gateway.store.sqlite.store's docstring).
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

import msgspec

from gateway.errors import StoreError
from gateway.protocol.shapes import Message
from gateway.store.base import SessionRecord, StoredEvent, StoredMessage, StoreState
from gateway.store.group_commit import WritesRefused
from gateway.store.sqlite import files, outbox
from gateway.store.sqlite.batch import (
    INSERT_EVENT,
    INSERT_SESSION,
    SESSION_COLUMNS,
    UPSERT_MESSAGE,
    UPSERT_SESSION,
    SqliteBatch,
    session_record,
    session_row,
)
from gateway.store.sqlite.schema import RAISE_META, prepare_schema, read_meta

BUSY_TIMEOUT_S = 5.0

_T = TypeVar("_T")
# Errors that are one row's fault: that row is skipped. Any other failure (a busy
# or full or corrupt database) holds the whole batch, retried until it lands.
ROW_ERRORS = (sqlite3.IntegrityError, sqlite3.DataError)

# A page of GET /sessions: the filters are in the query, so a page is cut from
# the sessions the caller may see (and ``before`` pages through those alone).
_VISIBLE_TO = "owner IN ('', ?)"
_BEFORE = "(created_at, id) < (SELECT created_at, id FROM sessions WHERE id = ?)"
_PAGE_OF_SESSIONS = f"""
    SELECT {SESSION_COLUMNS} FROM sessions {{where}}
    ORDER BY created_at DESC, id DESC LIMIT ?
"""

_message_decoder = msgspec.json.Decoder(Message)


class FileReplaced(WritesRefused):
    """The store's file was deleted or replaced while the gateway ran (module docstring)."""

    event = "store_file_replaced"


_FileId = tuple[int, int]  # (st_dev, st_ino)


def _file_id(path: str) -> _FileId | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino


class Database:
    """The SQL of the store, synchronous; each method runs in a worker thread."""

    def __init__(self, path: str, writer: sqlite3.Connection, reader: sqlite3.Connection) -> None:
        self._path = path
        self._writer = writer
        self._reader = reader
        # The files this store is (module docstring): the WAL exists once the schema's
        # transaction ran, and no connection of ours deletes it while open.
        opened = {f: _file_id(f) for f in (path, f"{path}-wal")}
        self._files = {f: ident for f, ident in opened.items() if ident is not None}

    def check_files(self) -> None:
        """Raise unless the store's files are still the ones opened (module docstring).

        Raises:
            FileReplaced: naming the path and what changed.
        """
        for name, opened in self._files.items():
            now = _file_id(name)  # os.stat: microseconds, in the writer's thread
            if now != opened:
                what = "deleted" if now is None else "replaced by another file"
                raise FileReplaced(
                    f"store {self._path!r}: {name!r} was {what} while the gateway ran"
                    f" (device and inode {opened} at open, now {now}); no write is taken"
                    " until a restart"
                )

    @contextmanager
    def _in_the_file(self) -> Iterator[None]:
        """A write transaction on the file opened, and only there: checked before and after."""
        self.check_files()
        yield
        self.check_files()  # what landed in an unlinked file is not durable

    @classmethod
    def open(cls, path: str) -> tuple[Database, StoreState]:
        """Open both connections, creating the schema on a new store.

        Raises:
            StoreError: naming the path, for a missing directory, a file that is
                not a SQLite database or not a gateway store, a schema version
                this code does not know, or any other SQLite error.
        """
        if path == ":memory:":
            raise StoreError("cannot open store ':memory:': the store needs a file")
        directory = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(directory):
            raise StoreError(f"cannot open store {path!r}: directory {directory!r} does not exist")
        with _reporting(path, "open"):
            writer = _connect(path)
            try:
                writer.execute("PRAGMA journal_mode = WAL")
                writer.execute("PRAGMA synchronous = NORMAL")
                state = prepare_schema(writer, path)
                reader = _connect(path)
                reader.execute("PRAGMA query_only = ON")
            except BaseException:
                writer.close()
                raise
        return cls(path, writer, reader), state

    def write(self, batch: SqliteBatch) -> None:
        """Apply one batch in one transaction."""
        w = self._writer
        with self._in_the_file(), _reporting(self._path, "write to"), w:
            w.execute("BEGIN IMMEDIATE")
            w.executemany(UPSERT_SESSION, batch.sessions)
            w.executemany(UPSERT_MESSAGE, batch.messages)
            w.executemany(INSERT_EVENT, batch.events)
            w.executemany(outbox.INSERT, batch.deliveries)
            if batch.ceiling is not None:
                w.execute(RAISE_META, ("event_ceiling", batch.ceiling))

    def write_row_by_row(self, batch: SqliteBatch) -> list[str]:
        """Apply one batch in one transaction, skipping each row that fails; the failures.

        The fallback after :meth:`write` failed for a reason other than a
        transient one: one bad row costs only itself (gateway.store.sqlite.store's docstring).
        """
        w = self._writer
        refused: list[str] = []
        statements: list[tuple[str, tuple[Any, ...], str]] = [
            *((UPSERT_SESSION, row, f"session {row[0]}") for row in batch.sessions),
            *((UPSERT_MESSAGE, row, f"message {row[1]} of {row[0]}") for row in batch.messages),
            *((INSERT_EVENT, row, f"event {row[0]} ({row[2]})") for row in batch.events),
            *((outbox.INSERT, row, f"delivery {row[1]} to {row[0]}") for row in batch.deliveries),
        ]
        if batch.ceiling is not None:
            statements.append((RAISE_META, ("event_ceiling", batch.ceiling), "event ceiling"))
        with self._in_the_file(), _reporting(self._path, "write to"), w:
            w.execute("BEGIN IMMEDIATE")
            for sql, args, what in statements:
                w.execute("SAVEPOINT row")
                try:
                    w.execute(sql, args)
                except ROW_ERRORS as exc:
                    w.execute("ROLLBACK TO row")
                    refused.append(f"{what}: {exc}")
                w.execute("RELEASE row")
        return refused

    def shrink_writer(self) -> None:
        """Free the write connection's page cache (:meth:`SqliteStore.release_memory`)."""
        with _reporting(self._path, "shrink the cache of"):
            self._writer.execute("PRAGMA shrink_memory")

    def shrink_reader(self) -> None:
        """Free the read connection's page cache."""
        with _reporting(self._path, "shrink the cache of"):
            self._reader.execute("PRAGMA shrink_memory")

    def open_turns(self) -> list[SessionRecord]:
        """Sessions whose turn was in flight, or with queued turns, when the store was last
        written (docs/protocol.md §9, §2 "A busy session")."""
        sql = (
            f"SELECT {SESSION_COLUMNS} FROM sessions"
            " WHERE current_turn_id IS NOT NULL OR queued_turns != x'5b5d'"
        )
        with _reporting(self._path, "read"):
            rows = self._reader.execute(sql).fetchall()
        return [session_record(row) for row in rows]

    def worker_ids(self, parent_id: str) -> list[str]:
        sql = "SELECT id FROM sessions WHERE parent_session_id = ? ORDER BY created_at, id"
        with _reporting(self._path, "read"):
            rows = self._reader.execute(sql, (parent_id,)).fetchall()
        return [sid for (sid,) in rows]

    def purge_before(self, ts_ms: int) -> int:
        w = self._writer
        with self._in_the_file(), _reporting(self._path, "purge"), w:
            w.execute("BEGIN IMMEDIATE")
            (highest,) = w.execute("SELECT max(seq) FROM events WHERE ts < ?", (ts_ms,)).fetchone()
            if highest is not None:
                w.execute("DELETE FROM events WHERE ts < ?", (ts_ms,))
                w.execute(RAISE_META, ("retention_floor", highest))
            return read_meta(w, "retention_floor")

    def delete_sessions(self, session_ids: Sequence[str]) -> None:
        """Delete the sessions' rows, their messages', events' and files', in one transaction."""
        w = self._writer
        rows = [(sid,) for sid in session_ids]
        with self._in_the_file(), _reporting(self._path, "delete"), w:
            w.execute("BEGIN IMMEDIATE")
            w.executemany("DELETE FROM events WHERE session_id = ?", rows)
            w.executemany("DELETE FROM messages WHERE session_id = ?", rows)
            w.executemany("DELETE FROM sessions WHERE id = ?", rows)
            files.delete_files(w, list(session_ids))

    def transaction(self, action: Callable[[sqlite3.Connection], _T]) -> _T:
        """``action`` in one write transaction of its own (idempotency records)."""
        w = self._writer
        with self._in_the_file(), _reporting(self._path, "write to"), w:
            w.execute("BEGIN IMMEDIATE")
            return action(w)

    def read(self, query: Callable[[sqlite3.Connection], _T]) -> _T:
        """``query`` on the read connection (the webhook outbox's)."""
        with _reporting(self._path, "read"):
            return query(self._reader)

    def get_session(self, session_id: str) -> SessionRecord | None:
        with _reporting(self._path, "read"):
            sql = f"SELECT {SESSION_COLUMNS} FROM sessions WHERE id = ?"
            row = self._reader.execute(sql, (session_id,)).fetchone()
        return None if row is None else session_record(row)

    def list_sessions(
        self, limit: int, before: str | None, visible_to: str | None
    ) -> tuple[list[SessionRecord], bool]:
        where: list[str] = []
        args: list[Any] = []
        if visible_to is not None:
            where.append(_VISIBLE_TO)
            args.append(visible_to)
        if before is not None:
            where.append(_BEFORE)
            args.append(before)
        sql = _PAGE_OF_SESSIONS.format(where=f"WHERE {' AND '.join(where)}" if where else "")
        with _reporting(self._path, "read"):
            rows = self._reader.execute(sql, (*args, limit + 1)).fetchall()
        return [session_record(row) for row in rows[:limit]], len(rows) > limit

    def sessions_per_owner(self) -> dict[str, int]:
        sql = """
            SELECT owner, count(*) FROM sessions GROUP BY owner
        """
        with _reporting(self._path, "read"):
            rows = self._reader.execute(sql).fetchall()
        return {owner: count for owner, count in rows}

    def event_bytes(self, session_id: str) -> int:
        sql = "SELECT coalesce(sum(length(data)), 0) FROM events WHERE session_id = ?"
        with _reporting(self._path, "read"):
            (size,) = self._reader.execute(sql, (session_id,)).fetchone()
        return int(size)

    def load_messages(self, session_id: str) -> list[StoredMessage]:
        sql = """
            SELECT data, complete_event_id, stop_reason, complete_ts FROM messages
            WHERE session_id = ? ORDER BY ord
        """
        with _reporting(self._path, "read"):
            rows = self._reader.execute(sql, (session_id,)).fetchall()
        return [
            StoredMessage(_message_decoder.decode(data), event_id, stop_reason, complete_ts)
            for data, event_id, stop_reason, complete_ts in rows
        ]

    def events_after(
        self, session_ids: Sequence[str], after_seq: int, limit: int
    ) -> list[StoredEvent]:
        marks = ", ".join("?" * len(session_ids))
        sql = f"""
            SELECT seq, session_id, type, ts, data FROM events
            WHERE session_id IN ({marks}) AND seq > ?
            ORDER BY seq LIMIT ?
        """
        with _reporting(self._path, "read"):
            rows = self._reader.execute(sql, (*session_ids, after_seq, limit)).fetchall()
        return [
            StoredEvent(seq=seq, session_id=session_id, type=type_, ts=ts, data=data)
            for seq, session_id, type_, ts, data in rows
        ]

    def close_writer(self) -> None:
        self._writer.close()

    def close_reader(self) -> None:
        self._reader.close()


@contextmanager
def _reporting(path: str, action: str) -> Iterator[None]:
    """Turn a SQLite error into a StoreError naming the path and what was being done."""
    try:
        yield
    except sqlite3.Error as exc:
        raise StoreError(f"cannot {action} store {path!r}: {exc}") from exc


def _connect(path: str) -> sqlite3.Connection:
    # isolation_level=None: no implicit transactions; writes say BEGIN themselves.
    return sqlite3.connect(
        path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False
    )


def insert_new_session(w: sqlite3.Connection, rec: SessionRecord) -> SessionRecord | None:
    """Insert ``rec`` unless its id has a row; that row if it has (Store.insert_session)."""
    if w.execute(INSERT_SESSION, session_row(rec)).rowcount:
        return None
    found = w.execute(f"SELECT {SESSION_COLUMNS} FROM sessions WHERE id = ?", (rec.id,))
    return session_record(found.fetchone())

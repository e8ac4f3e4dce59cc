"""The trace store's embedded SQLite backend (docs/reference.md ``[store] backend = "sqlite"``).

Two layers:

- :class:`_Database` is plain synchronous SQL over two connections, one for
  writes and one for reads (WAL lets a reader and the writer run at once). It
  knows nothing of Trio.
- :class:`SqliteStore` is the Trio side: the queue of pending writes, the
  batching writer, and the rule that SQLite is never touched on the event loop.
  Every call into :class:`_Database` goes through ``trio.to_thread.run_sync``
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

import logging
import os
import secrets
import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

import msgspec
import trio

from gateway.errors import StoreError
from gateway.protocol.shapes import Message
from gateway.store.base import SessionRecord, StoredEvent, StoredMessage, StoreState
from gateway.store.group_commit import Batch, GroupCommit, WritesRefused
from gateway.store.idempotency import Claim, Claimed
from gateway.store.outbox import Lane, OutboxEntry
from gateway.store.sqlite import outbox, requests
from gateway.store.sqlite.leases import LocalLeases

SCHEMA_VERSION = 4
BUSY_TIMEOUT_S = 5.0

_T = TypeVar("_T")
log = logging.getLogger("gateway.store")
# Errors that are one row's fault: that row is skipped. Any other failure (a busy
# or full or corrupt database) holds the whole batch, retried until it lands.
_ROW_ERRORS = (sqlite3.IntegrityError, sqlite3.DataError)

# Version 2 (docs/protocol.md §9): a session remembers the turn in flight, so a
# restart finds the turns to close without scanning events; workers are found
# by their parent.
_V2_INDEXES = (
    "CREATE INDEX sessions_by_parent ON sessions (parent_session_id)"
    " WHERE parent_session_id IS NOT NULL",
    "CREATE INDEX sessions_in_flight ON sessions (id) WHERE current_turn_id IS NOT NULL",
)
_MIGRATE_1_TO_2 = (
    "ALTER TABLE sessions ADD COLUMN current_turn_id TEXT",
    "ALTER TABLE sessions ADD COLUMN current_turn_seq INTEGER NOT NULL DEFAULT 0",
    *_V2_INDEXES,
    # The turns a version-1 gateway left in flight: a session's last turn event is turn.started.
    """UPDATE sessions SET
        current_turn_id = (SELECT json_extract(CAST(e.data AS TEXT), '$.turn_id') FROM events e
                           WHERE e.session_id = sessions.id AND e.type IN
                             ('turn.started', 'turn.completed', 'turn.cancelled')
                           ORDER BY e.seq DESC LIMIT 1),
        current_turn_seq = (SELECT e.seq FROM events e
                            WHERE e.session_id = sessions.id AND e.type IN
                              ('turn.started', 'turn.completed', 'turn.cancelled')
                            ORDER BY e.seq DESC LIMIT 1)
    """,
    """UPDATE sessions SET current_turn_id = NULL, current_turn_seq = 0
       WHERE current_turn_seq IS NULL OR (SELECT type FROM events WHERE seq = current_turn_seq)
             != 'turn.started'
    """,
)

# Version 3 (docs/protocol.md §2): a session belongs to the key that created it.
# ``owner`` is the key's id (gateway.server.auth.key_id), never the key; "" for
# the sessions made without keys, which every key sees (so every version-2
# session, made before owners existed, stays visible as it was).
_V3_INDEXES = ("CREATE INDEX sessions_by_owner ON sessions (owner, created_at, id)",)
_MIGRATE_2_TO_3 = (
    "ALTER TABLE sessions ADD COLUMN owner TEXT NOT NULL DEFAULT ''",
    *_V3_INDEXES,
)

# Version 4 (docs/protocol.md §11): a session runs the agent it was created with;
# the sessions of earlier versions ran the default agent.
_MIGRATE_3_TO_4 = ("ALTER TABLE sessions ADD COLUMN agent TEXT NOT NULL DEFAULT 'default'",)

_SCHEMA = (
    "CREATE TABLE meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL)",
    """CREATE TABLE sessions (
        id TEXT PRIMARY KEY,
        created_at INTEGER NOT NULL,
        workspace_path TEXT NOT NULL,
        active_model TEXT NOT NULL,
        metadata BLOB NOT NULL,
        parent_session_id TEXT,
        routing_policy_version TEXT NOT NULL,
        cost_so_far_usd REAL NOT NULL,
        turn_count INTEGER NOT NULL,
        current_turn_id TEXT,
        current_turn_seq INTEGER NOT NULL DEFAULT 0,
        owner TEXT NOT NULL DEFAULT '',
        agent TEXT NOT NULL DEFAULT 'default'
    )""",
    "CREATE INDEX sessions_by_age ON sessions (created_at, id)",
    *_V2_INDEXES,
    *_V3_INDEXES,
    # ord is the insertion order: message ids are random or the provider's own.
    """CREATE TABLE messages (
        ord INTEGER PRIMARY KEY,
        session_id TEXT NOT NULL,
        id TEXT NOT NULL,
        data BLOB NOT NULL,
        complete_event_id TEXT,
        stop_reason TEXT,
        complete_ts INTEGER,
        UNIQUE (session_id, id)
    )""",
    "CREATE INDEX messages_by_session ON messages (session_id, ord)",
    """CREATE TABLE events (
        seq INTEGER PRIMARY KEY,
        session_id TEXT NOT NULL,
        type TEXT NOT NULL,
        ts INTEGER NOT NULL,
        data BLOB NOT NULL
    )""",
    "CREATE INDEX events_by_session ON events (session_id, seq)",
    "CREATE INDEX events_by_ts ON events (ts)",
)

_SESSION_COLUMNS = (
    "id, created_at, workspace_path, active_model, metadata, parent_session_id,"
    " routing_policy_version, cost_so_far_usd, turn_count, current_turn_id, current_turn_seq,"
    " owner, agent"
)
_UPSERT_SESSION = f"""
    INSERT INTO sessions ({_SESSION_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
    ON CONFLICT (id) DO UPDATE SET
        created_at = excluded.created_at,
        workspace_path = excluded.workspace_path,
        active_model = excluded.active_model,
        metadata = excluded.metadata,
        parent_session_id = excluded.parent_session_id,
        routing_policy_version = excluded.routing_policy_version,
        cost_so_far_usd = excluded.cost_so_far_usd,
        turn_count = excluded.turn_count,
        current_turn_id = excluded.current_turn_id,
        current_turn_seq = excluded.current_turn_seq,
        agent = excluded.agent
    WHERE sessions.owner = excluded.owner
"""
# A session's owner is its own from its first write: the upsert above never
# changes it (another owner's row is left whole), and a new session named by
# its client is inserted only where no row has its id (Store.insert_session),
# one transaction that tells which.
_INSERT_SESSION = _UPSERT_SESSION.split("ON CONFLICT")[0] + "ON CONFLICT (id) DO NOTHING"
# An upsert keeps the row, hence its ord: a rewritten message keeps its place.
_UPSERT_MESSAGE = """
    INSERT INTO messages (session_id, id, data, complete_event_id, stop_reason, complete_ts)
    VALUES (?, ?, ?, ?, ?, ?)
    ON CONFLICT (session_id, id) DO UPDATE SET
        data = excluded.data,
        complete_event_id = excluded.complete_event_id,
        stop_reason = excluded.stop_reason,
        complete_ts = excluded.complete_ts
"""
_INSERT_EVENT = "INSERT INTO events (seq, session_id, type, ts, data) VALUES (?, ?, ?, ?, ?)"
# The event ceiling and the retention floor only ever grow.
_RAISE_META = """
    INSERT INTO meta (key, value) VALUES (?, ?)
    ON CONFLICT (key) DO UPDATE SET value = max(value, excluded.value)
"""
# A page of GET /sessions: the filters are in the query, so a page is cut from
# the sessions the caller may see (and ``before`` pages through those alone).
_VISIBLE_TO = "owner IN ('', ?)"
_BEFORE = "(created_at, id) < (SELECT created_at, id FROM sessions WHERE id = ?)"
_PAGE_OF_SESSIONS = f"""
    SELECT {_SESSION_COLUMNS} FROM sessions {{where}}
    ORDER BY created_at DESC, id DESC LIMIT ?
"""
# The message still streaming (stored in_progress as its blocks end, PROTOCOL
# section 9) is not listed: it is in the snapshot.
_LISTED = "json_extract(CAST(data AS TEXT), '$.status') != 'in_progress'"
_LATEST_MESSAGES = f"""
    SELECT data FROM messages WHERE session_id = ? AND {_LISTED}
    ORDER BY ord DESC LIMIT ?
"""
_MESSAGES_BEFORE = f"""
    SELECT data FROM messages
    WHERE session_id = ? AND {_LISTED}
      AND ord < (SELECT ord FROM messages WHERE session_id = ? AND id = ?)
    ORDER BY ord DESC LIMIT ?
"""

_encoder = msgspec.json.Encoder()
_message_decoder = msgspec.json.Decoder(Message)
_metadata_decoder = msgspec.json.Decoder(dict[str, Any])

_SessionRow = tuple[
    str, int, str, str, bytes, str | None, str, float, int, str | None, int, str, str
]
_MessageRow = tuple[str, str, bytes, str | None, str | None, int | None]
_EventRow = tuple[int, str, str, int, bytes]


class _Batch(Batch):
    """The SQLite rows of a batch (:class:`gateway.store.group_commit.Batch`)."""

    def __init__(self) -> None:
        super().__init__()
        self.sessions: list[_SessionRow] = []
        self.messages: list[_MessageRow] = []
        self.events: list[_EventRow] = []
        self.deliveries: list[outbox.OutboxRow] = []

    def rows(self) -> tuple[list[Any], ...]:
        return (self.sessions, self.messages, self.events, self.deliveries)

    def add_session(self, rec: SessionRecord) -> None:
        self.sessions.append(_session_row(rec))
        self.size += 1

    def add_message(self, msg: StoredMessage) -> int:
        m = msg.message
        data = _encoder.encode(m)
        self.messages.append(
            (m.session_id, m.id, data, msg.complete_event_id, msg.stop_reason, msg.complete_ts)
        )
        self.size += 1
        return len(data)

    def add_event(self, ev: StoredEvent) -> None:
        self.events.append((ev.seq, ev.session_id, ev.type, ev.ts, ev.data))
        self.size += 1

    def add_outbox(self, hook: str, ev: StoredEvent) -> None:
        self.deliveries.append((hook, ev.seq, ev.session_id, ev.data))
        self.outbox += 1


class _FileReplaced(WritesRefused):
    """The store's file was deleted or replaced while the gateway ran (module docstring)."""

    event = "store_file_replaced"


def id_floor() -> int:
    """The lowest ceiling a store opens with: the wall clock in microseconds (module docstring)."""
    return time.time_ns() // 1000


_FileId = tuple[int, int]  # (st_dev, st_ino)


def _file_id(path: str) -> _FileId | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino


class _Database:
    """The SQL of the store, synchronous; each method runs in a worker thread."""

    def __init__(self, path: str, writer: sqlite3.Connection, reader: sqlite3.Connection) -> None:
        self._path = path
        self._writer = writer
        self._reader = reader
        # The files this store is (module docstring): the WAL exists once the
        # schema's transaction ran, and no connection of ours deletes it while open.
        opened = {f: _file_id(f) for f in (path, f"{path}-wal")}
        self._files = {f: ident for f, ident in opened.items() if ident is not None}

    def check_files(self) -> None:
        """Raise unless the store's files are still the ones opened (module docstring).

        Raises:
            _FileReplaced: naming the path and what changed.
        """
        for name, opened in self._files.items():
            now = _file_id(name)  # os.stat: microseconds, in the writer's thread
            if now != opened:
                what = "deleted" if now is None else "replaced by another file"
                raise _FileReplaced(
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
    def open(cls, path: str) -> tuple[_Database, StoreState]:
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
                state = _prepare_schema(writer, path)
                reader = _connect(path)
                reader.execute("PRAGMA query_only = ON")
            except BaseException:
                writer.close()
                raise
        return cls(path, writer, reader), state

    def write(self, batch: _Batch) -> None:
        """Apply one batch in one transaction."""
        w = self._writer
        with self._in_the_file(), _reporting(self._path, "write to"), w:
            w.execute("BEGIN IMMEDIATE")
            w.executemany(_UPSERT_SESSION, batch.sessions)
            w.executemany(_UPSERT_MESSAGE, batch.messages)
            w.executemany(_INSERT_EVENT, batch.events)
            w.executemany(outbox.INSERT, batch.deliveries)
            if batch.ceiling is not None:
                w.execute(_RAISE_META, ("event_ceiling", batch.ceiling))

    def write_row_by_row(self, batch: _Batch) -> list[str]:
        """Apply one batch in one transaction, skipping each row that fails; the failures.

        The fallback after :meth:`write` failed for a reason other than a
        transient one: one bad row costs only itself (module docstring).
        """
        w = self._writer
        refused: list[str] = []
        statements: list[tuple[str, tuple[Any, ...], str]] = [
            *((_UPSERT_SESSION, row, f"session {row[0]}") for row in batch.sessions),
            *((_UPSERT_MESSAGE, row, f"message {row[1]} of {row[0]}") for row in batch.messages),
            *((_INSERT_EVENT, row, f"event {row[0]} ({row[2]})") for row in batch.events),
            *((outbox.INSERT, row, f"delivery {row[1]} to {row[0]}") for row in batch.deliveries),
        ]
        if batch.ceiling is not None:
            statements.append((_RAISE_META, ("event_ceiling", batch.ceiling), "event ceiling"))
        with self._in_the_file(), _reporting(self._path, "write to"), w:
            w.execute("BEGIN IMMEDIATE")
            for sql, args, what in statements:
                w.execute("SAVEPOINT row")
                try:
                    w.execute(sql, args)
                except _ROW_ERRORS as exc:
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
        """Sessions whose turn was in flight when the store was last written (section 9)."""
        sql = f"SELECT {_SESSION_COLUMNS} FROM sessions WHERE current_turn_id IS NOT NULL"
        with _reporting(self._path, "read"):
            rows = self._reader.execute(sql).fetchall()
        return [_session_record(row) for row in rows]

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
                w.execute(_RAISE_META, ("retention_floor", highest))
            return _meta(w, "retention_floor")

    def delete_sessions(self, session_ids: Sequence[str]) -> None:
        """Delete the sessions' rows, their messages' and events', in one transaction."""
        w = self._writer
        rows = [(sid,) for sid in session_ids]
        with self._in_the_file(), _reporting(self._path, "delete"), w:
            w.execute("BEGIN IMMEDIATE")
            w.executemany("DELETE FROM events WHERE session_id = ?", rows)
            w.executemany("DELETE FROM messages WHERE session_id = ?", rows)
            w.executemany("DELETE FROM sessions WHERE id = ?", rows)

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
            sql = f"SELECT {_SESSION_COLUMNS} FROM sessions WHERE id = ?"
            row = self._reader.execute(sql, (session_id,)).fetchone()
        return None if row is None else _session_record(row)

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
        return [_session_record(row) for row in rows[:limit]], len(rows) > limit

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


def _prepare_schema(conn: sqlite3.Connection, path: str) -> StoreState:
    """Create the schema in an empty database, or check an existing one's version."""
    with conn:
        conn.execute("BEGIN IMMEDIATE")
        tables = {
            name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        }
        if not tables:
            for statement in _SCHEMA:
                conn.execute(statement)
            conn.execute(_RAISE_META, ("schema_version", SCHEMA_VERSION))
        elif "meta" not in tables:
            raise StoreError(f"cannot open store {path!r}: a SQLite database, not a gateway store")
        version = _meta(conn, "schema_version")
        if version == 1:  # earlier releases' stores are upgraded in place, one step at a time
            for statement in _MIGRATE_1_TO_2:
                conn.execute(statement)
            conn.execute(_RAISE_META, ("schema_version", 2))
            version = 2
        if version == 2:
            for statement in _MIGRATE_2_TO_3:
                conn.execute(statement)
            conn.execute(_RAISE_META, ("schema_version", 3))
            version = 3
        if version == 3:
            for statement in _MIGRATE_3_TO_4:
                conn.execute(statement)
            conn.execute(_RAISE_META, ("schema_version", 4))
            version = 4
        if version != SCHEMA_VERSION:
            raise StoreError(
                f"cannot open store {path!r}: schema version {version},"
                f" this gateway reads version {SCHEMA_VERSION}"
            )
        for statement in (*requests.SCHEMA, *outbox.SCHEMA):  # tables of their own
            conn.execute(statement)
        (highest_seq,) = conn.execute("SELECT coalesce(max(seq), 0) FROM events").fetchone()
        return StoreState(
            event_ceiling=max(_meta(conn, "event_ceiling"), highest_seq),
            retention_floor=_meta(conn, "retention_floor"),
        )


def _meta(conn: sqlite3.Connection, key: str) -> int:
    row = conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
    return 0 if row is None else int(row[0])


def _session_row(rec: SessionRecord) -> _SessionRow:
    return (
        rec.id,
        rec.created_at,
        rec.workspace_path,
        rec.active_model,
        _encoder.encode(rec.metadata),
        rec.parent_session_id,
        rec.routing_policy_version,
        rec.cost_so_far_usd,
        rec.turn_count,
        rec.current_turn_id,
        rec.current_turn_seq,
        rec.owner,
        rec.agent,
    )


def _insert_session(w: sqlite3.Connection, rec: SessionRecord) -> SessionRecord | None:
    """Insert ``rec`` unless its id has a row; that row if it has (Store.insert_session)."""
    if w.execute(_INSERT_SESSION, _session_row(rec)).rowcount:
        return None
    found = w.execute(f"SELECT {_SESSION_COLUMNS} FROM sessions WHERE id = ?", (rec.id,))
    return _session_record(found.fetchone())


def _session_record(row: tuple[Any, ...]) -> SessionRecord:
    (id_, created, workspace, model, metadata, parent, policy, cost, turns, turn_id, seq, owner,
     agent) = row  # fmt: skip
    return SessionRecord(
        id=id_,
        created_at=created,
        workspace_path=workspace,
        active_model=model,
        metadata=_metadata_decoder.decode(metadata),
        parent_session_id=parent,
        routing_policy_version=policy,
        cost_so_far_usd=cost,
        turn_count=turns,
        current_turn_id=turn_id,
        current_turn_seq=seq,
        owner=owner,
        agent=agent,
    )


class SqliteStore(GroupCommit[_Batch]):
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
        self._db: _Database | None = None
        self._ceiling = 0  # the top of the last block of event ids allocated
        self._write_limiter = trio.CapacityLimiter(1)  # its own thread: never queued behind others
        self._read_limiter = trio.CapacityLimiter(1)  # the read connection: one thread at a time
        self._process = secrets.token_hex(8)  # this process's idempotency holders

    # --- lifecycle ----------------------------------------------------------

    async def open(self) -> StoreState:
        self._db, state = await self._offload(_Database.open, self._path)
        # Never below the clock (module docstring): what the store says stays as
        # it is, the next block is taken above both.
        self._ceiling = max(state.event_ceiling, id_floor() if self._ids_above_clock else 0)
        return state

    async def aclose(self) -> None:
        db = self._db

        async def release() -> None:
            if db is not None:
                async with self._write_lock:
                    await self._offload(db.close_writer, limiter=self._write_limiter)
                await self._offload(db.close_reader, limiter=self._read_limiter)

        await self._close_writer(release, drain=db is not None)

    # --- writes -------------------------------------------------------------

    def _new_batch(self) -> _Batch:
        return _Batch()

    def reserve_event_ids(self, block: int, granted: Callable[[int], None]) -> None:
        # One node: the next block above the ceiling is this node's at once.
        def take(batch: _Batch) -> None:
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
        async with self._write_lock:
            await self._offload(db.shrink_writer, limiter=self._write_limiter)
        await self._offload(db.shrink_reader, limiter=self._read_limiter)

    async def purge_before(self, ts_ms: int) -> int:
        db = self._database()
        async with self._write_lock:
            self._check_writable()
            try:
                return await self._offload(db.purge_before, ts_ms, limiter=self._write_limiter)
            except _FileReplaced as exc:
                self._refuse(exc)
                raise

    async def delete_sessions(self, session_ids: Sequence[str]) -> None:
        db = self._database()
        await self.flush()  # what was enqueued before lands first: nothing comes back after
        async with self._write_lock:
            self._check_writable()
            try:
                await self._offload(db.delete_sessions, session_ids, limiter=self._write_limiter)
            except _FileReplaced as exc:
                self._refuse(exc)
                raise

    # --- idempotency records (gateway.store.idempotency) ---------------------

    async def insert_session(self, rec: SessionRecord) -> SessionRecord | None:
        return await self._transaction(lambda w: _insert_session(w, rec))

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
        async with self._write_lock:
            self._check_writable()
            try:
                return await self._offload(db.transaction, action, limiter=self._write_limiter)
            except _FileReplaced as exc:
                self._refuse(exc)
                raise

    async def _apply(self, batch: _Batch) -> list[str]:
        """One transaction; a batch a row breaks is written row by row (module docstring)."""
        db = self._database()
        try:
            await self._offload(db.write, batch, limiter=self._write_limiter)
            return []
        except StoreError as exc:
            if isinstance(exc, WritesRefused) or not isinstance(exc.__cause__, _ROW_ERRORS):
                raise
            self._report(exc)  # a row the schema refuses: the rest lands without it
            return await self._offload(db.write_row_by_row, batch, limiter=self._write_limiter)

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

    async def _read(self, query: Callable[[_Database], _T]) -> _T:
        return await self._offload(query, self._database(), limiter=self._read_limiter)

    def _database(self) -> _Database:
        if self._db is None:
            raise StoreError(f"store {self._path!r} is not open")
        return self._db


def _check_limit(limit: int) -> None:
    # SQLite reads a negative LIMIT as "no limit": refuse it rather than return everything.
    if limit < 0:
        raise ValueError(f"limit must be >= 0, not {limit}")

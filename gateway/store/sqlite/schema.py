"""The SQLite store's tables, and the migrations of the stores earlier releases wrote.

:func:`prepare_schema` creates the schema in an empty database, upgrades an
older one in place, one version at a time, and reads the two numbers the
store opens with (:class:`gateway.store.base.StoreState`).
"""

from __future__ import annotations

import sqlite3

from gateway.errors import StoreError
from gateway.store.base import StoreState
from gateway.store.sqlite import files, outbox, requests

SCHEMA_VERSION = 6

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
# ``owner`` is the key's id (gateway.tenancy.key_id), never the key; "" for
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

# Version 5 (docs/protocol.md §2 "A busy session", "Edit and regenerate"): a
# session keeps its queued turns and its edits; a restart finds the sessions
# with queued turns as it finds those with a turn in flight.
_V5_INDEXES = ("CREATE INDEX sessions_queued ON sessions (id) WHERE queued_turns != x'5b5d'",)
_MIGRATE_4_TO_5 = (
    "ALTER TABLE sessions ADD COLUMN queued_turns BLOB NOT NULL DEFAULT x'5b5d'",
    "ALTER TABLE sessions ADD COLUMN rewinds BLOB NOT NULL DEFAULT x'5b5d'",
    *_V5_INDEXES,
)

# Version 6 (docs/doors/a2a.md "Push notifications"): a session keeps its tasks' push configs.
_MIGRATE_5_TO_6 = ("ALTER TABLE sessions ADD COLUMN push_configs BLOB NOT NULL DEFAULT x'5b5d'",)

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
        agent TEXT NOT NULL DEFAULT 'default',
        queued_turns BLOB NOT NULL DEFAULT x'5b5d',
        rewinds BLOB NOT NULL DEFAULT x'5b5d',
        push_configs BLOB NOT NULL DEFAULT x'5b5d'
    )""",
    "CREATE INDEX sessions_by_age ON sessions (created_at, id)",
    *_V2_INDEXES,
    *_V3_INDEXES,
    *_V5_INDEXES,
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

# The event ceiling and the retention floor only ever grow.
RAISE_META = """
    INSERT INTO meta (key, value) VALUES (?, ?)
    ON CONFLICT (key) DO UPDATE SET value = max(value, excluded.value)
"""


def prepare_schema(conn: sqlite3.Connection, path: str) -> StoreState:
    """Create the schema in an empty database, or check an existing one's version."""
    with conn:
        conn.execute("BEGIN IMMEDIATE")
        tables = {
            name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        }
        if not tables:
            for statement in _SCHEMA:
                conn.execute(statement)
            conn.execute(RAISE_META, ("schema_version", SCHEMA_VERSION))
        elif "meta" not in tables:
            raise StoreError(f"cannot open store {path!r}: a SQLite database, not a gateway store")
        version = read_meta(conn, "schema_version")
        if version == 1:  # earlier releases' stores are upgraded in place, one step at a time
            for statement in _MIGRATE_1_TO_2:
                conn.execute(statement)
            conn.execute(RAISE_META, ("schema_version", 2))
            version = 2
        if version == 2:
            for statement in _MIGRATE_2_TO_3:
                conn.execute(statement)
            conn.execute(RAISE_META, ("schema_version", 3))
            version = 3
        if version == 3:
            for statement in _MIGRATE_3_TO_4:
                conn.execute(statement)
            conn.execute(RAISE_META, ("schema_version", 4))
            version = 4
        if version == 4:
            for statement in _MIGRATE_4_TO_5:
                conn.execute(statement)
            conn.execute(RAISE_META, ("schema_version", 5))
            version = 5
        if version == 5:
            for statement in _MIGRATE_5_TO_6:
                conn.execute(statement)
            conn.execute(RAISE_META, ("schema_version", 6))
            version = 6
        if version != SCHEMA_VERSION:
            raise StoreError(
                f"cannot open store {path!r}: schema version {version},"
                f" this gateway reads version {SCHEMA_VERSION}"
            )
        for statement in (*requests.SCHEMA, *outbox.SCHEMA, *files.SCHEMA):  # tables of their own
            conn.execute(statement)
        files.sweep(conn)  # a fork's copies a crash kept from their record
        (highest_seq,) = conn.execute("SELECT coalesce(max(seq), 0) FROM events").fetchone()
        return StoreState(
            event_ceiling=max(read_meta(conn, "event_ceiling"), highest_seq),
            retention_floor=read_meta(conn, "retention_floor"),
        )


def read_meta(conn: sqlite3.Connection, key: str) -> int:
    row = conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
    return 0 if row is None else int(row[0])

"""The webhook outbox: deliveries owed to receivers, durable (docs/protocol.md §14).

A catalog event that a configured webhook subscribes to is put in the outbox
in the same write as the event itself (the group commit's batch: one SQLite
transaction, one Redis ``MULTI``/``EXEC``), so a kill -9 between the commit
and the delivery loses nothing: the delivery loop (:mod:`gateway.webhooks`)
reads what is pending after a restart and carries on. An entry holds a copy of
the event's wire JSON, so a retention purge or a ``DELETE`` of the session
does not take a delivery owed away; it leaves the outbox once delivered, or
once dropped after the webhook's ``max_attempts``.

:data:`Routes` is how the store knows which events go there: event type ->
the names of the webhooks that want it, set once before the first write.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping, Sequence

import msgspec

Routes = Mapping[str, tuple[str, ...]]
"""Event type -> the webhooks (their ``[webhooks.NAME]``) that are sent it."""


class OutboxEntry(msgspec.Struct, frozen=True):
    """One delivery owed: event ``seq`` of ``session_id`` to webhook ``hook``."""

    hook: str
    seq: int
    session_id: str
    data: bytes  # the event's wire JSON, the POST's body


OutboxRow = tuple[str, int, str, bytes]  # (hook, seq, session_id, data)

Lane = tuple[str, str]
"""(webhook, session id): the deliveries that go one at a time, in event order."""

SQLITE_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS outbox (
        hook TEXT NOT NULL,
        session_id TEXT NOT NULL,
        seq INTEGER NOT NULL,
        data BLOB NOT NULL,
        PRIMARY KEY (hook, session_id, seq)
    ) WITHOUT ROWID""",
)
"""Added to any store when it opens: a table an older gateway never reads."""

SQLITE_INSERT = "INSERT OR IGNORE INTO outbox (hook, seq, session_id, data) VALUES (?, ?, ?, ?)"


def sqlite_lanes(conn: sqlite3.Connection) -> list[Lane]:
    """Every lane with a delivery pending (read from the primary key alone)."""
    rows = conn.execute("SELECT DISTINCT hook, session_id FROM outbox").fetchall()
    return [(hook, sid) for hook, sid in rows]


def sqlite_lane(
    conn: sqlite3.Connection, lane: Lane, after_seq: int, limit: int
) -> list[OutboxEntry]:
    """The lane's deliveries after ``after_seq``, in event order, at most ``limit``."""
    sql = """
        SELECT seq, data FROM outbox WHERE hook = ? AND session_id = ? AND seq > ?
        ORDER BY seq LIMIT ?
    """
    rows = conn.execute(sql, (*lane, after_seq, limit)).fetchall()
    return [OutboxEntry(lane[0], seq, lane[1], data) for seq, data in rows]


def sqlite_depth(conn: sqlite3.Connection) -> int:
    (count,) = conn.execute("SELECT count(*) FROM outbox").fetchone()
    return int(count)


def sqlite_delete(conn: sqlite3.Connection, done: Sequence[OutboxEntry]) -> None:
    """Delete the entries ``done``; one already gone is no error."""
    sql = "DELETE FROM outbox WHERE hook = ? AND session_id = ? AND seq = ?"
    conn.executemany(sql, [(e.hook, e.session_id, e.seq) for e in done])

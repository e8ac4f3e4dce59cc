"""The webhook outbox on SQLite (gateway.store.outbox, docs/doors/webhooks.md).

A table of its own, ``outbox``, written in the transaction of the batch that
holds the event (the group commit's), read and emptied by the delivery loop
through the store's ``outbox_*`` methods. One node: every lane
is its own, nothing is claimed.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

from gateway.store.outbox import Lane, OutboxEntry

OutboxRow = tuple[str, int, str, bytes]  # (hook, seq, session_id, data)

SCHEMA = (
    """CREATE TABLE IF NOT EXISTS outbox (
        hook TEXT NOT NULL,
        session_id TEXT NOT NULL,
        seq INTEGER NOT NULL,
        data BLOB NOT NULL,
        PRIMARY KEY (hook, session_id, seq)
    ) WITHOUT ROWID""",
)
"""Added to any store when it opens: a table an older gateway never reads."""

INSERT = "INSERT OR IGNORE INTO outbox (hook, seq, session_id, data) VALUES (?, ?, ?, ?)"


def lanes(conn: sqlite3.Connection) -> list[Lane]:
    """Every lane with a delivery pending (read from the primary key alone)."""
    rows = conn.execute("SELECT DISTINCT hook, session_id FROM outbox").fetchall()
    return [(hook, sid) for hook, sid in rows]


def entries(conn: sqlite3.Connection, lane: Lane, after_seq: int, limit: int) -> list[OutboxEntry]:
    """The lane's deliveries after ``after_seq``, in event order, at most ``limit``."""
    sql = """
        SELECT seq, data FROM outbox WHERE hook = ? AND session_id = ? AND seq > ?
        ORDER BY seq LIMIT ?
    """
    rows = conn.execute(sql, (*lane, after_seq, limit)).fetchall()
    return [OutboxEntry(lane[0], seq, lane[1], data) for seq, data in rows]


def depth(conn: sqlite3.Connection) -> int:
    (count,) = conn.execute("SELECT count(*) FROM outbox").fetchone()
    return int(count)


def delete(conn: sqlite3.Connection, done: Sequence[OutboxEntry]) -> None:
    """Delete the entries ``done``; one already gone is no error."""
    sql = "DELETE FROM outbox WHERE hook = ? AND session_id = ? AND seq = ?"
    conn.executemany(sql, [(e.hook, e.session_id, e.seq) for e in done])

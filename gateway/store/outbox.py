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

SQLITE_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS outbox (
        hook TEXT NOT NULL,
        seq INTEGER NOT NULL,
        session_id TEXT NOT NULL,
        data BLOB NOT NULL,
        PRIMARY KEY (seq, hook)
    )""",
)
"""Added to any store when it opens: a table an older gateway never reads."""

SQLITE_INSERT = "INSERT OR IGNORE INTO outbox (hook, seq, session_id, data) VALUES (?, ?, ?, ?)"


def sqlite_after(conn: sqlite3.Connection, after: tuple[int, str], limit: int) -> list[OutboxEntry]:
    """The entries after ``after`` (``(seq, hook)``), in event order, at most ``limit``."""
    sql = """
        SELECT hook, seq, session_id, data FROM outbox
        WHERE (seq, hook) > (?, ?) ORDER BY seq, hook LIMIT ?
    """
    rows = conn.execute(sql, (*after, limit)).fetchall()
    return [OutboxEntry(hook, seq, sid, data) for hook, seq, sid, data in rows]


def sqlite_depth(conn: sqlite3.Connection) -> int:
    (count,) = conn.execute("SELECT count(*) FROM outbox").fetchone()
    return int(count)


def sqlite_delete(conn: sqlite3.Connection, done: Sequence[tuple[str, int]]) -> None:
    """Delete the entries ``done`` (``(hook, seq)`` each); one already gone is no error."""
    conn.executemany("DELETE FROM outbox WHERE hook = ? AND seq = ?", done)

"""The idempotency records on SQLite (gateway.store.idempotency, docs/protocol.md §13).

A table of their own, ``requests``: one row per (owner, key), the record
MessagePack-encoded; claimed and settled by :func:`gateway.store.idempotency.decide`
and :func:`gateway.store.idempotency.settle` in the caller's write transaction.
"""

from __future__ import annotations

import sqlite3

import msgspec

from gateway.store import idempotency
from gateway.store.idempotency import RECORD_TTL_MS, Claim, Claimed, RequestRecord

SCHEMA = (
    """CREATE TABLE IF NOT EXISTS requests (
        owner TEXT NOT NULL,
        key TEXT NOT NULL,
        created_at INTEGER NOT NULL,
        data BLOB NOT NULL,
        PRIMARY KEY (owner, key)
    )""",
    "CREATE INDEX IF NOT EXISTS requests_by_age ON requests (created_at)",
)
"""Added to any store when it opens: a table an older gateway never reads."""

_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder(RequestRecord).decode


def _found(conn: sqlite3.Connection, owner: str, key: str) -> RequestRecord | None:
    sql = "SELECT data FROM requests WHERE owner = ? AND key = ?"
    row = conn.execute(sql, (owner, key)).fetchone()
    return None if row is None else _decode(row[0])


def claim_request(
    conn: sqlite3.Connection, owner: str, key: str, claim: Claim, now_ms: int, process: str
) -> Claimed:
    """:meth:`gateway.store.base.Store.claim_request` in the caller's write
    transaction (:func:`gateway.store.idempotency.decide`); prunes records past 24 h.

    ``process``: this process's own (random) id. The holder is prefixed with
    it, so an attempt that a restart interrupted holds its key no longer
    (the SQLite store is one process's).
    """
    conn.execute("DELETE FROM requests WHERE created_at <= ?", (now_ms - RECORD_TTL_MS,))
    alive = f"{process}/"
    claim = msgspec.structs.replace(claim, holder=alive + claim.holder)
    claimed, write = idempotency.decide(_found(conn, owner, key), claim, now_ms, alive)
    if write is not None:
        conn.execute(
            "INSERT OR REPLACE INTO requests (owner, key, created_at, data) VALUES (?, ?, ?, ?)",
            (owner, key, write.created_at, _encode(write)),
        )
    return claimed


def settle_request(
    conn: sqlite3.Connection, owner: str, key: str, holder: str, status: int | None, body: bytes
) -> None:
    """:meth:`gateway.store.base.Store.settle_request` in the caller's write
    transaction (:func:`gateway.store.idempotency.settle`)."""
    write = idempotency.settle(_found(conn, owner, key), holder, status, body)
    if write is not None:
        sql = "UPDATE requests SET data = ? WHERE owner = ? AND key = ?"
        conn.execute(sql, (_encode(write), owner, key))

"""Idempotency records: the store's half of ``Idempotency-Key`` (docs/protocol.md §13).

A record is kept per (owner, key) for :data:`RECORD_TTL_MS` (24 h) from the
first request that used the key. It says which request made it (its
fingerprint: method, path and canonical body), what that request makes (its
``target``: the session id or turn id, chosen before anything is made), and
either that an attempt (``holder``) is in progress until ``until``, or the
answer (``status`` and ``body``) once one was recorded.

:func:`decide` is the whole state machine, sans-IO: the SQLite store runs it
in one write transaction, the Redis store runs the same rules as a Lua script
(:data:`CLAIM_SCRIPT`, on Redis's clock). Both stores only ever:

- **claim** (:meth:`Store.claim_request`): no record, or one older than 24 h,
  is a ``new`` claim; another fingerprint is ``reused``; a recorded answer is
  ``answered``; an attempt in progress until later is ``in_use``; one whose
  time is up (its node died, or it gave up) is ``taken`` by this attempt,
  which keeps the target: the caller looks for the target first (it may have
  been made just before the node died) and makes it under the same id if not;
- **settle** (:meth:`Store.settle_request`): the holder records its answer,
  or lets the record go (``until`` = 0, target kept) so that a retry runs at
  once. A holder that is no longer the record's changes nothing.

The records hold no conversation: a fingerprint is a digest, an answer the
ids of what was made.
"""

from __future__ import annotations

import sqlite3
from typing import Literal

import msgspec

RECORD_TTL_MS = 24 * 3600 * 1000
"""How long a key is remembered, from its first request (docs/protocol.md §13)."""

Outcome = Literal["new", "taken", "answered", "in_use", "reused"]


class RequestRecord(msgspec.Struct):
    """One key's record (module docstring)."""

    fingerprint: str
    target: str
    holder: str
    created_at: int  # ms: the 24 h count from here
    until: int  # ms: an attempt is in progress until then; 0 once settled
    status: int = 0  # the recorded answer's status; 0: none yet
    body: bytes = b""


class Claim(msgspec.Struct, frozen=True):
    """An attempt's claim of a key: what it is, what it would make, for how long."""

    fingerprint: str
    target: str
    holder: str
    hold_ms: int


class Claimed(msgspec.Struct, frozen=True):
    """What a claim found: ``outcome``, and the record as it now is."""

    outcome: Outcome
    record: RequestRecord


def decide(
    found: RequestRecord | None, claim: Claim, now_ms: int, alive: str | None = None
) -> tuple[Claimed, RequestRecord | None]:
    """The claim's outcome, and the record to write (``None``: leave it as it is).

    ``alive``: where the store is one process's (SQLite), the prefix of that
    process's holders: an attempt of any other holder died with its process,
    and its hold is over at once.
    """
    if found is None or now_ms - found.created_at >= RECORD_TTL_MS:
        new = RequestRecord(claim.fingerprint, claim.target, claim.holder, now_ms,
                            now_ms + claim.hold_ms)  # fmt: skip
        return Claimed("new", new), new
    if found.fingerprint != claim.fingerprint:
        return Claimed("reused", found), None
    if found.status:
        return Claimed("answered", found), None
    if found.until > now_ms and (alive is None or found.holder.startswith(alive)):
        return Claimed("in_use", found), None
    taken = msgspec.structs.replace(found, holder=claim.holder, until=now_ms + claim.hold_ms)
    return Claimed("taken", taken), taken


def settle(
    found: RequestRecord | None, holder: str, status: int | None, body: bytes
) -> RequestRecord | None:
    """The record once ``holder`` answered ``status`` (``None``: let go); ``None``: no change."""
    if found is None or found.holder != holder or found.status:
        return None
    if status is None:
        return msgspec.structs.replace(found, until=0)
    return msgspec.structs.replace(found, until=0, status=status, body=body)


# --- SQLite ---------------------------------------------------------------------

SQLITE_SCHEMA = (
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


def sqlite_claim(
    conn: sqlite3.Connection, owner: str, key: str, claim: Claim, now_ms: int, process: str
) -> Claimed:
    """:func:`decide` in the caller's write transaction; prunes records past 24 h.

    ``process``: this process's own (random) id. The holder is prefixed with
    it, so an attempt that a restart interrupted holds its key no longer
    (the SQLite store is one process's).
    """
    conn.execute("DELETE FROM requests WHERE created_at <= ?", (now_ms - RECORD_TTL_MS,))
    alive = f"{process}/"
    claim = msgspec.structs.replace(claim, holder=alive + claim.holder)
    claimed, write = decide(_found(conn, owner, key), claim, now_ms, alive)
    if write is not None:
        conn.execute(
            "INSERT OR REPLACE INTO requests (owner, key, created_at, data) VALUES (?, ?, ?, ?)",
            (owner, key, write.created_at, _encode(write)),
        )
    return claimed


def sqlite_settle(
    conn: sqlite3.Connection, owner: str, key: str, holder: str, status: int | None, body: bytes
) -> None:
    """:func:`settle` in the caller's write transaction."""
    write = settle(_found(conn, owner, key), holder, status, body)
    if write is not None:
        sql = "UPDATE requests SET data = ? WHERE owner = ? AND key = ?"
        conn.execute(sql, (_encode(write), owner, key))


# --- Redis ----------------------------------------------------------------------
# One HASH per (owner, key), under the deployment's prefix, expiring 24 h after
# its first request: f fingerprint, t target, h holder, c created_at, u until,
# s status, b body. Times are Redis's (TIME), so nodes' clocks do not matter.

_NOW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

CLAIM_SCRIPT = (
    _NOW
    + """
local r = redis.call('HMGET', KEYS[1], 'f', 't', 'h', 'c', 'u', 's', 'b')
local hold = tonumber(ARGV[4])
if not r[1] then
    redis.call('HSET', KEYS[1], 'f', ARGV[1], 't', ARGV[2], 'h', ARGV[3], 'c', now,
               'u', now + hold, 's', 0, 'b', '')
    redis.call('PEXPIRE', KEYS[1], ARGV[5])
    return {'new', ARGV[1], ARGV[2], ARGV[3], tostring(now), tostring(now + hold), '0', ''}
end
local outcome = 'taken'
if r[1] ~= ARGV[1] then outcome = 'reused'
elseif tonumber(r[6]) ~= 0 then outcome = 'answered'
elseif tonumber(r[5]) > now then outcome = 'in_use'
else
    r[3] = ARGV[3]
    r[5] = tostring(now + hold)
    redis.call('HSET', KEYS[1], 'h', r[3], 'u', r[5])
end
return {outcome, r[1], r[2], r[3], r[4], r[5], r[6], r[7]}
"""
)
"""KEYS: the record; ARGV: fingerprint, target, holder, hold_ms, ttl_ms (:func:`decide`)."""

SETTLE_SCRIPT = """
if redis.call('HGET', KEYS[1], 'h') ~= ARGV[1] then return 0 end
if tonumber(redis.call('HGET', KEYS[1], 's')) ~= 0 then return 0 end
if ARGV[2] == '' then
    redis.call('HSET', KEYS[1], 'u', 0)
else
    redis.call('HSET', KEYS[1], 'u', 0, 's', ARGV[2], 'b', ARGV[3])
end
return 1
"""
"""KEYS: the record; ARGV: holder, status ('' to let go), body (:func:`settle`)."""


def redis_claimed(answer: list[bytes | str]) -> Claimed:
    """A :data:`CLAIM_SCRIPT` answer as a :class:`Claimed`."""
    text = [a.decode() if isinstance(a, bytes) and i < 7 else a for i, a in enumerate(answer)]
    outcome, fingerprint, target, holder, created, until, status = (str(t) for t in text[:7])
    body = answer[7]
    record = RequestRecord(
        fingerprint, target, holder, int(created), int(until), int(status),
        body if isinstance(body, bytes) else body.encode(),
    )  # fmt: skip
    return Claimed(outcome, record)  # type: ignore[arg-type]

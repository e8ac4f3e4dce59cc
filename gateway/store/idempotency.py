"""Idempotency records: the store's half of ``Idempotency-Key`` (docs/protocol.md §13).

A record is kept per (owner, key) for :data:`RECORD_TTL_MS` (24 h) from the
first request that used the key. It says which request made it (its
fingerprint: method, path and canonical body), what that request makes (its
``target``: the session id or turn id, chosen before anything is made), and
either that an attempt (``holder``) is in progress until ``until``, or the
answer (``status`` and ``body``) once one was recorded.

:func:`decide` is the whole state machine, sans-IO: the SQLite store runs it
in one write transaction (:mod:`gateway.store.sqlite.requests`), the Redis
store runs the same rules as a Lua script (:mod:`gateway.store.redis.requests`,
on Redis's clock). Both stores only ever:

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

"""The idempotency records of the Redis store (gateway.store.idempotency, docs/protocol.md §13).

A mixin of :class:`gateway.store.redis.store.RedisStore`, kept apart so the store
class stays about one thing: one hash per (owner, key) under the
deployment's prefix, ``<prefix>req:<sha256 of owner NUL key>`` (a digest:
a key may hold any printable character, braces included, which Redis
Cluster would read as a hash tag), claimed and settled by the scripts below
(the rules of :func:`gateway.store.idempotency.decide` and
:func:`gateway.store.idempotency.settle`), on Redis's clock, expiring 24 h after
its first request.
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable
from typing import Any

import coredis

from gateway.store import idempotency
from gateway.store.idempotency import Claimed, RequestRecord

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


def claimed(answer: list[bytes | str]) -> Claimed:
    """A :data:`CLAIM_SCRIPT` answer as a :class:`Claimed`."""
    text = [a.decode() if isinstance(a, bytes) and i < 7 else a for i, a in enumerate(answer)]
    outcome, fingerprint, target, holder, created, until, status = (str(t) for t in text[:7])
    body = answer[7]
    record = RequestRecord(
        fingerprint, target, holder, int(created), int(until), int(status),
        body if isinstance(body, bytes) else body.encode(),
    )  # fmt: skip
    return Claimed(outcome, record)  # type: ignore[arg-type]


class RedisRequests:
    """``claim_request`` and ``settle_request`` of :class:`gateway.store.base.Store` on Redis."""

    _prefix: str

    async def _read(self, query: Callable[[coredis.Redis[bytes]], Awaitable[Any]]) -> Any:
        raise NotImplementedError  # the store's: a command, its failures as StoreError

    async def claim_request(
        self, owner: str, key: str, claim: idempotency.Claim, now_ms: int
    ) -> Claimed:
        """Redis's clock decides, not ``now_ms`` (the nodes' clocks may differ)."""
        args: list[str | int] = [claim.fingerprint, claim.target, claim.holder, claim.hold_ms]
        args.append(idempotency.RECORD_TTL_MS)
        keys = [self._request_key(owner, key)]
        answer = await self._read(lambda c: c.eval(CLAIM_SCRIPT, keys, args))
        return claimed(answer)

    async def settle_request(
        self, owner: str, key: str, holder: str, status: int | None, body: bytes
    ) -> None:
        args: list[str | bytes] = [holder, "" if status is None else str(status), body]
        keys = [self._request_key(owner, key)]
        await self._read(lambda c: c.eval(SETTLE_SCRIPT, keys, args))

    def _request_key(self, owner: str, key: str) -> str:
        digest = hashlib.sha256(f"{owner}\0{key}".encode()).hexdigest()
        return f"{self._prefix}req:{digest}"

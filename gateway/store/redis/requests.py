"""The idempotency records of the Redis store (gateway.store.idempotency, docs/protocol.md §13).

A mixin of :class:`gateway.store.redis.store.RedisStore`, kept apart so the store
class stays about one thing: one hash per (owner, key) under the
deployment's prefix, ``<prefix>req:<sha256 of owner NUL key>`` (a digest:
a key may hold any printable character, braces included, which Redis
Cluster would read as a hash tag), claimed and settled by the scripts of
gateway.store.idempotency, on Redis's clock, expiring 24 h after its first
request.
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable
from typing import Any

import coredis

from gateway.store import idempotency


class RedisRequests:
    """``claim_request`` and ``settle_request`` of :class:`gateway.store.base.Store` on Redis."""

    _prefix: str

    async def _read(self, query: Callable[[coredis.Redis[bytes]], Awaitable[Any]]) -> Any:
        raise NotImplementedError  # the store's: a command, its failures as StoreError

    async def claim_request(
        self, owner: str, key: str, claim: idempotency.Claim, now_ms: int
    ) -> idempotency.Claimed:
        """Redis's clock decides, not ``now_ms`` (the nodes' clocks may differ)."""
        args: list[str | int] = [claim.fingerprint, claim.target, claim.holder, claim.hold_ms]
        args.append(idempotency.RECORD_TTL_MS)
        keys = [self._request_key(owner, key)]
        answer = await self._read(lambda c: c.eval(idempotency.CLAIM_SCRIPT, keys, args))
        return idempotency.redis_claimed(answer)

    async def settle_request(
        self, owner: str, key: str, holder: str, status: int | None, body: bytes
    ) -> None:
        args: list[str | bytes] = [holder, "" if status is None else str(status), body]
        keys = [self._request_key(owner, key)]
        await self._read(lambda c: c.eval(idempotency.SETTLE_SCRIPT, keys, args))

    def _request_key(self, owner: str, key: str) -> str:
        digest = hashlib.sha256(f"{owner}\0{key}".encode()).hexdigest()
        return f"{self._prefix}req:{digest}"

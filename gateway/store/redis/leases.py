"""The session leases on a Redis store (gateway.store.lease, docs/scale-out.md).

``SET gw:lease:{sid} <node> NX PX <ttl>`` pipelined with a read of the event
id counter (the counter read after the lease is taken bounds every id the
previous holder issued); renew and release are compare-and-``PEXPIRE`` and
compare-and-``DEL`` scripts, one per session (each session's key in its own
slot, as a Cluster needs).
"""

from __future__ import annotations

from collections.abc import Sequence

import coredis
from coredis.tokens import PureToken

from gateway.store.lease import Taken
from gateway.store.redis.client import Read
from gateway.store.redis.keys import Keys

# Leases (gateway.store.lease): only the holder extends or drops its lease.
_RENEW_LEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
    return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""
_RELEASE_LEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
    return redis.call('DEL', KEYS[1])
end
return 0
"""


class RedisLeases:
    """The session leases of one node on a Redis store (:class:`gateway.store.lease.Leases`)."""

    shared = True

    def __init__(self, read: Read, keys: Keys, node_id: str, ttl_ms: int) -> None:
        self.node_id = node_id
        self.ttl_ms = ttl_ms
        self._read = read
        self._keys = keys

    async def acquire(self, session_id: str) -> Taken | None:
        k = self._keys
        key = k.lease(session_id)

        async def take(c: coredis.Redis[bytes]) -> Taken | None:
            async with c.pipeline(transaction=False) as p:
                took = p.set(key, self.node_id, condition=PureToken.NX, px=self.ttl_ms)
                counter = p.zscore(k.meta, "event_ceiling")
            if await took:
                return Taken(int(await counter or 0), new=True)
            # Held: by this node already (renewed here), or by another.
            if await c.eval(_RENEW_LEASE, [key], [self.node_id, self.ttl_ms]) == 1:
                return Taken()
            return None

        return await self._read(take)

    async def renew(self, session_ids: Sequence[str]) -> list[str]:
        sids = list(session_ids)

        async def renew(c: coredis.Redis[bytes]) -> list[object]:
            async with c.pipeline(transaction=False) as p:
                answers = [
                    p.eval(_RENEW_LEASE, [self._keys.lease(s)], [self.node_id, self.ttl_ms])
                    for s in sids
                ]
            return [await a for a in answers]

        answers = await self._read(renew)
        return [s for s, answer in zip(sids, answers, strict=True) if answer != 1]

    async def release(self, session_ids: Sequence[str]) -> None:
        sids = list(session_ids)

        async def release(c: coredis.Redis[bytes]) -> None:
            async with c.pipeline(transaction=False) as p:
                for s in sids:
                    p.eval(_RELEASE_LEASE, [self._keys.lease(s)], [self.node_id])

        if sids:
            await self._read(release)

    async def holder(self, session_id: str) -> str | None:
        data = await self._read(lambda c: c.get(self._keys.lease(session_id)))
        return None if data is None else data.decode()

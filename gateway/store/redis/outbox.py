"""The webhook outbox of the Redis store (gateway.store.outbox, docs/doors/webhooks.md).

A mixin of :class:`gateway.store.redis.store.RedisStore`, kept apart so the store
class stays about one thing. Keys (:class:`gateway.store.redis.keys.Keys`),
under the deployment's prefix (``gw:``), ``HOOK`` a webhook's name (no ``:``
in it: gateway.config's names)::

    gw:ob:HOOK:{sid}       ZSET: score seq, member [seq, wire bytes]: the lane's deliveries
    gw:oblanes             SET: "HOOK:sid", every lane with a delivery pending
    gw:obclaim:HOOK:{sid}  STRING: the node delivering the lane, with its expiry

- **Atomic with the event.** A batch's deliveries are written by a script of
  the batch's own ``MULTI`` (:func:`queue_deliveries`), one per
  (session, webhook), fenced by the session's lease exactly as the script
  that appends the events: both read the lease inside the same ``EXEC``, so
  either both land or neither does. A batch retried after its answer was
  lost lands once (re-adding an identical member is a no-op).
- **Which node delivers.** Any node: a lane is *claimed* by one node at a
  time (``SET NX PX``, the lease time; renewed by the holder every third of
  it, released when the lane is empty or the node stops). The node that
  commits an event holds its session's lease and is woken by its commit, so
  it usually claims the lane first; when it dies, its claims lapse and a
  survivor's next read of the outbox takes them over.
- **Order when the claim moves.** A delivery leaves the outbox only once it
  was accepted (or dropped), and a lane is read from its lowest ``seq``: the
  new holder starts with the delivery the old one may have had in flight
  (sent again with the same ``webhook-id``: at least once), then the rest in
  order.
- A delivery owed outlives its session (``DELETE``, the retention purge):
  its keys are none of the session's.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import coredis
import msgspec
from coredis.patterns.pipeline import Pipeline
from coredis.tokens import PureToken

from gateway.store.outbox import Lane, OutboxEntry
from gateway.store.redis.keys import Keys
from gateway.store.redis.scripts import FENCE

# A batch's deliveries of one lane, after the store's fence (gateway.store.redis.scripts
# FENCE: KEYS[1] the session's lease, ARGV[1] this node). KEYS: lease, lanes,
# the lane's set; ARGV: node, lane name, then (seq, member) per delivery.
_ADD_DELIVERIES = """
redis.call('SADD', KEYS[2], ARGV[2])
local chunk = {}
for i = 3, #ARGV, 2 do
    chunk[#chunk + 1] = ARGV[i]
    chunk[#chunk + 1] = ARGV[i + 1]
    if #chunk >= 1000 or i + 2 > #ARGV then
        redis.call('ZADD', KEYS[3], unpack(chunk))
        chunk = {}
    end
end
return 1
"""

# Deliveries made or dropped; the lane leaves the set once empty. KEYS: the
# lane's set, lanes; ARGV: lane name, then the seqs.
_DELETE = """
for i = 2, #ARGV do
    redis.call('ZREMRANGEBYSCORE', KEYS[1], ARGV[i], ARGV[i])
end
if redis.call('ZCARD', KEYS[1]) == 0 then
    redis.call('SREM', KEYS[2], ARGV[1])
end
return 1
"""

# Claim a lane, or extend this node's claim. KEYS: the claim; ARGV: node, ttl ms,
# "r" to renew only (a claim that lapsed is not taken again).
_CLAIM = """
local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    return 1
end
if not holder and ARGV[3] ~= 'r' then
    redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
    return 1
end
return 0
"""

_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
    return redis.call('DEL', KEYS[1])
end
return 0
"""

_encoder = msgspec.msgpack.Encoder()
_decode = msgspec.msgpack.Decoder(tuple[int, bytes]).decode

Delivery = tuple[str, str, int, bytes]  # (hook, session, seq, member): a batch's row


def delivery_row(hook: str, session_id: str, seq: int, data: bytes) -> Delivery:
    """A batch's row for a delivery, encoded when enqueued."""
    return (hook, session_id, seq, _encoder.encode((seq, data)))


def queue_deliveries(
    p: Pipeline[bytes], k: Keys, deliveries: Sequence[Delivery], node: str, rows: list[str]
) -> list[str]:
    """Queue a batch's deliveries in its ``MULTI`` ``p``: one fenced script per lane.

    Returns:
        The session whose lease fences each command queued (and row added), in order.
    """
    lanes: dict[Lane, list[str | bytes | int]] = {}
    seqs: dict[Lane, list[int]] = {}
    for hook, sid, seq, member in deliveries:
        lanes.setdefault((hook, sid), [node, f"{hook}:{sid}"]).extend((seq, member))
        seqs.setdefault((hook, sid), []).append(seq)
    for lane, args in lanes.items():
        p.eval(FENCE + _ADD_DELIVERIES, [k.lease(lane[1]), k.lanes, k.lane(lane)], args)
        rows.append(f"deliveries {min(seqs[lane])}..{max(seqs[lane])} of {lane[1]} to {lane[0]}")
    return [sid for _, sid in lanes]


class RedisOutbox:
    """The outbox methods of :class:`gateway.store.base.Store` on Redis (module docstring)."""

    _keys: Keys

    async def _read(self, query: Callable[[coredis.Redis[bytes]], Awaitable[Any]]) -> Any:
        raise NotImplementedError  # the store's: a command, its failures as StoreError

    async def outbox_lanes(self) -> list[Lane]:
        names = await self._read(lambda c: c.smembers(self._keys.lanes))
        lanes = (name.decode().split(":", 1) for name in names)
        return sorted((hook, sid) for hook, sid in lanes)

    async def outbox_lane(self, lane: Lane, after_seq: int, limit: int) -> list[OutboxEntry]:
        if limit < 0:
            raise ValueError(f"limit must be >= 0, not {limit}")
        if not limit:
            return []
        key = self._keys.lane(lane)
        members = await self._read(
            lambda c: c.zrange(
                key, f"({after_seq}", "+inf", PureToken.BYSCORE, offset=0, count=limit
            )
        )
        return [OutboxEntry(lane[0], seq, lane[1], data) for seq, data in map(_decode, members)]

    async def outbox_depth(self) -> int:
        lanes = await self.outbox_lanes()

        async def count(c: coredis.Redis[bytes]) -> int:
            async with c.pipeline(transaction=False) as p:
                sizes = [p.zcard(self._keys.lane(lane)) for lane in lanes]
            return sum([await size for size in sizes])

        return int(await self._read(count)) if lanes else 0

    async def outbox_delete(self, done: Sequence[OutboxEntry]) -> None:
        by_lane: dict[Lane, list[str | int]] = {}
        for e in done:
            by_lane.setdefault((e.hook, e.session_id), [f"{e.hook}:{e.session_id}"]).append(e.seq)
        if not by_lane:
            return

        async def delete(c: coredis.Redis[bytes]) -> None:
            async with c.pipeline(transaction=True) as p:
                for lane, args in by_lane.items():
                    p.eval(_DELETE, [self._keys.lane(lane), self._keys.lanes], args)

        await self._read(delete)

    async def outbox_claim(
        self, lanes: Sequence[Lane], node_id: str, ttl_ms: int, *, renew: bool = False
    ) -> list[Lane]:
        if not lanes:
            return []
        args: list[str | int] = [node_id, ttl_ms, "r" if renew else ""]

        async def claim(c: coredis.Redis[bytes]) -> list[object]:
            async with c.pipeline(transaction=False) as p:
                answers = [p.eval(_CLAIM, [self._keys.lane_claim(lane)], args) for lane in lanes]
            return [await a for a in answers]

        answers = await self._read(claim)
        return [lane for lane, answer in zip(lanes, answers, strict=True) if answer == 1]

    async def outbox_release(self, lanes: Sequence[Lane], node_id: str) -> None:
        if not lanes:
            return

        async def release(c: coredis.Redis[bytes]) -> None:
            async with c.pipeline(transaction=False) as p:
                for lane in lanes:
                    p.eval(_RELEASE, [self._keys.lane_claim(lane)], [node_id])

        await self._read(release)

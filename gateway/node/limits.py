"""The per-key limits of a deployment of several nodes, counted in Redis (docs/protocol.md §15).

On one node (SQLite) :class:`gateway.tenancy.Limits` counts in memory. On
Redis, once the placement is clustered (gateway.node.placement), it hands the
three per-key limits to :class:`RedisKeyLimits`, so that they count for the
whole deployment, whichever node a request reaches. Each check is one Lua
script: it reads, decides and counts in one step on Redis, so two nodes racing
for a key's last slot cannot both get it. Times are Redis's own (``TIME``):
the nodes' clocks need not agree.

- **Sessions** (``max_sessions_per_key``): what a key owns is its stored
  sessions (the store's owner index, workers included) plus the creations
  under way: a creation *reserves* its session id first (a sorted set per key,
  scored by the reservation's expiry), and the reservation ends by itself once
  the record is durable (it is then counted by the index; the next check of
  the key ends it too, should that step be missed) or after
  :data:`RESERVATION_S` (a node that died creating it). A refused creation
  gives its reservation back at once; ``DELETE /sessions/{id}`` gives the slot
  back by taking the session out of the index.
- **Turns** (``turns_per_minute_per_key``): a sorted set per key of the turns
  of the last 60 s (member: a token of the turn, score: when, in Redis ms),
  expiring with its last turn. ``Retry-After`` is the time until its oldest
  turn leaves the window, as in memory.
- **Streams** (``max_connections_per_key``): a hash per key, one field per
  node: ``"<streams> <expiry ms>"``. A node writes its own count (an absolute
  value, under a lock: never drifts) when a stream opens, at once when one
  closes (the task ``limits``, woken by the close), and every ``lease_s / 3``
  to push its expiry ``lease_s`` ahead. A node that dies stops doing so: its
  field is ignored (and dropped) once it expires, so its streams are given
  back within ``lease_s``. A node stopping cleanly writes zero for its keys.

Where Redis does not answer a check, the request is refused 503
``store_unavailable`` (with ``Retry-After``), as every request that needs the
store is (docs/protocol.md §13): no limit is ever waived. A close that cannot
be written stays due, and is written once Redis answers again.

The session script reads the session records it was not passed as keys (to
end the reservations of those that landed): the deployment shares one Redis,
not a Redis Cluster.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import secrets
from collections.abc import Sequence
from typing import TYPE_CHECKING

import trio

from gateway.errors import StoreError, unavailable
from gateway.logs import event
from gateway.node.attach_tokens import RedisCall

if TYPE_CHECKING:
    import coredis

log = logging.getLogger("gateway.node")

RESERVATION_S = 60.0
"""How long a session being created holds its slot before its record is in the store."""

WINDOW_MS = 60_000
"""The window of ``turns_per_minute_per_key`` (gateway.tenancy.TURN_WINDOW_S), in ms."""

_NOW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

# KEYS: the key's reservations, its owner index. ARGV: limit, reservation ttl ms, the
# session id, the record key's text before and after the id. -1: reserved; else owned.
_RESERVE_SESSION = (
    _NOW
    + """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local pending = 0
for _, sid in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
    if redis.call('EXISTS', ARGV[4] .. sid .. ARGV[5]) == 1 then
        redis.call('ZREM', KEYS[1], sid)
    else
        pending = pending + 1
    end
end
local owned = redis.call('ZCARD', KEYS[2]) + pending
if owned >= tonumber(ARGV[1]) then
    return owned
end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return -1
"""
)

# KEYS: the key's turns. ARGV: limit, window ms, the turn's token ('': only look).
# -1: under the limit (counted, with a token); else the ms until the oldest leaves.
_TURN = (
    _NOW
    + """
local window = tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - window)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[1]) then
    local oldest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
    return tonumber(oldest[2]) + window - now
end
if ARGV[3] ~= '' then
    redis.call('ZADD', KEYS[1], now, ARGV[3])
    redis.call('PEXPIRE', KEYS[1], window)
end
return -1
"""
)

# KEYS: the key's streams (hash: node -> "count expiry"). ARGV: node, its count to
# write, limit (0: write without a check), ttl ms. -1: written; else the streams open.
_STREAMS = (
    _NOW
    + """
local count = tonumber(ARGV[2])
local limit = tonumber(ARGV[3])
if limit > 0 then
    local others = 0
    local fields = redis.call('HGETALL', KEYS[1])
    for i = 1, #fields, 2 do
        if fields[i] ~= ARGV[1] then
            local n, expiry = string.match(fields[i + 1], '(%d+) (%d+)')
            if tonumber(expiry) <= now then
                redis.call('HDEL', KEYS[1], fields[i])
            else
                others = others + tonumber(n)
            end
        end
    end
    if others + count > limit then
        return others + count - 1
    end
end
if count > 0 then
    redis.call('HSET', KEYS[1], ARGV[1], count .. ' ' .. (now + tonumber(ARGV[4])))
    redis.call('PEXPIRE', KEYS[1], ARGV[4])
else
    redis.call('HDEL', KEYS[1], ARGV[1])
end
return -1
"""
)


class RedisKeyLimits:
    """The per-key counts of the deployment, in Redis (:class:`gateway.tenancy.SharedLimits`).

    Args:
        redis_call: runs a command on the node's Redis client (the cluster link's).
        prefix: the store's key prefix.
        node_id: this node (its field in each key's streams).
        lease_s: how long a node's streams outlive its last refresh.
        record_key: the store's key of a session record, ``(before, after)`` its id.
        owner_key: the store's key of an owner's index of sessions.
    """

    def __init__(
        self,
        redis_call: RedisCall,
        prefix: str,
        node_id: str,
        lease_s: float,
        record_key: tuple[str, str],
        owner_key: str,
    ) -> None:
        self._call = redis_call
        self._prefix = f"{prefix}lim:"
        self.node_id = node_id
        self.lease_s = lease_s
        self._ttl_ms = max(1, round(lease_s * 1000))
        self._record_key = record_key
        self._owner_key = owner_key  # "...owner:" + the owner
        self.streams: collections.Counter[str] = collections.Counter()  # this node's, per key
        self._due: set[str] = set()  # keys whose count Redis has not been told yet
        self._wake = trio.Event()
        self._lock = trio.Lock()  # one write of this node's counts at a time: no stale one lands
        self._failing = False

    async def _eval(self, script: str, keys: Sequence[str], args: Sequence[object]) -> int:
        async def run(c: coredis.Redis[bytes]) -> object:
            return await c.eval(script, list(keys), list(args))  # type: ignore[arg-type]

        try:
            answer = await self._call(run)
        except StoreError as exc:
            raise unavailable(exc) from None
        return int(answer)

    # --- sessions ---

    async def reserve_session(self, key: str, session_id: str, limit: int) -> int | None:
        """Reserve a slot for a session being created: ``None``, or how many the key owns.

        Raises:
            Refused: ``store_unavailable``.
        """
        before, after = self._record_key
        owned = await self._eval(
            _RESERVE_SESSION,
            [f"{self._prefix}s:{key}", f"{self._owner_key}{key}"],
            [limit, round(RESERVATION_S * 1000), session_id, before, after],
        )
        return None if owned < 0 else owned

    async def unreserve_session(self, key: str, session_id: str) -> None:
        """End a reservation: the creation failed, or its record is durable (indexed)."""
        name = f"{self._prefix}s:{key}"
        with contextlib.suppress(StoreError):  # else it ends by itself after RESERVATION_S
            await self._call(lambda c: c.zrem(name, [session_id]))

    # --- turns ---

    async def turn(self, key: str, limit: int, *, count: bool) -> tuple[str | None, float]:
        """Look at (or count) a turn of ``key``: ``(token, 0)``, or ``(None, seconds to wait)``.

        The token (``""`` when only looking) names the counted turn for :meth:`refund_turn`.

        Raises:
            Refused: ``store_unavailable``.
        """
        token = secrets.token_hex(8) if count else ""
        wait_ms = await self._eval(_TURN, [f"{self._prefix}t:{key}"], [limit, WINDOW_MS, token])
        return (token, 0.0) if wait_ms < 0 else (None, wait_ms / 1000)

    async def refund_turn(self, key: str, token: str) -> None:
        """Take back the counted turn ``token``: it was refused after all."""
        name = f"{self._prefix}t:{key}"
        with contextlib.suppress(StoreError):  # else it leaves the window by itself
            await self._call(lambda c: c.zrem(name, [token]))

    # --- streams ---

    async def open_stream(self, key: str, limit: int) -> int | None:
        """Count a stream of ``key`` opening here: ``None``, or how many are open (refused).

        Raises:
            Refused: ``store_unavailable``.
        """
        async with self._lock:
            want = self.streams[key] + 1
            answer = await self._eval(
                _STREAMS, [f"{self._prefix}c:{key}"], [self.node_id, want, limit, self._ttl_ms]
            )
            if answer >= 0:
                return answer
            self.streams[key] += 1  # not "= want": a close may have come meanwhile (it is due)
            return None

    def close_stream(self, key: str) -> None:
        """A stream of ``key`` closed here: told to Redis at once, by the task ``limits``."""
        self.streams[key] -= 1
        if self.streams[key] <= 0:
            del self.streams[key]
        self._due.add(key)
        self._wake.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Write this node's stream counts: closes at once, every count each ``lease_s / 3``.

        Stopping (cancelled), it writes zero for each of its keys: its streams end with it.
        """
        task_status.started()
        refresh_at = trio.current_time()
        try:
            while True:
                with trio.move_on_at(refresh_at):
                    await self._wake.wait()
                self._wake = trio.Event()
                if trio.current_time() >= refresh_at:
                    refresh_at = trio.current_time() + self.lease_s / 3
                    self._due |= set(self.streams)
                await self._write_due()
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(2):
                self._due |= set(self.streams)
                self.streams.clear()
                await self._write_due(quiet=True)  # the cluster link may be gone already

    async def _write_due(self, *, quiet: bool = False) -> None:
        if not self._due:
            return
        async with self._lock:
            keys, self._due = sorted(self._due), set()
            counts = [self.streams.get(k, 0) for k in keys]

            async def write(c: coredis.Redis[bytes]) -> None:
                async with c.pipeline(transaction=False) as p:
                    for k, n in zip(keys, counts, strict=True):
                        name = f"{self._prefix}c:{k}"
                        p.eval(_STREAMS, [name], [self.node_id, n, 0, self._ttl_ms])

            try:
                await self._call(write)
            except StoreError as exc:
                self._due.update(keys)  # written once Redis answers again
                if not self._failing and not quiet:
                    self._failing = True
                    event(
                        log, logging.WARNING, "limits_not_written",
                        f"the streams per key of this node were not written to Redis: {exc};"
                        " retried every lease_s / 3",
                        error=str(exc),
                    )  # fmt: skip
                return
        self._failing = False


__all__ = ["RESERVATION_S", "RedisKeyLimits"]

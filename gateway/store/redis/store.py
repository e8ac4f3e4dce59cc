"""The Redis backend of the trace store (docs/reference.md ``[store] backend = "redis"``).

Same interface and guarantees as the SQLite backend (:mod:`gateway.store.base`):
puts are a synchronous enqueue, a writer task commits them in batches, and
:attr:`RedisStore.committed` moves past a ticket only once Redis has answered
the batch's ``EXEC``: the batch is then in Redis's append-only file under the
server's ``appendfsync`` policy (docs/operating.md "Redis backend": ``always`` fsyncs before
answering, ``everysec``, the documented default, within a second, so an answered
write survives a Redis crash and loses at most a second to a power cut).

It talks to Redis with coredis on Trio itself (anyio's Trio backend): no
asyncio bridge and no thread. A coredis client must be held open by one task
for as long as it is used (its connection pool runs its connections' tasks in a
task group of its own), and the store's lifecycle (``open`` ... ``aclose``,
possibly from different tasks, with reads before ``run`` starts) has no task of
its own; so :meth:`RedisStore.open` starts one Trio system task that holds the
client until :meth:`RedisStore.aclose` (and reopens it should the pool fail):
:class:`gateway.store.redis.client.Connection`.

The package, by concept: the key names (:mod:`gateway.store.redis.keys`), the
Lua scripts that write a session's keys (:mod:`gateway.store.redis.scripts`),
a batch and its transaction (:mod:`gateway.store.redis.batch`), the leases
(:mod:`gateway.store.redis.leases`), the idempotency records
(:mod:`gateway.store.redis.requests`) and the webhook outbox
(:mod:`gateway.store.redis.outbox`); this module holds the store and its reads.

Data layout, every key under one prefix (``gw:`` by default) so that one Redis can
hold other data; values are msgspec MessagePack. ``{sid}`` is a session id in
braces: a Redis Cluster hash tag, so each session's keys share a slot when the
store is later sharded by session::

    gw:version                 "1": the layout version this code reads
    gw:meta                    ZSET: event_ceiling (the deployment's id counter: ZINCRBY by a
                               block allocates that block to one node), retention_floor
                               (raised with ZADD GT: only grows)
    gw:s:{sid}                 the SessionRecord
    gw:sessions                ZSET (lex): "<created_at, 16 digits>:<sid>", every session
    gw:owner:<owner>           ZSET (lex): the same, one owner's sessions (docs/protocol.md §2)
    gw:owners, gw:roots:<owner> SET: owners; an owner's sessions that are not workers
    gw:workers:<parent>        ZSET (lex): a session's workers, oldest first
    gw:open                    SET: sessions whose current_turn_id is set, or with queued
                               turns (docs/protocol.md §9, §2 "A busy session")
    gw:m:{sid}                 HASH: message id -> StoredMessage
    gw:mo:{sid}                ZSET: message id -> insertion order (kept by a rewrite)
    gw:e:{sid}                 ZSET: score seq, member [seq, type, ts, wire bytes]
    gw:ets                     ZSET: score ts, member "<seq>:<sid>" (the retention purge)
    gw:lease:{sid}             STRING: the node id holding the session's lease, with its expiry
    gw:req:<digest>            HASH: an Idempotency-Key's record (gateway.store.idempotency), the
                               digest of its owner and key; expires 24 h after its first request
    gw:fm:{sid}, gw:f:{sid},   a session's files and the bytes of each owner's
    gw:fbytes                  (gateway.store.redis.files)
    gw:ob:*, gw:oblanes,       the webhook outbox, its lanes pending and their claims
    gw:obclaim:*               (gateway.store.redis.outbox)

``DELETE /sessions/{id}`` (:meth:`RedisStore.delete_sessions`) removes every
key and index entry of each session above, in one ``MULTI``: its age index
entries are read first (from its events' set), between two of the writer's
batches, so nothing written before is left behind.

Why a sorted set per session for events, not a stream: a replay reads each
asked session's set from ``after_seq`` by score (``ZRANGE ... BYSCORE``) and
merges the sorted pages (a worker's events interleave with its parent's), and
re-adding an identical member is a no-op, so a batch retried after its answer
was lost lands once; a stream refuses an explicit id at or below its last one,
and trims by id, not by age.

Decisions where the contract is silent:

- A session's ``created_at``, ``owner`` and ``parent_session_id`` are its
  identity in the indexes: set when it is created, never changed by an upsert
  (the gateway never changes them).
- A batch's events are one ``ZADD`` per session plus one for the age index,
  so a command Redis refuses (below) costs that session's events of the batch.
- A message's insertion order is given by a small Lua script (``EVAL``) inside
  the batch's ``MULTI``: a new id gets the next number, a rewritten one keeps
  its own.
- A failed write never loses the batch. Connection errors, timeouts and
  refusals of the whole transaction (``MISCONF`` when the AOF cannot be
  written, ``OOM`` at ``maxmemory``: Redis then runs nothing of it) are retried
  with backoff (0.05 s doubling to 5 s) until they land; everything after them
  waits, in order. A command of the batch that Redis refuses on its own
  (``WRONGTYPE``: a key of the prefix holding something else) costs only its
  row: reported, the rest of the batch applied. Each failure is reported to
  ``on_write_error``; the first write that lands after failed ones is logged
  once (``store_reconnected``: how many attempts failed, over how long), so an
  outage has an end in the log as well as a beginning.
- An event stored twice with the same ``seq`` is not refused (the sequencer
  never reuses one: docs/protocol.md §1, and the event ceiling).
- Event ids come in blocks allocated by ``ZINCRBY gw:meta <block> event_ceiling``
  inside the writer's transaction: atomic, so the blocks of several nodes never
  overlap, and each above every block before it. The counter is the
  ``event_ceiling`` member that earlier releases raised with ``ZADD GT``, so a
  store they wrote needs no migration (a score is a double: exact up to 2^53,
  nine thousand million blocks). A batch retried after its answer was lost
  allocates its block twice: one block of numbers is skipped, nothing reused.
- Leases (:mod:`gateway.store.redis.leases`): ``SET gw:lease:{sid} <node> NX PX <ttl>``
  pipelined with a read of the counter (the counter read after the lease is
  taken bounds every id the previous holder issued); renew and release are
  compare-and-``PEXPIRE`` and compare-and-``DEL`` scripts, one per session
  (each session's key in its own slot, as a Cluster needs).
- Fencing: every write of a session's keys (its record and indexes, a
  message, a batch's events and their age entries) is a small Lua script
  (:mod:`gateway.store.redis.scripts`) inside the batch's ``MULTI`` that
  first reads the session's lease, and
  writes nothing if another node holds it: the store writes for the node
  named by its first :meth:`RedisStore.leases` call (a store with no node
  writes unfenced). A session nobody holds is written (a new session's
  record lands before its lease is taken; a lapsed lease nobody took yet).
  Why: while Redis is away every node's writes wait in its writer, each on
  its own backoff; the node that ran a turn loses the lease meanwhile, and
  another takes it once Redis is back, reads the store and closes the turn
  (docs/protocol.md §9). Without the fence the first node's queued writes
  would land after that, under the closing: events with lower ids (a call
  both completed and failed), its message over the closed one, its record
  over the new owner's. A write so dropped is reported (``on_write_error``:
  "its lease is <node>'s") like a refused row, and its ticket is committed;
  its session is told to ``on_fenced`` first, before the commit is, so the
  node stops running it and releases none of its batches that waited for
  that commit (docs/protocol.md §9: every catalog event a client receives
  is durable; the node's keeper may not have seen the lease go yet).
- A Redis whose ``appendonly`` is ``no`` is accepted with a warning in the log:
  what a client was shown then survives only until Redis restarts.
"""

from __future__ import annotations

import heapq
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

import coredis
import msgspec
import trio
from coredis.tokens import PureToken

from gateway.errors import StoreError
from gateway.store.base import SessionRecord, StoredEvent, StoredMessage, StoreState
from gateway.store.group_commit import GroupCommit
from gateway.store.redis.batch import RedisBatch, Transaction
from gateway.store.redis.client import TRANSIENT, Connection, reason, redacted
from gateway.store.redis.files import DROP_SCRIPT, RedisFiles
from gateway.store.redis.keys import Keys, index_member, sid_of
from gateway.store.redis.leases import RedisLeases
from gateway.store.redis.outbox import RedisOutbox
from gateway.store.redis.requests import RedisRequests
from gateway.store.redis.scripts import INSERT_SESSION, session_write

log = logging.getLogger("gateway.store")

LAYOUT_VERSION = 1
OPEN_TIMEOUT_S = 5.0  # Redis unreachable at start-up: one line within this, not a hang
PURGE_CHUNK = 1000  # events deleted per transaction by the retention purge

_T = TypeVar("_T")

_encoder = msgspec.msgpack.Encoder()
_session_decoder = msgspec.msgpack.Decoder(SessionRecord)
_message_decoder = msgspec.msgpack.Decoder(StoredMessage)
_event_decoder = msgspec.msgpack.Decoder(tuple[int, str, int, bytes])
_decode = _event_decoder.decode


class RedisStore(RedisRequests, RedisOutbox, RedisFiles, GroupCommit[RedisBatch]):
    """The Redis trace store: implements :class:`gateway.store.base.Store`.

    The group commit is :class:`gateway.store.group_commit.GroupCommit`'s; this
    class applies a batch as one ``MULTI``/``EXEC`` and reads.

    Args:
        url: ``redis://[:password@]host:port/db`` (or ``rediss://``, ``unix://``).
        prefix: every key's prefix (module docstring).
        flush_interval_s: the longest the writer gathers a batch.
        max_batch: the pending count at which the writer stops gathering.
    """

    def __init__(
        self,
        url: str,
        *,
        prefix: str = "gw:",
        flush_interval_s: float = 0.0,
        max_batch: int = 1000,
    ) -> None:
        where = redacted(url)
        super().__init__(
            f"store {where}", {"url": where}, flush_interval_s=flush_interval_s, max_batch=max_batch
        )
        self._where = where
        self._keys = Keys(prefix)
        self._prefix = prefix
        self._connection = Connection(url, where, self._report)
        self._node_id: str | None = None  # the node whose writes these are (leases())
        self._opened = False
        # self.refusing stays None: a Redis that comes back is the same store.

    # --- lifecycle ----------------------------------------------------------

    async def open(self) -> StoreState:
        """Connect, check the layout version, read the two numbers.

        Raises:
            StoreError: naming the URL (without its password): Redis unreachable
                or not answering within :data:`OPEN_TIMEOUT_S`, refusing us
                (auth), or holding a layout this code does not read.
        """
        deadline = trio.current_time() + OPEN_TIMEOUT_S
        try:
            with trio.fail_after(OPEN_TIMEOUT_S):
                await self._connection.hold()
                state = await self._read_state()
                self._opened = True
                return state
        except Exception as exc:  # whatever it is, start-up says it in one line
            # coredis turns the deadline's cancellation of a command waiting for
            # its answer into a ConnectionError of its own: the clock says which.
            late = isinstance(exc, trio.TooSlowError) or trio.current_time() >= deadline
            await self._connection.let_go()
            if late:
                raise StoreError(
                    f"cannot open store {self._where}: Redis did not answer"
                    f" within {OPEN_TIMEOUT_S:g} s"
                ) from None
            if isinstance(exc, StoreError):
                raise
            raise StoreError(f"cannot open store {self._where}: {reason(exc)}") from None

    async def _read_state(self) -> StoreState:
        client = self._redis()
        k = self._keys
        async with client.pipeline(transaction=False) as p:
            version = p.get(k.version)
            meta = p.zrange(k.meta, 0, -1, withscores=True)
        async with client.pipeline(transaction=False, raise_on_error=False) as p:
            aof = p.config_get(["appendonly"])  # CONFIG may be disabled (managed Redis)
        found = await version
        if found is None:
            await client.set(k.version, str(LAYOUT_VERSION), condition=PureToken.NX)
        elif found != str(LAYOUT_VERSION).encode():
            raise StoreError(
                f"cannot open store {self._where}: layout version {found.decode(errors='replace')}"
                f" under {k.version!r}, this gateway reads version {LAYOUT_VERSION}"
            )
        numbers = {m.member: int(m.score) for m in await meta}
        setting = await aof
        if isinstance(setting, dict) and setting.get(b"appendonly") == b"no":
            log.warning(
                "store %s: Redis has appendonly no; what clients were shown survives"
                " only until Redis restarts (docs/operating.md: Redis backend)",
                self._where,
            )
        return StoreState(
            event_ceiling=numbers.get(b"event_ceiling", 0),
            retention_floor=numbers.get(b"retention_floor", 0),
        )

    async def aclose(self) -> None:
        await self._close_writer(self._connection.let_go, drain=self._opened)

    # --- writes -------------------------------------------------------------

    def _new_batch(self) -> RedisBatch:
        return RedisBatch()

    def reserve_event_ids(self, block: int, granted: Callable[[int], None]) -> None:
        self._enqueue(lambda batch: batch.add_block(block, granted))

    def leases(self, node_id: str, ttl_ms: int) -> RedisLeases:
        """The leases of ``node_id``; the first call names the node this store writes for.

        From then on a session's writes land only while no other node holds
        its lease (module docstring: fencing).
        """
        if self._node_id is None:
            self._node_id = node_id
        return RedisLeases(self._read, self._keys, node_id, ttl_ms)

    async def _apply(self, batch: RedisBatch) -> list[str]:
        """One ``MULTI``/``EXEC`` of the whole batch; the rows Redis refused on their own.

        Raises:
            StoreError: the transaction did not run (connection, timeout, or
                refused whole): nothing of it is applied, or, if the answer was
                lost, all of it, and applying it again changes nothing.
        """
        client = self._redis()
        writes = Transaction(self._keys, self._node_id or "")
        try:
            async with client.pipeline(transaction=True, raise_on_error=False) as p:
                writes.queue(p, batch)
        except TRANSIENT as exc:
            raise StoreError(f"cannot write to store {self._where}: {reason(exc)}") from exc
        refused = writes.answered(p.results or ())
        if self.on_fenced is not None:  # before the commit is told: nothing of theirs goes out
            for sid in writes.fenced:
                self.on_fenced(sid)
        return refused

    async def insert_session(self, rec: SessionRecord) -> SessionRecord | None:
        keys, args = session_write(self._keys, rec, _encoder.encode(rec), self._node_id or "")
        try:
            answer = await self._redis().eval(INSERT_SESSION, keys, args)
        except TRANSIENT as exc:
            raise StoreError(f"cannot write to store {self._where}: {reason(exc)}") from exc
        if isinstance(answer, bytes):
            return _session_decoder.decode(answer)
        if isinstance(answer, list):  # fenced: a node holds a lease on this id
            holder = answer[0].decode() if isinstance(answer[0], bytes) else answer[0]
            raise StoreError(f"cannot create session {rec.id}: its lease is {holder}'s")
        return None

    async def release_memory(self) -> None:
        """Nothing: what a Redis store caches is the server's, not this process's."""

    async def purge_before(self, ts_ms: int) -> int:
        k = self._keys
        try:
            while True:
                client = self._redis()
                old = await client.zrange(
                    k.ets, "-inf", f"({ts_ms}", PureToken.BYSCORE, offset=0, count=PURGE_CHUNK
                )
                if not old:
                    break
                highest = 0
                async with client.pipeline(transaction=True) as p:
                    for entry in old:
                        seq_text, sid = entry.decode().split(":", 1)
                        seq = int(seq_text)
                        highest = max(highest, seq)
                        p.zremrangebyscore(k.events(sid), seq, seq)
                    p.zrem(k.ets, list(old))
                    p.zadd(k.meta, {"retention_floor": highest}, comparison=PureToken.GT)
                if len(old) < PURGE_CHUNK:
                    break
            floor = await self._redis().zscore(k.meta, "retention_floor")
        except TRANSIENT as exc:
            raise StoreError(f"cannot purge store {self._where}: {reason(exc)}") from exc
        return 0 if floor is None else int(floor)

    async def delete_sessions(self, session_ids: Sequence[str]) -> None:
        """Every key and index entry of each session, in one transaction (module docstring)."""
        await self.flush()  # what was enqueued before lands first: nothing comes back after
        async with self._writer():
            sids = list(dict.fromkeys(session_ids))
            try:
                await _delete(self._redis(), self._keys, await self._records(sids), sids)
            except TRANSIENT as exc:
                raise StoreError(f"cannot delete from store {self._where}: {reason(exc)}") from exc

    # --- reads --------------------------------------------------------------

    async def get_session(self, session_id: str) -> SessionRecord | None:
        data = await self._read(lambda c: c.get(self._keys.session(session_id)))
        return None if data is None else _session_decoder.decode(data)

    async def list_sessions(
        self, *, limit: int, before: str | None, visible_to: str | None = None
    ) -> tuple[list[SessionRecord], bool]:
        _check_limit(limit)
        k = self._keys
        if visible_to is None:
            indexes = [k.sessions]
        else:
            indexes = list(dict.fromkeys([k.owner(""), k.owner(visible_to)]))
        top: bytes | str = "+"
        if before is not None:
            cursor = await self.get_session(before)
            if cursor is None:
                return [], False
            top = f"({index_member(cursor)}"

        async def page(c: coredis.Redis[bytes]) -> list[bytes]:
            async with c.pipeline(transaction=False) as p:
                pages = [
                    p.zrange(i, top, "-", PureToken.BYLEX, rev=True, offset=0, count=limit + 1)
                    for i in indexes
                ]
            members = [m for request in pages for m in await request]
            return sorted(set(members), reverse=True)[: limit + 1]

        members = await self._read(page)
        records = await self._records([sid_of(m) for m in members[:limit]])
        return records, len(members) > limit

    async def sessions_per_owner(self) -> dict[str, int]:
        k = self._keys

        async def count(c: coredis.Redis[bytes]) -> dict[str, int]:
            owners = sorted(o.decode() for o in await c.smembers(k.owners))
            async with c.pipeline(transaction=False) as p:
                sizes = [p.zcard(k.owner(o)) for o in owners]  # workers included
            return {o: await n for o, n in zip(owners, sizes, strict=True)}

        return await self._read(count)

    async def load_messages(self, session_id: str) -> list[StoredMessage]:
        k = self._keys

        async def load(c: coredis.Redis[bytes]) -> list[StoredMessage]:
            ids = await c.zrange(k.message_order(session_id), 0, -1)
            if not ids:
                return []
            datas = await c.hmget(k.messages(session_id), list(ids))
            return [_message_decoder.decode(d) for d in datas if d is not None]

        return await self._read(load)

    async def open_turns(self) -> list[SessionRecord]:
        sids = sorted(s.decode() for s in await self._read(lambda c: c.smembers(self._keys.open)))
        records = await self._records(sids)
        return [r for r in records if r.current_turn_id is not None or r.queued_turns]

    async def event_bytes(self, session_id: str) -> int:
        # Redis's own estimate of the events' sorted set (sampled: one command,
        # whatever its size), read once when a session is loaded.
        key = self._keys.events(session_id)
        size = await self._read(lambda c: c.memory_usage(key))
        return int(size or 0)

    async def worker_ids(self, parent_id: str) -> list[str]:
        members = await self._read(lambda c: c.zrange(self._keys.workers(parent_id), 0, -1))
        return [sid_of(m) for m in members]

    async def events_after(
        self, session_ids: Sequence[str], after_seq: int, limit: int
    ) -> list[StoredEvent]:
        _check_limit(limit)
        if not session_ids or not limit:
            return []
        k = self._keys
        sids = list(dict.fromkeys(session_ids))

        async def read(c: coredis.Redis[bytes]) -> list[tuple[bytes, ...]]:
            async with c.pipeline(transaction=False) as p:
                pages = [
                    p.zrange(
                        k.events(sid),
                        f"({after_seq}",
                        "+inf",
                        PureToken.BYSCORE,
                        offset=0,
                        count=limit,
                    )
                    for sid in sids
                ]
            return [await request for request in pages]

        pages = await self._read(read)
        decoded = [
            [StoredEvent(seq, sid, type_, ts, data) for seq, type_, ts, data in map(_decode, page)]
            for sid, page in zip(sids, pages, strict=True)
        ]
        merged = heapq.merge(*decoded, key=lambda e: e.seq)
        return [e for _, e in zip(range(limit), merged, strict=False)]

    async def _records(self, sids: list[str]) -> list[SessionRecord]:
        if not sids:
            return []
        datas = await self._read(lambda c: c.mget([self._keys.session(s) for s in sids]))
        return [_session_decoder.decode(d) for d in datas if d is not None]

    async def _read(self, query: Callable[[coredis.Redis[bytes]], Awaitable[_T]]) -> _T:
        try:
            return await query(self._redis())
        except TRANSIENT as exc:
            raise StoreError(f"cannot read store {self._where}: {reason(exc)}") from exc

    def _redis(self) -> coredis.Redis[bytes]:
        client = self._connection.client
        if client is None:
            if self._closing:
                raise StoreError(f"store {self._where} is closed")
            raise StoreError(f"store {self._where} is not open (or is reconnecting)")
        return client


async def _delete(
    client: coredis.Redis[bytes], k: Keys, records: list[SessionRecord], sids: list[str]
) -> None:
    """Every key and index entry of the sessions, in one ``MULTI`` (``delete_sessions``).

    Their age index entries are read from their events' sets first.
    """
    async with client.pipeline(transaction=False) as p:
        pages = [p.zrange(k.events(sid), 0, -1) for sid in sids]
    ages: list[str] = []
    for sid, page in zip(sids, pages, strict=True):
        ages += [f"{_decode(member)[0]}:{sid}" for member in await page]
    async with client.pipeline(transaction=True) as p:
        for rec in records:
            member = index_member(rec)
            p.zrem(k.sessions, [member])
            p.zrem(k.owner(rec.owner), [member])
            if rec.parent_session_id:
                p.zrem(k.workers(rec.parent_session_id), [member])
            else:
                p.srem(k.roots(rec.owner), [rec.id])
        p.srem(k.open, sids)
        for sid in sids:  # a record or not (a refused fork's copies: docs/protocol.md §2)
            p.eval(DROP_SCRIPT, [k.file_meta(sid), k.files(sid), k.file_bytes], [])
        for chunk in range(0, len(ages), PURGE_CHUNK):
            p.zrem(k.ets, ages[chunk : chunk + PURGE_CHUNK])
        per_session = (k.session, k.messages, k.message_order, k.events, k.lease, k.workers)
        p.delete([key(sid) for sid in sids for key in per_session])


def _check_limit(limit: int) -> None:
    if limit < 0:
        raise ValueError(f"limit must be >= 0, not {limit}")

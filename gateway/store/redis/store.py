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
client until :meth:`RedisStore.aclose` (and reopens it should the pool fail).

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
    gw:open                    SET: sessions whose current_turn_id is set (docs/protocol.md §9)
    gw:m:{sid}                 HASH: message id -> StoredMessage
    gw:mo:{sid}                ZSET: message id -> insertion order (kept by a rewrite)
    gw:e:{sid}                 ZSET: score seq, member [seq, type, ts, wire bytes]
    gw:ets                     ZSET: score ts, member "<seq>:<sid>" (the retention purge)
    gw:lease:{sid}             STRING: the node id holding the session's lease, with its expiry
    gw:req:<digest>            HASH: an Idempotency-Key's record (gateway.store.idempotency), the
                               digest of its owner and key; expires 24 h after its first request
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
- Leases (:mod:`gateway.store.lease`): ``SET gw:lease:{sid} <node> NX PX <ttl>``
  pipelined with a read of the counter (the counter read after the lease is
  taken bounds every id the previous holder issued); renew and release are
  compare-and-``PEXPIRE`` and compare-and-``DEL`` scripts, one per session
  (each session's key in its own slot, as a Cluster needs).
- Fencing: every write of a session's keys (its record and indexes, a
  message, a batch's events and their age entries) is a small Lua script
  inside the batch's ``MULTI`` that first reads the session's lease, and
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
  "its lease is <node>'s") like a refused row, and its ticket is committed.
- A Redis whose ``appendonly`` is ``no`` is accepted with a warning in the log:
  what a client was shown then survives only until Redis restarts.
"""

from __future__ import annotations

import heapq
import logging
import os
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import anyio
import coredis
import msgspec
import trio
from coredis.exceptions import RedisError
from coredis.tokens import PureToken

from gateway.errors import StoreError, first_leaf
from gateway.store.base import SessionRecord, StoredEvent, StoredMessage, StoreState
from gateway.store.group_commit import CLOSE_RETRY_S, RETRY_FIRST_S, RETRY_MAX_S, Batch, GroupCommit
from gateway.store.lease import Taken
from gateway.store.redis.outbox import Delivery, RedisOutbox, delivery_row
from gateway.store.redis.requests import RedisRequests

log = logging.getLogger("gateway.store")

LAYOUT_VERSION = 1
OPEN_TIMEOUT_S = 5.0  # Redis unreachable at start-up: one line within this, not a hang
CONNECT_TIMEOUT_S = 2.0
COMMAND_TIMEOUT_S = 10.0  # a hung Redis fails a command (the writer retries) rather than hangs
PURGE_CHUNK = 1000  # events deleted per transaction by the retention purge

_T = TypeVar("_T")
# Failures of a whole transaction or of the connection: the batch is held and retried.
_TRANSIENT: tuple[type[BaseException], ...] = (
    RedisError,
    OSError,
    TimeoutError,
    anyio.BrokenResourceError,
    anyio.ClosedResourceError,
    anyio.EndOfStream,
)

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

# Every write of a session's keys is fenced by its lease (module docstring): it
# lands unless another node holds the lease (KEYS[1]; ARGV[1] this node's id,
# "" for a store that has no node), else it answers that node's id.
_FENCE = """
local holder = redis.call('GET', KEYS[1])
if ARGV[1] ~= '' and holder and holder ~= ARGV[1] then return {holder} end
"""

# A session record and its indexes. KEYS: lease, record, sessions, owner's,
# owners or parent's workers, owner's roots, open; ARGV: node, record, index
# member, id, owner, "w" for a worker, "o" for a turn in flight.
_WRITE_SESSION = """
redis.call('SET', KEYS[2], ARGV[2])
redis.call('ZADD', KEYS[3], 0, ARGV[3])
redis.call('ZADD', KEYS[4], 0, ARGV[3])
if ARGV[6] == 'w' then
    redis.call('ZADD', KEYS[5], 0, ARGV[3])
else
    redis.call('SADD', KEYS[5], ARGV[5])
    redis.call('SADD', KEYS[6], ARGV[4])
end
if ARGV[7] == 'o' then
    redis.call('SADD', KEYS[7], ARGV[4])
else
    redis.call('SREM', KEYS[7], ARGV[4])
end
return 1
"""

# An upsert never changes a session's owner (Store.put_session): a record of
# another owner is refused whole (records stored before owners existed have none).
_PUT_SESSION = (
    _FENCE
    + """
local stored = redis.call('GET', KEYS[2])
if stored and (cmsgpack.unpack(stored)['owner'] or '') ~= ARGV[5] then
    return redis.error_reply('the record has another owner, and an owner is never rewritten')
end
"""
    + _WRITE_SESSION
)

# A new session named by its client (Store.insert_session): written only if
# no record has its id, else that record is the answer (whoever holds its
# lease: the node that made it, usually); the same KEYS and ARGV.
_INSERT_SESSION = (
    """
local stored = redis.call('GET', KEYS[2])
if stored then return stored end
"""
    + _FENCE
    + _WRITE_SESSION
)

# A batch's messages of one session, in order; a message keeps its place when
# rewritten (an in_progress message completed): only a new id takes the next
# number of its session. KEYS: lease, messages, their order; ARGV: node, then
# (message id, message) per message.
_UPSERT_MESSAGES = (
    _FENCE
    + """
for i = 2, #ARGV, 2 do
    if not redis.call('ZSCORE', KEYS[3], ARGV[i]) then
        local last = redis.call('ZRANGE', KEYS[3], 0, 0, 'REV', 'WITHSCORES')
        local ord = 1
        if last[2] then ord = tonumber(last[2]) + 1 end
        redis.call('ZADD', KEYS[3], ord, ARGV[i])
    end
    redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1])
end
return 1
"""
)

# A batch's events of one session, and their entries in the age index. KEYS:
# lease, events, age index; ARGV: node, session id, then (seq, member, ts) per
# event. ZADD takes them in chunks (Lua's unpack has a limit).
_ADD_EVENTS = (
    _FENCE
    + """
local events, ages = {}, {}
for i = 3, #ARGV, 3 do
    events[#events + 1] = ARGV[i]
    events[#events + 1] = ARGV[i + 1]
    ages[#ages + 1] = ARGV[i + 2]
    ages[#ages + 1] = ARGV[i] .. ':' .. ARGV[2]
    if #events >= 1000 or i + 3 > #ARGV then
        redis.call('ZADD', KEYS[2], unpack(events))
        redis.call('ZADD', KEYS[3], unpack(ages))
        events, ages = {}, {}
    end
end
return 1
"""
)

_encoder = msgspec.msgpack.Encoder()
_session_decoder = msgspec.msgpack.Decoder(SessionRecord)
_message_decoder = msgspec.msgpack.Decoder(StoredMessage)
_event_decoder = msgspec.msgpack.Decoder(tuple[int, str, int, bytes])
_decode = _event_decoder.decode


def redacted(url: str) -> str:
    """``url`` without its password, for messages and logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    user = f"{parts.username}:***@" if parts.username else ":***@"
    return urlunsplit(parts._replace(netloc=user + host))


def _index_member(rec: SessionRecord) -> str:
    """A session's member in the lex-ordered indexes: ``created_at`` order, then id."""
    return f"{rec.created_at:016d}:{rec.id}"


def _sid_of(member: bytes) -> str:
    return member.decode().split(":", 1)[1]


class _Keys:
    """Every key name of the layout (module docstring), under one prefix."""

    def __init__(self, prefix: str) -> None:
        p = prefix
        self.version = f"{p}version"
        self.meta = f"{p}meta"
        self.sessions = f"{p}sessions"
        self.owners = f"{p}owners"
        self.open = f"{p}open"
        self.ets = f"{p}ets"
        self._p = p

    def session(self, sid: str) -> str:
        return f"{self._p}s:{{{sid}}}"

    def owner(self, owner: str) -> str:
        return f"{self._p}owner:{owner}"

    def roots(self, owner: str) -> str:
        return f"{self._p}roots:{owner}"

    def workers(self, parent: str) -> str:
        return f"{self._p}workers:{parent}"

    def messages(self, sid: str) -> str:
        return f"{self._p}m:{{{sid}}}"

    def message_order(self, sid: str) -> str:
        return f"{self._p}mo:{{{sid}}}"

    def events(self, sid: str) -> str:
        return f"{self._p}e:{{{sid}}}"

    def lease(self, sid: str) -> str:
        return f"{self._p}lease:{{{sid}}}"


class _Batch(Batch):
    """The Redis rows of a batch (:class:`gateway.store.group_commit.Batch`)."""

    def __init__(self) -> None:
        super().__init__()
        self.sessions: list[tuple[SessionRecord, bytes]] = []
        self.messages: list[tuple[str, str, bytes]] = []  # (session, message id, encoded)
        self.events: list[tuple[int, str, int, bytes]] = []  # (seq, session, ts, member)
        self.blocks: list[tuple[int, Callable[[int], None]]] = []  # (size, granted)
        self.deliveries: list[Delivery] = []  # webhook deliveries (gateway.store.redis.outbox)

    def rows(self) -> tuple[list[Any], ...]:
        return (self.sessions, self.messages, self.events, self.blocks, self.deliveries)

    def add_session(self, rec: SessionRecord) -> None:
        self.sessions.append((msgspec.structs.replace(rec), _encoder.encode(rec)))
        self.size += 1

    def add_message(self, msg: StoredMessage) -> int:
        m = msg.message
        data = _encoder.encode(msg)
        self.messages.append((m.session_id, m.id, data))
        self.size += 1
        return len(data)

    def add_event(self, ev: StoredEvent) -> None:
        member = _encoder.encode((ev.seq, ev.type, ev.ts, ev.data))
        self.events.append((ev.seq, ev.session_id, ev.ts, member))
        self.size += 1

    def add_block(self, block: int, granted: Callable[[int], None]) -> None:
        self.blocks.append((block, granted))
        self.size += 1

    def add_outbox(self, hook: str, ev: StoredEvent) -> None:
        self.deliveries.append(delivery_row(hook, ev.session_id, ev.seq, ev.data))
        self.outbox += 1


class RedisStore(RedisRequests, RedisOutbox, GroupCommit[_Batch]):
    """The Redis trace store: implements :class:`gateway.store.base.Store`.

    The group commit is :class:`gateway.store.group_commit.GroupCommit`'s; this
    class applies a batch as one ``MULTI``/``EXEC`` and reads.

    Args:
        url: ``redis://[:password@]host:port/db`` (or ``rediss://``, ``unix://``).
        prefix: every key's prefix (module docstring).
        flush_interval_s: the longest the writer gathers a batch.
        max_batch: the pending count at which the writer stops gathering.
    """

    _fence = _FENCE  # the webhook outbox's scripts are fenced as the events are

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
        self._url = url
        self._where = where
        self._keys = _Keys(prefix)
        self._prefix = prefix
        self._client: coredis.Redis[bytes] | None = None
        self._holding = False  # the holder task was started
        self._release = trio.Event()  # set: the holder task lets the client go
        self._released = trio.Event()  # set: it has
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
                # The store reports Redis's failures itself (on_write_error: the
                # node's store_write_failed line; a StoreError at start-up: one
                # line); coredis's own lines would repeat them with tracebacks,
                # at info level and, for a handshake that gets no answer, at
                # error level ("Connection attempt failed unexpectedly!").
                logging.getLogger("coredis").setLevel(logging.CRITICAL)
                ready = trio.Event()
                trio.lowlevel.spawn_system_task(self._hold_client, ready, name="redis-client")
                self._holding = True
                await ready.wait()
                state = await self._read_state()
                self._opened = True
                return state
        except Exception as exc:  # whatever it is, start-up says it in one line
            # coredis turns the deadline's cancellation of a command waiting for
            # its answer into a ConnectionError of its own: the clock says which.
            late = isinstance(exc, trio.TooSlowError) or trio.current_time() >= deadline
            await self._let_go()
            if late:
                raise StoreError(
                    f"cannot open store {self._where}: Redis did not answer"
                    f" within {OPEN_TIMEOUT_S:g} s"
                ) from None
            if isinstance(exc, StoreError):
                raise
            raise StoreError(f"cannot open store {self._where}: {_reason(exc)}") from None

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

    async def _hold_client(self, ready: trio.Event) -> None:
        """The task that holds the coredis client open (module docstring).

        A system task: it must never raise. Should the client's pool fail, a
        new client is opened (commands meanwhile fail and are retried).
        """
        try:
            delay = RETRY_FIRST_S
            while not self._release.is_set():
                client: coredis.Redis[bytes] = coredis.Redis.from_url(
                    self._url,
                    connect_timeout=CONNECT_TIMEOUT_S,
                    stream_timeout=COMMAND_TIMEOUT_S,
                )
                try:
                    async with client:
                        self._client = client
                        ready.set()
                        await self._release.wait()
                        return
                except Exception as exc:
                    self._report(StoreError(f"store {self._where}: {_reason(exc)}; reconnecting"))
                self._client = None
                with trio.move_on_after(delay):
                    await self._release.wait()
                delay = min(delay * 2, RETRY_MAX_S)
        finally:
            self._client = None
            self._released.set()

    async def _let_go(self) -> None:
        """Stop the holder task (if it started) and wait for it."""
        self._release.set()
        if self._holding:
            with trio.CancelScope(shield=True), trio.move_on_after(CLOSE_RETRY_S):
                await self._released.wait()

    async def aclose(self) -> None:
        await self._close_writer(self._let_go, drain=self._opened)

    # --- writes -------------------------------------------------------------

    def _new_batch(self) -> _Batch:
        return _Batch()

    def reserve_event_ids(self, block: int, granted: Callable[[int], None]) -> None:
        self._enqueue(lambda batch: batch.add_block(block, granted))

    def leases(self, node_id: str, ttl_ms: int) -> RedisLeases:
        """The leases of ``node_id``; the first call names the node this store writes for.

        From then on a session's writes land only while no other node holds
        its lease (module docstring: fencing).
        """
        if self._node_id is None:
            self._node_id = node_id
        return RedisLeases(self, node_id, ttl_ms)

    async def _apply(self, batch: _Batch) -> list[str]:
        """One ``MULTI``/``EXEC`` of the whole batch; the rows Redis refused on their own.

        Raises:
            StoreError: the transaction did not run (connection, timeout, or
                refused whole): nothing of it is applied, or, if the answer was
                lost, all of it, and applying it again changes nothing.
        """
        k = self._keys
        client = self._redis()
        rows: list[str] = []  # what each queued command writes, for a refusal's report
        node = self._node_id or ""
        try:
            async with client.pipeline(transaction=True, raise_on_error=False) as p:
                for rec, data in batch.sessions:
                    p.eval(_PUT_SESSION, *self._session_write(rec, data, node))
                    rows.append(f"session {rec.id}")
                # One script per session for its messages, and one for its events,
                # however many: a command costs far more than a member (the figures
                # in docs/performance.md; a tool turn writes a message at every block's end).
                messages: dict[str, list[str | bytes]] = {}
                for sid, mid, data in batch.messages:
                    messages.setdefault(sid, [node]).extend((mid, data))
                for sid, upserts in messages.items():
                    keys = [k.lease(sid), k.messages(sid), k.message_order(sid)]
                    p.eval(_UPSERT_MESSAGES, keys, upserts)
                    rows.append(f"{len(upserts) // 2} messages of {sid}")
                by_session: dict[str, list[str | bytes | int]] = {}
                seqs: dict[str, list[int]] = {}
                for seq, sid, ts, member_bytes in batch.events:
                    by_session.setdefault(sid, [node, sid]).extend((seq, member_bytes, ts))
                    seqs.setdefault(sid, []).append(seq)
                for sid, events in by_session.items():
                    p.eval(_ADD_EVENTS, [k.lease(sid), k.events(sid), k.ets], events)
                    rows.append(f"events {min(seqs[sid])}..{max(seqs[sid])} of {sid}")
                # Their webhook deliveries: the same MULTI, the same fence.
                self._queue_deliveries(p, batch.deliveries, node, rows)
                grants: list[tuple[int, Callable[[int], None]]] = []  # (result index, granted)
                for block, granted in batch.blocks:
                    p.zincrby(k.meta, "event_ceiling", block)
                    grants.append((len(rows), granted))
                    rows.append(f"a block of {block} event ids")
                ceiling = max([batch.ceiling or 0, *(seq for seq, *_ in batch.events)])
                if ceiling:
                    p.zadd(k.meta, {"event_ceiling": ceiling}, comparison=PureToken.GT)
                    rows.append("event ceiling")
        except _TRANSIENT as exc:
            raise StoreError(f"cannot write to store {self._where}: {_reason(exc)}") from exc
        results = p.results or ()
        refused: dict[str, None] = {}
        for what, result in zip(rows, results, strict=False):
            if isinstance(result, Exception):
                refused[f"{what}: {result}"] = None
            elif isinstance(result, list):  # fenced: the lease is another node's
                holder = result[0].decode() if isinstance(result[0], bytes) else result[0]
                refused[f"{what}: its lease is {holder}'s, not this node's"] = None
        for index, granted in grants:
            top = results[index] if index < len(results) else None
            if isinstance(top, int | float | bytes | str):
                granted(int(float(top)))
        return list(refused)

    def _session_write(
        self, rec: SessionRecord, data: bytes, node: str
    ) -> tuple[list[str], list[str | bytes]]:
        """The KEYS and ARGV of :data:`_PUT_SESSION` and :data:`_INSERT_SESSION` for ``rec``."""
        k = self._keys
        sid, worker = rec.id, rec.parent_session_id
        keys = [
            k.lease(sid),
            k.session(sid),
            k.sessions,
            k.owner(rec.owner),
            k.workers(worker) if worker else k.owners,
            k.roots(rec.owner),
            k.open,
        ]
        args: list[str | bytes] = [node, data, _index_member(rec), sid, rec.owner]
        args += ["w" if worker else "", "o" if rec.current_turn_id else ""]
        return keys, args

    async def insert_session(self, rec: SessionRecord) -> SessionRecord | None:
        keys, args = self._session_write(rec, _encoder.encode(rec), self._node_id or "")
        try:
            answer = await self._redis().eval(_INSERT_SESSION, keys, args)
        except _TRANSIENT as exc:
            raise StoreError(f"cannot write to store {self._where}: {_reason(exc)}") from exc
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
        except _TRANSIENT as exc:
            raise StoreError(f"cannot purge store {self._where}: {_reason(exc)}") from exc
        return 0 if floor is None else int(floor)

    async def delete_sessions(self, session_ids: Sequence[str]) -> None:
        """Every key and index entry of each session, in one transaction (module docstring)."""
        await self.flush()  # what was enqueued before lands first: nothing comes back after
        async with self._write_lock:
            sids = list(dict.fromkeys(session_ids))
            try:
                await _delete(self._redis(), self._keys, await self._records(sids), sids)
            except _TRANSIENT as exc:
                raise StoreError(f"cannot delete from store {self._where}: {_reason(exc)}") from exc

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
            top = f"({_index_member(cursor)}"

        async def page(c: coredis.Redis[bytes]) -> list[bytes]:
            async with c.pipeline(transaction=False) as p:
                pages = [
                    p.zrange(i, top, "-", PureToken.BYLEX, rev=True, offset=0, count=limit + 1)
                    for i in indexes
                ]
            members = [m for request in pages for m in await request]
            return sorted(set(members), reverse=True)[: limit + 1]

        members = await self._read(page)
        records = await self._records([_sid_of(m) for m in members[:limit]])
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
        return [r for r in await self._records(sids) if r.current_turn_id is not None]

    async def event_bytes(self, session_id: str) -> int:
        # Redis's own estimate of the events' sorted set (sampled: one command,
        # whatever its size), read once when a session is loaded.
        key = self._keys.events(session_id)
        size = await self._read(lambda c: c.memory_usage(key))
        return int(size or 0)

    async def worker_ids(self, parent_id: str) -> list[str]:
        members = await self._read(lambda c: c.zrange(self._keys.workers(parent_id), 0, -1))
        return [_sid_of(m) for m in members]

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
        except _TRANSIENT as exc:
            raise StoreError(f"cannot read store {self._where}: {_reason(exc)}") from exc

    def _redis(self) -> coredis.Redis[bytes]:
        if self._client is None:
            if self._closing:
                raise StoreError(f"store {self._where} is closed")
            raise StoreError(f"store {self._where} is not open (or is reconnecting)")
        return self._client


async def _delete(
    client: coredis.Redis[bytes], k: _Keys, records: list[SessionRecord], sids: list[str]
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
            member = _index_member(rec)
            p.zrem(k.sessions, [member])
            p.zrem(k.owner(rec.owner), [member])
            if rec.parent_session_id:
                p.zrem(k.workers(rec.parent_session_id), [member])
            else:
                p.srem(k.roots(rec.owner), [rec.id])
        p.srem(k.open, sids)
        for chunk in range(0, len(ages), PURGE_CHUNK):
            p.zrem(k.ets, ages[chunk : chunk + PURGE_CHUNK])
        per_session = (k.session, k.messages, k.message_order, k.events, k.lease, k.workers)
        p.delete([key(sid) for sid in sids for key in per_session])


def _reason(exc: BaseException) -> str:
    """One line for an error that may come wrapped in exception groups.

    coredis says "Unable to establish a connection to host:port" whatever the
    cause: the system's reason (connection refused, name or service not
    known, ...) from the chain of causes is added to it.
    """
    exc = first_leaf(exc)
    line = str(exc) or type(exc).__name__
    why = None
    cause = exc.__cause__
    while cause is not None:
        cause = first_leaf(cause)
        if isinstance(cause, OSError) and cause.errno:
            why = os.strerror(cause.errno) if cause.errno > 0 else cause.strerror
        cause = cause.__cause__
    if why and why.lower() not in line.lower():
        line = f"{line}: {why.lower()}"
    return line


def _check_limit(limit: int) -> None:
    if limit < 0:
        raise ValueError(f"limit must be >= 0, not {limit}")


class RedisLeases:
    """The session leases of one node on a Redis store (:class:`gateway.store.lease.Leases`)."""

    shared = True

    def __init__(self, store: RedisStore, node_id: str, ttl_ms: int) -> None:
        self.node_id = node_id
        self.ttl_ms = ttl_ms
        self._store = store
        self._keys = store._keys

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

        return await self._store._read(take)

    async def renew(self, session_ids: Sequence[str]) -> list[str]:
        sids = list(session_ids)

        async def renew(c: coredis.Redis[bytes]) -> list[object]:
            async with c.pipeline(transaction=False) as p:
                answers = [
                    p.eval(_RENEW_LEASE, [self._keys.lease(s)], [self.node_id, self.ttl_ms])
                    for s in sids
                ]
            return [await a for a in answers]

        answers = await self._store._read(renew)
        return [s for s, answer in zip(sids, answers, strict=True) if answer != 1]

    async def release(self, session_ids: Sequence[str]) -> None:
        sids = list(session_ids)

        async def release(c: coredis.Redis[bytes]) -> None:
            async with c.pipeline(transaction=False) as p:
                for s in sids:
                    p.eval(_RELEASE_LEASE, [self._keys.lease(s)], [self.node_id])

        if sids:
            await self._store._read(release)

    async def holder(self, session_id: str) -> str | None:
        data = await self._store._read(lambda c: c.get(self._keys.lease(session_id)))
        return None if data is None else data.decode()


# --- the store's keys the per-key limits read (gateway.node.limits) ----------------


def record_and_owner_keys(prefix: str) -> tuple[tuple[str, str], str]:
    """A session record's key as ``(before, after)`` its id; an owner index's key before the owner.

    ``max_sessions_per_key`` on Redis counts an owner's index and checks that
    the records of the sessions being created have landed.
    """
    keys = _Keys(prefix)
    before, _, after = keys.session("\0").partition("\0")
    return (before, after), keys.owner("")

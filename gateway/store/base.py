"""The trace store's interface: what the gateway persists, and how it asks.

The gateway persists three things (docs/protocol.md §5: "catalog events are
persisted in the trace store and replayable"): sessions, the messages of their
conversations, and catalog events. Streaming-only events are never persisted;
a reconnect restores them from the message store instead (docs/protocol.md §3).

Two numbers make event ids safe across restarts (docs/protocol.md §1: event ids
"are never reused (the high-water mark survives a restart)"):

- the **event ceiling**: every sequence number up to it may have been handed
  out, streaming-only ones included, so a restarted node starts above it. A
  node takes its ids in blocks the store allocates (:meth:`Store.reserve_event_ids`),
  and the ceiling is the top of the last block allocated: on Redis, the
  deployment's counter, so the blocks of several nodes never overlap;
- the **retention floor**: the highest sequence number ever purged, so a
  ``since`` cursor at or below it is ``cursor_expired`` (docs/protocol.md §3).

Writes are a synchronous enqueue that never blocks the session: a writer task
(:meth:`Store.run`) applies them in order, in batches (a group commit). Each
put takes a ticket; :attr:`Store.committed` says how far the writes are
durable, and ``on_commit`` is told each time it moves. The gateway holds a
session's live events behind its pending catalog events until then, so no
client ever receives an event the store could lose (docs/protocol.md §9).
Reads see only what has been committed; the session keeps the in-memory tail.

:class:`Store` is a ``typing.Protocol`` so that a networked backend can be
added next to the embedded SQLite one without the gateway noticing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal, Protocol

import msgspec
import trio

from gateway.errors import StoreError
from gateway.protocol.shapes import Message, StopReason
from gateway.store.idempotency import Claim, Claimed
from gateway.store.lease import Leases
from gateway.store.outbox import Lane, OutboxEntry, Routes


class StoreState(msgspec.Struct, frozen=True):
    """What :meth:`Store.open` found: both numbers are 0 on a new store."""

    event_ceiling: int
    retention_floor: int


class QueuedTurn(msgspec.Struct):
    """A turn accepted while another ran (``if_busy: "queue"``, docs/protocol.md §2
    "A busy session"): it starts, in order, once the turns before it ended.

    ``trace``: the trace context its request came with (gateway.telemetry).
    ``steering``: a steer (``if_busy: "steer"``) waiting for the running turn of
    that id to take it; a steer the turn did not take is queued as a turn of
    its own (``None``), announced then with ``turn.queued``.
    """

    turn_id: str
    user_message: Message
    trace: dict[str, str] = {}
    steering: str | None = None


class Rewind(msgspec.Struct):
    """One edit of the conversation (``rewind_to``, docs/protocol.md §2 "Edit and
    regenerate"): from ``before_message_id`` up to turn ``turn_id``'s user message,
    the messages left the conversation (they stay stored, rewound)."""

    before_message_id: str
    turn_id: str


class PushConfig(msgspec.Struct, frozen=True):
    """An A2A push notification config of one of the session's tasks (docs/doors/a2a.md
    "Push notifications"): its events go, in the outbox, to ``url`` with ``token``."""

    id: str
    turn_id: str
    url: str
    token: str = ""


class SessionRecord(msgspec.Struct):
    """One session as stored (the durable part of docs/protocol.md §6's SessionSummary)."""

    id: str
    created_at: int
    workspace_path: str
    active_model: str
    metadata: dict[str, Any]
    parent_session_id: str | None
    routing_policy_version: str
    cost_so_far_usd: float = 0.0
    turn_count: int = 0
    # The turn in flight and the id of its turn.started (docs/protocol.md §9):
    # written with turn.started and cleared with the turn's terminal event, in
    # the same commit, so a restart knows which turns to close.
    current_turn_id: str | None = None
    current_turn_seq: int = 0
    # Who the session belongs to (docs/protocol.md §2): the id of the API key that
    # created it (gateway.tenancy.key_id: a digest, never the key), a worker's
    # its parent's; "" (no owner, seen by every key) where no keys were configured.
    # A default, so records stored before owners existed decode as ownerless.
    owner: str = ""
    # The agent it runs (docs/protocol.md §11), fixed at creation; records stored
    # before agents existed run the default agent.
    agent: str = "default"
    # Its queued turns, in order (docs/protocol.md §2 "A busy session"): written
    # with their turn.queued, so a queued turn is as durable as a started one.
    queued_turns: list[QueuedTurn] = []
    # Its edits, oldest first (docs/protocol.md §2 "Edit and regenerate"): written
    # with their history.rewound.
    rewinds: list[Rewind] = []
    # Its tasks' A2A push configs (docs/doors/a2a.md "Push notifications"), gone with it.
    push_configs: list[PushConfig] = []


class FileRecord(msgspec.Struct, frozen=True):
    """A file of a session, without its bytes (docs/protocol.md §2 "Files").

    ``file_id`` is derived from ``sha256`` (gateway.ids.file_id_of): a session
    stores the same bytes once. ``owner`` is the session's, so a key's files
    are counted against ``[limits] max_file_mb_per_key`` however many sessions
    hold them.
    """

    file_id: str
    session_id: str
    owner: str
    sha256: str
    media_type: str
    size: int
    created_at: int


FileRefusal = Literal["session_not_found", "too_many_files", "quota_exceeded"]
"""Why :meth:`Store.put_file` stored nothing."""


class StoredEvent(msgspec.Struct):
    """One persisted catalog event.

    ``data`` is the event's JSON exactly as it was sent on the wire: a replay
    re-sends these bytes, so a replayed event is byte-identical to the live one.
    """

    seq: int
    session_id: str
    type: str
    ts: int
    data: bytes


class StoredMessage(msgspec.Struct):
    """A message and, for an assistant message, how its live ``message.complete`` looked.

    A replay rebuilds ``message.complete`` from the message store (PROTOCOL
    section 3) with the same id, ``ts`` and ``stop_reason`` as the live one, so
    the rebuilt event sits exactly where the live one was: ``Message`` itself
    carries neither the stop reason nor the event's time. All three are ``None``
    for user messages and messages that never completed.
    """

    message: Message
    complete_event_id: str | None
    stop_reason: StopReason | None = None
    complete_ts: int | None = None


class Store(Protocol):
    """The trace store. One instance per node, owned by the server's nursery.

    Lifecycle: ``await open()``, then ``await nursery.start(store.run)``, then
    any reads and writes, then ``await aclose()``.
    """

    async def open(self) -> StoreState:
        """Open the store, creating its schema if needed.

        Raises:
            StoreError: the store cannot be opened (bad path, not a store, wrong
                schema version).
        """
        ...

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The batching writer loop.

        Calls ``task_status.started()`` once ready; returns once :meth:`aclose`
        has been requested and everything pending is written.

        A failed write is retried (transient failures) or written row by row
        (rows the schema refuses are skipped and reported): the writer never
        gives up while it runs.
        """
        ...

    async def aclose(self) -> None:
        """Write everything pending, even from a cancelled scope, and close. Idempotent."""
        ...

    def put_session(self, rec: SessionRecord) -> None:
        """Enqueue an upsert of a session (by id).

        A session's ``owner`` is fixed by its first write: an upsert never
        changes it, and one whose owner is not the stored record's changes
        nothing (SQLite leaves the row; Redis refuses the write, reported as a
        row the store refused).
        """
        ...

    async def insert_session(self, rec: SessionRecord) -> SessionRecord | None:
        """Insert a new session now, unless its id is taken; the record that has it if so.

        One atomic step of the store (SQLite: one transaction; Redis: one script,
        across every node on it): of two creations of one id, on this node or
        any other, exactly one inserts and the other is told whose the id is
        (docs/protocol.md §14: a session its client names). Durable when it
        returns ``None``.

        Raises:
            StoreError: the store cannot be written.
        """
        ...

    def put_message(self, msg: StoredMessage) -> int:
        """Enqueue an upsert of a message (by session and message id).

        An ``in_progress`` message may later be rewritten as ``complete``; it
        keeps its place in the conversation.

        Returns:
            The bytes of the message as encoded for the store: what its session's
            stored size counts (``max_session_mb``, docs/protocol.md §15), known at
            no cost since the put encodes it anyway.
        """
        ...

    def put_event(self, ev: StoredEvent, pushes: Sequence[tuple[str, bytes]] = ()) -> None:
        """Enqueue a catalog event, and ``pushes`` in the webhook outbox in the same write:
        (lane's hook, body) of the A2A push notifications made of it (docs/doors/a2a.md)."""
        ...

    def put_pushes(self, ev: StoredEvent, pushes: Sequence[tuple[str, bytes]]) -> None:
        """Enqueue ``pushes`` in the webhook outbox, made of the streaming-only event ``ev``
        (its ``seq`` and ``session_id``; it is not stored)."""
        ...

    committed: int
    """Every put whose ticket is at most this is durable."""

    on_commit: Callable[[int], None] | None
    """Called with :attr:`committed` after each commit, in the Trio thread."""

    on_write_error: Callable[[StoreError], None] | None
    """Told of every failed write (it is retried, or its bad rows skipped)."""

    on_flush: Callable[[float, int], None] | None
    """Told of every commit: how long it took (seconds, retries included) and its rows."""

    on_fenced: Callable[[str], None] | None
    """Told, in the Trio thread and before the commit that carried them is, of each session
    whose writes the store dropped because another node holds its lease (Redis's fence,
    docs/scale-out.md "Fenced at the store"; never on SQLite)."""

    on_refusing: Callable[[StoreError], None] | None
    """Told once, in the Trio thread, when the store begins to refuse every write.

    (:attr:`refusing` is set by then.) The node ends every turn in flight
    (docs/protocol.md §15).
    """

    webhook_routes: Routes
    """Which catalog events a put also puts in the webhook outbox, for whom (store.outbox).

    Set before the first write; empty (the default): none.
    """

    on_outbox: Callable[[], None] | None
    """Called, in the Trio thread, after a commit that put deliveries in the outbox."""

    failure: StoreError | None
    """While writes fail, the last failure; ``None`` once one lands again.

    ``/readyz`` answers 503 ``store_unavailable`` meanwhile (docs/protocol.md §15).
    """

    refusing: StoreError | None
    """Set for good once the store takes no more writes until a restart.

    SQLite: its file was deleted or replaced while the gateway ran (PROTOCOL
    section 15); every request that waits for a commit then gets 503 at once.
    Redis: never (a Redis that comes back is the same store).
    """

    def ticket(self) -> int:
        """The ticket of the last put (a count of puts so far)."""
        ...

    async def wait_committed(self, ticket: int) -> None:
        """Return once every put up to ``ticket`` is durable.

        Raises:
            StoreError: :attr:`refusing`, at once (already, or as soon as the
                store begins to refuse): those puts will never be durable.
        """
        ...

    def reserve_event_ids(self, block: int, granted: Callable[[int], None]) -> None:
        """Allocate the next ``block`` event ids to this node alone (docs/protocol.md §1).

        ``granted(top)`` is called, in the Trio thread, with the block's last id:
        the node may issue ``top - block + 1`` to ``top``. Blocks never overlap,
        whichever node asked, and every block lies above every id stored or
        allocated before it, across restarts (the stored ceiling only grows).

        - SQLite (one node): granted at once (the next block above the ceiling);
          the raised ceiling is enqueued like a put: follow with :meth:`flush`
          before issuing ids above the previously durable ceiling.
        - Redis: granted once the writer's transaction that allocates it (an
          atomic increment of the deployment's counter) has been answered: it
          is enqueued like a put, and :meth:`flush` returns after the grant.
        """
        ...

    def leases(self, node_id: str, ttl_ms: int) -> Leases:
        """This node's session leases on this store (:mod:`gateway.store.lease`).

        SQLite: every lease is this node's (it is the only one). Redis: one key
        per session with an expiry, shared by every node of the deployment.
        """
        ...

    async def flush(self) -> None:
        """Return once everything enqueued before the call is durable (retrying as needed)."""
        ...

    async def release_memory(self) -> None:
        """Give back what the store caches in this process (sessions left memory).

        SQLite: each connection's page cache (``PRAGMA shrink_memory``); it
        fills again from the file as reads need it. Redis: nothing (the cache
        is the server's).
        """
        ...

    async def get_session(self, session_id: str) -> SessionRecord | None:
        """The session, or ``None`` if the store does not know it."""
        ...

    async def list_sessions(
        self, *, limit: int, before: str | None, visible_to: str | None = None
    ) -> tuple[list[SessionRecord], bool]:
        """One page of ``GET /sessions`` (docs/protocol.md §2), newest first.

        Order: ``created_at`` descending, then ``id`` descending.

        Args:
            limit: the page size (>= 0).
            before: a session id: only sessions strictly after it in that order.
                An id the store does not know gives an empty page.
            visible_to: a key id: only the sessions it owns and those with no
                owner (``""``), filtered before the page is cut; ``None``: all.

        Returns:
            The page and whether more sessions follow it.
        """
        ...

    async def load_messages(self, session_id: str) -> list[StoredMessage]:
        """The whole conversation, in insertion order (to load a session)."""
        ...

    async def sessions_per_owner(self) -> dict[str, int]:
        """How many sessions each owner has, workers included (``max_sessions_per_key``).

        A worker belongs to its parent's owner and counts against the same limit
        (docs/protocol.md §15, "Limits that hold").
        """
        ...

    async def event_bytes(self, session_id: str) -> int:
        """The bytes of the session's stored events (their wire JSON), read once when it is loaded.

        With its messages' sizes, the session's stored size that
        ``max_session_mb`` bounds (docs/protocol.md §15); from then on the session
        counts what it writes, in memory, and never asks again.
        """
        ...

    async def open_turns(self) -> list[SessionRecord]:
        """Every session whose ``current_turn_id`` is set, or with queued turns: turns a
        restart must close, and turns it must start."""
        ...

    async def worker_ids(self, parent_id: str) -> list[str]:
        """The ids of a session's worker sessions, oldest first."""
        ...

    async def events_after(
        self, session_ids: Sequence[str], after_seq: int, limit: int
    ) -> list[StoredEvent]:
        """Events of any of ``session_ids`` with ``seq > after_seq``, ascending, at most ``limit``.

        The replay of docs/protocol.md §3; several ids when worker sessions are included.
        """
        ...

    async def delete_sessions(self, session_ids: Sequence[str]) -> None:
        """Delete sessions for good: records, messages, events, files, index entries, leases.

        ``DELETE /sessions/{id}`` (docs/protocol.md §13) names the session and
        every worker under it. One transaction (SQLite), one ``MULTI``/``EXEC``
        (Redis), taken between two of the writer's batches: what was enqueued
        before the call is written first, so no batch lands after it and
        brings a row back. An id the store does not know is no error.

        Raises:
            StoreError: the store did not answer (nothing was deleted, or all).
        """
        ...

    # --- files (docs/protocol.md §2 "Files") ---------------------------------

    async def put_file(
        self, rec: FileRecord, data: bytes, *, max_per_session: int, owner_quota_bytes: int
    ) -> FileRecord | FileRefusal:
        """Store a file of a session now, outside the group commit, in one atomic step.

        The session must exist (a file never outlives, nor lands after, its
        session's deletion); a file of the same id already there is the answer
        (stored once per session, counted once). Otherwise the session may hold
        at most ``max_per_session`` files and ``rec.owner`` at most
        ``owner_quota_bytes`` of files across its sessions (0: no limit each),
        checked and counted in the same step, across every node of the store.
        Durable when it returns a record.

        Raises:
            StoreError: the store cannot be written.
        """
        ...

    async def get_file(self, session_id: str, file_id: str) -> tuple[FileRecord, bytes] | None:
        """A file of the session and its bytes, or ``None`` (unknown here, or another session's)."""
        ...

    async def files_of(self, session_id: str) -> list[FileRecord]:
        """The session's files, without their bytes, oldest first."""
        ...

    async def copy_files(self, source_id: str, target_id: str, owner: str) -> None:
        """Give session ``target_id`` (of ``owner``) a copy of every file of ``source_id``.

        A fork's (docs/protocol.md §2 "Forks"): its messages name the same files.
        Counted against ``owner``'s bytes, never refused (the fork was).
        """
        ...

    # --- the webhook outbox (gateway.store.outbox, docs/doors/webhooks.md) ---

    async def outbox_lanes(self) -> list[Lane]:
        """Every (webhook, session) with a delivery pending.

        Raises:
            StoreError: the store did not answer.
        """
        ...

    async def outbox_lane(self, lane: Lane, after_seq: int, limit: int) -> list[OutboxEntry]:
        """The lane's pending deliveries after ``after_seq``, in event order, at most ``limit``."""
        ...

    async def outbox_depth(self) -> int:
        """How many deliveries are pending."""
        ...

    async def outbox_delete(self, done: Sequence[OutboxEntry]) -> None:
        """Delete deliveries made or dropped, written at once (outside the group commit)."""
        ...

    async def outbox_claim(
        self, lanes: Sequence[Lane], node_id: str, ttl_ms: int, *, renew: bool = False
    ) -> list[Lane]:
        """Claim these lanes for ``node_id``, or extend its claims; the ones it holds now.

        A lane is delivered by the one node holding its claim; a claim not
        extended lapses after ``ttl_ms`` (Redis: gateway.store.redis.outbox).
        ``renew``: only extend the claims ``node_id`` holds (one that lapsed is
        not taken again). SQLite has one node: every lane is its own.
        """
        ...

    async def outbox_release(self, lanes: Sequence[Lane], node_id: str) -> None:
        """Drop ``node_id``'s claims on these lanes (another's is left alone)."""
        ...

    # --- idempotency records (gateway.store.idempotency, docs/protocol.md §13) ---

    async def claim_request(self, owner: str, key: str, claim: Claim, now_ms: int) -> Claimed:
        """Claim ``owner``'s ``key`` for one attempt (:func:`gateway.store.idempotency.decide`).

        Atomic across every node of the store; written at once, outside the
        group commit. ``now_ms``: the SQLite store's clock; Redis reads its own.
        The record's ``holder`` (new or taken) is what :meth:`settle_request`
        takes: the store may qualify the claim's (SQLite: with its process, so
        a restart frees what the previous process held).

        Raises:
            StoreError: the store did not answer.
        """
        ...

    async def settle_request(
        self, owner: str, key: str, holder: str, status: int | None, body: bytes
    ) -> None:
        """Record ``holder``'s answer, or (``status`` ``None``) let the key go, target kept.

        Raises:
            StoreError: the store did not answer.
        """
        ...

    async def purge_before(self, ts_ms: int) -> int:
        """Delete every event with ``ts < ts_ms`` (retention, docs/reference.md ``[store]``).

        Returns:
            The retention floor, persisted: the highest sequence number ever
            purged (unchanged if nothing was purged).
        """
        ...


EVENT_PAGE = 5000
"""How many events one :meth:`Store.events_after` read asks for."""


async def each_event_after(
    store: Store, session_ids: Sequence[str], after_seq: int, take: Callable[[StoredEvent], None]
) -> None:
    """Hand ``take`` every stored event of ``session_ids`` after ``after_seq``, in id order.

    Read page by page (:data:`EVENT_PAGE`); an exception from ``take`` (a
    replay over its size) stops the reading.
    """
    while True:
        rows = await store.events_after(session_ids, after_seq, EVENT_PAGE)
        for row in rows:
            take(row)
        if len(rows) < EVENT_PAGE:
            return
        after_seq = rows[-1].seq

"""A live session: its state, its emission path, its views, and its runtime nursery.

Runtime shape::

    session nursery  (Session.run)
    ├── "agent-loop <id>"   runs turns: drives the provider, runs tools, emits
    │                       the turn's domain events (gateway.session.agent,
    │                       docs/protocol.md §7)
    └── "translator <id>"   streams the LLM call in flight: drains raw provider
                            events from the call's inbox in batches, translates
                            them and emits each batch at once (gateway.session.call)

Where the rest of a session lives: its turn phases in :mod:`~gateway.session.turn`,
the cancel sequences in :mod:`~gateway.session.closing` (pure) and
:mod:`~gateway.session.closing_live` (live), its subscriptions and
fan-out in :mod:`~gateway.session.hub`, what a client gets when it subscribes in
:mod:`~gateway.session.seam`, its permission requests in
:mod:`~gateway.session.permissions`.

Emission (:meth:`Session.emit`) is synchronous and is the only way an event
leaves the session: it assigns the node-wide id, encodes and frames the event
once, enqueues catalog events on the store's batching writer and the session's
in-memory tail, and fans the batch out through the hub. Every state change that
a snapshot or replay reads (a finished message, a tool result) happens in the
same synchronous step as the event that announces it, so a snapshot can never
fall between the two.

Durability first (docs/protocol.md §9): a batch that carries a catalog event is
*held* until the store has committed it, and every later batch of the same
session family (a session and its workers, whose events share streams) waits
behind it, so the order on the wire never changes and no client ever receives
a catalog event the store could lose. The node releases held batches when the
store reports a commit (:meth:`gateway.node.durability.Durability.on_commit`). A snapshot or a
replay, which read state directly, wait for the commit of everything they read
before they are sent.

A session counts its stored size as it writes (docs/protocol.md §15,
``max_session_mb``): the bytes of its catalog events' wire JSON and of each
message as the store encodes it (a rewritten message counts once, at its
latest size), starting from what the store held when it was loaded. No store
read per turn: :meth:`Session.submit_turn` compares a number. Each session
counts by itself: a worker's data is the worker's, not its parent's.

A session is a failure boundary: an exception in its agent loop or its
translator task is logged with its traceback, counted
(``gateway_session_failures_total``), the turn in flight is closed with
``turn.completed`` (``stop_reason: error``), and the session goes on with its
next turn (:meth:`Session.run`). Nothing of it reaches another session or the
node.
"""

from __future__ import annotations

import functools
import logging
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Literal, Protocol

import msgspec
import trio

from gateway.cluster import ops
from gateway.errors import Refused
from gateway.ids import format_event_id, new_turn_id, now_ms
from gateway.logs import event
from gateway.metrics import Metrics
from gateway.protocol.events import (
    EVENT_TYPES,
    Event,
    FeedbackRecorded,
    Payload,
    StreamEvent,
    stream_event,
)
from gateway.protocol.frames import encode
from gateway.protocol.framing import event_frame
from gateway.protocol.http import IfBusy
from gateway.protocol.shapes import Message, PendingPermission, SessionSummary, ToolInfo
from gateway.session import admission, busy, history, rewind, sampling_host, tool_host
from gateway.session.agent import AgentLoop, AgentServices
from gateway.session.call import CALL_TYPES, CallStream, Completion
from gateway.session.checkpoints import Checkpoints
from gateway.session.compaction import plan
from gateway.session.hub import Emitted, Hub, Subscriber
from gateway.session.permissions import Permissions, decide_in
from gateway.session.rollup import Rollup
from gateway.session.sequencer import EventSequencer
from gateway.session.supervisor import Supervisor
from gateway.session.tail import Tail
from gateway.session.turn import Turn
from gateway.store.base import SessionRecord, Store, StoredEvent, StoredMessage
from gateway.tenancy import Limits
from gateway.tools.workspace import display_name

if TYPE_CHECKING:
    from gateway.tools.registry import ToolContext

log = logging.getLogger("gateway.session")


PushNotes = Callable[["Session", Emitted, Payload], Sequence[tuple[str, bytes]]]
"""The outbox deliveries (lane's hook, body) made of a catalog event of a session with
A2A push configs (``SessionRecord.push_configs``; gateway.doors.a2a.push), put in the
same write as the event."""


class FamilyJoins(Protocol):
    """What the seam tells the node's placement (gateway.node.placement)."""

    def joined(self, root_id: str, cut: int) -> None:
        """The family's only client here has everything up to ``cut``."""
        ...


class NodeServices(AgentServices, Protocol):
    """What a session uses of its node (:class:`gateway.node.node.Node` is the one)."""

    store: Store
    sequencer: EventSequencer
    checkpoints: Checkpoints | None  # None: ``[store] checkpoint_ms = 0``
    metrics: Metrics
    retention_floor: int
    shutting_down: bool
    push_notes: PushNotes | None  # the A2A door's push notifications (docs/doors/a2a.md)

    def holding(self, family: Session) -> None:
        """``family`` has batches waiting for their commit."""
        ...

    def tool_infos(self, agent: str, session_id: str | None = None) -> list[ToolInfo]:
        """An agent's tools, as a summary lists them (docs/protocol.md §6)."""
        ...

    def session_closed(self, session: Session) -> None:
        """The session's tasks ended here (its session-scope MCP servers stop)."""
        ...

    def runs_here(self, session_id: str) -> bool:
        """Whether this node may run the session's turns (it holds its lease)."""
        ...

    def relay(self, family: Session, session: Session, events: list[Emitted]) -> None:
        """A batch this node released, for the other nodes' clients (gateway.cluster)."""
        ...

    def forward(self, session: Session, op: ops.Warn | ops.Unregistered) -> None:
        """Carry ``op`` out on the node running the session, without waiting (a warning)."""
        ...

    async def ask_owner(
        self, session: Session, op: ops.Operation, *, patient: bool = False
    ) -> ops.Answer | None:
        """Run ``op`` on the node running the session; ``None``: that is this node."""
        ...

    async def watch(self, session: Session, *, tell_owner: bool = True) -> None:
        """Receive the live batches of the session's family from the node running it."""
        ...

    @property
    def placement(self) -> FamilyJoins:
        """Where the session's family runs and what was relayed here (gateway.node.placement)."""
        ...

    async def cancel_turn(
        self, session: Session, turn_id: str, reason: str, requested_by: str
    ) -> None:
        """:meth:`Session.cancel_turn` on the node running the session."""
        ...

    @property
    def limits(self) -> Limits:
        """The per-key limits (a worker's turn counts against its key: tool_host)."""
        ...

    async def durable_or_503(self) -> None:
        """Return once everything put so far is committed, or raise 503 ``store_unavailable``."""
        ...

    async def create_session(
        self,
        *,
        workspace_path: str | None = None,
        model: str | None = None,
        metadata: dict[str, Any] | None = None,
        parent: Session | None = None,
    ) -> Session:
        """Create and start a session (a worker, when ``parent`` is given)."""
        ...


def summary_of(
    record: SessionRecord,
    turn: Turn | None = None,
    pending: list[PendingPermission] | None = None,
    tools: list[ToolInfo] | None = None,
) -> SessionSummary:
    """The ``SessionSummary`` of docs/protocol.md §6, of a live session or a stored record.

    ``workspace_path`` is the workspace's name, never the host's path of the
    workspace root (docs/protocol.md §15, gateway.tools.workspace.display_name).
    """
    return SessionSummary(
        id=record.id,
        agent=record.agent,
        tools=tools or [],
        workspace_path=display_name(record.workspace_path),
        active_model=record.active_model,
        routing_policy_version=record.routing_policy_version,
        cost_so_far_usd=record.cost_so_far_usd,
        turn_count=record.turn_count,
        current_turn_id=turn.id if turn else None,
        current_turn_status="in_flight" if turn else None,
        parent_session_id=record.parent_session_id,
        pending_permissions=pending or [],
        queued_turns=busy.queued_info(record) or msgspec.UNSET,
        tool_progress=list(turn.progress.values()) if turn and turn.progress else msgspec.UNSET,
    )


def emitted(
    seq: int, item: Payload | StreamEvent, session_id: str, turn_id: str | None, ts: int
) -> tuple[Emitted, bool]:
    """One event as it leaves a session, encoded and framed once; whether it is a catalog
    event (stored, kept in the tail, held until its commit)."""
    se = item if isinstance(item, StreamEvent) else stream_event(item)
    spec = EVENT_TYPES[se.type]
    data = encode(
        Event(format_event_id(seq), se.type, session_id, turn_id, ts, spec.actor, se.payload)
    )
    em = Emitted(seq, se.type, spec.actor, session_id, turn_id, ts, data, event_frame(data))
    return em, spec.catalog


def push_notes(
    session: Session, em: Emitted, item: Payload | StreamEvent, catalog: bool
) -> Sequence[tuple[str, bytes]]:
    """The A2A push notifications made of ``em`` (:data:`PushNotes`), for the store's
    ``put_event`` of a catalog event; a streaming-only one's (a message's completion: its
    text) are put in the outbox here, in the same batch as what the step stores."""
    notes = session.node.push_notes if session.record.push_configs else None
    if notes is None:
        return ()
    pushes = notes(session, em, item.payload if isinstance(item, StreamEvent) else item)
    if catalog or not pushes:
        return pushes
    session.node.store.put_pushes(StoredEvent(em.seq, em.session_id, em.type, em.ts, b""), pushes)
    return ()


def stored(message: Message, completion: Completion | None) -> StoredMessage:
    """A message as the store keeps it: with its completion's event id, stop reason and
    time once it is finished."""
    if completion is None:
        return StoredMessage(message, None, None, None)
    return StoredMessage(
        message, format_event_id(completion.seq), completion.stop_reason, completion.ts
    )


def new_hub(node: NodeServices, parent: Session | None) -> Hub:
    """A session's hub, its delta rollup windows ended by the node's clock (docs/protocol.md
    §3 "Delta rollup"); on a node without one (a test's), nothing is rolled up."""
    clock = getattr(node, "rollups", None)
    return Hub(parent.hub if parent else None, node.metrics, Rollup, clock)


def new_calls(session: Session) -> CallStream:
    """A session's calls' stream, batching and storing as ``[stream]`` and ``[store]`` say."""
    config = session.node.config
    return CallStream(
        session,
        session.hub.backlog,
        config.stream.batch_window_ms / 1000,
        session.node.metrics,
        session.node.checkpoints,
    )


class Session(sampling_host.ServerRequests):
    """One session's state and runtime. Created and owned by :class:`gateway.node.node.Node`."""

    def __init__(
        self,
        node: NodeServices,
        record: SessionRecord,
        stored: Iterable[StoredMessage] = (),
        parent: Session | None = None,
        event_bytes: int = 0,
    ) -> None:
        self.node = node
        self.record = record
        self.parent = parent
        # A root session is at depth 0, its workers at 1, theirs at 2 (max_delegate_depth).
        self.depth: int = parent.depth + 1 if parent else 0
        # In the store, in bytes (module docstring): its events', each message's latest.
        self.event_bytes = event_bytes
        self.message_bytes: dict[str, int] = {}
        # The family shares streams (a parent's clients may take its workers'
        # events), so it shares the hold: batches waiting for their commit.
        self.family: Session = parent.family if parent else self
        self.awaiting_commit: deque[tuple[int, Session, list[Emitted]]] = deque()
        self.workers: list[Session] = []
        self.hub: Hub = new_hub(node, parent)
        self.joining: set[object] = set()  # clients in their seam, not yet cut (seam)
        self.messages: list[Message] = []
        self.completions: dict[str, Completion] = {}
        self._load(stored)
        self.turn: Turn | None = None
        self.steered = busy.Pulse()  # fired when a steer for the running turn is kept
        self.permissions = Permissions(record.id)
        self.calls = new_calls(self)
        stream = node.config.stream
        self.tail = Tail(stream.replay_max_events, stream.tail_max_bytes, node.sequencer.last)
        # A turn, and at most one compaction queued ahead of it (compact()).
        self.supervisor = Supervisor()  # its turns' queue and its tasks' failure boundary
        self.agent: AgentLoop | None = None  # once run() started it
        self.fenced = False  # stopping after a lost lease: nothing more is emitted here
        self.deleted = False  # DELETE /sessions/{id} took it (gateway.node.deletion)
        self.deleting = False  # a DELETE is under way: nothing queued starts (busy)
        # Unloading (docs/protocol.md §13, gateway.node.unloading): the trio time it was
        # last used, the requests holding it now, and its tasks' end.
        self.used_at = 0.0
        self.pins = 0
        self.ended = trio.Event()

    def _load(self, stored: Iterable[StoredMessage]) -> None:
        """Take the conversation as stored, its rewinds applied (gateway.session.history)."""
        h = history.read(stored, self.record.rewinds)
        self.messages, self.rewound, self.completions, self.message_bytes, self.last_ts = h.parts()

    def reload(
        self, record: SessionRecord, stored: Iterable[StoredMessage], floor: int, event_bytes: int
    ) -> None:
        """Take the store's state of a session another node ran until now (its lease is ours).

        ``floor``: every event id issued before is at most this, and a replay
        reads everything up to it from the store (docs/protocol.md §3).
        ``event_bytes``: the size of its stored events (:meth:`Store.event_bytes`).
        """
        self.record = record
        self._load(stored)
        self.event_bytes = event_bytes
        self.tail.reset(max(floor, self.node.sequencer.last))

    @property
    def id(self) -> str:
        return self.record.id

    @property
    def stored_bytes(self) -> int:
        """What the session holds in the store, in bytes (``max_session_mb``; module docstring)."""
        return self.event_bytes + sum(self.message_bytes.values())

    # --- emission ------------------------------------------------------------

    def emit(self, payloads: Iterable[Payload | StreamEvent], turn_id: str | None) -> list[Emitted]:
        """Give each event its id and send the batch on its way (module docstring).

        Nothing is emitted by a session that is stopping after its lease was
        lost (:meth:`stop_here`): another node runs it.
        """
        if self.fenced:
            return []
        node = self.node
        seqr = node.sequencer
        store = node.store
        # A wall clock stepped back repeats the last ts (docs/protocol.md §4).
        ts = self.last_ts = max(now_ms(), self.last_ts)
        sid = self.id
        out: list[Emitted] = []
        catalog = False
        for item in payloads:
            em, in_catalog = emitted(seqr.next(), item, sid, turn_id, ts)
            pushes = push_notes(self, em, item, in_catalog)
            if in_catalog:
                store.put_event(StoredEvent(em.seq, sid, em.type, ts, em.data), pushes)
                self.event_bytes += len(em.data)
                catalog = True
                self.tail.append(em)
            out.append(em)
        if not out:
            return out
        call = self.calls.current
        if call is not None and out[0].type in CALL_TYPES:
            call.last_seq = out[-1].seq
        node.metrics.events_emitted(out)
        family = self.family
        if catalog:  # held until its commit (module docstring)
            family.awaiting_commit.append((store.ticket(), self, out))
            node.holding(family)
        elif family.awaiting_commit:  # behind the family's held batches, released with the last
            family.awaiting_commit.append((family.awaiting_commit[-1][0], self, out))
        else:
            self.release(out)
        return out

    def release(self, out: list[Emitted]) -> None:
        """A batch is free to go (durable, or streaming only): here, and to the other nodes."""
        self.publish(out)
        self.node.relay(self.family, self, out)

    def publish(self, out: list[Emitted], *, from_worker: bool = False) -> None:
        """Fan a batch out to this node's clients, then apply the slow-client rule (section 3).

        ``from_worker``: a batch of a worker this node has not loaded (a
        replica's relay: gateway.node), for the subscriptions that take workers'.
        A failure in a subscriber is contained here: logged, counted, and the
        session goes on (the connection's own task notices its socket).
        """
        try:
            for sub in self.hub.publish(out, trio.current_time(), from_worker=from_worker):
                sub.overflowed()
        except Exception as exc:
            self.failed("hub", exc, out[0].turn_id if out else None)

    def warn(self, subscription: str, reason: str, detail: str) -> None:
        """Emit ``bus.handler_warning`` (docs/protocol.md §3, §8), on the node running it."""
        self.node.forward(self, ops.Warn(subscription, reason, detail))

    def unregistered(self, sub: Subscriber, reason: str) -> None:
        """Drop a subscription and record ``bus.subscriber_unregistered``."""
        if not self.hub.unsubscribe(sub):
            return
        self.node.forward(self, ops.Unregistered(sub.name, reason))

    # --- views -----------------------------------------------------------------

    def summary(self) -> SessionSummary:
        tools = self.node.tool_infos(self.record.agent, self.id)
        return summary_of(self.record, self.turn, self.pending_permissions(), tools)

    def pending_permissions(self) -> list[PendingPermission]:
        """Its own requests still waiting, then its workers', recursively (docs/protocol.md §6).

        Each is listed with the ``session_id`` that asked: a worker's request is
        answered from any of its ancestors (:meth:`decide_permission`).
        """
        return [p for s in self.scope(True) for p in s.permissions.pending()]

    def scope(self, include_workers: bool) -> list[Session]:
        """This session and, when asked, its worker sessions, recursively."""
        out = [self]
        if include_workers:
            for w in self.workers:
                out += w.scope(True)
        return out

    # --- turns -------------------------------------------------------------------

    def submit_turn(
        self, user_message: Message, if_busy: IfBusy = "reject", rewind_to: str | None = None
    ) -> Turn:
        """Take a turn (the turn lock), to run on the agent loop (docs/protocol.md §2).

        Raises:
            Refused: ``turn_in_progress`` (or a message id taken); ``shutting_down``;
                ``session_elsewhere`` (with ``Retry-After``) where several nodes
                share a store and another node holds the session's lease;
                ``store_unavailable`` once the store refuses every write.
        """
        admission.check_store(self.node.store)  # 503 first: the store ended its turns (§15)
        admission.check_idle(self)
        busy.check_new(self, user_message)  # two requests of one message racing: one turn
        admission.check_size(self)
        rewind.check(self, rewind_to, user_message.id)  # §2 "Edit and regenerate"
        turn = Turn(user_message.turn_id or new_turn_id(), user_message, rewind_to=rewind_to)
        self.turn = turn
        self.supervisor.queue_turn(turn)
        return turn

    def compact(self) -> None:
        """Queue a compaction of the model's context (``POST .../compact``, docs/protocol.md §12).

        It runs on the agent loop between two turns: a turn submitted meanwhile
        starts once it is done. A compaction already queued is the same one.

        Raises:
            Refused: ``turn_in_progress``; ``nothing_to_compact`` when
                the model's view holds nothing but the latest turn (and a
                previous summary); 503 as :meth:`submit_turn`.
        """
        admission.check_store(self.node.store)
        admission.check_idle(self)
        if self.supervisor.compaction_queued:
            return
        if plan(self.messages, None) is None:
            raise Refused(
                "nothing_to_compact",
                f"session {self.id}: the model's context holds only its latest turn",
            )
        self.supervisor.queue_compaction()

    async def accepted(self, turn: Turn) -> None:
        """Return once the turn's ``turn.started`` (and its user message) is durable.

        ``POST .../turns`` answers 202 then, so an accepted turn survives a
        crash (docs/protocol.md §9).

        A turn queued behind a ``POST .../compact`` waits for that compaction
        first (bounded by ``[turns] timeout_s``): until it ran, the turn is not
        even started, let alone durable.

        Raises:
            Refused: ``store_unavailable`` past ``commit_timeout_s``.
        """
        await self.supervisor.compacted()
        with trio.move_on_after(self.node.config.store.commit_timeout_s):
            await turn.started.wait()
        # An interrupting turn still waiting for the running one to close is nowhere in
        # the store: it is withdrawn, and refused (docs/protocol.md §2 "A busy session").
        busy.withdraw(self, turn)
        if turn.refused is not None:  # withdrawn, or its session went away
            raise turn.refused
        await self.node.durable_or_503()

    def cancel_turn(self, turn_id: str, reason: str, requested_by: str) -> None:
        """Cancel the turn in flight (docs/protocol.md §8), whoever asks.

        A second cancel of a cancelling turn is a no-op plus ``bus.handler_warning``.

        Raises:
            Refused: ``turn_not_found`` for a turn this session never had;
                ``turn_not_in_flight`` for a finished one.
        """
        # Queued, or taken from the queue but not started (§2 "A busy session"): never starts.
        if busy.cancel_queued(self, turn_id, reason):
            return
        turn = self.turn
        if turn is None or turn.id != turn_id:
            if any(m.turn_id == turn_id for m in (*self.messages, *self.rewound)):
                raise Refused("turn_not_in_flight", f"turn {turn_id} has already ended")
            raise Refused("turn_not_found", f"no turn {turn_id!r} in {self.id}")
        if not turn.request_cancel(reason):
            self.warn(requested_by, "cancel_ignored", f"turn {turn_id} is already cancelling")

    def decide_permission(
        self, perm_id: str, decision: str, content: dict[str, Any] | None = None
    ) -> None:
        """Resolve a pending permission (:meth:`Permissions.decide`).

        ``perm_id`` may be a request of one of its workers, at any depth: PROTOCOL
        section 2 lets ``{id}`` be the session that asked or any of its ancestors.
        A worker runs on its root's node, so the owner that decides holds it too.
        """
        decide_in(self.scope(True), perm_id, decision, content)

    def record_feedback(self, message_id: str, rating: Literal[-1, 1], comment: str | None) -> None:
        """Emit ``feedback.recorded`` for one of its messages (``POST .../feedback``); 404
        ``message_not_found``."""
        message = next((m for m in (*self.messages, *self.rewound) if m.id == message_id), None)
        if message is None:
            raise Refused("message_not_found", f"no message {message_id!r} in {self.id}")
        self.emit([FeedbackRecorded(message_id, rating, comment)], message.turn_id)

    def add_message(self, message: Message, completion: Completion | None = None) -> None:
        """Append or replace a message of the conversation, in memory and in the store."""
        for i, m in enumerate(self.messages):
            if m.id == message.id:
                self.messages[i] = message
                break
        else:
            self.messages.append(message)
        if completion is not None:
            self.completions[message.id] = completion
        if self.fenced:  # another node runs it now: its history is that node's
            return
        self.message_bytes[message.id] = self.node.store.put_message(stored(message, completion))

    def keep_partial(self, message: Message) -> None:
        """Store the streaming message as far as it got (docs/protocol.md §9).

        Without ``open_block_index``: that says where a live stream stands, and
        what is stored is read back only once the stream is over.
        """
        if self.fenced:
            return
        kept = msgspec.structs.replace(message, open_block_index=msgspec.UNSET)
        self.message_bytes[message.id] = self.node.store.put_message(StoredMessage(kept, None))

    def save_record(self) -> None:
        """Store the session record (nothing once fenced: :meth:`stop_here`)."""
        if not self.fenced:
            self.node.store.put_session(self.record)

    def next_turn(self) -> None:
        """The turn ended (or a recovery closed it): the next waiting one starts (busy)."""
        busy.start_next(self)

    def take_steers(self, turn: Turn) -> list[Message]:
        """The messages steered into the running turn join it; those taken (busy)."""
        return busy.take_steers(self, turn)

    def end_turn(self, turn: Turn) -> None:
        """Release the turn lock, in the step that emits the turn's end."""
        if self.turn is turn:
            self.turn = None
        self.used_at = trio.current_time()  # idle from now on (gateway.node.unloading)
        self.node.notify()

    # --- what a tool may do (gateway.tools.registry.ToolSession) ---------------------

    @property
    def cancel_grace_s(self) -> float:
        return self.node.config.server.shutdown_grace_s

    async def elicit(
        self, ctx: ToolContext, message: str, requested_schema: dict[str, Any]
    ) -> tuple[str, dict[str, Any] | None]:
        """An MCP server's question (:func:`gateway.session.tool_host.elicit`)."""
        return await tool_host.elicit(self, ctx, message, requested_schema)

    async def spawn_worker(self, tool_use_id: str) -> Session:
        """A worker session of this one (:func:`gateway.session.tool_host.spawn_worker`)."""
        create = functools.partial(
            self.node.create_session,
            workspace_path=self.record.workspace_path,
            model=self.record.active_model,
            metadata={"delegated_by": tool_use_id},
            parent=self,
        )
        return await tool_host.spawn_worker(self, create)

    def book_worker_cost(self, turn_id: str, cost_usd: float) -> None:
        """A worker turn's cost, on the turn that delegated it (gateway.session.tool_host)."""
        tool_host.book_worker_cost(self, turn_id, cost_usd)

    # --- runtime -------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The session nursery: the agent loop and the translator (module docstring).

        The failure boundary: if either task fails, the failure is logged and
        counted, the turn in flight is closed for every client, and both tasks
        start again for the next turn. A session failing over and over (five
        times within a second) pauses a second before it starts again.
        """
        agent = self.agent = AgentLoop(self, self.node)
        try:
            await self.supervisor.run(self, agent, task_status)
        finally:
            self.node.session_closed(self)  # its session-scope MCP servers stop (section 11)

    def stop_here(self) -> None:
        """Stop running the session on this node at once: its lease is another node's now.

        Its turn is torn down without a further event, message or record
        (fenced meanwhile); the node that holds the lease closes it as
        interrupted (docs/protocol.md §9). The session stays here as a replica.
        """
        self.fenced = True
        self.supervisor.stop()
        self.node.session_closed(self)  # its session-scope MCP servers (section 11)
        # Its batches still waiting for their commit may never be stored (the
        # store drops a session's writes once another node holds its lease):
        # no client anywhere gets them.
        family = self.family
        family.awaiting_commit = deque(
            entry for entry in family.awaiting_commit if entry[1] is not self
        )

    def stopped_here(self) -> None:
        """After :meth:`stop_here`: a replica with nothing in flight, ready to run again."""
        self.turn = None
        self.permissions = Permissions(self.id)
        self.calls = new_calls(self)
        self.fenced = False
        self.node.notify()

    def failed(self, component: str, exc: BaseException, turn_id: str | None = None) -> None:
        """Log a failure caught at this session's boundary, once, and count it."""
        where = f" in turn {turn_id}" if turn_id else ""
        event(
            log, logging.ERROR, "session_failed",
            f"session {self.id}: {component} failed{where}: {type(exc).__name__}: {exc}",
            exc_info=exc, session_id=self.id, turn_id=turn_id, component=component,
            error_type=type(exc).__name__,
        )  # fmt: skip
        self.node.metrics.session_failures.labels(component).inc()


__all__ = ["NodeServices", "Session", "summary_of"]

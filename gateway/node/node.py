"""The gateway node: every session of one daemon, and what they share.

Task tree (a stack dump reads like this)::

    node                      Node.run
    ├── store-writer          the store's batching writer (gateway.store)
    ├── retention             purges events older than retention_hours
    ├── rollup-clock          ends the delta rollup windows of the hubs (gateway.session.rollup)
    ├── lease-keeper          renews this node's session leases (gateway.store.lease)
    ├── cluster               Redis only: the link to the other nodes (gateway.cluster.link)
    ├── recovery              Redis only: closes turns of nodes that died (gateway.node.recovery)
    ├── unloader              sessions unused for idle_unload_s leave memory (node.unloading)
    ├── webhooks              [webhooks.NAME]: the outbox delivered (gateway.webhooks.delivery)
    └── sessions              one child nursery per live session
        └── session <id>      Session.run: agent-loop <id>, translator <id>

Several nodes on one Redis (docs/reference.md "Command line", docs/scale-out.md):
every request for a session may reach any node. The node holding the
session's lease runs it; any other node keeps a *replica* of it for its own
clients: their live events come from the owner over the cluster link (one
publish per batch per family), and whatever acts on the session (a turn, a
cancel, a permission decision, feedback, a snapshot or replay's cut) is a
request to the owner, answered exactly as the owner's own routes would answer
it. Which of the two a node is, is chosen once at start-up (gateway.node.placement).

The node is the composition of its parts, each in a file of its own:

- gateway.node.registry: the sessions live here, created or loaded on first use;
- gateway.node.placement: where each session runs, and the operations sent there;
- gateway.node.failover: taking a session's lease over, and losing it;
- gateway.node.recovery: closing the turns a dead node left in flight;
- gateway.node.attach_tokens: the attach tokens, here or in Redis;
- gateway.node.durability: batches released once their commit is durable;
- gateway.node.forking: a fork of a session, made where the session runs;
- gateway.node.pricing: what a model call cost.

The parts see the node as gateway.node.core.NodeCore, so none of them imports this module.

Shared by all sessions: the config, the store, the node-wide event sequencer
(docs/protocol.md §1), the provider, the tool registry, the attach tokens, the
limits per API key (``gateway.tenancy``) and the metrics. Shutdown
(docs/reference.md "Command line") goes in order: no new turns, in-flight turns
cancelled with ``reason: "shutdown"`` and given
``shutdown_grace_s`` to emit their sequences, sessions stopped, the store
flushed and closed.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import trio

from gateway import runtimes, telemetry
from gateway.agents import AgentProfile, Agents, log_unsandboxed
from gateway.cluster import ops
from gateway.config import Config
from gateway.environment import daemon_env
from gateway.errors import Refused, ShutdownError, StoreError, unavailable
from gateway.ids import now_ms
from gateway.logs import event
from gateway.mcp.servers import McpServers
from gateway.metrics import Metrics
from gateway.node import deletion, recovery, unloading
from gateway.node.attach_tokens import AttachTokens, Tokens
from gateway.node.core import Connection
from gateway.node.durability import Durability
from gateway.node.failover import Failover
from gateway.node.operations import Notice, perform
from gateway.node.placement import Placement, choose
from gateway.node.pricing import pricing
from gateway.node.registry import Registry
from gateway.node.tool_listing import tool_infos
from gateway.protocol.http import IfBusy
from gateway.protocol.shapes import Message, SessionSummary, ToolInfo, Usage
from gateway.providers.base import Provider
from gateway.providers.factory import Providers
from gateway.providers.model_proxy import ModelProxy
from gateway.session import busy, rewind
from gateway.session.agent import TurnHost
from gateway.session.checkpoints import Checkpoints
from gateway.session.files import Files
from gateway.session.hub import Emitted
from gateway.session.rollup import RollupClock
from gateway.session.sequencer import EventSequencer
from gateway.session.session import PushNotes, Session
from gateway.store.base import Store
from gateway.store.lease import LeaseKeeper, new_node_id
from gateway.tenancy import Limits
from gateway.tools.process import ToolProcesses
from gateway.tools.process_slots import ProcessSlots
from gateway.tools.registry import SessionTools, ToolRegistry
from gateway.tools.workspace import Workspaces
from gateway.webhooks.delivery import Deliveries

if TYPE_CHECKING:
    from gateway.cluster.link import Cluster
    from gateway.session.loop_api import RuntimeFactory

log = logging.getLogger("gateway.node")

STORE_REFUSING = "store_unavailable"
"""``turn.cancelled``'s reason for the turns a store that refuses every write ends."""


class Node:
    """One gateway daemon's sessions and shared services (module docstring)."""

    def __init__(
        self,
        config: Config,
        store: Store,
        provider: Provider | Providers,
        tools: ToolRegistry,
        metrics: Metrics | None = None,
    ) -> None:
        self.config = config
        self.store = store
        # Each agent's provider (docs/protocol.md §11); one given alone serves every agent.
        self.providers = provider if isinstance(provider, Providers) else Providers.single(provider)
        self.agents = Agents(config)  # ConfigError: a system_file that cannot be read
        # ConfigError: no extra. The environment as it started (gateway.environment).
        self.traces = telemetry.settings(config.telemetry, daemon_env())
        self.tools = tools  # the built-in tools the daemon enabled; each agent has some of them
        # The MCP servers (gateway.mcp); the daemon sets them, a bare node has none.
        self.mcp: McpServers | None = None
        self.metrics = metrics or Metrics()
        self.metrics.watch(
            turns_in_flight=lambda: sum(s.turn is not None for s in self.sessions.values()),
            connection_states=self._connection_states,
            streams_by_door=lambda: self.limits.streams_by_door,
        )
        # In this process; in Redis once the placement is clustered (gateway.node.attach_tokens).
        self.tokens: Tokens = AttachTokens(config.stream.attach_token_ttl_s)
        self.limits = Limits(config.limits)  # [limits]: counted per API key (gateway.tenancy)
        self.rollups = RollupClock()  # ends the hubs' delta rollup windows (docs/protocol.md §3)
        self.workspaces = Workspaces.from_config(config.sessions)  # docs/protocol.md §15
        self.files = Files(store, config)  # docs/protocol.md §2 "Files"
        # The tool processes of the daemon (the app shares its own); a bare node spawns without
        # a watchdog: its groups are still stopped with their sessions.
        self.processes = ToolProcesses(config.tools)
        # The Claude Code processes of each agent on this node (max_processes).
        self.process_slots = ProcessSlots(config.tools.process_slot_wait_s)
        # Their door to the model API: they never hold the provider key (started when first used).
        self.model_proxy = ModelProxy()
        self.registry = Registry(self)
        self.sessions: dict[str, Session] = self.registry.sessions
        self.durability = Durability(store, config.store, self.metrics)
        self.node_id = new_node_id()  # this process, in the session leases and webhook claims
        # Before the store's first write: it routes the events webhooks want to its outbox.
        self.webhooks = Deliveries.of(config, store, self.metrics, self.node_id)
        self.failover = Failover(self)
        self.push_notes: PushNotes | None = None  # set by the A2A door when push is offered
        self.connections: set[Connection] = set()  # open streams (closed with 1001 on shutdown)
        # Told each session whose tasks end, to drop what they keep for it (AG-UI's runs).
        self.session_listeners: list[Callable[[str], None]] = []
        self.sequencer: EventSequencer
        self.checkpoints = Checkpoints.every(config.store.checkpoint_ms)  # streaming messages'
        self.leases: LeaseKeeper
        self.placement: Placement  # chosen once the store is open (gateway.node.placement)
        self.cluster: Cluster | None = None  # the link to the other nodes (Redis only)
        self.retention_floor = 0
        self.shutting_down = False
        self._stop = trio.Event()
        self._changed = trio.Event()
        self._drained = False

    # --- lifecycle -------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[Node] = trio.TASK_STATUS_IGNORED) -> None:
        tracing = telemetry.start(self.traces)  # the exporter's thread: flushed and ended below
        try:
            await self._run(task_status)
        finally:
            await telemetry.stop(tracing)

    async def _run(self, task_status: trio.TaskStatus[Node]) -> None:
        log_unsandboxed(self.agents.profiles())
        state = await self.store.open()
        self.retention_floor = state.retention_floor
        self.durability.attach(self._store_refusing)
        lease_ms = round(self.config.store.lease_s * 1000)
        self.leases = LeaseKeeper(
            self.store.leases(self.node_id, lease_ms),
            self.failover.lease_lost,
            self.failover.lease_renew_failed,
        )
        self.store.on_fenced = self.leases.fenced  # a write dropped: the lease is gone already
        async with trio.open_nursery() as nursery:
            await nursery.start(self._run_store, name="store-writer")
            self.sequencer = EventSequencer(self.store.reserve_event_ids, on_overrun=self._overrun)
            await self.store.flush()  # the first block is durable (granted) before any id is used
            if not self.sequencer.ready:
                raise StoreError("the store allocated no block of event ids (see the log)")
            self.limits.count_sessions(await self.store.sessions_per_owner())
            async with trio.open_nursery() as sessions:
                self.registry.nursery = sessions
                self.model_proxy.attach(sessions)
                sessions.start_soon(self._retention_loop, name="retention")
                sessions.start_soon(self.rollups.run, name="rollup-clock")
                await sessions.start(self.leases.run, name="lease-keeper")
                self.placement = await choose(self, sessions)
                await recovery.close_interrupted_turns(self)
                self.placement.keep_recovering(sessions)
                sessions.start_soon(unloading.keep_unloading, self, name="unloader")
                if self.checkpoints is not None:
                    sessions.start_soon(self.checkpoints.run, name="checkpoints")
                if self.config.webhooks or self.config.a2a.push_url_prefixes:  # A2A push too
                    await sessions.start(self.webhooks.run, name="webhooks")
                task_status.started(self)
                await self._stop.wait()
                await self.drain_turns()
                await self.placement.hand_over()  # before the leases go
                sessions.cancel_scope.cancel()
            with trio.CancelScope(shield=True):
                await self.providers.aclose()
                with contextlib.suppress(StoreError), trio.move_on_after(2):
                    await self.leases.release_all()  # another node need not wait for them
            await close_store(self.store)

    async def _run_store(self, *, task_status: trio.TaskStatus[None]) -> None:
        await self.store.run(task_status=task_status)

    def stop(self) -> None:
        """Begin shutdown: no new turns; :meth:`run` returns once everything is closed."""
        self.shutting_down = True
        self._stop.set()

    async def drain_turns(self) -> None:
        """Cancel in-flight turns with ``reason: "shutdown"`` and wait for their sequences.

        Returns once those sequences are durable, hence handed to the clients'
        queues (docs/protocol.md §9): a close that follows comes after them.
        Once per shutdown: the daemon drains before it closes the connections
        (gateway.app), and :meth:`run` then finds nothing left to drain.
        """
        if self._drained:
            return
        self._drained = True
        for session in self.sessions.values():
            busy.cancel_running(session, "shutdown")  # a queued turn waits through it (§2)
        with trio.move_on_after(self.config.server.shutdown_grace_s), contextlib.suppress(Refused):
            while any(s.turn is not None for s in self.sessions.values()):
                await self.changed()
            await self.wait_durable()  # Refused: the store refuses writes; none will land

    def _store_refusing(self, exc: StoreError) -> None:
        """The store takes no more writes until a restart: every turn in flight ends now.

        Each is cancelled with ``reason: "store_unavailable"`` (the sequence
        of docs/protocol.md §8 for its phase, which no store will hold, so no
        client gets it), so no turn waits for a commit that never comes and
        its session answers 503 ``store_unavailable``, not 409
        ``turn_in_progress`` (docs/protocol.md §15).
        """
        for session in self.sessions.values():
            busy.cancel_running(session, STORE_REFUSING)  # a queued turn waits (§2)

    def notify(self) -> None:
        """Something shutdown waits for happened: a turn ended or a connection closed."""
        self._changed.set()
        self._changed = trio.Event()

    async def changed(self) -> None:
        """Wait for the next :meth:`notify`."""
        await self._changed.wait()

    def _connection_states(self) -> list[str]:
        """Each open connection's state (``gateway_ws_connections_by_state``)."""
        return [
            "closing" if c.closing is not None else "live" if c.subscribed else "subscribing"
            for c in self.connections
        ]

    def _overrun(self, seq: int) -> None:
        event(
            log, logging.ERROR, "event_ids_overrun",
            f"event id {seq} is past the blocks the store granted (it has not answered):"
            " ids may repeat another node's until it does",
            seq=seq,
        )  # fmt: skip

    async def _retention_loop(self) -> None:
        """Purge events older than ``retention_hours`` (their cursors then expire)."""
        horizon_ms = self.config.store.retention_hours * 3_600_000
        while True:
            try:
                self.retention_floor = await self.store.purge_before(now_ms() - horizon_ms)
            except StoreError as exc:  # tried again next round; nothing is lost meanwhile
                event(
                    log, logging.ERROR, "store_purge_failed",
                    f"store: the retention purge failed: {exc}", error=str(exc),
                )  # fmt: skip
                self.metrics.store_write_failures.inc()
            await trio.sleep(min(3600.0, horizon_ms / 1000 / 10))

    # --- durability (gateway.node.durability) ------------------------------------

    def holding(self, family: Session) -> None:
        self.durability.holding(family)

    def on_commit(self, committed: int) -> None:
        self.durability.on_commit(committed)

    async def wait_durable(self) -> None:
        await self.durability.wait_durable()

    async def durable_or_503(self) -> None:
        await self.durability.durable_or_503()

    # --- agents and tools ----------------------------------------------------------

    @property
    def provider(self) -> Provider:
        """The default agent's provider."""
        return self.providers.for_agent(self.agents.default)

    def agent(self, name: str) -> AgentProfile:
        """The agent ``name`` (a stored session's agent since removed runs the default)."""
        return self.agents[name]

    def runtime_of(self, agent: AgentProfile) -> RuntimeFactory | None:
        """What makes ``agent``'s runtime; ``None``: the gateway's own loop (gateway.runtimes)."""
        return runtimes.factory(agent)

    def pricing(self, model: str) -> Callable[[Usage], float | None]:
        """``cost_usd`` of a usage on ``model`` (gateway.node.pricing)."""
        return pricing(self.config.model.prices, model)

    def tools_of(self, agent: str, session_id: str | None = None) -> SessionTools:
        """The tools an agent's session sees now (docs/protocol.md §11).

        The daemon's built-in tools and its MCP servers' (those of ``scope =
        "node"``, and the session's own of ``scope = "session"``), those the
        agent's ``tools`` patterns match. An MCP server's list can change at
        any time (``notifications/tools/list_changed``): this is asked anew at
        every model call.
        """
        profile = self.agents[agent]
        if self.mcp is None:
            return SessionTools(self.tools, allows=profile.allows)
        return self.mcp.session_tools(self.tools, session_id or "", profile)

    def session_tools(self, session: TurnHost) -> SessionTools:
        """A session's tools; its session-scope MCP servers are started at the first ask."""
        if self.mcp is not None and self.config.mcp_servers:
            profile = self.agents[session.record.agent]
            workspace = self.workspaces.host_path(session.record.workspace_path)
            self.mcp.open_session(session.id, workspace, profile.uses_server)
        return self.tools_of(session.record.agent, session.id)

    async def tools_ready(self, session: TurnHost) -> None:
        """Wait for the session's MCP servers still starting (each within its startup_timeout_s)."""
        if self.mcp is not None and self.config.mcp_servers:
            self.session_tools(session)
            await self.mcp.wait_ready(session.id)

    def session_closed(self, session: Session) -> None:
        """A session's tasks ended: its session-scope MCP servers stop, what was kept for it goes.

        (Its tasks end when it is deleted, unloaded, or its lease is lost:
        nothing of it is kept elsewhere in the process by then.)
        """
        if self.mcp is not None:
            self.mcp.close_session(session.id)
        for forget in self.session_listeners:
            forget(session.id)

    def tool_infos(self, agent: str, session_id: str | None = None) -> list[ToolInfo]:
        """An agent's tools as ``GET /agents`` and a session's summary list them
        (:func:`gateway.node.tool_listing.tool_infos`)."""
        return tool_infos(self.agents[agent], self.tools_of(agent, session_id))

    # --- sessions (gateway.node.registry, gateway.node.placement) ------------------

    def resolve_agent(self, name: str | None) -> str:
        return self.registry.resolve_agent(name)

    def resolve_model(self, model: str | None, agent: str = "default") -> str:
        return self.registry.resolve_model(model, agent)

    async def create_session(self, **how: Any) -> Session:
        """Create and start a session (``POST /sessions``, or a ``delegate`` worker).

        The keywords and refusals of :meth:`gateway.node.registry.Registry.create`.
        """
        return await self.registry.create(**how)

    async def get_session(self, session_id: str) -> Session | None:
        """A live session, loading a stored one on first use; ``None`` if unknown.

        Its lease is taken here if nobody holds it (:meth:`Placement.claim`):
        every request for a session goes through here.
        """
        session = await self.registry.load(session_id)
        if session is not None:
            await self.placement.claim(session)
            if self.sessions.get(session_id) is not session:
                return None  # deleted on another node: gone from the store (gateway.node.failover)
        return session

    def runs_here(self, session_id: str) -> bool:
        """Whether this node may run the session's turns (:meth:`Placement.runs_here`)."""
        return self.placement.runs_here(session_id)

    async def ask_owner(
        self, session: Session, op: ops.Operation, *, patient: bool = False
    ) -> ops.Answer | None:
        """:meth:`Placement.ask_owner`."""
        return await self.placement.ask_owner(session, op, patient=patient)

    def forward(self, session: Session, op: Notice) -> None:
        """:meth:`Placement.forward`."""
        self.placement.forward(session, op)

    def relay(self, family: Session, session: Session, events: list[Emitted]) -> None:
        """:meth:`Placement.relay`."""
        self.placement.relay(family, session, events)

    async def watch(self, session: Session, *, tell_owner: bool = True) -> None:
        """:meth:`Placement.watch`."""
        await self.placement.watch(session, tell_owner=tell_owner)

    async def issue_token(self, session_id: str) -> str:
        """A single-use attach token (docs/protocol.md §2), good on any node of the deployment."""
        return await self.tokens.issue_token(session_id)

    async def redeem_token(self, token: str | None, session_id: str) -> None:
        """Use an attach token up (:meth:`Tokens.redeem_token`)."""
        await self.tokens.redeem_token(token, session_id)

    # --- what acts on a session, wherever it runs ------------------------------------

    async def act(self, session: Session, op: ops.Operation) -> ops.Answer:
        """Carry ``op`` out on the node that runs the session: asked of it, or done here.

        Raises:
            Refused: as the session's own routes would refuse it
                (gateway.node.operations), or as :meth:`Placement.ask_owner`.
        """
        answer = await self.placement.ask_owner(session, op)
        return answer if answer is not None else await perform(self, session, op)

    async def submit_turn(
        self, session: Session, message: Message, if_busy: IfBusy, rewind_to: str | None
    ) -> ops.TurnTaken:
        """Start a turn on the session, wherever it runs; return once it is accepted
        (started, queued or steered: docs/protocol.md §2 "A busy session")."""
        op = ops.StartTurn(message, telemetry.carried(), if_busy, rewind_to)
        return ops.expect(await self.act(session, op), ops.TurnTaken)

    async def cancel_turn(
        self, session: Session, turn_id: str, reason: str, requested_by: str
    ) -> None:
        """:meth:`Session.cancel_turn`, on the node that runs the session."""
        await self.act(session, ops.CancelTurn(turn_id, reason, requested_by))

    async def decide_permission(
        self,
        session: Session,
        perm_id: str,
        decision: str,
        content: dict[str, Any] | None = None,
    ) -> None:
        """:meth:`Session.decide_permission`, on the node that runs the session."""
        await self.act(session, ops.DecidePermission(perm_id, decision, content))

    async def record_feedback(
        self, session: Session, message_id: str, rating: int, comment: str | None
    ) -> None:
        """:meth:`Session.record_feedback`, on the node that runs the session."""
        await self.act(session, ops.RecordFeedback(message_id, rating, comment))  # type: ignore[arg-type]

    async def compact(self, session: Session) -> None:
        """:meth:`Session.compact`, on the node that runs the session (docs/protocol.md §12)."""
        await self.act(session, ops.Compact())

    async def delete_session(self, session: Session) -> None:
        """``DELETE /sessions/{id}`` on the node that runs it (gateway.node.deletion).

        On several nodes, this node's own clients of it are closed too, and it
        leaves this node's memory (the owner did the rest: its store rows, its
        workspace, its clients there).
        """
        await self.act(session, ops.DeleteSession())
        if self.sessions.get(session.id) is session:  # a replica here: the owner deleted it
            await deletion.deleted_elsewhere(self, session)

    async def live_summary(self, session: Session) -> SessionSummary:
        """The session's summary as its owner sees it (its turn and pending permissions)."""
        return ops.expect(await self.act(session, ops.State()), ops.Summary).summary

    async def messages_of(self, session: Session) -> list[Message]:
        """The session's conversation: its own where it runs here, else the store's (durable).

        Raises:
            Refused: ``store_unavailable``.
        """
        if self.runs_here(session.id):
            return list(session.messages)
        try:
            return await rewind.stored_conversation(self.store, session.id)  # its rewinds applied
        except StoreError as exc:
            raise unavailable(exc) from None


async def close_store(store: Store) -> None:
    """The shutdown's last step: writes the store could not make durable are a
    :class:`ShutdownError` (one line, exit 1: docs/reference.md "Command line")."""
    try:
        await store.aclose()
    except StoreError as exc:
        raise ShutdownError(exc.message) from None

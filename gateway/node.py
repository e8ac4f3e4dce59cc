"""The gateway node: every session of one daemon, and what they share.

Task tree (a stack dump reads like this)::

    node                      Node.run
    ├── store-writer          the store's batching writer (gateway.store)
    ├── retention             purges events older than retention_hours
    ├── lease-keeper          renews this node's session leases (gateway.store.lease)
    ├── recovery              Redis only: closes turns of nodes that died (every lease_s / 2)
    ├── cluster               Redis only: the link to the other nodes (gateway.cluster)
    └── sessions              one child nursery per live session
        └── session <id>      Session.run: agent-loop <id>, translator <id>

Several nodes on one Redis (RUNNING.md "Command line", docs/scale-out.md):
every request for a session may reach any node. The node holding the
session's lease runs it; any other node keeps a *replica* of it for its own
clients: their live events come from the owner over the cluster link (one
publish per batch per family), and whatever acts on the session (a turn, a
cancel, a permission decision, feedback, a snapshot or replay's cut) is a
request to the owner (:meth:`Node.ask_owner`), answered exactly as the owner's
own routes would answer it.

Shared by all sessions: the config, the store, the node-wide event sequencer
(PROTOCOL section 1), the provider, the tool registry, the attach tokens, the
limits per API key (``gateway.server.auth``) and the metrics. Shutdown
(RUNNING.md "Command line") goes in order: no new turns, in-flight turns
cancelled with ``reason: "shutdown"`` and given
``shutdown_grace_s`` to emit their sequences, sessions stopped, the store
flushed and closed.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import msgspec
import trio

from gateway.agents import AgentProfile, Agents
from gateway.config import Config
from gateway.errors import ApiError, StoreError, SubscribeRejected, unavailable
from gateway.ids import new_attach_token, new_session_id, now_ms
from gateway.logs import SLOW_FLUSH_S, event
from gateway.mcp.servers import McpServers
from gateway.metrics import Metrics
from gateway.protocol.events import BusHandlerWarning, BusSubscriberUnregistered
from gateway.protocol.filters import resolve_filter
from gateway.protocol.frames import Subscribe, decode_client_frame
from gateway.protocol.framing import event_frame
from gateway.protocol.shapes import Message, SessionSummary, ToolInfo, Usage
from gateway.providers.base import Provider
from gateway.providers.factory import Providers
from gateway.runtimes import slots
from gateway.server.auth import NO_OWNER, Limits
from gateway.session import seam
from gateway.session.agent import TurnHost
from gateway.session.hub import Emitted
from gateway.session.recovery import close_interrupted
from gateway.session.sequencer import EventSequencer
from gateway.session.session import Session
from gateway.store.base import SessionRecord, Store
from gateway.store.lease import LeaseKeeper, Taken, new_node_id
from gateway.tools.process import ToolProcesses
from gateway.tools.registry import SessionTools, ToolRegistry
from gateway.tools.workspace import WorkspaceError, Workspaces

if TYPE_CHECKING:
    from gateway.cluster import Cluster, LiveBatch

log = logging.getLogger("gateway.node")

ROUTING_POLICY_VERSION = "static-1"


TOKEN_INVALID = "the attach token is unknown, used, or for another session"


class AttachTokens:
    """Single-use attach tokens bound to one session, with a TTL (PROTOCOL section 2).

    A token is kept under its session and itself: a handshake on another
    session's path looks up another key and finds nothing, so it cannot use
    up the token of the session it was issued for (PROTOCOL section 15).
    Time is Trio's clock, so the TTL is testable with ``MockClock``.
    """

    def __init__(self, ttl_s: float) -> None:
        self.ttl_s = ttl_s
        self._tokens: dict[tuple[str, str], float] = {}  # (session, token): expiry

    def issue(self, session_id: str) -> str:
        now = trio.current_time()
        # Tokens expire in the order they were issued (one TTL for all), which
        # is the dict's order: prune from the front, stop at the first live one.
        for key, expires in list(itertools.islice(self._tokens.items(), 64)):
            if expires + self.ttl_s > now:  # kept one more TTL, to say "expired"
                break
            del self._tokens[key]
        token = new_attach_token()
        self._tokens[session_id, token] = now + self.ttl_s
        return token

    def redeem(self, token: str | None, session_id: str) -> None:
        """Use a token up.

        Only a handshake on the token's own session uses it up; on any other
        it is unknown there, and stays good for its own.

        Raises:
            ApiError: 403 for a missing, unknown, used, expired or other-session token.
        """
        if not token:
            raise ApiError(403, "attach_token_required", "the ?attach= token is missing")
        expires = self._tokens.pop((session_id, token), None)
        if expires is None:
            raise ApiError(403, "attach_token_invalid", TOKEN_INVALID)
        if trio.current_time() >= expires:
            raise ApiError(403, "attach_token_expired", "the attach token has expired")


class Connection(Protocol):
    """An open stream connection, as shutdown sees it (gateway.server.connection)."""

    def request_close(self, code: str) -> None:
        """Close with the close named ``code`` (gateway.protocol.closes)."""
        ...

    @property
    def subscribed(self) -> bool:
        """Past its subscribe (``gateway_ws_connections_by_state``)."""
        ...

    @property
    def closing(self) -> str | None:
        """The name of the close decided for it, if any."""
        ...


class Node:
    """One gateway daemon's sessions and shared services."""

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
        # Each agent's provider (PROTOCOL section 11); one given alone serves every agent.
        self.providers = provider if isinstance(provider, Providers) else Providers.single(provider)
        self.agents = Agents(config)  # ConfigError: a system_file that cannot be read
        self.tools = tools  # the built-in tools the daemon enabled; each agent has some of them
        # The MCP servers (gateway.mcp); the daemon sets them, a bare node has none.
        self.mcp: McpServers | None = None
        self.metrics = metrics or Metrics()
        self.metrics.watch(
            turns_in_flight=lambda: sum(s.turn is not None for s in self.sessions.values()),
            connection_states=self._connection_states,
        )
        self.tokens = AttachTokens(config.stream.attach_token_ttl_s)
        self.limits = Limits(config.limits)  # [limits]: counted per API key (gateway.server.auth)
        self.workspaces = Workspaces.from_config(config.sessions)  # PROTOCOL section 15
        # The tool processes of the daemon (the app shares its own); a bare node spawns without
        # a watchdog: its groups are still stopped with their sessions.
        self.processes = ToolProcesses(config.tools)
        # The Claude Code processes of each agent on this node (max_processes).
        self.process_slots = slots.ProcessSlots()
        self.sessions: dict[str, Session] = {}
        self.connections: set[Connection] = set()  # open streams (closed with 1001 on shutdown)
        self.sequencer: EventSequencer
        self.node_id = new_node_id()  # this process, in the session leases
        self.leases: LeaseKeeper
        self.retention_floor = 0
        self.shutting_down = False
        self._loading: dict[str, trio.Event] = {}
        self._recovery_lock = trio.Lock()  # closing interrupted turns: one at a time
        self._claiming: dict[str, trio.Event] = {}  # sessions whose lease a request is taking
        self._holding: dict[Session, None] = {}  # families with batches waiting for a commit
        self._sessions_nursery: trio.Nursery
        self.cluster: Cluster | None = None  # the link to the other nodes (Redis only)
        self._relayed: dict[str, tuple[str, int]] = {}  # family -> (owner, last batch number)
        self._stop = trio.Event()
        self._changed = trio.Event()

    # --- lifecycle -------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[Node] = trio.TASK_STATUS_IGNORED) -> None:
        state = await self.store.open()
        self.retention_floor = state.retention_floor
        self.store.on_commit = self.on_commit
        self.store.on_write_error = self._store_write_failed
        self.store.on_flush = self._store_flushed
        lease_ms = round(self.config.store.lease_s * 1000)
        self.leases = LeaseKeeper(
            self.store.leases(self.node_id, lease_ms), self._lease_lost, self._lease_renew_failed
        )
        async with trio.open_nursery() as nursery:
            await nursery.start(self._run_store, name="store-writer")
            self.sequencer = EventSequencer(self.store.reserve_event_ids, on_overrun=self._overrun)
            await self.store.flush()  # the first block is durable (granted) before any id is used
            if not self.sequencer.ready:
                raise StoreError("the store allocated no block of event ids (see the log)")
            self.limits.count_sessions(await self.store.sessions_per_owner())
            async with trio.open_nursery() as sessions:
                self._sessions_nursery = sessions
                sessions.start_soon(self._retention_loop, name="retention")
                await sessions.start(self.leases.run, name="lease-keeper")
                if self.leases.leases.shared:
                    from gateway.cluster import Cluster  # coredis: imported only when used

                    self.cluster = Cluster(
                        self.config.store.url,
                        "gw:",
                        self.node_id,
                        self._serve,
                        self._on_live,
                        self._relay_gap,
                    )
                    await sessions.start(self.cluster.run, name="cluster")
                await self._close_interrupted_turns()
                if self.leases.leases.shared:
                    sessions.start_soon(self._recovery_loop, name="recovery")
                task_status.started(self)
                await self._stop.wait()
                await self.drain_turns()
                sessions.cancel_scope.cancel()
            with trio.CancelScope(shield=True):
                await self.providers.aclose()
                with contextlib.suppress(StoreError), trio.move_on_after(2):
                    await self.leases.release_all()  # another node need not wait for them
            await self.store.aclose()

    async def _run_store(self, *, task_status: trio.TaskStatus[None]) -> None:
        await self.store.run(task_status=task_status)

    def stop(self) -> None:
        """Begin shutdown: no new turns; :meth:`run` returns once everything is closed."""
        self.shutting_down = True
        self._stop.set()

    async def drain_turns(self) -> None:
        """Cancel in-flight turns with ``reason: "shutdown"`` and wait for their sequences.

        Returns once those sequences are durable, hence handed to the clients'
        queues (PROTOCOL section 9): a close that follows comes after them.
        """
        for session in self.sessions.values():
            if session.turn is not None:
                session.turn.request_cancel("shutdown")
        with trio.move_on_after(self.config.server.shutdown_grace_s):
            while any(s.turn is not None for s in self.sessions.values()):
                await self.changed()
            await self.wait_durable()

    # --- durability (PROTOCOL section 9) -------------------------------------------

    def holding(self, family: Session) -> None:
        """``family`` has batches waiting for their commit (:meth:`Session.emit`)."""
        self._holding[family] = None

    def on_commit(self, committed: int) -> None:
        """The store committed every put up to ticket ``committed``: release what waited.

        Each family's batches go out in the order they were emitted; a batch
        emitted meanwhile (a slow client's warning) waits for its own commit.
        """
        for family in list(self._holding):
            held = family.held
            while held and held[0][0] <= committed:
                _, session, events = held.popleft()
                session.release(events)
            if not held:
                self._holding.pop(family, None)

    async def wait_durable(self) -> None:
        """Return once everything put so far is committed."""
        await self.store.wait_committed(self.store.ticket())

    async def durable_or_503(self) -> None:
        """:meth:`wait_durable` for a request, within ``commit_timeout_s``.

        Raises:
            ApiError: 503 ``store_unavailable`` when the store does not commit in
                time, and at once when it takes no more writes (its file was
                deleted or replaced: PROTOCOL section 15).
        """
        store = self.store
        if store.refusing is not None:
            raise unavailable(store.refusing)
        with trio.move_on_after(self.config.store.commit_timeout_s):
            await self.wait_durable()
            return
        failure = store.refusing or store.failure
        if failure is not None:  # the reason, in the answer
            raise unavailable(failure)
        raise ApiError(
            503, "store_unavailable", "the store did not commit in time; the request may be retried"
        )

    def _store_write_failed(self, exc: Exception) -> None:
        event(
            log, logging.ERROR, "store_write_failed",
            f"store: {exc} (retrying; live events wait for the commit)", error=str(exc),
        )  # fmt: skip
        self.metrics.store_write_failures.inc()

    def _store_flushed(self, duration_s: float, rows: int) -> None:
        """The store committed ``rows`` in ``duration_s``: observed, and logged when slow."""
        self.metrics.store_flush_duration.observe(duration_s)
        self.metrics.store_flush_rows.observe(rows)
        if duration_s > SLOW_FLUSH_S:
            ms = round(duration_s * 1000)
            event(
                log, logging.WARNING, "store_flush_slow",
                f"store: a commit of {rows} rows took {ms} ms", duration_ms=ms, rows=rows,
            )  # fmt: skip

    def _connection_states(self) -> list[str]:
        """Each open connection's state (``gateway_ws_connections_by_state``)."""
        return [
            "closing" if c.closing is not None else "live" if c.subscribed else "subscribing"
            for c in self.connections
        ]

    async def _close_interrupted_turns(self) -> None:
        """Close the turns a dead node left in flight, workers before their parents (section 9).

        A family (a session and its workers) is taken by one node, from its
        root: only where this node can take the root's lease
        (gateway.store.lease); on Redis a family whose lease a live node holds
        is running there, and is left alone; a dead node's leases expire within
        ``lease_s``, and the ``recovery`` task tries again every half
        ``lease_s``. A turn running on this node is not interrupted. With
        SQLite every lease is this node's: all of them are closed at start-up,
        as before.
        """
        records = await self.store.open_turns()
        by_id = {r.id: r for r in records}

        def root_of(sid: str) -> str:
            parent = by_id[sid].parent_session_id
            return root_of(parent) if parent in by_id else sid

        closed = 0
        for root_id in dict.fromkeys(root_of(r.id) for r in records):
            live = self.sessions.get(root_id)
            if live is not None and live.turn is not None:
                continue  # running here
            if root_id in self._claiming:
                continue  # a request is taking it: it closes the turns itself
            # Registered as a claim, so that a request for it waits for this
            # pass (its turn must come after the closing: get_session).
            self._claiming[root_id] = claiming = trio.Event()
            try:
                taken = await self.leases.take(root_id)
                if taken is None:
                    continue  # a live node runs it
                await self.ids_above(taken)
                root = await self._get_session(root_id)
                if root is not None and root.turn is None:
                    closed += await self._take_over(root, taken)
            except Exception as exc:  # one session's history must not keep the node down
                event(
                    log, logging.ERROR, "session_failed",
                    f"session {root_id}: could not close the turns left by a crash: {exc}",
                    exc_info=exc, session_id=root_id, component="recovery",
                )  # fmt: skip
                self.metrics.session_failures.labels("recovery").inc()
            finally:
                del self._claiming[root_id]
                claiming.set()
        if closed:
            self._recovered(closed)
            await self.wait_durable()

    async def _close_if_interrupted(self, session: Session) -> bool:
        """Close the session's turn left in flight, if it has one and none runs here.

        One at a time, so that a recovery pass and a request taking the same
        lease never close a turn twice.
        """
        async with self._recovery_lock:
            if session.turn is not None or session.record.current_turn_id is None:
                return False
            await close_interrupted(session)
            return True

    def _recovered(self, turns: int) -> None:
        event(
            log, logging.INFO, "turns_recovered",
            f"closed {turns} turns left in flight by a node that died", turns=turns,
        )  # fmt: skip

    async def _recovery_loop(self) -> None:
        """Redis: close the turns of nodes that died since, once their leases expire.

        Every half lease time: a dead node's turn is closed at most 1.5 x
        ``lease_s`` after its last renewal (README "Running several nodes").
        """
        while True:
            await trio.sleep(self.config.store.lease_s / 2)
            try:
                await self._close_interrupted_turns()
            except StoreError as exc:  # tried again next round
                event(
                    log, logging.ERROR, "store_read_failed",
                    f"store: looking for interrupted turns failed: {exc}", error=str(exc),
                )  # fmt: skip

    async def ids_above(self, taken: Taken) -> None:
        """Issue the next ids above every id the lease's previous holder could have issued.

        (PROTOCOL section 1: a session's ids increase across a failover.)
        """
        while self.sequencer.needs_block_above(taken.counter):
            self.sequencer.renew()
            await self.store.flush()

    def _lease_lost(self, session_id: str) -> None:
        """This node lost the session's lease: it stops acting on the session (docs/scale-out.md).

        Another node may hold it now (or will, once Redis answers again): the
        session's turn is stopped here without a further event (its new owner
        closes it as interrupted, PROTOCOL section 9), and this node's clients
        of its family are closed with ``relay_gap`` so that they resume against
        the owner. Writes this node had already queued are dropped by the
        store (its lease fences them), and its held batches go to no client.
        """
        event(
            log, logging.ERROR, "lease_lost",
            f"session {session_id}: this node lost its lease; it stops running it here",
            session_id=session_id, component="lease",
        )  # fmt: skip
        self.metrics.session_failures.labels("lease").inc()
        session = self.sessions.get(session_id)
        if session is not None:
            session.stop_here()
            self._close_clients(session.family, "relay_gap")

    def _lease_renew_failed(self, exc: StoreError) -> None:
        event(
            log, logging.ERROR, "lease_renew_failed",
            f"store: renewing the session leases failed: {exc} (retrying)", error=str(exc),
        )  # fmt: skip

    def _overrun(self, seq: int) -> None:
        event(
            log, logging.ERROR, "event_ids_overrun",
            f"event id {seq} is past the blocks the store granted (it has not answered):"
            " ids may repeat another node's until it does",
            seq=seq,
        )  # fmt: skip

    def notify(self) -> None:
        """Something shutdown waits for happened: a turn ended or a connection closed."""
        self._changed.set()
        self._changed = trio.Event()

    async def changed(self) -> None:
        """Wait for the next :meth:`notify`."""
        await self._changed.wait()

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

    # --- sessions -----------------------------------------------------------------

    @property
    def provider(self) -> Provider:
        """The default agent's provider."""
        return self.providers.for_agent(self.agents.default)

    def agent(self, name: str) -> AgentProfile:
        """The agent ``name`` (a stored session's agent since removed runs the default)."""
        return self.agents[name]

    def tools_of(self, agent: str, session_id: str | None = None) -> SessionTools:
        """The tools an agent's session sees now (PROTOCOL section 11).

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
        """A session's tasks ended: its session-scope MCP servers are stopped."""
        if self.mcp is not None:
            self.mcp.close_session(session.id)

    def tool_infos(self, agent: str, session_id: str | None = None) -> list[ToolInfo]:
        """An agent's tools as ``GET /agents`` and a session's summary list them (section 6)."""
        profile = self.agents[agent]
        tools = self.tools_of(agent, session_id)
        return [
            ToolInfo(spec.name, spec.description, spec.input_schema,
                     profile.needs_approval(spec.name), tools.source_of(spec.name) or "builtin")
            for spec in tools.specs()
        ]  # fmt: skip

    def resolve_agent(self, name: str | None) -> str:
        """The agent a new session runs (``POST /sessions {"agent"}``).

        Raises:
            ApiError: 422 ``unknown_agent``, the message listing the agents there are.
                The name is echoed cut at 64 characters (an agent's longest): a
                100 kB name came back whole in the body, and in the access log.
        """
        if name is None:
            return self.agents.default
        if name not in self.agents:
            names = ", ".join(self.agents.names())
            shown = name if len(name) <= 64 else f"{name[:64]}..."
            raise ApiError(422, "unknown_agent", f"no agent {shown!r}; agents: {names}")
        return name

    def resolve_model(self, model: str | None, agent: str = "default") -> str:
        """The model a new session runs on (``POST /sessions``): its agent's, unless named.

        Raises:
            ApiError: 422 for a model of another provider than the agent's.
        """
        profile = self.agents[agent]
        if model is None:
            return profile.model
        provider = profile.provider
        if not model.startswith(f"{provider}:") or len(model) == len(provider) + 1:
            raise ApiError(
                422,
                "invalid_model",
                f"model {model!r} is not served here; models are '{provider}:<name>'",
            )
        return model

    async def create_session(
        self,
        *,
        workspace_path: str | None = None,
        model: str | None = None,
        agent: str | None = None,
        metadata: dict[str, Any] | None = None,
        parent: Session | None = None,
        owner: str = NO_OWNER,
        session_id: str | None = None,
    ) -> Session:
        """Create and start a session (``POST /sessions``, or a ``delegate`` worker).

        Args:
            owner: the id of the API key that creates it (PROTOCOL section 2), ``""``
                without keys. A worker belongs to its parent's owner and counts
                against that owner's ``max_sessions_per_key`` like any session
                (PROTOCOL section 15: a turn cannot make sessions its key could not;
                the ``delegate`` tool turns the 429 into ``tool.failed`` ``limit``).
            session_id: the id to give it (an AG-UI ``threadId`` the caller
                checked is unknown: gateway.agui); a fresh ``sess_`` id if None.

        Raises:
            ApiError: 429 ``too_many_sessions`` (the count is taken before any
                wait, so two racing requests cannot both get the last one), 422
                for a bad workspace or model, 503 ``store_unavailable``.
        """
        if parent is not None:
            owner = parent.record.owner
        with self.limits.new_session(owner):
            session_id = session_id or new_session_id()
            if parent is not None:  # a worker runs its parent's agent's delegate_agent
                agent = self.agents[parent.record.agent].delegate_agent
                if agent != parent.record.agent:
                    model = None  # ... on that agent's model, not the parent's
            agent = self.resolve_agent(agent)  # 422 before anything is made
            active_model = self.resolve_model(model, agent)
            if parent is not None:  # a worker works in its parent's workspace
                workspace = parent.record.workspace_path
            else:
                workspace = await _workspace(self.workspaces, session_id, owner, workspace_path)
            record = SessionRecord(
                id=session_id,
                created_at=now_ms(),
                workspace_path=workspace,
                active_model=active_model,
                metadata=metadata or {},
                parent_session_id=parent.id if parent else None,
                routing_policy_version=ROUTING_POLICY_VERSION,
                owner=owner,
                agent=agent,
            )
            self.store.put_session(record)
        session = Session(self, record, parent=parent)
        if parent is not None:
            parent.workers.append(session)
        await self._start(session)
        with contextlib.suppress(StoreError):  # new: no id of it anywhere, so no id jump
            await self.leases.take(record.id)
        await self.durable_or_503()  # PROTOCOL section 9: durable when POST /sessions answers
        event(
            log, logging.INFO, "session_created", f"session {record.id} created",
            session_id=record.id, parent_session_id=record.parent_session_id,
            model=record.active_model, agent=record.agent,
        )  # fmt: skip
        return session

    def runs_here(self, session_id: str) -> bool:
        """Whether this node may run the session's turns: it holds the session's lease.

        Always, on a store of one node (SQLite). On Redis, a session whose
        lease another node holds is a replica here: what acts on it is sent to
        that node (:meth:`ask_owner`).
        """
        return not self.leases.leases.shared or self.leases.holds(session_id)

    async def get_session(self, session_id: str) -> Session | None:
        """A live session, loading a stored one on first use; ``None`` if unknown.

        On Redis the node also takes the session's lease if nobody holds it
        (:meth:`_claim`): every request for a session goes through here.
        """
        session = await self._get_session(session_id)
        if session is None or not self.leases.leases.shared:
            return session
        claiming = self._claiming.get(session_id)
        if claiming is not None:  # another request is taking it: its turn closes first
            await claiming.wait()
        elif not self.leases.holds(session_id):
            self._claiming[session_id] = claiming = trio.Event()
            try:
                await self._claim(session)
            finally:
                del self._claiming[session_id]
                claiming.set()
        return session

    async def _claim(self, session: Session) -> None:
        """Take the session's lease if it is free; close the turn a dead holder left open.

        This node then runs the session's turns (the one it left in flight is
        closed before any new one can start: nothing awaits between this and
        a turn's submission). A session held elsewhere stays as it is: a
        replica here for this node's clients, whatever acts on it sent to its
        owner (:meth:`ask_owner`). A replica whose lease this node takes is
        read afresh from the store first (:meth:`_took_over`).
        """
        try:
            taken = await self.leases.take(session.id)
            if taken is None:
                return
            await self.ids_above(taken)
            if taken.new and session.turn is None:
                closed = await self._take_family(session, taken)
                if closed:
                    self._recovered(closed)
        except StoreError as exc:  # tried again at the next request or recovery pass
            event(
                log, logging.ERROR, "store_read_failed",
                f"session {session.id}: taking its lease failed: {exc}",
                error=str(exc), session_id=session.id,
            )  # fmt: skip

    async def _get_session(self, session_id: str) -> Session | None:
        session = self.sessions.get(session_id)
        if session is not None:
            return session
        loading = self._loading.get(session_id)
        if loading is not None:
            await loading.wait()
            return self.sessions.get(session_id)
        self._loading[session_id] = loading = trio.Event()
        try:
            record = await self.store.get_session(session_id)
            if record is None:
                return None
            parent = None
            if record.parent_session_id:
                # Not get_session: nothing is claimed while loading (a claim
                # loads the family itself: _take_over).
                parent = await self._get_session(record.parent_session_id)
            stored = await self.store.load_messages(session_id)
            size = await self.store.event_bytes(session_id)  # max_session_mb: once, at load
            session = Session(self, record, stored, parent=parent, event_bytes=size)
            if parent is not None:
                parent.workers.append(session)
            await self._start(session)
            event(
                log, logging.INFO, "session_loaded", f"session {session_id} loaded from the store",
                session_id=session_id, messages=len(session.messages),
            )  # fmt: skip
            # A parent's stream carries its workers' events (PROTOCOL section 5):
            # they are loaded with it. One being loaded already joins by itself.
            for worker_id in await self.store.worker_ids(session_id):
                if worker_id not in self.sessions and worker_id not in self._loading:
                    await self._get_session(worker_id)
            return session
        finally:
            del self._loading[session_id]
            loading.set()

    async def _start(self, session: Session) -> None:
        self.sessions[session.id] = session
        self.metrics.sessions_live.set(len(self.sessions))
        await self._sessions_nursery.start(session.run, name=f"session {session.id}")

    async def _take_family(self, session: Session, taken: Taken) -> int:
        """This node just took the session's lease (it was free): its family comes with it.

        From the family's root (a worker asked for alone brings its parents'
        leases, where free), so that one node closes a family's turns, its
        ids in one order, workers first (:meth:`_take_over`).

        Returns:
            How many turns were closed.
        """
        await self._took_over(session, taken)
        root = session.family
        if root is not session:
            held = await self._take_patiently(root.id)
            if held is not None and root.turn is None:
                await self.ids_above(held)
                return await self._take_over(root, held)  # the session among its workers
        return await self._take_over(session, None)

    async def _take_over(self, session: Session, taken: Taken | None) -> int:
        """Close the turns a session's family left in flight here, workers first.

        ``taken``: the session's lease, if this node just took it (the session
        is read afresh from the store first: :meth:`_took_over`). The leases of
        its workers are taken too, where free (PROTOCOL sections 8 and 9: a
        delegate's worker is closed before its parent).

        Returns:
            How many turns were closed.
        """
        if taken is not None and taken.new:
            await self._took_over(session, taken)
        closed = 0
        for worker in list(session.workers):
            held = await self._take_patiently(worker.id)
            if held is None or worker.turn is not None:
                continue  # a live node runs it, or this one does
            await self.ids_above(held)
            closed += await self._take_over(worker, held)
        return closed + await self._close_if_interrupted(session)

    async def _take_patiently(self, session_id: str) -> Taken | None:
        """Take a lease, allowing a third of ``lease_s`` for it to lapse.

        A dead node's leases were renewed in one round, so they lapse within
        moments of each other: a family's are all free, or soon.
        """
        taken = await self.leases.take(session_id)
        if taken is None and self.leases.leases.shared:
            wait = self.config.store.lease_s
            with trio.move_on_after(wait / 3):
                while taken is None:
                    await trio.sleep(wait / 20)
                    taken = await self.leases.take(session_id)
        return taken

    async def _took_over(self, session: Session, taken: Taken) -> None:
        """Read a session afresh from the store: another node ran it until now.

        Its record and messages are the store's (the previous owner wrote
        them, durably, as it went); everything up to ``taken.counter`` is read
        from the store by a replay; workers it made that this node never
        loaded are loaded now (a parent's replay and closing include them).
        """
        await self.wait_durable()  # this node's own writes of it first (it may have run it)
        if self.cluster is not None:  # nodes that watched its previous owner still do
            self.cluster.heard(session.family.id)
        record = await self.store.get_session(session.id)
        if record is not None:
            stored = await self.store.load_messages(session.id)
            size = await self.store.event_bytes(session.id)  # max_session_mb: once, at load
            session.reload(record, stored, taken.counter, size)
        for worker_id in await self.store.worker_ids(session.id):
            if worker_id not in self.sessions:
                await self._get_session(worker_id)

    # --- several nodes (gateway.cluster, docs/scale-out.md) ----------------------------

    async def issue_token(self, session_id: str) -> str:
        """A single-use attach token (PROTOCOL section 2), good on any node of the deployment."""
        if self.cluster is None:
            return self.tokens.issue(session_id)
        try:
            return await self.cluster.issue_token(session_id, self.tokens.ttl_s)
        except StoreError as exc:
            raise unavailable(exc) from None

    async def redeem_token(self, token: str | None, session_id: str) -> None:
        """Use an attach token up (:meth:`AttachTokens.redeem`)."""
        if self.cluster is None:
            self.tokens.redeem(token, session_id)
            return
        try:
            await self.cluster.redeem_token(token, session_id, self.tokens.ttl_s)
        except StoreError as exc:
            raise unavailable(exc) from None

    async def ask_owner(
        self, session: Session, op: str, args: object, *, patient: bool = False
    ) -> bytes | None:
        """Send ``op`` to the node holding the session's lease; ``None``: it is this node.

        A session whose lease is free is taken here first (its dead holder's
        turn closed: :meth:`_claim`), and then runs here. ``patient``: when the
        holder does not answer (it died: a client's snapshot or replay on a
        survivor), wait up to ``lease_s`` for its lease to lapse and take it.

        Raises:
            ApiError: the owner's own refusal, exactly as its routes would
                answer; 503 ``session_owner_unreachable`` (it did not answer in
                ``commit_timeout_s``) or ``store_unavailable`` (Redis did not).
        """
        if self.cluster is None or self.runs_here(session.id):
            return None
        try:
            holder = await self.leases.leases.holder(session.id)
            if holder is None:
                await self.get_session(session.id)  # takes the free lease (:meth:`_claim`)
                if self.runs_here(session.id):
                    return None
                holder = await self.leases.leases.holder(session.id)
        except StoreError as exc:
            raise unavailable(exc) from None
        if holder is None or holder == self.node_id:  # changing hands right now
            raise _changing_nodes(session.id)
        store = self.config.store
        wait_s = store.commit_timeout_s + (slots.SLOT_WAIT_S if op == "turn" else 0.0)
        try:
            return await self.cluster.call(
                holder, op, session.id, _pack(args), wait_s, store.lease_s
            )
        except StoreError as exc:
            raise unavailable(exc) from None
        except ApiError as exc:
            if not patient or exc.code != "session_owner_unreachable":
                raise
            with trio.move_on_after(store.lease_s * 1.5):
                while not self.runs_here(session.id):
                    await trio.sleep(store.lease_s / 5)
                    await self.get_session(session.id)  # takes the lease once it lapsed
                return None
            raise

    async def submit_turn(self, session: Session, message: Message) -> None:
        """Start a turn on the session, wherever it runs; return once it is accepted.

        Raises:
            ApiError: as :meth:`Session.submit_turn` and :meth:`Session.accepted`,
                or as :meth:`ask_owner`.
        """
        if await self.ask_owner(session, "turn", message) is None:
            await self._process_slot(session)
            try:
                turn = session.submit_turn(message)
            except ApiError:
                self._unreserve_slot(session)
                raise
            await session.accepted(turn)

    async def _process_slot(self, session: Session) -> None:
        """A ``claude-code`` session's turn holds a process slot before it is accepted.

        ``max_processes`` of its agent (:mod:`gateway.runtimes.slots`): an idle
        process may be stopped to make room; after ``SLOT_WAIT_S``, 503
        ``over_capacity``. A session whose turn is in flight is refused as
        before (409), without waiting.
        """
        agent = self.agents[session.record.agent]
        if agent.runtime != "claude-code" or session.turn is not None:
            return
        limit = agent.max_processes
        if not await self.process_slots.acquire(agent.name, limit, session.id, slots.SLOT_WAIT_S):
            raise slots.over_capacity(agent.name, limit)

    def _unreserve_slot(self, session: Session) -> None:
        """A slot held for a turn that was refused, and for no process: free it."""
        agent = self.agents[session.record.agent]
        runtime = session.agent.runtime if session.agent is not None else None
        if session.turn is None and (runtime is None or runtime.client is None):
            self.process_slots.release(agent.name, session.id)

    async def cancel_turn(
        self, session: Session, turn_id: str, reason: str, requested_by: str
    ) -> None:
        """:meth:`Session.cancel_turn`, on the node that runs the session."""
        if await self.ask_owner(session, "cancel", (turn_id, reason, requested_by)) is None:
            session.cancel_turn(turn_id, reason, requested_by)

    async def decide_permission(
        self,
        session: Session,
        perm_id: str,
        decision: str,
        content: dict[str, Any] | None = None,
    ) -> None:
        """:meth:`Session.decide_permission`, on the node that runs the session."""
        if await self.ask_owner(session, "permission", (perm_id, decision, content)) is None:
            session.decide_permission(perm_id, decision, content)

    async def record_feedback(
        self, session: Session, message_id: str, rating: int, comment: str | None
    ) -> None:
        """:meth:`Session.record_feedback`, on the node that runs the session."""
        if await self.ask_owner(session, "feedback", (message_id, rating, comment)) is None:
            session.record_feedback(message_id, rating, comment)  # type: ignore[arg-type]

    async def compact(self, session: Session) -> None:
        """:meth:`Session.compact`, on the node that runs the session (PROTOCOL section 12)."""
        if await self.ask_owner(session, "compact", None) is None:
            session.compact()

    async def live_summary(self, session: Session) -> SessionSummary:
        """The session's summary as its owner sees it (its turn and pending permissions)."""
        answer = await self.ask_owner(session, "state", None)
        if answer is None:
            return session.summary()
        return msgspec.msgpack.decode(answer, type=SessionSummary)

    async def messages_of(self, session: Session) -> list[Message]:
        """The session's conversation: its own where it runs here, else the store's (durable).

        Raises:
            ApiError: 503 ``store_unavailable``.
        """
        if self.runs_here(session.id):
            return list(session.messages)
        try:
            return [sm.message for sm in await self.store.load_messages(session.id)]
        except StoreError as exc:
            raise unavailable(exc) from None

    def forward(self, session: Session, op: str, args: object) -> None:
        """Send ``op`` to the session's owner without waiting (a replica's warnings)."""

        async def send() -> None:
            with contextlib.suppress(ApiError):
                if await self.ask_owner(session, op, args) is None:  # it took the free lease
                    await self._perform(session, op, _pack(args))

        self._sessions_nursery.start_soon(send, name=f"cluster-forward {op} {session.id}")

    def relay(self, family: Session, session: Session, events: list[Emitted]) -> None:
        """A batch this node released: published once for the other nodes' clients."""
        if self.cluster is not None:
            self.cluster.publish(family.id, session.id, events)

    async def watch(self, session: Session, *, tell_owner: bool = True) -> None:
        """Receive the live batches of the session's family here (a replica's client subscribes).

        ``tell_owner``: ask the owner to publish them (``False`` when a
        snapshot or replay asked of it next says so anyway, before its cut).

        Raises:
            ApiError: 503 ``store_unavailable``: Redis did not take the subscription.
        """
        if self.cluster is None:
            return
        root = session.family.id
        if root not in self.cluster.watched:
            self._relayed.pop(root, None)
        try:
            await self.cluster.watch(root)
        except StoreError as exc:
            raise unavailable(exc) from None
        # Then the owner publishes the family's batches (it did not while
        # nobody watched): told before any cut is taken.
        if tell_owner:
            await self.ask_owner(session, "watch", None, patient=True)

    def _on_live(self, root: str, batch: LiveBatch) -> None:
        """A live batch of a watched family from its owner: fanned out to this node's clients.

        A batch whose number does not follow the last one of the same owner
        means pub/sub lost some: the family's clients here are closed with
        ``relay_gap`` and resume with ``since`` (gateway.cluster).
        """
        family = self.sessions.get(root)
        if family is None or not any(len(s.hub) for s in family.scope(True)):
            self._relayed.pop(root, None)
            if self.cluster is not None:
                self.cluster.unwatch(root)
            return
        if self.runs_here(batch.session_id):
            return  # a late batch of a node that ran it before this one: its own are the truth
        last = self._relayed.get(root)
        self._relayed[root] = (batch.node, batch.batch_no)
        if last is not None and last[0] == batch.node and batch.batch_no != last[1] + 1:
            self._relay_gap(root)
            return
        events = batch.emitted(event_frame)
        session = self.sessions.get(batch.session_id)
        if session is not None and session.family is family:
            session.publish(events)
        else:  # a worker this node has not loaded: its parent's clients may take it
            family.publish(events, from_worker=True)

    def _relay_gap(self, root: str) -> None:
        """Live batches of the family may have been lost: its clients here resume with since."""
        self._relayed.pop(root, None)
        family = self.sessions.get(root)
        if family is None:
            return
        event(
            log, logging.WARNING, "relay_gap",
            f"session {root}: live events from its node were lost; its clients here resume"
            " with since", session_id=root,
        )  # fmt: skip
        self._close_clients(family, "relay_gap")

    def _close_clients(self, family: Session, code: str) -> None:
        for s in family.scope(True):
            for sub in s.hub.subscribers():
                sub.request_close(code)

    async def _serve(self, op: str, session_id: str, body: bytes) -> bytes:
        """Serve another node's request on a session this node runs (:meth:`ask_owner`)."""
        session = await self.get_session(session_id)
        if session is None:
            raise ApiError(404, "session_not_found", f"no session {session_id!r}")
        if not self.runs_here(session_id):  # the lease moved meanwhile: the sender retries
            raise _changing_nodes(session_id)
        return await self._perform(session, op, body)

    async def _perform(self, session: Session, op: str, body: bytes) -> bytes:
        """Run an operation of :meth:`ask_owner` on a session this node runs; its answer."""
        session_id = session.id
        args: Any = msgspec.msgpack.decode(body)
        if op in ("watch", "snapshot", "replay") and self.cluster is not None:
            self.cluster.heard(session.family.id)  # before the cut: no batch after it is missed
        if op == "watch":
            return b""
        if op == "turn":
            await self.submit_turn(session, msgspec.msgpack.decode(body, type=Message))
        elif op == "cancel":
            session.cancel_turn(*args)
        elif op == "permission":
            session.decide_permission(*args)
        elif op == "feedback":
            session.record_feedback(*args)
        elif op == "compact":
            session.compact()
        elif op == "warn":
            session.emit([BusHandlerWarning(*args)], None)
        elif op == "unregistered":
            session.emit([BusSubscriberUnregistered(*args)], None)
        elif op == "state":
            return _pack(session.summary())
        elif op == "snapshot":
            return _pack(await seam.durable_snapshot(session, args))
        elif op == "replay":
            frame, max_events = args
            request = decode_client_frame(frame)
            assert isinstance(request, Subscribe) and request.since is not None
            _, key = resolve_filter(request.filter)
            try:
                frames, cut = await seam.replay(session, request.since, key, max_events)
            except SubscribeRejected as exc:
                return _pack(("error", exc.code, str(exc)))
            return _pack(("ok", frames, cut))
        else:  # a node of another version, say
            raise ApiError(
                503,
                "session_owner_unreachable",
                f"the node running session {session_id} does not know the operation {op!r}",
            )
        return b""

    # --- shared rules -------------------------------------------------------------

    def pricing(self, model: str) -> Callable[[Usage], float | None]:
        """``cost_usd`` of a usage on ``model``, from ``[model.prices]`` (0 when unpriced)."""
        price = self.config.model.prices.get(model)

        def cost(usage: Usage) -> float | None:
            if price is None:
                return 0.0
            return (
                usage.input_tokens * price.input_per_mtok
                + usage.output_tokens * price.output_per_mtok
                + (usage.cache_read_input_tokens or 0) * price.cache_read_per_mtok
                + (usage.cache_creation_input_tokens or 0) * price.cache_write_per_mtok
            ) / 1_000_000

        return cost


async def _workspace(
    workspaces: Workspaces, session_id: str, owner: str, workspace_path: str | None
) -> str:
    """The workspace of a new session, made now; what its record holds (PROTOCOL section 15).

    No ``workspace_path``: a fresh directory of its own, named after the
    session. Else a relative name under ``[sessions] workspace_root``, or an
    absolute directory under one of ``allowed_workspaces``
    (gateway.tools.workspace has the rules).

    Raises:
        ApiError: 422 ``invalid_workspace`` naming the problem (never a host path of the root).
    """
    try:
        return await workspaces.create(session_id=session_id, owner=owner, name=workspace_path)
    except WorkspaceError as exc:
        raise ApiError(422, "invalid_workspace", str(exc)) from None


def _pack(value: object) -> bytes:
    return msgspec.msgpack.encode(value)


def _changing_nodes(session_id: str) -> ApiError:
    """The session's lease is changing hands at this moment: the caller retries."""
    return ApiError(
        503,
        "session_owner_unreachable",
        f"session {session_id} is changing nodes; retry in 1 s",
        headers=(("Retry-After", "1"),),
    )

"""The gateway node: every session of one daemon, and what they share.

Task tree (a stack dump reads like this)::

    node                      Node.run
    ├── store-writer          the store's batching writer (gateway.store)
    ├── retention             purges events older than retention_hours
    ├── lease-keeper          renews this node's session leases (gateway.store.lease)
    ├── recovery              Redis only: closes turns of nodes that died (every lease_s)
    └── sessions              one child nursery per live session
        └── session <id>      Session.run: agent-loop <id>, translator <id>

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
import os
from collections.abc import Callable
from typing import Any, Protocol

import trio

from gateway.config import Config
from gateway.errors import ApiError, StoreError
from gateway.ids import new_attach_token, new_session_id, now_ms
from gateway.logs import SLOW_FLUSH_S, event
from gateway.metrics import Metrics
from gateway.protocol.shapes import Usage
from gateway.providers.base import Provider
from gateway.server.auth import NO_OWNER, Limits
from gateway.session.recovery import close_interrupted
from gateway.session.sequencer import EventSequencer
from gateway.session.session import Session
from gateway.store.base import SessionRecord, Store
from gateway.store.lease import LeaseKeeper, Taken, new_node_id
from gateway.tools.registry import ToolRegistry

log = logging.getLogger("gateway.node")

ROUTING_POLICY_VERSION = "static-1"


class AttachTokens:
    """Single-use attach tokens bound to one session, with a TTL (PROTOCOL section 2).

    Time is Trio's clock, so the TTL is testable with ``MockClock``.
    """

    def __init__(self, ttl_s: float) -> None:
        self.ttl_s = ttl_s
        self._tokens: dict[str, tuple[str, float]] = {}

    def issue(self, session_id: str) -> str:
        now = trio.current_time()
        # Tokens expire in the order they were issued (one TTL for all), which
        # is the dict's order: prune from the front, stop at the first live one.
        for token, (_, expires) in list(itertools.islice(self._tokens.items(), 64)):
            if expires + self.ttl_s > now:  # kept one more TTL, to say "expired"
                break
            del self._tokens[token]
        token = new_attach_token()
        self._tokens[token] = (session_id, now + self.ttl_s)
        return token

    def redeem(self, token: str | None, session_id: str) -> None:
        """Use a token up.

        Raises:
            ApiError: 403 for a missing, unknown, used, expired or other-session token.
        """
        if not token:
            raise ApiError(403, "attach_token_required", "the ?attach= token is missing")
        entry = self._tokens.pop(token, None)
        if entry is None:
            raise ApiError(403, "attach_token_invalid", "the attach token is unknown or used")
        owner, expires = entry
        if owner != session_id:
            raise ApiError(403, "attach_token_invalid", "the attach token is for another session")
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
        provider: Provider,
        tools: ToolRegistry,
        metrics: Metrics | None = None,
    ) -> None:
        self.config = config
        self.store = store
        self.provider = provider
        self.tools = tools
        self.metrics = metrics or Metrics()
        self.metrics.watch(
            turns_in_flight=lambda: sum(s.turn is not None for s in self.sessions.values()),
            connection_states=self._connection_states,
        )
        self.tokens = AttachTokens(config.stream.attach_token_ttl_s)
        self.limits = Limits(config.limits)  # [limits]: counted per API key (gateway.server.auth)
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
                await self._close_interrupted_turns()
                if self.leases.leases.shared:
                    sessions.start_soon(self._recovery_loop, name="recovery")
                task_status.started(self)
                await self._stop.wait()
                await self.drain_turns()
                sessions.cancel_scope.cancel()
            with trio.CancelScope(shield=True):
                await self.provider.aclose()
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
                session.publish(events)
            if not held:
                self._holding.pop(family, None)

    async def wait_durable(self) -> None:
        """Return once everything put so far is committed."""
        await self.store.wait_committed(self.store.ticket())

    async def durable_or_503(self) -> None:
        """:meth:`wait_durable` for a request, within ``commit_timeout_s``.

        Raises:
            ApiError: 503 ``store_unavailable`` when the store does not commit in time.
        """
        with trio.move_on_after(self.config.store.commit_timeout_s):
            await self.wait_durable()
            return
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

        Only a turn whose session's lease this node can take (gateway.store.lease):
        on Redis a session whose lease a live node holds is running there, and
        is left alone; a dead node's lease expires within ``lease_s``, and the
        ``recovery`` task tries again every ``lease_s``. A turn running on this
        node is not interrupted. With SQLite every lease is this node's: all of
        them are closed at start-up, as before.
        """
        records = await self.store.open_turns()
        by_id = {r.id: r for r in records}

        def depth(sid: str) -> int:
            parent = by_id[sid].parent_session_id
            return 1 + depth(parent) if parent in by_id else 0

        closed = 0
        for record in sorted(records, key=lambda r: -depth(r.id)):
            live = self.sessions.get(record.id)
            if live is not None and live.turn is not None:
                continue  # running here
            try:
                taken = await self.leases.take(record.id)
                if taken is None:
                    continue  # a live node runs it
                await self.ids_above(taken)
                session = await self.get_session(record.id)
                if session is not None:
                    # Loaded here while another node ran it: the stored record is the truth.
                    fresher = record if session is live and taken.new else None
                    closed += await self._close_if_interrupted(session, fresher)
            except Exception as exc:  # one session's history must not keep the node down
                event(
                    log, logging.ERROR, "session_failed",
                    f"session {record.id}: could not close turn {record.current_turn_id}"
                    f" left by a crash: {exc}",
                    exc_info=exc, session_id=record.id, turn_id=record.current_turn_id,
                    component="recovery",
                )  # fmt: skip
                self.metrics.session_failures.labels("recovery").inc()
        if closed:
            self._recovered(closed)
            await self.wait_durable()

    async def _close_if_interrupted(self, session: Session, record: SessionRecord | None) -> bool:
        """Close the session's turn left in flight, if it has one and none runs here.

        ``record``: the session as stored, replacing the one loaded here (a
        session loaded while another node ran it). One at a time, so that a
        recovery pass and a request taking the same lease never close a turn twice.
        """
        async with self._recovery_lock:
            if session.turn is not None:
                return False
            if record is not None:
                session.record = record
            if session.record.current_turn_id is None:
                return False
            await close_interrupted(session)
            return True

    def _recovered(self, turns: int) -> None:
        event(
            log, logging.INFO, "turns_recovered",
            f"closed {turns} turns left in flight by a node that died", turns=turns,
        )  # fmt: skip

    async def _recovery_loop(self) -> None:
        """Redis: close the turns of nodes that died since, once their leases expire."""
        while True:
            await trio.sleep(self.config.store.lease_s)
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
        # The session must stop acting here; routing it to the holder is the
        # next slice of issue 13 (docs/scale-out.md). For now: said and counted.
        event(
            log, logging.ERROR, "lease_lost",
            f"session {session_id}: this node lost its lease (another node may run it now)",
            session_id=session_id, component="lease",
        )  # fmt: skip
        self.metrics.session_failures.labels("lease").inc()

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

    def resolve_model(self, model: str | None) -> str:
        """The model a new session runs on (``POST /sessions``).

        Raises:
            ApiError: 422 for a model of another provider than the configured one.
        """
        if model is None:
            return self.config.model.name
        provider = self.config.model.provider
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
        metadata: dict[str, Any] | None = None,
        parent: Session | None = None,
        owner: str = NO_OWNER,
        session_id: str | None = None,
    ) -> Session:
        """Create and start a session (``POST /sessions``, or a ``delegate`` worker).

        Args:
            owner: the id of the API key that creates it (PROTOCOL section 2), ``""``
                without keys. A worker belongs to its parent's owner and is not
                counted against ``max_sessions_per_key`` (a tool made it, not a client).
            session_id: the id to give it (an AG-UI ``threadId`` the caller
                checked is unknown: gateway.agui); a fresh ``sess_`` id if None.

        Raises:
            ApiError: 429 ``too_many_sessions`` (the count is taken before any
                wait, so two racing requests cannot both get the last one), 422
                for a bad workspace or model, 503 ``store_unavailable``.
        """
        if parent is not None:
            owner = parent.record.owner
        counted = self.limits.new_session(owner) if parent is None else contextlib.nullcontext()
        with counted:
            workspace = await _workspace(workspace_path)
            record = SessionRecord(
                id=session_id or new_session_id(),
                created_at=now_ms(),
                workspace_path=workspace,
                active_model=self.resolve_model(model),
                metadata=metadata or {},
                parent_session_id=parent.id if parent else None,
                routing_policy_version=ROUTING_POLICY_VERSION,
                owner=owner,
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
            model=record.active_model,
        )  # fmt: skip
        return session

    def runs_here(self, session_id: str) -> bool:
        """Whether this node may run the session's turns: it holds the session's lease.

        Always, on a store of one node (SQLite). On Redis, a session whose
        lease another node holds is not run here (its turns get 503
        ``session_elsewhere`` until routing to the holder exists).
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
        a turn's submission). A session held elsewhere stays as it is: loaded
        here for its clients, its turns, for now, run wherever they are sent
        (docs/scale-out.md: routing them to the holder is the next slice).
        """
        try:
            taken = await self.leases.take(session.id)
            if taken is None:
                return
            await self.ids_above(taken)
            if taken.new and session.turn is None:
                record = await self.store.get_session(session.id)
                if await self._close_if_interrupted(session, record):
                    self._recovered(1)
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
                parent = await self.get_session(record.parent_session_id)
            stored = await self.store.load_messages(session_id)
            session = Session(self, record, stored, parent=parent)
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
                    await self.get_session(worker_id)
            return session
        finally:
            del self._loading[session_id]
            loading.set()

    async def _start(self, session: Session) -> None:
        self.sessions[session.id] = session
        self.metrics.sessions_live.set(len(self.sessions))
        await self._sessions_nursery.start(session.run, name=f"session {session.id}")

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


async def _workspace(workspace_path: str | None) -> str:
    """The absolute workspace of a new session (``POST /sessions``, PROTOCOL section 2).

    Raises:
        ApiError: 422 ``invalid_workspace``: not a directory, or none given and
            the daemon's own working directory is gone (deleted under it).
    """
    try:
        path = await trio.Path(workspace_path or os.curdir).absolute()
    except OSError as exc:  # os.getcwd() of a deleted directory
        raise ApiError(
            422,
            "invalid_workspace",
            f"the daemon's working directory is gone ({exc.strerror}); give workspace_path",
        ) from None
    if not await path.is_dir():
        raise ApiError(422, "invalid_workspace", f"workspace_path {str(path)!r} is not a directory")
    return str(path)

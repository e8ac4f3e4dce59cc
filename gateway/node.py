"""The gateway node: every session of one daemon, and what they share.

Task tree (a stack dump reads like this)::

    node                      Node.run
    ├── store-writer          the store's batching writer (gateway.store)
    ├── retention             purges events older than retention_hours
    └── sessions              one child nursery per live session
        └── session <id>      Session.run: agent-loop <id>, translator <id>

Shared by all sessions: the config, the store, the node-wide event sequencer
(PROTOCOL section 1), the provider, the tool registry, the attach tokens and
the metrics. Shutdown (RUNNING.md "Command line") goes in order: no new turns,
in-flight turns cancelled with ``reason: "shutdown"`` and given
``shutdown_grace_s`` to emit their sequences, sessions stopped, the store
flushed and closed.
"""

from __future__ import annotations

import itertools
import logging
import os
from collections.abc import Callable
from typing import Any

import trio

from gateway.config import Config
from gateway.errors import ApiError
from gateway.ids import new_attach_token, new_session_id, now_ms
from gateway.metrics import Metrics
from gateway.protocol.shapes import Usage
from gateway.providers.base import Provider
from gateway.session.hub import Subscriber
from gateway.session.sequencer import EventSequencer
from gateway.session.session import Session
from gateway.store.base import SessionRecord, Store
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
        self.tokens = AttachTokens(config.stream.attach_token_ttl_s)
        self.sessions: dict[str, Session] = {}
        self.connections: set[Any] = set()  # open stream connections (closed with 1001 on shutdown)
        self.sequencer: EventSequencer
        self.retention_floor = 0
        self.shutting_down = False
        self._loading: dict[str, trio.Event] = {}
        self._sessions_nursery: trio.Nursery
        self._stop = trio.Event()
        self._changed = trio.Event()

    # --- lifecycle -------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[Node] = trio.TASK_STATUS_IGNORED) -> None:
        state = await self.store.open()
        self.retention_floor = state.retention_floor
        async with trio.open_nursery() as nursery:
            await nursery.start(self._run_store, name="store-writer")
            self.sequencer = EventSequencer(state.event_ceiling, self.store.reserve_event_ids)
            await self.store.flush()  # the first reservation is durable before any id is used
            async with trio.open_nursery() as sessions:
                self._sessions_nursery = sessions
                sessions.start_soon(self._retention_loop, name="retention")
                task_status.started(self)
                await self._stop.wait()
                await self.drain_turns()
                sessions.cancel_scope.cancel()
            with trio.CancelScope(shield=True):
                await self.provider.aclose()
            await self.store.aclose()

    async def _run_store(self, *, task_status: trio.TaskStatus[None]) -> None:
        await self.store.run(task_status=task_status)

    def stop(self) -> None:
        """Begin shutdown: no new turns; :meth:`run` returns once everything is closed."""
        self.shutting_down = True
        self._stop.set()

    async def drain_turns(self) -> None:
        """Cancel in-flight turns with ``reason: "shutdown"`` and wait for their sequences."""
        for session in self.sessions.values():
            if session.turn is not None:
                session.turn.request_cancel("shutdown")
        with trio.move_on_after(self.config.server.shutdown_grace_s):
            while any(s.turn is not None for s in self.sessions.values()):
                await self.changed()

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
            self.retention_floor = await self.store.purge_before(now_ms() - horizon_ms)
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
    ) -> Session:
        """Create and start a session (``POST /sessions``, or a ``delegate`` worker)."""
        path = await trio.Path(workspace_path or os.curdir).absolute()
        workspace = str(path)
        if not await path.is_dir():
            raise ApiError(
                422, "invalid_workspace", f"workspace_path {workspace!r} is not a directory"
            )
        record = SessionRecord(
            id=new_session_id(),
            created_at=now_ms(),
            workspace_path=workspace,
            active_model=self.resolve_model(model),
            metadata=metadata or {},
            parent_session_id=parent.id if parent else None,
            routing_policy_version=ROUTING_POLICY_VERSION,
        )
        self.store.put_session(record)
        session = Session(self, record, parent=parent)
        if parent is not None:
            parent.workers.append(session)
        await self._start(session)
        return session

    async def get_session(self, session_id: str) -> Session | None:
        """A live session, loading a stored one on first use; ``None`` if unknown."""
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

    def slow_client(self, sub: Subscriber) -> None:
        """The slow-client rule (PROTOCOL section 3), applied after a fan-out, never during one.

        The subscriber unsubscribes itself, its session emits
        ``bus.handler_warning`` and the connection is closed with 1008; other
        clients of the session are unaffected.
        """
        self.metrics.slow_clients.inc()
        sub.overflowed()

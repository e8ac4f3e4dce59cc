"""The session registry: the sessions live on this node, created or loaded on first use.

A stored session is loaded the first time a request names it (its family
with it: a parent's stream carries its workers' events, docs/protocol.md §5);
two requests for one session load it once. A new session (``POST /sessions``,
or a ``delegate`` worker) is checked, stored and started here. Each session
runs in its own child of the ``sessions`` nursery (gateway.node.node).
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import math
from typing import Any

import trio

from gateway.errors import Refused, StoreError
from gateway.ids import new_session_id, now_ms
from gateway.logs import event
from gateway.node.core import NodeCore
from gateway.session.session import Session
from gateway.store.base import SessionRecord
from gateway.tenancy import NO_OWNER
from gateway.tools.workspace import WorkspaceError, Workspaces

log = logging.getLogger("gateway.node")

_PINS: contextvars.ContextVar[Pins | None] = contextvars.ContextVar("pins", default=None)
"""The sessions the request in this task holds (:func:`pinning`)."""

ROUTING_POLICY_VERSION = "static-1"


class Registry:
    """Every session live on this node, by id."""

    def __init__(self, node: NodeCore) -> None:
        self.node = node
        self.sessions: dict[str, Session] = {}
        self._loading: dict[str, trio.Event] = {}
        self._unloading: dict[str, trio.Event] = {}  # leaving memory: a request waits, then loads
        self._scopes: dict[str, trio.CancelScope] = {}  # each live session's tasks, to end them
        # Sessions being deleted (gateway.node.deletion): unknown to every request already.
        self.deleting: set[str] = set()
        self._naming: dict[str, trio.Event] = {}  # ids their clients chose, being created
        self.nursery: trio.Nursery  # the node's ``sessions`` nursery, once it runs

    def resolve_agent(self, name: str | None) -> str:
        """The agent a new session runs (``POST /sessions {"agent"}``).

        Raises:
            Refused: ``unknown_agent``, the message listing the agents there are.
                The name is echoed cut at 64 characters (an agent's longest).
        """
        agents = self.node.agents
        if name is None:
            return agents.default
        if name not in agents:
            names = ", ".join(agents.names())
            shown = name if len(name) <= 64 else f"{name[:64]}..."
            raise Refused("unknown_agent", f"no agent {shown!r}; agents: {names}")
        return name

    def resolve_model(self, model: str | None, agent: str = "default") -> str:
        """The model a new session runs on (``POST /sessions``): its agent's, unless named.

        Raises:
            Refused: ``invalid_model`` for a model of another provider than the agent's.
        """
        profile = self.node.agents[agent]
        if model is None:
            return profile.model
        provider = profile.provider
        if not model.startswith(f"{provider}:") or len(model) == len(provider) + 1:
            raise Refused(
                "invalid_model",
                f"model {model!r} is not served here; models are '{provider}:<name>'",
            )
        return model

    async def create(
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
            owner: the id of the API key that creates it (docs/protocol.md §2), ``""``
                without keys. A worker belongs to its parent's owner and counts
                against that owner's ``max_sessions_per_key`` like any session
                (docs/protocol.md §15: a turn cannot make sessions its key could not;
                the ``delegate`` tool turns the 429 into ``tool.failed`` ``limit``).
            session_id: the id to give it (through :meth:`create_named` only);
                a fresh ``sess_`` id if None.

        Raises:
            ApiError: 429 ``too_many_sessions`` (gateway.tenancy; the count is
                taken before any wait, so two racing requests cannot both get the
                last one).
            Refused: ``unknown_agent``, ``invalid_model``, ``invalid_workspace``,
                ``store_unavailable``; ``shutting_down`` (with Retry-After) for a
                client's session once shutdown began, as a turn is (a worker of a
                turn still running is made: the turn is being cancelled anyway).
        """
        node = self.node
        if parent is not None:
            owner = parent.record.owner
        elif node.shutting_down:
            wait = math.ceil(node.config.server.shutdown_grace_s)
            raise Refused(
                "shutting_down",
                f"the gateway is shutting down; retry in {wait} s (on another node)",
                retry_after_s=wait,
            )
        session_id = session_id or new_session_id()
        async with node.limits.new_session(owner, session_id):
            record = await self._new_record(
                session_id, owner, parent, agent, model, workspace_path, metadata
            )
            if session_id in self._naming:  # its client chose the id: the store decides
                if await node.store.insert_session(record) is not None:
                    raise _Taken(session_id)
            else:
                node.store.put_session(record)
        session = Session(node, record, parent=parent)
        if parent is not None:
            parent.workers.append(session)
        await self.start(session)
        with contextlib.suppress(StoreError):  # new: no id of it anywhere, so no id jump
            await node.leases.take(record.id)
        await node.durable_or_503()  # docs/protocol.md §9: durable when POST /sessions answers
        await node.limits.session_stored(owner, record.id)  # counted by the store from now on
        event(
            log, logging.INFO, "session_created", f"session {record.id} created",
            session_id=record.id, parent_session_id=record.parent_session_id,
            model=record.active_model, agent=record.agent,
        )  # fmt: skip
        return session

    async def _new_record(
        self,
        session_id: str,
        owner: str,
        parent: Session | None,
        agent: str | None,
        model: str | None,
        workspace_path: str | None,
        metadata: dict[str, Any] | None,
    ) -> SessionRecord:
        """A new session's record: its agent, model and workspace resolved (422 before
        anything is made); a worker's agent and workspace are its parent's."""
        node = self.node
        if parent is not None:  # a worker runs its parent's agent's delegate_agent
            agent = node.agents[parent.record.agent].delegate_agent
            if agent != parent.record.agent:
                model = None  # ... on that agent's model, not the parent's
        agent = self.resolve_agent(agent)
        active_model = self.resolve_model(model, agent)
        if parent is not None:  # a worker works in its parent's workspace
            workspace = parent.record.workspace_path
        else:
            workspace = await _workspace(node.workspaces, session_id, owner, workspace_path)
        return SessionRecord(
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

    async def create_named(self, session_id: str, owner: str) -> Session | None:
        """A new session ``session_id`` owned by ``owner``; ``None`` if the id is taken.

        The one way a session its client names is made (docs/protocol.md §14:
        AG-UI's ``threadId``, the AI SDK's chat ``id``, whichever door asks):
        requests for one id on this node wait for each other, and the store
        inserts the record only where no record has the id
        (:meth:`gateway.store.base.Store.insert_session`), so of two creations
        on any nodes exactly one makes it. ``None``: the id is a session's, or
        was one being deleted; whose, the caller's ownership check tells.

        Raises:
            Refused, ApiError: as :meth:`create`.
            StoreError: the store did not answer.
        """
        while (naming := self._naming.get(session_id)) is not None:
            await naming.wait()
        if self._taken(session_id) or await self.node.store.get_session(session_id):
            return None
        if session_id in self._naming or self._taken(session_id):  # meanwhile, during the read
            return await self.create_named(session_id, owner)
        self._naming[session_id] = named = trio.Event()
        try:
            return await self.create(owner=owner, session_id=session_id)
        except _Taken:
            return None
        finally:
            del self._naming[session_id]
            named.set()

    def _taken(self, session_id: str) -> bool:
        """The id is a session's here: live, loading, leaving memory or being deleted."""
        return (
            session_id in self.sessions
            or session_id in self._loading
            or session_id in self._unloading
            or session_id in self.deleting
        )

    async def load(self, session_id: str) -> Session | None:
        """A live session, loading a stored one (and its workers); ``None`` if unknown.

        Nothing is claimed while loading (a claim loads the family itself:
        gateway.node.failover).
        """
        if session_id in self.deleting:
            return None
        while (unloading := self._unloading.get(session_id)) is not None:
            await unloading.wait()  # then loaded afresh (gateway.node.unloading)
        session = self.sessions.get(session_id)
        if session is not None:
            return self._used(session)
        loading = self._loading.get(session_id)
        if loading is not None:
            await loading.wait()
            session = self.sessions.get(session_id)
            return None if session is None else self._used(session)
        self._loading[session_id] = loading = trio.Event()
        try:
            session = await self._load(session_id)
            return None if session is None else self._used(session)
        finally:
            del self._loading[session_id]
            loading.set()

    def _used(self, session: Session) -> Session:
        """A request is using the session: not idle, and pinned until its answer is out."""
        session.used_at = trio.current_time()
        pins = _PINS.get()
        if pins is not None and pins.open:
            session.pins += 1
            pins.pinned.append(session)
        return session

    async def _load(self, session_id: str) -> Session | None:
        store = self.node.store
        record = await store.get_session(session_id)
        if record is None:
            return None
        parent = None
        if record.parent_session_id:
            parent = await self.load(record.parent_session_id)
        stored = await store.load_messages(session_id)
        size = await store.event_bytes(session_id)  # max_session_mb: once, at load
        session = Session(self.node, record, stored, parent=parent, event_bytes=size)
        if parent is not None:
            parent.workers.append(session)
        await self.start(session)
        event(
            log, logging.INFO, "session_loaded", f"session {session_id} loaded from the store",
            session_id=session_id, messages=len(session.messages),
        )  # fmt: skip
        # A parent's stream carries its workers' events (docs/protocol.md §5):
        # they are loaded with it. One being loaded already joins by itself.
        for worker_id in await store.worker_ids(session_id):
            if worker_id not in self.sessions and worker_id not in self._loading:
                await self.load(worker_id)
        return session

    async def start(self, session: Session) -> None:
        session.used_at = trio.current_time()
        self.sessions[session.id] = session
        self.node.metrics.sessions_live.set(len(self.sessions))
        self._scopes[session.id] = scope = trio.CancelScope()
        await self.nursery.start(self._run, session, scope, name=f"session {session.id}")

    async def _run(
        self,
        session: Session,
        scope: trio.CancelScope,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        _PINS.set(None)  # a session's own tasks hold nothing (they may start in a request)
        try:
            with scope:
                await session.run(task_status=task_status)
        finally:
            session.ended.set()

    async def loaded(self, session_id: str) -> None:
        """Wait for a load of the session in progress, if any."""
        loading = self._loading.get(session_id)
        if loading is not None:
            await loading.wait()

    def busy(self, session: Session) -> bool:
        """Whether the session is being loaded, or a request is loading its worker."""
        return session.id in self._loading or session.id in self._unloading

    def unload(self, family: list[Session]) -> None:
        """A family leaves memory (gateway.node.unloading): its tasks end, it is dropped.

        Until :meth:`unloaded`, a request for one of them waits, then loads it
        afresh from the store.
        """
        for session in reversed(family):  # workers first
            self._unloading[session.id] = trio.Event()
            scope = self._scopes.pop(session.id, None)
            if scope is not None:
                scope.cancel()
            if self.sessions.get(session.id) is session:
                del self.sessions[session.id]
        self.node.metrics.sessions_live.set(len(self.sessions))

    def unloaded(self, family: list[Session]) -> None:
        """The family is out of memory: a request for it loads it from the store now."""
        for session in family:
            unloading = self._unloading.pop(session.id, None)
            if unloading is not None:
                unloading.set()

    def forget(self, session: Session) -> None:
        """End a deleted session's tasks for good and drop it from this node (and its parent)."""
        session.fenced = True  # from now on it emits and stores nothing (a late client's goodbye)
        session.deleted = True  # a client attaching to it now is closed session_deleted
        scope = self._scopes.pop(session.id, None)
        if scope is not None:
            scope.cancel()
        if self.sessions.get(session.id) is session:
            del self.sessions[session.id]
        parent = session.parent
        if parent is not None and session in parent.workers:
            parent.workers.remove(session)
        self.node.metrics.sessions_live.set(len(self.sessions))


class Pins:
    """The sessions one request holds (:func:`pinning`); none once released."""

    __slots__ = ("open", "pinned")

    def __init__(self) -> None:
        self.pinned: list[Session] = []
        self.open = True  # a task spawned by the request inherits it: it pins nothing after

    def release(self) -> None:
        """The request is over: its sessions are free to unload, idle from now on."""
        if not self.open:
            return
        self.open = False
        now = trio.current_time()
        for session in self.pinned:
            session.pins -= 1
            session.used_at = now
        self.pinned.clear()


class _Taken(Exception):
    """The store has a record of the id :meth:`Registry.create_named` was creating."""


def pinning() -> Pins:
    """Hold every session the request in this task uses (loads), until ``release()``.

    A pinned session is never unloaded (gateway.node.unloading): the HTTP layer
    holds them from a request's start until its answer is out or its stream
    (WebSocket, SSE) is over; the cluster link while it serves an operation.
    """
    pins = Pins()
    _PINS.set(pins)
    return pins


async def _workspace(
    workspaces: Workspaces, session_id: str, owner: str, workspace_path: str | None
) -> str:
    """The workspace of a new session, made now; what its record holds (docs/protocol.md §15).

    No ``workspace_path``: a fresh directory of its own, named after the
    session. Else a relative name under ``[sessions] workspace_root``, or an
    absolute directory under one of ``allowed_workspaces``
    (gateway.tools.workspace has the rules).

    Raises:
        Refused: ``invalid_workspace`` naming the problem (never a host path of the root).
    """
    try:
        return await workspaces.create(session_id=session_id, owner=owner, name=workspace_path)
    except WorkspaceError as exc:
        raise Refused("invalid_workspace", str(exc)) from None

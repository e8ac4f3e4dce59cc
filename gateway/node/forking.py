"""``POST /sessions/{id}/fork``, carried out on the node that runs the source (docs/protocol.md
§2, "Forks").

A fork is a new session of the caller's key and its source's agent and
model, whose history is a copy of the source's up to the fork point
(gateway.session.fork_point), whose workspace is a copy of the source's as it
is now (:meth:`gateway.tools.workspace.Workspaces.copy`), and whose Claude
Code conversation, for a ``claude-code`` agent, resumes the source's at that
point (gateway.runtimes.claude_code.forking), and whose files are copies of the
source's (its messages name them). Its first event is
``session.forked``. It is made where the source runs (the ``Fork``
operation, gateway.cluster.ops): that node holds the source's messages, knows
whether a turn runs, and has its workspace and transcript.

In order, each refusal before anything is made: ``shutting_down``;
``store_unavailable`` once the store refuses every write (again after the copy);
``worker_session`` (a ``delegate`` worker or a Claude Code sub-agent:
their conversations are their parent's turns'); ``turn_in_progress`` (a
workspace copied while a turn writes to it would be torn);
``message_rewound``, ``message_not_found``, ``not_a_fork_point``; then, counted against the key's
``max_sessions_per_key`` from here on, ``too_many_sessions``;
``invalid_workspace`` (the source's cannot be used), ``workspace_too_large``;
``transcript_unavailable``; and ``session_not_found`` if the source was
deleted meanwhile. A turn submitted to the source while its workspace is
being copied waits for the copy (:func:`copied`); another fork of it copies
alongside.
"""

from __future__ import annotations

import contextlib
import logging
import math
import weakref
from collections.abc import Iterator

import msgspec
import trio

from gateway.cluster import ops
from gateway.errors import ApiError, Refused, StoreError, unavailable
from gateway.ids import now_ms
from gateway.logs import event
from gateway.node.core import NodeCore
from gateway.protocol.events import SessionForked
from gateway.protocol.http import ForkCreated, ForkOrigin
from gateway.runtimes.claude_code import forking as claude_code
from gateway.runtimes.claude_code.paths import claude_session_id, remove_state, state_dir
from gateway.session import admission
from gateway.session.fork_point import (
    ForkPoint,
    fork_messages,
    fork_metadata,
    fork_point,
    origin_of,
    turns_in,
)
from gateway.session.session import Session
from gateway.store.base import SessionRecord, StoredMessage
from gateway.tools.workspace import WorkspaceError, WorkspaceTooLarge

log = logging.getLogger("gateway.node")

MIB = 1 << 20


async def fork(node: NodeCore, source: Session, op: ops.Fork) -> ForkCreated:
    """Make the fork (module docstring); what ``POST /sessions/{id}/fork`` answers.

    Raises:
        Refused: each refusal of the module docstring, in that order.
    """
    _check(node, source)
    if any(m.id == op.at_message_id for m in source.rewound):
        raise Refused(
            "message_rewound",
            f"message {op.at_message_id} of {source.id} was rewound: fork at a message of"
            " the history as it is now",
        )
    point = fork_point(source.messages, op.at_message_id, source.id)
    with _copying(source):  # in the step that found no turn: one submitted now waits
        session = await _make(node, source, op, point)
    await node.registry.start(session)
    with contextlib.suppress(StoreError):  # new: no id of it anywhere, so no id jump
        await node.leases.take(session.id)
    await node.durable_or_503()  # docs/protocol.md §9: durable when the fork answers
    await node.limits.session_stored(op.owner, session.id)
    event(
        log, logging.INFO, "session_forked",
        f"session {session.id} forked from {source.id} at {point.at_message_id}",
        session_id=session.id, from_session_id=source.id, at_message_id=point.at_message_id,
        messages=len(point.history), draft=point.draft is not None,
    )  # fmt: skip
    return answer_of(session.record)


def answer_of(record: SessionRecord) -> ForkCreated:
    """What ``POST /sessions/{id}/fork`` answers for the fork ``record`` (a retry's too)."""
    origin, draft = origin_of(record.metadata)
    return ForkCreated(
        record.id,
        record.active_model,
        record.created_at,
        record.agent,
        origin or ForkOrigin("", None),
        msgspec.UNSET if draft is None else draft,
    )


def _check(node: NodeCore, source: Session) -> None:
    """The refusals that look at the source alone (module docstring)."""
    if node.shutting_down:
        wait = math.ceil(node.config.server.shutdown_grace_s)
        raise Refused(
            "shutting_down",
            f"the gateway is shutting down; retry in {wait} s (on another node)",
            retry_after_s=wait,
        )
    admission.check_store(node.store)  # §15: nothing copied that the store could never hold
    parent = source.record.parent_session_id
    if parent is not None:
        raise Refused(
            "worker_session",
            f"{source.id} is a worker of {parent} (its conversation is a turn of its"
            f" parent's): fork {parent}",
        )
    if source.turn is not None:
        raise Refused(
            "turn_in_progress",
            f"turn {source.turn.id} is in flight on {source.id}: a fork copies the"
            " workspace it may be changing; fork once it ends (or cancel it)",
        )


async def _make(node: NodeCore, source: Session, op: ops.Fork, point: ForkPoint) -> Session:
    """The fork, stored and ready to start: counted, its workspace and state copied.

    Nothing is left behind by a refusal: the count is given back, the copies removed.
    """
    created_at = now_ms()
    try:
        async with node.limits.new_session(op.owner, op.fork_id):  # 429 past the key's limit
            workspace = await _workspace(node, source, op)
            try:
                await _conversation(node, source, op.fork_id, created_at, workspace, point)
                await _files(node, source, op)
                admission.check_store(node.store)  # began to refuse writes while copying
                if _gone(node, source):
                    raise Refused("session_not_found", f"no session {source.id!r}")
            except BaseException:
                with trio.CancelScope(shield=True):
                    await _remove(node, op.fork_id, workspace)
                raise
            return _stored(node, source, op, point, created_at, workspace)
    except ApiError as exc:  # the key's session limit: a refusal (it crosses the cluster link)
        raise Refused(exc.code, exc.message) from None
    except Refused:
        if _gone(node, source):  # deleted while its workspace was copied (and went with it)
            raise Refused("session_not_found", f"no session {source.id!r}") from None
        raise


def _gone(node: NodeCore, source: Session) -> bool:
    """The source was deleted (or is being deleted) since the fork began."""
    return source.deleted or source.id in node.registry.deleting


async def _workspace(node: NodeCore, source: Session, op: ops.Fork) -> str:
    """The fork's own workspace, a copy of the source's (gateway.tools.workspace)."""
    limit_mb = node.config.sessions.fork_copy_max_mb
    try:
        return await node.workspaces.copy(
            recorded=source.record.workspace_path,
            session_id=op.fork_id,
            owner=op.owner,
            max_bytes=limit_mb * MIB,
        )
    except WorkspaceTooLarge as exc:
        raise Refused(
            "workspace_too_large",
            f"the workspace of {source.id} holds {_mib(exc.size)} of files, more than"
            f" [sessions] fork_copy_max_mb ({limit_mb} MiB): it is not copied",
        ) from None
    except WorkspaceError as exc:
        raise Refused("invalid_workspace", f"the workspace of {source.id}: {exc}") from None


async def _conversation(
    node: NodeCore, source: Session, fork_id: str, created_at: int, workspace: str, point: ForkPoint
) -> None:
    """A ``claude-code`` fork's state: its CLI resumes the source's conversation there."""
    if node.agents[source.record.agent].runtime != "claude-code":
        return
    root = node.workspaces.root

    def prepare() -> None:
        claude_code.prepare(
            state_dir(root, source.id),
            claude_session_id(source.id),
            state_dir(root, fork_id),
            created_at,
            node.workspaces.host_path(workspace),
            point.history,
        )

    try:
        await trio.to_thread.run_sync(prepare)
    except claude_code.TranscriptUnavailable as exc:
        raise Refused(
            "transcript_unavailable",
            f"{source.id} cannot be forked at {point.at_message_id}: {exc}",
        ) from None


def _stored(
    node: NodeCore,
    source: Session,
    op: ops.Fork,
    point: ForkPoint,
    created_at: int,
    workspace: str,
) -> Session:
    """Put the fork's record and messages, and emit ``session.forked``, in one step (one
    commit: a fork is stored whole or not at all)."""
    record = SessionRecord(
        id=op.fork_id,
        created_at=created_at,
        workspace_path=workspace,
        active_model=source.record.active_model,
        metadata=fork_metadata(source.record.metadata, source.id, point),
        parent_session_id=None,
        routing_policy_version=source.record.routing_policy_version,
        turn_count=turns_in(point.history),
        owner=op.owner,
        agent=source.record.agent,
    )
    # Copies without their completions: a replay of the fork holds no event of its history
    # (those were the source's); its snapshot and GET .../messages hold the messages.
    stored = [StoredMessage(m, None) for m in fork_messages(point.history, op.fork_id)]
    node.store.put_session(record)
    for message in stored:
        node.store.put_message(message)
    session = Session(node, record, stored)
    session.emit([SessionForked(source.id, point.at_message_id)], None)
    return session


async def _files(node: NodeCore, source: Session, op: ops.Fork) -> None:
    """The fork's copy of the source's files: its messages name them (docs/protocol.md §2
    "Files"). Before the fork's record: a fork is never seen without them."""
    try:
        await node.store.copy_files(source.id, op.fork_id, op.owner)
    except StoreError as exc:
        raise unavailable(exc) from None


async def _remove(node: NodeCore, fork_id: str, workspace: str) -> None:
    """What a refused fork copied: its files (first: they count against its key's quota,
    whatever fails after), its workspace and Claude Code state."""
    with contextlib.suppress(StoreError):  # no record of it: only its files (copied or not)
        await node.store.delete_sessions([fork_id])
    await node.workspaces.remove(session_id=fork_id, recorded=workspace)
    root = node.workspaces.root
    await trio.to_thread.run_sync(remove_state, root, fork_id)


def _mib(size: int) -> str:
    return f"{size / MIB:.1f} MiB"


# --- turns wait for a copy -------------------------------------------------------------


class _Copies:
    """The forks copying one session's workspace now."""

    def __init__(self) -> None:
        self.count = 0
        self.done = trio.Event()


_copies: weakref.WeakKeyDictionary[Session, _Copies] = weakref.WeakKeyDictionary()


@contextlib.contextmanager
def _copying(source: Session) -> Iterator[None]:
    copies = _copies.get(source)
    if copies is None:
        copies = _copies[source] = _Copies()
    copies.count += 1
    try:
        yield
    finally:
        copies.count -= 1
        if not copies.count:
            del _copies[source]
            copies.done.set()


async def copied(session: Session) -> None:
    """Return once no fork is copying the session's workspace: a turn starts after
    (gateway.node.operations; module docstring)."""
    while (copies := _copies.get(session)) is not None:
        await copies.done.wait()


__all__ = ["answer_of", "copied", "fork"]

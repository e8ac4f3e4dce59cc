"""What each operation on a session does, on the node that runs it.

The operations are :mod:`gateway.cluster.ops`; a request for one reaches the
node that runs the session (gateway.node.placement), which carries it out
here (:func:`perform`) and answers exactly as its own routes would.
"""

from __future__ import annotations

from typing import assert_never

from gateway.cluster import ops
from gateway.errors import Refused, SubscribeRejected
from gateway.node import deletion, forking, push_configs
from gateway.node.core import NodeCore
from gateway.protocol.events import BusHandlerWarning, BusSubscriberUnregistered
from gateway.protocol.filters import resolve_filter
from gateway.protocol.frames import Subscribe, decode_client_frame
from gateway.session import busy, seam
from gateway.session.session import Session

Notice = ops.Warn | ops.Unregistered
"""An operation sent without waiting for its answer (a replica's warnings)."""


def notice(session: Session, op: Notice) -> None:
    """Emit a forwarded warning on the node that runs the session."""
    match op:
        case ops.Warn():
            session.emit([BusHandlerWarning(op.subscription, op.reason, op.detail)], None)
        case ops.Unregistered():
            session.emit([BusSubscriberUnregistered(op.name, op.reason)], None)
        case _:
            assert_never(op)


async def perform(node: NodeCore, session: Session, op: ops.Operation) -> ops.Answer:
    """Carry an operation out on a session this node runs; its answer.

    Raises:
        Refused: as the session's own routes would refuse it.
    """
    if session.id in node.registry.deleting:  # it is being deleted: already unknown
        raise Refused("session_not_found", f"no session {session.id!r}")
    match op:
        case ops.Watch():
            pass
        case ops.StartTurn():
            return await start_turn(node, session, op)
        case ops.CancelTurn():
            session.cancel_turn(op.turn_id, op.reason, op.requested_by)
        case ops.DecidePermission():
            session.decide_permission(op.perm_id, op.decision, op.content)
        case ops.RecordFeedback():
            session.record_feedback(op.message_id, op.rating, op.comment)
        case ops.Compact():
            session.compact()
        case ops.DeleteSession():
            await deletion.delete(node, session)
        case ops.Fork():
            return ops.Forked(await forking.fork(node, session, op))
        case ops.ChangePushConfig():
            changed = push_configs.change(session, op)
            await node.store.wait_committed(node.store.ticket())
            return changed
        case ops.Warn() | ops.Unregistered():
            notice(session, op)
        case ops.State():
            return ops.Summary(session.summary())
        case ops.TakeSnapshot():
            data, cut = await seam.durable_snapshot(session, op.limit)
            return ops.Snapshot(data, cut)
        case ops.Replay():
            request = decode_client_frame(op.frame)
            if not isinstance(request, Subscribe) or request.since is None:
                raise Refused("session_owner_unreachable", "a replay needs a subscribe with since")
            _, key = resolve_filter(request.filter)
            try:
                frames, cut = await seam.replay(session, request.since, key, op.max_events)
            except SubscribeRejected as exc:
                return ops.ReplayRejected(exc.code, exc.message)
            return ops.Replayed(frames, cut)
        case _:
            assert_never(op)
    return ops.Done()


async def start_turn(node: NodeCore, session: Session, op: ops.StartTurn) -> ops.TurnTaken:
    """Start a turn on a session this node runs; return once it is accepted (durable):
    started, queued or steered (docs/protocol.md §2 "A busy session").

    ``op.trace``: the trace context its request came with (gateway.telemetry).

    Raises:
        Refused: as :meth:`Session.submit_turn` and :meth:`Session.accepted`;
            ``over_capacity`` (:func:`_process_slot`).
    """
    await _process_slot(node, session)
    await forking.copied(session)  # a fork copying its workspace first (docs/protocol.md §2)
    if session.id in node.registry.deleting:  # deleted while it waited for a slot
        _unreserve_slot(node, session)
        raise Refused("session_not_found", f"no session {session.id!r}")
    try:
        turn = busy.submit(session, op.message, op.if_busy, op.rewind_to, op.trace)
    except Refused:
        _unreserve_slot(node, session)
        raise
    if isinstance(turn, ops.TurnTaken):  # queued, or steered: durable with the record
        await node.durable_or_503()
        taken = turn
    else:
        if op.trace:
            turn.trace = op.trace  # before its task starts it (no checkpoint since submit_turn)
        await session.accepted(turn)
        taken = ops.TurnTaken(turn.id)
    if not node.placement.runs_here(session.id):
        # The store fenced its writes: another node took the lease meanwhile, and
        # nothing of this turn was stored (docs/scale-out.md "Fenced at the store").
        raise changing_nodes(session.id)
    return taken


async def _process_slot(node: NodeCore, session: Session) -> None:
    """A ``claude-code`` session's turn holds a process slot before it is accepted.

    ``max_processes`` of its agent (:mod:`gateway.tools.process_slots`): an idle
    process may be stopped to make room; after ``[tools] process_slot_wait_s``,
    ``over_capacity``. A session whose turn is in flight is refused
    ``turn_in_progress`` without waiting.
    """
    agent = node.agents[session.record.agent]
    if agent.runtime != "claude-code" or session.turn is not None:
        return
    limit, slots = agent.max_processes, node.process_slots
    if not await slots.acquire(agent.name, limit, session.id, slots.wait_s):
        raise slots.over_capacity(agent.name, limit)


def _unreserve_slot(node: NodeCore, session: Session) -> None:
    """A slot held for a turn that was refused, and for no process: free it."""
    agent = node.agents[session.record.agent]
    runtime = session.agent.runtime if session.agent is not None else None
    if session.turn is None and (runtime is None or runtime.client is None):
        node.process_slots.release(agent.name, session.id)


def changing_nodes(session_id: str) -> Refused:
    """The session's lease is changing hands at this moment: the caller retries."""
    return Refused(
        "session_owner_unreachable",
        f"session {session_id} is changing nodes; retry in 1 s",
        retry_after_s=1,
    )

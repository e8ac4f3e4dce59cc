"""What a tool may do with its session: ask the user, delegate to a worker, book its cost.

The session side of gateway.tools.registry.ToolSession: an MCP server's
elicitation is a ``permission.requested`` (docs/protocol.md §11), a
``delegate`` call makes a worker session within the limits of PROTOCOL
section 15.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

import trio

from gateway.errors import ApiError, Refused, ToolError
from gateway.ids import now_ms
from gateway.protocol.events import PermissionRequested, PermissionResolved
from gateway.session.core import SessionCore

if TYPE_CHECKING:
    from gateway.tools.registry import ToolContext

Worker = TypeVar("Worker")
"""The session :func:`spawn_worker` makes (a :class:`gateway.session.session.Session`)."""


async def elicit(
    session: SessionCore, ctx: ToolContext, message: str, requested_schema: dict[str, Any]
) -> tuple[str, dict[str, Any] | None]:
    """An MCP server's question, as a ``permission.requested`` (``kind: "elicitation"``).

    docs/protocol.md §11: waited on within ``approval_timeout_s``; ``allow``
    comes with the user's content (checked against ``requested_schema`` by
    the permissions route), ``deny`` declines; the timeout and a cancel
    (the turn's, or the server's call ending) cancel it.
    """
    timeout = session.node.config.tools.approval_timeout_s
    expires_at = now_ms() + round(timeout * 1000)
    tool_name = ctx.tool_name or "mcp"
    request = session.permissions.open(
        ctx.tool_use_id, tool_name, {}, expires_at,
        kind="elicitation", message=message, requested_schema=requested_schema,
    )  # fmt: skip
    session.emit(
        [
            PermissionRequested(
                request.perm_id,
                ctx.tool_use_id,
                tool_name,
                {},
                expires_at,
                "elicitation",
                message,
                requested_schema,
            )
        ],
        ctx.turn_id,
    )
    decision = "cancelled"
    try:
        with trio.move_on_after(timeout):
            await request.decided.wait()
        decision = request.decision or "timeout"
    finally:
        request.closed = True
        request.decision = decision
        session.emit([PermissionResolved(request.perm_id, decision)], ctx.turn_id)  # type: ignore[arg-type]
    return decision, request.content if decision == "allow" else None


async def spawn_worker(session: SessionCore, create: Callable[[], Awaitable[Worker]]) -> Worker:
    """Create and start a worker session of this one (the ``delegate`` tool) with ``create``.

    Within the limits of docs/protocol.md §15: not from a session at
    ``max_delegate_depth``, at most ``max_workers_per_turn`` of the turn in
    flight, and the worker's session and its turn count against its
    owner's ``max_sessions_per_key`` and ``turns_per_minute_per_key`` (the
    same counts as a client's, so a turn cannot make sessions and turns its
    key could not). Each check counts in the step that makes it, so
    concurrent ``delegate`` calls of one batch cannot all take the last slot.

    ``create`` makes it (the node's ``create_session``, with ``session`` as
    its parent) once the limits allow it: the session passes it in, so that
    this module needs to know no more of the session than :class:`SessionCore`.

    Raises:
        ToolError: ``limit``, naming the limit; nothing was created or counted.
    """
    config = session.node.config.limits
    max_depth = config.max_delegate_depth
    if max_depth and session.depth >= max_depth:
        raise ToolError(
            "limit",
            f"delegate refused: this session is a worker {session.depth} deep, the"
            f" max_delegate_depth is {max_depth}",
        )
    turn = session.turn
    max_workers = config.max_workers_per_turn
    if turn is not None and max_workers and turn.workers >= max_workers:
        raise ToolError(
            "limit",
            f"delegate refused: this turn started its max_workers_per_turn ({max_workers}) workers",
        )
    limits, owner = session.node.limits, session.record.owner
    if turn is not None:
        turn.workers += 1  # held while the key's turns are counted (on Redis, a wait)
    try:
        counted = await limits.count_turn(owner)
    except BaseException as exc:
        if turn is not None:
            turn.workers -= 1
        if isinstance(exc, ApiError):  # the key's limits answer as HTTP (gateway.tenancy)
            raise ToolError("limit", f"delegate refused: {exc} (workers' turns count)") from None
        if isinstance(exc, Refused):  # store_unavailable: the shared count was not read
            raise ToolError("error", f"delegate refused: {exc}") from None
        raise
    try:
        return await create()
    except ApiError as exc:
        if exc.code != "too_many_sessions":
            raise  # it may have been created: it stays counted
        await limits.refund_turn(owner, counted)  # refused before anything was made
        if turn is not None:
            turn.workers -= 1
        raise ToolError("limit", f"delegate refused: {exc} (workers' sessions count)") from None


def book_worker_cost(session: SessionCore, turn_id: str, cost_usd: float) -> None:
    """Add what a delegated worker's turn spent to the turn that delegated it.

    docs/protocol.md §5: ``turn.completed.cost_usd`` includes the turn's
    workers (``workers_cost_usd``), and so does ``cost_so_far_usd``; a
    worker's own workers are in its cost already, so it rolls up level by
    level. A turn that has ended meanwhile is not charged twice.
    """
    turn = session.turn
    if turn is not None and turn.id == turn_id and turn.in_flight:
        turn.workers_cost_usd += cost_usd

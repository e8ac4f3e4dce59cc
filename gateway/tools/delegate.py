"""The ``delegate`` tool: a task run as one turn of a new worker session (docs/reference.md).

The worker is a session like any other (``parent_session_id`` set): its own
nursery, its own agent loop, its own stream that can be attached directly, and
its events also reach the parent's subscribers that ask for
``include_worker_sessions`` (docs/protocol.md §5). The parent emits
``delegate.started``, then ``delegate.completed`` or ``delegate.failed``.

Limits (docs/protocol.md §15, :meth:`gateway.session.session.Session.spawn_worker`):
no worker from a session at ``max_delegate_depth``, at most
``max_workers_per_turn`` per turn of the parent, and the worker's session and
turn count against the owner's ``max_sessions_per_key`` and
``turns_per_minute_per_key``. Beyond, the tool fails with ``limit`` before
anything happens: no session, no ``delegate.*`` event.

What the worker's turn spent (its own workers' included) is added to the
parent's turn: its ``turn.completed`` has it in ``cost_usd`` and in
``workers_cost_usd``, and the parent's ``cost_so_far_usd`` counts it
(docs/protocol.md §5).

Cancelling the parent's turn cancels the worker's turn first, which emits its
own cancellation sequence in the worker's stream; then the parent emits
``delegate.failed`` (``cancelled_by_user``), and the tool's ``tool.failed``
and ``turn.cancelled`` follow (docs/protocol.md §8, last row).
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
import trio

from gateway.errors import ToolError
from gateway.ids import new_message_id, new_turn_id, now_ms
from gateway.protocol.events import DelegateCompleted, DelegateFailed, DelegateStarted
from gateway.protocol.shapes import Message, TextBlock
from gateway.tools.registry import FunctionTool, ToolContext, ToolOutput


class DelegateInput(msgspec.Struct, forbid_unknown_fields=True):
    task: Annotated[str, msgspec.Meta(min_length=1)]


async def _delegate(args: DelegateInput, ctx: ToolContext) -> ToolOutput:
    parent = ctx.session
    if parent is None:
        raise ToolError("error", "delegate needs a session to run in")
    worker = await parent.spawn_worker(ctx.tool_use_id)
    turn_id = new_turn_id()
    task = Message(
        new_message_id(), worker.id, turn_id, "user", [TextBlock(args.task)], "complete", now_ms()
    )
    parent.emit([DelegateStarted(ctx.tool_use_id, worker.id, args.task)], ctx.turn_id)
    turn = worker.submit_turn(task)
    try:
        await turn.done.wait()
    except trio.Cancelled:
        # The worker's turn is cancelled the same way, in the worker's stream,
        # before the parent says so.
        with trio.CancelScope(shield=True):
            turn.request_cancel("parent_cancelled")
            with trio.move_on_after(parent.cancel_grace_s):
                await turn.done.wait()
        parent.book_worker_cost(ctx.turn_id, turn.cost_usd)  # spent, cancelled or not
        parent.emit(
            [
                DelegateFailed(
                    ctx.tool_use_id, worker.id, "cancelled_by_user", "the parent turn was cancelled"
                )
            ],
            ctx.turn_id,
        )
        raise
    parent.book_worker_cost(ctx.turn_id, turn.cost_usd)
    if turn.outcome in ("end_turn", "max_tokens", "stop_sequence"):
        parent.emit([DelegateCompleted(ctx.tool_use_id, worker.id, turn.final_text)], ctx.turn_id)
        return ToolOutput(turn.final_text, {"worker_session_id": worker.id})
    mode: Literal["timeout", "error"] = "timeout" if turn.cancel_reason == "timeout" else "error"
    message = f"the worker's turn ended with {turn.outcome}"
    parent.emit([DelegateFailed(ctx.tool_use_id, worker.id, mode, message)], ctx.turn_id)
    raise ToolError("timeout" if mode == "timeout" else "error", message)


DELEGATE = FunctionTool(
    "delegate",
    "Run a task as one turn of a new worker session and return its final text.",
    DelegateInput,
    _delegate,
)

"""How a turn ends early: the three cancel sequences, and the crash sequence (PROTOCOL section 8).

A cancel takes one path whatever asked for it (a ``cancel`` frame, the HTTP
route, ``turn_timeout_s``, shutdown, a parent's cancel): :meth:`Turn.request_cancel
<gateway.session.turn.Turn.request_cancel>` cancels the turn's scope, the agent
loop's ``finally`` calls :func:`cancel_sequence`, and the turn's phase
(:mod:`gateway.session.turn`) decides what it emits:

==========  =================================================================
phase       sequence (then ``turn.cancelled`` with ``phase`` and ``partial``)
==========  =================================================================
``llm``     the call is settled with :class:`~gateway.session.call.CancelCall`:
            the translator closes the open blocks and emits
            ``message.complete`` (``cancelled``); then ``llm.call_failed``
            (``cancelled``). A turn cancelled before its first call
            (``starting``) takes this row, with no message.
``seam``    each tool that has not entered execution: ``tool.failed``
            (``cancelled``). A call that finished just as the cancel landed
            is completed first (``llm.call_completed``): that is the seam.
``tools``   each tool, running or not yet started, emits ``tool.failed``
            (``cancelled``) from its own task as the batch's nursery is
            cancelled (a ``delegate`` cancels its worker's turn first).
==========  =================================================================

Every sequence is synchronous: emitted in one step, with nothing to shield.

A gateway bug in a turn (:func:`crash_sequence`) closes it as a provider
error would: ``message.complete`` and ``llm.call_failed`` if a call was
streaming, ``tool.failed`` for each pending tool, ``turn.completed`` with
``stop_reason: error``.

After a crash of the whole process, :mod:`gateway.session.recovery` closes
the turns left in flight with the same sequences and ``reason: "server_restart"``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gateway.protocol.events import LlmCallCompleted, TurnCancelled
from gateway.protocol.shapes import ToolUseBlock, Usage
from gateway.session.call import CancelCall
from gateway.session.turn import Turn

if TYPE_CHECKING:
    from gateway.session.agent import AgentLoop, TurnState


def cancel_sequence(loop: AgentLoop, turn: Turn, state: TurnState) -> None:
    """Emit the one sequence of PROTOCOL section 8 that the phase calls for."""
    s = loop.s
    phase = turn.phase
    if phase in ("starting", "llm"):
        call = state.call
        if call is not None and not call.done.is_set():
            s.calls.settle(CancelCall())
        if call is not None and call.error_class is None and phase == "llm":
            # The call finished just as the cancel landed: that is the seam.
            message = call.translator.message
            assert message is not None and call.translator.stop_reason is not None
            s.emit(
                [
                    LlmCallCompleted(
                        state.call_id,
                        message.id,
                        call.translator.stop_reason,
                        message.usage or Usage(),
                    )
                ],
                turn.id,
            )
            turn.enter("seam")
            tool_uses = [b for b in message.content if isinstance(b, ToolUseBlock)]
            state.pending_tools = tool_uses if call.translator.stop_reason == "tool_use" else []
            phase = "seam"
        elif call is not None:
            loop.call_failed(turn, state, call)
    # Tools that never got a task of their own (the cancel landed at the
    # seam, before the batch started) are failed here; the others already
    # failed from their own tasks.
    for block in list(state.pending_tools):
        loop.tool_failed(turn, state, block, "cancelled", "cancelled")
    partial = any(m.role == "assistant" and m.turn_id == turn.id for m in s.messages)
    sequence_phase = "llm" if phase == "starting" else phase
    loop.close_turn(turn, state, "cancelled")
    s.emit(
        [TurnCancelled(turn.id, turn.cancel_reason or "cancelled", sequence_phase, partial)],  # type: ignore[arg-type]
        turn.id,
    )
    state.ended = True


def crash_sequence(loop: AgentLoop, turn: Turn, state: TurnState) -> None:
    """Close a turn that a gateway bug broke, as a provider error would (module docstring).

    Each step is attempted on its own: whatever else fails, the turn ends
    with ``turn.completed`` (``error``) and the session is free again.
    """
    s = loop.s
    call = state.call
    try:
        if call is not None and not call.done.is_set():
            s.calls.break_call(call, RuntimeError("the turn failed"))
        if call is not None and turn.phase == "llm":
            loop.call_failed(turn, state, call)
        for block in list(state.pending_tools):
            loop.tool_failed(turn, state, block, "error", "the turn failed before it ran")
    except Exception as exc:
        s.failed("agent-loop", exc, turn.id)
    finally:
        if s.calls.current is call:
            s.calls.current = None
        loop.finish(turn, state, "error")

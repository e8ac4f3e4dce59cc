"""Ending a turn in a live session: releasing it, and closing it early as :mod:`closing` says.

Whatever ends a turn, exactly one of ``turn.completed`` or ``turn.cancelled``
closes it, and the turn lock is released in the same step
(:meth:`TurnEnding.close_turn`: the cost booked, the record cleared, one log
line and the turn metrics).

A turn that ends early (a cancel, its timeout, shutdown, a parent's cancel, a
gateway bug, a failed LLM call) is closed by :meth:`TurnEnding.close`: the
call still streaming is settled first (a cancel's ``message.complete`` comes
from its translator, docs/protocol.md §8 row 1), then the facts the turn left
are handed to :func:`gateway.session.closing.sequence`, and its events are
emitted here, each tool's with its result recorded in the conversation. Every
sequence is synchronous: emitted in one step, with nothing to shield.
"""

from __future__ import annotations

import logging
from typing import get_args

import trio

from gateway import telemetry
from gateway.logs import event
from gateway.protocol.events import LlmCallCompleted, Payload, ToolFailed, TurnCancelled
from gateway.protocol.shapes import StopReason, TextBlock, ToolUseBlock, Usage
from gateway.session import closing
from gateway.session.call import Call, CancelCall
from gateway.session.loop_api import AgentServices, TurnHost
from gateway.session.tool_round import fail_tool
from gateway.session.turn import Turn, TurnState

log = logging.getLogger("gateway.agent")

_TURN_OUTCOMES = frozenset(get_args(StopReason))


class TurnEnding:
    """Ends the turns of one session (module docstring)."""

    def __init__(self, session: TurnHost, node: AgentServices) -> None:
        self.session = session
        self.node = node

    def close(self, turn: Turn, state: TurnState, why: closing.Why) -> None:
        """Close a turn in flight with the sequence :func:`closing.sequence` gives.

        A crash is closed step by step, each attempted on its own: whatever
        else fails, the turn ends with ``turn.completed`` (``error``) and the
        session is free again.
        """
        if why == "crash":
            self._crash(turn, state)
            return
        call = state.call
        streaming = call is not None and not call.done.is_set()
        if why == "cancel" and turn.phase in ("starting", "llm") and streaming:
            self.session.calls.settle(CancelCall())
        plan = closing.sequence(self.facts(turn, state, why))
        self._steps(turn, state, plan.steps)
        terminal = plan.terminal
        if isinstance(terminal, TurnCancelled):
            self.close_turn(turn, state, "cancelled")
            self.session.emit([terminal], turn.id)
            state.ended = True
        else:
            self.finish(turn, state, terminal.stop_reason)

    def _crash(self, turn: Turn, state: TurnState) -> None:
        s = self.session
        call = state.call
        try:
            if call is not None and not call.done.is_set():
                s.calls.break_call(call, RuntimeError("the turn failed"))
            self._steps(turn, state, closing.sequence(self.facts(turn, state, "crash")).steps)
        except Exception as exc:
            s.failed("agent-loop", exc, turn.id)
        finally:
            if s.calls.current is call:
                s.calls.current = None
            self.finish(turn, state, "error")  # the sequence's turn.completed

    def facts(self, turn: Turn, state: TurnState, why: closing.Why) -> closing.Facts:
        """What the turn left open, as the call stream and the turn's state say."""
        call = state.call
        call_facts = _call_facts(state, call) if call is not None else None
        s = self.session
        return closing.Facts(
            turn.id,
            turn.phase,
            why,
            turn.cancel_reason or "cancelled",
            call_facts,
            tuple((b.id, b.name) for b in state.pending_tools),
            partial=any(m.role == "assistant" and m.turn_id == turn.id for m in s.messages),
            usage=state.usage,
            workers_cost_usd=turn.workers_cost_usd,
        )

    def _steps(self, turn: Turn, state: TurnState, steps: list[Payload]) -> None:
        """Emit the events before the terminal one, a tool's with its result recorded."""
        s = self.session
        blocks = {b.id: b for b in state.pending_tools}
        for payload in steps:
            if isinstance(payload, ToolFailed):
                block = blocks.get(payload.tool_use_id) or _tool_use(state, payload.tool_use_id)
                fail_tool(s, turn, state, block, payload.error_class, payload.message)
                continue
            s.emit([payload], turn.id)
            if isinstance(payload, LlmCallCompleted) and turn.phase == "llm":
                turn.enter("seam")  # the call completed just as the cancel landed

    def call_failed(self, turn: Turn, state: TurnState, call: Call) -> None:
        """``llm.call_failed`` for ``call``, as it failed."""
        self.session.emit([closing.call_failed(_call_facts(state, call))], turn.id)

    def finish(self, turn: Turn, state: TurnState, stop_reason: StopReason) -> None:
        """End the turn with ``turn.completed``."""
        self.close_turn(turn, state, stop_reason)
        self.emit_terminal(turn, state, stop_reason)

    def emit_terminal(self, turn: Turn, state: TurnState, stop_reason: StopReason) -> None:
        terminal = closing.completed(turn.id, stop_reason, state.usage, turn.workers_cost_usd)
        self.session.emit([terminal], turn.id)
        state.ended = True

    def close_turn(self, turn: Turn, state: TurnState, outcome: str) -> None:
        """Release the turn lock and book the cost, in the step that ends the turn."""
        s = self.session
        last = s.messages[-1] if s.messages else None
        final_text = ""
        if last is not None and last.role == "assistant" and last.turn_id == turn.id:
            final_text = "".join(b.text for b in last.content if isinstance(b, TextBlock))
        phase = turn.phase
        # Before done: a parent's delegate reads it.
        turn.cost_usd = closing.turn_cost(state.usage, turn.workers_cost_usd)
        turn.finish(outcome, final_text)
        s.record.cost_so_far_usd += turn.cost_usd
        s.record.current_turn_id, s.record.current_turn_seq = None, 0
        s.save_record()
        s.end_turn(turn)
        self._turn_ended(turn, state, outcome, phase)  # after the lock is free, whatever it does

    def _turn_ended(self, turn: Turn, state: TurnState, outcome: str, phase: str) -> None:
        """One line and the turn metrics, in the step that ends the turn."""
        seconds = trio.current_time() - state.started_at
        label = outcome if outcome in _TURN_OUTCOMES else "other"
        metrics = self.node.metrics
        metrics.turns.labels(label).inc()
        metrics.turn_duration.labels(label).observe(seconds)
        ms = round(seconds * 1000)
        cancelled = outcome == "cancelled"
        call = state.call
        why = turn.cancel_reason if cancelled else call.error_message if call else None
        usage = state.usage
        telemetry.turn_ended(turn.id, outcome, why, usage.input_tokens, usage.output_tokens)
        event(
            log, logging.INFO, "turn_ended",
            f"turn {turn.id} {'cancelled' if cancelled else 'ended'}: {outcome} after {ms} ms",
            session_id=self.session.id, turn_id=turn.id, duration_ms=ms, stop_reason=outcome,
            reason=turn.cancel_reason if cancelled else None, phase=phase if cancelled else None,
            input_tokens=state.usage.input_tokens, output_tokens=state.usage.output_tokens,
        )  # fmt: skip


def _call_facts(state: TurnState, call: Call) -> closing.CallFacts:
    """What :func:`closing.sequence` needs of a settled call."""
    tr = call.translator
    message = tr.message
    uses = [b for b in message.content if isinstance(b, ToolUseBlock)] if message else []
    return closing.CallFacts(
        state.call_id,
        message.id if message else None,
        call.error_class,
        call.error_message,
        tr.stop_reason,
        (message.usage if message else None) or Usage(),
        tuple((b.id, b.name) for b in uses),
        state.call_failed_emitted,
    )


def _tool_use(state: TurnState, tool_use_id: str) -> ToolUseBlock:
    """A tool use of the turn's call (the call completed just as the cancel landed)."""
    message = state.call.translator.message if state.call is not None else None
    assert message is not None
    return next(b for b in message.content if isinstance(b, ToolUseBlock) and b.id == tool_use_id)

"""How the calls of a Claude Code turn end: each before the turn does.

docs/protocol.md §7 (every ``llm.call_started`` has its ``llm.call_completed``
or ``llm.call_failed`` before ``turn.completed``) and §11 ("Stream", "When a
turn ends"): a call the gateway could not translate, or that ended with no
stop reason, fails once, at its end or at the latest at the turn's result; a
call still streaming when the turn would end fails ``network``; a failure
with no call open is one ``llm.call_started`` and ``llm.call_failed``.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Protocol

from gateway.ids import new_call_id
from gateway.logs import event
from gateway.protocol.events import LlmCallFailed, LlmCallStarted, error_label
from gateway.protocol.shapes import StopReason
from gateway.runtimes.claude_code.owner import Owner
from gateway.session.call import EndCall
from gateway.session.turn import Turn

if TYPE_CHECKING:
    from gateway.session.turn import TurnState

log = logging.getLogger("gateway.claude_code")


class Ending(Owner, Protocol):
    """The runtime whose turn's calls end here, as its parts see it (:class:`Owner`),
    and its turn's end on a failure."""

    def _failed(
        self, turn: Turn, state: TurnState, error_class: str, message: str
    ) -> StopReason: ...
    def _close_pending(self, turn: Turn, state: TurnState, reason: StopReason) -> StopReason: ...


def streaming(state: TurnState) -> bool:
    """Whether a call of the turn has started and not ended."""
    return state.call is not None and not state.call.done.is_set()


def broken(rt: Ending, turn: Turn, state: TurnState) -> None:
    """The ``llm.call_failed`` of the turn's call if it ended failed and it has not
    gone out yet (the gateway could not translate its stream, or it had no stop
    reason)."""
    call = state.call
    if call is None or not call.done.is_set() or call.error_class is None:
        return
    if not state.call_failed_emitted:
        rt.loop.call_failed(turn, state, call)
        state.call_failed_emitted = True


def end_open_call(rt: Ending, turn: Turn, state: TurnState, stop: StopReason) -> StopReason:
    """The turn ends at ``stop``, unless one of its calls still streams: Claude Code
    ended its answer with no ``message_stop``, so that call fails (``network``) and
    the turn ends as a failed call's does (``error``)."""
    if not streaming(state):
        return stop
    return rt._failed(turn, state, "network", "Claude Code's answer ended mid-message")


def failed(rt: Ending, turn: Turn, state: TurnState, error_class: str, message: str) -> StopReason:
    """A failed call: the one streaming is closed, one that failed as it streamed gets
    its own failure (once), else one is started and failed."""
    s = rt.session
    call = state.call
    if call is not None and not call.done.is_set():
        s.calls.settle(EndCall(error_class, message))
        rt.loop.call_failed(turn, state, call)
    elif call is not None and call.error_class is not None:
        broken(rt, turn, state)
    else:
        state.call = None
        state.call_id = new_call_id()
        s.emit(
            [
                LlmCallStarted(state.call_id, s.record.active_model),
                LlmCallFailed(state.call_id, error_class, message),  # type: ignore[arg-type]
            ],
            turn.id,
        )
    state.call_failed_emitted = True
    rt.approvals.end(turn)  # the CLI went away asking: cancelled, before the tool fails
    rt.node.metrics.provider_errors.labels(error_label(error_class)).inc()
    event(
        log, logging.WARNING, "provider_error",
        f"turn {turn.id}: Claude Code's call failed: {error_class}: {message}",
        session_id=s.id, turn_id=turn.id, code=error_class, error=message,
        model=s.record.active_model,
    )  # fmt: skip
    rt._close_pending(turn, state, "error")
    return "error"

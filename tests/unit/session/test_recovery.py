"""Where an interrupted turn stood, from what was durable (gateway/session/recovery.py), sans-IO.

docs/protocol.md §9: a restart closes each turn left in flight with the
sequence of section 8 for the phase it was in, ``reason: "server_restart"``.
These tests feed :func:`plan` the stored events of one turn and check the
phase it infers and the closing events :func:`closing` produces.
"""

from __future__ import annotations

from typing import Any

from gateway.protocol.events import (
    DelegateStarted,
    LlmCallCompleted,
    LlmCallStarted,
    PermissionRequested,
    PermissionResolved,
    ToolCalled,
    ToolCompleted,
    ToolFailed,
)
from gateway.protocol.shapes import Message, TextBlock, ToolUseBlock, Usage
from gateway.session.recovery import closing, plan

TURN = "turn_1"


def msg(mid: str, status: str = "complete", content: list[Any] | None = None) -> Message:
    return Message(mid, "sess_1", TURN, "assistant", content or [], status, 1000)  # type: ignore[arg-type]


def ev(payload: Any) -> tuple[str, Any]:
    from gateway.protocol.events import PAYLOAD_TYPE

    return PAYLOAD_TYPE[type(payload)], payload


def summary(events: list[tuple[str, Any]], messages: list[Message]) -> list[tuple[str, Any]]:
    state = plan(TURN, events, messages)
    out = []
    for p in closing(state):
        type_ = ev(p)[0]
        detail = getattr(p, "error_class", None) or getattr(p, "phase", None)
        out.append((type_, detail))
    return out


def test_a_call_still_streaming_is_the_llm_phase_with_its_stored_message() -> None:
    streaming = msg("msg_a", "in_progress", [TextBlock("half a")])
    state = plan(TURN, [ev(LlmCallStarted("call_1", "m"))], [streaming])
    assert (state.phase, state.call_id, state.message, state.partial) == (
        "llm",
        "call_1",
        streaming,
        True,
    )
    assert summary([ev(LlmCallStarted("call_1", "m"))], [streaming]) == [
        ("llm.call_failed", "cancelled"),
        ("turn.cancelled", "llm"),
    ]


def test_a_call_killed_before_its_message_started_has_no_message() -> None:
    state = plan(TURN, [ev(LlmCallStarted("call_1", "m"))], [])
    assert (state.phase, state.message, state.partial) == ("llm", None, False)
    [failed, _] = closing(state)
    assert failed.message_id is None  # type: ignore[attr-defined]


def test_tools_asked_for_but_not_yet_called_are_the_seam() -> None:
    uses = [ToolUseBlock("tu_1", "sleep", {}), ToolUseBlock("tu_2", "read_file", {})]
    events = [
        ev(LlmCallStarted("call_1", "m")),
        ev(LlmCallCompleted("call_1", "msg_a", "tool_use", Usage())),
    ]
    state = plan(TURN, events, [msg("msg_a", content=uses)])
    assert state.phase == "seam"
    assert state.pending_tools == [("tu_1", "sleep"), ("tu_2", "read_file")]
    assert summary(events, [msg("msg_a", content=uses)]) == [
        ("tool.failed", "cancelled"),
        ("tool.failed", "cancelled"),
        ("turn.cancelled", "seam"),
    ]


def test_a_tool_waiting_for_permission_is_the_seam() -> None:
    events = [
        ev(LlmCallStarted("call_1", "m")),
        ev(LlmCallCompleted("call_1", "msg_a", "tool_use", Usage())),
        ev(ToolCalled("tu_1", "sleep", {})),
        ev(PermissionRequested("perm_1", "tu_1", "sleep", {}, 0)),
    ]
    state = plan(TURN, events, [])
    assert (state.phase, state.pending_tools) == ("seam", [("tu_1", "sleep")])


def test_a_running_tool_is_the_tools_phase_and_finished_ones_are_left_alone() -> None:
    events = [
        ev(LlmCallStarted("call_1", "m")),
        ev(LlmCallCompleted("call_1", "msg_a", "tool_use", Usage())),
        ev(ToolCalled("tu_1", "sleep", {})),
        ev(ToolCalled("tu_2", "sleep", {})),
        ev(ToolCalled("tu_3", "sleep", {})),
        ev(PermissionRequested("perm_1", "tu_2", "sleep", {}, 0)),
        ev(PermissionResolved("perm_1", "allow")),  # so tu_2 runs too
        ev(ToolCompleted("tu_1", "sleep", "slept", 5)),
        ev(ToolFailed("tu_3", "sleep", "invalid_input", "bad")),
    ]
    state = plan(TURN, events, [])
    assert (state.phase, state.pending_tools) == ("tools", [("tu_2", "sleep")])


def test_a_running_delegate_fails_before_its_tool() -> None:
    events = [
        ev(LlmCallStarted("call_1", "m")),
        ev(LlmCallCompleted("call_1", "msg_a", "tool_use", Usage())),
        ev(ToolCalled("tu_1", "delegate", {"task": "x"})),
        ev(DelegateStarted("tu_1", "sess_w", "x")),
    ]
    assert summary(events, []) == [
        ("delegate.failed", None),
        ("tool.failed", "cancelled"),
        ("turn.cancelled", "tools"),
    ]
    [failed, *_] = closing(plan(TURN, events, []))
    assert failed.failure_mode == "cancelled_by_user"  # type: ignore[attr-defined]


def test_between_a_finished_call_and_the_turns_end_is_the_seam() -> None:
    events = [
        ev(LlmCallStarted("call_1", "m")),
        ev(LlmCallCompleted("call_1", "msg_a", "end_turn", Usage())),
    ]
    done = msg("msg_a", content=[TextBlock("all done")])
    state = plan(TURN, events, [done])
    assert (state.phase, state.pending_tools, state.partial) == ("seam", [], True)
    [cancelled] = closing(state)
    assert (cancelled.reason, cancelled.phase) == ("server_restart", "seam")  # type: ignore[attr-defined]


def test_a_later_call_resets_what_an_earlier_round_left() -> None:
    events = [
        ev(LlmCallStarted("call_1", "m")),
        ev(LlmCallCompleted("call_1", "msg_a", "tool_use", Usage())),
        ev(ToolCalled("tu_1", "sleep", {})),
        ev(ToolCompleted("tu_1", "sleep", "slept", 5)),
        ev(LlmCallStarted("call_2", "m")),
    ]
    state = plan(TURN, events, [msg("msg_b", "in_progress")])
    assert (state.phase, state.call_id, state.pending_tools) == ("llm", "call_2", [])

"""The soak's turns: scripted-model scripts, what to do during each, what must follow.

Each :class:`Scenario` is one turn of the scripted model (docs/reference.md "The
scripted model"), an optional action taken when a given event of the turn
arrives (a cancel over HTTP or as a ``cancel`` frame, or the approval of a
permission), and the end the contract promises for it: docs/protocol.md §7 for
a turn that runs to its end (a failing tool is an event, the turn goes on to
the next model round), section 8 for a cancelled one, in each phase:

- ``llm``: cancelled on its first ``text.delta`` of a long stream;
- ``tools``: cancelled on ``tool.called`` of a 30-second ``sleep``;
- ``seam``: cancelled on ``permission.requested`` of a ``read_file`` that
  waits for approval (the soak's gateway requires approval for it).

:func:`judge` compares the events of a finished turn with the expectation and
returns what differs (sans-IO, as the events came).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from gateway.protocol.events import Event, ToolFailed, TurnCancelled, TurnCompleted

Action = Literal["cancel_http", "cancel_frame", "approve"]

_CANCELS: tuple[Action, ...] = ("cancel_http", "cancel_frame")

NOTES_FILE = "notes.txt"  # in every soak session's workspace, for read_file


@dataclass(frozen=True)
class Scenario:
    """One kind of turn (module docstring)."""

    name: str
    rounds: list[list[dict[str, Any]]]
    delay_ms: float = 0.0
    fail: dict[str, Any] | None = None
    trigger: str | None = None  # the event type of this turn that fires ``action``
    action: Action | None = None
    end: Literal["turn.completed", "turn.cancelled"] = "turn.completed"
    stop_reason: str | None = "end_turn"  # of turn.completed
    phase: str | None = None  # of turn.cancelled
    tool_failures: tuple[str, ...] = ()  # error classes of the tool.failed events, in order
    tools_completed: int = 0

    def content(self) -> str:
        """The user message: the script as JSON (docs/reference.md "The scripted model")."""
        script: dict[str, Any] = {"rounds": self.rounds}
        if self.delay_ms:
            script["delay_ms"] = self.delay_ms
        if self.fail is not None:
            script["fail"] = self.fail
        return json.dumps({"script": script})


def _tool(name: str, tool_input: dict[str, Any]) -> dict[str, Any]:
    return {"tool_use": {"name": name, "input": tool_input}}


_THINK = {"thinking": "Let me check that."}
_SAY = {"text": "Running it now."}
_DONE = [{"text": "All done."}]


def _cancel_llm(action: Action) -> Scenario:
    return Scenario(
        f"cancel_llm_{action.removeprefix('cancel_')}",
        [[_THINK, {"lorem": 5000}]],
        delay_ms=20,
        trigger="text.delta",
        action=action,
        end="turn.cancelled",
        phase="llm",
    )


def _cancel_tools(action: Action) -> Scenario:
    return Scenario(
        f"cancel_tools_{action.removeprefix('cancel_')}",
        [[_SAY, _tool("sleep", {"seconds": 30})], _DONE],
        trigger="tool.called",
        action=action,
        end="turn.cancelled",
        phase="tools",
        tool_failures=("cancelled",),
    )


def _cancel_seam(action: Action) -> Scenario:
    return Scenario(
        f"cancel_seam_{action.removeprefix('cancel_')}",
        [[_SAY, _tool("read_file", {"path": NOTES_FILE})], _DONE],
        trigger="permission.requested",
        action=action,
        end="turn.cancelled",
        phase="seam",
        tool_failures=("cancelled",),
    )


def scenarios(lorem_words: int, lorem_delay_ms: float) -> dict[str, Scenario]:
    """Every scenario by name; ``lorem`` streams ``lorem_words`` at ``lorem_delay_ms``."""
    all_ = [
        Scenario(
            "tool_round",
            [[_THINK, _SAY, _tool("sleep", {"seconds": 0.05})], _DONE],
            delay_ms=2,
            tools_completed=1,
        ),
        Scenario("lorem", [[{"lorem": lorem_words}]], delay_ms=lorem_delay_ms),
        *(make(how) for make in (_cancel_llm, _cancel_tools, _cancel_seam) for how in _CANCELS),
        Scenario(
            "approved",
            [[_SAY, _tool("read_file", {"path": NOTES_FILE})], _DONE],
            trigger="permission.requested",
            action="approve",
            tools_completed=1,
        ),
        Scenario(
            "unknown_tool",
            [[_SAY, _tool("no_such_tool", {})], _DONE],
            tool_failures=("unknown_tool",),
        ),
        Scenario(
            "invalid_input",
            [[_SAY, _tool("sleep", {"seconds": "soon"})], _DONE],
            tool_failures=("invalid_input",),
        ),
        Scenario(
            "provider_error",
            [[{"lorem": 20}]],
            delay_ms=2,
            fail={"round": 0, "after_deltas": 3, "error_class": "overloaded"},
            stop_reason="error",
        ),
    ]
    return {s.name: s for s in all_}


# The order each session runs them in (each session starts at its own offset).
ROTATION = (
    "tool_round",
    "lorem",
    "cancel_llm_http",
    "unknown_tool",
    "cancel_tools_frame",
    "approved",
    "invalid_input",
    "cancel_seam_http",
    "lorem",
    "cancel_llm_frame",
    "provider_error",
    "cancel_tools_http",
    "tool_round",
    "cancel_seam_frame",
)


def judge(scenario: Scenario, events: list[Event]) -> list[str]:
    """What about this finished turn differs from the scenario's expectation (empty: ok).

    Args:
        events: the turn's events as one client received them, its end last.
    """
    problems: list[str] = []
    end = events[-1] if events else None
    if end is None or end.type != scenario.end:
        problems.append(f"ended with {end.type if end else 'nothing'}, expected {scenario.end}")
    elif isinstance(end.payload, TurnCompleted) and end.payload.stop_reason != scenario.stop_reason:
        problems.append(f"stop_reason {end.payload.stop_reason}, expected {scenario.stop_reason}")
    elif isinstance(end.payload, TurnCancelled) and end.payload.phase != scenario.phase:
        problems.append(f"cancelled in phase {end.payload.phase}, expected {scenario.phase}")
    failures = tuple(e.payload.error_class for e in events if isinstance(e.payload, ToolFailed))
    if failures != scenario.tool_failures:
        problems.append(f"tool failures {failures}, expected {scenario.tool_failures}")
    completed = sum(1 for e in events if e.type == "tool.completed")
    if completed != scenario.tools_completed:
        problems.append(f"{completed} tools completed, expected {scenario.tools_completed}")
    if scenario.end == "turn.completed" and scenario.tool_failures:
        rounds = sum(1 for e in events if e.type == "llm.call_started")
        if rounds < 2:
            problems.append("the turn did not go on to the next model round after the tool failed")
    return problems

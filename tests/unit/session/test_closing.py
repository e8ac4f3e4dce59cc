"""How a turn closes (gateway/session/closing.py), sans-IO: one table over phases and reasons.

docs/protocol.md §8's three cancellation sequences, section 9's close of a turn
a crash of the process left in flight, and section 7's close of a turn that a
gateway bug or a failed call ended: each row gives the facts a closing turn
left (its phase, what is open, why it closes) and the exact events
:func:`sequence` returns for them. The live loop and the crash recovery emit
these same lists (tests/integration/session/test_cancellation.py and
tests/unit/session/test_recovery.py see them on the wire).
"""

from __future__ import annotations

import pytest

from gateway.protocol.events import (
    DelegateFailed,
    LlmCallCompleted,
    LlmCallFailed,
    Payload,
    PermissionResolved,
    ToolFailed,
    TurnCancelled,
    TurnCompleted,
)
from gateway.protocol.shapes import Usage
from gateway.session.closing import (
    TOOL_NOT_RUN,
    CallFacts,
    Facts,
    Row,
    completed,
    sequence,
    why_closed,
)

T = "turn_1"
USAGE = Usage(10, 5, cost_usd=0.25)
STREAMED = CallFacts("call_1", "msg_1", "cancelled", "cancelled")  # settled by the cancel
UNSTARTED = CallFacts("call_1", None, "cancelled", "cancelled")  # no message.start yet
TOOLS = (("tu_1", "echo"), ("tu_2", "shell"))
ASKED = CallFacts("call_1", "msg_1", None, "", "tool_use", USAGE, TOOLS)  # completed as it landed
ANSWERED = CallFacts("call_1", "msg_1", None, "", "end_turn", USAGE)
BROKEN = CallFacts("call_1", "msg_1", "api_error", "the gateway failed to stream the call")
OVERLOADED = CallFacts("call_1", "msg_1", "overloaded", "try later")

Case = tuple[str, Facts, list[Payload], Row | None]

CASES: list[Case] = [
    # --- cancel: the llm row ---------------------------------------------------------------
    (
        "cancel before the first call (starting) takes the llm row, with no call",
        Facts(T, "starting", "cancel", "user"),
        [TurnCancelled(T, "user", "llm", False)],
        "llm",
    ),
    (
        "cancel mid-stream: llm.call_failed (cancelled) after the call's own message.complete",
        Facts(T, "llm", "cancel", "user", STREAMED, partial=True),
        [
            LlmCallFailed("call_1", "cancelled", "cancelled", "msg_1"),
            TurnCancelled(T, "user", "llm", True),
        ],
        "llm",
    ),
    (
        "cancel before the call's message began: no message id",
        Facts(T, "llm", "cancel", "timeout", UNSTARTED),
        [
            LlmCallFailed("call_1", "cancelled", "cancelled"),
            TurnCancelled(T, "timeout", "llm", False),
        ],
        "llm",
    ),
    (
        "cancel during a compaction's summary call: no call to close",
        Facts(T, "llm", "cancel", "shutdown"),
        [TurnCancelled(T, "shutdown", "llm", False)],
        "llm",
    ),
    # --- cancel: the seam row --------------------------------------------------------------
    (
        "the call completed as the cancel landed: completed, then its tool uses fail (seam)",
        Facts(T, "llm", "cancel", "user", ASKED, partial=True),
        [
            LlmCallCompleted("call_1", "msg_1", "tool_use", USAGE),
            ToolFailed("tu_1", "echo", "cancelled", "cancelled"),
            ToolFailed("tu_2", "shell", "cancelled", "cancelled"),
            TurnCancelled(T, "user", "seam", True),
        ],
        "seam",
    ),
    (
        "the call completed with no tool use as the cancel landed: the seam, nothing pending",
        Facts(T, "llm", "cancel", "user", ANSWERED, partial=True),
        [
            LlmCallCompleted("call_1", "msg_1", "end_turn", USAGE),
            TurnCancelled(T, "user", "seam", True),
        ],
        "seam",
    ),
    (
        "cancel at the seam: each tool that has not entered execution fails; the call is done",
        Facts(T, "seam", "cancel", "user", ASKED, TOOLS, partial=True),
        [
            ToolFailed("tu_1", "echo", "cancelled", "cancelled"),
            ToolFailed("tu_2", "shell", "cancelled", "cancelled"),
            TurnCancelled(T, "user", "seam", True),
        ],
        "seam",
    ),
    # --- cancel: the tools row -------------------------------------------------------------
    (
        "cancel while tools run: they failed from their own tasks, only turn.cancelled is left",
        Facts(T, "tools", "cancel", "parent_cancelled", partial=True),
        [TurnCancelled(T, "parent_cancelled", "tools", True)],
        "tools",
    ),
    # --- restart (docs/protocol.md §9) ------------------------------------------------------
    (
        "restart mid-stream: the call closes as a cancel leaves it",
        Facts(T, "llm", "restart", "server_restart", STREAMED, partial=True),
        [
            LlmCallFailed("call_1", "cancelled", "cancelled", "msg_1"),
            TurnCancelled(T, "server_restart", "llm", True),
        ],
        "llm",
    ),
    (
        "restart while tools run: open delegates, then each approval resolved before its tool",
        Facts(
            T,
            "tools",
            "restart",
            "server_restart",
            None,
            TOOLS,
            approvals={"tu_2": ("perm_1",)},
            delegates=(("tu_1", "sess_w"),),
        ),
        [
            DelegateFailed("tu_1", "sess_w", "cancelled_by_user", "the gateway restarted"),
            ToolFailed("tu_1", "echo", "cancelled", "cancelled"),
            PermissionResolved("perm_1", "cancelled"),
            ToolFailed("tu_2", "shell", "cancelled", "cancelled"),
            TurnCancelled(T, "server_restart", "tools", False),
        ],
        "tools",
    ),
    # --- crash (a gateway bug, docs/protocol.md §7) -----------------------------------------
    (
        "crash mid-stream: llm.call_failed as the broken call failed, turn.completed (error)",
        Facts(T, "llm", "crash", call=BROKEN, usage=USAGE),
        [
            LlmCallFailed("call_1", "api_error", "the gateway failed to stream the call", "msg_1"),
            TurnCompleted(T, "error", USAGE, 0.25),
        ],
        None,
    ),
    (
        "crash at the seam: each pending tool fails (error); the completed call stays completed",
        Facts(T, "seam", "crash", call=ASKED, pending_tools=TOOLS, usage=USAGE),
        [
            ToolFailed("tu_1", "echo", "error", TOOL_NOT_RUN),
            ToolFailed("tu_2", "shell", "error", TOOL_NOT_RUN),
            TurnCompleted(T, "error", USAGE, 0.25),
        ],
        None,
    ),
    (
        "crash before the first call: only turn.completed (error), its workers' cost in it",
        Facts(T, "starting", "crash", workers_cost_usd=1.5),
        [TurnCompleted(T, "error", Usage(), 1.5, 1.5)],
        None,
    ),
    # --- provider failure ------------------------------------------------------------------
    (
        "a failed call: llm.call_failed with its class, turn.completed (error)",
        Facts(T, "llm", "provider_error", call=OVERLOADED, usage=USAGE),
        [
            LlmCallFailed("call_1", "overloaded", "try later", "msg_1"),
            TurnCompleted(T, "error", USAGE, 0.25),
        ],
        None,
    ),
    (
        "a failed call whose llm.call_failed went out already (an overflow): only the end",
        Facts(T, "llm", "provider_error", call=CallFacts("call_1", reported=True)),
        [TurnCompleted(T, "error", Usage(), 0.0)],
        None,
    ),
]


@pytest.mark.parametrize(
    ("facts", "events", "row"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_each_closing_turn_emits_exactly_its_sequence(
    facts: Facts, events: list[Payload], row: Row | None
) -> None:
    closing = sequence(facts)
    assert closing.events == events
    assert closing.row == row
    assert closing.terminal == events[-1]
    assert closing.steps == events[:-1]


def test_every_phase_a_turn_closes_in_has_a_row() -> None:
    """A cancel in any phase but done ends with turn.cancelled, whatever else is open."""
    for phase in ("starting", "llm", "seam", "tools"):
        for call in (None, STREAMED, ASKED):
            closing = sequence(Facts(T, phase, "cancel", "user", call))  # type: ignore[arg-type]
            assert isinstance(closing.terminal, TurnCancelled), (phase, call)
            assert closing.row == closing.terminal.phase


@pytest.mark.parametrize(
    ("cancelled", "requested", "timed_out", "why"),
    [
        (True, "user", False, ("cancel", "user")),
        (True, "user", True, ("cancel", "user")),  # asked for before the deadline passed
        (True, None, True, ("cancel", "timeout")),  # turn_timeout_s
        (True, None, False, ("cancel", "shutdown")),  # an outer scope: the session stops
        (False, None, False, ("crash", "")),  # left in flight with nothing cancelled: a bug
    ],
)
def test_why_a_turn_left_in_flight_closes(
    cancelled: bool, requested: str | None, timed_out: bool, why: tuple[str, str]
) -> None:
    assert why_closed(cancelled=cancelled, requested=requested, timed_out=timed_out) == why


def test_turn_completed_costs_its_calls_and_its_workers() -> None:
    assert completed(T, "end_turn", USAGE, 0.5) == TurnCompleted(T, "end_turn", USAGE, 0.75, 0.5)
    assert completed(T, "end_turn", Usage(), 0.0).cost_usd == 0.0  # unpriced usage costs nothing

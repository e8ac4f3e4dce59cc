"""A turn and its phase: the one place that says where a turn is (docs/protocol.md sections 7, 8).

The phase decides which cancellation sequence a cancel produces:

========  ==========================================================  =====================
phase     meaning                                                     cancel emits
========  ==========================================================  =====================
starting  turn accepted; no LLM call has begun yet                    as ``llm`` (no message)
llm       an LLM call is streaming (first or a later call)            ``llm`` sequence
seam      the call completed; no tool has entered execution yet       ``seam`` sequence
          (a batch whose tools all failed before running goes on to ``llm``)
tools     tools are executing                                         ``tools`` sequence
done      ``turn.completed`` or ``turn.cancelled`` was emitted        nothing (finished)
========  ==========================================================  =====================

Moves follow :data:`TRANSITIONS`; anything else raises, loudly, because a turn
in an impossible phase would emit the wrong sequence. The sequences themselves
are decided in :mod:`gateway.session.closing`.

:class:`TurnState` is what the turn has done so far (its call, its pending
tools, its usage): the facts its ending is decided from.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import trio

from gateway.errors import Refused
from gateway.protocol.shapes import Message, ToolProgressInfo, ToolUseBlock, Usage
from gateway.session.call import Call

Phase = Literal["starting", "llm", "seam", "tools", "done"]

TRANSITIONS: dict[Phase, frozenset[Phase]] = {
    "starting": frozenset({"llm", "done"}),
    "llm": frozenset({"seam", "done"}),
    # seam -> llm: every tool of the batch failed before it ran (an unknown
    # tool, bad input, a denied permission); the next round sees the errors.
    "seam": frozenset({"tools", "llm", "done"}),
    "tools": frozenset({"llm", "done"}),
    "done": frozenset(),
}


class IllegalPhase(RuntimeError):
    """A move the turn state machine does not allow: a gateway bug."""


@dataclass(eq=False)
class Turn:
    """One user submission, from ``turn.started`` to ``turn.completed``/``turn.cancelled``."""

    id: str
    user_message: Message
    phase: Phase = "starting"
    cancel_scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    cancel_reason: str | None = None
    # How it ended: "end_turn", "tool_use", "error", ... or "cancelled"; set with ``done``.
    outcome: str | None = None
    final_text: str = ""
    done: trio.Event = field(default_factory=trio.Event)
    # Set once turn.started was emitted (or the turn ended without it).
    started: trio.Event = field(default_factory=trio.Event)
    # Delegate workers it started (``max_workers_per_turn``, docs/protocol.md §15).
    workers: int = 0
    # What its delegated workers' turns spent (docs/protocol.md §5, ``workers_cost_usd``).
    workers_cost_usd: float = 0.0
    # What it spent in all, its workers' included; set as it ends, before ``done``.
    cost_usd: float = 0.0
    # The trace context its request came with (gateway.telemetry: its span's parent); {}: none.
    trace: dict[str, str] = field(default_factory=dict)
    # The user message it rewinds to (docs/protocol.md §2 "Edit and regenerate"); None: none.
    rewind_to: str | None = None
    # Why it will never start (an interrupting turn whose session went away before it
    # could: gateway.session.busy); its request is refused so.
    refused: Refused | None = None
    # Its running tools' last ``tool.progress``, by tool use (docs/protocol.md §6: a
    # snapshot's ``tool_progress``); a tool's is dropped as it ends (gateway.session.tool_round).
    progress: dict[str, ToolProgressInfo] = field(default_factory=dict)

    def finish(self, outcome: str, final_text: str = "") -> None:
        """Enter ``done`` and wake whoever waits for the turn (a parent's ``delegate``)."""
        self.enter("done")
        self.outcome, self.final_text = outcome, final_text
        self.started.set()
        self.done.set()

    def enter(self, phase: Phase) -> None:
        if phase not in TRANSITIONS[self.phase]:
            raise IllegalPhase(f"turn {self.id}: cannot go from {self.phase!r} to {phase!r}")
        self.phase = phase

    @property
    def in_flight(self) -> bool:
        return self.phase != "done"

    @property
    def cancelling(self) -> bool:
        return self.cancel_reason is not None

    def drop(self, refused: Refused) -> None:
        """End a turn that never started: its request is refused with ``refused``."""
        self.refused = refused
        self.finish("dropped")

    def request_cancel(self, reason: str) -> bool:
        """Ask the turn to stop. ``False`` if it is already cancelling or done (a no-op)."""
        if self.cancelling or not self.in_flight:
            return False
        self.cancel_reason = reason
        self.cancel_scope.cancel()
        return True


class TurnState:
    """What one turn has done so far (for its ending)."""

    def __init__(self) -> None:
        self.started_at = trio.current_time()  # the turn's duration is measured from here
        self.usage = Usage()
        self.call_id = ""
        self.call: Call | None = None
        self.pending_tools: list[ToolUseBlock] = []
        self.tool_uses = 0  # tool_use blocks the model asked for so far (max_tool_uses_per_turn)
        self.rounds = 0  # LLM calls so far (the agent's max_rounds)
        self.results_message: Message | None = None
        self.ended = False  # its terminal event went out
        self.overflowed = False  # the last call was refused as too long (docs/protocol.md §12)
        self.call_failed_emitted = False  # its llm.call_failed went out already

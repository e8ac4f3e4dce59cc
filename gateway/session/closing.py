"""How a turn closes: one pure function from the turn's phase and facts to the events that close it.

Every way a turn ends early takes its events from :func:`sequence`: a cancel
(a ``cancel`` frame, the HTTP route, ``turn_timeout_s``, shutdown, a parent's
cancel), a gateway bug in the turn (a crash), a provider failure, and the
crash recovery of a restarted process. The caller gathers the :class:`Facts`
(what is still open, why it closes) and emits what comes back; nothing here
does I/O, so every row is testable without a session.

docs/protocol.md §8's three cancellation sequences, by the turn's phase
(:mod:`gateway.session.turn`), each ending with ``turn.cancelled`` (``phase``,
``partial``):

==========  =================================================================
row         sequence
==========  =================================================================
``llm``     the call's own ``message.complete`` (``cancelled``: the caller
            settles the call first, its translator closes the open blocks),
            then ``llm.call_failed`` (``cancelled``). A turn cancelled before
            its first call (``starting``) takes this row, with no call.
``seam``    each tool that has not entered execution: ``tool.failed``
            (``cancelled``). A call that completed just as the cancel landed
            is completed first (``llm.call_completed``): that is the seam,
            and its tool uses are the pending tools.
``tools``   each tool still pending: ``tool.failed`` (``cancelled``). Live,
            a running tool fails from its own task as the batch is
            cancelled, so none is pending by then; after a restart, an open
            delegate is ``delegate.failed`` and an open approval
            ``permission.resolved`` (``cancelled``) before its tool's
            ``tool.failed``.
==========  =================================================================

A crash closes the turn as a provider error would (docs/protocol.md §7):
``llm.call_failed`` if a call was streaming, ``tool.failed`` (``error``) for
each pending tool, ``turn.completed`` with ``stop_reason: error``. A provider
failure is ``llm.call_failed`` (unless it went out already) and
``turn.completed`` (``error``). After a crash of the process, docs/protocol.md
§9 closes the turns left in flight with the cancellation sequence of their
phase and ``reason: "server_restart"``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

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
from gateway.protocol.shapes import StopReason, Usage
from gateway.session.turn import Phase

Why = Literal["cancel", "crash", "restart", "provider_error"]
"""Why the turn closes: a cancel (timeout and shutdown are cancels), a gateway bug,
a restart after a crash of the process, a failed LLM call."""

Row = Literal["llm", "seam", "tools"]
"""The cancellation sequence of docs/protocol.md §8 (``turn.cancelled``'s ``phase``)."""

ToolRef = tuple[str, str]
"""A tool use: its id and its tool's name."""

RESTART_REASON = "server_restart"
TOOL_NOT_RUN = "the turn failed before it ran"


@dataclass(frozen=True, slots=True)
class CallFacts:
    """The turn's LLM call, as its stream left it (settled: nothing streams any more)."""

    call_id: str
    message_id: str | None = None  # its assistant message, if one began
    error_class: str | None = None  # how it failed; None: it completed
    error_message: str = ""
    stop_reason: StopReason | None = None  # of a completed call
    usage: Usage = field(default_factory=Usage)  # of a completed call's message
    tool_uses: tuple[ToolRef, ...] = ()  # a completed call's tool_use blocks
    reported: bool = False  # its llm.call_failed went out already


@dataclass(frozen=True, slots=True)
class Facts:
    """What a closing turn has open, and why it closes."""

    turn_id: str
    phase: Phase  # where the turn stands (never ``done``)
    why: Why
    reason: str = "cancelled"  # turn.cancelled's reason (a cancel, a restart)
    call: CallFacts | None = None  # the call of the phase, if any
    pending_tools: tuple[ToolRef, ...] = ()  # announced or asked for, not ended, no task running
    approvals: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # tool use id -> open
    delegates: tuple[ToolRef, ...] = ()  # open delegates: (tool use id, worker session id)
    partial: bool = False  # an assistant message of the turn exists
    usage: Usage = field(default_factory=Usage)  # the turn's, for turn.completed
    workers_cost_usd: float = 0.0  # its delegated workers' cost (docs/protocol.md §5)


@dataclass(frozen=True, slots=True)
class Closing:
    """The events that close the turn, in order; the last one is its terminal event."""

    events: list[Payload]
    row: Row | None = None  # the cancellation sequence taken (None: turn.completed)

    @property
    def steps(self) -> list[Payload]:
        """The events before the terminal one."""
        return self.events[:-1]

    @property
    def terminal(self) -> TurnCancelled | TurnCompleted:
        last = self.events[-1]
        assert isinstance(last, TurnCancelled | TurnCompleted)
        return last


def sequence(facts: Facts) -> Closing:
    """The events that close the turn (module docstring), for why it closes and what is open."""
    if facts.why == "crash":
        return _crash(facts)
    if facts.why == "provider_error":
        return _provider_error(facts)
    return _cancel(facts)


def why_closed(*, cancelled: bool, requested: str | None, timed_out: bool) -> tuple[Why, str]:
    """Why a turn left in flight by its task closes, and ``turn.cancelled``'s reason.

    Decided from the scopes, not from the exception (a ``Cancelled`` may come
    wrapped in an ``ExceptionGroup``): ``cancelled`` if the turn's scope or an
    outer one was cancelled. A cancel nobody asked for is the turn's deadline
    (``timeout``) or an outer scope's (``shutdown``); anything else is a crash.
    """
    if not cancelled:
        return "crash", ""
    if requested is not None:
        return "cancel", requested
    return "cancel", "timeout" if timed_out else "shutdown"


def completed(
    turn_id: str, stop_reason: StopReason, usage: Usage, workers_cost_usd: float
) -> TurnCompleted:
    """``turn.completed``: its cost is its calls' and its workers' (docs/protocol.md §5)."""
    cost = turn_cost(usage, workers_cost_usd)
    return TurnCompleted(turn_id, stop_reason, usage, cost, workers_cost_usd)


def turn_cost(usage: Usage, workers_cost_usd: float) -> float:
    """A turn's cost, its delegated workers' included."""
    return (usage.cost_usd or 0.0) + workers_cost_usd


def _cancel(f: Facts) -> Closing:
    row: Row = "llm" if f.phase == "starting" else f.phase  # type: ignore[assignment]
    out: list[Payload] = []
    pending = f.pending_tools
    call = f.call
    if f.phase in ("starting", "llm") and call is not None:
        if call.error_class is None and f.phase == "llm":
            # The call completed just as the cancel landed: that is the seam.
            assert call.message_id is not None and call.stop_reason is not None
            completed_call = LlmCallCompleted(
                call.call_id, call.message_id, call.stop_reason, call.usage
            )
            out.append(completed_call)
            row = "seam"
            pending = call.tool_uses if call.stop_reason == "tool_use" else ()
        else:
            out.append(call_failed(call))
    gone = "the gateway restarted" if f.why == "restart" else "cancelled"
    out += [DelegateFailed(t, worker, "cancelled_by_user", gone) for t, worker in f.delegates]
    for tool_use_id, name in pending:
        out += [PermissionResolved(perm, "cancelled") for perm in f.approvals.get(tool_use_id, ())]
        out.append(ToolFailed(tool_use_id, name, "cancelled", "cancelled"))
    out.append(TurnCancelled(f.turn_id, f.reason, row, f.partial))
    return Closing(out, row)


def _crash(f: Facts) -> Closing:
    out: list[Payload] = []
    if f.call is not None and f.phase == "llm":
        out.append(call_failed(f.call))
    out += [ToolFailed(t, name, "error", TOOL_NOT_RUN) for t, name in f.pending_tools]
    out.append(completed(f.turn_id, "error", f.usage, f.workers_cost_usd))
    return Closing(out)


def _provider_error(f: Facts) -> Closing:
    out: list[Payload] = []
    if f.call is not None and not f.call.reported:
        out.append(call_failed(f.call))
    out.append(completed(f.turn_id, "error", f.usage, f.workers_cost_usd))
    return Closing(out)


def call_failed(call: CallFacts) -> LlmCallFailed:
    """``llm.call_failed`` for a call that failed (its class; ``api_error`` if it has none)."""
    error_class = call.error_class or "api_error"
    return LlmCallFailed(call.call_id, error_class, call.error_message, call.message_id)  # type: ignore[arg-type]

"""Closing the turns a crash left in flight (docs/protocol.md §9).

At start-up the gateway closes every turn that was in flight when the previous
process died, with the sequence of section 8 for the phase the turn was in and
``reason: "server_restart"``. What the turn had done is read back from what
was durable: its catalog events (every one a client saw, since events are
held until committed) and the assistant message stored as its blocks ended.

The core is sans-IO: :func:`plan` reads a turn's stored events and messages
and says where the turn stood; :func:`closing` says what to emit, as
:func:`gateway.session.closing.sequence` decides for every closing turn. The
session's side (:func:`close_interrupted`) reads the store, emits, and stores
the interrupted message as ``cancelled`` with whatever of it was durable, so
that a client resuming with a ``since`` from before the crash gets
``message.complete`` in its replay and closes its open blocks.

Where the phase is not written down, it is inferred: an ``llm.call_started``
with no ``llm.call_completed``/``llm.call_failed`` after it is ``llm``; tools
called and not ended are ``tools`` if any of them was running (not waiting
for its own approval), else ``seam``; an MCP server's sampling call
(``purpose: "sampling"``) is part of its tool's run: one left open gets its
``llm.call_failed`` (``cancelled``) before the tools' ``tool.failed``, as a
live cancel emits it (docs/protocol.md §8); a turn between a call's end and its next
step is ``seam``. A ``context.compacting`` with no ``context.compacted`` after
it (the summary call of docs/protocol.md §12 was running) is ``llm``, with no
call to close: only ``turn.cancelled``, as a live cancel then emits.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import msgspec

from gateway.ids import new_message_id, now_ms
from gateway.protocol.events import (
    EVENT_TYPES,
    LlmCallFailed,
    MessageComplete,
    Payload,
    PermissionResolved,
)
from gateway.protocol.shapes import ContentBlock, Message, ToolResultBlock, ToolUseBlock, Usage
from gateway.session.call import Completion
from gateway.session.closing import RESTART_REASON, CallFacts, Facts, sequence
from gateway.store.base import StoredEvent, each_event_after

if TYPE_CHECKING:
    from gateway.session.session import Session

REASON = RESTART_REASON


class _Envelope(msgspec.Struct):
    type: str
    turn_id: str | None
    payload: msgspec.Raw


_envelope = msgspec.json.Decoder(_Envelope)


def decode_stored(data: bytes) -> tuple[str, str | None, Payload]:
    """A stored event's type, turn id and typed payload."""
    env = _envelope.decode(data)
    payload = msgspec.json.decode(env.payload, type=EVENT_TYPES[env.type].payload)
    return env.type, env.turn_id, payload


@dataclass
class Interrupted:
    """Where an interrupted turn stood when the process died."""

    turn_id: str
    phase: Literal["llm", "seam", "tools"]
    call_id: str | None = None  # the call still streaming (phase llm)
    message: Message | None = None  # its assistant message, as far as it was stored
    pending_tools: list[tuple[str, str]] = field(default_factory=list)  # (id, name), in order
    delegates: list[tuple[str, str]] = field(default_factory=list)  # (tool_use_id, worker id)
    partial: bool = False
    # The requests still waiting, by tool use id, in order (a tool's own approval; or
    # its server's questions, several at once): each is resolved ``cancelled`` right
    # before its tool's ``tool.failed`` (docs/protocol.md §5).
    permissions: dict[str, tuple[str, ...]] = field(default_factory=dict)
    sampling_calls: list[str] = field(default_factory=list)  # MCP sampling calls still open
    # Requests still waiting whose tool ended (an MCP server's question is its oldest
    # call's, which may end first: gateway.mcp.sampling): resolved ``cancelled`` first.
    orphans: list[str] = field(default_factory=list)


def plan(
    turn_id: str, events: Sequence[tuple[str, Any]], messages: Sequence[Message]
) -> Interrupted:
    """Where the turn stood, from its stored events (after ``turn.started``) and messages."""
    open_call: str | None = None
    completed_message: str | None = None  # the last completed call's message, stop tool_use
    pending: dict[str, str] = {}
    waiting: set[str] = set()  # tools waiting for a permission
    perm_tool: dict[str, str] = {}
    delegates: dict[str, str] = {}
    called_since_completion = False
    compacting = False
    sampling: dict[str, None] = {}  # MCP sampling calls open, in order
    for type_, p in events:
        if type_.startswith("llm.call_") and p.purpose == "sampling":
            # an MCP server's, inside a tool call: the tool's phase (section 11)
            if type_ == "llm.call_started":
                sampling[p.call_id] = None
            else:
                sampling.pop(p.call_id, None)
            continue
        if type_ == "context.compacting":
            compacting = True
        elif type_ == "context.compacted":
            compacting = False
        elif type_ == "llm.call_started":
            open_call, completed_message, called_since_completion = p.call_id, None, False
            pending.clear()
        elif type_ == "llm.call_completed":
            open_call = None
            completed_message = p.message_id if p.stop_reason == "tool_use" else None
        elif type_ == "llm.call_failed":
            open_call = completed_message = None
        elif type_ == "tool.called":
            pending[p.tool_use_id] = p.tool_name
            called_since_completion = True
        elif type_ in ("tool.completed", "tool.failed"):
            pending.pop(p.tool_use_id, None)
            waiting.discard(p.tool_use_id)
        elif type_ == "permission.requested":
            if p.kind == "tool":  # its own approval: not running yet (a server's question
                waiting.add(p.tool_use_id)  # is asked while its tool runs: section 11)
            perm_tool[p.perm_id] = p.tool_use_id
        elif type_ == "permission.resolved":
            waiting.discard(perm_tool.pop(p.perm_id, ""))
        elif type_ == "delegate.started":
            delegates[p.tool_use_id] = p.worker_session_id
        elif type_ in ("delegate.completed", "delegate.failed"):
            delegates.pop(p.tool_use_id, None)
    of_turn = [m for m in messages if m.turn_id == turn_id and m.role == "assistant"]
    partial = any(m.content for m in of_turn)
    if open_call is not None:
        streaming = next((m for m in reversed(of_turn) if m.status == "in_progress"), None)
        return Interrupted(turn_id, "llm", open_call, streaming, partial=partial)
    if compacting:
        return Interrupted(turn_id, "llm", partial=partial)
    if completed_message is not None and not called_since_completion:
        # The call asked for tools and none was called yet: all pending, none ran.
        msg = next((m for m in of_turn if m.id == completed_message), None)
        uses = [b for b in msg.content if isinstance(b, ToolUseBlock)] if msg else []
        pending = {b.id: b.name for b in uses}
        waiting = set(pending)
    running = [t for t in pending if t not in waiting]
    phase: Literal["seam", "tools"] = "tools" if running else "seam"
    running_delegates = [(t, w) for t, w in delegates.items() if t in pending]
    return Interrupted(
        turn_id, phase, pending_tools=list(pending.items()), delegates=running_delegates,
        partial=partial, permissions=_by_tool(perm_tool, pending), sampling_calls=list(sampling),
        orphans=[perm for perm, t in perm_tool.items() if t not in pending],
    )  # fmt: skip


def _by_tool(perm_tool: dict[str, str], pending: dict[str, str]) -> dict[str, tuple[str, ...]]:
    """The open requests of each pending tool, in the order asked."""
    out: dict[str, tuple[str, ...]] = {}
    for perm_id, tool_use_id in perm_tool.items():
        if tool_use_id in pending:
            out[tool_use_id] = (*out.get(tool_use_id, ()), perm_id)
    return out


def closing(state: Interrupted) -> list[Payload]:
    """The catalog events that close the turn: section 8's sequence for its phase.

    ``message.complete`` for the interrupted message is the session's to emit
    (it is stored with the message); it comes first. The call still streaming
    closes as a cancel leaves it (``cancelled``).
    """
    call = None
    if state.phase == "llm" and state.call_id is not None:
        message_id = state.message.id if state.message else None
        call = CallFacts(state.call_id, message_id, "cancelled", "cancelled")
    facts = Facts(
        state.turn_id, state.phase, "restart", REASON, call, tuple(state.pending_tools),
        state.permissions, tuple(state.delegates), state.partial,
    )  # fmt: skip
    first: list[Payload] = [
        LlmCallFailed(c, "cancelled", "cancelled", None, "sampling") for c in state.sampling_calls
    ]
    first += [PermissionResolved(perm, "cancelled") for perm in state.orphans]
    return first + sequence(facts).events


async def close_interrupted(session: Session) -> None:
    """Close the session's turn left in flight by a crash (module docstring)."""
    record = session.record
    turn_id = record.current_turn_id
    if turn_id is None:
        return
    rows: list[StoredEvent] = []
    after = max(record.current_turn_seq - 1, 0)
    await each_event_after(session.node.store, [session.id], after, rows.append)
    decoded = [decode_stored(r.data) for r in rows]
    events = [(t, p) for t, of, p in decoded if of == turn_id and t != "turn.started"]
    # From here on nothing awaits: the turn is closed in one step.
    state = plan(turn_id, events, session.messages)
    if state.message is not None:
        usage = state.message.usage or Usage()
        message = msgspec.structs.replace(state.message, status="cancelled", usage=usage)
        payload = MessageComplete(message.id, "cancelled", message.content, usage)
        [complete] = session.emit([payload], turn_id)
        session.add_message(message, Completion(complete.seq, complete.ts, "cancelled"))
    if state.pending_tools:
        results: list[ContentBlock] = [
            ToolResultBlock(t, "cancelled", True) for t, _ in state.pending_tools
        ]
        session.add_message(
            Message(new_message_id(), session.id, turn_id, "user", results, "complete", now_ms())
        )
    payloads = closing(state)
    record.current_turn_id, record.current_turn_seq = None, 0
    session.save_record()
    session.emit(payloads, turn_id)

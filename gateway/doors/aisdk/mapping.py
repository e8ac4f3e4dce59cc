"""The gateway's events as the AI SDK's UI message chunks: one turn, sans-IO (docs/protocol.md §14).

:class:`ChatMapper` is fed the session's events (docs/protocol.md sections 5, 7
and 8) and answers the UI message chunks (:mod:`gateway.aisdk.chunks`) they
become; it holds no socket and never awaits, so it is tested event by event
against the recorded traces (tests/unit/aisdk/test_aisdk_mapping.py). A chat
response is one turn, one assistant UI message whose id is the turn's
(:func:`ui_message_id`); events of other turns map to nothing.

=============================  ===============================================
gateway                        AI SDK UI message chunk
=============================  ===============================================
(the response begins)          ``start`` (``messageId``; metadata: the session
                               and the turn)
``llm.call_started``           ``start-step``
``llm.call_completed/failed``  ``finish-step``
``text.start/delta/end``       ``text-start/-delta/-end`` (id ``{message}:{i}``)
``thinking.*``                 ``reasoning-start/-delta/-end``; a signature, or
                               a redacted block's data, is the end's
                               ``providerMetadata.gateway``
``tool.use_start``             ``tool-input-start`` (``providerExecuted``,
                               ``dynamic``: the gateway runs its tools)
``tool.input_delta``           ``tool-input-delta``
``tool.use_end``               ``tool-input-available`` (one delta first with
                               the whole input when none streamed)
``tool.completed``             ``tool-output-available`` (of a call the
                               message shows: the SDK rejects any other)
``tool.failed``                ``tool-output-error``; ``tool-output-denied``
                               when the approval was denied
``permission.requested``       ``tool-approval-request`` on the tool call; a
                               worker's, on the ``delegate`` call that runs
                               it; an MCP elicitation, a ``data-elicitation``
                               part (answered on the permissions route)
``permission.resolved``        ``tool-approval-response`` (``reason``: a
                               timeout or a cancel); a data part's request,
                               that part again (``state``: ``resolved``,
                               ``decision``)
``delegate.*``                 a ``data-delegate`` part per worker, updated
``context.compacting/ed``      a ``data-compaction`` part, updated
``message.complete``           closes what a cancel left open; in a replay,
                               the blocks it holds that were not streamed
``turn.completed``             ``finish`` (``stop``, ``length``,
                               ``tool-calls``, ``other``), after ``error`` when
                               its ``stop_reason`` is ``error``
``turn.cancelled``             ``abort`` (the reason), ``finish`` (``other``)
=============================  ===============================================

While an approval waits, :meth:`ChatMapper.pause` ends the response with
``finish`` (``tool-calls``) as an AI SDK server does: the client answers in its
next request (docs/protocol.md §14). Every ``finish`` carries the response's
position (``messageMetadata.gateway.lastEventId``), which the client sends back
with the message, so a continuation streams what came after it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

import msgspec

from gateway.doors.aisdk import chunks as ui
from gateway.ids import parse_event_id
from gateway.protocol.events import (
    ContextCompacted,
    ContextCompacting,
    DelegateCompleted,
    DelegateFailed,
    DelegateStarted,
    Envelope,
    LlmCallCompleted,
    LlmCallFailed,
    LlmCallStarted,
    MessageComplete,
    MessageSnapshot,
    PermissionRequested,
    PermissionResolved,
    TextDelta,
    TextEnd,
    TextStart,
    ThinkingDelta,
    ThinkingEnd,
    ThinkingStart,
    ToolCompleted,
    ToolFailed,
    ToolUseEnd,
    ToolUseInputDelta,
    ToolUseStart,
    TurnCancelled,
    TurnCompleted,
)
from gateway.protocol.rebuild import unstarted

FINISH_REASONS: dict[str, str] = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "tool_use": "tool-calls",
    "max_rounds": "other",
    "cancelled": "other",
    "error": "error",
}
"""A turn's ``stop_reason`` as the AI SDK's ``finishReason``."""


def ui_message_id(turn_id: str) -> str:
    """The assistant UI message of a turn: the same in every response of it."""
    return f"msg_{turn_id}"


def user_message_id(session_id: str, client_id: str) -> str:
    """The gateway id of a user message the client named ``client_id`` in its chat.

    Derived, so a request repeated after a lost answer names the turn it
    started (docs/protocol.md §14) rather than starting another.
    """
    digest = hashlib.sha256(f"ai-sdk\0{session_id}\0{client_id}".encode()).hexdigest()
    return f"msg_{digest[:20]}"


@dataclass
class _Block:
    kind: str  # "text", "thinking", "redacted", "tool"
    ui_id: str
    data: list[str] = field(default_factory=list)  # redacted data, or a tool's input so far


@dataclass
class ChatMapper:
    """One turn as one assistant UI message (module docstring).

    Args:
        session_id: the chat (the gateway session).
        turn_id: the turn this response streams.
        after: the last event the client has (a continuation); the chunks of
            events at or below it are not sent, only tracked.
        answering: the approvals this request answers: the response does not
            pause for them.
    """

    session_id: str
    turn_id: str
    after: int = -1
    answering: frozenset[str] = frozenset()
    finished: bool = False
    last_event_id: str | None = None
    _seq: int = -1
    _blocks: dict[tuple[str, int], _Block] = field(default_factory=dict)
    _seen: set[tuple[str, int]] = field(default_factory=set)
    _steps: list[str] = field(default_factory=list)
    _tools: set[str] = field(default_factory=set)  # tool calls of this message
    _unrun: dict[str, None] = field(default_factory=dict)  # calls with input, no output yet
    _waiting: dict[str, str] = field(default_factory=dict)  # perm id: its tool call ("": none)
    _asked: dict[str, str] = field(default_factory=dict)  # tool call: its approval asked
    _parts: dict[str, ui.Data] = field(default_factory=dict)  # perm id: its data part
    _delegates: dict[str, str] = field(default_factory=dict)  # worker session: delegate call
    _running: list[str] = field(default_factory=list)  # delegate calls not yet ended
    _compactions: int = 0
    _failure: str | None = None

    @property
    def message_id(self) -> str:
        return ui_message_id(self.turn_id)

    def start(self) -> list[ui.Chunk]:
        """The response's ``start``: the turn's message, continued if the client has it."""
        meta = {"gateway": {"sessionId": self.session_id, "turnId": self.turn_id}}
        return [ui.Start(message_id=self.message_id, message_metadata=meta)]

    def receive(self, event: Envelope[Any]) -> list[ui.Chunk]:
        """The chunks of one gateway event (none once the response has finished)."""
        if self.finished:
            return []
        seq = parse_event_id(event.id)
        if seq is not None:
            self._seq = seq
        if self._owned(event):  # before mapping: a finish it makes carries it
            self.last_event_id = event.id
        out: list[ui.Chunk] = []
        for payload in unstarted(event.payload, self._started):  # a replay's whole message
            out += self._map(msgspec.structs.replace(event, payload=payload))
        out += self._map(event)
        if self._seq > self.after:
            return out
        # At or below the client's position: it has these. A position past the end
        # (a cursor from elsewhere) still gets the end, so the response finishes.
        return [c for c in out if isinstance(c, ui.Finish)] if self.finished else []

    def pause(self) -> list[ui.Chunk]:
        """End the response while an approval waits (module docstring); else nothing.

        Called once the events that were ready have been received (a live
        batch, or a whole replay: an approval a replay shows asked may be
        answered further on), so approvals asked together end the response
        together; never for the approvals this request answers. A continuation
        that answers none of those still waiting ends at once, as it began.
        """
        if self.finished or not set(self._waiting) - self.answering:
            return []
        self.finished = True
        return [*self._close_all(), self._finish("tool-calls")]

    def closed(self, error: str | None = None) -> list[ui.Chunk]:
        """End a response whose turn will send no more here: an error, or nothing left."""
        self.finished = True
        out = [*self._close_all(), *self._close_unrun()]
        if error is not None:
            out.append(ui.Error(error_text=error))
        return [*out, self._finish("error" if error is not None else "other")]

    @property
    def waiting(self) -> list[str]:
        """The approvals this response saw asked and not answered."""
        return list(self._waiting)

    # --- one event ---------------------------------------------------------------------

    def _owned(self, event: Envelope[Any]) -> bool:
        if event.turn_id == self.turn_id:
            return True
        # A delegated worker's request reaches its ancestors' streams (docs/protocol.md
        # §5), answered from there: it is part of this response too.
        worker = event.session_id != self.session_id
        return worker and isinstance(event.payload, PermissionRequested | PermissionResolved)

    def _map(self, event: Envelope[Any]) -> list[ui.Chunk]:
        if not self._owned(event):
            return []
        p = event.payload
        if isinstance(p, TextStart | TextDelta | TextEnd):
            return self._text(p)
        if isinstance(p, ThinkingStart | ThinkingDelta | ThinkingEnd):
            return self._thinking(p)
        if isinstance(p, ToolUseStart | ToolUseInputDelta | ToolUseEnd):
            return self._tool_use(p)
        if isinstance(p, MessageComplete):
            return self._close_message(p.message_id)
        if isinstance(p, MessageSnapshot):
            return []
        if isinstance(p, LlmCallStarted):
            self._steps.append(p.call_id)
            return [ui.StartStep()]
        if isinstance(p, LlmCallCompleted | LlmCallFailed):
            if isinstance(p, LlmCallFailed):
                self._failure = f"{p.error_class}: {p.message}"
            if p.call_id not in self._steps:
                return []
            self._steps.remove(p.call_id)
            return [ui.FinishStep()]
        if isinstance(p, ToolCompleted | ToolFailed) and p.tool_use_id not in self._tools:
            return []  # a call this message never showed: the SDK rejects its output
        if isinstance(p, ToolCompleted | ToolFailed):
            self._unrun.pop(p.tool_use_id, None)
        if isinstance(p, ToolCompleted):
            output = p.structured_result if p.structured_result is not None else p.result
            return [ui.ToolOutputAvailable(tool_call_id=p.tool_use_id, output=output)]
        if isinstance(p, ToolFailed):
            if p.error_class == "permission_denied":
                return [ui.ToolOutputDenied(tool_call_id=p.tool_use_id)]
            text = f"{p.error_class}: {p.message}"
            return [ui.ToolOutputError(tool_call_id=p.tool_use_id, error_text=text)]
        if isinstance(p, PermissionRequested):
            return self._asked_for(p, event.session_id)
        if isinstance(p, PermissionResolved):
            return self._resolved(p)
        if isinstance(p, DelegateStarted | DelegateCompleted | DelegateFailed):
            return [self._delegate(p)]
        if isinstance(p, ContextCompacting | ContextCompacted):
            if isinstance(p, ContextCompacting):
                self._compactions += 1
            data = {"phase": "compacting" if isinstance(p, ContextCompacting) else "compacted"}
            data.update(msgspec.to_builtins(p))
            return [ui.Data(name="compaction", id=f"compaction-{self._compactions}", data=data)]
        if isinstance(p, TurnCompleted):
            return self._end(FINISH_REASONS.get(p.stop_reason, "other"), p)
        if isinstance(p, TurnCancelled):
            self.finished = True
            ended = [*self._close_all(), *self._close_unrun()]
            return [*ended, ui.Abort(reason=p.reason), self._finish("other")]
        return []

    # --- approvals and workers ------------------------------------------------------

    def _asked_for(self, p: PermissionRequested, asker: str) -> list[ui.Chunk]:
        worker = asker != self.session_id
        if p.kind == "elicitation":
            self._waiting[p.perm_id] = ""
            data = {
                "permId": p.perm_id,
                "toolCallId": p.tool_use_id,
                "toolName": p.tool_name,
                "message": p.message if isinstance(p.message, str) else "",
                "requestedSchema": p.requested_schema
                if isinstance(p.requested_schema, dict)
                else {},
                "expiresAt": p.expires_at,
                "state": "requested",
            }
            return [self._part("elicitation", p.perm_id, data)]
        call = p.tool_use_id
        if worker:  # on the delegate call that runs the worker, if it has no other
            call = self._delegates.get(asker, self._running[-1] if self._running else "")
        if not call or call in self._asked or (not worker and call not in self._tools):
            self._waiting[p.perm_id] = ""
            data = {"permId": p.perm_id, "toolCallId": p.tool_use_id, "toolName": p.tool_name,
                    "input": p.input, "sessionId": asker, "state": "requested"}  # fmt: skip
            return [self._part("permission", p.perm_id, data)]
        self._waiting[p.perm_id] = call
        self._asked[call] = p.perm_id
        reason = f"Allow {p.tool_name} with {msgspec.json.encode(p.input).decode()}?"
        return [ui.ToolApprovalRequest(approval_id=p.perm_id, tool_call_id=call, reason=reason)]

    def _resolved(self, p: PermissionResolved) -> list[ui.Chunk]:
        call = self._waiting.pop(p.perm_id, None)
        if call is None:
            return []
        approved = p.decision == "allow"
        part = self._parts.pop(p.perm_id, None)
        if not call:  # a data part: replaced by its new state
            if part is None:
                return []
            data = {**part.data, "state": "resolved", "decision": p.decision}
            return [ui.Data(name=part.name, id=part.id, data=data)]
        del self._asked[call]
        reason = None if p.decision in ("allow", "deny") else p.decision  # timeout, cancelled
        return [
            ui.ToolApprovalResponse(
                approval_id=p.perm_id, approved=approved, provider_executed=True, reason=reason
            )
        ]

    def _part(self, name: str, perm_id: str, data: dict[str, Any]) -> ui.Data:
        """A request shown as a data part (not a tool part's approval), kept to update."""
        part = self._parts[perm_id] = ui.Data(name=name, id=perm_id, data=data)
        return part

    def _delegate(self, p: DelegateStarted | DelegateCompleted | DelegateFailed) -> ui.Chunk:
        data: dict[str, Any] = {"toolCallId": p.tool_use_id, "sessionId": p.worker_session_id}
        if isinstance(p, DelegateStarted):
            self._delegates[p.worker_session_id] = p.tool_use_id
            self._running.append(p.tool_use_id)
            data.update(state="running", task=p.task)
        else:
            if p.tool_use_id in self._running:
                self._running.remove(p.tool_use_id)
            if isinstance(p, DelegateCompleted):
                data.update(state="completed", result=p.result)
            else:
                data.update(state="failed", failureMode=p.failure_mode, message=p.message)
        return ui.Data(name="delegate", id=p.worker_session_id, data=data)

    # --- blocks ------------------------------------------------------------------------

    def _started(self, message_id: str, index: int) -> bool:
        return (message_id, index) in self._seen

    def _text(self, p: TextStart | TextDelta | TextEnd) -> list[ui.Chunk]:
        key = (p.message_id, p.content_block_index)
        if isinstance(p, TextStart):
            block = self._blocks[key] = _Block("text", f"{p.message_id}:{p.content_block_index}")
            self._seen.add(key)
            return [ui.TextStart(id=block.ui_id)]
        found = self._blocks.get(key)
        if found is None:
            return []
        if isinstance(p, TextDelta):
            return [ui.TextDelta(id=found.ui_id, delta=p.text)] if p.text else []
        return self._close(key)

    def _thinking(self, p: ThinkingStart | ThinkingDelta | ThinkingEnd) -> list[ui.Chunk]:
        key = (p.message_id, p.content_block_index)
        if isinstance(p, ThinkingStart):
            rid = f"{p.message_id}:{p.content_block_index}"
            self._blocks[key] = _Block("redacted" if p.redacted else "thinking", rid)
            self._seen.add(key)
            return [ui.ReasoningStart(id=rid)]
        found = self._blocks.get(key)
        if found is None:
            return []
        if isinstance(p, ThinkingDelta):
            if found.kind == "redacted":
                found.data.append(p.text)
                return []
            return [ui.ReasoningDelta(id=found.ui_id, delta=p.text)] if p.text else []
        return self._close(key, p.signature)

    def _tool_use(self, p: ToolUseStart | ToolUseInputDelta | ToolUseEnd) -> list[ui.Chunk]:
        key = (p.message_id, p.content_block_index)
        if isinstance(p, ToolUseStart):
            self._blocks[key] = _Block("tool", p.tool_use_id)
            self._seen.add(key)
            self._tools.add(p.tool_use_id)
            return [ui.ToolInputStart(tool_call_id=p.tool_use_id, tool_name=p.tool_name)]
        found = self._blocks.get(key)
        if found is None:
            return []
        if isinstance(p, ToolUseInputDelta):
            if not p.partial_json:
                return []
            found.data.append(p.partial_json)
            return [ui.ToolInputDelta(tool_call_id=p.tool_use_id, input_text_delta=p.partial_json)]
        out: list[ui.Chunk] = []
        if not found.data:  # no delta streamed: the input in one piece
            whole = msgspec.json.encode(p.final_input).decode()
            out.append(ui.ToolInputDelta(tool_call_id=p.tool_use_id, input_text_delta=whole))
        del self._blocks[key]
        self._unrun[p.tool_use_id] = None
        out.append(
            ui.ToolInputAvailable(
                tool_call_id=p.tool_use_id, tool_name=p.tool_name, input=p.final_input
            )
        )
        return out

    def _close(self, key: tuple[str, int], signature: str | None = None) -> list[ui.Chunk]:
        block = self._blocks.pop(key, None)
        if block is None:
            return []
        if block.kind == "text":
            return [ui.TextEnd(id=block.ui_id)]
        if block.kind == "tool":  # cut short by a cancel: its input as far as it came
            text = "".join(block.data)
            return [ui.ToolOutputError(tool_call_id=block.ui_id, error_text=f"cancelled: {text}")]
        opaque = "".join(block.data) if block.kind == "redacted" else signature
        meta = None
        if opaque:
            name = "redactedData" if block.kind == "redacted" else "signature"
            meta = {"gateway": {name: opaque}}
        return [ui.ReasoningEnd(id=block.ui_id, provider_metadata=meta)]

    def _close_message(self, message_id: str) -> list[ui.Chunk]:
        """What a cancel or an error left open in ``message_id`` (docs/protocol.md §7, §8)."""
        out: list[ui.Chunk] = []
        for key in [k for k in self._blocks if k[0] == message_id]:
            out += self._close(key)
        return out

    def _close_all(self) -> list[ui.Chunk]:
        out: list[ui.Chunk] = []
        for key in list(self._blocks):
            out += self._close(key)
        out += [ui.FinishStep() for _ in self._steps]
        self._steps.clear()
        return out

    def _close_unrun(self) -> list[ui.Chunk]:
        """The calls whose input came and whose tool never ran: the turn ended first (§8)."""
        ended = [call for call in self._unrun if call not in self._asked]  # (not the waiting)
        for call in ended:
            del self._unrun[call]
        text = "cancelled: the turn ended first"
        return [ui.ToolOutputError(tool_call_id=call, error_text=text) for call in ended]

    def _end(self, reason: str, p: TurnCompleted) -> list[ui.Chunk]:
        self.finished = True
        out = [*self._close_all(), *self._close_unrun()]
        if reason == "error":
            out.append(ui.Error(error_text=self._failure or "the turn ended with an error"))
        usage = msgspec.to_builtins(p.usage)
        return [*out, self._finish(reason, usage=usage, costUsd=p.cost_usd)]

    def _finish(self, reason: str, **more: Any) -> ui.Finish:
        meta = {"gateway": {"turnId": self.turn_id, "lastEventId": self.last_event_id, **more}}
        return ui.Finish(finish_reason=reason, message_metadata=meta)

"""The gateway's events as the AI SDK's UI message chunks: one turn, sans-IO (docs/doors/aisdk.md).

:class:`ChatMapper` is fed the session's events (docs/protocol.md sections 5, 7
and 8) and answers the UI message chunks (:mod:`gateway.doors.aisdk.chunks`) they
become; it holds no socket and never awaits, so it is tested event by event
against the recorded traces (tests/unit/doors/aisdk/test_aisdk_mapping.py). A chat
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
                               message shows: the SDK rejects any other);
                               each of its ``files``, a ``file`` part (the
                               file route's URL)
``tool.failed``                ``tool-output-error``; ``tool-output-denied``
                               when the approval was denied
``permission.requested``       ``tool-approval-request`` on the tool call; a
                               worker's, on the ``delegate`` call that runs
                               it; an MCP elicitation, a ``data-elicitation``
                               part (answered on the permissions route); an
                               MCP sampling request, a ``data-sampling`` part,
                               a URL-mode elicitation a ``data-elicitation-url``
                               part (``message`` and the request's ``input``)
``permission.resolved``        ``tool-approval-response`` (``reason``: a
                               timeout or a cancel); a data part's request,
                               that part again (``state``: ``resolved``,
                               ``decision``)
``tool.progress``              a transient ``data-tool-progress`` part (id: the
                               tool call): delivered, never kept in the message
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
next request (docs/doors/aisdk.md). Every ``finish`` carries the response's
position (``messageMetadata.gateway.lastEventId``), which the client sends back
with the message, so a continuation streams what came after it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

import msgspec

from gateway.doors.aisdk import chunks as ui
from gateway.doors.attachments import file_url
from gateway.ids import parse_event_id
from gateway.protocol.events import (
    ContextCompacted,
    ContextCompacting,
    DelegateCompleted,
    DelegateFailed,
    DelegateStarted,
    Envelope,
    Payload,
    PermissionRequested,
    PermissionResolved,
    ToolCompleted,
    ToolFailed,
    ToolProgress,
    TurnCancelled,
    TurnCompleted,
)
from gateway.protocol.projection import (
    Block,
    BlockEmitter,
    BlockKind,
    Emitters,
    Handler,
    Projection,
    indexed_id,
)

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
    started (docs/doors/aisdk.md) rather than starting another.
    """
    digest = hashlib.sha256(f"ai-sdk\0{session_id}\0{client_id}".encode()).hexdigest()
    return f"msg_{digest[:20]}"


class _Text:
    """A text block as ``text-start/-delta/-end``, its id ``{message}:{index}``."""

    def name(self, b: Block) -> str:
        return indexed_id(b)

    def start(self, b: Block, ts: int) -> list[ui.Chunk]:
        return [ui.TextStart(id=b.id)]

    def delta(self, b: Block, text: str, ts: int) -> list[ui.Chunk]:
        return [ui.TextDelta(id=b.id, delta=text)]

    def end(self, b: Block, ts: int | None) -> list[ui.Chunk]:
        return [ui.TextEnd(id=b.id)]


class _Reasoning:
    """A thinking block as ``reasoning-*``: its signature, or redacted data, on the end."""

    def name(self, b: Block) -> str:
        return indexed_id(b)

    def start(self, b: Block, ts: int) -> list[ui.Chunk]:
        return [ui.ReasoningStart(id=b.id)]

    def delta(self, b: Block, text: str, ts: int) -> list[ui.Chunk]:
        return [ui.ReasoningDelta(id=b.id, delta=text)]

    def end(self, b: Block, ts: int | None) -> list[ui.Chunk]:
        opaque = "".join(b.data) if b.kind == "redacted" else b.signature
        meta = None
        if opaque:
            name = "redactedData" if b.kind == "redacted" else "signature"
            meta = {"gateway": {name: opaque}}
        return [ui.ReasoningEnd(id=b.id, provider_metadata=meta)]


class _ToolInput:
    """A tool block as ``tool-input-*``; the calls this message shows, and those not run."""

    def __init__(self) -> None:
        self.shown: set[str] = set()  # tool calls of this message
        self.unrun: dict[str, None] = {}  # calls with input, no output yet

    def name(self, b: Block) -> str:
        return b.tool_use_id

    def start(self, b: Block, ts: int) -> list[ui.Chunk]:
        self.shown.add(b.id)
        return [ui.ToolInputStart(tool_call_id=b.id, tool_name=b.tool_name)]

    def delta(self, b: Block, text: str, ts: int) -> list[ui.Chunk]:
        return [ui.ToolInputDelta(tool_call_id=b.id, input_text_delta=text)]

    def end(self, b: Block, ts: int | None) -> list[ui.Chunk]:
        if b.ended:
            self.unrun[b.id] = None
            return [ui.ToolInputAvailable(tool_call_id=b.id, tool_name=b.tool_name, input=b.input)]
        text = "".join(b.data)  # cut short by a cancel: its input as far as it came
        return [ui.ToolOutputError(tool_call_id=b.id, error_text=f"cancelled: {text}")]


class _Steps:
    def start(self, call_id: str, ts: int) -> list[ui.Chunk]:
        return [ui.StartStep()]

    def end(self, call_id: str, ts: int | None) -> list[ui.Chunk]:
        return [ui.FinishStep()]


@dataclass
class ChatMapper:
    """One turn as one assistant UI message (module docstring).

    The turn's walk (its filter, blocks, steps, closing) is the shared
    :class:`~gateway.protocol.projection.Projection`; this class gives it the
    AI SDK's emitters and handles the rest: tool outputs, approvals, workers,
    compaction, the response's end, and the client's position.

    Args:
        session_id: the chat (the gateway session).
        turn_id: the turn this response streams.
        after: the last event the client has (a continuation); the chunks of
            events at or below it are not sent, only tracked.
        answering: the approvals this request answers: the response does not
            pause for them.
        file_base: what a file's URL begins with (``[server] public_url``;
            empty: the URL is the file route's path, docs/doors/aisdk.md "Files").
    """

    session_id: str
    turn_id: str
    after: int = -1
    answering: frozenset[str] = frozenset()
    file_base: str = ""
    last_event_id: str | None = None
    _seq: int = -1
    _calls: _ToolInput = field(default_factory=_ToolInput)
    _waiting: dict[str, str] = field(default_factory=dict)  # perm id: its tool call ("": none)
    _asked: dict[str, str] = field(default_factory=dict)  # tool call: its approval asked
    _parts: dict[str, ui.Data] = field(default_factory=dict)  # perm id: its data part
    _delegates: dict[str, str] = field(default_factory=dict)  # worker session: delegate call
    _running: list[str] = field(default_factory=list)  # delegate calls not yet ended
    _compactions: int = 0
    _turn: Projection[ui.Chunk] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        reasoning = _Reasoning()
        blocks: dict[BlockKind, BlockEmitter[ui.Chunk]] = {
            "text": _Text(), "thinking": reasoning, "redacted": reasoning, "tool": self._calls,
        }  # fmt: skip
        events: dict[type[Payload], Handler[ui.Chunk]] = {
            ToolCompleted: self._tool_completed,
            ToolFailed: self._tool_failed,
            PermissionRequested: self._asked_for,
            PermissionResolved: self._resolved,
            DelegateStarted: self._delegate_started,
            DelegateCompleted: self._delegate_completed,
            DelegateFailed: self._delegate_failed,
            ContextCompacting: self._compacting,
            ContextCompacted: self._compacted,
            ToolProgress: self._progress,
            TurnCompleted: self._completed,
            TurnCancelled: self._cancelled,
        }
        self._turn = Projection(self.session_id, self.turn_id, Emitters(blocks, _Steps(), events))

    @property
    def message_id(self) -> str:
        return ui_message_id(self.turn_id)

    @property
    def finished(self) -> bool:
        """The response has ended: nothing more is mapped."""
        return self._turn.finished

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
        if self._turn.owns(event):  # before mapping: a finish it makes carries it
            self.last_event_id = event.id
        out = self._turn.rebuilt(event)  # a replay's whole message
        out += self._turn.receive(event)
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
        return [*self._turn.end(None), self._finish("tool-calls")]

    def closed(self, error: str | None = None) -> list[ui.Chunk]:
        """End a response whose turn will send no more here: an error, or nothing left."""
        out = [*self._turn.end(None), *self._close_unrun()]
        if error is not None:
            out.append(ui.Error(error_text=error))
        return [*out, self._finish("error" if error is not None else "other")]

    @property
    def waiting(self) -> list[str]:
        """The approvals this response saw asked and not answered."""
        return list(self._waiting)

    # --- the events of the AI SDK's own (the projection's table) ----------------------

    def _tool_completed(self, p: ToolCompleted, e: Envelope[Any]) -> list[ui.Chunk]:
        if not self._ran(p.tool_use_id):
            return []
        output = p.structured_result if p.structured_result is not None else p.result
        out: list[ui.Chunk] = [ui.ToolOutputAvailable(tool_call_id=p.tool_use_id, output=output)]
        for f in p.files or ():  # the tool's images (and audio): by their URL, never the bytes
            meta = {"gateway": {"fileId": f.file_id, "size": f.size, "toolCallId": p.tool_use_id}}
            url = file_url(self.file_base, e.session_id, f.file_id)
            out.append(ui.File(url=url, media_type=f.media_type, provider_metadata=meta))
        return out

    def _tool_failed(self, p: ToolFailed, e: Envelope[Any]) -> list[ui.Chunk]:
        if not self._ran(p.tool_use_id):
            return []
        if p.error_class == "permission_denied":
            return [ui.ToolOutputDenied(tool_call_id=p.tool_use_id)]
        text = f"{p.error_class}: {p.message}"
        return [ui.ToolOutputError(tool_call_id=p.tool_use_id, error_text=text)]

    def _ran(self, call: str) -> bool:
        """A call's output came: False for a call this message never showed (the SDK
        rejects its output)."""
        if call not in self._calls.shown:
            return False
        self._calls.unrun.pop(call, None)
        return True

    def _compacting(self, p: ContextCompacting, e: Envelope[Any]) -> list[ui.Chunk]:
        self._compactions += 1
        return self._compaction("compacting", p)

    def _compacted(self, p: ContextCompacted, e: Envelope[Any]) -> list[ui.Chunk]:
        return self._compaction("compacted", p)

    def _compaction(self, phase: str, p: ContextCompacting | ContextCompacted) -> list[ui.Chunk]:
        """The ``data-compaction`` part, replaced in place as the compaction ends."""
        data = {"phase": phase, **msgspec.to_builtins(p)}
        return [ui.Data(name="compaction", id=f"compaction-{self._compactions}", data=data)]

    def _progress(self, p: ToolProgress, e: Envelope[Any]) -> list[ui.Chunk]:
        """A running tool's progress: a transient part (the client's ``onData``, not kept)."""
        data = msgspec.to_builtins(p)
        return [ui.Data(name="tool-progress", id=p.tool_use_id, data=data, transient=True)]

    def _cancelled(self, p: TurnCancelled, e: Envelope[Any]) -> list[ui.Chunk]:
        ended = [*self._turn.end(None), *self._close_unrun()]
        return [*ended, ui.Abort(reason=p.reason), self._finish("other")]

    def _completed(self, p: TurnCompleted, e: Envelope[Any]) -> list[ui.Chunk]:
        reason = FINISH_REASONS.get(p.stop_reason, "other")
        out = [*self._turn.end(None), *self._close_unrun()]
        if reason == "error":
            failure = self._turn.failure
            text = f"{failure.error_class}: {failure.message}" if failure else None
            out.append(ui.Error(error_text=text or "the turn ended with an error"))
        usage = msgspec.to_builtins(p.usage)
        return [*out, self._finish(reason, usage=usage, costUsd=p.cost_usd)]

    # --- approvals and workers ------------------------------------------------------

    def _asked_for(self, p: PermissionRequested, e: Envelope[Any]) -> list[ui.Chunk]:
        asker = e.session_id
        worker = asker != self.session_id
        if p.kind in ("sampling", "elicitation_url"):  # an MCP server's (docs/protocol.md §11)
            self._waiting[p.perm_id] = ""
            data = {"permId": p.perm_id, "toolCallId": p.tool_use_id, "toolName": p.tool_name,
                    "message": p.message if isinstance(p.message, str) else "",
                    "input": p.input, "expiresAt": p.expires_at, "state": "requested"}  # fmt: skip
            return [self._part(p.kind.replace("_", "-"), p.perm_id, data)]
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
        if not call or call in self._asked or (not worker and call not in self._calls.shown):
            self._waiting[p.perm_id] = ""
            data = {"permId": p.perm_id, "toolCallId": p.tool_use_id, "toolName": p.tool_name,
                    "input": p.input, "sessionId": asker, "state": "requested"}  # fmt: skip
            return [self._part("permission", p.perm_id, data)]
        self._waiting[p.perm_id] = call
        self._asked[call] = p.perm_id
        reason = f"Allow {p.tool_name} with {msgspec.json.encode(p.input).decode()}?"
        return [ui.ToolApprovalRequest(approval_id=p.perm_id, tool_call_id=call, reason=reason)]

    def _resolved(self, p: PermissionResolved, e: Envelope[Any]) -> list[ui.Chunk]:
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

    def _delegate_started(self, p: DelegateStarted, e: Envelope[Any]) -> list[ui.Chunk]:
        self._delegates[p.worker_session_id] = p.tool_use_id
        self._running.append(p.tool_use_id)
        return self._worker(p.tool_use_id, p.worker_session_id, state="running", task=p.task)

    def _delegate_completed(self, p: DelegateCompleted, e: Envelope[Any]) -> list[ui.Chunk]:
        return self._worker_ended(p.tool_use_id, p.worker_session_id, "completed", result=p.result)

    def _delegate_failed(self, p: DelegateFailed, e: Envelope[Any]) -> list[ui.Chunk]:
        worker, why = p.worker_session_id, {"failureMode": p.failure_mode, "message": p.message}
        return self._worker_ended(p.tool_use_id, worker, "failed", **why)

    def _worker_ended(self, call: str, worker: str, state: str, **data: Any) -> list[ui.Chunk]:
        if call in self._running:
            self._running.remove(call)
        return self._worker(call, worker, state=state, **data)

    def _worker(self, call: str, worker: str, **data: Any) -> list[ui.Chunk]:
        """A worker's ``data-delegate`` part, replaced in place as it runs and ends."""
        part = {"toolCallId": call, "sessionId": worker, **data}
        return [ui.Data(name="delegate", id=worker, data=part)]

    def _close_unrun(self) -> list[ui.Chunk]:
        """The calls whose input came and whose tool never ran: the turn ended first (§8)."""
        ended = [call for call in self._calls.unrun if call not in self._asked]  # (not the waiting)
        for call in ended:
            del self._calls.unrun[call]
        text = "cancelled: the turn ended first"
        return [ui.ToolOutputError(tool_call_id=call, error_text=text) for call in ended]

    def _finish(self, reason: str, **more: Any) -> ui.Finish:
        meta = {"gateway": {"turnId": self.turn_id, "lastEventId": self.last_event_id, **more}}
        return ui.Finish(finish_reason=reason, message_metadata=meta)

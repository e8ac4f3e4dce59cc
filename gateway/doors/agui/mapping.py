"""The gateway's events as AG-UI events: one run, sans-IO (docs/doors/agui.md).

:class:`RunMapper` is fed the session's events (docs/protocol.md sections 5, 7 and 8)
with :meth:`RunMapper.receive` and answers the AG-UI events they become; it
holds no socket and never awaits, so it is tested event by event against the
recorded traces (tests/unit/doors/agui/test_agui_mapping.py). The run is the turn: events of
any other turn, and the event types it has no use for, map to nothing.

=============================  ===============================================
gateway                        AG-UI
=============================  ===============================================
(the run begins)               ``RUN_STARTED``; ``MESSAGES_SNAPSHOT`` when the
                               thread has history
``llm.call_started``           ``STEP_STARTED`` (``stepName``: the call id)
``llm.call_completed``,        ``STEP_FINISHED``
``llm.call_failed``
``text.start/delta/end``       ``TEXT_MESSAGE_START/CONTENT/END``, one message
                               per text block
``thinking.*``                 ``REASONING_START``, ``REASONING_MESSAGE_START/
                               CONTENT/END``, ``REASONING_END``; a signature
                               is a ``REASONING_ENCRYPTED_VALUE``
``thinking.*`` (redacted)      ``REASONING_START``, ``REASONING_ENCRYPTED_VALUE``
                               (the opaque data), ``REASONING_END``
``tool.use_start/input_delta/  ``TOOL_CALL_START/ARGS/END`` (no delta streamed:
end``                          one ``ARGS`` with the final input)
``tool.completed``,            ``TOOL_CALL_RESULT``; a result with ``files``
``tool.failed``                has parts for content: its text, then each
                               file by its URL (``image``, ``document``,
                               ``audio`` parts, ``source`` a ``url``)
``message.complete``           closes what a cancel left open
``permission.requested``       an ``Interrupt``; :meth:`RunMapper.pause` ends
                               the run with ``RUN_FINISHED`` whose outcome is
                               ``interrupt``. A tool approval's ``reason`` is
                               ``tool_approval``; an MCP elicitation's
                               (``kind: "elicitation"``, section 11) is
                               ``elicitation``, with the server's ``message``
                               and a ``responseSchema`` whose ``content`` is
                               its ``requested_schema``; an MCP sampling
                               request's is ``sampling``, a URL-mode
                               elicitation's ``elicitation_url``, with the
                               message and the request's ``input`` (the URL:
                               ``metadata.url``) and the decision schema
``tool.progress``              ``CUSTOM`` named ``gateway.tool_progress``, the
                               payload as its ``value`` (a running tool's
                               progress, docs/protocol.md §11)
``context.compacting``,        ``CUSTOM`` named ``gateway.context_compacting``
``context.compacted``          / ``gateway.context_compacted``, the payload as
                               its ``value`` (AG-UI has no compaction event;
                               one between turns belongs to no run)
``turn.completed``             ``RUN_FINISHED`` (``success``), or ``RUN_ERROR``
                               when its ``stop_reason`` is ``error``
``turn.cancelled``             ``RUN_FINISHED`` (``cancelled``)
=============================  ===============================================

Ids: a text block's message is the gateway message's id for its first text
block and ``{message_id}:{index}`` for any later one; a thinking block's is
``{message_id}:{index}``; a tool result's message is ``{tool_use_id}:result``.
:func:`agui_messages` gives stored messages the same ids, so a snapshot and a
live run name the same things alike. A ``context`` message (a compaction's
summary, docs/protocol.md §12) is left out of ``MESSAGES_SNAPSHOT``: the
messages it replaces are all there, and the summary is the model's view of
them, not the conversation (a client that sent the snapshot's messages back as
input would repeat the history twice over).
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from gateway.doors.agui import shapes as ag
from gateway.doors.attachments import file_url
from gateway.protocol.events import (
    ContextCompacted,
    ContextCompacting,
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
from gateway.protocol.fit import cut_message
from gateway.protocol.frames import encode
from gateway.protocol.projection import (
    Block,
    BlockEmitter,
    BlockKind,
    Emitters,
    Handler,
    Projection,
)
from gateway.protocol.shapes import (
    AudioBlock,
    DocumentBlock,
    FileBlock,
    ImageBlock,
    Message,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)

APPROVAL_REASON = "tool_approval"
"""The ``reason`` of an interrupt for a tool call that waits for approval."""

ELICITATION_REASON = "elicitation"
"""The ``reason`` of an interrupt for an MCP server's question (docs/protocol.md §11)."""

COMPACTING, COMPACTED = "gateway.context_compacting", "gateway.context_compacted"
"""The ``name`` of the ``CUSTOM`` events of a compaction (docs/protocol.md §12)."""

TOOL_PROGRESS = "gateway.tool_progress"
"""The ``name`` of the ``CUSTOM`` event of a running tool's progress (docs/protocol.md §11)."""

DECISION_SCHEMA: dict[str, object] = {
    "type": "object",
    "properties": {"decision": {"enum": ["allow", "deny"]}},
    "required": ["decision"],
}
"""The ``responseSchema`` of an approval interrupt: what a resume entry's ``payload`` holds."""


def elicitation_schema(requested: dict[str, object]) -> dict[str, object]:
    """The ``responseSchema`` of an elicitation: a decision, and with ``allow`` the content."""
    return {
        "type": "object",
        "properties": {"decision": {"enum": ["allow", "deny"]}, "content": requested},
        "required": ["decision"],
    }


def text_message_id(message_id: str, index: int, first_text: int | None) -> str:
    """The AG-UI message of a text block (module docstring, "Ids")."""
    return message_id if first_text is None or index == first_text else f"{message_id}:{index}"


def reasoning_message_id(message_id: str, index: int) -> str:
    return f"{message_id}:{index}"


def result_message_id(tool_use_id: str) -> str:
    return f"{tool_use_id}:result"


def iso_ms(ms: int) -> str:
    """Milliseconds since the epoch as ISO 8601 (an interrupt's ``expiresAt``)."""
    moment = datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


class _TextMessages:
    """A text block as ``TEXT_MESSAGE_START/CONTENT/END`` (module docstring, "Ids")."""

    def __init__(self) -> None:
        self._first: dict[str, int] = {}  # a message's first text block

    def name(self, b: Block) -> str:
        first = self._first.setdefault(b.message_id, b.index)
        return text_message_id(b.message_id, b.index, first)

    def start(self, b: Block, ts: int) -> list[ag.AguiEvent]:
        return [ag.TextMessageStart(message_id=b.id, timestamp=ts)]

    def delta(self, b: Block, text: str, ts: int) -> list[ag.AguiEvent]:
        return [ag.TextMessageContent(message_id=b.id, delta=text, timestamp=ts)]

    def end(self, b: Block, ts: int | None) -> list[ag.AguiEvent]:
        return [ag.TextMessageEnd(message_id=b.id, timestamp=ts)]


class _Reasoning:
    """A thinking block as ``REASONING_*``; a redacted one has no message, only its value."""

    def name(self, b: Block) -> str:
        return reasoning_message_id(b.message_id, b.index)

    def start(self, b: Block, ts: int) -> list[ag.AguiEvent]:
        out: list[ag.AguiEvent] = [ag.ReasoningStart(message_id=b.id, timestamp=ts)]
        if b.kind == "thinking":
            out.append(ag.ReasoningMessageStart(message_id=b.id, role="reasoning", timestamp=ts))
        return out

    def delta(self, b: Block, text: str, ts: int) -> list[ag.AguiEvent]:
        return [ag.ReasoningMessageContent(message_id=b.id, delta=text, timestamp=ts)]

    def end(self, b: Block, ts: int | None) -> list[ag.AguiEvent]:
        out: list[ag.AguiEvent] = []
        if b.kind == "thinking":
            out.append(ag.ReasoningMessageEnd(message_id=b.id, timestamp=ts))
        opaque = "".join(b.data) if b.kind == "redacted" else b.signature
        if opaque:
            out.append(
                ag.ReasoningEncryptedValue(
                    subtype="message", entity_id=b.id, encrypted_value=opaque, timestamp=ts
                )
            )
        out.append(ag.ReasoningEnd(message_id=b.id, timestamp=ts))
        return out


class _ToolCalls:
    """A tool block as ``TOOL_CALL_START/ARGS/END``, cut or not."""

    def name(self, b: Block) -> str:
        return b.tool_use_id

    def start(self, b: Block, ts: int) -> list[ag.AguiEvent]:
        return [
            ag.ToolCallStart(
                tool_call_id=b.id,
                tool_call_name=b.tool_name,
                parent_message_id=b.message_id,
                timestamp=ts,
            )
        ]

    def delta(self, b: Block, text: str, ts: int) -> list[ag.AguiEvent]:
        return [ag.ToolCallArgs(tool_call_id=b.id, delta=text, timestamp=ts)]

    def end(self, b: Block, ts: int | None) -> list[ag.AguiEvent]:
        return [ag.ToolCallEnd(tool_call_id=b.id, timestamp=ts)]


class _Steps:
    def start(self, call_id: str, ts: int) -> list[ag.AguiEvent]:
        return [ag.StepStarted(step_name=call_id, timestamp=ts)]

    def end(self, call_id: str, ts: int | None) -> list[ag.AguiEvent]:
        return [ag.StepFinished(step_name=call_id, timestamp=ts)]


@dataclass
class RunMapper:
    """One AG-UI run over one gateway turn (module docstring).

    The turn's walk (its filter, blocks, steps, closing) is the shared
    :class:`~gateway.protocol.projection.Projection`; this class gives it
    AG-UI's emitters and handles the rest: tool results, interrupts,
    compaction, the run's end.

    Args:
        thread_id: the run's thread (the gateway session).
        run_id: the client's run id.
        turn_id: the turn this run streams; events of other turns map to nothing.
        file_base: what a file's URL begins with (``[server] public_url``; empty:
            the file route's path, docs/doors/agui.md "Files").
    """

    thread_id: str
    run_id: str
    turn_id: str
    file_base: str = ""
    _interrupts: dict[str, ag.Interrupt] = field(default_factory=dict)
    _turn: Projection[ag.AguiEvent] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        reasoning = _Reasoning()
        blocks: dict[BlockKind, BlockEmitter[ag.AguiEvent]] = {
            "text": _TextMessages(), "thinking": reasoning, "redacted": reasoning,
            "tool": _ToolCalls(),
        }  # fmt: skip
        events: dict[type[Payload], Handler[ag.AguiEvent]] = {
            ToolCompleted: self._tool_completed,
            ToolFailed: self._tool_failed,
            PermissionRequested: self._asked,
            PermissionResolved: self._resolved,
            ContextCompacting: self._compacting,
            ContextCompacted: self._compacted,
            ToolProgress: self._progress,
            TurnCompleted: self._completed,
            TurnCancelled: self._cancelled,
        }
        self._turn = Projection(self.thread_id, self.turn_id, Emitters(blocks, _Steps(), events))

    @property
    def finished(self) -> bool:
        """The run has ended: nothing more is mapped."""
        return self._turn.finished

    def start(
        self,
        history: Sequence[Message] = (),
        ts: int | None = None,
        max_bytes: int | None = None,
    ) -> list[ag.AguiEvent]:
        """``RUN_STARTED``, then ``MESSAGES_SNAPSHOT`` of ``history`` when there is any.

        With ``max_bytes`` (``[stream] snapshot_max_bytes``) the snapshot event
        fits it as a native snapshot frame does (docs/protocol.md §15,
        :func:`fitting_snapshot`).
        """
        out: list[ag.AguiEvent] = [
            ag.RunStarted(thread_id=self.thread_id, run_id=self.run_id, timestamp=ts)
        ]
        if history:
            if max_bytes is None:
                messages = agui_messages(history, self.file_base)
                out.append(ag.MessagesSnapshot(messages=messages, timestamp=ts))
            else:
                out.append(fitting_snapshot(history, ts, max_bytes, self.file_base))
        return out

    def receive(self, event: Envelope[Any]) -> list[ag.AguiEvent]:
        """The AG-UI events of one gateway event (nothing once the run has finished).

        ``event`` is an :class:`~gateway.protocol.events.Event`, or an envelope
        whose payload was read into its type's struct (:mod:`gateway.doors.oneway`).
        """
        return self._turn.receive(event)

    def pause(self, ts: int | None = None) -> list[ag.AguiEvent]:
        """End the run with the interrupt outcome if an approval is waiting, else nothing.

        Called once the events that were ready have been received (the IO
        layer's queue is momentarily empty), so the approvals of tools called
        together end the run together.
        """
        if self.finished or not self._interrupts:
            return []
        out = self._turn.end(ts)
        outcome = ag.InterruptOutcome(list(self._interrupts.values()))
        out.append(self._finished(outcome, ts))
        return out

    def closed(self, code: str, message: str, ts: int | None = None) -> list[ag.AguiEvent]:
        """End the run with ``RUN_ERROR``: its stream was closed (the session deleted, moved)."""
        if self.finished:
            return []
        return [*self._turn.end(ts), ag.RunError(message=message, code=code, timestamp=ts)]

    def idle_finish(self, ts: int | None = None) -> ag.RunFinished:
        """``RUN_FINISHED`` (success) of a run that started no turn: nothing was left to do."""
        self._turn.finished = True
        return self._finished(ag.SuccessOutcome(), ts)

    def _finished(self, outcome: ag.Outcome, ts: int | None) -> ag.RunFinished:
        return ag.RunFinished(
            thread_id=self.thread_id, run_id=self.run_id, outcome=outcome, timestamp=ts
        )

    def started(self, message_id: str, index: int) -> bool:
        """Whether this run has started the block (a replay rebuilds the others)."""
        return self._turn.started(message_id, index)

    def rebuilt(self, event: Envelope[Any]) -> list[ag.AguiEvent]:
        """The AG-UI events of the blocks of a whole message the run has not started."""
        return self._turn.rebuilt(event)

    @property
    def interrupts(self) -> list[str]:
        """The perm ids waiting for an answer, as far as this run saw."""
        return list(self._interrupts)

    # --- the events of AG-UI's own (the projection's table) ---------------------------

    def _tool_completed(self, p: ToolCompleted, e: Envelope[Any]) -> list[ag.AguiEvent]:
        if not p.files:
            return [_result(p.tool_use_id, p.result, e.ts)]
        parts = result_parts(p.result, p.files, e.session_id, self.file_base)
        return [_result(p.tool_use_id, parts, e.ts)]

    def _tool_failed(self, p: ToolFailed, e: Envelope[Any]) -> list[ag.AguiEvent]:
        return [_result(p.tool_use_id, f"{p.error_class}: {p.message}", e.ts)]

    def _asked(self, p: PermissionRequested, e: Envelope[Any]) -> list[ag.AguiEvent]:
        self._interrupts[p.perm_id] = interrupt(p)
        return []

    def _resolved(self, p: PermissionResolved, e: Envelope[Any]) -> list[ag.AguiEvent]:
        self._interrupts.pop(p.perm_id, None)
        return []

    def _compacting(self, p: ContextCompacting, e: Envelope[Any]) -> list[ag.AguiEvent]:
        return [ag.Custom(name=COMPACTING, value=msgspec.to_builtins(p), timestamp=e.ts)]

    def _compacted(self, p: ContextCompacted, e: Envelope[Any]) -> list[ag.AguiEvent]:
        return [ag.Custom(name=COMPACTED, value=msgspec.to_builtins(p), timestamp=e.ts)]

    def _progress(self, p: ToolProgress, e: Envelope[Any]) -> list[ag.AguiEvent]:
        return [ag.Custom(name=TOOL_PROGRESS, value=msgspec.to_builtins(p), timestamp=e.ts)]

    def _cancelled(self, p: TurnCancelled, e: Envelope[Any]) -> list[ag.AguiEvent]:
        return [*self._turn.end(e.ts), self._finished(ag.CancelledOutcome(), e.ts)]

    def _completed(self, p: TurnCompleted, e: Envelope[Any]) -> list[ag.AguiEvent]:
        out = self._turn.end(e.ts)
        if p.stop_reason != "error":
            return [*out, self._finished(ag.SuccessOutcome(), e.ts)]
        failure = self._turn.failure
        message = failure.message if failure else "the turn ended with an error"
        code = failure.error_class if failure else "error"
        return [*out, ag.RunError(message=message, code=code, timestamp=e.ts)]


def interrupt(p: PermissionRequested) -> ag.Interrupt:
    """The interrupt of a request: an MCP elicitation's, or a tool approval's (module docstring)."""
    if p.kind in ("sampling", "elicitation_url"):  # an MCP server's (docs/protocol.md §11)
        return ag.Interrupt(
            id=p.perm_id,
            reason=p.kind,
            message=p.message if isinstance(p.message, str) else None,
            tool_call_id=p.tool_use_id,
            response_schema=DECISION_SCHEMA,
            expires_at=iso_ms(p.expires_at),
            metadata={"tool_name": p.tool_name, **p.input},
        )
    if p.kind == "elicitation":
        requested = p.requested_schema
        return ag.Interrupt(
            id=p.perm_id,
            reason=ELICITATION_REASON,
            message=p.message if isinstance(p.message, str) else None,
            tool_call_id=p.tool_use_id,
            response_schema=elicitation_schema(
                requested if isinstance(requested, dict) else {"type": "object"}
            ),
            expires_at=iso_ms(p.expires_at),
            metadata={"tool_name": p.tool_name},
        )
    return ag.Interrupt(
        id=p.perm_id,
        reason=APPROVAL_REASON,
        message=f"Allow {p.tool_name} with {msgspec.json.encode(p.input).decode()}?",
        tool_call_id=p.tool_use_id,
        response_schema=DECISION_SCHEMA,
        expires_at=iso_ms(p.expires_at),
    )


def file_parts(
    blocks: Iterable[FileBlock], session_id: str, base: str = ""
) -> list[ag.ContentPart]:
    """Files as AG-UI 1.0 media parts: each a ``url`` source, the file route's
    (docs/doors/agui.md "Files"), its ``metadata`` the gateway's ``fileId`` and ``size``."""
    out: list[ag.ContentPart] = []
    for b in blocks:
        source = ag.UrlSource(file_url(base, session_id, b.file_id), b.media_type)
        meta: dict[str, Any] = {"fileId": b.file_id, "size": b.size}
        if isinstance(b, ImageBlock):
            out.append(ag.ImagePart(source=source, metadata=meta))
        elif isinstance(b, AudioBlock):
            out.append(ag.AudioPart(source=source, metadata=meta))
        else:
            out.append(ag.DocumentPart(source=source, metadata=meta))
    return out


def result_parts(
    text: str, files: Iterable[FileBlock], session_id: str, base: str = ""
) -> list[ag.ContentPart]:
    """A tool result with files: its text (when it has any), then its files."""
    lead: list[ag.ContentPart] = [ag.TextPart(text)] if text else []
    return [*lead, *file_parts(files, session_id, base)]


def _result(tool_use_id: str, content: str | list[ag.ContentPart], ts: int) -> ag.ToolCallResult:
    return ag.ToolCallResult(
        message_id=result_message_id(tool_use_id),
        tool_call_id=tool_use_id,
        content=content,
        timestamp=ts,
    )


def fitting_snapshot(
    history: Sequence[Message], ts: int | None, max_bytes: int, file_base: str = ""
) -> ag.MessagesSnapshot:
    """``MESSAGES_SNAPSHOT`` of the newest of ``history`` whose JSON fits ``max_bytes``.

    As a native snapshot (docs/protocol.md §15): older messages are left out
    first, each gateway message measured once as the AG-UI messages it
    becomes, from the newest back; when even the newest does not fit alone,
    its blocks are cut (:func:`gateway.protocol.fit.cut_message`). AG-UI has
    no ``has_more`` nor a truncated mark: an AG-UI client sees the newest
    history that fits, and the rest with ``GET /sessions/{id}/messages``.
    """
    room = max_bytes - len(ag.encode(ag.MessagesSnapshot(messages=[], timestamp=ts)))
    kept: list[list[ag.AguiMessage]] = []
    used = 0
    for message in reversed(history):
        converted = agui_messages([message], file_base)
        size = sum(len(msgspec.json.encode(m)) + 1 for m in converted)  # a comma each
        if used + size <= room:
            kept.append(converted)
            used += size
            continue
        if not kept:  # the newest alone does not fit: cut it until it does
            budget = len(encode(message)) - (size - room)
            for _ in range(4):  # the AG-UI form's overhead differs a little: settle on it
                cut, _fits = cut_message(message, budget)
                converted = agui_messages([cut], file_base)
                size = sum(len(msgspec.json.encode(m)) + 1 for m in converted)
                if size <= room:
                    kept.append(converted)
                    break
                budget -= size - room
        break
    messages = [m for converted in reversed(kept) for m in converted]
    return ag.MessagesSnapshot(messages=messages, timestamp=ts)


def agui_messages(messages: Iterable[Message], file_base: str = "") -> list[ag.AguiMessage]:
    """Stored gateway messages as AG-UI messages, with the ids a live run gives them.

    A user message of text is a ``user`` message (with files, its content is
    parts: text, and each file by its URL, :func:`file_parts`, after
    ``file_base``); its tool results are each a ``tool`` message (with files,
    parts as well); an assistant message is its thinking blocks as
    ``reasoning`` messages, then one ``assistant`` message (its first text and
    every tool call), then one more per later text block. A ``context`` message
    (docs/protocol.md §12) is left out: it is the model's summary of messages
    that are all still here.
    """
    out: list[ag.AguiMessage] = []
    for m in messages:
        if m.role == "context":
            continue  # the model's view of older messages, not the conversation (module docstring)
        if m.role == "user":
            said = _user_content(m, file_base)
            if said:
                out.append(ag.UserMessage(id=m.client_id or m.id, content=said))
            for b in m.content:
                if isinstance(b, ToolResultBlock):
                    files = b.files or []
                    out.append(
                        ag.ToolMessage(
                            id=result_message_id(b.tool_use_id),
                            content=result_parts(b.content, files, m.session_id, file_base)
                            if files
                            else b.content,
                            tool_call_id=b.tool_use_id,
                            error=b.content if b.is_error else None,
                        )
                    )
            continue
        first_text = next((i for i, b in enumerate(m.content) if isinstance(b, TextBlock)), None)
        calls: list[ag.ToolCall] = []
        later: list[ag.AguiMessage] = []
        for i, b in enumerate(m.content):
            if isinstance(b, ThinkingBlock):
                out.append(
                    ag.ReasoningMessage(
                        id=reasoning_message_id(m.id, i),
                        content=b.thinking,
                        encrypted_value=b.signature or None,
                    )
                )
            elif isinstance(b, RedactedThinkingBlock):
                out.append(
                    ag.ReasoningMessage(
                        id=reasoning_message_id(m.id, i), content="", encrypted_value=b.data
                    )
                )
            elif isinstance(b, ToolUseBlock):
                args = msgspec.json.encode(b.input).decode()
                calls.append(ag.ToolCall(id=b.id, function=ag.FunctionCall(b.name, args)))
            elif isinstance(b, TextBlock) and i != first_text:
                later.append(
                    ag.AssistantMessage(id=text_message_id(m.id, i, first_text), content=b.text)
                )
        text = m.content[first_text] if first_text is not None else None
        if text is not None or calls:
            out.append(
                ag.AssistantMessage(
                    id=m.id,
                    content=text.text if isinstance(text, TextBlock) else None,
                    tool_calls=calls or None,
                )
            )
        out += later
    return out


def _user_content(m: Message, file_base: str) -> str | list[ag.ContentPart]:
    """A user message's content as AG-UI's: its text, or, with files, its parts in order."""
    if not any(isinstance(b, ImageBlock | DocumentBlock | AudioBlock) for b in m.content):
        return "".join(b.text for b in m.content if isinstance(b, TextBlock))
    parts: list[ag.ContentPart] = []
    for b in m.content:
        if isinstance(b, TextBlock):
            parts.append(ag.TextPart(b.text))
        elif isinstance(b, ImageBlock | DocumentBlock | AudioBlock):
            parts += file_parts([b], m.session_id, file_base)
    return parts

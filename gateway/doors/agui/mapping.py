"""The gateway's events as AG-UI events: one run, sans-IO (docs/protocol.md "AG-UI").

:class:`RunMapper` is fed the session's events (docs/protocol.md sections 5, 7 and 8)
with :meth:`RunMapper.receive` and answers the AG-UI events they become; it
holds no socket and never awaits, so it is tested event by event against the
recorded traces (tests/unit/agui/test_agui_mapping.py). The run is the turn: events of
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
``tool.completed``,            ``TOOL_CALL_RESULT``
``tool.failed``
``message.complete``           closes what a cancel left open
``permission.requested``       an ``Interrupt``; :meth:`RunMapper.pause` ends
                               the run with ``RUN_FINISHED`` whose outcome is
                               ``interrupt``. A tool approval's ``reason`` is
                               ``tool_approval``; an MCP elicitation's
                               (``kind: "elicitation"``, section 11) is
                               ``elicitation``, with the server's ``message``
                               and a ``responseSchema`` whose ``content`` is
                               its ``requested_schema``
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
from gateway.protocol.events import (
    ContextCompacted,
    ContextCompacting,
    Envelope,
    LlmCallCompleted,
    LlmCallFailed,
    LlmCallStarted,
    MessageComplete,
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
from gateway.protocol.fit import cut_message
from gateway.protocol.frames import encode
from gateway.protocol.shapes import (
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


@dataclass
class _Block:
    kind: str  # "text", "thinking", "redacted", "tool"
    agui_id: str
    data: list[str] = field(default_factory=list)  # redacted data, or a tool's args so far


@dataclass
class RunMapper:
    """One AG-UI run over one gateway turn (module docstring).

    Args:
        thread_id: the run's thread (the gateway session).
        run_id: the client's run id.
        turn_id: the turn this run streams; events of other turns map to nothing.
    """

    thread_id: str
    run_id: str
    turn_id: str
    finished: bool = False
    _blocks: dict[tuple[str, int], _Block] = field(default_factory=dict)
    _first_text: dict[str, int] = field(default_factory=dict)
    _steps: list[str] = field(default_factory=list)
    _interrupts: dict[str, ag.Interrupt] = field(default_factory=dict)
    _failure: LlmCallFailed | None = None
    _seen: set[tuple[str, int]] = field(default_factory=set)  # every block started

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
                out.append(ag.MessagesSnapshot(messages=agui_messages(history), timestamp=ts))
            else:
                out.append(fitting_snapshot(history, ts, max_bytes))
        return out

    def receive(self, event: Envelope[Any]) -> list[ag.AguiEvent]:
        """The AG-UI events of one gateway event (nothing once the run has finished).

        ``event`` is an :class:`~gateway.protocol.events.Event`, or an envelope
        whose payload was read into its type's struct (:mod:`gateway.agui.sse`).
        """
        p, ts = event.payload, event.ts
        if self.finished:
            return []
        if event.turn_id != self.turn_id:
            # A delegated worker's request reaches its ancestors' streams (PROTOCOL
            # section 5) and is answered from there: it interrupts this run too.
            worker_request = event.session_id != self.thread_id
            if not (worker_request and isinstance(p, PermissionRequested | PermissionResolved)):
                return []
        if isinstance(p, TextStart | TextDelta | TextEnd):
            return self._text(p, ts)
        if isinstance(p, ThinkingStart | ThinkingDelta | ThinkingEnd):
            return self._thinking(p, ts)
        if isinstance(p, ToolUseStart | ToolUseInputDelta | ToolUseEnd):
            return self._tool_use(p, ts)
        if isinstance(p, MessageComplete):
            return self._close_blocks(p.message_id, ts)
        if isinstance(p, LlmCallStarted):
            self._steps.append(p.call_id)
            return [ag.StepStarted(step_name=p.call_id, timestamp=ts)]
        if isinstance(p, LlmCallCompleted | LlmCallFailed):
            if isinstance(p, LlmCallFailed):
                self._failure = p
            if p.call_id not in self._steps:
                return []
            self._steps.remove(p.call_id)
            return [ag.StepFinished(step_name=p.call_id, timestamp=ts)]
        if isinstance(p, ToolCompleted):
            return [_result(p.tool_use_id, p.result, ts)]
        if isinstance(p, ToolFailed):
            return [_result(p.tool_use_id, f"{p.error_class}: {p.message}", ts)]
        if isinstance(p, PermissionRequested) and p.kind == "elicitation":
            requested = p.requested_schema
            self._interrupts[p.perm_id] = ag.Interrupt(
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
            return []
        if isinstance(p, ContextCompacting | ContextCompacted):
            name = COMPACTING if isinstance(p, ContextCompacting) else COMPACTED
            return [ag.Custom(name=name, value=msgspec.to_builtins(p), timestamp=ts)]
        if isinstance(p, PermissionRequested):
            self._interrupts[p.perm_id] = ag.Interrupt(
                id=p.perm_id,
                reason=APPROVAL_REASON,
                message=f"Allow {p.tool_name} with {msgspec.json.encode(p.input).decode()}?",
                tool_call_id=p.tool_use_id,
                response_schema=DECISION_SCHEMA,
                expires_at=iso_ms(p.expires_at),
            )
            return []
        if isinstance(p, PermissionResolved):
            self._interrupts.pop(p.perm_id, None)
            return []
        if isinstance(p, TurnCompleted | TurnCancelled):
            return self._end(p, ts)
        return []

    def pause(self, ts: int | None = None) -> list[ag.AguiEvent]:
        """End the run with the interrupt outcome if an approval is waiting, else nothing.

        Called once the events that were ready have been received (the IO
        layer's queue is momentarily empty), so the approvals of tools called
        together end the run together.
        """
        if self.finished or not self._interrupts:
            return []
        self.finished = True
        out = self._close_all(ts)
        outcome = ag.InterruptOutcome(list(self._interrupts.values()))
        out.append(self._finished(outcome, ts))
        return out

    def closed(self, code: str, message: str, ts: int | None = None) -> list[ag.AguiEvent]:
        """End the run with ``RUN_ERROR``: its stream was closed (the session deleted, moved)."""
        if self.finished:
            return []
        self.finished = True
        return [*self._close_all(ts), ag.RunError(message=message, code=code, timestamp=ts)]

    def idle_finish(self, ts: int | None = None) -> ag.RunFinished:
        """``RUN_FINISHED`` (success) of a run that started no turn: nothing was left to do."""
        self.finished = True
        return self._finished(ag.SuccessOutcome(), ts)

    def _finished(self, outcome: ag.Outcome, ts: int | None) -> ag.RunFinished:
        return ag.RunFinished(
            thread_id=self.thread_id, run_id=self.run_id, outcome=outcome, timestamp=ts
        )

    def started(self, message_id: str, index: int) -> bool:
        """Whether this run has started the block (a replay rebuilds the others)."""
        return (message_id, index) in self._seen

    @property
    def interrupts(self) -> list[str]:
        """The perm ids waiting for an answer, as far as this run saw."""
        return list(self._interrupts)

    # --- blocks ----------------------------------------------------------------------

    def _text(self, p: TextStart | TextDelta | TextEnd, ts: int) -> list[ag.AguiEvent]:
        key = (p.message_id, p.content_block_index)
        if isinstance(p, TextStart):
            first = self._first_text.setdefault(p.message_id, p.content_block_index)
            block = _Block("text", text_message_id(p.message_id, p.content_block_index, first))
            self._blocks[key] = block
            self._seen.add(key)
            return [ag.TextMessageStart(message_id=block.agui_id, timestamp=ts)]
        found = self._blocks.get(key)
        if found is None:
            return []
        if isinstance(p, TextDelta):
            if not p.text:
                return []
            return [ag.TextMessageContent(message_id=found.agui_id, delta=p.text, timestamp=ts)]
        return self._close(key, ts)

    def _thinking(
        self, p: ThinkingStart | ThinkingDelta | ThinkingEnd, ts: int
    ) -> list[ag.AguiEvent]:
        key = (p.message_id, p.content_block_index)
        if isinstance(p, ThinkingStart):
            rid = reasoning_message_id(p.message_id, p.content_block_index)
            self._blocks[key] = _Block("redacted" if p.redacted else "thinking", rid)
            self._seen.add(key)
            out: list[ag.AguiEvent] = [ag.ReasoningStart(message_id=rid, timestamp=ts)]
            if not p.redacted:
                out.append(ag.ReasoningMessageStart(message_id=rid, role="reasoning", timestamp=ts))
            return out
        found = self._blocks.get(key)
        if found is None:
            return []
        if isinstance(p, ThinkingDelta):
            if found.kind == "redacted":
                found.data.append(p.text)
                return []
            if not p.text:
                return []
            rid = found.agui_id
            return [ag.ReasoningMessageContent(message_id=rid, delta=p.text, timestamp=ts)]
        return self._close(key, ts, p.signature)

    def _tool_use(
        self, p: ToolUseStart | ToolUseInputDelta | ToolUseEnd, ts: int
    ) -> list[ag.AguiEvent]:
        key = (p.message_id, p.content_block_index)
        if isinstance(p, ToolUseStart):
            self._blocks[key] = _Block("tool", p.tool_use_id)
            self._seen.add(key)
            return [
                ag.ToolCallStart(
                    tool_call_id=p.tool_use_id,
                    tool_call_name=p.tool_name,
                    parent_message_id=p.message_id,
                    timestamp=ts,
                )
            ]
        found = self._blocks.get(key)
        if found is None:
            return []
        if isinstance(p, ToolUseInputDelta):
            if not p.partial_json:
                return []
            found.data.append(p.partial_json)
            return [ag.ToolCallArgs(tool_call_id=p.tool_use_id, delta=p.partial_json, timestamp=ts)]
        out: list[ag.AguiEvent] = []
        if not found.data:  # no delta streamed: the arguments in one piece
            args = msgspec.json.encode(p.final_input).decode()
            out.append(ag.ToolCallArgs(tool_call_id=p.tool_use_id, delta=args, timestamp=ts))
            found.data.append(args)
        return out + self._close(key, ts)

    def _close(
        self, key: tuple[str, int], ts: int | None, signature: str | None = None
    ) -> list[ag.AguiEvent]:
        block = self._blocks.pop(key, None)
        if block is None:
            return []
        bid = block.agui_id
        if block.kind == "text":
            return [ag.TextMessageEnd(message_id=bid, timestamp=ts)]
        if block.kind == "tool":
            return [ag.ToolCallEnd(tool_call_id=bid, timestamp=ts)]
        out: list[ag.AguiEvent] = []
        if block.kind == "thinking":
            out.append(ag.ReasoningMessageEnd(message_id=bid, timestamp=ts))
        opaque = "".join(block.data) if block.kind == "redacted" else signature
        if opaque:
            out.append(
                ag.ReasoningEncryptedValue(
                    subtype="message", entity_id=bid, encrypted_value=opaque, timestamp=ts
                )
            )
        out.append(ag.ReasoningEnd(message_id=bid, timestamp=ts))
        return out

    def _close_blocks(self, message_id: str, ts: int | None) -> list[ag.AguiEvent]:
        """What a cancel or an error left open in ``message_id`` (docs/protocol.md §7, §8)."""
        out: list[ag.AguiEvent] = []
        for key in [k for k in self._blocks if k[0] == message_id]:
            out += self._close(key, ts)
        return out

    def _close_all(self, ts: int | None) -> list[ag.AguiEvent]:
        out: list[ag.AguiEvent] = []
        for key in list(self._blocks):
            out += self._close(key, ts)
        out += [ag.StepFinished(step_name=s, timestamp=ts) for s in self._steps]
        self._steps.clear()
        return out

    def _end(self, p: TurnCompleted | TurnCancelled, ts: int) -> list[ag.AguiEvent]:
        self.finished = True
        out = self._close_all(ts)
        if isinstance(p, TurnCancelled):
            outcome: ag.Outcome = ag.CancelledOutcome()
        elif p.stop_reason == "error":
            failure = self._failure
            message = failure.message if failure else "the turn ended with an error"
            code = failure.error_class if failure else "error"
            out.append(ag.RunError(message=message, code=code, timestamp=ts))
            return out
        else:
            outcome = ag.SuccessOutcome()
        out.append(self._finished(outcome, ts))
        return out


def _result(tool_use_id: str, content: str, ts: int) -> ag.ToolCallResult:
    return ag.ToolCallResult(
        message_id=result_message_id(tool_use_id),
        tool_call_id=tool_use_id,
        content=content,
        timestamp=ts,
    )


def fitting_snapshot(
    history: Sequence[Message], ts: int | None, max_bytes: int
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
        converted = agui_messages([message])
        size = sum(len(msgspec.json.encode(m)) + 1 for m in converted)  # a comma each
        if used + size <= room:
            kept.append(converted)
            used += size
            continue
        if not kept:  # the newest alone does not fit: cut it until it does
            budget = len(encode(message)) - (size - room)
            for _ in range(4):  # the AG-UI form's overhead differs a little: settle on it
                cut, _fits = cut_message(message, budget)
                converted = agui_messages([cut])
                size = sum(len(msgspec.json.encode(m)) + 1 for m in converted)
                if size <= room:
                    kept.append(converted)
                    break
                budget -= size - room
        break
    messages = [m for converted in reversed(kept) for m in converted]
    return ag.MessagesSnapshot(messages=messages, timestamp=ts)


def agui_messages(messages: Iterable[Message]) -> list[ag.AguiMessage]:
    """Stored gateway messages as AG-UI messages, with the ids a live run gives them.

    A user message of text is a ``user`` message; its tool results are each a
    ``tool`` message; an assistant message is its thinking blocks as
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
            texts = [b.text for b in m.content if isinstance(b, TextBlock)]
            if texts:
                out.append(ag.UserMessage(id=m.id, content="".join(texts)))
            for b in m.content:
                if isinstance(b, ToolResultBlock):
                    out.append(
                        ag.ToolMessage(
                            id=result_message_id(b.tool_use_id),
                            content=b.content,
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

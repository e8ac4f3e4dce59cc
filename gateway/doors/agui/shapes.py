"""The AG-UI shapes the gateway emits and accepts, declared once as msgspec Structs.

Names and fields follow the AG-UI 1.0 schema (``spec/1.0/schema.json``, the
source of the ``ag_ui.core`` models of the ``ag-ui-protocol`` package): camelCase
on the wire, optional fields left out rather than sent as ``null``.
tests/unit/doors/agui/test_agui_mapping.py checks every Struct here against those models.

Only what the gateway uses is declared: the events of docs/doors/agui.md,
the messages of a ``MESSAGES_SNAPSHOT``, and ``RunAgentInput`` (whose messages
are read leniently: only the last user message's text is used).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec


class _Event(msgspec.Struct, tag_field="type", rename="camel", omit_defaults=True):
    """Base of every event: ``timestamp`` is milliseconds since the epoch (the event's ``ts``)."""


# --- run lifecycle -----------------------------------------------------------------


class RunStarted(_Event, tag="RUN_STARTED", kw_only=True):
    thread_id: str
    run_id: str
    timestamp: int | None = None


class SuccessOutcome(msgspec.Struct, tag="success", tag_field="type"):
    """The run completed."""


class Interrupt(msgspec.Struct, rename="camel", omit_defaults=True, kw_only=True):
    """Something the run waits for: here, always a tool call's approval (a ``perm_id``)."""

    id: str
    reason: str
    message: str | None = None
    tool_call_id: str | None = None
    response_schema: dict[str, Any] | None = None
    expires_at: str | None = None
    metadata: dict[str, Any] | None = None


class InterruptOutcome(msgspec.Struct, tag="interrupt", tag_field="type"):
    """The run paused; the next run's ``resume`` answers every one of ``interrupts``."""

    interrupts: list[Interrupt]


class CancelledOutcome(msgspec.Struct, tag="cancelled", tag_field="type"):
    """The run was stopped (the turn was cancelled) and did not fail."""


Outcome = SuccessOutcome | InterruptOutcome | CancelledOutcome


class RunFinished(_Event, tag="RUN_FINISHED", kw_only=True):
    thread_id: str
    run_id: str
    outcome: Outcome | None = None
    timestamp: int | None = None


class RunError(_Event, tag="RUN_ERROR", kw_only=True):
    message: str
    code: str | None = None
    timestamp: int | None = None


class StepStarted(_Event, tag="STEP_STARTED", kw_only=True):
    step_name: str
    timestamp: int | None = None


class StepFinished(_Event, tag="STEP_FINISHED", kw_only=True):
    step_name: str
    timestamp: int | None = None


# --- text and reasoning ------------------------------------------------------------------
#
# Each field list is declared once, in wire order (a subclass's fields would
# follow ``timestamp``): the events of one message by its id, and its deltas.


class _OfMessage(_Event, kw_only=True):
    message_id: str
    timestamp: int | None = None


class _MessageDelta(_Event, kw_only=True):
    message_id: str
    delta: str
    timestamp: int | None = None


class TextMessageStart(_Event, tag="TEXT_MESSAGE_START", kw_only=True):
    message_id: str
    role: Literal["assistant"] = "assistant"
    timestamp: int | None = None


class TextMessageContent(_MessageDelta, tag="TEXT_MESSAGE_CONTENT"): ...


class TextMessageEnd(_OfMessage, tag="TEXT_MESSAGE_END"): ...


class ReasoningStart(_OfMessage, tag="REASONING_START"): ...


class ReasoningMessageStart(_Event, tag="REASONING_MESSAGE_START", kw_only=True):
    """``role`` is required (the schema says so; ``@ag-ui/client`` refuses it missing)."""

    message_id: str
    role: Literal["reasoning"]
    timestamp: int | None = None


class ReasoningMessageContent(_MessageDelta, tag="REASONING_MESSAGE_CONTENT"): ...


class ReasoningMessageEnd(_OfMessage, tag="REASONING_MESSAGE_END"): ...


class ReasoningEnd(_OfMessage, tag="REASONING_END"): ...


class ReasoningEncryptedValue(_Event, tag="REASONING_ENCRYPTED_VALUE", kw_only=True):
    subtype: Literal["tool-call", "message"]
    entity_id: str
    encrypted_value: str
    timestamp: int | None = None


# --- tool calls -------------------------------------------------------------------------


class ToolCallStart(_Event, tag="TOOL_CALL_START", kw_only=True):
    tool_call_id: str
    tool_call_name: str
    parent_message_id: str | None = None
    timestamp: int | None = None


class ToolCallArgs(_Event, tag="TOOL_CALL_ARGS", kw_only=True):
    tool_call_id: str
    delta: str
    timestamp: int | None = None


class ToolCallEnd(_Event, tag="TOOL_CALL_END", kw_only=True):
    tool_call_id: str
    timestamp: int | None = None


class ToolCallResult(_Event, tag="TOOL_CALL_RESULT", kw_only=True):
    message_id: str
    tool_call_id: str
    content: str | list[ContentPart]
    role: Literal["tool"] = "tool"
    timestamp: int | None = None


# --- messages (MESSAGES_SNAPSHOT) ---------------------------------------------------------


class _Message(msgspec.Struct, tag_field="role", rename="camel", omit_defaults=True):
    pass


class UrlSource(msgspec.Struct, tag="url", tag_field="type", rename="camel", omit_defaults=True):
    """Where a file's bytes are: here always the gateway's file route (docs/doors/agui.md)."""

    value: str
    mime_type: str | None = None


class _Part(msgspec.Struct, tag_field="type", rename="camel", omit_defaults=True):
    pass


class TextPart(_Part, tag="text"):
    text: str


class ImagePart(_Part, tag="image", kw_only=True):
    """A file of the session in a message: its URL, and ``metadata`` the gateway's block
    (``fileId``, ``size``); never the bytes."""

    source: UrlSource
    metadata: dict[str, Any] | None = None


class DocumentPart(_Part, tag="document", kw_only=True):
    source: UrlSource
    metadata: dict[str, Any] | None = None


class AudioPart(_Part, tag="audio", kw_only=True):
    source: UrlSource
    metadata: dict[str, Any] | None = None


ContentPart = TextPart | ImagePart | DocumentPart | AudioPart
"""A part of a message with files (AG-UI 1.0's ``ContentPart``): text, and files by URL."""


class UserMessage(_Message, tag="user", kw_only=True):
    id: str
    content: str | list[ContentPart]


class FunctionCall(msgspec.Struct):
    name: str
    arguments: str  # JSON text


class ToolCall(msgspec.Struct, kw_only=True):
    id: str
    function: FunctionCall
    type: Literal["function"] = "function"


class AssistantMessage(_Message, tag="assistant", kw_only=True):
    id: str
    content: str | None = None
    tool_calls: list[ToolCall] | None = None


class ToolMessage(_Message, tag="tool", kw_only=True):
    id: str
    content: str | list[ContentPart]
    tool_call_id: str
    error: str | None = None


class ReasoningMessage(_Message, tag="reasoning", kw_only=True):
    id: str
    content: str
    encrypted_value: str | None = None


AguiMessage = UserMessage | AssistantMessage | ToolMessage | ReasoningMessage


class MessagesSnapshot(_Event, tag="MESSAGES_SNAPSHOT", kw_only=True):
    messages: list[AguiMessage]
    timestamp: int | None = None


class Custom(_Event, tag="CUSTOM", kw_only=True):
    """An event AG-UI has no type for: ``name`` says which, ``value`` is its payload.

    The gateway's are a compaction's ``gateway.context_compacting`` and
    ``gateway.context_compacted`` (docs/protocol.md §12).
    """

    name: str
    value: Any = None
    timestamp: int | None = None


AguiEvent = (
    RunStarted
    | RunFinished
    | RunError
    | StepStarted
    | StepFinished
    | TextMessageStart
    | TextMessageContent
    | TextMessageEnd
    | ReasoningStart
    | ReasoningMessageStart
    | ReasoningMessageContent
    | ReasoningMessageEnd
    | ReasoningEnd
    | ReasoningEncryptedValue
    | ToolCallStart
    | ToolCallArgs
    | ToolCallEnd
    | ToolCallResult
    | MessagesSnapshot
    | Custom
)


# --- what a client sends ------------------------------------------------------------------


MESSAGE_ID_MAX = 256
"""The longest ``id`` of an input message: the run's user message keeps its own, to name
it by in ``MESSAGES_SNAPSHOT`` (docs/doors/agui.md "Ids")."""


class InputMessage(msgspec.Struct, kw_only=True):
    """Any message of ``RunAgentInput.messages``: only ``role`` and ``content`` are read.

    Other fields (``name``, ``toolCalls``, ...) are allowed and ignored: the
    gateway's own history is the thread's (docs/doors/agui.md).
    """

    role: str
    id: Annotated[str, msgspec.Meta(max_length=MESSAGE_ID_MAX)] | None = None
    content: Any = None


class InputTool(msgspec.Struct, kw_only=True):
    name: str
    description: str = ""
    parameters: Any = None


class InputContext(msgspec.Struct):
    description: str
    value: str


class ResumeEntry(msgspec.Struct, rename="camel", kw_only=True):
    """An answer to one interrupt of the previous run."""

    interrupt_id: str
    status: Literal["resolved", "cancelled"]
    payload: Any = None
    metadata: Any = None


RUN_ID_MAX = 256
"""The longest ``runId`` (a UUID is 36): a run's id is kept with its record
(gateway.doors.agui.runs), a resume run's too, which counts against no turn limit."""


class RunAgentInput(msgspec.Struct, rename="camel", kw_only=True):
    """The body of ``POST /agui`` (AG-UI ``RunAgentInput``)."""

    thread_id: str
    run_id: Annotated[str, msgspec.Meta(min_length=1, max_length=RUN_ID_MAX)]
    messages: list[InputMessage]
    tools: list[InputTool] = []
    context: list[InputContext] = []
    state: Any = None
    forwarded_props: Any = None
    resume: list[ResumeEntry] | None = None
    parent_run_id: str | None = None
    protocol_version: str | None = None


class CancelRun(msgspec.Struct, rename="camel", forbid_unknown_fields=True, kw_only=True):
    """The body of ``POST /agui/{thread_id}/cancel`` (optional)."""

    run_id: str | None = None
    reason: str | None = None


class RunCancelling(msgspec.Struct, kw_only=True):
    """The answer of ``POST /agui/{session_id}/cancel`` (a gateway shape: snake_case)."""

    session_id: str
    run_id: str | None
    turn_id: str
    status: Literal["cancelling"] = "cancelling"


_encoder = msgspec.json.Encoder()


def encode(event: AguiEvent) -> bytes:
    """One event's JSON."""
    return _encoder.encode(event)


__all__ = [name for name in dir() if name[0].isupper()] + ["encode"]

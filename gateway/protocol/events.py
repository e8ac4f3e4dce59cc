"""The event envelope and every event type (docs/protocol.md sections 4 and 5).

One table, :data:`EVENT_TYPES`, says for each type its payload struct, the
actor that emits it, and whether it is a persisted catalog event or a
streaming-only one. Everything else (filter validation, presets, the store's
choice of what to persist, the client's decoding) reads this table.

Payload structs are declared without a tag: the envelope's ``type`` says which
one a payload is. Fields the contract marks optional (``message_id?``,
``structured_result?``, ``comment?``) are omitted when unset; nullable fields
(``signature: str or null``) are always present.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar, get_args

import msgspec

from gateway.protocol.shapes import (
    ContentBlock,
    FileBlock,
    Message,
    PermissionKind,
    StopReason,
    Usage,
)

Actor = Literal["user", "router", "llm", "tool", "session", "bus"]
ACTORS: tuple[str, ...] = ("user", "router", "llm", "tool", "session", "bus")

LlmErrorClass = Literal[
    "cancelled", "overloaded", "rate_limited", "api_error", "network", "timeout", "invalid_request"
]


def error_label(error_class: str) -> str:
    """An LLM call's error class as ``gateway_provider_errors_total`` labels it: one of
    :data:`LlmErrorClass`, else ``other`` (a provider's own name stays out of the labels)."""
    return error_class if error_class in _LLM_ERROR_CLASSES else "other"


_LLM_ERROR_CLASSES = frozenset(get_args(LlmErrorClass))

# "limit": refused unrun, past a limit of docs/protocol.md §15 (docs/reference.md [limits]).
ToolErrorClass = Literal[
    "cancelled", "error", "timeout", "permission_denied", "unknown_tool", "invalid_input", "limit"
]
TurnPhase = Literal["llm", "tools", "seam", "queued"]


class Payload(msgspec.Struct):
    """Base of every payload struct."""


# --- catalog (persisted) -----------------------------------------------------


class TurnStarted(Payload):
    turn_id: str
    user_message: Message


class TurnQueued(Payload):
    """A turn accepted while another ran, waiting (docs/protocol.md §2 "A busy session");
    ``position`` 1 starts next."""

    turn_id: str
    position: int
    user_message: Message


class TurnSteered(Payload):
    """A message the running turn ``turn_id`` took, for its next model call (§2 "A busy
    session")."""

    turn_id: str
    user_message: Message


class HistoryRewound(Payload):
    """From ``before_message_id`` on, the messages left the conversation; turn ``turn_id``
    goes on from the history before it (docs/protocol.md §2 "Edit and regenerate")."""

    before_message_id: str
    turn_id: str


class RouteDecided(Payload):
    model: str
    reason: str
    policy_version: str


# Why a model call was made: absent for the turn's own calls; "sampling" for an MCP
# server's sampling request during a tool call (docs/protocol.md §11, "MCP tools").
CallPurpose = Literal["sampling"]


class LlmCallStarted(Payload):
    call_id: str
    model: str
    purpose: CallPurpose | msgspec.UnsetType = msgspec.UNSET


class LlmCallCompleted(Payload):
    call_id: str
    message_id: str
    stop_reason: StopReason
    usage: Usage
    purpose: CallPurpose | msgspec.UnsetType = msgspec.UNSET


class LlmCallFailed(Payload, omit_defaults=True):
    call_id: str
    error_class: LlmErrorClass
    message: str
    message_id: str | None = None
    purpose: CallPurpose | msgspec.UnsetType = msgspec.UNSET


class ToolCalled(Payload):
    tool_use_id: str
    tool_name: str
    input: dict[str, Any]


class ToolCompleted(Payload, omit_defaults=True):
    tool_use_id: str
    tool_name: str
    result: str
    duration_ms: int
    structured_result: Any = None
    # The files the tool returned (an MCP tool's image or audio), by reference
    # (docs/protocol.md §2 "Files"); left out when it returned none.
    files: list[FileBlock] | msgspec.UnsetType = msgspec.UNSET


class ToolFailed(Payload, omit_defaults=True):
    tool_use_id: str
    tool_name: str
    error_class: ToolErrorClass
    message: str
    duration_ms: int | None = None


class PermissionRequested(Payload, omit_defaults=True):
    """A tool waiting for approval, or an MCP server's elicitation (docs/protocol.md §5, §11).

    ``kind`` is always sent; ``message`` and ``requested_schema`` only with an
    elicitation.
    """

    perm_id: str
    tool_use_id: str
    tool_name: str
    input: dict[str, Any]
    expires_at: int
    kind: PermissionKind = msgspec.field(default_factory=lambda: "tool")
    message: str | msgspec.UnsetType = msgspec.UNSET
    requested_schema: dict[str, Any] | msgspec.UnsetType = msgspec.UNSET


PermissionDecision = Literal["allow", "deny", "timeout", "cancelled"]


class PermissionResolved(Payload):
    perm_id: str
    decision: PermissionDecision


CompactionTrigger = Literal["auto", "manual", "overflow"]


class ContextCompacting(Payload):
    """A compaction begins (docs/protocol.md §12)."""

    trigger: CompactionTrigger
    pre_tokens: int


class ContextCompacted(Payload):
    """A compaction ended: the model's view now starts at ``first_kept_message_id``."""

    trigger: CompactionTrigger
    method: Literal["summary", "truncate"]
    pre_tokens: int
    post_tokens: int
    summary_message_id: str | None
    first_kept_message_id: str | None


class DelegateStarted(Payload):
    tool_use_id: str
    worker_session_id: str
    task: str


class DelegateCompleted(Payload):
    tool_use_id: str
    worker_session_id: str
    result: str


class DelegateFailed(Payload):
    tool_use_id: str
    worker_session_id: str
    failure_mode: Literal["cancelled_by_user", "error", "timeout"]
    message: str


class SessionForked(Payload):
    """A fork's first event (docs/protocol.md §2, "Forks"): where its history comes from."""

    from_session_id: str
    at_message_id: str | None


class FeedbackRecorded(Payload, omit_defaults=True):
    message_id: str
    rating: Literal[-1, 1]
    comment: str | None = None


class TurnCompleted(Payload):
    """A turn's end: ``cost_usd`` includes its workers', ``workers_cost_usd`` is theirs."""

    turn_id: str
    stop_reason: StopReason
    usage: Usage
    cost_usd: float
    workers_cost_usd: float = 0.0


class TurnCancelled(Payload):
    turn_id: str
    reason: str
    phase: TurnPhase
    partial: bool


class BusHandlerWarning(Payload):
    subscription_name: str
    reason: str
    detail: str


class BusSubscriberUnregistered(Payload):
    subscription_name: str
    reason: str


# --- streaming-only ----------------------------------------------------------


class MessageStart(Payload):
    message_id: str
    role: Literal["assistant"]
    model: str


class TextStart(Payload):
    message_id: str
    content_block_index: int


class TextEnd(Payload):
    message_id: str
    content_block_index: int


class TextDelta(Payload):
    message_id: str
    content_block_index: int
    text: str


class ThinkingStart(Payload):
    message_id: str
    content_block_index: int
    redacted: bool


class ThinkingDelta(Payload):
    message_id: str
    content_block_index: int
    text: str
    signature: str | None


class ThinkingEnd(Payload):
    message_id: str
    content_block_index: int
    signature: str | None


class ToolUseStart(Payload):
    message_id: str
    content_block_index: int
    tool_use_id: str
    tool_name: str


class ToolUseInputDelta(Payload):
    message_id: str
    content_block_index: int
    tool_use_id: str
    partial_json: str


class ToolUseEnd(Payload):
    message_id: str
    content_block_index: int
    tool_use_id: str
    tool_name: str  # docs/protocol.md §5: a client that joined mid-block still learns the tool
    final_input: dict[str, Any]


class MessageComplete(Payload):
    message_id: str
    stop_reason: StopReason
    final_content: list[ContentBlock]
    usage: Usage


class MessageSnapshot(Payload):
    message: Message


class ToolProgress(Payload):
    """A running tool's progress (docs/protocol.md §5, §11 "MCP tools"): an MCP server's
    ``notifications/progress``, at most 10 a second per tool use, the last value kept."""

    tool_use_id: str
    progress: float
    total: float | None
    message: str | None


@dataclass(frozen=True, slots=True)
class EventSpec:
    """What the contract says of one event type."""

    payload: type[Payload]
    actor: Actor
    catalog: bool


EVENT_TYPES: dict[str, EventSpec] = {
    # catalog, docs/protocol.md §5
    "session.forked": EventSpec(SessionForked, "session", True),
    "turn.started": EventSpec(TurnStarted, "user", True),
    "turn.queued": EventSpec(TurnQueued, "user", True),
    "turn.steered": EventSpec(TurnSteered, "user", True),
    "history.rewound": EventSpec(HistoryRewound, "user", True),
    "route.decided": EventSpec(RouteDecided, "router", True),
    "llm.call_started": EventSpec(LlmCallStarted, "llm", True),
    "llm.call_completed": EventSpec(LlmCallCompleted, "llm", True),
    "llm.call_failed": EventSpec(LlmCallFailed, "llm", True),
    "tool.called": EventSpec(ToolCalled, "tool", True),
    "tool.completed": EventSpec(ToolCompleted, "tool", True),
    "tool.failed": EventSpec(ToolFailed, "tool", True),
    "permission.requested": EventSpec(PermissionRequested, "tool", True),
    "permission.resolved": EventSpec(PermissionResolved, "user", True),
    "context.compacting": EventSpec(ContextCompacting, "session", True),
    "context.compacted": EventSpec(ContextCompacted, "session", True),
    "delegate.started": EventSpec(DelegateStarted, "tool", True),
    "delegate.completed": EventSpec(DelegateCompleted, "tool", True),
    "delegate.failed": EventSpec(DelegateFailed, "tool", True),
    "feedback.recorded": EventSpec(FeedbackRecorded, "user", True),
    "turn.completed": EventSpec(TurnCompleted, "session", True),
    "turn.cancelled": EventSpec(TurnCancelled, "session", True),
    "bus.handler_warning": EventSpec(BusHandlerWarning, "bus", True),
    "bus.subscriber_unregistered": EventSpec(BusSubscriberUnregistered, "bus", True),
    # streaming-only
    "message.start": EventSpec(MessageStart, "llm", False),
    "text.start": EventSpec(TextStart, "llm", False),
    "text.delta": EventSpec(TextDelta, "llm", False),
    "text.end": EventSpec(TextEnd, "llm", False),
    "thinking.start": EventSpec(ThinkingStart, "llm", False),
    "thinking.delta": EventSpec(ThinkingDelta, "llm", False),
    "thinking.end": EventSpec(ThinkingEnd, "llm", False),
    "tool.use_start": EventSpec(ToolUseStart, "llm", False),
    "tool.use_input_delta": EventSpec(ToolUseInputDelta, "llm", False),
    "tool.use_end": EventSpec(ToolUseEnd, "llm", False),
    "message.complete": EventSpec(MessageComplete, "llm", False),
    "message.snapshot": EventSpec(MessageSnapshot, "llm", False),
    "tool.progress": EventSpec(ToolProgress, "tool", False),
}

CATALOG_TYPES: frozenset[str] = frozenset(t for t, s in EVENT_TYPES.items() if s.catalog)
STREAMING_TYPES: frozenset[str] = frozenset(t for t, s in EVENT_TYPES.items() if not s.catalog)


P = TypeVar("P")


class Envelope(msgspec.Struct, Generic[P]):
    """The envelope of docs/protocol.md §4, over a payload of type ``P``.

    Its fields are declared here only: :class:`Event` is the envelope the
    gateway emits, stores and sends, and the client's codec decodes
    ``Envelope[msgspec.Raw]`` first, then the payload with its type's decoder.
    """

    id: str
    type: str
    session_id: str
    turn_id: str | None
    ts: int
    actor: Actor
    payload: P


class Event(Envelope[Any]):
    """An event: the envelope with ``payload`` the type's payload struct."""


class StreamEvent(msgspec.Struct, frozen=True):
    """An event before the translator task has stamped it with id, session and time.

    The sans-IO cores (translator, turn sequences) produce these; the session's
    translator task turns each into an :class:`Event` at emission.
    """

    type: str
    payload: Payload


def stream_event(payload: Payload) -> StreamEvent:
    """Wrap a payload in a :class:`StreamEvent` of the one type it belongs to."""
    return StreamEvent(PAYLOAD_TYPE[type(payload)], payload)


# Payload struct -> its event type (each payload struct serves exactly one type).
PAYLOAD_TYPE: dict[type[Payload], str] = {spec.payload: t for t, spec in EVENT_TYPES.items()}
assert len(PAYLOAD_TYPE) == len(EVENT_TYPES), "a payload struct serves two event types"

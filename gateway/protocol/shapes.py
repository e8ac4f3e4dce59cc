"""The data shapes of docs/protocol.md §6: content blocks, messages, usage, sessions.

Each shape is declared once, as a ``msgspec.Struct``; the encoders and decoders
built from them are the only way these objects reach the wire. Optional fields
(``model?``, ``usage?``, the cache counters, ``cost_usd``) are omitted when
unset rather than sent as ``null``, as the contract writes them with a ``?``.
A required field is always sent, even when it holds its zero: "Usage counts
are always present, zeros included" (section 6).
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

# ``truncated`` (docs/protocol.md §15, "Snapshots that fit"): set only on a block
# that a snapshot frame or a ``message.snapshot`` had to cut to stay under
# ``[stream] snapshot_max_bytes``; the whole message is ``GET
# /sessions/{id}/messages/{message_id}``. Unset (left out of the JSON) everywhere
# else, so stored messages, events and provider history never carry it.
Truncated = bool | msgspec.UnsetType

PROTOCOL_VERSION = 1
"""The contract's version (docs/protocol.md §4), in ``subscribe_ack`` and ``GET /sessions/{id}``:
it changes only with a change that could break a client written against it."""


class TextBlock(msgspec.Struct, tag="text", tag_field="type"):
    text: str
    truncated: Truncated = msgspec.UNSET


class ThinkingBlock(msgspec.Struct, tag="thinking", tag_field="type"):
    thinking: str
    signature: str | None = None
    truncated: Truncated = msgspec.UNSET


class RedactedThinkingBlock(msgspec.Struct, tag="redacted_thinking", tag_field="type"):
    data: str
    truncated: Truncated = msgspec.UNSET


class ToolUseBlock(msgspec.Struct, tag="tool_use", tag_field="type"):
    id: str
    name: str
    input: dict[str, Any]
    # A cut tool_use has ``input: {}`` (a prefix of JSON is not JSON).
    truncated: Truncated = msgspec.UNSET


class ImageBlock(msgspec.Struct, tag="image", tag_field="type"):
    """An image of a turn or a tool result (docs/protocol.md §2 "Files"): a reference to
    a file of the session, never its bytes (``GET /sessions/{id}/files/{file_id}``)."""

    file_id: str
    media_type: str
    size: int
    truncated: Truncated = msgspec.UNSET


class DocumentBlock(msgspec.Struct, tag="document", tag_field="type"):
    """A document (PDF or text) of a turn (docs/protocol.md §2 "Files"): a file reference."""

    file_id: str
    media_type: str
    size: int
    truncated: Truncated = msgspec.UNSET


class AudioBlock(msgspec.Struct, tag="audio", tag_field="type"):
    """Audio a tool returned (docs/protocol.md §2 "Files"): stored, shown to clients,
    sent to no model (none of the gateway's providers takes audio)."""

    file_id: str
    media_type: str
    size: int
    truncated: Truncated = msgspec.UNSET


FileBlock = ImageBlock | DocumentBlock | AudioBlock
"""A block that stands for a file of the session (docs/protocol.md §2 "Files")."""


class ToolResultBlock(msgspec.Struct, tag="tool_result", tag_field="type"):
    tool_use_id: str
    content: str
    is_error: bool = False
    truncated: Truncated = msgspec.UNSET
    # A tool's structured result (an MCP tool's ``structuredContent``), kept so a
    # snapshot shows what ``tool.completed.structured_result`` showed (PROTOCOL
    # section 6); left out when the tool had none.
    structured_content: Any | msgspec.UnsetType = msgspec.UNSET
    # The files the tool returned (an MCP tool's image or audio, docs/protocol.md
    # §2 "Files"), by reference; the model gets the images inside the tool_result.
    files: list[FileBlock] | msgspec.UnsetType = msgspec.UNSET


class CompactionBlock(msgspec.Struct, tag="compaction", tag_field="type"):
    """What a ``context`` message holds (docs/protocol.md §12): the summary of older messages.

    ``replaces`` names the messages it stands for in the model's view; they stay
    in the store and in every client's view. ``summary`` is "" when the
    compaction truncated (``method: "truncate"``).
    """

    summary: str
    replaces: list[str]
    truncated: Truncated = msgspec.UNSET


ContentBlock = (
    TextBlock
    | ImageBlock
    | DocumentBlock
    | AudioBlock
    | ThinkingBlock
    | RedactedThinkingBlock
    | ToolUseBlock
    | ToolResultBlock
    | CompactionBlock
)

# "context": a message the gateway wrote for the model's view (a compaction, section 12).
Role = Literal["user", "assistant", "context"]
MessageStatus = Literal["complete", "in_progress", "cancelled", "error"]
StopReason = Literal[
    "end_turn", "max_tokens", "stop_sequence", "tool_use", "cancelled", "error", "max_rounds"
]


def _zero() -> int:
    return 0


class Usage(msgspec.Struct, omit_defaults=True):
    """Token usage of one LLM call or of a whole turn (docs/protocol.md §6).

    ``input_tokens`` and ``output_tokens`` are always encoded, zeros included
    (section 6): their default comes from a factory, and ``omit_defaults``
    omits a field only when it equals a default *value* (it never calls a
    factory of ours to compare). Decoding still fills a missing count with 0,
    so what a store wrote before this rule (counts of 0 left out) still reads.
    The optional fields are omitted when ``None``.
    """

    input_tokens: int = msgspec.field(default_factory=_zero)
    output_tokens: int = msgspec.field(default_factory=_zero)
    cache_read_input_tokens: int | None = None
    cache_creation_input_tokens: int | None = None
    cost_usd: float | None = None

    def __add__(self, other: Usage) -> Usage:
        def add(a: float | None, b: float | None) -> Any:
            return None if a is None and b is None else (a or 0) + (b or 0)

        return Usage(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            cache_read_input_tokens=add(
                self.cache_read_input_tokens, other.cache_read_input_tokens
            ),
            cache_creation_input_tokens=add(
                self.cache_creation_input_tokens, other.cache_creation_input_tokens
            ),
            cost_usd=add(self.cost_usd, other.cost_usd),
        )


class Message(msgspec.Struct, omit_defaults=True):
    """One user or assistant message of a session (docs/protocol.md §6)."""

    id: str
    session_id: str
    turn_id: str | None
    role: Role
    content: list[ContentBlock]
    status: MessageStatus
    created_at: int
    model: str | None = None
    usage: Usage | None = None
    # Only on an ``in_progress`` message (snapshot, ``message.snapshot``): the
    # position of the block still streaming, or null; every other block has
    # ended (docs/protocol.md §6). Left out of every other message.
    open_block_index: int | msgspec.UnsetType | None = msgspec.UNSET
    # A user message's id in the front end that sent it, where its framework
    # names messages itself (AG-UI's, given back in its MESSAGES_SNAPSHOT:
    # docs/doors/agui.md "Ids"); left out otherwise (docs/protocol.md §6).
    client_id: str | None = None


PermissionKind = Literal["tool", "elicitation", "sampling", "elicitation_url"]


class PendingPermission(msgspec.Struct, omit_defaults=True):
    """A request waiting for ``allow``/``deny``, as a snapshot shows it (docs/protocol.md §6).

    ``session_id`` is the session that asked: the snapshot's own, or one of its
    workers'. An elicitation (section 11) adds the server's ``message`` and
    ``requested_schema``.
    """

    perm_id: str
    session_id: str
    kind: PermissionKind
    tool_use_id: str
    tool_name: str
    input: dict[str, Any]
    expires_at: int
    message: str | msgspec.UnsetType = msgspec.UNSET
    requested_schema: dict[str, Any] | msgspec.UnsetType = msgspec.UNSET
    # ``input: {}`` in a snapshot whose frame it alone would push over the cap.
    truncated: Truncated = msgspec.UNSET


ToolSource = str
"""``"builtin"``, ``"mcp:<server>"`` or ``"claude-code"`` (docs/protocol.md §6, ToolInfo)."""


class ToolInfo(msgspec.Struct):
    """A tool of an agent, as ``GET /agents`` and a session's summary list it (section 6)."""

    name: str
    description: str
    input_schema: dict[str, Any]
    requires_approval: bool
    source: ToolSource


class ResourceTemplateInfo(msgspec.Struct, omit_defaults=True):
    """An MCP server's resource template, as ``GET /agents`` lists it (docs/protocol.md §11)."""

    server: str
    uri_template: str
    name: str
    description: str | None = None
    mime_type: str | None = None


class QueuedTurnInfo(msgspec.Struct):
    """A queued turn, as a summary lists it (docs/protocol.md §2 "A busy session");
    ``position`` 1 starts next."""

    turn_id: str
    position: int
    user_message: Message


class ToolProgressInfo(msgspec.Struct):
    """A running tool's last ``tool.progress``, as a summary lists it (docs/protocol.md §6)."""

    tool_use_id: str
    progress: float
    total: float | None
    message: str | None


class SessionSummary(msgspec.Struct):
    """The ``session`` of a ``snapshot`` frame (docs/protocol.md §6)."""

    id: str
    workspace_path: str
    active_model: str
    routing_policy_version: str
    cost_so_far_usd: float
    turn_count: int
    current_turn_id: str | None
    current_turn_status: Literal["in_flight"] | None
    parent_session_id: str | None
    pending_permissions: list[PendingPermission] = msgspec.field(default_factory=list)
    agent: str = "default"  # docs/protocol.md §11
    tools: list[ToolInfo] = msgspec.field(default_factory=list)  # the agent's, as GET /agents
    # Its queued turns, next first; absent when none (docs/protocol.md §2 "A busy session").
    queued_turns: list[QueuedTurnInfo] | msgspec.UnsetType = msgspec.UNSET
    # Its running tools' last progress (``tool.progress``); absent when none (docs/protocol.md §6).
    tool_progress: list[ToolProgressInfo] | msgspec.UnsetType = msgspec.UNSET

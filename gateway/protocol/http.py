"""The HTTP bodies of docs/protocol.md §2, declared once for the server and the client.

Requests refuse unknown fields (422 ``invalid_body`` names the field); answers
are what the routes encode and what :mod:`gateway.client.api` decodes, and
``/openapi.json`` shows their msgspec schemas (:mod:`gateway.http.openapi`).
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from gateway.protocol.shapes import (
    PROTOCOL_VERSION,
    AudioBlock,
    CompactionBlock,
    ContentBlock,
    Message,
    QueuedTurnInfo,
    RedactedThinkingBlock,
    ResourceTemplateInfo,
    SessionSummary,
    TextBlock,
    ThinkingBlock,
    ToolInfo,
    ToolResultBlock,
    ToolUseBlock,
)


class Base64Source(msgspec.Struct, forbid_unknown_fields=True):
    """An inline file of a turn: ``{"type": "base64", "media_type", "data"}`` (Anthropic's
    shape; docs/protocol.md §2 "Files"): stored as a file first."""

    type: Literal["base64"]
    media_type: str
    data: str


class ImageInput(msgspec.Struct, tag="image", tag_field="type"):
    """An image of a turn as a client sends it: ``file_id`` (a file of the session) or
    ``source`` (inline), never both. ``media_type`` and ``size``, which the
    gateway's own blocks carry, are taken and ignored: a block read from an event
    may be sent back as it is."""

    file_id: str | None = None
    source: Base64Source | None = None
    media_type: str | None = None
    size: int | None = None


class DocumentInput(msgspec.Struct, tag="document", tag_field="type"):
    """A document of a turn as a client sends it (as :class:`ImageInput`)."""

    file_id: str | None = None
    source: Base64Source | None = None
    media_type: str | None = None
    size: int | None = None


TurnBlock = (
    TextBlock
    | ImageInput
    | DocumentInput
    | AudioBlock
    | ThinkingBlock
    | RedactedThinkingBlock
    | ToolUseBlock
    | ToolResultBlock
    | CompactionBlock
)
"""A block of a turn's ``content`` as sent: text, an image or a document; the other
kinds decode only to be refused with a message that names them."""


class FileStored(msgspec.Struct):
    """``POST /sessions/{id}/files`` (docs/protocol.md §2 "Files")."""

    file_id: str
    media_type: str
    size: int
    sha256: str


class CreateSession(msgspec.Struct, forbid_unknown_fields=True):
    workspace_path: str | None = None
    model: str | None = None
    agent: str | None = None  # docs/protocol.md §11; None: the default agent
    metadata: dict[str, Any] | None = None


class SessionCreated(msgspec.Struct):
    """``POST /sessions``."""

    session_id: str
    active_model: str
    created_at: int
    agent: str = "default"


class AgentListing(msgspec.Struct):
    """One agent of ``GET /agents`` (docs/protocol.md sections 2, 11): never its system prompt."""

    name: str
    runtime: str
    model: str
    default: bool
    tools: list[ToolInfo]
    # Its MCP servers' resource templates (docs/protocol.md §11); absent when none.
    resource_templates: list[ResourceTemplateInfo] | msgspec.UnsetType = msgspec.UNSET


class AgentList(msgspec.Struct):
    """``GET /agents``."""

    agents: list[AgentListing]


class SessionListing(msgspec.Struct):
    """One entry of ``GET /sessions``: the summary plus when and with what it was made."""

    session: SessionSummary
    created_at: int
    metadata: dict[str, Any]


class SessionList(msgspec.Struct):
    """``GET /sessions``: newest first; ``has_more`` says older ones exist."""

    sessions: list[SessionListing]
    has_more: bool


class ForkOrigin(msgspec.Struct):
    """Where a fork comes from: its source session and the message it was made at."""

    session_id: str
    at_message_id: str | None


class SessionAttach(msgspec.Struct):
    """``GET /sessions/{id}``: a fresh single-use attach token, in ``ws_url`` too.

    A fork's (docs/protocol.md §2, "Forks") also says where it comes from and,
    made at a user message, that message's content, its draft.
    """

    session_id: str
    active_model: str
    attach_token: str
    ws_url: str
    agent: str = "default"
    protocol_version: int = PROTOCOL_VERSION  # docs/protocol.md §4
    forked_from: ForkOrigin | msgspec.UnsetType = msgspec.UNSET
    draft: list[ContentBlock] | msgspec.UnsetType = msgspec.UNSET
    # Its queued turns, next first; absent when none (docs/protocol.md §2 "A busy session").
    queued_turns: list[QueuedTurnInfo] | msgspec.UnsetType = msgspec.UNSET


class ListedMessage(Message):
    """A message as ``GET /sessions/{id}/messages`` lists it: with ``include_rewound=true``,
    one of a rewound branch says ``"rewound": true`` (docs/protocol.md §2 "Edit and
    regenerate"); every other listed message leaves the field out. A listing's own field:
    the message itself (a snapshot's, an event's, ``GET .../messages/{id}``) has none."""

    rewound: bool = False


class MessagePage(msgspec.Struct):
    """``GET /sessions/{id}/messages``: oldest first; ``has_more`` says older ones exist."""

    messages: list[ListedMessage]
    has_more: bool


IfBusy = Literal["reject", "queue", "interrupt", "steer"]
"""What a turn sent to a busy session does (docs/protocol.md §2 "A busy session")."""


class SubmitTurn(msgspec.Struct, forbid_unknown_fields=True):
    """``POST /sessions/{id}/turns`` (docs/protocol.md §2).

    ``if_busy``: ``None`` is ``[turns] if_busy``. ``rewind_to``: the id of one
    of the session's user messages ("Edit and regenerate").
    """

    content: str | list[TurnBlock]
    if_busy: IfBusy | None = None
    rewind_to: str | None = None


class TurnAccepted(msgspec.Struct, omit_defaults=True):
    """The 202 of a turn: started, queued (with its ``position``, 1 = next), or steered
    into the running turn (whose id it is)."""

    turn_id: str
    queued: bool = False
    position: int | None = None
    steered: bool = False


class CancelTurn(msgspec.Struct, forbid_unknown_fields=True):
    reason: str | None = None


class Compact(msgspec.Struct, forbid_unknown_fields=True):
    """``POST /sessions/{id}/compact``: ``{}`` (docs/protocol.md §12); no field yet."""


class CancelAccepted(msgspec.Struct):
    turn_id: str
    status: Literal["cancelling"] = "cancelling"


class PermissionDecision(msgspec.Struct, forbid_unknown_fields=True):
    decision: Literal["allow", "deny"]
    content: dict[str, Any] | None = None  # an elicitation's answer (docs/protocol.md §2, §11)


class Feedback(msgspec.Struct, forbid_unknown_fields=True):
    message_id: str
    rating: Literal[-1, 1]
    comment: str | None = None


class Accepted(msgspec.Struct):
    status: str


class Health(msgspec.Struct):
    status: str = "ok"


class Ready(msgspec.Struct):
    """``GET /readyz`` while the gateway accepts work.

    Else 503: ``draining`` once shutdown began, ``store_unavailable`` while
    commits fail (docs/protocol.md §15).
    """

    status: str = "ready"


class ForkSession(msgspec.Struct, forbid_unknown_fields=True):
    """``POST /sessions/{id}/fork`` (docs/protocol.md §2, "Forks"); absent: the last message."""

    at_message_id: str | None = None


class ForkCreated(msgspec.Struct):
    """``POST /sessions/{id}/fork``: the fork, as ``POST /sessions`` answers a session, where it
    comes from, and its draft when it was made at a user message."""

    session_id: str
    active_model: str
    created_at: int
    agent: str
    forked_from: ForkOrigin
    draft: list[ContentBlock] | msgspec.UnsetType = msgspec.UNSET

"""Tool permissions: a tool in ``require_approval`` waits for ``allow`` or ``deny``.

The agent loop opens a request (``permission.requested``) and waits on it
within ``approval_timeout_s``; ``POST /sessions/{id}/permissions/{perm_id}``
decides it (docs/protocol.md §2). A request is decided once: a second decision,
or one after the timeout or after the turn moved on, is a 409.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import msgspec
import trio

from gateway.errors import Refused
from gateway.ids import asked_for, new_perm_id
from gateway.protocol.shapes import Message, PendingPermission, PermissionKind, ToolUseBlock


@dataclass(eq=False)
class PermissionRequest:
    """A tool waiting for ``allow``/``deny``, or an MCP elicitation (docs/protocol.md §11)."""

    perm_id: str
    session_id: str  # the session that asked
    tool_use_id: str
    tool_name: str
    input: dict[str, Any]
    expires_at: int  # ms since the epoch
    kind: PermissionKind = "tool"
    message: str | None = None  # an elicitation's question
    requested_schema: dict[str, Any] | None = None  # an elicitation's answer schema
    decision: str | None = None
    content: dict[str, Any] | None = None  # an elicitation's answer (with ``allow``)
    closed: bool = False  # decided, timed out, or the turn moved on
    decided: trio.Event = field(default_factory=trio.Event)

    def pending(self) -> PendingPermission:
        """This request as a snapshot lists it."""
        return PendingPermission(
            self.perm_id,
            self.session_id,
            self.kind,
            self.tool_use_id,
            self.tool_name,
            self.input,
            self.expires_at,
            msgspec.UNSET if self.message is None else self.message,
            msgspec.UNSET if self.requested_schema is None else self.requested_schema,
        )


class Permissions:
    """The permission requests of one session, by ``perm_id``."""

    def __init__(self, session_id: str) -> None:
        self._session_id = session_id
        self._requests: dict[str, PermissionRequest] = {}

    def open(
        self,
        tool_use_id: str,
        tool_name: str,
        input: dict[str, Any],
        expires_at: int,
        *,
        kind: PermissionKind = "tool",
        message: str | None = None,
        requested_schema: dict[str, Any] | None = None,
    ) -> PermissionRequest:
        """A new request for the tool call ``tool_use_id``."""
        request = PermissionRequest(
            new_perm_id(tool_use_id),
            self._session_id,
            tool_use_id,
            tool_name,
            input,
            expires_at,
            kind,
            message,
            requested_schema,
        )
        self._requests[request.perm_id] = request
        return request

    def pending(self) -> list[PendingPermission]:
        """The requests still waiting, oldest first (a snapshot's ``pending_permissions``)."""
        return [r.pending() for r in self._requests.values() if not r.closed and r.decision is None]

    def holds(self, perm_id: str) -> bool:
        """Whether ``perm_id`` is one of this session's requests (pending or not)."""
        return perm_id in self._requests

    def decide(self, perm_id: str, decision: str, content: dict[str, Any] | None = None) -> None:
        """Resolve a pending request (docs/protocol.md §2).

        ``content`` answers an elicitation (with ``allow``), checked against its
        ``requested_schema`` (docs/protocol.md §11); a tool permission takes none.

        Raises:
            Refused: ``permission_not_found``; ``permission_resolved``;
                ``invalid_content``.
        """
        request = self._requests.get(perm_id)
        if request is None:
            raise Refused(
                "permission_not_found", f"no permission {perm_id!r} in {self._session_id}"
            )
        if request.closed or request.decision is not None:
            raise Refused("permission_resolved", f"permission {perm_id} is no longer waiting")
        if content is None and decision == "allow" and request.kind == "elicitation":
            # Accepting with no answer is the empty answer: it must fit too (a
            # server whose schema requires a field was told "accept", with none).
            problem = _misfit({}, request.requested_schema or {})
            if problem is not None:
                raise Refused(
                    "invalid_content", f"allow needs content that fits the schema: {problem}"
                )
        if content is not None:
            if request.kind != "elicitation":
                raise Refused("invalid_content", "content answers an elicitation only")
            if decision != "allow":
                raise Refused("invalid_content", "content comes with allow only")
            problem = _not_primitive(content) or _misfit(content, request.requested_schema or {})
            if problem is not None:
                raise Refused("invalid_content", f"content does not fit the schema: {problem}")
        request.decision = decision
        request.content = content
        request.decided.set()


class Asker(Protocol):
    """A session of a family, as a decision looks for the one that asked."""

    @property
    def permissions(self) -> Permissions: ...

    @property
    def messages(self) -> list[Message]: ...

    @property
    def rewound(self) -> list[Message]:
        """Its rewound messages (docs/protocol.md §2 "Edit and regenerate")."""
        ...


def decide_in(
    family: Sequence[Asker], perm_id: str, decision: str, content: dict[str, Any] | None
) -> None:
    """Resolve a request of the family (its first session: the one asked) where it waits.

    Raises:
        Refused: ``permission_resolved`` for one it asked before; as
            :meth:`Permissions.decide`.
    """
    asker = next((s for s in family if s.permissions.holds(perm_id)), None)
    if asker is None and any(asked_before(perm_id, s.messages, s.rewound) for s in family):
        raise Refused("permission_resolved", f"permission {perm_id} is no longer waiting")
    (asker or family[0]).permissions.decide(perm_id, decision, content)


def asked_before(perm_id: str, *conversations: list[Message]) -> bool:
    """Whether ``perm_id`` names a request for one of the tool uses in these messages
    (a session's conversation and its rewound messages, docs/protocol.md §2).

    A session loaded afresh holds only the requests still pending; an answer to
    one it asked before is then told apart from an id it never issued by the
    tool use's part of the id (:func:`gateway.ids.new_perm_id`): 409
    ``permission_resolved``, as the session said before it left memory.
    """
    return any(
        asked_for(perm_id, block.id)
        for messages in conversations
        for message in messages
        for block in message.content
        if isinstance(block, ToolUseBlock)
    )


def _not_primitive(content: dict[str, Any]) -> str | None:
    """Why ``content`` is not an MCP elicitation answer, or None.

    MCP's answer holds strings, numbers, booleans, null and lists of strings
    only: anything else (a nested object a permissive schema let through) was
    accepted with a 202 and then failed the SDK's own check, the server told
    an error instead of the user's answer.
    """
    for key, value in content.items():
        if value is None or isinstance(value, str | int | float | bool):
            continue
        if isinstance(value, list) and all(isinstance(item, str) for item in value):
            continue
        return f"{key}: an answer holds strings, numbers, booleans and lists of strings only"
    return None


def _misfit(content: dict[str, Any], schema: dict[str, Any]) -> str | None:
    """Why ``content`` does not fit ``schema`` (an elicitation's), or None.

    The schema is a server's: one that cannot be checked against (an unknown
    type, a regex that does not compile, a ``$ref`` that cannot be resolved;
    gateway.mcp.tools.elicitation_problem refuses them before they are asked)
    is the answer's 422, never a 500.
    """
    import jsonschema  # type: ignore[import-untyped]
    import jsonschema.exceptions  # type: ignore[import-untyped]

    from gateway.mcp.tools import elicitation_problem

    problem = elicitation_problem("", schema)  # a caller that asked without the MCP adapter's check
    if problem is not None:
        return f"the question cannot be answered with content: {problem}"
    try:
        cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
        error = jsonschema.exceptions.best_match(cls(schema).iter_errors(content))
    except jsonschema.exceptions.SchemaError as exc:
        return f"the schema is not valid: {exc.message}"
    except Exception as exc:  # the server's schema, not the client's answer, is at fault
        return f"the schema cannot be checked against: {type(exc).__name__}"
    if error is None:
        return None
    where = "/".join(str(p) for p in error.absolute_path)
    return f"{where}: {error.message}" if where else str(error.message)

"""A2A message parts read as a turn's content, or as the answer to an approval.

docs/doors/a2a.md "Messages". A new task's message: ``text`` parts are its
text; a ``raw`` part (base64 with its ``mediaType``) or a ``url`` part (a
``data:`` URL, or the URL of a file of the context the gateway served:
``/sessions/{id}/files/{file_id}``, nothing is fetched) is a file, checked
as ``POST /sessions/{id}/files`` checks one (gateway.doors.attachments); a
``data`` part is its JSON, as text. An answer to ``TASK_STATE_INPUT_REQUIRED``
is read by :func:`decision`.
"""

from __future__ import annotations

from typing import Any

import msgspec

from gateway.doors import attachments
from gateway.doors.a2a import shapes as a2
from gateway.doors.a2a.rpc import INVALID_PARAMS, RpcFailure
from gateway.errors import ApiError

YES = frozenset({"yes", "y", "allow", "approve", "approved", "ok", "true"})
NO = frozenset({"no", "n", "deny", "denied", "reject", "false"})


def sent(message: a2.Message, session_id: str, base: str) -> attachments.Sent:
    """The message's text and files, in order (module docstring); 422 ``invalid_body``."""
    parts: list[str | attachments.Attachment] = []
    for i, part in enumerate(message.parts):
        where = f"parts[{i}]"
        if part.text is not None:
            parts.append(part.text)
        elif part.raw is not None:
            if not part.media_type:
                raise ApiError(422, "invalid_body", f"{where}: a raw part needs its mediaType")
            parts.append(attachments.inline(part.raw, part.media_type, None, where))
        elif part.url is not None:
            url, mime = part.url, part.media_type
            parts.append(attachments.attachment(url, mime, None, session_id, where, base))
        elif part.data is not None:
            parts.append(msgspec.json.encode(part.data).decode())
        else:
            raise ApiError(422, "invalid_body", f"{where}: a part is text, raw, url or data")
    said = attachments.Sent(parts)
    if said.empty():
        raise ApiError(422, "invalid_body", "the message has no content")
    return said


def decision(message: a2.Message) -> tuple[str, str | None, dict[str, Any] | None]:
    """The answer to an approval: its decision, the approval it names (None: every open
    one of the task), and an elicitation's content.

    A ``data`` part ``{"decision": "allow" | "deny", "permId"?, "content"?}`` (also
    ``{"approved": bool}``), or a text part, its first word ``yes``/``allow`` or
    ``no``/``deny`` (and a few synonyms: :data:`YES`, :data:`NO`). A ``permId`` that is
    no string is a wrong answer, never one for every open approval.

    Raises:
        RpcFailure: -32602 ``invalid_answer``: neither.
    """
    for part in message.parts:
        data = part.data
        if isinstance(data, dict):
            raw = data.get("decision", data.get("approved"))
            said = {"allow": "allow", "deny": "deny", True: "allow", False: "deny"}.get(raw)
            if said is None:
                continue
            perm = data.get("permId")
            if perm is not None and not isinstance(perm, str):  # never every open one
                raise RpcFailure(INVALID_PARAMS, "permId must be a string", "invalid_answer", 422)
            content = data.get("content")
            if content is not None and not isinstance(content, dict):
                raise RpcFailure(INVALID_PARAMS, "content must be an object", "invalid_answer", 422)
            return said, perm, content
        if part.text is not None:
            words = part.text.strip().lower().split()
            word = words[0].strip(".!,") if words else ""
            if word in YES:
                return "allow", None, None
            if word in NO:
                return "deny", None, None
    raise RpcFailure(
        INVALID_PARAMS,
        'the task waits for an approval: answer with a data part {"decision": "allow"|"deny"} '
        "or the text yes or no",
        "invalid_answer",
        422,
    )


def echo(message: a2.Message, task_id: str, context_id: str) -> a2.Message:
    """The user's message as the task's history holds it (its task and context set)."""
    return msgspec.structs.replace(message, task_id=task_id, context_id=context_id)

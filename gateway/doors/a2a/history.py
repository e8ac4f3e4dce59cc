"""A task's ``history``: its turn's messages as A2A Messages (docs/doors/a2a.md
"Tasks and contexts").

The turn's user message and its assistant messages, oldest first: their text
parts, and a user message's files by URL (as the artifacts give a tool's,
never their bytes); a message with neither (a tool call, a tool's result)
is left out. At most :data:`MAX_HISTORY`, the most recent; ``historyLength``
asks for fewer (0: none).
"""

from __future__ import annotations

from gateway.doors.a2a import shapes as a2
from gateway.doors.a2a.rpc import INVALID_PARAMS, RpcFailure
from gateway.doors.attachments import file_url
from gateway.protocol.shapes import AudioBlock, DocumentBlock, ImageBlock, Message, TextBlock

MAX_HISTORY = 50
"""The most messages a task's history holds (its most recent)."""


def limit_of(history_length: int | None) -> int:
    """How many messages ``historyLength`` asks for, within :data:`MAX_HISTORY`."""
    if history_length is None:
        return MAX_HISTORY
    if history_length < 0:
        raise RpcFailure(INVALID_PARAMS, "historyLength is at least 0", "invalid_params")
    return min(history_length, MAX_HISTORY)


def history(
    messages: list[Message], task: str, context: str, turn_id: str, base: str, limit: int
) -> list[a2.Message] | None:
    """The turn's messages as A2A Messages (module docstring); None: none."""
    out: list[a2.Message] = []
    for m in messages:
        if m.turn_id != turn_id or m.role not in ("user", "assistant"):
            continue
        parts: list[a2.Part] = []
        for b in m.content:
            if isinstance(b, TextBlock) and b.text:
                parts.append(a2.Part(text=b.text))
            elif isinstance(b, ImageBlock | DocumentBlock | AudioBlock) and m.role == "user":
                parts.append(
                    a2.Part(
                        url=file_url(base, context, b.file_id),
                        media_type=b.media_type,
                        metadata={"fileId": b.file_id, "size": b.size},
                    )
                )
        if parts:
            role = "ROLE_USER" if m.role == "user" else "ROLE_AGENT"
            out.append(
                a2.Message(
                    message_id=m.id, context_id=context, task_id=task, role=role, parts=parts
                )
            )
    return out[len(out) - limit :] if limit and out else None

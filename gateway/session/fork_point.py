"""Where a session may be forked, and what the fork starts with (docs/protocol.md §2, "Forks").

Sans-IO: a session's messages in, the fork's history and draft out
(:func:`fork_point`); gateway.node.forking carries the fork out. The rules:

- **A user message** (a turn's prompt: ``role: "user"``, no tool result in
  it): the fork's history is every message before it, and the message is
  the fork's *draft* (given back to the client, never sent to the model).
- **A message that ends a turn**: the last message of its turn (whatever it
  is: the final reply, a cancelled turn's tool results, a failed turn's
  partial reply), or a message of no turn (a ``context`` message of a
  compaction between turns). The fork's history is every message up to
  it, that message included: what the source itself would send the model
  at its next turn, had the conversation stopped there.
- **Any other message** is in the middle of a turn (an assistant message
  whose tools ran and were answered, those tools' results, a compaction
  inside the turn): ``not_a_fork_point``, naming the points there are.
- **No message named**: the last message (a session with none forks empty).

The copies keep their ids (and turn ids): a later fork or rewind of the fork
names them as it would name the source's; each is the fork's own message
(``session_id``).

Where a fork comes from is in its ``metadata`` (the source's, and two keys of
the gateway's: ``forked_from`` and, made at a user message, ``draft``), so
the store keeps it with no field of its own: :func:`fork_metadata` writes
them, :func:`origin_of` reads them back (``GET /sessions/{id}``, a retried
request's answer).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from gateway.errors import Refused
from gateway.protocol.http import ForkOrigin
from gateway.protocol.shapes import ContentBlock, Message, ToolResultBlock

FORKED_FROM = "forked_from"
"""The metadata key of a fork's :class:`ForkOrigin`."""
DRAFT = "draft"
"""The metadata key of a fork's draft: the content of the user message it was made at."""


@dataclass(frozen=True)
class ForkPoint:
    """What a fork starts with (module docstring)."""

    at_message_id: str | None
    """The message the fork was made at (the one named, or the last); ``None``: no message."""
    history: list[Message]
    """The fork's messages, oldest first (still the source's: :func:`copied` makes them its)."""
    draft: list[ContentBlock] | None = None
    """The content of the user message the fork was made at, which is not in ``history``."""


def is_prompt(message: Message) -> bool:
    """Whether ``message`` is a turn's user message (not a message of tool results)."""
    return message.role == "user" and not any(
        isinstance(block, ToolResultBlock) for block in message.content
    )


def fork_point(
    messages: Sequence[Message], at_message_id: str | None, session_id: str
) -> ForkPoint:
    """The fork of a session whose conversation is ``messages``, at ``at_message_id``.

    Args:
        messages: the session's conversation, oldest first; no turn in flight.
        at_message_id: the message named; ``None``: the last one.
        session_id: the session's id, for the messages of a refusal.

    Raises:
        Refused: ``message_not_found`` (the session holds no such message),
            ``not_a_fork_point`` (it is in the middle of a turn; the message
            names the turn's last message and its user message).
    """
    if at_message_id is None:
        if not messages:
            return ForkPoint(None, [])
        at_message_id = messages[-1].id
    at = next((i for i, m in enumerate(messages) if m.id == at_message_id), None)
    if at is None:
        raise Refused("message_not_found", f"no message {at_message_id!r} in {session_id}")
    message = messages[at]
    if is_prompt(message):
        return ForkPoint(at_message_id, list(messages[:at]), list(message.content))
    turn_id = message.turn_id
    later = [m for m in messages[at + 1 :] if turn_id is not None and m.turn_id == turn_id]
    if not later:
        return ForkPoint(at_message_id, list(messages[: at + 1]))
    prompt = next((m.id for m in messages if m.turn_id == turn_id and is_prompt(m)), None)
    points = f"its last message {later[-1].id!r}"
    if prompt is not None:
        points += f", or at its user message {prompt!r} (the fork's draft)"
    raise Refused(
        "not_a_fork_point",
        f"message {at_message_id!r} is in the middle of turn {turn_id} of {session_id}"
        f" (the turn went on after it): fork at {points}",
    )


def fork_messages(history: Sequence[Message], fork_id: str) -> list[Message]:
    """The fork's own copies of ``history``: the same ids, the fork's ``session_id``."""
    return [msgspec.structs.replace(m, session_id=fork_id) for m in history]


def turns_in(history: Sequence[Message]) -> int:
    """How many turns ``history`` holds (the fork's ``turn_count`` to start with)."""
    return len({m.turn_id for m in history if m.turn_id is not None})


def fork_metadata(source: dict[str, Any], source_id: str, point: ForkPoint) -> dict[str, Any]:
    """A fork's metadata: its source's, where it comes from, and its draft if it has one."""
    metadata = {k: v for k, v in source.items() if k not in (FORKED_FROM, DRAFT)}
    metadata[FORKED_FROM] = msgspec.to_builtins(ForkOrigin(source_id, point.at_message_id))
    if point.draft is not None:
        metadata[DRAFT] = msgspec.to_builtins(point.draft)
    return metadata


def origin_of(
    metadata: dict[str, Any],
) -> tuple[ForkOrigin | None, list[ContentBlock] | None]:
    """Where a session was forked from and its draft, as its metadata says (``None``: not
    said, or not in the shape :func:`fork_metadata` writes).

    A session that is no fork (most) costs a look-up: a ``convert`` to the
    content-block union is some 8 µs, paid by every ``GET /sessions/{id}``."""
    said = metadata.get(FORKED_FROM)
    if said is None:
        return None, None
    try:
        origin = msgspec.convert(said, ForkOrigin)
        draft = msgspec.convert(metadata.get(DRAFT), list[ContentBlock] | None)
    except msgspec.ValidationError:
        return None, None
    return origin, draft


__all__ = [
    "DRAFT",
    "FORKED_FROM",
    "ForkPoint",
    "fork_messages",
    "fork_metadata",
    "fork_point",
    "is_prompt",
    "origin_of",
    "turns_in",
]

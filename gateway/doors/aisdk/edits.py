"""``useChat``'s edits and regenerations as ``rewind_to``, sans-IO (docs/doors/aisdk.md).

The gateway names a user message of a chat after the client's id for it
(:func:`~gateway.doors.aisdk.mapping.user_message_id`). ``useChat`` keeps that
id when its user edits the message (``sendMessage({text, messageId})``) or
regenerates the answer to it (``regenerate()``): both send the history up to
that message, the message last. The gateway then starts a turn that rewinds
to the message it holds for it (docs/protocol.md §2 "Edit and regenerate"),
whose user message needs an id of its own (the one it rewinds to stays
stored): :func:`edited_id`, derived from the client's id and the new turn's,
so :func:`find` still knows it as that client message in the next request
(another edit, another regeneration, a repeat after a lost answer).
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.doors.aisdk.mapping import user_message_id
from gateway.doors.attachments import Sent
from gateway.protocol.shapes import Message, TextBlock
from gateway.session.files import file_ids

REGENERATE = "regenerate-message"
"""``useChat``'s ``trigger`` for ``regenerate()``."""


def edited_id(chat_id: str, client_id: str, turn_id: str) -> str:
    """The id of the user message of a turn that rewinds to the client's ``client_id``."""
    return user_message_id(chat_id, f"{client_id}\0{turn_id}")


def find(
    chat_ids: Sequence[str], client_id: str, conversation: Sequence[Message]
) -> Message | None:
    """The user message of the conversation the client names ``client_id``, the latest.

    As first sent (:func:`user_message_id`), or as a turn that rewound to it
    gave it again (:func:`edited_id`), in the chat or in one it was forked from
    (``chat_ids``: the chat's id, then its sources'; a fork's copies keep their
    source's ids, docs/protocol.md §2 "Forks").
    """
    firsts = {user_message_id(chat, client_id) for chat in chat_ids}
    for message in reversed(conversation):
        if message.role != "user" or message.turn_id is None:
            continue
        if message.id in firsts or any(
            message.id == edited_id(chat, client_id, message.turn_id) for chat in chat_ids
        ):
            return message
    return None


def same_content(message: Message, said: Sent) -> bool:
    """Whether a stored user message says what the request's message says: the same text
    and the same files, in order (an inline file by the id its bytes give it)."""
    text = "".join(b.text for b in message.content if isinstance(b, TextBlock))
    return text == said.text and file_ids(message.content) == said.file_ids

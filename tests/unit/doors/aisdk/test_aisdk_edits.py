"""``useChat``'s edits and regenerations as the gateway's messages (gateway.doors.aisdk.edits)."""

from __future__ import annotations

from gateway.doors.aisdk import edits
from gateway.doors.aisdk.mapping import user_message_id
from gateway.protocol.shapes import Message, TextBlock, ToolResultBlock

CHAT = "chat-1"


def user(id_: str, turn: str, text: str = "hi") -> Message:
    return Message(id_, CHAT, turn, "user", [TextBlock(text)], "complete", 0)


def test_a_client_message_is_found_as_first_sent_and_as_a_rewinding_turn_gave_it_again() -> None:
    first = user(user_message_id(CHAT, "u1"), "turn_1")
    assert edits.find([CHAT], "u1", [first]) is first
    again = user(edits.edited_id(CHAT, "u1", "turn_2"), "turn_2", "edited")
    assert edits.find([CHAT], "u1", [again]) is again
    assert edits.find([CHAT], "u2", [first, again]) is None
    # an id derived for another turn is not this message's
    stray = user(edits.edited_id(CHAT, "u1", "turn_9"), "turn_3")
    assert edits.find([CHAT], "u1", [stray]) is None
    # another chat's, or a tool results message, never
    assert edits.find(["chat-2"], "u1", [first]) is None
    results = Message(first.id, CHAT, None, "user", [ToolResultBlock("t", "ok")], "complete", 0)
    assert edits.find([CHAT], "u1", [results]) is None


def test_same_text_compares_the_text_blocks() -> None:
    message = user("msg_1", "turn_1", "a question")
    assert edits.same_text(message, [TextBlock("a "), TextBlock("question")])
    assert not edits.same_text(message, [TextBlock("a question, edited")])


def test_the_edited_id_is_the_chats_and_the_turns() -> None:
    one = edits.edited_id(CHAT, "u1", "turn_1")
    assert one.startswith("msg_") and len(one) == len(user_message_id(CHAT, "u1"))
    assert one not in {edits.edited_id(CHAT, "u1", "turn_2"), user_message_id(CHAT, "u1")}

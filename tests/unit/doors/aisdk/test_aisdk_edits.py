"""``useChat``'s edits and regenerations as the gateway's messages (gateway.doors.aisdk.edits)."""

from __future__ import annotations

from gateway.doors.aisdk import edits
from gateway.doors.aisdk.mapping import user_message_id
from gateway.doors.attachments import Inline, Sent, Served
from gateway.protocol.shapes import ImageBlock, Message, TextBlock, ToolResultBlock
from tests.files_support import png

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


def test_same_content_compares_the_text_and_the_files_in_order() -> None:
    message = user("msg_1", "turn_1", "a question")
    assert edits.same_content(message, Sent(["a ", "question"]))
    assert not edits.same_content(message, Sent(["a question, edited"]))
    # A file: the text alone is not the message; the file's id is (inline: its bytes').
    image = png()
    inline = Inline("image/png", image, "image")
    block = ImageBlock(inline.file_id, "image/png", len(image))
    pictured = Message("msg_2", CHAT, "turn_2", "user", [block, TextBlock("what is it?")],
                       "complete", 0)  # fmt: skip
    assert edits.same_content(pictured, Sent([inline, "what is it?"]))
    assert edits.same_content(pictured, Sent([Served(inline.file_id, None), "what is it?"]))
    assert not edits.same_content(pictured, Sent(["what is it?"]))
    other = Inline("image/png", png(color=(1, 2, 3)), "image")
    assert not edits.same_content(pictured, Sent([other, "what is it?"]))


def test_the_edited_id_is_the_chats_and_the_turns() -> None:
    one = edits.edited_id(CHAT, "u1", "turn_1")
    assert one.startswith("msg_") and len(one) == len(user_message_id(CHAT, "u1"))
    assert one not in {edits.edited_id(CHAT, "u1", "turn_2"), user_message_id(CHAT, "u1")}

"""What Claude Code's streaming input is sent of a user message (docs/protocol.md §11,
the ``claude-code`` runtime): its text, or with files the Messages API's blocks.
Needs the claude-code extra (the module imports the SDK), none of its processes."""

from __future__ import annotations

import base64

import pytest

pytest.importorskip("claude_agent_sdk", reason="needs the claude-code extra")

from gateway.protocol.shapes import DocumentBlock, ImageBlock, Message, TextBlock
from gateway.runtimes.claude_code.steering import prompt_of
from tests.files_support import PDF, png

IMAGE = png()
PIC = ImageBlock("file_pic", "image/png", len(IMAGE))
NOTE = DocumentBlock("file_note", "text/markdown", 5)
DOC = DocumentBlock("file_doc", "application/pdf", len(PDF))


def user(*blocks: TextBlock | ImageBlock | DocumentBlock) -> Message:
    return Message("msg_1", "s", "t", "user", list(blocks), "complete", 0)


def test_text_alone_is_a_string_as_before() -> None:
    assert prompt_of(user(TextBlock("a"), TextBlock("b"))) == "ab"


def test_files_are_blocks_with_their_bytes_a_text_document_as_text_a_lost_one_a_line() -> None:
    files = {
        "file_pic": ("image/png", IMAGE),
        "file_note": ("text/markdown", b"# hi\n"),
        "file_doc": ("application/pdf", PDF),
    }
    gone = ImageBlock("file_gone", "image/png", 9)
    message = user(TextBlock("look"), PIC, TextBlock(""), NOTE, DOC, gone)
    assert prompt_of(message, files) == [
        {"type": "text", "text": "look"},
        {
            "type": "image",
            "source": {
                "type": "base64",
                "media_type": "image/png",
                "data": base64.b64encode(IMAGE).decode(),
            },
        },
        {
            "type": "document",
            "source": {"type": "text", "media_type": "text/plain", "data": "# hi\n"},
        },
        {
            "type": "document",
            "source": {
                "type": "base64",
                "media_type": "application/pdf",
                "data": base64.b64encode(PDF).decode(),
            },
        },
        {"type": "text", "text": "[file file_gone is no longer stored]"},
    ]


def test_a_text_that_starts_with_a_slash_is_sent_with_a_space_so_it_is_no_cli_command() -> None:
    """Claude Code runs a user message's text that starts with ``/`` as its own command
    (``/model``, ``/clear``...), in a block of several too: a client's text is the model's."""
    assert prompt_of(user(TextBlock("/model claude-opus-4-1"))) == " /model claude-opus-4-1"
    assert prompt_of(user(TextBlock("a"), TextBlock("/cost"))) == "a/cost"
    files = {"file_pic": ("image/png", IMAGE)}
    blocks = prompt_of(user(TextBlock("/clear"), PIC, TextBlock("/cost")), files)
    assert isinstance(blocks, list)
    assert [b.get("text") for b in blocks] == [" /clear", None, " /cost"]

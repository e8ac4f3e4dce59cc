"""Compaction and files, sans-IO (docs/protocol.md §12; rules 3 to 5 of
:mod:`gateway.session.compaction`): an image counts 1,600 tokens and a document
its size / 4 in the estimate (audio nothing: it is never sent); the summary call
reads a line naming each file, never its bytes; the note naming the replaced
messages' files covers every message the context message replaces, earlier
compactions' included."""

from __future__ import annotations

import itertools

from gateway.protocol.shapes import (
    AudioBlock,
    CompactionBlock,
    ContentBlock,
    DocumentBlock,
    ImageBlock,
    Message,
    Role,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from gateway.session.compaction import files_note, render, summary_request, tokens

_ids = itertools.count()

IMAGE = ImageBlock("file_img", "image/png", 1234)
PDF = DocumentBlock("file_pdf", "application/pdf", 4000)
AUDIO = AudioBlock("file_wav", "audio/wav", 800)


def msg(role: Role, *content: ContentBlock) -> Message:
    return Message(f"msg_{next(_ids)}", "sess_1", "turn_1", role, list(content), "complete", 0)


def test_the_estimate_counts_an_image_a_document_and_no_audio() -> None:
    assert tokens([msg("user", TextBlock("abcd"))]) == 1
    assert tokens([msg("user", TextBlock("abcd"), IMAGE)]) == 1 + 1600
    assert tokens([msg("user", PDF)]) == 1000
    assert tokens([msg("user", AUDIO)]) == 0
    shot = ToolResultBlock("tu_1", "", files=[IMAGE, AUDIO])
    assert tokens([msg("user", shot)]) == 1600


def test_the_summary_call_reads_the_files_named_never_their_bytes() -> None:
    shot = ToolResultBlock("tu_1", "done", files=[IMAGE, AUDIO])
    messages = [
        msg("user", TextBlock("look"), PDF),
        msg("assistant", ToolUseBlock("tu_1", "shot", {})),
        msg("user", shot),
    ]
    assert render(messages).split("\n\n---\n\n") == [
        "user: look\n[document file_pdf application/pdf, 4000 bytes]",
        "assistant: [tool call shot] {}",
        "user: [tool result] done\n[image file_img image/png, 1234 bytes]"
        "\n[audio file_wav audio/wav, 800 bytes]",
    ]
    assert summary_request("m", messages, "sess_1").files == {}


def test_the_note_names_every_file_the_context_message_replaces() -> None:
    first = msg("user", TextBlock("a"), IMAGE)
    second = msg("user", ToolResultBlock("tu_1", "x", files=[AUDIO, IMAGE]), PDF)
    kept = msg("user", DocumentBlock("file_kept", "text/plain", 3))
    earlier = msg("context", CompactionBlock("sum", [first.id]))
    messages = [first, earlier, second, kept]
    assert files_note(messages, [first.id, second.id]) == (
        "Files in the replaced messages: file_img (image/png, 1234 bytes),"
        " file_wav (audio/wav, 800 bytes), file_pdf (application/pdf, 4000 bytes)"
    )
    assert files_note(messages, [kept.id]) == (
        "Files in the replaced messages: file_kept (text/plain, 3 bytes)"
    )
    assert files_note([msg("user", TextBlock("none"))], ["msg_x"]) == ""

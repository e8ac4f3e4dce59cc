"""``gateway chat``'s ``/attach`` (gateway.client.chat_attach): what it takes, and the content
of the next message (the integration: tests/system/client/test_chat.py)."""

from __future__ import annotations

from gateway.client.chat_attach import HELP, Attachments, is_attach_command
from gateway.client.files import media_type_for
from gateway.media import MEDIA_TYPES
from gateway.protocol.http import DocumentInput, FileStored, ImageInput
from gateway.protocol.shapes import TextBlock

PNG = FileStored("file_" + "a" * 32, "image/png", 12_595, "0" * 64)
PDF = FileStored("file_" + "b" * 32, "application/pdf", 191, "1" * 64)


def test_the_media_type_is_the_extensions_and_only_what_the_gateway_takes() -> None:
    assert media_type_for("/tmp/Shot.PNG") == "image/png"
    assert media_type_for("a.jpeg") == media_type_for("b.jpg") == "image/jpeg"
    assert media_type_for("notes.md") == "text/markdown"
    for refused in ("drawing.svg", "run.sh", "README", "archive.tar.gz", ".png.exe"):
        assert media_type_for(refused) is None, refused
    named = {
        media_type_for(f"x.{ext}")
        for ext in ("png", "jpg", "gif", "webp", "pdf", "txt", "md", "csv")
    }
    assert named == set(MEDIA_TYPES)


def test_the_next_message_carries_the_pending_files_first() -> None:
    attachments = Attachments()
    assert attachments.content("hi") == "hi" and attachments.summary() == ""
    attachments.pending += [PNG, PDF]
    assert attachments.content("What are these?") == [
        ImageInput(file_id=PNG.file_id),
        DocumentInput(file_id=PDF.file_id),
        TextBlock("What are these?"),
    ]
    assert attachments.summary() == (
        f"(attached to your next message: [image image/png 12.3 KiB {PNG.file_id}] "
        f"[document application/pdf 191 B {PDF.file_id}])"
    )
    attachments.sent()
    assert attachments.content("hi") == "hi"


def test_attach_and_help_are_its_commands() -> None:
    assert is_attach_command("/attach shot.png") and is_attach_command("  /attach")
    assert is_attach_command("/help")
    assert not is_attach_command("/attachment") and not is_attach_command("attach x")
    assert "/attach PATH" in HELP and "/queue TEXT" in HELP and "/quit" in HELP

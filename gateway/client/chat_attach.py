"""``gateway chat``'s ``/attach PATH`` and ``/help`` (docs/clients.md, "The terminal chat").

``/attach PATH`` uploads a file to the session (``POST /sessions/{id}/files``,
docs/protocol.md §2 "Files"), its media type from its name's extension
(:data:`gateway.client.files.EXTENSIONS`; any other is refused here, before
anything is sent), and holds it for the next message: the next line sent (a
turn, a ``/queue`` or a ``/steer``) carries the pending files first, then its
text. ``/attach`` alone lists what is pending; the prompt shows it too, one dim
line above it. A file the gateway refuses (not what its extension says, too
large, past a quota) is not attached, and the line says why.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import trio

from gateway.client.api import Session
from gateway.client.files import EXTENSIONS, TurnContent, file_block, media_type_for
from gateway.client.views import FileView, file_line
from gateway.errors import GatewayError
from gateway.protocol.http import DocumentInput, FileStored, ImageInput
from gateway.protocol.shapes import TextBlock

HELP = """\
commands:
  /attach PATH   upload a file (png, jpg, gif, webp, pdf, txt, md, csv) for your next message
  /attach        list the files waiting for your next message
  /queue TEXT    a turn that waits for the running one
  /steer TEXT    a message for the running turn to take before its next step
  /edit N TEXT   send TEXT in place of your N-th message
  /retry         your last message again, for a new answer
  /fork [ID]     fork the session (at its last message, or at message ID)
  /help          this list
  /quit          quit (also Ctrl-D)"""


def is_attach_command(line: str) -> bool:
    """``/attach`` (with or without a path) or ``/help``: handled by :class:`Attachments`."""
    return line.strip().partition(" ")[0] in ("/attach", "/help")


@dataclass
class Attachments:
    """The files uploaded for the next message (module docstring)."""

    pending: list[FileStored] = field(default_factory=list)

    def summary(self) -> str:
        """One line: what the next message carries, or ``""`` when nothing."""
        if not self.pending:
            return ""
        files = " ".join(file_line(_view(stored)) for stored in self.pending)
        return f"(attached to your next message: {files})"

    def content(self, text: str) -> TurnContent:
        """The turn's content: the pending files, then ``text`` (or the text alone)."""
        if not self.pending:
            return text
        blocks: list[ImageInput | DocumentInput | TextBlock] = [
            file_block(stored) for stored in self.pending
        ]
        return [*blocks, TextBlock(text)]

    def sent(self) -> None:
        """The next message went: nothing is pending any more."""
        self.pending.clear()

    async def command(self, session: Session, line: str) -> str:
        """``/attach [PATH]`` or ``/help``: what to write (a line, or :data:`HELP`)."""
        head, _, rest = line.strip().partition(" ")
        if head == "/help":
            return HELP
        path = str(await trio.Path(rest.strip()).expanduser()) if rest.strip() else ""
        if not path:
            return self.summary() or "(nothing attached: /attach PATH uploads a file)"
        media_type = media_type_for(path)
        if media_type is None:
            known = ", ".join(sorted(EXTENSIONS))
            return f"(not attached: {path}: the gateway takes files named {known})"
        try:
            data = await trio.Path(path).read_bytes()
        except OSError as exc:
            return f"(not attached: {path}: {exc.strerror or exc})"
        try:
            stored = await session.client.upload(session.id, data, media_type)
        except GatewayError as exc:  # 415, 422 invalid_file, 413, 429, the gateway away
            return f"(not attached: {path}: {exc.message})"
        self.pending.append(stored)
        return self.summary()


def _view(stored: FileStored) -> FileView:
    kind: Literal["image", "document"] = (
        "image" if isinstance(file_block(stored), ImageInput) else "document"
    )
    return {
        "type": kind,
        "file_id": stored.file_id,
        "media_type": stored.media_type,
        "size": stored.size,
        "open": False,
    }

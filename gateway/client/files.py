"""A session's files from the client library (docs/protocol.md §2 "Files").

:class:`FilesApi` is the part of :class:`gateway.client.GatewayClient` that
uploads and downloads files; the blocks a turn names them by are
:func:`image_block`, :func:`document_block` and :func:`file_block` (which
picks the kind by the file's media type)::

    stored = await gateway.upload(session_id, png_bytes, "image/png")
    await gateway.send_turn(session_id, [file_block(stored), TextBlock("What is this?")])

A turn's content may also hold the gateway's own blocks as they came in an
event (an :class:`~gateway.protocol.shapes.ImageBlock` read from a message:
its ``media_type`` and ``size`` are ignored), or plain dicts
(``{"type": "image", "file_id": ...}``), sent as they are.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import httpx
import msgspec

from gateway.client.stream import api_error, describe
from gateway.errors import ClientError
from gateway.media import IMAGE_TYPES
from gateway.protocol.http import DocumentInput, FileStored, ImageInput
from gateway.protocol.shapes import ContentBlock

TurnContent = str | Sequence[ContentBlock | ImageInput | DocumentInput | dict[str, Any]]
"""What a turn's content may be: text, or blocks (module docstring)."""

EXTENSIONS: Final = {
    ".png": "image/png",
    ".jpg": "image/jpeg",
    ".jpeg": "image/jpeg",
    ".gif": "image/gif",
    ".webp": "image/webp",
    ".pdf": "application/pdf",
    ".txt": "text/plain",
    ".md": "text/markdown",
    ".markdown": "text/markdown",
    ".csv": "text/csv",
}
"""The media type of a file by its name's extension (lower case): what ``/attach`` takes."""


def media_type_for(name: str) -> str | None:
    """The media type a file of this name is sent as, or ``None`` when the gateway takes none."""
    dot = name.rfind(".")
    return None if dot < 0 else EXTENSIONS.get(name[dot:].lower())


def image_block(file_id: str) -> ImageInput:
    """An image of a turn, by the id of a file of the session."""
    return ImageInput(file_id=file_id)


def document_block(file_id: str) -> DocumentInput:
    """A document (PDF or text) of a turn, by the id of a file of the session."""
    return DocumentInput(file_id=file_id)


def file_block(stored: FileStored) -> ImageInput | DocumentInput:
    """The block of a turn for an uploaded file: an image or a document, by its media type."""
    if stored.media_type in IMAGE_TYPES:
        return image_block(stored.file_id)
    return document_block(stored.file_id)


class FilesApi:
    """``POST /sessions/{id}/files`` and ``GET .../files/{file_id}``, on a client's ``http``."""

    http: httpx.AsyncClient

    async def upload(self, session_id: str, data: bytes, media_type: str) -> FileStored:
        """Store ``data`` as a file of the session; its id, media type, size and sha256.

        The same bytes again are the same file (content-addressed). Sent once:
        a lost answer is an error (upload again: the same bytes make no second file).

        Raises:
            ApiError: 415 ``unsupported_media_type`` (one of
                :data:`gateway.media.MEDIA_TYPES` only), 422 ``invalid_file`` (not
                what it says), 413 ``file_too_large``, 409 ``too_many_files``, 429
                ``quota_exceeded``, 404 ``session_not_found``.
            ClientError: ``unreachable``, ``not_a_gateway``.
        """
        path = f"/sessions/{session_id}/files"
        r = await self._request("POST", path, data, {"Content-Type": media_type})
        try:
            return msgspec.json.decode(r.content, type=FileStored)
        except msgspec.DecodeError as exc:
            why = f"POST {path}: not the gateway's answer: {exc}"
            raise ClientError("not_a_gateway", why) from None

    async def download(self, session_id: str, file_id: str) -> bytes:
        """The bytes of a file of the session.

        Raises:
            ApiError: 404 ``file_not_found`` (unknown, or another session's), 404
                ``session_not_found``.
        """
        r = await self._request("GET", f"/sessions/{session_id}/files/{file_id}", None, {})
        return r.content

    async def _request(
        self, method: str, path: str, content: bytes | None, headers: dict[str, Any]
    ) -> httpx.Response:
        try:
            r = await self.http.request(method, path, content=content, headers=headers)
        except httpx.TransportError as exc:
            why = f"cannot reach {self.http.base_url}: {describe(exc)}"
            raise ClientError("unreachable", why) from exc
        if not 200 <= r.status_code < 300:
            raise api_error(r)
        return r

"""A session's files: ``POST /sessions/{id}/files`` and ``GET .../files/{file_id}``
(docs/protocol.md §2 "Files").

The body of a POST is the file itself, its ``Content-Type`` one of
:data:`gateway.media.MEDIA_TYPES` (the router's 415 otherwise), up to
``[files] max_bytes`` (the transport's 413 ``file_too_large``, before the body
is read; gateway.app.large_bodies). A GET answers the bytes as a download,
never as something a browser renders: ``Content-Disposition: attachment``,
``X-Content-Type-Options: nosniff``, and a ``Content-Security-Policy`` that
runs nothing should a browser render it anyway.
"""

from __future__ import annotations

from gateway.doors.context import DoorContext
from gateway.http.server import Request, Response, json_response
from gateway.media import media_type_of
from gateway.protocol.http import FileStored

DOWNLOAD_HEADERS = (
    ("X-Content-Type-Options", "nosniff"),
    ("Content-Security-Policy", "default-src 'none'; sandbox"),
    ("Cache-Control", "private, max-age=31536000, immutable"),  # content-addressed...
    ("Vary", "Authorization"),  # ...for the key that fetched it: another asks again
)


class Files:
    """The handlers of a session's files (module docstring).

    Args:
        ctx: the doors' context (gateway.doors.context).
    """

    def __init__(self, ctx: DoorContext) -> None:
        self.ctx = ctx

    async def upload(self, req: Request, session_id: str) -> Response:
        """``POST /sessions/{id}/files``: 201 once the file is stored."""
        session = await self.ctx.session(session_id, self.ctx.authenticate(req))
        media_type = media_type_of(req.headers.get("content-type", ""))
        rec = await self.ctx.node.files.upload(
            session.id, session.record.owner, media_type, req.body
        )
        return json_response(201, FileStored(rec.file_id, rec.media_type, rec.size, rec.sha256))

    async def download(self, req: Request, session_id: str, file_id: str) -> Response:
        """``GET /sessions/{id}/files/{file_id}``: the bytes, as an attachment."""
        session = await self.ctx.session(session_id, self.ctx.authenticate(req))
        rec, data = await self.ctx.node.files.get(session.id, file_id)
        name = f"{rec.file_id}.{_EXTENSIONS.get(rec.media_type, 'bin')}"
        headers = [
            ("Content-Disposition", f'attachment; filename="{name}"'),
            ("ETag", f'"{rec.sha256}"'),
            *DOWNLOAD_HEADERS,
        ]
        # A text file is UTF-8 (gateway.media checked it): said so, never guessed.
        text = rec.media_type.startswith("text/")
        return Response(200, data, rec.media_type + ("; charset=utf-8" if text else ""), headers)


_EXTENSIONS = {
    "image/png": "png",
    "image/jpeg": "jpg",
    "image/gif": "gif",
    "image/webp": "webp",
    "application/pdf": "pdf",
    "text/plain": "txt",
    "text/markdown": "md",
    "text/csv": "csv",
    "audio/wav": "wav",
    "audio/mpeg": "mp3",
}

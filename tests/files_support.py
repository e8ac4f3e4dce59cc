"""Small real files for the tests of docs/protocol.md §2 "Files", made with Pillow."""

from __future__ import annotations

import hashlib
import io

from PIL import Image


def png(width: int = 4, height: int = 3, color: tuple[int, int, int] = (200, 30, 30)) -> bytes:
    """A real PNG of ``width`` x ``height`` pixels."""
    out = io.BytesIO()
    Image.new("RGB", (width, height), color).save(out, "PNG")
    return out.getvalue()


def jpeg(width: int = 4, height: int = 3) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, height), (10, 120, 200)).save(out, "JPEG")
    return out.getvalue()


PDF = (
    b"%PDF-1.4\n1 0 obj<</Type/Catalog/Pages 2 0 R>>endobj\n"
    b"2 0 obj<</Type/Pages/Kids[3 0 R]/Count 1>>endobj\n"
    b"3 0 obj<</Type/Page/Parent 2 0 R/MediaBox[0 0 72 72]>>endobj\n"
    b"trailer<</Root 1 0 R>>\n%%EOF\n"
)
"""A minimal PDF: its header and end marker (what the gateway checks)."""


def said_back(kind: str, media_type: str, data: bytes) -> str:
    """The scripted model's line for a file it was sent, after a newline (docs/protocol.md
    §11 "The scripted model"): proof that these very bytes reached the model."""
    digest = hashlib.sha256(data).hexdigest()[:8]
    return f"\n[{kind} {media_type} {len(data)} bytes sha256:{digest}]"

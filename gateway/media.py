"""What a file is: its type checked against its bytes (docs/protocol.md §2 "Files").

A file sent to the gateway (``POST /sessions/{id}/files``, an inline image of a
turn, a data URL of the AI SDK's door) declares a media type; :func:`check`
takes it only if the bytes are one:

- an image (PNG, JPEG, GIF, WebP) must be that format by its magic bytes and
  decode whole with Pillow (a PNG must also end with its ``IEND`` chunk:
  Pillow decodes one cut short after its last pixel), and its size is read
  from the header *before* any pixel is decoded, so a decompression bomb (a
  small file of a huge picture) is refused without being expanded: at most
  ``max_pixels`` pixels, and 8,000 pixels a side (what Claude takes at all);
- a PDF begins with ``%PDF-`` and has its ``%%EOF`` marker in its last KiB;
- text (plain, Markdown, CSV) is UTF-8 without a NUL byte.

SVG and every type not listed are 415 ``unsupported_media_type``: an SVG is a
document that may hold script, and the gateway never serves one to a browser.
A file that is not what it says is 422 ``invalid_file``. The check is CPU work
on up to ``[files] max_bytes`` of data: callers run it in a worker thread
(:meth:`gateway.session.files.Files.upload`).
"""

from __future__ import annotations

import functools
import io
import struct
import warnings
import zlib
from typing import Final

from gateway.errors import ApiError

IMAGE_TYPES: Final = ("image/png", "image/jpeg", "image/gif", "image/webp")
DOCUMENT_TYPES: Final = ("application/pdf", "text/plain", "text/markdown", "text/csv")
MEDIA_TYPES: Final = IMAGE_TYPES + DOCUMENT_TYPES
"""What ``POST /sessions/{id}/files`` takes (docs/protocol.md §2 "Files")."""

MAX_SIDE: Final = 8000
"""The longest side of an image, in pixels (Claude's own limit)."""

_PILLOW_FORMATS: Final = {
    "image/png": "PNG",
    "image/jpeg": "JPEG",
    "image/gif": "GIF",
    "image/webp": "WEBP",
}
_PNG_END: Final = b"\x00\x00\x00\x00IEND\xaeB`\x82"
"""A PNG's last chunk, whole: IEND, empty, with its CRC."""
_MAGIC: Final = {
    "image/png": (b"\x89PNG\r\n\x1a\n",),
    "image/jpeg": (b"\xff\xd8\xff",),
    "image/gif": (b"GIF87a", b"GIF89a"),
    "image/webp": (b"RIFF",),
}


def media_type_of(content_type: str) -> str:
    """A ``Content-Type`` header's media type: parameters dropped, lower case."""
    return content_type.partition(";")[0].strip().lower()


def accepted(media_type: str) -> str:
    """``media_type`` if the gateway takes files of it, else 415 ``unsupported_media_type``."""
    if media_type in MEDIA_TYPES:
        return media_type
    shown = repr(media_type[:100]) if media_type else "none"
    why = " (an SVG may hold script)" if "svg" in media_type else ""
    raise ApiError(
        415,
        "unsupported_media_type",
        f"a file's media type must be one of {', '.join(MEDIA_TYPES)}; got {shown}{why}",
    )


def kind_of(media_type: str) -> str:
    """The block a file of this type is in a turn: ``"image"`` or ``"document"``."""
    return "image" if media_type in IMAGE_TYPES else "document"


def check(media_type: str, data: bytes, *, max_pixels: int) -> None:
    """Refuse ``data`` unless it is a file of ``media_type`` (module docstring).

    Raises:
        ApiError: 415 ``unsupported_media_type``, 422 ``invalid_file``.
    """
    accepted(media_type)
    if not data:
        raise _invalid(media_type, "it is empty")
    if media_type in IMAGE_TYPES:
        _check_image(media_type, data, max_pixels)
    elif media_type == "application/pdf":
        if not data.startswith(b"%PDF-") or b"%%EOF" not in data[-1024:]:
            raise _invalid(media_type, "it does not begin with %PDF- and end with %%EOF")
    else:
        if b"\x00" in data:
            raise _invalid(media_type, "text holds a NUL byte")
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise _invalid(media_type, f"text is not UTF-8 (byte {exc.start})") from None


def _check_image(media_type: str, data: bytes, max_pixels: int) -> None:
    from PIL import Image

    if not data.startswith(_MAGIC[media_type]) or (
        media_type == "image/webp" and data[8:12] != b"WEBP"
    ):
        raise _invalid(media_type, "its first bytes are not that format's")
    if media_type == "image/png" and not data.endswith(_PNG_END):
        # Pillow decodes a PNG cut short after its last pixel (its IEND chunk gone,
        # its last CRC cut): a model's API may not, so it is refused here, not later.
        raise _invalid(media_type, "it does not end with its IEND chunk (cut short?)")
    _bombs_are_errors()
    try:
        with Image.open(io.BytesIO(data), formats=[_PILLOW_FORMATS[media_type]]) as image:
            width, height = image.size
            if width > MAX_SIDE or height > MAX_SIDE or width * height > max_pixels:
                raise _invalid(
                    media_type,
                    f"{width}x{height} pixels is over the limit ({MAX_SIDE} a side, "
                    f"{max_pixels} in all)",
                )
            image.load()  # decodes every pixel: a truncated or corrupt image fails here
    except ApiError:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise _invalid(media_type, f"it decodes to too many pixels ({exc})") from None
    except Exception as exc:  # Pillow's errors are OSError, ValueError, SyntaxError...
        raise _invalid(media_type, f"it does not decode as one ({exc})") from None


@functools.cache
def _bombs_are_errors() -> None:
    """Pillow's ``DecompressionBombWarning`` (an image over its own pixel limit, warned of
    as it is opened) raised as an error, once for the process.

    A ``warnings.catch_warnings`` around each check changed the process's filters
    for its duration: checks run in worker threads, two at once, and two that
    overlapped left the filters as one of them found them, not as they were.
    """
    from PIL import Image

    warnings.filterwarnings("error", category=Image.DecompressionBombWarning)


def _invalid(media_type: str, why: str) -> ApiError:
    return ApiError(422, "invalid_file", f"the file is not a valid {media_type}: {why}")


_PNG_SIGNATURE: Final = b"\x89PNG\r\n\x1a\n"


def png_repaired(data: bytes) -> bytes:
    """A PNG without its ancillary chunks whose CRC is wrong, as libpng reads it (else ``data``).

    libpng drops such a chunk with a warning, and browsers show the picture;
    Pillow refuses the whole file. A tool's image is read the libpng way
    before it is checked (gateway.session.tool_round): the MCP logo of MCP's
    reference server (``get-tiny-image``) carries an ``iCCP`` chunk with a
    wrong CRC. A critical chunk (``IHDR``, ``IDAT``...) with a wrong CRC, or
    bytes that are not a sequence of chunks, are left as they are, for
    :func:`check` to refuse.
    """
    if not data.startswith(_PNG_SIGNATURE):
        return data
    kept = [_PNG_SIGNATURE]
    at, dropped = len(_PNG_SIGNATURE), False
    while at < len(data):
        if at + 12 > len(data):
            return data
        (length,) = struct.unpack(">I", data[at : at + 4])
        end = at + 12 + length
        if end > len(data):
            return data
        kind, body = data[at + 4 : at + 8], data[at + 8 : at + 8 + length]
        (crc,) = struct.unpack(">I", data[end - 4 : end])
        if crc != zlib.crc32(kind + body):
            if not kind[0] & 0x20:  # critical (an upper-case first letter)
                return data
            dropped = True
        else:
            kept.append(data[at:end])
        at = end
    return b"".join(kept) if dropped else data

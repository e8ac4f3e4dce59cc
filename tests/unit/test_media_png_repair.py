"""A tool's PNG read as libpng reads it (gateway.media.png_repaired, docs/protocol.md §2
"Files"): an ancillary chunk with a wrong CRC dropped, anything else left to the check."""

from __future__ import annotations

import struct
import zlib

import pytest

from gateway import media
from gateway.errors import ApiError
from tests.files_support import png

PIXELS = 1_000_000


def chunk(kind: bytes, body: bytes, *, crc: int | None = None) -> bytes:
    good = zlib.crc32(kind + body)
    return (
        struct.pack(">I", len(body)) + kind + body + struct.pack(">I", good if crc is None else crc)
    )


def with_chunk(image: bytes, extra: bytes) -> bytes:
    """``image`` with ``extra`` right after its IHDR chunk (8 + 25 bytes in)."""
    return image[:33] + extra + image[33:]


def test_an_ancillary_chunk_with_a_wrong_crc_is_dropped_and_the_image_then_checks() -> None:
    image = png()
    broken = with_chunk(image, chunk(b"iCCP", b"profile\0\0" + b"x" * 40, crc=0))
    with pytest.raises(ApiError) as err:  # Pillow refuses it whole
        media.check("image/png", broken, max_pixels=PIXELS)
    assert err.value.code == "invalid_file"
    repaired = media.png_repaired(broken)
    assert repaired == image
    media.check("image/png", repaired, max_pixels=PIXELS)
    # A sound ancillary chunk is kept: nothing changes.
    sound = with_chunk(image, chunk(b"tEXt", b"Comment\0hello"))
    assert media.png_repaired(sound) is sound


@pytest.mark.parametrize(
    "data",
    [
        with_chunk(png(), chunk(b"IDAT", b"\x00" * 8, crc=1)),  # critical: left to the check
        png()[:-5],  # cut short inside a chunk
        png()[:-12] + b"\x00\x00\x00\x50",  # a length past the end
        b"GIF89a" + b"\x00" * 20,  # not a PNG at all
        png(),  # sound
    ],
)
def test_anything_else_is_left_as_it_is(data: bytes) -> None:
    assert media.png_repaired(data) is data

"""The client library's files (gateway.client.files; docs/clients.md) against a real gateway.

``upload`` and ``download`` give back the same bytes; ``send_turn`` takes image and
document blocks by file id (the helpers, the gateway's own blocks read from a message,
plain dicts); a session's state and both views show the files by reference, never
their bytes; what the gateway refuses is one ``ApiError``.
"""

from __future__ import annotations

import base64

import pytest
import trio

from gateway.client import GatewayClient, document_block, file_block, image_block
from gateway.client.views import file_line, human_size
from gateway.errors import ApiError
from gateway.protocol.shapes import DocumentBlock, ImageBlock, TextBlock
from tests.conftest import Harness
from tests.files_support import PDF, png


async def test_upload_download_and_a_turn_with_an_image_and_a_document(gw: Harness) -> None:
    picture = png(12, 7)
    with trio.fail_after(30):
        async with GatewayClient(gw.base) as client:
            sid = (await client.create_session()).session_id
            image = await client.upload(sid, picture, "image/png")
            paper = await client.upload(sid, PDF, "application/pdf")
            assert (image.media_type, image.size) == ("image/png", len(picture))
            assert image.file_id.startswith("file_") and len(image.sha256) == 64
            assert await client.download(sid, image.file_id) == picture
            assert await client.download(sid, paper.file_id) == PDF
            assert (await client.upload(sid, picture, "image/png")).file_id == image.file_id
            async with client.open_session(sid) as session:
                turn_id = await session.send(
                    [file_block(image), file_block(paper), TextBlock("What are these?")]
                )
                async for _ in session:
                    if session.turn_ended(turn_id):
                        break
                asked = session.state.messages[0]
                full, simple = session.full, session.simple
            # The gateway's own blocks, read back from a message, may be sent as they are,
            # and so may plain dicts.
            again = [*asked.content[:2], {"type": "text", "text": "And again?"}]
            await client.send_turn(sid, again)
            by_id = [image_block(image.file_id), document_block(paper.file_id), TextBlock("x")]
            await client.submit_turn(sid, by_id, if_busy="queue")

    assert asked.content[:2] == [
        ImageBlock(image.file_id, "image/png", len(picture)),
        DocumentBlock(paper.file_id, "application/pdf", len(PDF)),
    ]
    views = [
        {"type": "image", "file_id": image.file_id, "media_type": "image/png",
         "size": len(picture), "open": False},
        {"type": "document", "file_id": paper.file_id, "media_type": "application/pdf",
         "size": len(PDF), "open": False},
    ]  # fmt: skip
    assert full["messages"][0]["blocks"][:2] == views
    assert simple["thread"][0]["files"] == views
    assert simple["thread"][0]["text"] == "What are these?"
    assert "files" not in simple["thread"][1]
    encoded = base64.b64encode(picture).decode()
    assert encoded not in repr(session.state.state())  # references only, never the bytes
    assert file_line(views[0]) == f"[image image/png {len(picture)} B {image.file_id}]"


async def test_what_the_gateway_refuses_is_one_api_error(gw: Harness) -> None:
    with trio.fail_after(30):
        async with GatewayClient(gw.base) as client:
            sid = (await client.create_session()).session_id
            other = (await client.create_session()).session_id
            stored = await client.upload(sid, png(), "image/png")
            with pytest.raises(ApiError) as svg:
                await client.upload(
                    sid, b"<svg xmlns='http://www.w3.org/2000/svg'/>", "image/svg+xml"
                )
            assert (svg.value.status, svg.value.code) == (415, "unsupported_media_type")
            with pytest.raises(ApiError) as not_png:
                await client.upload(sid, b"\x89PNG\r\n\x1a\nnot really", "image/png")
            assert (not_png.value.status, not_png.value.code) == (422, "invalid_file")
            with pytest.raises(ApiError) as elsewhere:
                await client.download(other, stored.file_id)
            assert (elsewhere.value.status, elsewhere.value.code) == (404, "file_not_found")
            with pytest.raises(ApiError) as unknown:
                await client.send_turn(other, [image_block(stored.file_id), TextBlock("hm")])
            assert (unknown.value.status, unknown.value.code) == (422, "unknown_file")


def test_sizes_are_shown_in_bytes_kib_and_mib() -> None:
    sizes = (0, 1023, 1024, 1280, 12_595, 5 * 1024 * 1024, 1_572_864 + 52_429)
    assert [human_size(n) for n in sizes] == [
        "0 B",
        "1023 B",
        "1.0 KiB",
        "1.3 KiB",  # a half rounds up, in the JS as here (tests/streaming-conformance)
        "12.3 KiB",
        "5.0 MiB",
        "1.6 MiB",
    ]

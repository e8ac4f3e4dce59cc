"""``POST /sessions/{id}/files``, ``GET .../files/{file_id}`` and file blocks in a turn,
end to end over real sockets (docs/protocol.md §2 "Files")."""

from __future__ import annotations

import base64
import hashlib

from tests.conftest import Harness
from tests.files_support import PDF, png
from tests.integration.doors.rest.test_http_api import assert_error


async def upload(gw: Harness, sid: str, data: bytes, media_type: str) -> dict[str, object]:
    r = await gw.http.post(
        f"/sessions/{sid}/files", content=data, headers={"Content-Type": media_type}
    )
    assert r.status_code == 201, r.text
    return dict(r.json())


async def test_a_file_is_stored_once_and_given_back_as_an_attachment(gw: Harness) -> None:
    sid = await gw.create_session()
    image = png()
    first = await upload(gw, sid, image, "image/png")
    digest = hashlib.sha256(image).hexdigest()
    assert first == {
        "file_id": "file_" + digest[:32],
        "media_type": "image/png",
        "size": len(image),
        "sha256": digest,
    }
    assert await upload(gw, sid, image, "image/png") == first  # content-addressed
    r = await gw.http.get(f"/sessions/{sid}/files/{first['file_id']}")
    assert r.status_code == 200 and r.content == image
    assert r.headers["content-type"] == "image/png"
    assert r.headers["content-disposition"].startswith("attachment")
    assert r.headers["x-content-type-options"] == "nosniff"
    # Kept by a browser for a year, for the key that fetched it (docs/protocol.md §2 "Files").
    assert r.headers["cache-control"] == "private, max-age=31536000, immutable"
    assert "Authorization" in r.headers.get_list("vary"), r.headers


async def test_a_turn_names_files_and_the_wire_carries_references_only(gw: Harness) -> None:
    sid = await gw.create_session()
    image, doc = png(), await upload(gw, sid, PDF, "application/pdf")
    inline = {"type": "base64", "media_type": "image/png", "data": base64.b64encode(image).decode()}
    content = [
        {"type": "text", "text": "look"},
        {"type": "image", "source": inline},
        {"type": "document", "file_id": doc["file_id"]},
    ]
    r = await gw.http.post(f"/sessions/{sid}/turns", json={"content": content})
    assert r.status_code == 202, r.text
    messages = (await gw.http.get(f"/sessions/{sid}/messages")).json()["messages"]
    blocks = messages[0]["content"]
    assert blocks[1] == {
        "type": "image",
        "file_id": "file_" + hashlib.sha256(image).hexdigest()[:32],
        "media_type": "image/png",
        "size": len(image),
    }
    assert blocks[2]["type"] == "document" and blocks[2]["file_id"] == doc["file_id"]


async def test_what_is_not_a_file_of_its_type_is_refused(gw: Harness) -> None:
    sid = await gw.create_session()
    for data, media_type, status, code in [
        (b"<svg onload='alert(1)'/>", "image/svg+xml", 415, "unsupported_media_type"),
        (b"\x89PNG\r\n\x1a\n" + b"not a png" * 10, "image/png", 422, "invalid_file"),
        (b"hello", "application/pdf", 422, "invalid_file"),
        (b"\xff\xfe bad", "text/plain", 422, "invalid_file"),
    ]:
        r = await gw.http.post(
            f"/sessions/{sid}/files", content=data, headers={"Content-Type": media_type}
        )
        assert_error(r, status, code)
    r = await gw.http.post(
        f"/sessions/{sid}/turns",
        json={"content": [{"type": "image", "file_id": "file_" + "0" * 32}]},
    )
    assert_error(r, 422, "unknown_file")


async def test_an_inline_files_media_type_is_read_as_an_uploads_content_type(gw: Harness) -> None:
    """An inline file is taken as its upload is (docs/protocol.md §2 "Files"): a media type
    in upper case, or with parameters (``; charset=utf-8``), is the same type."""
    sid = await gw.create_session()
    for kind, media_type, uploaded, data, kept_as in [
        ("document", "text/plain; charset=utf-8", b"uploaded", b"inline", "text/plain"),
        ("image", "Image/PNG", png(5, 4), png(4, 5), "image/png"),
    ]:
        assert (await upload(gw, sid, uploaded, media_type))["media_type"] == kept_as
        source = {
            "type": "base64",
            "media_type": media_type,
            "data": base64.b64encode(data).decode(),
        }
        body = {"content": [{"type": kind, "source": source}], "if_busy": "queue"}
        r = await gw.http.post(f"/sessions/{sid}/turns", json=body)
        assert r.status_code == 202, r.text
        r = await gw.http.get(f"/sessions/{sid}/files/file_{hashlib.sha256(data).hexdigest()[:32]}")
        assert r.status_code == 200 and r.content == data
        assert r.headers["content-type"].partition(";")[0] == kept_as

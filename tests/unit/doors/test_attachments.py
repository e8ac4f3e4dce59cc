"""How a door reads a file named by URL (gateway.doors.attachments; docs/doors/aisdk.md "Files").

Pure: data URLs decoded, the gateway's own file URLs recognised for the
session the message goes to only, anything else refused with a code that says
why (the gateway fetches nothing from the network).
"""

from __future__ import annotations

import base64
import hashlib

import pytest

from gateway.doors.attachments import Inline, Sent, Served, attachment, file_url, inline
from gateway.errors import ApiError
from tests.files_support import PDF, png

FILE = "file_" + "0123456789abcdef" * 2
IMAGE = png()
PNG_URL = "data:image/png;base64," + base64.b64encode(IMAGE).decode()


def refused(url: str, media_type: str | None = "image/png", session: str = "chat-1") -> ApiError:
    with pytest.raises(ApiError) as caught:
        attachment(url, media_type, None, session, "parts[0]")
    assert "parts[0]" in str(caught.value) or caught.value.status == 415
    return caught.value


def test_a_data_url_is_its_bytes_with_the_id_they_will_have() -> None:
    got = attachment(PNG_URL, "image/png", None, "chat-1", "parts[0]")
    assert got == Inline("image/png", IMAGE, "image")
    assert isinstance(got, Inline)
    assert got.file_id == "file_" + hashlib.sha256(IMAGE).hexdigest()[:32]
    pdf = attachment(
        "data:application/pdf;base64," + base64.b64encode(PDF).decode(), None, None, "c", "p"
    )
    assert isinstance(pdf, Inline) and pdf.kind == "document"
    # Text, percent-encoded (no ;base64), its charset dropped; the part's type if the URL has none.
    text = attachment("data:text/plain;charset=utf-8,caf%C3%A9", "text/plain", None, "c", "p")
    assert isinstance(text, Inline) and text.data == "café".encode()
    bare = attachment(
        "data:;base64," + base64.b64encode(IMAGE).decode(), "image/png", None, "c", "p"
    )
    assert isinstance(bare, Inline) and bare.media_type == "image/png"


def test_a_url_the_gateway_served_for_this_session_is_that_file() -> None:
    for url in (
        f"/sessions/chat-1/files/{FILE}",
        f"http://127.0.0.1:8080/sessions/chat-1/files/{FILE}",
        f"https://gw.example/sessions/chat-1/files/{FILE}?key=k",
        file_url("https://gw.example/", "chat-1", FILE),
    ):
        assert attachment(url, "image/png", None, "chat-1", "p") == Served(FILE, "image")
    assert attachment(f"/sessions/chat-1/files/{FILE}", None, None, "chat-1", "p") == Served(
        FILE, None
    )


def test_another_sessions_file_and_any_other_url_are_refused_saying_why() -> None:
    other = refused(f"/sessions/chat-2/files/{FILE}")
    assert (other.status, other.code) == (422, "unknown_file")
    for url in (
        "https://example.com/cat.png",
        f"https://example.com/proxy/sessions/chat-1/files/{FILE}",
        f"ftp://gw.example/sessions/chat-1/files/{FILE}",
        f"file:///sessions/chat-1/files/{FILE}",
        "http://169.254.169.254/latest/meta-data/",
        f"/sessions/chat-1/files/{FILE}/../../x",
        "cat.png",
        "",
    ):
        e = refused(url)
        assert (e.status, e.code) == (422, "unsupported_file_url"), url
        assert "fetches nothing" in str(e)


def test_a_bad_data_url_and_an_svg_are_refused() -> None:
    for url, code in (
        ("data:image/png;base64", "invalid_body"),  # no comma
        ("data:image/png;base64,not base64!", "invalid_body"),
        ("data:image/jpeg;base64," + base64.b64encode(IMAGE).decode(), "invalid_body"),  # != part
    ):
        assert refused(url).code == code, url
    svg = base64.b64encode(b"<svg onload='alert(1)'/>").decode()
    e = refused("data:image/svg+xml;base64," + svg, "image/svg+xml")
    assert (e.status, e.code) == (415, "unsupported_media_type") and "script" in str(e)
    # A stored file is what it was stored as, whatever type a part gives it.
    for said in ("image/svg+xml", "image/*", "application/octet-stream"):
        assert attachment(f"/sessions/chat-1/files/{FILE}", said, None, "chat-1", "p") == Served(
            FILE, None
        )


def test_an_inline_part_and_its_declared_kind() -> None:
    data = base64.b64encode(IMAGE).decode()
    assert inline(data, "image/png", "image", "content[0]") == Inline("image/png", IMAGE, "image")
    with pytest.raises(ApiError, match="no document") as caught:
        inline(data, "image/png", "document", "content[0]")
    assert caught.value.code == "invalid_body"
    with pytest.raises(ApiError, match="not base64"):
        inline("%%%", "image/png", "image", "content[0]")


def test_a_message_is_its_text_and_its_files_in_order() -> None:
    image = Inline("image/png", IMAGE, "image")
    said = Sent([image, "what ", Served(FILE, None), "is it?"])
    assert said.text == "what is it?" and said.file_ids == [image.file_id, FILE]
    assert not said.empty() and Sent([""]).empty() and not Sent([image]).empty()


def test_under_public_urls_path_a_url_is_the_gateways_and_under_no_other() -> None:
    base = "https://example.org/gw/"
    served = file_url(base, "chat-1", FILE)
    assert served == f"https://example.org/gw/sessions/chat-1/files/{FILE}"
    for url in (served, f"/gw/sessions/chat-1/files/{FILE}", f"/sessions/chat-1/files/{FILE}"):
        assert attachment(url, None, None, "chat-1", "p", base) == Served(FILE, None)
    for url in (
        f"https://example.org/other/sessions/chat-1/files/{FILE}",
        f"https://example.org/gwx/sessions/chat-1/files/{FILE}",
    ):
        with pytest.raises(ApiError) as caught:
            attachment(url, None, None, "chat-1", "p", base)
        assert caught.value.code == "unsupported_file_url", url
    with pytest.raises(ApiError) as caught:
        attachment(file_url(base, "chat-2", FILE), None, None, "chat-1", "p", base)
    assert caught.value.code == "unknown_file"

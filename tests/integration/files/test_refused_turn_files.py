"""A turn refused for its own files keeps none of them (docs/protocol.md §2 "Files",
"In a turn"): every block is checked, the model's refusal included, before an inline
file is kept. Real sockets; the quota and the session's count are the files kept."""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path

from bench.fake_api import FakeServer
from gateway.providers.factory import make_provider
from tests.aisdk_support import request as aisdk_request
from tests.conftest import Harness, make_config, running_gateway
from tests.files_support import PDF, png
from tests.integration.doors.agui.test_agui_files import run_input
from tests.integration.doors.rest.test_http_api import assert_error
from tests.integration.files.test_files_to_models import openai_config
from tests.provider_support import server as server


def inline(media_type: str, data: bytes) -> dict[str, str]:
    return {"type": "base64", "media_type": media_type, "data": base64.b64encode(data).decode()}


def file_id(data: bytes) -> str:
    return "file_" + hashlib.sha256(data).hexdigest()[:32]


async def kept(gw: Harness, sid: str, data: bytes) -> bool:
    r = await gw.http.get(f"/sessions/{sid}/files/{file_id(data)}")
    assert r.status_code in (200, 404), r.text
    return r.status_code == 200


async def test_a_turn_refused_for_a_block_keeps_none_of_its_inline_files(gw: Harness) -> None:
    sid = await gw.create_session()
    image, other = png(5, 5), png(6, 6)
    # An image block whose inline bytes are a PDF: refused, the PDF not kept.
    r = await gw.http.post(
        f"/sessions/{sid}/turns",
        json={"content": [{"type": "image", "source": inline("application/pdf", PDF)}]},
    )
    assert_error(r, 422, "invalid_body")
    assert not await kept(gw, sid, PDF)
    # An inline image, then a file id that is none of the session's: neither kept.
    content = [
        {"type": "image", "source": inline("image/png", image)},
        {"type": "image", "file_id": "file_" + "0" * 32},
        {"type": "image", "source": inline("image/png", other)},
    ]
    r = await gw.http.post(f"/sessions/{sid}/turns", json={"content": content})
    assert_error(r, 422, "unknown_file")
    assert not await kept(gw, sid, image)
    assert not await kept(gw, sid, other)


async def test_a_file_the_model_cannot_take_is_not_kept(tmp_path: Path, server: FakeServer) -> None:
    config = openai_config(tmp_path, server)
    provider = make_provider(config, {})
    try:
        async with running_gateway(config, provider) as gw:
            sid = await gw.create_session()
            content = [
                {"type": "image", "source": inline("image/png", png())},
                {"type": "document", "source": inline("application/pdf", PDF)},
            ]
            r = await gw.http.post(f"/sessions/{sid}/turns", json={"content": content})
            assert_error(r, 422, "unsupported_content")
            assert not await kept(gw, sid, png())
            assert not await kept(gw, sid, PDF)
            # Through the AI SDK door too, to a chat that exists.
            url = f"data:application/pdf;base64,{base64.b64encode(PDF).decode()}"
            part = {"type": "file", "mediaType": "application/pdf", "url": url}
            message = {"id": "u1", "role": "user", "parts": [part]}
            r = await gw.http.post("/ai-sdk/chat", json=aisdk_request(sid, message))
            assert_error(r, 422, "unsupported_content")
            assert not await kept(gw, sid, PDF)
            assert server.requests == []
    finally:
        await provider.aclose()


async def test_a_new_chat_whose_file_the_model_cannot_take_is_not_made(
    tmp_path: Path, server: FakeServer
) -> None:
    config = openai_config(tmp_path, server)
    provider = make_provider(config, {})
    url = f"data:application/pdf;base64,{base64.b64encode(PDF).decode()}"
    try:
        async with running_gateway(config, provider) as gw:
            part = {"type": "file", "mediaType": "application/pdf", "url": url}
            message = {"id": "u1", "role": "user", "parts": [part]}
            r = await gw.http.post("/ai-sdk/chat", json=aisdk_request("chat-pdf", message))
            assert_error(r, 422, "unsupported_content")
            assert (await gw.http.get("/sessions/chat-pdf")).status_code == 404  # none made
            document = {"type": "document", "source": {"type": "url", "value": url}}
            r = await gw.http.post("/agui", json=run_input("thread-pdf", [document]))
            assert_error(r, 422, "unsupported_content")
            assert (await gw.http.get("/sessions/thread-pdf")).status_code == 404
    finally:
        await provider.aclose()


async def test_a_turn_refused_for_a_later_inline_files_bytes_keeps_none(gw: Harness) -> None:
    """An inline file's own check (its type, its bytes) is one of the turn's block checks:
    a later block that is no PNG, of a type the gateway does not take, or empty keeps
    no earlier inline file."""
    sid = await gw.create_session()
    image = png(7, 7)
    for bad, status, code in [
        ({"type": "image", "source": inline("image/png", b"no png")}, 422, "invalid_file"),
        (
            {"type": "image", "source": inline("image/svg+xml", b"<svg/>")},
            415,
            "unsupported_media_type",
        ),
        ({"type": "document", "source": inline("text/plain", b"")}, 422, "invalid_file"),
    ]:
        content = [{"type": "image", "source": inline("image/png", image)}, bad]
        r = await gw.http.post(f"/sessions/{sid}/turns", json={"content": content})
        assert_error(r, status, code)
        assert not await kept(gw, sid, image)
    assert await gw.node.store.files_of(sid) == []


async def test_a_limit_is_checked_as_each_inline_file_is_kept(tmp_path: Path) -> None:
    """The limits are the store's, one file at a time (docs/protocol.md §2 "Files"): a
    turn whose second inline file passes max_per_session keeps its first."""
    config = make_config(tmp_path, **{"files.max_per_session": 2})
    async with running_gateway(config) as gw:
        sid = await gw.create_session()
        first, second, third = png(3, 3), png(4, 4), png(5, 5)
        r = await gw.http.post(
            f"/sessions/{sid}/files", content=first, headers={"Content-Type": "image/png"}
        )
        assert r.status_code == 201, r.text
        content = [
            {"type": "image", "source": inline("image/png", second)},
            {"type": "image", "source": inline("image/png", third)},
        ]
        r = await gw.http.post(f"/sessions/{sid}/turns", json={"content": content})
        assert_error(r, 409, "too_many_files")
        assert await kept(gw, sid, second)
        assert not await kept(gw, sid, third)

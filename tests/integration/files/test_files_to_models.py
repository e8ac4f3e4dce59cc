"""A turn's files reach the model, end to end over real sockets (docs/protocol.md §2
"Files", "To the model"; §11 "Providers", "The scripted model"; §12).

- Anthropic (the real SDK on :class:`bench.fake_api.FakeServer`, which records
  each request): a PNG, a PDF and a text file posted to ``POST
  /sessions/{id}/files`` and named in a turn arrive as ``image`` and
  ``document`` blocks whose base64 decodes to the very bytes posted.
- OpenAI-compatible (the same fake server): the PNG is an ``image_url`` data
  URL of the same bytes, the text a text part; a PDF is 422
  ``unsupported_content`` at ``POST .../turns``, and the server is never called.
- The scripted model says back what it received (kind, media type, size,
  sha256 prefix), so the whole path is proven offline.
- A compaction names the files of the messages it replaced in its summary.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import trio

from bench.fake_api import FakeServer
from gateway.protocol.events import Event
from gateway.protocol.shapes import TextBlock
from gateway.providers.factory import make_provider
from tests.aisdk_support import request as aisdk_request
from tests.conftest import Harness, make_config, running_gateway
from tests.files_support import PDF, png, said_back
from tests.integration.doors.agui.test_agui_files import run_input
from tests.integration.doors.rest.test_http_api import assert_error
from tests.integration.files.test_file_routes import upload
from tests.provider_support import ANTHROPIC, OPENAI, ignore_unfinalized_generators
from tests.provider_support import server as server

# The SDKs leave their inner async generators to Trio's finalizer when a stream
# ends (tests/integration/providers/test_provider_anthropic.py says why).
pytestmark = ignore_unfinalized_generators(
    "anthropic", "httpx2", "httpcore2", "httpx", "httpcore", "httpx_sse"
)

NOTES = "# Notes\n\nplain *text*, é\n".encode()


async def turn(gw: Harness, sid: str, content: list[dict[str, Any]]) -> list[Event]:
    """Post a turn of these blocks; its events until it ends."""
    async with gw.client(sid) as client:
        await client.subscribe()
        r = await gw.http.post(f"/sessions/{sid}/turns", json={"content": content})
        assert r.status_code == 202, r.text
        with trio.fail_after(20):
            return await client.until_turn_ends()


def reply(events: list[Event]) -> str:
    """The text of the turn's last assistant message."""
    [*_, done] = [e for e in events if e.type == "message.complete"]
    return "".join(b.text for b in done.payload.final_content if isinstance(b, TextBlock))


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


async def test_a_png_a_pdf_and_a_text_reach_anthropic_as_blocks_of_the_same_bytes(
    tmp_path: Path, server: FakeServer
) -> None:
    server.enqueue(ANTHROPIC.sse("text"))
    config = make_config(
        tmp_path,
        **{
            "model.provider": "anthropic",
            "model.name": ANTHROPIC.model,
            "model.base_url": server.base_url,
            "model.max_retries": 0,
        },
    )
    provider = make_provider(config, {"ANTHROPIC_API_KEY": ANTHROPIC.key})
    image = png(5, 4)
    try:
        async with running_gateway(config, provider) as gw:
            sid = await gw.create_session()
            ids = [
                (await upload(gw, sid, data, media))["file_id"]
                for data, media in [(image, "image/png"), (PDF, "application/pdf")]
            ]
            notes = await upload(gw, sid, NOTES, "text/markdown")
            events = await turn(
                gw,
                sid,
                [
                    {"type": "text", "text": "Look at these."},
                    {"type": "image", "file_id": ids[0]},
                    {"type": "document", "file_id": ids[1]},
                    {"type": "document", "file_id": notes["file_id"]},
                ],
            )
    finally:
        await provider.aclose()

    assert events[-1].type == "turn.completed"
    [sent] = server.requests
    [user] = sent.body["messages"]
    text, img, pdf, doc = user["content"]
    assert user["role"] == "user" and text == {"type": "text", "text": "Look at these."}
    assert img["type"] == "image" and pdf["type"] == "document"
    assert {k: v for k, v in img["source"].items() if k != "data"} == {
        "type": "base64",
        "media_type": "image/png",
    }
    assert base64.b64decode(img["source"]["data"]) == image
    assert pdf["source"]["media_type"] == "application/pdf"
    assert base64.b64decode(pdf["source"]["data"]) == PDF
    assert doc == {
        "type": "document",
        "source": {"type": "text", "media_type": "text/plain", "data": NOTES.decode()},
    }


def openai_config(tmp_path: Path, server: FakeServer) -> Any:
    return make_config(
        tmp_path,
        **{
            "model.provider": "openai",
            "model.name": OPENAI.model,
            "model.base_url": f"{server.base_url}/v1",
            "model.max_retries": 0,
        },
    )


async def test_an_openai_compatible_server_gets_a_data_url_and_no_pdf(
    tmp_path: Path, server: FakeServer
) -> None:
    server.enqueue(OPENAI.sse("text"))
    config = openai_config(tmp_path, server)
    provider = make_provider(config, {})
    image = png(3, 3)
    try:
        async with running_gateway(config, provider) as gw:
            sid = await gw.create_session()
            pdf = await upload(gw, sid, PDF, "application/pdf")
            r = await gw.http.post(
                f"/sessions/{sid}/turns",
                json={"content": [{"type": "document", "file_id": pdf["file_id"]}]},
            )
            assert_error(r, 422, "unsupported_content")
            assert pdf["file_id"] in r.json()["error"]["message"]
            # Inline, too: refused before any turn.
            inline = {"type": "base64", "media_type": "application/pdf"}
            inline["data"] = b64(PDF)
            r = await gw.http.post(
                f"/sessions/{sid}/turns",
                json={"content": [{"type": "document", "source": inline}]},
            )
            assert_error(r, 422, "unsupported_content")
            # Every door that takes a turn refuses it the same way, before any turn.
            pdf_url = f"data:application/pdf;base64,{b64(PDF)}"
            part = {"type": "file", "mediaType": "application/pdf", "url": pdf_url}
            message = {"id": "u1", "role": "user", "parts": [part]}
            r = await gw.http.post("/ai-sdk/chat", json=aisdk_request("chat-pdf", message))
            assert_error(r, 422, "unsupported_content")
            document = {"type": "document", "source": {"type": "url", "value": pdf_url}}
            r = await gw.http.post("/agui", json=run_input("thread-pdf", [document]))
            assert_error(r, 422, "unsupported_content")
            assert server.requests == []
            img = await upload(gw, sid, image, "image/png")
            notes = await upload(gw, sid, NOTES, "text/markdown")
            events = await turn(
                gw,
                sid,
                [
                    {"type": "text", "text": "What is it?"},
                    {"type": "image", "file_id": img["file_id"]},
                    {"type": "document", "file_id": notes["file_id"]},
                ],
            )
    finally:
        await provider.aclose()

    assert events[-1].type == "turn.completed"
    [sent] = server.requests
    assert sent.body["messages"] == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is it?"},
                {
                    "type": "image_url",
                    "image_url": {"url": f"data:image/png;base64,{b64(image)}"},
                },
                {
                    "type": "text",
                    "text": f"[document {notes['file_id']} text/markdown]\n{NOTES.decode()}",
                },
            ],
        }
    ]


async def test_the_scripted_model_says_back_the_bytes_it_was_given(gw: Harness) -> None:
    sid = await gw.create_session()
    image = png(7, 2)
    img = await upload(gw, sid, image, "image/png")
    inline = {"type": "base64", "media_type": "application/pdf"}
    inline["data"] = b64(PDF)
    events = await turn(
        gw,
        sid,
        [
            {"type": "text", "text": "see"},
            {"type": "image", "file_id": img["file_id"]},
            {"type": "document", "source": inline},
        ],
    )
    assert reply(events) == "You said: see" + said_back("image", "image/png", image) + said_back(
        "document", "application/pdf", PDF
    )
    # A later turn without files says back none.
    events = await turn(gw, sid, [{"type": "text", "text": "and now?"}])
    assert reply(events) == "You said: and now?"


async def test_a_compaction_names_the_files_it_replaced(tmp_path: Path) -> None:
    config = make_config(tmp_path, **{"model.context_max_tokens": 10**6})
    async with running_gateway(config) as gw:
        sid = await gw.create_session()
        image = png()
        img = await upload(gw, sid, image, "image/png")
        first = [{"type": "text", "text": "one"}, {"type": "image", "file_id": img["file_id"]}]
        await turn(gw, sid, first)
        await turn(gw, sid, [{"type": "text", "text": "two"}])
        async with gw.client(sid) as client:
            await client.subscribe()
            r = await gw.http.post(f"/sessions/{sid}/compact", json={})
            assert r.status_code == 202, r.text
            with trio.fail_after(10):
                [*_, done] = await client.until(lambda e: e.type == "context.compacted")
        assert done.payload.method == "summary"
        r = await gw.http.get(f"/sessions/{sid}/messages")
        [context] = [m for m in r.json()["messages"] if m["role"] == "context"]

    [block] = context["content"]
    summary = block["summary"]
    assert summary.startswith("Summary of 2 messages: ")
    assert summary.endswith(
        f"\n\nFiles in the replaced messages: {img['file_id']} (image/png, {len(image)} bytes)"
    )

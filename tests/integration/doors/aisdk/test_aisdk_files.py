"""Files through the AI SDK's doors, over real sockets (docs/doors/aisdk.md "Files").

A ``useChat`` message's ``file`` parts (a data URL, or the URL of a file the
gateway served for the chat) become the turn's image and document blocks;
what the gateway cannot take is refused before the chat is made, saying why.
Driven with httpx and trio-websocket on 127.0.0.1 port 0; the answers read
by :class:`tests.aisdk_support.UiMessage`.
"""

from __future__ import annotations

import base64
import hashlib
import json
import uuid
from pathlib import Path
from typing import Any

from trio_websocket import open_websocket_url

from tests.aisdk_support import UiMessage, gateway, read, request, ws_url
from tests.conftest import Harness
from tests.files_support import PDF, png, said_back
from tests.integration.doors.aisdk.test_aisdk_ws import Responses, ended, send

IMAGE = png(6, 5)


def data_url(data: bytes, media_type: str) -> str:
    return f"data:{media_type};base64,{base64.b64encode(data).decode()}"


def file_part(url: str, media_type: str = "image/png", name: str = "pic.png") -> dict[str, Any]:
    return {"type": "file", "mediaType": media_type, "filename": name, "url": url}


def said(text: str, *files: dict[str, Any], mid: str | None = None) -> dict[str, Any]:
    """A user message as ``useChat`` makes it: its files, then its text."""
    parts = [*files, {"type": "text", "text": text}]
    return {"id": mid or f"u-{uuid.uuid4()}", "role": "user", "parts": parts}


def file_id(data: bytes) -> str:
    return "file_" + hashlib.sha256(data).hexdigest()[:32]


async def chat(h: Harness, body: dict[str, Any]) -> UiMessage:
    async with h.http.stream("POST", "/ai-sdk/chat", json=body) as r:
        assert r.status_code == 200, (await r.aread()).decode()
        return await read(r)


async def messages(h: Harness, chat_id: str) -> list[dict[str, Any]]:
    r = await h.http.get(f"/sessions/{chat_id}/messages")
    assert r.status_code == 200, r.text
    found: list[dict[str, Any]] = r.json()["messages"]
    return found


async def test_a_file_part_is_an_image_of_the_turn_and_the_reply_streams_back(
    tmp_path: Path,
) -> None:
    async with gateway(tmp_path) as h:
        chat_id = f"chat-{uuid.uuid4()}"
        pdf = file_part(data_url(PDF, "application/pdf"), "application/pdf", "a.pdf")
        m = await chat(
            h, request(chat_id, said("hello", file_part(data_url(IMAGE, "image/png")), pdf))
        )
        # The model got both files' very bytes (the scripted model says them back).
        got = said_back("image", "image/png", IMAGE) + said_back("document", "application/pdf", PDF)
        assert m.text == "You said: hello" + got
        assert m.finish_reason == "stop" and not m.errors
        [question, _answer] = await messages(h, chat_id)
        assert question["content"] == [
            {"type": "image", "file_id": file_id(IMAGE), "media_type": "image/png",
             "size": len(IMAGE)},
            {"type": "document", "file_id": file_id(PDF), "media_type": "application/pdf",
             "size": len(PDF)},
            {"type": "text", "text": "hello"},
        ]  # fmt: skip
        got = await h.http.get(f"/sessions/{chat_id}/files/{file_id(IMAGE)}")
        assert got.status_code == 200 and got.content == IMAGE
        # The stream carried references only: no chunk holds the bytes.
        assert base64.b64encode(IMAGE).decode() not in json.dumps(m.chunks)
        # A file alone, no text, is a message too.
        alone = await chat(h, request(chat_id, said("", file_part(data_url(IMAGE, "image/png")))))
        assert alone.finish_reason == "stop"
        assert (await messages(h, chat_id))[-2]["content"][0]["file_id"] == file_id(IMAGE)


async def test_a_file_the_gateway_served_for_the_chat_is_named_by_its_url(
    tmp_path: Path,
) -> None:
    async with gateway(tmp_path) as h:
        chat_id = f"chat-{uuid.uuid4()}"
        await chat(h, request(chat_id, said("first")))
        r = await h.http.post(
            f"/sessions/{chat_id}/files", content=PDF, headers={"Content-Type": "application/pdf"}
        )
        assert r.status_code == 201, r.text
        path = f"/sessions/{chat_id}/files/{r.json()['file_id']}"
        relative = file_part(path, "application/pdf", "a.pdf")
        absolute = file_part(f"https://gw.example{path}?key=x", "application/pdf", "a.pdf")
        m = await chat(h, request(chat_id, said("both", relative, absolute)))
        assert m.text == "You said: both" + 2 * said_back("document", "application/pdf", PDF)
        blocks = (await messages(h, chat_id))[-2]["content"]
        assert [b.get("file_id") for b in blocks] == [file_id(PDF), file_id(PDF), None]
        assert [b["type"] for b in blocks] == ["document", "document", "text"]


async def test_a_repeat_with_the_same_file_is_that_turn_and_an_edit_of_the_file_rewinds(
    tmp_path: Path,
) -> None:
    """docs/doors/aisdk.md: a repeated request names its turn; an edited one (here, its
    file changed, its text not) starts a turn that rewinds to it."""
    async with gateway(tmp_path) as h:
        chat_id = f"chat-{uuid.uuid4()}"
        first = said("what is it?", file_part(data_url(IMAGE, "image/png")), mid="u-1")
        m1 = await chat(h, request(chat_id, first))
        again = await chat(h, request(chat_id, first))  # a lost answer, sent again
        assert again.id == m1.id and len(await messages(h, chat_id)) == 2
        other = png(7, 7, (1, 2, 3))
        edited = said("what is it?", file_part(data_url(other, "image/png")), mid="u-1")
        m2 = await chat(h, request(chat_id, edited))
        assert m2.id != m1.id
        shown = await messages(h, chat_id)
        assert len(shown) == 2 and shown[0]["content"][0]["file_id"] == file_id(other)


async def test_the_websocket_transport_takes_a_file_part(tmp_path: Path) -> None:
    async with gateway(tmp_path) as h, open_websocket_url(ws_url(h)) as ws:
        r = Responses(ws)
        chat_id = f"chat-{uuid.uuid4()}"
        rid = await r.request(send(chat_id, said("hi", file_part(data_url(IMAGE, "image/png")))))
        m = await r.until(rid, ended)
        assert m.text == "You said: hi" + said_back("image", "image/png", IMAGE)
        [question, _] = await messages(h, chat_id)
        assert question["content"][0]["file_id"] == file_id(IMAGE)


async def test_refused_files_say_why_and_make_no_chat(tmp_path: Path) -> None:
    """The adversary's files: another chat's, a URL elsewhere (nothing is fetched), a data
    URL that is none, an SVG (script in an image), a PNG header on what is no PNG."""
    async with gateway(tmp_path) as h:
        owner = f"chat-{uuid.uuid4()}"
        await chat(h, request(owner, said("mine", file_part(data_url(IMAGE, "image/png")))))
        theirs = f"/sessions/{owner}/files/{file_id(IMAGE)}"
        svg = b"<svg xmlns='http://www.w3.org/2000/svg' onload='alert(1)'/>"
        cases = [
            (file_part(theirs), 422, "unknown_file"),
            (file_part(f"http://127.0.0.1:1{theirs}"), 422, "unknown_file"),
            (file_part("https://example.com/cat.png"), 422, "unsupported_file_url"),
            (file_part("http://169.254.169.254/latest/meta-data/"), 422, "unsupported_file_url"),
            (file_part("data:image/png;base64,%%%"), 422, "invalid_body"),
            (file_part("data:image/png;base64"), 422, "invalid_body"),
            (file_part(data_url(svg, "image/svg+xml"), "image/svg+xml"), 415,
             "unsupported_media_type"),
            (file_part(data_url(b"\x89PNG\r\n\x1a\nnot a picture", "image/png")), 422,
             "invalid_file"),
            ({"type": "file", "url": data_url(IMAGE, "image/png")}, 422, "invalid_body"),
        ]  # fmt: skip
        for part, status, code in cases:
            chat_id = f"chat-{uuid.uuid4()}"
            r = await h.http.post("/ai-sdk/chat", json=request(chat_id, said("look", part)))
            assert (r.status_code, r.json()["error"]["code"]) == (status, code), (part, r.text)
            assert (await h.http.get(f"/sessions/{chat_id}")).status_code == 404  # none made
        # In a chat that exists, another chat's file is no file of it either.
        other = f"chat-{uuid.uuid4()}"
        await chat(h, request(other, said("x")))
        r = await h.http.post("/ai-sdk/chat", json=request(other, said("x", file_part(theirs))))
        assert (r.status_code, r.json()["error"]["code"]) == (422, "unknown_file")
        assert (
            "fetches nothing"
            in (
                await h.http.post(
                    "/ai-sdk/chat", json=request(other, said("x", file_part("https://e.example/a")))
                )
            ).json()["error"]["message"]
        )

"""Files through ``POST /agui``, over a real socket (docs/doors/agui.md "Files").

A user message's media parts (AG-UI 1.0's ``image`` and ``document``, a
``data`` or ``url`` source) and the legacy ``binary`` part become the turn's
image and document blocks; the thread's next ``MESSAGES_SNAPSHOT`` shows them
as parts whose source is the file route's URL. Every event is read by the
``ag-ui-protocol`` package's own models (:class:`Sse`).
"""

from __future__ import annotations

import base64
import hashlib
import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Harness
from tests.files_support import PDF, png, said_back
from tests.integration.doors.agui.test_agui_http import gateway, run_all

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

IMAGE = png(5, 4)
B64 = base64.b64encode(IMAGE).decode()


def run_input(thread: str, content: str | list[dict[str, Any]]) -> dict[str, Any]:
    """A ``RunAgentInput`` whose last user message is ``content`` (a string, or parts)."""
    message = {"id": f"m-{uuid.uuid4()}", "role": "user", "content": content}
    return {"threadId": thread, "runId": f"run-{uuid.uuid4()}", "messages": [message],
            "tools": [], "context": [], "state": {}, "forwardedProps": {}}  # fmt: skip


def file_id(data: bytes) -> str:
    return "file_" + hashlib.sha256(data).hexdigest()[:32]


def image(source: dict[str, Any]) -> dict[str, Any]:
    return {"type": "image", "source": source}


def text(t: str) -> dict[str, Any]:
    return {"type": "text", "text": t}


async def user_blocks(h: Harness, thread: str) -> list[dict[str, Any]]:
    r = await h.http.get(f"/sessions/{thread}/messages")
    assert r.status_code == 200, r.text
    user = [m for m in r.json()["messages"] if m["role"] == "user"]
    blocks: list[dict[str, Any]] = user[-1]["content"]
    return blocks


async def test_media_parts_are_the_turns_files_and_the_snapshot_shows_them_by_url(
    tmp_path: Path,
) -> None:
    async with gateway(tmp_path) as h:
        thread = f"thread-{uuid.uuid4()}"
        content = [
            text("what is this?"),
            image({"type": "data", "value": B64, "mimeType": "image/png"}),
        ]
        events = await run_all(h, run_input(thread, content))
        assert events[-1]["type"] == "RUN_FINISHED"
        said = "".join(e["delta"] for e in events if e["type"] == "TEXT_MESSAGE_CONTENT")
        # The model got the picture's very bytes (the scripted model says them back).
        assert said == "You said: what is this?" + said_back("image", "image/png", IMAGE)
        assert await user_blocks(h, thread) == [
            {"type": "text", "text": "what is this?"},
            {"type": "image", "file_id": file_id(IMAGE), "media_type": "image/png",
             "size": len(IMAGE)},
        ]  # fmt: skip
        assert B64 not in json.dumps(events)  # the bytes never travel back
        # The next run's snapshot: the message's parts, the file by its route's URL.
        events = await run_all(h, run_input(thread, "again"))
        [snapshot] = [e for e in events if e["type"] == "MESSAGES_SNAPSHOT"]
        first = next(m for m in snapshot["messages"] if m["role"] == "user")
        path = f"/sessions/{thread}/files/{file_id(IMAGE)}"
        assert first["content"] == [
            text("what is this?"),
            {"type": "image", "source": {"type": "url", "value": path, "mimeType": "image/png"},
             "metadata": {"fileId": file_id(IMAGE), "size": len(IMAGE)}},
        ]  # fmt: skip
        assert B64 not in json.dumps(snapshot)
        got = await h.http.get(path)
        assert got.status_code == 200 and got.content == IMAGE
        # That URL, sent back (a client that shows the history sends what it shows).
        again = [image({"type": "url", "value": path}), text("and this?")]
        await run_all(h, run_input(thread, again))
        assert (await user_blocks(h, thread))[0]["file_id"] == file_id(IMAGE)


async def test_a_document_part_and_the_legacy_binary_part(tmp_path: Path) -> None:
    async with gateway(tmp_path) as h:
        thread = f"thread-{uuid.uuid4()}"
        pdf = base64.b64encode(PDF).decode()
        document = {"type": "document", "source": {"type": "data", "value": pdf,
                                                   "mimeType": "application/pdf"}}  # fmt: skip
        binary = {"type": "binary", "mimeType": "image/png", "data": B64, "filename": "a.png"}
        await run_all(h, run_input(thread, [document, binary, text("two files")]))
        blocks = await user_blocks(h, thread)
        assert [(b["type"], b.get("file_id")) for b in blocks] == [
            ("document", file_id(PDF)),
            ("image", file_id(IMAGE)),
            ("text", None),
        ]
        # binary by the file's id, and by its URL (relative or absolute).
        by_id = {"type": "binary", "mimeType": "application/pdf", "id": file_id(PDF)}
        url = f"http://localhost:9/sessions/{thread}/files/{file_id(IMAGE)}"
        by_url = {"type": "binary", "mimeType": "image/png", "url": url}
        await run_all(h, run_input(thread, [by_id, by_url, text("named")]))
        blocks = await user_blocks(h, thread)
        assert [b.get("file_id") for b in blocks] == [file_id(PDF), file_id(IMAGE), None]


async def test_refused_files_say_why_and_make_no_thread(tmp_path: Path) -> None:
    async with gateway(tmp_path) as h:
        owner = f"thread-{uuid.uuid4()}"
        mine = image({"type": "data", "value": B64, "mimeType": "image/png"})
        await run_all(h, run_input(owner, [mine, text("mine")]))
        theirs = f"/sessions/{owner}/files/{file_id(IMAGE)}"
        svg = base64.b64encode(b"<svg onload='alert(1)'/>").decode()
        fake = base64.b64encode(b"\x89PNG\r\n\x1a\nnot a picture").decode()
        cases = [
            (image({"type": "url", "value": theirs}), 422, "unknown_file"),
            (image({"type": "url", "value": "https://example.com/cat.png"}), 422,
             "unsupported_file_url"),
            (image({"type": "file", "value": "file-abc", "provider": "openai"}), 422,
             "invalid_body"),
            (image({"type": "data", "value": "%%%", "mimeType": "image/png"}), 422,
             "invalid_body"),
            (image({"type": "data", "value": svg, "mimeType": "image/svg+xml"}), 415,
             "unsupported_media_type"),
            (image({"type": "data", "value": base64.b64encode(PDF).decode(),
                    "mimeType": "application/pdf"}), 422, "invalid_body"),  # no image
            ({"type": "binary", "mimeType": "image/png",
              "data": fake}, 422, "invalid_file"),
            ({"type": "binary", "mimeType": "image/png", "id": "file_" + "0" * 32}, 422,
             "unknown_file"),
            ({"type": "video", "source": {"type": "url", "value": theirs}}, 422, "invalid_body"),
        ]  # fmt: skip
        for part, status, code in cases:
            thread = f"thread-{uuid.uuid4()}"
            r = await h.http.post("/agui", json=run_input(thread, [part, text("look")]))
            assert (r.status_code, r.json()["error"]["code"]) == (status, code), (part, r.text)
            assert (await h.http.get(f"/sessions/{thread}")).status_code == 404  # none made


@pytest.mark.parametrize("public_url", ["https://gw.example", "https://example.org/gw/"])
async def test_behind_a_proxy_the_url_is_the_public_ones(tmp_path: Path, public_url: str) -> None:
    """``[server] public_url`` set (with a path or none: the gateway served under ``/gw``):
    the file's URL is absolute, under that path, and taken back as it is."""
    async with gateway(tmp_path, **{"server.public_url": public_url}) as h:
        thread = f"thread-{uuid.uuid4()}"
        picture = image({"type": "data", "value": B64, "mimeType": "image/png"})
        await run_all(h, run_input(thread, [picture, text("one")]))
        events = await run_all(h, run_input(thread, "two"))
        [snapshot] = [e for e in events if e["type"] == "MESSAGES_SNAPSHOT"]
        url = snapshot["messages"][0]["content"][0]["source"]["value"]
        assert url == f"{public_url.rstrip('/')}/sessions/{thread}/files/{file_id(IMAGE)}"
        await run_all(h, run_input(thread, [image({"type": "url", "value": url}), text("3")]))
        assert (await user_blocks(h, thread))[0]["file_id"] == file_id(IMAGE)

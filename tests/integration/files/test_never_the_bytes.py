"""Never the bytes on the wire (docs/protocol.md §2 "Files"): a file is a reference everywhere
a block is shown.

A session runs turns with images and documents, inline (base64) and by
``file_id``, while a WebSocket client, an SSE client and a webhook receiver
watch; then a WebSocket snapshot, a ``since`` replay, an SSE snapshot and
``GET .../messages`` read it back. Every frame and body, as the bytes that
crossed the socket, is searched for each file: its base64 (at the three
alignments a base64 encoder could start from, so a file embedded anywhere in a
larger base64 string is found too) and a marker written into each file as
plain bytes. None holds any. And a snapshot of a session with 50 images stays
small: each image is a reference of a hundred-odd bytes.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import trio
from PIL import Image, PngImagePlugin

from gateway.client.attach import open_websocket
from gateway.client.sse import abandon
from gateway.ids import file_id_of
from tests.conftest import Harness, make_config, running_gateway
from tests.integration.doors.sse.test_sse_stream import token
from tests.webhook_support import Receiver, config_with_webhooks, webhook_toml

MARKER = b"QZX-never-on-the-wire-4417"
"""Written into every file as plain bytes (a PNG's text chunk, a document's text)."""


def marked_png(n: int, size: int = 24) -> bytes:
    """A distinct real PNG (its colour and text chunk), holding :data:`MARKER`."""
    info = PngImagePlugin.PngInfo()
    info.add_text("Comment", f"{MARKER.decode()} {n}")
    out = io.BytesIO()
    Image.new("RGB", (size, size), (n % 256, (n * 7) % 256, 99)).save(out, "PNG", pnginfo=info)
    return out.getvalue()


def marked_pdf() -> bytes:
    return (
        b"%PDF-1.4\n1 0 obj<</Type/Catalog/Pages 2 0 R>>endobj\n"
        b"2 0 obj<</Type/Pages/Kids[]/Count 0>>endobj\n% " + MARKER + b"\n"
        b"trailer<</Root 1 0 R>>\n%%EOF\n"
    )


def needles(data: bytes) -> list[bytes]:
    """What would show ``data`` on the wire: :data:`MARKER`, and 24 characters of its
    base64 from each of the three alignments (the whole base64 included)."""
    found = [MARKER]
    for start in range(3):
        encoded = base64.b64encode(data[start:])
        middle = len(encoded) // 2
        found.append(encoded[middle : middle + 24])
    return found


def holding(haystacks: list[bytes], files: list[bytes]) -> list[tuple[int, bytes]]:
    """Every (haystack index, needle) where a needle of a file is found."""
    wanted = {n for f in files for n in needles(f)}
    return [(i, n) for i, h in enumerate(haystacks) for n in wanted if n in h]


class RawWs:
    """A WebSocket client keeping every frame as the text that crossed the socket."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.frames: list[bytes] = []

    async def recv(self) -> dict[str, Any]:
        raw = await self.ws.get_message()
        self.frames.append(raw.encode() if isinstance(raw, str) else raw)
        decoded: dict[str, Any] = json.loads(raw)
        return decoded

    async def subscribe(self, since: str | None = None, snapshot: bool = False) -> None:
        frame = {"type": "subscribe", "filter": "preset:full", "since": since}
        await self.ws.send_message(json.dumps(frame | {"snapshot": snapshot}))

    async def until(self, event_type: str) -> dict[str, Any]:
        while True:
            frame = await self.recv()
            if frame["type"] == "event" and frame["event"]["type"] == event_type:
                return frame


@asynccontextmanager
async def raw_ws(gw: Harness, sid: str) -> AsyncIterator[RawWs]:
    async with open_websocket(await gw.ws_url(sid)) as ws:
        yield RawWs(ws)


async def sse_bytes(gw: Harness, sid: str, until: bytes, **query: str) -> bytes:
    """An SSE stream's bytes from its start until ``until`` has been read."""
    params = {"attach": await token(gw, sid), "filter": "preset:full", **query}
    got = b""
    async with gw.http.stream("GET", f"/sessions/{sid}/events", params=params) as r:
        assert r.status_code == 200
        chunks = r.aiter_bytes()
        try:
            while until not in got:
                chunk = await anext(chunks, b"")
                assert chunk, f"the stream ended before {until!r}"
                got += chunk
        finally:
            with trio.CancelScope(shield=True):
                await abandon(r, chunks)
    return got


def inline(kind: str, media_type: str, data: bytes) -> dict[str, Any]:
    source = {"type": "base64", "media_type": media_type, "data": base64.b64encode(data).decode()}
    return {"type": kind, "source": source}


async def upload(http: httpx.AsyncClient, sid: str, data: bytes, media_type: str) -> str:
    r = await http.post(
        f"/sessions/{sid}/files", content=data, headers={"Content-Type": media_type}
    )
    assert r.status_code == 201, r.text
    return str(r.json()["file_id"])


async def turns_with_files(gw: Harness, sid: str, watcher: RawWs) -> list[bytes]:
    """Three turns naming files every way a client can; the files' bytes."""
    by_id, pdf = marked_png(1), marked_pdf()
    image_inline, note = marked_png(2), b"a note: " + MARKER + b"\n"
    pdf_id = await upload(gw.http, sid, pdf, "application/pdf")
    png_id = await upload(gw.http, sid, by_id, "image/png")
    first = [
        {"type": "text", "text": "look at these"},
        inline("image", "image/png", image_inline),
        {"type": "document", "file_id": pdf_id},
    ]
    second = [
        {"type": "image", "file_id": png_id},
        inline("document", "text/plain", note),
        {"type": "text", "text": "and these"},
    ]
    shown: list[Any] = []
    for content in (first, second, None):
        if content is None:  # a block as an event showed it, sent back as it is
            content = [*shown, {"type": "text", "text": "again"}]
        r = await gw.http.post(f"/sessions/{sid}/turns", json={"content": content})
        assert r.status_code == 202, r.text
        started = await watcher.until("turn.started")
        blocks = started["event"]["payload"]["user_message"]["content"]
        shown = [b for b in blocks if "file_id" in b]
        await watcher.until("turn.completed")
    assert len(shown) == 2
    assert all(sorted(b) == ["file_id", "media_type", "size", "type"] for b in shown)
    return [by_id, pdf, image_inline, note]


async def test_no_frame_nor_body_holds_a_files_bytes(tmp_path: Path) -> None:
    receiver = Receiver()
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(receiver.serve)
            hooks = webhook_toml("crm", receiver.url, ["turn.started", "turn.completed"])
            config = config_with_webhooks(tmp_path, hooks)
            async with running_gateway(config) as gw:
                sid = await gw.create_session()
                async with raw_ws(gw, sid) as live:
                    await live.subscribe()
                    files = await turns_with_files(gw, sid, live)
                first_id = json.loads(next(f for f in live.frames if b'"event"' in f))
                async with raw_ws(gw, sid) as late, raw_ws(gw, sid) as replay:
                    await late.subscribe(snapshot=True)
                    await late.recv(), await late.recv()  # the ack, the snapshot
                    await replay.subscribe(since=first_id["event"]["id"])
                    await replay.until("turn.completed")
                    await replay.until("turn.completed")
                sse_live = await sse_bytes(gw, sid, b'"snapshot"', snapshot="true")
                sse_replay = await sse_bytes(
                    gw, sid, b"turn.completed", since=first_id["event"]["id"]
                )
                messages = (await gw.http.get(f"/sessions/{sid}/messages")).content
                hooks_got = await receiver.wait_accepted(6)
            nursery.cancel_scope.cancel()
    assert any(b'"snapshot"' in f for f in late.frames)
    assert len(live.frames) > 20 and len(hooks_got) == 6
    everything = [*live.frames, *late.frames, *replay.frames, sse_live, sse_replay, messages]
    everything += [h.body for h in hooks_got]
    for data in files:  # every file is named on the wire, by its id
        assert file_id_of(hashlib.sha256(data).hexdigest()).encode() in messages
    assert holding(everything, files) == []
    # the needles do find a file where one is: the check can fail
    assert holding([base64.b64encode(b"xx" + files[0])], files) != []


async def test_a_snapshot_of_a_session_with_50_images_stays_under_64_kib(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with running_gateway(make_config(tmp_path)) as gw:
            sid = await gw.create_session()
            async with raw_ws(gw, sid) as live:
                await live.subscribe()
                for turn in range(10):
                    content: list[dict[str, Any]] = [{"type": "text", "text": f"turn {turn}"}]
                    for n in range(5):
                        image = marked_png(turn * 5 + n, size=64)
                        if n % 2:
                            content.append(inline("image", "image/png", image))
                        else:
                            fid = await upload(gw.http, sid, image, "image/png")
                            content.append({"type": "image", "file_id": fid})
                    r = await gw.http.post(f"/sessions/{sid}/turns", json={"content": content})
                    assert r.status_code == 202, r.text
                    await live.until("turn.completed")
            async with raw_ws(gw, sid) as late:
                await late.subscribe(snapshot=True)
                await late.recv()
                snapshot = await late.recv()
    assert snapshot["type"] == "snapshot" and snapshot["has_more"] is False
    frame = late.frames[-1]
    images = [
        b
        for m in snapshot["messages"]
        for b in m["content"]
        if isinstance(b, dict) and b.get("type") == "image"
    ]
    assert len({b["file_id"] for b in images}) == 50
    assert len(frame) < 64 * 1024, len(frame)

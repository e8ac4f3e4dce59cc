"""A fork's files (docs/protocol.md §2 "Files", "Forks"): its messages name its source's
files, so it gets a copy of them, its own from then on (the source deleted, they stay)."""

from __future__ import annotations

import base64

from tests.conftest import Harness
from tests.files_support import PDF, png
from tests.integration.doors.rest.test_http_api import assert_error


async def test_a_fork_has_its_sources_files_and_keeps_them(gw: Harness) -> None:
    sid = await gw.create_session()
    image = png(5, 5)
    r = await gw.http.post(
        f"/sessions/{sid}/files", content=PDF, headers={"Content-Type": "application/pdf"}
    )
    doc = r.json()["file_id"]
    inline = {"type": "base64", "media_type": "image/png", "data": base64.b64encode(image).decode()}
    content = [{"type": "text", "text": "see"}, {"type": "image", "source": inline}]
    content.append({"type": "document", "file_id": doc})
    async with gw.client(sid) as watcher:
        await watcher.subscribe()
        assert (
            await gw.http.post(f"/sessions/{sid}/turns", json={"content": content})
        ).status_code == 202
        await watcher.until_turn_ends()
    r = await gw.http.post(f"/sessions/{sid}/fork", json={})
    assert r.status_code == 201, r.text
    fork = r.json()["session_id"]
    messages = (await gw.http.get(f"/sessions/{fork}/messages")).json()["messages"]
    blocks = [b for b in messages[0]["content"] if "file_id" in b]
    assert [b["type"] for b in blocks] == ["image", "document"]
    assert (await gw.http.delete(f"/sessions/{sid}")).status_code == 204
    for block, data in zip(blocks, (image, PDF), strict=True):
        got = await gw.http.get(f"/sessions/{fork}/files/{block['file_id']}")
        assert got.status_code == 200 and got.content == data
    # a block read from the fork's messages may be sent back in a turn of the fork
    r = await gw.http.post(
        f"/sessions/{fork}/turns", json={"content": [*blocks, {"type": "text", "text": "again"}]}
    )
    assert r.status_code == 202, r.text
    assert_error(await gw.http.get(f"/sessions/{sid}/files/{doc}"), 404, "session_not_found")

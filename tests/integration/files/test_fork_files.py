"""A fork gets a copy of its source's files (docs/protocol.md §2 "Files", "Forks"): its
messages name them, its file route serves them, its turns may use them; a refused fork
leaves none behind. Real sockets, the scripted model, SQLite."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest
import trio

from gateway.errors import StoreError
from tests.conftest import Harness, make_config, running_gateway
from tests.files_support import PDF, png
from tests.integration.files.test_file_routes import upload


async def turn(gw: Harness, sid: str, content: list[dict[str, Any]]) -> str:
    """A turn of ``content`` blocks, to its end; its last event's type."""
    async with gw.client(sid) as client:
        await client.subscribe()
        r = await gw.http.post(f"/sessions/{sid}/turns", json={"content": content})
        assert r.status_code == 202, r.text
        with trio.fail_after(15):
            return (await client.until_turn_ends())[-1].type


def files_in_store(tmp_path: Path) -> list[tuple[str, str]]:
    with sqlite3.connect(tmp_path / "gateway.db") as db:
        return sorted(db.execute("SELECT session_id, file_id FROM files"))


async def test_a_fork_serves_and_uses_its_sources_files_which_stay_the_sources_too(
    tmp_path: Path,
) -> None:
    image = png(5, 5)
    async with running_gateway(make_config(tmp_path)) as gw:
        source = await gw.create_session()
        pic = await upload(gw, source, image, "image/png")
        doc = await upload(gw, source, PDF, "application/pdf")
        look = [{"type": "text", "text": "look"}, {"type": "image", "file_id": pic["file_id"]}]
        assert await turn(gw, source, look) == "turn.completed"
        r = await gw.http.post(f"/sessions/{source}/fork", json={})
        assert r.status_code == 201, r.text
        fork = r.json()["session_id"]

        for file, data in ((pic, image), (doc, PDF)):
            got = await gw.http.get(f"/sessions/{fork}/files/{file['file_id']}")
            assert got.status_code == 200 and got.content == data
        # The fork's copied messages name the file; a turn of the fork may use it.
        listed = (await gw.http.get(f"/sessions/{fork}/messages")).json()["messages"]
        assert listed[0]["content"][1]["file_id"] == pic["file_id"]
        again = [{"type": "text", "text": "again"}, {"type": "document", "file_id": doc["file_id"]}]
        assert await turn(gw, fork, again) == "turn.completed"
        listed = (await gw.http.get(f"/sessions/{fork}/messages")).json()["messages"]
        assert listed[-2]["content"][1] == {
            "type": "document",
            "file_id": doc["file_id"],
            "media_type": "application/pdf",
            "size": len(PDF),
        }
        # Copies: the fork's deletion leaves the source's files.
        assert (await gw.http.delete(f"/sessions/{fork}")).status_code in (200, 202, 204)
        got = await gw.http.get(f"/sessions/{source}/files/{pic['file_id']}")
        assert got.status_code == 200 and got.content == image
        gone = await gw.http.get(f"/sessions/{fork}/files/{pic['file_id']}")
        assert gone.status_code == 404
    assert files_in_store(tmp_path) == sorted([(source, pic["file_id"]), (source, doc["file_id"])])


@pytest.mark.parametrize("copied", [False, True])
async def test_a_fork_refused_while_its_files_are_copied_leaves_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, copied: bool
) -> None:
    """The store fails the copy (503 ``store_unavailable``): before it copied anything, or
    after (then the refusal removes the copies: no file of a session that never was)."""
    async with running_gateway(make_config(tmp_path)) as gw:
        source = await gw.create_session()
        pic = await upload(gw, source, png(), "image/png")
        store: Any = gw.node.store
        copy = store.copy_files

        async def failing(source_id: str, target_id: str, owner: str) -> None:
            if copied:
                await copy(source_id, target_id, owner)
            raise StoreError("the disk is gone")

        monkeypatch.setattr(store, "copy_files", failing)
        r = await gw.http.post(f"/sessions/{source}/fork", json={})
        assert r.status_code == 503 and r.json()["error"]["code"] == "store_unavailable"
        listed = (await gw.http.get("/sessions")).json()
        ids = {s["session"]["id"] for s in listed["sessions"]}
        assert ids == {source}, listed
    assert files_in_store(tmp_path) == [(source, pic["file_id"])]


async def test_a_refused_fork_whose_workspace_cannot_be_removed_leaves_no_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Copied, then refused, and the fork's workspace copy fails to go: its files go
    anyway (they count against the key's quota, for a session that never was)."""
    async with running_gateway(make_config(tmp_path)) as gw:
        source = await gw.create_session()
        pic = await upload(gw, source, png(), "image/png")
        store: Any = gw.node.store
        copy = store.copy_files

        async def failing(source_id: str, target_id: str, owner: str) -> None:
            await copy(source_id, target_id, owner)
            raise StoreError("the disk is gone")

        async def stuck(self: object, *, session_id: str, recorded: str) -> bool:
            raise OSError("the directory is busy")

        monkeypatch.setattr(store, "copy_files", failing)
        monkeypatch.setattr(type(gw.node.workspaces), "remove", stuck)
        r = await gw.http.post(f"/sessions/{source}/fork", json={})
        assert r.status_code >= 500
    assert files_in_store(tmp_path) == [(source, pic["file_id"])]

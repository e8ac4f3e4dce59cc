"""Workspaces (docs/protocol.md §15 "Workspaces", gateway.tools.workspace).

What an adversarial trial found, each reproduced here as reported: ``POST
/sessions {"workspace_path": "/"}``, then ``read_file`` of ``etc/shadow``, put
the file in the session's messages; with API keys on, one key read the keys
file holding another's. Now a client names a directory under the workspace
root (or one the operator allows), and built-in tools open paths below the
workspace by descriptor, refusing ``..``, absolute paths and every symlink.
"""

from __future__ import annotations

import os
import stat
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from gateway.app import Gateway
from gateway.errors import StartupError, ToolError
from gateway.tools.builtin import build_registry
from gateway.tools.registry import ToolContext
from gateway.tools.workspace import Workspaces, display_name
from tests.conftest import Harness, make_config, running_gateway
from tests.integration.doors.rest.test_http_api import assert_error

SECRET = "the-secret-line"


def read_turn(*paths: str) -> dict[str, Any]:
    tools = [{"tool_use": {"name": "read_file", "input": {"path": p}}} for p in paths]
    return {"script": {"rounds": [tools, [{"text": "done"}]]}}


async def failed_reads(gw: Harness, sid: str, *paths: str) -> list[tuple[str, str]]:
    """Run a turn reading ``paths``; each read's (error class, message), in order."""
    async with gw.client(sid) as client:
        await client.subscribe()
        await gw.submit(sid, read_turn(*paths))
        with trio.fail_after(10):
            events = await client.until_turn_ends()
    called = [e.payload.tool_use_id for e in events if e.type == "tool.called"]
    failed = {e.payload.tool_use_id: e.payload for e in events if e.type == "tool.failed"}
    assert set(failed) == set(called), [e.type for e in events]
    return [(failed[t].error_class, failed[t].message) for t in called]


async def messages_text(gw: Harness, sid: str) -> str:
    r = await gw.http.get(f"/sessions/{sid}/messages")
    assert r.status_code == 200, r.text
    return r.text


@asynccontextmanager
async def gateway(tmp_path: Path, **overrides: Any) -> AsyncIterator[Harness]:
    with trio.fail_after(30):
        async with running_gateway(make_config(tmp_path, **overrides)) as gw:
            yield gw


# --- POST /sessions ----------------------------------------------------------------------


async def test_a_session_gets_a_fresh_directory_of_its_own(gw: Harness, tmp_path: Path) -> None:
    root = tmp_path / "workspaces"
    assert stat.S_IMODE(root.stat().st_mode) == 0o700  # made at start-up
    a, b = await gw.create_session(), await gw.create_session()
    for sid in (a, b):
        own = root / "local" / ".own" / sid
        assert own.is_dir() and stat.S_IMODE(own.stat().st_mode) == 0o700
    listing = (await gw.http.get("/sessions")).json()["sessions"]
    # Names, no host path; an own workspace is shown under .own/, which no client can name.
    assert {s["session"]["workspace_path"] for s in listing} == {f".own/{a}", f".own/{b}"}
    refused = await gw.http.post("/sessions", json={"workspace_path": f".own/{a}"})
    assert refused.status_code == 422, refused.text
    assert str(tmp_path) not in (await gw.http.get("/sessions")).text


@pytest.mark.parametrize(
    ("workspace_path", "problem"),
    [
        ("/", "absolute"),
        ("/etc", "absolute"),
        ("../x", "'..'"),
        ("a/../../x", "'..'"),
        ("", "empty"),
        ("a//b", "empty segment"),
        ("a/", "empty segment"),
        ("a\0b", "NUL"),
        (".hidden", "segment"),
        ("-rf", "segment"),
        ("a b", "segment"),
        ("/".join("a" * 9), "segments"),
    ],
)
async def test_a_workspace_outside_the_root_is_422(
    gw: Harness, workspace_path: str, problem: str
) -> None:
    r = await gw.http.post("/sessions", json={"workspace_path": workspace_path})
    error = assert_error(r, 422, "invalid_workspace")
    assert problem in error["message"]
    assert (await gw.http.get("/sessions")).json()["sessions"] == []


async def test_a_symlink_under_the_root_pointing_out_is_422(gw: Harness, tmp_path: Path) -> None:
    local = tmp_path / "workspaces" / "local"
    local.mkdir(exist_ok=True)
    (local / "evil").symlink_to("/etc")
    (local / "real").mkdir()
    (local / "real" / "link").symlink_to("/etc")
    for name in ("evil", "evil/ssh", "real/link"):
        r = await gw.http.post("/sessions", json={"workspace_path": name})
        error = assert_error(r, 422, "invalid_workspace")
        assert "symbolic link" in error["message"], error
        assert "/etc" not in error["message"] and str(tmp_path) not in error["message"]


async def test_a_name_is_made_once_and_shared_by_the_sessions_that_give_it(
    gw: Harness, tmp_path: Path
) -> None:
    a = await gw.create_session(workspace_path="team/api")
    b = await gw.create_session(workspace_path="team/api")
    shared = tmp_path / "workspaces" / "local" / "team" / "api"
    (shared / "notes.txt").write_text("shared notes")
    for sid in (a, b):
        r = await gw.http.get("/sessions")
        assert {s["session"]["workspace_path"] for s in r.json()["sessions"]} == {"team/api"}
        async with gw.client(sid) as client:
            await client.subscribe()
            await gw.submit(sid, read_turn("notes.txt"))
            with trio.fail_after(10):
                events = await client.until_turn_ends()
        [done] = [e for e in events if e.type == "tool.completed"]
        assert done.payload.result == "shared notes"


async def test_an_allowed_absolute_workspace(tmp_path: Path) -> None:
    allowed = tmp_path / "projects"
    (allowed / "site").mkdir(parents=True)
    (allowed / "site" / "index.txt").write_text("hello")
    (allowed / "a-file").write_text("x")
    (allowed / "out").symlink_to("/etc")
    async with gateway(tmp_path, **{"sessions.allowed_workspaces": [str(allowed)]}) as gw:
        sid = await gw.create_session(workspace_path=str(allowed / "site"))
        listing = (await gw.http.get("/sessions")).json()["sessions"]
        assert listing[0]["session"]["workspace_path"] == str(allowed / "site")
        await gw.create_session(workspace_path=str(allowed))  # the allowed directory itself
        refused = {
            str(allowed / "missing"): "does not exist",
            str(allowed / "a-file"): "not a directory",
            str(allowed / "out"): "symbolic link",
            str(allowed / "site" / ".." / ".."): "not a plain path",
            str(tmp_path): "not under [sessions] allowed_workspaces",
            str(allowed) + "-evil": "not under [sessions] allowed_workspaces",
            "/": "not under [sessions] allowed_workspaces",
        }
        for path, problem in refused.items():
            r = await gw.http.post("/sessions", json={"workspace_path": path})
            assert problem in assert_error(r, 422, "invalid_workspace")["message"], path
        async with gw.client(sid) as client:
            await client.subscribe()
            await gw.submit(sid, read_turn("index.txt"))
            with trio.fail_after(10):
                events = await client.until_turn_ends()
        assert [e.payload.result for e in events if e.type == "tool.completed"] == ["hello"]


async def test_a_worker_works_in_its_parents_workspace(gw: Harness) -> None:
    parent = await gw.create_session(workspace_path="shared-by-the-family")
    task = {"rounds": [[{"tool_use": {"name": "delegate", "input": {"task": "hi"}}}]]}
    async with gw.client(parent) as client:
        await client.subscribe()
        await gw.submit(parent, {"script": task})
        with trio.fail_after(10):
            events = await client.until_turn_ends()
    [started] = [e for e in events if e.type == "delegate.started"]
    worker = gw.node.sessions[started.payload.worker_session_id]
    assert worker.record.workspace_path == gw.node.sessions[parent].record.workspace_path
    assert worker.summary().workspace_path == "shared-by-the-family"


# --- read_file -------------------------------------------------------------------------


async def test_read_file_never_leaves_the_workspace(gw: Harness, tmp_path: Path) -> None:
    sid = await gw.create_session()
    own = tmp_path / "workspaces" / "local" / ".own" / sid
    (own / "passwd-link").symlink_to("/etc/passwd")
    (own / "dir-link").symlink_to("/etc")
    (own / "inside.txt").write_text("inside")
    (own / "inner-link").symlink_to(own / "inside.txt")  # inside, but still refused
    paths = [
        "/etc/passwd",
        "../../etc/passwd",
        "../../../../../../etc/passwd",
        "./../x",
        "passwd-link",
        "dir-link/passwd",
        "inner-link",
    ]
    results = await failed_reads(gw, sid, *paths)
    assert [cls for cls, _ in results] == ["invalid_input"] * len(paths), results
    assert "root:" not in await messages_text(gw, sid)


async def test_a_session_cannot_read_another_keys_file(tmp_path: Path) -> None:
    """With API keys on, key B's session read the keys file holding key A (as reported)."""
    keys = tmp_path / "keys.txt"
    keys.write_text(f"key-a\nkey-b\n# {SECRET}\n")
    overrides = {"auth.api_keys_file": str(keys)}
    async with gateway(tmp_path, **overrides) as gw:
        http_b = httpx.AsyncClient(base_url=gw.base, headers={"Authorization": "Bearer key-b"})
        async with http_b:
            b = Harness(gw.gateway, http_b)
            for path in ("/", str(tmp_path)):
                r = await http_b.post("/sessions", json={"workspace_path": path})
                assert_error(r, 422, "invalid_workspace")
            sid = await b.create_session()
            results = await failed_reads(
                b, sid, str(keys), "../../../keys.txt", "../keys.txt", "keys.txt"
            )
            assert [cls for cls, _ in results[:3]] == ["invalid_input"] * 3
            assert results[3][0] == "error"  # no such file in its own workspace
            assert SECRET not in await messages_text(b, sid)


async def test_named_workspaces_of_two_keys_are_two_directories(tmp_path: Path) -> None:
    async with gateway(tmp_path, **{"auth.api_keys": ["key-a", "key-b"]}) as gw:
        headers = {"Authorization": "Bearer key-a"}, {"Authorization": "Bearer key-b"}
        async with (
            httpx.AsyncClient(base_url=gw.base, headers=headers[0]) as http_a,
            httpx.AsyncClient(base_url=gw.base, headers=headers[1]) as http_b,
        ):
            a = await Harness(gw.gateway, http_a).create_session(workspace_path="proj")
            b_harness = Harness(gw.gateway, http_b)
            b = await b_harness.create_session(workspace_path="proj")
            a_dir = gw.node.workspaces.host_path(gw.node.sessions[a].record.workspace_path)
            await trio.Path(a_dir, "private.txt").write_text(SECRET)
            b_dir = gw.node.workspaces.host_path(gw.node.sessions[b].record.workspace_path)
            assert a_dir != b_dir
            [(cls, _)] = await failed_reads(b_harness, b, "private.txt")
            assert cls == "error"  # no such file: B's "proj" is its own
            assert SECRET not in await messages_text(b_harness, b)


async def test_a_symlink_swapped_in_during_a_read_is_refused_at_use(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check is the open: a directory replaced by a symlink to /etc between any
    check and the open is refused, not followed (no realpath-then-open)."""
    workspaces = Workspaces(str(tmp_path / "workspaces"))
    recorded = await workspaces.create(session_id="sess_x", owner="", name=None)
    own = Path(workspaces.host_path(recorded))
    (own / "sub").mkdir()
    (own / "sub" / "passwd").write_text("harmless")
    registry = build_registry(["read_file"], workspaces=workspaces)
    ctx = ToolContext("sess_x", "t", "tu", recorded)
    real_open = os.open
    swapped = []

    def open_then_swap(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        # The first time anything opens through "sub", swap it for a symlink first.
        if not swapped and "sub" in Path(os.fsdecode(path)).parts:
            os.rename(own / "sub", own / "sub-moved")
            os.symlink("/etc", own / "sub")
            swapped.append(path)
        return real_open(path, flags, *args, **kwargs)

    assert (await registry.execute("read_file", {"path": "sub/passwd"}, ctx)).content == "harmless"
    monkeypatch.setattr(os, "open", open_then_swap)
    with pytest.raises(ToolError) as caught:
        await registry.execute("read_file", {"path": "sub/passwd"}, ctx)
    assert swapped and caught.value.error_class == "invalid_input", caught.value
    assert "symbolic link" in str(caught.value)


async def test_a_fifo_or_directory_is_not_read(tmp_path: Path) -> None:
    workspaces = Workspaces(str(tmp_path / "workspaces"))
    recorded = await workspaces.create(session_id="sess_x", owner="", name=None)
    own = Path(workspaces.host_path(recorded))
    os.mkfifo(own / "fifo")
    (own / "dir").mkdir()
    registry = build_registry(["read_file"], workspaces=workspaces)
    ctx = ToolContext("sess_x", "t", "tu", recorded)
    for path, kind in (("fifo", "not a regular file"), ("dir", "a directory"), (".", "directory")):
        with trio.fail_after(5), pytest.raises(ToolError) as caught:
            await registry.execute("read_file", {"path": path}, ctx)
        assert caught.value.error_class == "error" and kind in str(caught.value)


async def test_a_recorded_workspace_no_longer_allowed_is_refused_at_use(tmp_path: Path) -> None:
    """A session recorded with "/" (before this rule) reads nothing: its tools fail."""
    registry = build_registry(["read_file"], workspaces=Workspaces(str(tmp_path / "w")))
    ctx = ToolContext("s", "t", "tu", "/")
    with pytest.raises(ToolError) as caught:
        await registry.execute("read_file", {"path": "etc/passwd"}, ctx)
    assert caught.value.error_class == "error" and "not allowed" in str(caught.value)
    assert display_name("/") == "/" and display_name("local/proj/x") == "proj/x"


# --- deleting ------------------------------------------------------------------------------


async def test_remove_deletes_a_sessions_own_directory_and_nothing_else(tmp_path: Path) -> None:
    """DELETE /sessions calls ``Workspaces.remove`` (the route comes with another change)."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("keep")
    workspaces = Workspaces(str(tmp_path / "workspaces"))
    own = await workspaces.create(session_id="sess_a", owner="", name=None)
    named = await workspaces.create(session_id="sess_b", owner="", name="proj")
    own_dir = Path(workspaces.host_path(own))
    (own_dir / "deep" / "er").mkdir(parents=True)
    (own_dir / "deep" / "er" / "f").write_text("x")
    (own_dir / "link-out").symlink_to(outside)  # not followed
    (own_dir / "deep" / "link-file").symlink_to(outside / "keep.txt")

    assert not await workspaces.remove(session_id="sess_b", recorded=named)  # a name stays
    assert not await workspaces.remove(session_id="sess_worker", recorded=own)  # a worker's
    assert await workspaces.remove(session_id="sess_a", recorded=own)
    assert not await trio.Path(own_dir).exists()
    assert (outside / "keep.txt").read_text() == "keep"
    assert await trio.Path(workspaces.host_path(named)).is_dir()
    assert not await workspaces.remove(session_id="sess_a", recorded=own)  # already gone

    # A symlink put in a session's place is unlinked, its target left alone.
    own_c = await workspaces.create(session_id="sess_c", owner="", name=None)
    c_dir = trio.Path(workspaces.root, own_c)
    await c_dir.rmdir()
    await c_dir.symlink_to(outside)
    assert await workspaces.remove(session_id="sess_c", recorded=own_c)
    assert not await c_dir.is_symlink() and (outside / "keep.txt").exists()


def test_a_root_that_cannot_be_made_is_a_start_up_failure(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("x")
    config = make_config(tmp_path, **{"sessions.workspace_root": str(tmp_path / "a-file" / "ws")})
    with pytest.raises(StartupError, match=r"\[sessions\] workspace_root .* cannot be made"):
        Gateway(config)

"""An MCP server's ``roots/list``: the session's workspace (docs/protocol.md §11,
gateway.mcp.roots), and notification storms that must not hurt the daemon.

Against tests/mcp_servers/hostile_a.py, a real process that records what it is sent.
"""

from __future__ import annotations

import json
from pathlib import Path

import trio

from gateway.mcp.roots import Roots
from gateway.tools.registry import ToolContext, ToolRegistry
from tests.integration.mcp.test_mcp_progress import HOSTILE_A
from tests.mcp_support import running, server


def requests(log: Path, method: str) -> list[dict[str, object]]:
    seen = [json.loads(line) for line in log.read_text().splitlines()]
    return [s["params"] or {} for s in seen if s["method"] == method]


def ctx(session_id: str) -> ToolContext:
    return ToolContext(session_id, "turn_1", f"toolu_{session_id}", "")


async def roots_of(tools: object, session_id: str) -> list[dict[str, str]]:
    out = await tools.execute("mcp__ha__roots", {}, ctx(session_id))  # type: ignore[attr-defined]
    return list(json.loads(out.content)["roots"])


async def test_a_session_servers_root_is_its_workspace_and_list_changed_is_never_offered(
    tmp_path: Path,
) -> None:
    log = tmp_path / "requests"
    workspace = tmp_path / "ws_a"
    workspace.mkdir()
    env = {"HOSTILE_A_LOG": str(log)}
    with trio.fail_after(30):
        async with running(ha=server(command=HOSTILE_A, env=env, scope="session")) as manager:
            manager.open_session("ses_a", str(workspace))
            await manager.wait_ready("ses_a")
            tools = manager.session_tools(ToolRegistry(), "ses_a")
            assert await roots_of(tools, "ses_a") == [
                {"uri": workspace.as_uri(), "name": "workspace"}
            ]
    [init] = requests(log, "initialize")
    assert init["capabilities"]["roots"] == {"listChanged": False}  # type: ignore[index]
    assert requests(log, "notifications/roots/list_changed") == []


async def test_a_shared_server_gets_the_calling_sessions_workspace_only(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    with trio.fail_after(30):
        async with running(ha=server(command=HOSTILE_A)) as manager:
            manager.open_session("ses_a", str(a))
            manager.open_session("ses_b", str(b))
            await manager.wait_ready()
            tools = manager.session_tools(ToolRegistry(), "ses_a")
            assert await roots_of(tools, "ses_a") == [{"uri": a.as_uri(), "name": "workspace"}]
            assert await roots_of(tools, "ses_b") == [{"uri": b.as_uri(), "name": "workspace"}]
            # A session the servers do not know (closed): no root, never another's.
            manager.close_session("ses_b")
            assert await roots_of(tools, "ses_b") == []


async def test_a_long_call_on_a_shared_server_keeps_its_sessions_root(tmp_path: Path) -> None:
    """A session whose servers are all node-scope was stopped as idle during its own call
    (only its session-scope servers' calls counted): its workspace was forgotten, and the
    server asking for its roots late in a long call got none."""
    a = tmp_path / "a"
    with trio.fail_after(30):
        async with running(idle_unload_s=0.4, ha=server(command=HOSTILE_A)) as manager:
            manager.open_session("ses_a", str(a))
            await manager.wait_ready()
            tools = manager.session_tools(ToolRegistry(), "ses_a")
            out = await tools.execute("mcp__ha__roots", {"wait_ms": 1500}, ctx("ses_a"))
            assert json.loads(out.content)["roots"] == [{"uri": a.as_uri(), "name": "workspace"}]


def test_calls_of_several_sessions_or_none_give_no_root() -> None:
    calls: dict[object, ToolContext] = {}
    workspaces = {"ses_a": "/w/a", "ses_b": "/w/b"}
    roots = Roots("", calls, lambda sid: workspaces.get(sid, ""))
    assert roots.directories() == []  # nothing in flight: whose?
    calls[object()] = ctx("ses_a")
    calls[object()] = ctx("ses_a")
    assert roots.directories() == ["/w/a"]
    calls[object()] = ctx("ses_b")
    assert roots.directories() == []  # ambiguous: neither
    assert Roots("/w/own", calls, workspaces.get).directories() == ["/w/own"]


async def test_a_storm_of_list_changed_notices_does_not_hurt_the_daemon(tmp_path: Path) -> None:
    log = tmp_path / "requests"
    env = {"HOSTILE_A_LOG": str(log)}
    with trio.fail_after(60):
        async with running(ha=server(command=HOSTILE_A, env=env)) as manager:
            await manager.wait_ready()
            tools = manager.session_tools(ToolRegistry(), "ses_a")
            started = trio.current_time()
            out = await tools.execute("mcp__ha__storm", {"n": 5000}, ctx("ses_a"))
            assert out.content == "stormed"
            with trio.fail_after(5):  # answered at once after 25,000 notices
                assert (await tools.execute("mcp__ha__level", {}, ctx("ses_a"))).content
            took = trio.current_time() - started
            await trio.sleep(1.5)
            assert "mcp__ha__storm" in tools.names()
    # tools/list again at most once a second (and once at the start).
    assert len(requests(log, "tools/list")) <= 2 + took + 2

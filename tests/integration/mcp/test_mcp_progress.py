"""An MCP server's progress through the SDK's client and a real server process, then through a
whole daemon to a WebSocket client and a snapshot (docs/protocol.md §5, §6, §11).

The server is tests/mcp_servers/hostile_a.py (no SDK: it floods as told).
"""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

from gateway.client.api import GatewayClient
from gateway.client.chat import progress_of
from gateway.client.stream import MAX_FRAME_BYTES
from gateway.mcp.progress import PROGRESS_INTERVAL_S
from gateway.protocol.frames import Snapshot, SubscribeAck
from gateway.tools.registry import ToolContext, ToolRegistry
from tests.conftest import running_gateway
from tests.integration.mcp.test_mcp_gateway import cancel, mcp_config, script, seq
from tests.mcp_support import SERVERS, http_server, running, server

HOSTILE_A = [sys.executable, str(SERVERS / "hostile_a.py")]


class Reports:
    """A call's progress reports, with the trio time of each."""

    def __init__(self) -> None:
        self.got: list[tuple[float, float, float | None, str | None]] = []

    def __call__(self, progress: float, total: float | None, message: str | None) -> None:
        self.got.append((trio.current_time(), progress, total, message))


def ctx_with(reports: Reports, session_id: str = "ses_a") -> ToolContext:
    return ToolContext(session_id, "turn_1", f"toolu_{session_id}", "", progress=reports)


async def test_a_flood_of_progress_is_paced_the_last_kept_and_late_ones_dropped() -> None:
    with trio.fail_after(60):
        async with running(ha=server(command=HOSTILE_A)) as manager:
            await manager.wait_ready()
            tools = manager.session_tools(ToolRegistry(), "ses_a")
            reports = Reports()
            started = trio.current_time()
            args = {"n": 10_000, "total": 10_000, "late": True}
            out = await tools.execute("mcp__ha__progress", args, ctx_with(reports))
            took = trio.current_time() - started
            assert out.content == "done"
            got = reports.got
            assert 1 <= len(got) <= took / PROGRESS_INTERVAL_S + 2, (len(got), took)
            times = [t for t, *_ in got][:-1]  # the last: sent as the call ended, at once
            assert all(b - a >= PROGRESS_INTERVAL_S - 0.01 for a, b in itertools.pairwise(times))
            assert got[-1][1:] == (10_000.0, 10_000.0, "step 10000")
            # After the answer: one more for that token, and one for a token it never had.
            await trio.sleep(0.5)
            assert got[-1][1] == 10_000.0 and len(got) == len(reports.got)
            # The daemon is fine: the next call is answered at once.
            with trio.fail_after(5):
                assert (await tools.execute("mcp__ha__level", {}, ctx_with(Reports()))).content


async def test_a_progress_no_float_can_hold_is_dropped_and_breaks_no_call() -> None:
    """An integer past a float's range (a byte count of 10**400) made the SDK's float()
    raise in its receive loop: the connection died with every call in flight on it."""
    huge = "1" + "0" * 400
    with trio.fail_after(60):
        async with running(ha=server(command=HOSTILE_A)) as manager:
            await manager.wait_ready()
            connection = manager.connection("ha")
            assert connection is not None
            pid = connection.pid
            tools = manager.session_tools(ToolRegistry(), "ses_a")
            reports = Reports()
            args = {"n": 2, "raw": [huge, f"-{huge}", "1e999", "NaN"]}
            out = await tools.execute("mcp__ha__progress", args, ctx_with(reports))
            assert out.content == "done"
            assert [p for _, p, *_ in reports.got][-1] == 2.0  # only the finite ones
            assert connection.live and connection.pid == pid  # not restarted


@pytest.mark.slow  # a server process (over a second on two cores)
async def test_over_http_a_progress_no_float_can_hold_breaks_no_call() -> None:
    """The same over streamable HTTP, whose parsing is the SDK's: the read stream is
    guarded (gateway.mcp.inbound), so the SDK's float() never sees 10**400."""
    async with http_server() as url, running(web=server(url=url)) as manager:
        with trio.fail_after(30):
            await manager.wait_ready()
            connection = manager.connection("web")
            assert connection is not None
            tools = manager.session_tools(ToolRegistry(), "ses_a")
            reports = Reports()
            out = await tools.execute("mcp__web__overflow", {}, ctx_with(reports))
            assert out.content == "done"
            assert [p for _, p, *_ in reports.got] == [1.0]  # the finite one only
            assert connection.live
            assert (
                await tools.execute("mcp__web__echo", {"text": "y"}, ctx_with(reports))
            ).content == "y"


async def test_a_call_without_a_progress_callback_asks_for_none(tmp_path: Path) -> None:
    log = tmp_path / "requests"
    async with running(ha=server(command=HOSTILE_A, env={"HOSTILE_A_LOG": str(log)})) as manager:
        await manager.wait_ready()
        tools = manager.session_tools(ToolRegistry(), "ses_a")
        ctx = ToolContext("ses_a", "turn_1", "toolu_1", "")
        assert (await tools.execute("mcp__ha__progress", {"n": 3}, ctx)).content == "done"
        reports = Reports()
        await tools.execute("mcp__ha__progress", {"n": 3}, ctx_with(reports))
        assert [p for _, p, *_ in reports.got][-1] == 3.0
    calls = [
        json.loads(line)["params"]
        for line in log.read_text().splitlines()
        if json.loads(line)["method"] == "tools/call"
    ]
    assert "progressToken" not in (calls[0].get("_meta") or {})
    assert "progressToken" in calls[1]["_meta"]


@pytest.mark.slow  # a daemon and a server process
async def test_progress_reaches_a_websocket_client_and_the_snapshot(tmp_path: Path) -> None:
    servers = {"ha": {"command": HOSTILE_A}}
    config = mcp_config(tmp_path, servers=servers, tools=("mcp__ha__*",))
    slow = {"n": 30, "gap_ms": 50, "total": 30}
    with trio.fail_after(60):
        async with running_gateway(config) as gw:
            sid = await gw.create_session()
            async with (
                gw.client(sid, max_message_size=MAX_FRAME_BYTES) as client,
                GatewayClient(gw.base) as api,
                api.open_session(sid) as followed,
                trio.open_nursery() as nursery,
            ):
                assert isinstance(await client.subscribe("preset:chat"), SubscribeAck)
                seen: list[tuple[str, str]] = []  # the Python client's tool line, while it runs
                nursery.start_soon(follow, followed, seen)
                use = {"tool_use": {"name": "mcp__ha__progress", "input": slow}}
                await gw.submit(sid, script([use], [{"text": "ok"}]))
                snapshot = await snapshot_while_running(gw, sid)
                events = await client.until_turn_ends()
            types = seq(events)
            progress = [e.payload for e in events if e.type == "tool.progress"]
            assert 3 <= len(progress) <= 1.5 / PROGRESS_INTERVAL_S + 2, len(progress)
            assert types.index("tool.called") < types.index("tool.progress")
            assert types.index("tool.completed") > max(
                i for i, t in enumerate(types) if t == "tool.progress"
            )
            called = next(e.payload for e in events if e.type == "tool.called")
            assert {p.tool_use_id for p in progress} == {called.tool_use_id}
            assert (progress[-1].progress, progress[-1].total) == (30.0, 30.0)
            assert progress[-1].message == "step 30"
            [shown] = snapshot
            assert shown["tool_use_id"] == called.tool_use_id and shown["total"] == 30.0
            # Streaming-only: not stored, not replayed; the snapshot drops it as the tool ends.
            stored = await gw.http.get(f"/sessions/{sid}/events")
            if stored.status_code == 200:
                assert "tool.progress" not in stored.text
            after = await gw.http.get(f"/sessions/{sid}")
            assert "tool_progress" not in after.json().get("session", after.json())

            # A flood: 10,000 notifications; the client gets at most 10 a second of them.
            flood = {"tool_use": {"name": "mcp__ha__progress", "input": {"n": 10_000}}}
            async with gw.client(sid, max_message_size=MAX_FRAME_BYTES) as client:
                await client.subscribe("preset:full")
                started = trio.current_time()
                await gw.submit(sid, script([flood], [{"text": "ok"}]))
                events = await client.until_turn_ends()
                took = trio.current_time() - started
            got = [e.payload.progress for e in events if e.type == "tool.progress"]
            assert 1 <= len(got) <= took / PROGRESS_INTERVAL_S + 2 and got[-1] == 10_000.0
            assert events[-1].type == "turn.completed"
    # The Python client kept the running tool's progress, and the chat's line shows it.
    assert any(line.endswith(" 30/30 step 30") for status, line in seen if status == "running")
    assert seen[-1][0] == "completed" and seen[-1][1] == ""


async def follow(session: Any, seen: list[tuple[str, str]]) -> None:
    """The Python client's view of the tool as it runs (gateway.client.api.ToolRun)."""
    async for _ in session:
        for run in session.tools.values():
            seen.append((run.status, progress_of(run)))
        if session.state.turn is not None and session.state.turn.status != "in_flight":
            return


async def snapshot_while_running(gw: Any, sid: str) -> list[dict[str, Any]]:
    """The snapshot's ``tool_progress`` once it lists one (the tool runs 1.5 s)."""
    with trio.fail_after(20):
        while True:
            async with gw.client(sid, max_message_size=MAX_FRAME_BYTES) as client:
                await client.subscribe(snapshot=True)
                frame = await client.recv()
                assert isinstance(frame, Snapshot)
                shown = frame.session.tool_progress
                if shown:
                    return [
                        {"tool_use_id": p.tool_use_id, "total": p.total, "progress": p.progress}
                        for p in shown
                    ]
            await trio.sleep(0.05)


@pytest.mark.slow  # a daemon and a server process
async def test_a_cancelled_tool_sends_no_progress_after_its_end(tmp_path: Path) -> None:
    servers = {"ha": {"command": HOSTILE_A}}
    config = mcp_config(tmp_path, servers=servers, tools=("mcp__ha__*",))
    slow = {"n": 200, "gap_ms": 20, "total": 200}
    with trio.fail_after(60):
        async with running_gateway(config) as gw:
            sid = await gw.create_session()
            async with gw.client(sid, max_message_size=MAX_FRAME_BYTES) as client:
                await client.subscribe("preset:full")
                use = {"tool_use": {"name": "mcp__ha__progress", "input": slow}}
                turn_id = await gw.submit(sid, script([use], [{"text": "ok"}]))
                await client.until(lambda e: e.type == "tool.progress")
                await cancel(gw, sid, turn_id)
                events = await client.until_turn_ends()
                await trio.sleep(0.5)  # the server still sends for a while: none of it shows
                await gw.submit(sid, "hello")
                events += await client.until_turn_ends()
            types = seq(events)
            ended = types.index("tool.failed")
            assert "tool.progress" not in types[ended:], types[ended:]
            assert events[ended].payload.error_class == "cancelled"
            after = await gw.http.get(f"/sessions/{sid}")
            assert "tool_progress" not in after.json().get("session", after.json())

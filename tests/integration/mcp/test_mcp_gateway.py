"""MCP tools through the whole daemon (docs/protocol.md §5, §8, §11; docs/reference.md).

tests/integration/mcp/test_mcp.py tests the MCP manager alone; these drive a real
gateway (in-process, or ``gateway serve`` as a process) with the scripted model and a
trio-websocket client, against real server processes (tests/mcp_servers/
everything.py), since the process is the point: its calls, its cancel, its
elicitations, its death, its restart, and that none outlives the daemon.
Sub-cases share a gateway where that is sound, to keep the server processes
(each ~1.5 s of start-up) few.
"""

from __future__ import annotations

# Polling a process or a file for a change no event tells of; small local files read inline.
# ruff: noqa: ASYNC110, ASYNC240
import json
import os
import signal
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from gateway.client.attach import open_websocket as open_ws
from gateway.client.stream import MAX_FRAME_BYTES
from gateway.config import Config, load_config
from gateway.mcp.tools import MAX_RESULT_BYTES
from gateway.protocol.events import Event
from gateway.protocol.frames import Snapshot, SubscribeAck
from tests.conftest import Client, Harness, running_gateway
from tests.mcp_support import EVERYTHING
from tests.system.cli.test_cli_serve import gateway_process

PREFIX = "mcp__everything__"
DONE = [{"text": "done"}]


# --- helpers ------------------------------------------------------------------------------


def _toml(value: Any) -> str:
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + " }"
    return json.dumps(value)  # strings, numbers, booleans and lists of them are TOML too


def write_config(path: Path, sections: dict[str, dict[str, Any]]) -> Path:
    path.write_text(
        "".join(
            f"[{name}]\n" + "".join(f"{k} = {_toml(v)}\n" for k, v in body.items()) + "\n"
            for name, body in sections.items()
        )
    )
    return path


def sections(
    tmp_path: Path,
    servers: dict[str, dict[str, Any]] | None = None,
    tools: tuple[str, ...] = ("sleep", f"{PREFIX}*"),
    **more: dict[str, Any],
) -> dict[str, dict[str, Any]]:
    """A config's tables: the store and workspaces in ``tmp_path``, the everything server."""
    servers = servers if servers is not None else {"everything": {"command": EVERYTHING}}
    return {
        "server": {"port": 0},
        "store": {"path": str(tmp_path / "gateway.db")},
        "sessions": {"workspace_root": str(tmp_path / "workspaces")},
        "tools": {"enabled": list(tools)},
        **{f"mcp_servers.{name}": body for name, body in servers.items()},
        **more,
    }


def mcp_config(tmp_path: Path, **kw: Any) -> Config:
    return load_config(
        str(write_config(tmp_path / "gateway.toml", sections(tmp_path, **kw))), {}, {}
    )


def call(tool: str, **input: Any) -> dict[str, Any]:
    return {"tool_use": {"name": PREFIX + tool, "input": input}}


def script(*rounds: list[dict[str, Any]], delay_ms: int = 0) -> dict[str, Any]:
    return {"script": {"delay_ms": delay_ms, "rounds": list(rounds)}}


def seq(events: list[Event]) -> list[str]:
    return [e.type for e in events]


def only(events: list[Event], kind: str) -> Any:
    [payload] = [e.payload for e in events if e.type == kind]
    return payload


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


async def gone_within(pid: int, seconds: float) -> None:
    with trio.fail_after(seconds):
        while alive(pid):
            await trio.sleep(0.05)


async def appears(path: Path, seconds: float = 5) -> str:
    with trio.fail_after(seconds):
        while not path.exists() or not path.read_text():
            await trio.sleep(0.05)
    return path.read_text()


async def run_turn(gw: Harness, sid: str, content: Any, seconds: float = 15) -> list[Event]:
    """Submit a turn and return its events, from a client subscribed before it."""
    async with gw.client(sid, max_message_size=MAX_FRAME_BYTES) as client:
        await client.subscribe()
        await gw.submit(sid, content)
        with trio.fail_after(seconds):
            return await client.until_turn_ends()


async def snapshot_of(gw: Harness, sid: str) -> Snapshot:
    async with gw.client(sid, max_message_size=MAX_FRAME_BYTES) as client:
        assert isinstance(await client.subscribe(snapshot=True), SubscribeAck)
        frame = await client.recv()
        assert isinstance(frame, Snapshot)
        return frame


async def cancel(gw: Harness, sid: str, turn_id: str) -> None:
    r = await gw.http.post(f"/sessions/{sid}/turns/{turn_id}/cancel", json={"reason": "stop"})
    assert r.status_code == 202, r.text


def failures(gw: Harness, server: str) -> float:
    return float(gw.node.metrics.mcp_server_failures.labels(server)._value.get())


def pid_of(gw: Harness, server: str = "everything", session_id: str | None = None) -> int:
    assert gw.node.mcp is not None
    connection = gw.node.mcp.connection(server, session_id)
    assert connection is not None and connection.pid is not None
    return connection.pid


# --- 1, 4, 10: results, structured content, tool listings, elicitations, a huge result ----


@pytest.mark.slow  # over a second on two cores (measured with --durations)
async def test_an_mcp_call_through_the_daemon_results_listings_elicitation_and_a_huge_result(
    tmp_path: Path,
) -> None:
    gated = {"require_approval": [f"{PREFIX}slow"]}
    config = mcp_config(tmp_path, **{"agents.gated": gated})
    with trio.fail_after(45):
        async with running_gateway(config) as gw:
            sid = await gw.create_session()
            events = await run_turn(
                gw, sid, script([call("structured"), call("echo", text="hi")], DONE)
            )
            assert seq(events)[-1] == "turn.completed", seq(events)
            assert events[-1].payload.stop_reason == "end_turn"
            called = [e.payload for e in events if e.type == "tool.called"]
            assert [(c.tool_name, c.input) for c in called] == [
                (f"{PREFIX}structured", {}),
                (f"{PREFIX}echo", {"text": "hi"}),
            ]
            completed = {
                e.payload.tool_name: e.payload for e in events if e.type == "tool.completed"
            }
            assert completed[f"{PREFIX}structured"].result == "two items"
            assert completed[f"{PREFIX}structured"].structured_result == {"items": [1, 2]}
            assert completed[f"{PREFIX}echo"].result == "hi"
            assert completed[f"{PREFIX}echo"].structured_result is None

            # The stored tool_result keeps the structured content (docs/protocol.md §6).
            r = await gw.http.get(f"/sessions/{sid}/messages")
            results = {
                block["tool_use_id"]: block
                for message in r.json()["messages"]
                for block in message["content"]
                if block["type"] == "tool_result"
            }
            structured = results[events_id(events, f"{PREFIX}structured")]
            assert structured["content"] == "two items" and not structured["is_error"]
            assert structured["structured_content"] == {"items": [1, 2]}

            # The snapshot's session.tools and GET /agents list the MCP tools, source mcp:<server>.
            snap = await snapshot_of(gw, sid)
            tools = {t.name: t for t in snap.session.tools}
            assert tools[f"{PREFIX}echo"].source == "mcp:everything"
            assert tools[f"{PREFIX}echo"].input_schema["required"] == ["text"]
            assert tools["sleep"].source == "builtin"
            assert not tools[f"{PREFIX}slow"].requires_approval
            assert {t.source for t in snap.session.tools} == {"builtin", "mcp:everything"}
            assert snap.session.current_turn_id is None
            r = await gw.http.get("/agents")
            agents = {a["name"]: a for a in r.json()["agents"]}
            for name in ("default", "gated"):
                listed = {t["name"]: t for t in agents[name]["tools"]}
                assert listed[f"{PREFIX}structured"]["source"] == "mcp:everything"
                assert set(listed) == set(tools)
            gated_tools = {t["name"]: t["requires_approval"] for t in agents["gated"]["tools"]}
            assert gated_tools[f"{PREFIX}slow"] and not gated_tools[f"{PREFIX}echo"]

            await elicitation_cases(gw, sid)
            await huge_result(gw, sid)
            assert failures(gw, "everything") == 0


def events_id(events: list[Event], tool_name: str) -> str:
    """The tool_use_id of the call of ``tool_name`` among ``events``."""
    [tid] = [
        e.payload.tool_use_id
        for e in events
        if e.type == "tool.called" and e.payload.tool_name == tool_name
    ]
    return str(tid)


async def elicitation_cases(gw: Harness, sid: str) -> None:
    """4. elicitation/create is a permission.requested kind elicitation; content answers it."""
    content = script(
        [call("elicit", question="Ship it?")], [call("elicit", question="Really?")], DONE
    )
    async with gw.client(sid, max_message_size=MAX_FRAME_BYTES) as client:
        await client.subscribe()
        await gw.submit(sid, content)
        with trio.fail_after(15):
            asked = (await client.until(lambda e: e.type == "permission.requested"))[-1].payload
            assert asked.kind == "elicitation" and asked.message == "Ship it?"
            assert asked.tool_name == f"{PREFIX}elicit"
            assert asked.requested_schema["required"] == ["ok"]
            assert asked.requested_schema["properties"]["ok"] == {"type": "boolean"}
            # A client attaching now finds the question pending, and can answer it.
            [pending] = (await snapshot_of(gw, sid)).session.pending_permissions
            assert (pending.perm_id, pending.kind, pending.message) == (
                asked.perm_id, "elicitation", "Ship it?",
            )  # fmt: skip
            assert pending.requested_schema == asked.requested_schema
            route = f"/sessions/{sid}/permissions/{asked.perm_id}"
            # Content that does not fit the schema: 422, and the question stays open.
            for bad in ({"ok": "yes"}, {"note": "no ok"}, {"ok": True, "note": 5}):
                r = await gw.http.post(route, json={"decision": "allow", "content": bad})
                assert r.status_code == 422, (bad, r.text)
                assert r.json()["error"]["code"] == "invalid_content"
            r = await gw.http.post(
                route, json={"decision": "allow", "content": {"ok": True, "note": "go"}}
            )
            assert r.status_code == 202, r.text
            done = await client.until(lambda e: e.type == "tool.completed")
            assert only(done, "permission.resolved").decision == "allow"
            assert done[-1].payload.result == 'accept {"note": "go", "ok": true}'

            asked = (await client.until(lambda e: e.type == "permission.requested"))[-1].payload
            assert asked.message == "Really?"
            r = await gw.http.post(
                f"/sessions/{sid}/permissions/{asked.perm_id}", json={"decision": "deny"}
            )
            assert r.status_code == 202, r.text
            events = await client.until_turn_ends()
    assert only(events, "permission.resolved").decision == "deny"
    assert only(events, "tool.completed").result == "decline null"
    assert events[-1].type == "turn.completed"
    assert (await snapshot_of(gw, sid)).session.pending_permissions == []

    # A cancel while the server's question waits: it is cancelled, and so is the tool.
    async with gw.client(sid) as client:
        await client.subscribe()
        turn_id = await gw.submit(sid, script([call("elicit", question="Wait?")], DONE))
        with trio.fail_after(15):
            await client.until(lambda e: e.type == "permission.requested")
            await cancel(gw, sid, turn_id)
            events = await client.until_turn_ends()
    assert seq(events) == ["permission.resolved", "tool.failed", "turn.cancelled"], seq(events)
    assert events[0].payload.decision == "cancelled"
    assert events[1].payload.error_class == "cancelled"
    assert events[2].payload.phase == "tools"
    assert (await snapshot_of(gw, sid)).session.pending_permissions == []


async def huge_result(gw: Harness, sid: str) -> None:
    """10. A 3 MiB result is cut at MAX_RESULT_BYTES; the turn and the snapshot stay sound."""
    events = await run_turn(gw, sid, script([call("huge", mb=3)], DONE))
    assert events[-1].type == "turn.completed" and events[-1].payload.stop_reason == "end_turn"
    result = only(events, "tool.completed").result
    assert len(result.encode()) < MAX_RESULT_BYTES + 200
    assert result.endswith(f"[gateway: result cut at {MAX_RESULT_BYTES} of its 3145728 bytes]")
    snap = await snapshot_of(gw, sid)  # decodes: well-formed, whatever it kept
    assert snap.session.current_turn_id is None and snap.session.turn_count == 4
    r = await gw.http.get(f"/sessions/{sid}/messages", params={"limit": 2})
    assert r.status_code == 200
    [*_, last] = r.json()["messages"]
    assert last["role"] == "assistant" and last["content"] == [{"type": "text", "text": "done"}]
    # and the session goes on
    events = await run_turn(gw, sid, script([call("echo", text="after")], DONE))
    assert only(events, "tool.completed").result == "after"


# --- 2, 3: cancellation in every phase; the other session's call goes on -------------------


@pytest.mark.slow  # over a second on two cores (measured with --durations)
async def test_cancel_in_every_phase_with_an_mcp_tool_and_a_sharing_session_goes_on(
    tmp_path: Path,
) -> None:
    gated = {"require_approval": [f"{PREFIX}*"]}
    config = mcp_config(tmp_path, **{"agents.gated": gated})
    with trio.fail_after(45):
        async with running_gateway(config) as gw:
            await gw.node.mcp.wait_ready()  # type: ignore[union-attr]
            pid = pid_of(gw)
            sid = await gw.create_session()
            other = await gw.create_session()

            # phase tools, while another session's call on the same server runs (3.)
            marker = tmp_path / "tools-phase"
            async with gw.client(sid) as a, gw.client(other) as b:
                await a.subscribe()
                await b.subscribe()
                turn_id = await gw.submit(
                    sid, script([call("slow", seconds=30, marker=str(marker))], DONE)
                )
                await gw.submit(other, script([call("slow", seconds=1.5)], DONE))
                with trio.fail_after(10):
                    await a.until(lambda e: e.type == "tool.called")
                    await b.until(lambda e: e.type == "tool.called")
                    await cancel(gw, sid, turn_id)
                    ea = await a.until_turn_ends()
                    # the server saw notifications/cancelled
                    assert await appears(marker) == "cancelled"
                    eb = await b.until_turn_ends()
            assert seq(ea)[-2:] == ["tool.failed", "turn.cancelled"], seq(ea)
            assert ea[-2].payload.error_class == "cancelled"
            assert ea[-2].payload.tool_name == f"{PREFIX}slow"
            assert (ea[-1].payload.phase, ea[-1].payload.reason) == ("tools", "stop")
            assert "llm.call_failed" not in seq(ea) and "tool.completed" not in seq(ea)
            assert only(eb, "tool.completed").result == "slept 1.5"
            assert eb[-1].type == "turn.completed"

            # phase llm: cancelled while the model streams the round that would call the tool
            marker_llm = tmp_path / "llm-phase"
            slow = call("slow", seconds=30, marker=str(marker_llm), note="x" * 300)
            async with gw.client(sid) as a:
                await a.subscribe()
                turn_id = await gw.submit(
                    sid, script([{"text": "Calling."}, slow], DONE, delay_ms=5)
                )
                with trio.fail_after(10):
                    await a.until(lambda e: e.type == "tool.use_input_delta")
                    await cancel(gw, sid, turn_id)
                    ea = await a.until_turn_ends()
            assert seq(ea)[-4:] == [
                "tool.use_end", "message.complete", "llm.call_failed", "turn.cancelled",
            ], seq(ea)  # fmt: skip
            assert ea[-1].payload.phase == "llm" and ea[-2].payload.error_class == "cancelled"
            assert "tool.called" not in seq(ea) and "tool.failed" not in seq(ea)

            # phase seam: the MCP tool waits for approval (agent gated)
            gated_sid = await gw.create_session(agent="gated")
            marker_seam = tmp_path / "seam-phase"
            async with gw.client(gated_sid) as a:
                await a.subscribe()
                turn_id = await gw.submit(
                    gated_sid, script([call("slow", seconds=30, marker=str(marker_seam))], DONE)
                )
                with trio.fail_after(10):
                    asked = (await a.until(lambda e: e.type == "permission.requested"))[-1]
                    assert (asked.payload.kind, asked.payload.tool_name) == (
                        "tool",
                        f"{PREFIX}slow",
                    )
                    await cancel(gw, gated_sid, turn_id)
                    await a.until_turn_ends()
                    ea = a.events
            tail = seq(ea)[seq(ea).index("permission.requested") :]
            assert tail == [
                "permission.requested", "permission.resolved", "tool.failed", "turn.cancelled",
            ], tail  # fmt: skip
            assert ea[-3].payload.decision == "cancelled"
            assert ea[-2].payload.error_class == "cancelled"
            assert ea[-1].payload.phase == "seam"

            # Neither the llm- nor the seam-phase call reached the server; the server is the
            # same process, never counted as failed, and the session's next call works.
            events = await run_turn(gw, sid, script([call("echo", text="next")], DONE))
            assert only(events, "tool.completed").result == "next"
            assert not marker_llm.exists() and not marker_seam.exists()
            assert pid_of(gw) == pid and failures(gw, "everything") == 0


# --- 5, 6: a server that dies mid-call; a server that cannot start ---------------------------


@pytest.mark.slow  # over a second on two cores (measured with --durations)
async def test_a_server_dying_mid_call_fails_the_call_fast_and_the_next_call_restarts_it(
    tmp_path: Path,
) -> None:
    config = mcp_config(tmp_path)
    with trio.fail_after(30):
        async with running_gateway(config) as gw:
            sid = await gw.create_session()
            events = await run_turn(gw, sid, script([call("echo", text="up")], DONE))
            first = pid_of(gw)
            async with gw.client(sid) as client:
                await client.subscribe()
                await gw.submit(sid, script([call("die")], DONE))
                await client.until(lambda e: e.type == "tool.called")
                called_at = trio.current_time()
                with trio.fail_after(1):
                    failed = (await client.until(lambda e: e.type == "tool.failed"))[-1]
                took = trio.current_time() - called_at
                events = await client.until_turn_ends()
            assert failed.payload.error_class == "error", failed.payload
            assert "went away" in failed.payload.message, failed.payload.message
            assert took < 1
            # the turn goes on: the model is told, and the turn completes
            assert events[-1].type == "turn.completed"
            assert events[-1].payload.stop_reason == "end_turn"
            await gone_within(first, 5)
            assert failures(gw, "everything") == 1
            # the next turn's call starts the server again, at once (it had come up)
            events = await run_turn(gw, sid, script([call("echo", text="again")], DONE))
            assert only(events, "tool.completed").result == "again"
            assert pid_of(gw) != first
            assert failures(gw, "everything") == 1


@pytest.mark.slow  # over a second on two cores (measured with --durations)
async def test_a_server_that_cannot_start_fails_its_calls_and_nothing_else(tmp_path: Path) -> None:
    servers = {
        "everything": {"command": EVERYTHING},
        "bad": {"command": [str(tmp_path / "no-such-mcp-server")]},
    }
    config = mcp_config(tmp_path, servers=servers, tools=("sleep", f"{PREFIX}*", "mcp__bad__*"))
    with trio.fail_after(30):
        async with running_gateway(config) as gw:  # it starts, whatever "bad" does
            assert (await gw.http.get("/healthz")).status_code == 200
            await gw.node.mcp.wait_ready()  # type: ignore[union-attr]
            metrics = (await gw.http.get("/metrics")).text
            line = 'gateway_mcp_server_failures_total{server="bad"}'
            [value] = [m.split()[-1] for m in metrics.splitlines() if m.startswith(line)]
            assert float(value) >= 1, metrics
            sid = await gw.create_session()
            content = script(
                [
                    call("echo", text="fine"),
                    {"tool_use": {"name": "mcp__bad__x", "input": {}}},
                    {"tool_use": {"name": "sleep", "input": {"seconds": 0.01}}},
                ],
                DONE,
            )
            events = await run_turn(gw, sid, content)
            failed = only(events, "tool.failed")
            assert failed.tool_name == "mcp__bad__x"
            assert failed.error_class == "error", failed
            assert "'bad'" in failed.message and "no-such-mcp-server" in failed.message, failed
            done = {
                e.payload.tool_name: e.payload.result for e in events if e.type == "tool.completed"
            }
            assert done == {f"{PREFIX}echo": "fine", "sleep": "slept 0.01 s"}
            assert events[-1].type == "turn.completed"
            assert failures(gw, "everything") == 0


# --- 7: a restart on the same store and config ------------------------------------------------


@pytest.mark.slow  # over a second on two cores (measured with --durations)
async def test_a_restarted_gateway_answers_the_next_mcp_call_and_left_no_server(
    tmp_path: Path,
) -> None:
    config = mcp_config(tmp_path)
    with trio.fail_after(30):
        async with running_gateway(config) as gw:
            sid = await gw.create_session()
            events = await run_turn(gw, sid, script([call("echo", text="one")], DONE))
            assert only(events, "tool.completed").result == "one"
            first = pid_of(gw)
        await gone_within(first, 5)  # stopped with its gateway, not just orphaned
        async with running_gateway(config) as gw:
            events = await run_turn(gw, sid, script([call("echo", text="two")], DONE))
            assert only(events, "tool.completed").result == "two"
            assert pid_of(gw) != first
            r = await gw.http.get(f"/sessions/{sid}/messages")
            texts = [
                block["content"]
                for message in r.json()["messages"]
                for block in message["content"]
                if block["type"] == "tool_result"
            ]
            assert texts == ["one", "two"]


# --- 9: scope = "session" ----------------------------------------------------------------------


@pytest.mark.slow  # over a second on two cores (measured with --durations)
async def test_session_scope_servers_are_one_process_per_session_in_its_workspace(
    tmp_path: Path,
) -> None:
    servers = {"everything": {"command": EVERYTHING, "scope": "session"}}
    config = mcp_config(tmp_path, servers=servers)
    pids: list[int] = []
    with trio.fail_after(30):
        async with running_gateway(config) as gw:
            where: dict[str, dict[str, Any]] = {}
            sessions = [await gw.create_session() for _ in range(2)]
            for sid in sessions:
                events = await run_turn(gw, sid, script([call("where")], DONE))
                where[sid] = json.loads(only(events, "tool.completed").result)
                pids.append(pid_of(gw, session_id=sid))
                snap = await snapshot_of(gw, sid)
                assert {t.name for t in snap.session.tools} >= {f"{PREFIX}where", "sleep"}
            assert pids[0] != pids[1] and all(alive(pid) for pid in pids)
            root = (tmp_path / "workspaces").resolve()
            cwds = [Path(where[sid]["cwd"]).resolve() for sid in sessions]
            assert cwds[0] != cwds[1], cwds
            assert all(
                root in cwd.parents and cwd.name == sid
                for cwd, sid in zip(cwds, sessions, strict=True)
            ), cwds
            for sid, cwd in zip(sessions, cwds, strict=True):
                snap = await snapshot_of(gw, sid)
                assert cwd.as_posix().endswith("/" + snap.session.workspace_path), cwd
        for pid in pids:
            await gone_within(pid, 5)


# --- 8: no server process outlives the daemon, kill -9 included --------------------------------


@pytest.mark.slow  # over a second on two cores (measured with --durations)
async def test_no_server_process_outlives_the_daemon_kill_9_or_sigterm(tmp_path: Path) -> None:
    """``gateway serve`` as a process; its stdio server used by a turn; the daemon killed."""
    for how in (signal.SIGKILL, signal.SIGTERM):
        cwd = tmp_path / how.name
        cwd.mkdir()
        pid_file = cwd / "mcp.pid"
        # A server that outlives its stdin and ignores SIGTERM: only a SIGKILL ends it.
        env = {"MCP_PID_FILE": str(pid_file), "MCP_STUBBORN": "1"}
        servers = {"everything": {"command": EVERYTHING, "env": env}}
        tables = sections(cwd, servers=servers)
        tables["tools"]["kill_grace_s"] = 0.5
        config = write_config(cwd / "gateway.toml", tables)
        with trio.fail_after(30):
            async with gateway_process(cwd, "--config", str(config), "--port", "0") as (proc, port):
                async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
                    sid = (await http.post("/sessions", json={})).json()["session_id"]
                    url = (await http.get(f"/sessions/{sid}")).json()["ws_url"]
                    async with open_ws(url) as ws:
                        client = Client(ws, sid)
                        await client.subscribe()
                        content = json.dumps(script([call("echo", text="up")], DONE))
                        r = await http.post(f"/sessions/{sid}/turns", json={"content": content})
                        assert r.status_code == 202, r.text
                        events = await client.until_turn_ends()
                assert only(events, "tool.completed").result == "up"
                [pid] = [int(line) for line in (await appears(pid_file)).split()]
                assert alive(pid)
                proc.send_signal(how)
                status = await proc.wait()
                assert status == (-signal.SIGKILL if how == signal.SIGKILL else 0), status
                await gone_within(pid, 5)

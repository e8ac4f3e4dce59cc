"""MCP tools through the official SDK's client, over stdio and streamable HTTP (protocol §11).

Real server processes (tests/mcp_servers), since the process is the point:
its spawn, its death, its cancel, its stop.
"""

from __future__ import annotations

# Polling a process or a file for a change no event tells of.
# ruff: noqa: ASYNC110
import json
import logging
import os
import signal
from pathlib import Path

import pytest
import trio

from gateway.errors import ToolError
from gateway.mcp.tools import MAX_RESULT_BYTES
from gateway.tools.builtin import build_registry
from gateway.tools.registry import SessionTools, ToolRegistry
from tests.conftest import free_port
from tests.fresh_interpreter import modules_after_a_turn
from tests.mcp_support import (
    EVERYTHING,
    HANG,
    RAW,
    FakeSession,
    context,
    http_server,
    running,
    server,
)
from tests.paths import ROOT, TESTS


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


def failures(manager: object, name: str) -> float:
    metric = manager.metrics.mcp_server_failures.labels(name)  # type: ignore[attr-defined]
    return float(metric._value.get())


@pytest.mark.slow  # over a second on two cores (measured with --durations)
async def test_tools_are_listed_and_results_mapped(tmp_path: Path) -> None:
    async with running(ev=server(command=EVERYTHING)) as manager:
        await manager.wait_ready()
        tools = manager.session_tools(ToolRegistry(), "ses_a")
        names = tools.names()
        assert "mcp__ev__echo" in names and "mcp__ev__structured" in names
        assert tools.source_of("mcp__ev__echo") == "mcp:ev"
        [spec] = [s for s in tools.specs() if s.name == "mcp__ev__echo"]
        assert spec.input_schema["required"] == ["text"] and spec.description == "Echo a text."
        ctx = context()

        out = await tools.execute("mcp__ev__echo", {"text": "hi"}, ctx)
        assert (out.content, out.structured) == ("hi", None)
        out = await tools.execute("mcp__ev__structured", {}, ctx)
        assert (out.content, out.structured) == ("two items", {"items": [1, 2]})
        out = await tools.execute("mcp__ev__image", {}, ctx)  # its bytes: the session keeps them
        assert (out.content, out.files) == ("a picture:", [("image/png", b"\x89PNG\r\n\x1a\n")])

        with pytest.raises(ToolError) as err:
            await tools.execute("mcp__ev__fail", {}, ctx)
        assert (err.value.error_class, err.value.message) == ("error", "boom")
        with pytest.raises(ToolError) as err:
            await tools.execute("mcp__ev__crash", {}, ctx)
        assert err.value.error_class == "error" and "crashed on purpose" in err.value.message
        with pytest.raises(ToolError) as err:  # checked here: the server never sees it
            await tools.execute("mcp__ev__echo", {"text": 5}, ctx)
        assert err.value.error_class == "invalid_input" and "'text'" in err.value.message
        with pytest.raises(ToolError) as err:
            await tools.execute("mcp__ev__nope", {}, ctx)
        assert err.value.error_class == "unknown_tool"

        out = await tools.execute("mcp__ev__huge", {"mb": 3}, ctx)
        assert len(out.content.encode()) < MAX_RESULT_BYTES + 200
        assert out.content.endswith(
            f"[gateway: result cut at {MAX_RESULT_BYTES} of its 3145728 bytes]"
        )

        # An agent's tool list filters the MCP tools as the built-in ones.
        only = SessionTools(
            build_registry(["sleep", "read_file"]),
            lambda: manager.tools("ses_a"),
            lambda name: name in ("mcp__ev__echo", "sleep"),
        )
        assert only.names() == ["sleep", "mcp__ev__echo"]
        assert (only.source_of("sleep"), only.source_of("mcp__ev__fail")) == ("builtin", None)


@pytest.mark.slow  # over a second on two cores (measured with --durations)
async def test_cancel_sends_notifications_cancelled_and_the_other_session_goes_on(
    tmp_path: Path,
) -> None:
    """Two sessions share a node server; one call is cancelled, the other completes."""
    marker = tmp_path / "cancelled"
    async with running(ev=server(command=EVERYTHING)) as manager:
        await manager.wait_ready()
        tools = manager.session_tools(ToolRegistry(), "ses_a")
        done: list[str] = []

        async def other() -> None:
            out = await tools.execute("mcp__ev__slow", {"seconds": 1.5}, context("ses_b"))
            done.append(out.content)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(other)
            with trio.move_on_after(0.5):
                await tools.execute(
                    "mcp__ev__slow", {"seconds": 30, "marker": str(marker)}, context("ses_a")
                )
                pytest.fail("not cancelled")
        assert done == ["slept 1.5"]
        with trio.fail_after(5):
            while not marker.exists():
                await trio.sleep(0.05)
        assert marker.read_text() == "cancelled"
        # The server is still the same one, and answers.
        assert (await tools.execute("mcp__ev__echo", {"text": "x"}, context())).content == "x"
        assert failures(manager, "ev") == 0


@pytest.mark.slow  # over a second on two cores (measured with --durations)
async def test_tool_timeout_is_a_timeout_and_cancels_the_call(tmp_path: Path) -> None:
    marker = tmp_path / "cancelled"
    async with running(ev=server(command=EVERYTHING, tool_timeout_s=0.5)) as manager:
        await manager.wait_ready()
        tools = manager.session_tools(ToolRegistry(), "ses_a")
        with pytest.raises(ToolError) as err:
            await tools.execute("mcp__ev__slow", {"seconds": 30, "marker": str(marker)}, context())
        assert err.value.error_class == "timeout" and "tool_timeout_s" in err.value.message
        with trio.fail_after(5):
            while not marker.exists():
                await trio.sleep(0.05)


@pytest.mark.slow  # over a second on two cores (measured with --durations)
async def test_a_dying_server_fails_its_call_fast_and_the_next_call_restarts_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, "gateway.mcp")
    async with running(ev=server(command=EVERYTHING)) as manager:
        await manager.wait_ready()
        tools = manager.session_tools(ToolRegistry(), "ses_a")
        connection = manager.connection("ev")
        assert connection is not None and connection.pid is not None
        first = connection.pid
        started = trio.current_time()
        with pytest.raises(ToolError) as err:
            await tools.execute("mcp__ev__die", {}, context())
        assert trio.current_time() - started < 1.0
        assert err.value.error_class == "error" and "'ev'" in err.value.message
        with trio.fail_after(5):
            while connection.live:
                await trio.sleep(0.01)
        assert failures(manager, "ev") == 1
        assert any(getattr(r, "event", "") == "mcp_server_failed" for r in caplog.records)
        assert not alive(first)
        # Its tools stay listed meanwhile; the next call starts it again.
        assert "mcp__ev__echo" in tools
        out = await tools.execute("mcp__ev__echo", {"text": "back"}, context())
        assert out.content == "back" and connection.pid not in (None, first)


@pytest.mark.slow  # over a second on two cores (measured with --durations)
async def test_bad_servers_are_logged_counted_and_never_crash_the_manager(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, "gateway.mcp")
    async with running(
        missing=server(command=["/nonexistent/mcp-server"]),
        down=server(url=f"http://127.0.0.1:{free_port()}/mcp", startup_timeout_s=5),
        hangs=server(command=HANG, startup_timeout_s=1),
        ev=server(command=EVERYTHING),
    ) as manager:
        with trio.fail_after(15):
            await manager.wait_ready()
        for name in ("missing", "down", "hangs"):
            assert failures(manager, name) == 1, name
            connection = manager.connection(name)
            assert connection is not None and not connection.live
            with pytest.raises(ToolError) as err:  # within its backoff: fails at once
                await connection.call("anything", {}, context())
            assert err.value.error_class == "error" and repr(name) in err.value.message
        logged = {
            r.fields["server"]: r.fields["error"]  # type: ignore[attr-defined]
            for r in caplog.records
            if getattr(r, "event", "") == "mcp_server_failed"
        }
        assert "No such file" in logged["missing"]
        assert "startup_timeout_s" in logged["hangs"]
        assert set(logged) == {"missing", "down", "hangs"}
        hang = manager.connection("hangs")
        assert hang is not None and hang.pid is None  # its process was stopped
        # The good server is unaffected.
        tools = manager.session_tools(ToolRegistry(), "ses_a")
        assert (await tools.execute("mcp__ev__echo", {"text": "ok"}, context())).content == "ok"


async def test_a_tool_with_an_unusable_schema_is_dropped_not_the_server(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, "gateway.mcp")
    async with running(raw=server(command=RAW)) as manager:
        await manager.wait_ready()
        tools = manager.session_tools(ToolRegistry(), "ses_a")
        assert tools.names() == ["mcp__raw__ok"]
        dropped = {
            r.fields["tool"]  # type: ignore[attr-defined]
            for r in caplog.records
            if getattr(r, "event", "") == "mcp_tool_dropped"
        }
        assert dropped == {"not_object", "garbage", "no_schema", "42"}
        assert (await tools.execute("mcp__raw__ok", {"text": "x"}, context())).content == "ok x"
        assert failures(manager, "raw") == 0


@pytest.mark.slow  # over a second on two cores (measured with --durations)
async def test_list_changed_lists_the_tools_again() -> None:
    async with running(ev=server(command=EVERYTHING)) as manager:
        await manager.wait_ready()
        tools = manager.session_tools(ToolRegistry(), "ses_a")
        assert "mcp__ev__extra" not in tools
        await tools.execute("mcp__ev__grow", {}, context())
        with trio.fail_after(5):
            while "mcp__ev__extra" not in tools:
                await trio.sleep(0.02)
        assert (await tools.execute("mcp__ev__extra", {}, context())).content == "extra works"


@pytest.mark.slow  # over a second on two cores (measured with --durations)
async def test_a_session_server_runs_in_the_workspace_and_stops_with_the_session(
    tmp_path: Path,
) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    config = server(command=EVERYTHING, scope="session", env={"MCP_TEST_ENV": "yes"})
    os.environ["GATEWAY_SECRET_FOR_TEST"] = "leak"
    try:
        async with running(ev=config) as manager:
            assert manager.tools("ses_a") == []  # not opened yet
            manager.open_session("ses_a", str(workspace))
            await manager.wait_ready("ses_a")
            tools = manager.session_tools(ToolRegistry(), "ses_a")
            out = await tools.execute("mcp__ev__where", {}, context())
            where = json.loads(out.content)
            assert where["cwd"] == str(workspace) and where["home"] == str(workspace)
            assert where["env"] == "yes" and "GATEWAY_SECRET_FOR_TEST" not in where["keys"]
            assert manager.tools("ses_b") == []  # another session does not see it
            connection = manager.connection("ev", "ses_a")
            assert connection is not None and connection.pid is not None
            pid = connection.pid
            manager.close_session("ses_a")
            with trio.fail_after(5):
                while alive(pid):
                    await trio.sleep(0.02)
            assert manager.tools("ses_a") == []
            with pytest.raises(ToolError):
                await connection.call("echo", {"text": "x"}, context())
            assert failures(manager, "ev") == 0  # a stop is no failure
    finally:
        del os.environ["GATEWAY_SECRET_FOR_TEST"]


@pytest.mark.slow  # over a second on two cores (measured with --durations)
@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        (("allow", {"ok": True, "note": "go"}), 'accept {"note": "go", "ok": true}'),
        (("deny", None), "decline null"),
        (("timeout", None), "cancel null"),
        (("cancelled", None), "cancel null"),
    ],
)
async def test_an_elicitation_is_asked_of_the_calling_session(
    answer: tuple[str, dict[str, object] | None], expected: str
) -> None:
    async with running(ev=server(command=EVERYTHING)) as manager:
        await manager.wait_ready()
        tools = manager.session_tools(ToolRegistry(), "ses_a")
        session = FakeSession("ses_a", answer)
        out = await tools.execute(
            "mcp__ev__elicit", {"question": "Delete it?"}, context("ses_a", session)
        )
        assert out.content == expected
        [(tool_use_id, message, schema)] = session.asked
        assert (tool_use_id, message) == ("toolu_ses_a", "Delete it?")
        assert schema["required"] == ["ok"] and schema["type"] == "object"


@pytest.mark.slow  # over a second on two cores (measured with --durations)
async def test_the_http_transport_sends_the_headers_and_cancels() -> None:
    async with http_server() as url:
        headers = {"Authorization": "Bearer sekrit", "X-Test": "yes"}
        async with running(web=server(url=url, headers=headers)) as manager:
            with trio.fail_after(20):
                await manager.wait_ready()
            tools = manager.session_tools(ToolRegistry(), "ses_a")
            out = await tools.execute("mcp__web__headers", {}, context())
            assert json.loads(out.content) == {"authorization": "Bearer sekrit", "x-test": "yes"}
            out = await tools.execute("mcp__web__structured", {}, context())
            assert out.structured == {"items": [1, 2]}
            session = FakeSession("ses_a", ("allow", {"ok": False}))
            out = await tools.execute("mcp__web__elicit", {}, context("ses_a", session))
            assert out.content == 'accept {"ok": false}'
            with trio.move_on_after(0.3):
                await tools.execute("mcp__web__slow", {"seconds": 30}, context())
            assert (await tools.execute("mcp__web__echo", {"text": "y"}, context())).content == "y"


@pytest.mark.slow  # over a second on two cores (measured with --durations)
async def test_a_result_over_a_mib_over_http_is_cut_as_on_stdio() -> None:
    """docs/protocol.md §11 "Results": text is cut at 1 MiB, whatever the transport. The
    SDK's streamable HTTP client refuses an SSE event over 1 MiB by default, which failed
    the call and dropped the connection ("went away") where stdio cut the result."""
    async with http_server() as url, running(web=server(url=url)) as manager:
        with trio.fail_after(20):
            await manager.wait_ready()
        tools = manager.session_tools(ToolRegistry(), "ses_a")
        with trio.fail_after(20):
            out = await tools.execute("mcp__web__huge", {"mb": 3}, context())
        assert out.content.endswith(
            f"[gateway: result cut at {MAX_RESULT_BYTES} of its 3145728 bytes]"
        )
        assert failures(manager, "web") == 0


@pytest.mark.slow  # over a second on two cores (measured with --durations)
async def test_stopping_the_manager_stops_every_server_process() -> None:
    async with running(ev=server(command=EVERYTHING)) as manager:
        await manager.wait_ready()
        connection = manager.connection("ev")
        assert connection is not None and connection.pid is not None
        pid = connection.pid
    assert not alive(pid)


@pytest.mark.slow  # over a second on two cores (measured with --durations)
async def test_kill_9_of_the_daemon_kills_its_mcp_servers(tmp_path: Path) -> None:
    """A daemon (tests/mcp_servers/daemon.py: the watchdog and the MCP servers) is kill -9'd."""
    import subprocess
    import sys

    proc = await trio.lowlevel.open_process(
        [sys.executable, str(TESTS / "mcp_servers" / "daemon.py")],
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        assert proc.stdout is not None
        data = b""
        with trio.fail_after(30):
            while b"\n" not in data:
                chunk = await proc.stdout.receive_some(100)
                assert chunk, "the daemon exited"
                data += chunk
        pid = int(data.split()[1])
        assert alive(pid)
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
        with trio.fail_after(5):
            while alive(pid):
                await trio.sleep(0.05)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


@pytest.mark.slow  # over a second on two cores (measured with --durations)
async def test_the_example_notes_server(tmp_path: Path) -> None:
    """examples/mcp_notes.py, as the worked example of docs/agents.md runs it (session scope)."""
    example = ROOT / "examples" / "mcp_notes.py"
    import sys

    config = server(command=[sys.executable, str(example)], scope="session")
    async with running(notes=config) as manager:
        manager.open_session("ses_a", str(tmp_path))
        await manager.wait_ready("ses_a")
        tools = manager.session_tools(ToolRegistry(), "ses_a")
        await tools.execute("mcp__notes__add_note", {"text": "buy milk"}, context())
        out = await tools.execute("mcp__notes__search", {"query": "MILK"}, context())
        assert out.content == "1. buy milk"
        assert json.loads((tmp_path / "notes.json").read_text()) == ["buy milk"]
        session = FakeSession("ses_a", ("deny", None))
        out = await tools.execute("mcp__notes__clear_notes", {}, context("ses_a", session))
        assert out.content == "kept the notes (decline)" and len(session.asked) == 1


@pytest.mark.slow  # over a second on two cores (measured with --durations)
async def test_a_session_server_stops_when_its_session_goes_idle(tmp_path: Path) -> None:
    """Unused for ``[sessions] idle_unload_s``: stopped; busy with a call: kept; the next turn:
    started again (docs/protocol.md §11: "stops it when the session goes idle")."""
    config = server(command=EVERYTHING, scope="session")
    async with running(idle_unload_s=0.4, ev=config) as manager:
        manager.open_session("ses_a", str(tmp_path))
        await manager.wait_ready("ses_a")
        tools = manager.session_tools(ToolRegistry(), "ses_a")
        first = manager.connection("ev", "ses_a")
        assert first is not None and first.pid is not None
        pid = first.pid
        # A call longer than the idle time keeps the server: it is in use.
        out = await tools.execute("mcp__ev__slow", {"seconds": 1.0}, context())
        assert alive(pid) and "slept" in out.content.lower()
        with trio.fail_after(5):
            while alive(pid):  # then unused: stopped
                await trio.sleep(0.05)
        assert manager.connection("ev", "ses_a") is None
        manager.open_session("ses_a", str(tmp_path))  # its next turn
        await manager.wait_ready("ses_a")
        again = manager.connection("ev", "ses_a")
        assert again is not None and again.pid not in (None, pid)
        assert failures(manager, "ev") == 0  # an idle stop is no failure


def test_a_daemon_with_no_mcp_server_never_imports_the_sdk(tmp_path: Path) -> None:
    """The ``mcp`` SDK's types take about a second to import: a daemon with no
    ``[mcp_servers]`` runs a turn without them (a fresh interpreter)."""
    assert modules_after_a_turn(tmp_path, ("mcp.", "mcp_types")) == []

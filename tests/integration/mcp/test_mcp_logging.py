"""An MCP server's log messages through the SDK's client and a real server process: the
daemon's log, never a session's stream (docs/protocol.md §11, gateway.mcp.server_log)."""

from __future__ import annotations

# Polling the captured log for a line no event tells of.
# ruff: noqa: ASYNC110
import logging
import sys
from pathlib import Path

import pytest
import trio

from gateway.mcp.server_log import MAX_LINES_PER_S
from gateway.tools.registry import ToolContext, ToolRegistry
from tests.integration.mcp.test_mcp_progress import HOSTILE_A
from tests.mcp_support import FakeSession, running, server


class Emits(FakeSession):
    """A session that records what it is asked to emit (nothing should be)."""

    def __init__(self) -> None:
        super().__init__("ses_a")
        self.emitted: list[object] = []

    def emit(self, payloads: object, turn_id: str | None) -> object:
        self.emitted.append(payloads)
        return None


def logged(caplog: pytest.LogCaptureFixture, name: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if getattr(r, "event", None) == name]


def accounted(caplog: pytest.LogCaptureFixture) -> int:
    """The flood's lines logged or counted as dropped (the first two lines left out)."""
    dropped = logged(caplog, "mcp_server_log_dropped")
    counted = sum(r.fields["count"] for r in dropped)  # type: ignore[attr-defined]
    return len(logged(caplog, "mcp_server_log")) - 2 + counted


async def test_log_lines_reach_the_daemons_log_leveled_and_a_flood_is_bounded(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "gateway.mcp")
    session = Emits()
    ctx = ToolContext("ses_a", "turn_1", "toolu_1", "", session=session)
    with trio.fail_after(60):
        async with running(ha=server(command=HOSTILE_A)) as manager:
            await manager.wait_ready()
            tools = manager.session_tools(ToolRegistry(), "ses_a")
            # It was asked to log at the daemon's level (logging/setLevel once it is up,
            # beside its first calls: not before them).
            with trio.fail_after(5):
                while (await tools.execute("mcp__ha__level", {}, ctx)).content != "info":
                    await trio.sleep(0.01)
            await tools.execute("mcp__ha__log", {"n": 2, "level": "error"}, ctx)
            with trio.fail_after(5):
                while len(logged(caplog, "mcp_server_log")) < 2:
                    await trio.sleep(0.01)
            first = logged(caplog, "mcp_server_log")[0]
            assert first.levelno == logging.ERROR
            assert first.getMessage() == "MCP server ha (hostile): line 0"
            assert first.fields == {  # type: ignore[attr-defined]
                "server": "ha", "mcp_level": "error", "logger": "hostile"
            }  # fmt: skip

            started = trio.current_time()
            await tools.execute("mcp__ha__log", {"n": 10_000}, ctx)
            await trio.sleep(0.5)
            seconds = trio.current_time() - started + 1
            # The daemon is fine: the next call is answered at once.
            with trio.fail_after(5):
                await tools.execute("mcp__ha__level", {}, ctx)
            await trio.sleep(1.1)
            await tools.execute("mcp__ha__log", {"n": 1}, ctx)  # the next second: the count
            with trio.fail_after(5):  # every line is logged or counted
                while accounted(caplog) < 10_001:
                    await trio.sleep(0.01)
    lines = logged(caplog, "mcp_server_log")
    assert len(lines) <= 2 + MAX_LINES_PER_S * (seconds + 2), len(lines)
    assert logged(caplog, "mcp_server_log_dropped") and accounted(caplog) == 10_001
    assert session.emitted == []  # never a session's event


async def test_a_server_refusing_set_level_still_comes_up(tmp_path: Path) -> None:
    env = {"HOSTILE_A_REFUSE_LEVEL": "1"}
    async with running(ha=server(command=HOSTILE_A, env=env)) as manager:
        await manager.wait_ready()
        connection = manager.connection("ha")
        assert connection is not None and connection.live
        tools = manager.session_tools(ToolRegistry(), "ses_a")
        ctx = ToolContext("ses_a", "turn_1", "toolu_1", "")
        assert (await tools.execute("mcp__ha__level", {}, ctx)).content == "None"


async def test_a_servers_stderr_cannot_forge_lines_of_the_daemons_log(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Its stderr (logged at debug, and its last line in ``mcp_server_failed``) was written as
    is: a newline forged lines of the daemon's text log, an escape drove a terminal."""
    caplog.set_level(logging.DEBUG, "gateway.mcp")
    said = "boom\\x1b[2J\\r\\n2026-12-02 18:00:00,000 ERROR gateway.auth: key revoked\\x07"
    script = f"import sys; sys.stderr.write('{said}'); sys.stderr.flush(); sys.exit(1)"
    with trio.fail_after(30):
        async with running(bad=server(command=[sys.executable, "-c", script])) as manager:
            await manager.wait_ready()
    failed = logged(caplog, "mcp_server_failed")
    assert failed and "key revoked" in failed[0].getMessage()
    debug = [r for r in caplog.records if r.name == "gateway.mcp" and "boom" in r.getMessage()]
    for record in [*failed, *debug]:
        text = record.getMessage() + str(getattr(record, "fields", ""))
        for control in ("\n", "\r", "\x1b", "\x07"):
            assert control not in text, (control, text)

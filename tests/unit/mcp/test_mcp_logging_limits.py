"""An MCP server's log messages in the daemon's log (gateway.mcp.server_log; docs/protocol.md
§11), rate-limited per server, under trio's MockClock."""

from __future__ import annotations

import logging
import warnings

import pytest
import trio
import trio.testing

from gateway.mcp.server_log import (
    LEVELS,
    MAX_LINE_CHARS,
    MAX_LINES_PER_S,
    ServerLog,
    ask_level,
    mcp_level,
)


def lines(caplog: pytest.LogCaptureFixture, name: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if getattr(r, "event", None) == name]


async def test_levels_are_mapped_and_fields_kept(
    caplog: pytest.LogCaptureFixture, autojump_clock: trio.testing.MockClock
) -> None:
    caplog.set_level(logging.DEBUG, "gateway.mcp")
    log = ServerLog("ev", "ses_1")
    for level in LEVELS:
        log.receive(level, "db", f"a {level} line")
    log.receive("nonsense", None, {"a": [1, 2]})
    got = lines(caplog, "mcp_server_log")
    assert [(r.levelno, r.getMessage()) for r in got[:8]] == [
        (LEVELS[level], f"MCP server ev (db): a {level} line") for level in LEVELS
    ]
    assert got[4].levelno == logging.ERROR and got[7].levelno == logging.CRITICAL
    assert got[1].fields == {  # type: ignore[attr-defined]
        "server": "ev", "session_id": "ses_1", "mcp_level": "info", "logger": "db"
    }  # fmt: skip
    assert got[-1].levelno == logging.INFO and got[-1].getMessage().endswith('{"a": [1, 2]}')


async def test_a_flood_is_rate_limited_then_counted(
    caplog: pytest.LogCaptureFixture, autojump_clock: trio.testing.MockClock
) -> None:
    caplog.set_level(logging.INFO, "gateway.mcp")
    log = ServerLog("ev")
    other = ServerLog("other")  # per server: another's lines are its own
    for i in range(10_000):
        log.receive("info", None, f"line {i}")
    other.receive("info", None, "mine")
    assert len(lines(caplog, "mcp_server_log")) == MAX_LINES_PER_S + 1
    assert lines(caplog, "mcp_server_log_dropped") == []
    await trio.sleep(1.0)
    log.receive("warning", None, "after")
    [dropped] = lines(caplog, "mcp_server_log_dropped")
    assert dropped.fields["count"] == 10_000 - MAX_LINES_PER_S  # type: ignore[attr-defined]
    assert lines(caplog, "mcp_server_log")[-1].getMessage() == "MCP server ev: after"


async def test_a_long_line_is_cut(
    caplog: pytest.LogCaptureFixture, autojump_clock: trio.testing.MockClock
) -> None:
    caplog.set_level(logging.INFO, "gateway.mcp")
    ServerLog("ev").receive("info", "x" * 500, "y" * 100_000)
    [line] = lines(caplog, "mcp_server_log")
    assert len(line.getMessage()) < MAX_LINE_CHARS + 200


def test_the_level_asked_of_a_server_is_the_daemons() -> None:
    assert [mcp_level(v) for v in (5, 10, 20, 30, 40, 50)] == [
        "debug", "debug", "info", "warning", "error", "critical"
    ]  # fmt: skip


async def test_a_line_cannot_forge_lines_of_the_daemons_log(
    caplog: pytest.LogCaptureFixture, autojump_clock: trio.testing.MockClock
) -> None:
    """A server's text (its ``data`` and ``logger``) with newlines and terminal escapes was
    written as is: under ``[log] format = "text"`` it forged whole lines of the daemon's log
    (and drove an operator's terminal)."""
    caplog.set_level(logging.INFO, "gateway.mcp")
    forged = "ok\n2026-12-02 18:00:00,000 ERROR gateway.auth: key revoked\r\x1b[2J\x07\x85\u2028"
    ServerLog("ev").receive("info", "db\n\x1b[31mroot", forged)
    ServerLog("ev").receive("info", None, {"said": forged})  # JSON data is escaped already
    [line, data] = lines(caplog, "mcp_server_log")
    shown = line.getMessage() + str(line.fields["logger"])  # type: ignore[attr-defined]
    for control in ("\n", "\r", "\x1b", "\x07", "\x85", "\u2028"):
        assert control not in shown, repr(control)
        assert control not in data.getMessage(), repr(control)
    assert "key revoked" in line.getMessage() and "\\n" in line.getMessage()


async def test_servers_asked_at_once_leave_the_daemons_warning_filters_as_they_were(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Each ask set an "ignore every warning" filter across its wait (catch_warnings is the
    process's, not a task's): two servers asked at once, the first answering first, left
    the second's restore putting the first's filter back, for good: the daemon then hid
    every warning."""

    class Server:
        def __init__(self, answer_s: float) -> None:
            self.answer_s = answer_s

        async def set_logging_level(self, level: str) -> None:
            await trio.sleep(self.answer_s)

    before = list(warnings.filters)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(ask_level, Server(1.0), logging.INFO)
        await trio.sleep(0.1)
        nursery.start_soon(ask_level, Server(2.0), logging.INFO)
        await trio.sleep(0.5)
        assert warnings.filters == before  # not while they wait either
    assert warnings.filters == before

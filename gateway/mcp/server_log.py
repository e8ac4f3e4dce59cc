"""An MCP server's log messages in the daemon's log (docs/protocol.md §11 "MCP tools").

A server's ``notifications/message`` is one line of the daemon's log, the
event ``mcp_server_log`` (logger ``gateway.mcp``), with its ``server``, the
server's ``logger`` and ``mcp_level``, at the level MCP's (syslog's) maps to
(:data:`LEVELS`); never an event of a session's stream. Once it is up (beside its
first calls, so a slow answer holds no start), a server that declares the
``logging`` capability is asked (``logging/setLevel``) for what the daemon
logs: the level :func:`mcp_level` maps the ``gateway.mcp`` logger's own to,
so a daemon at ``info`` is not sent ``debug`` lines.

A server may log in a loop: at most :data:`MAX_LINES_PER_S` of one server's
lines are logged a second; past them, its lines are counted, and the first
line of the next second is one ``mcp_server_log_dropped`` saying how many
were not logged (as ``GARBAGE_LOG_INTERVAL_S`` does for a server's stray
stdout lines). A line is cut at :data:`MAX_LINE_CHARS`. Its text and ``logger``
are the server's: their control characters (newlines, terminal escapes, Unicode
line separators) are written escaped (``\\n``, ``\\x1b``), so a server cannot
forge lines of the daemon's text log nor drive an operator's terminal.
"""

from __future__ import annotations

import json
import logging
import re
import warnings
from contextlib import suppress
from typing import Any

import mcp_types as types
import pydantic
import trio
from mcp.client.session import ClientSession
from mcp.shared.exceptions import MCPDeprecationWarning, MCPError

from gateway.logs import event

log = logging.getLogger("gateway.mcp")

MAX_LINES_PER_S = 20
"""One server's log lines logged a second at most; the rest are counted (module docstring)."""

MAX_LINE_CHARS = 2000
"""A server's log message is cut there (with "...")."""

LEVELS: dict[str, int] = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "notice": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,
    "alert": logging.CRITICAL,
    "emergency": logging.CRITICAL,
}
"""MCP's log levels (RFC 5424's) as Python's."""


ASK_LEVEL_S = 5.0
"""How long a server has to answer ``logging/setLevel`` at its start (else it is let be)."""


def mcp_level(level: int) -> types.LoggingLevel:
    """The MCP level asked of a server for a daemon logging at ``level`` (module docstring)."""
    if level <= logging.DEBUG:
        return "debug"
    if level <= logging.INFO:
        return "info"
    if level <= logging.WARNING:
        return "warning"
    return "error" if level <= logging.ERROR else "critical"


async def ask_level(session: ClientSession, level: int) -> None:
    """Ask a server to log at the daemon's ``level`` (module docstring); a refusal, an error
    or no answer within :data:`ASK_LEVEL_S` leaves it as it is."""
    # Deprecated by MCP's 2026 revision (it still exists): the SDK warns as it is called.
    # The filters are the process's, not a task's: set around the call only, never
    # across a wait (servers asked at once restored each other's "ignore" for good).
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", MCPDeprecationWarning)
        asked = session.set_logging_level(mcp_level(level))
    with trio.move_on_after(ASK_LEVEL_S), suppress(MCPError, pydantic.ValidationError):
        await asked


_CONTROL = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029]")
"""What a server's text may not put in the log as is (module docstring); a tab may."""


def escaped(text: str) -> str:
    """``text`` with its control characters as escapes (module docstring)."""
    return _CONTROL.sub(lambda m: repr(m.group())[1:-1], text)


def _text(data: Any) -> str:
    if isinstance(data, str):
        text = data
    else:
        try:
            text = json.dumps(data, ensure_ascii=False, default=str)
        except (TypeError, ValueError):
            text = repr(data)
    text = text if len(text) <= MAX_LINE_CHARS else text[:MAX_LINE_CHARS] + "..."
    return escaped(text)


class ServerLog:
    """One server's ``logging_callback``: its messages, rate-limited (module docstring)."""

    def __init__(self, server: str, session_id: str | None = None) -> None:
        self.server = server
        self.session_id = session_id
        self._second = -1.0  # the start of the current second
        self._lines = 0  # logged in it
        self._dropped = 0  # not logged since the last line that was

    async def __call__(self, params: Any) -> None:
        self.receive(
            str(getattr(params, "level", "info")),
            getattr(params, "logger", None),
            getattr(params, "data", None),
        )

    def receive(self, level: str, logger: str | None, data: Any) -> None:
        """One log message of the server."""
        now = trio.current_time()
        if now - self._second >= 1.0:
            self._second, self._lines = now, 0
            if self._dropped:
                event(
                    log, logging.WARNING, "mcp_server_log_dropped",
                    f"MCP server {self.server}: {self._dropped} more log lines were not logged"
                    f" (over {MAX_LINES_PER_S} a second)",
                    server=self.server, session_id=self.session_id, count=self._dropped,
                )  # fmt: skip
                self._dropped = 0
        if self._lines >= MAX_LINES_PER_S:
            self._dropped += 1
            return
        self._lines += 1
        text = _text(data)
        logger = escaped(logger[:100]) if isinstance(logger, str) else None
        named = f" ({logger})" if logger else ""
        event(
            log, LEVELS.get(level, logging.INFO), "mcp_server_log",
            f"MCP server {self.server}{named}: {text}",
            server=self.server, session_id=self.session_id, mcp_level=level,
            logger=logger,
        )  # fmt: skip

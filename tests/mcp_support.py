"""Helpers for the MCP tests: a running :class:`McpServers`, the test servers, a fake session."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import msgspec
import trio

from gateway.config import Config, McpServerConfig
from gateway.mcp.servers import McpServers
from gateway.metrics import Metrics
from gateway.tools.process import ToolProcesses
from gateway.tools.registry import ToolContext

SERVERS = Path(__file__).parent / "mcp_servers"
EVERYTHING = [sys.executable, str(SERVERS / "everything.py")]
HANG = [sys.executable, str(SERVERS / "hang.py")]
RAW = [sys.executable, str(SERVERS / "raw_schemas.py")]


def server(**fields: Any) -> McpServerConfig:
    return msgspec.convert(fields, McpServerConfig)


@asynccontextmanager
async def running(
    idle_unload_s: float = 600.0, **servers: McpServerConfig
) -> AsyncIterator[McpServers]:
    """A node's MCP servers (with its tool-process watchdog) running in a nursery."""
    config = msgspec.structs.replace(Config(), mcp_servers=servers)
    sessions = msgspec.structs.replace(config.sessions, idle_unload_s=idle_unload_s)
    config = msgspec.structs.replace(config, sessions=sessions)
    processes = ToolProcesses(config.tools)
    manager = McpServers(config, processes, Metrics())
    async with trio.open_nursery() as nursery:
        await nursery.start(processes.run)
        await nursery.start(manager.run)
        try:
            yield manager
        finally:
            nursery.cancel_scope.cancel()


class FakeSession:
    """A ToolSession that answers elicitations as told, and records them."""

    def __init__(self, id: str, answer: tuple[str, dict[str, Any] | None] = ("deny", None)):
        self.id = id
        self.answer = answer
        self.asked: list[tuple[str, str, dict[str, Any]]] = []
        self.cancel_grace_s = 1.0

    def emit(self, payloads: Any, turn_id: str | None) -> object:
        return None

    async def spawn_worker(self, tool_use_id: str) -> Any:
        raise NotImplementedError

    async def elicit(
        self, ctx: ToolContext, message: str, requested_schema: dict[str, Any]
    ) -> tuple[str, dict[str, Any] | None]:
        self.asked.append((ctx.tool_use_id, message, requested_schema))
        return self.answer


def context(session_id: str = "ses_a", session: Any = None, workspace: str = "/tmp") -> ToolContext:
    return ToolContext(
        session_id=session_id,
        turn_id="turn_1",
        tool_use_id=f"toolu_{session_id}",
        workspace_path=workspace,
        session=session,
    )


@asynccontextmanager
async def http_server() -> AsyncIterator[str]:
    """``everything.py --http`` in a subprocess; yields its URL."""
    proc = await trio.lowlevel.open_process(
        [*EVERYTHING, "--http"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
    )
    try:
        assert proc.stdout is not None
        data = b""
        with trio.fail_after(30):
            while b"\n" not in data:
                chunk = await proc.stdout.receive_some(100)
                assert chunk, "the HTTP test server exited"
                data += chunk
        port = int(data.split()[1])
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.kill()
        await proc.wait()

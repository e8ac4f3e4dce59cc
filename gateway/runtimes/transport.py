"""The Claude Code CLI as a tool process: the SDK's transport, on Trio (docs/protocol.md §15).

The Claude Agent SDK starts the CLI itself (``anyio.open_process``) with the
daemon's whole environment, in the daemon's process group, and never tells
anyone its pid. The gateway gives the SDK this transport instead, so the CLI
is a tool process like any other (:mod:`gateway.tools.process`):

- it is started by :meth:`ToolProcesses.spawn <gateway.tools.process.ToolProcesses.spawn>`:
  in a group of its own, registered with the watchdog (it dies with the
  daemon, kill -9 included), with the resource limits of ``[tools]``;
- its environment is :func:`~gateway.tools.process.tool_environment` plus
  exactly what :mod:`gateway.runtimes.claude_code.options` passes (its session's credential,
  ``ANTHROPIC_BASE_URL``, its own ``HOME`` and ``CLAUDE_CONFIG_DIR``, the
  switches that keep it quiet, the agent's ``env``): nothing else of the
  daemon's;
- its command line is the SDK's own (``SubprocessCLITransport._build_command``),
  so every option of ``ClaudeAgentOptions`` means what the SDK documents.

The wire is the SDK's: one JSON object a line each way (stream-json).
:meth:`close` ends stdin, gives the CLI ``grace_s`` to write its transcript
and exit, then stops its whole group (SIGTERM, SIGKILL), shielded and bounded.
"""

from __future__ import annotations

import collections
import json
import logging
import subprocess
from collections.abc import AsyncIterator, Mapping
from typing import Any

import trio
from claude_agent_sdk import ClaudeAgentOptions
from claude_agent_sdk._errors import CLIConnectionError, ProcessError
from claude_agent_sdk._internal.transport import Transport
from claude_agent_sdk._internal.transport.subprocess_cli import SubprocessCLITransport

from gateway.tools.process import ToolProcesses

log = logging.getLogger("gateway.claude_code")

_MAX_LINE = 16 * 1024 * 1024  # one message of the CLI; beyond it the stream is broken


def cli_command(options: ClaudeAgentOptions) -> list[str]:
    """The CLI's command line for ``options``, as the SDK builds it (the bundled CLI)."""
    builder = SubprocessCLITransport(prompt="", options=options)
    builder._cli_path = (options.cli_path and str(options.cli_path)) or builder._find_cli()
    return builder._build_command()


class ToolProcessTransport(Transport):
    """The SDK's transport over a tool process (module docstring).

    Args:
        options: the SDK options the command line is built from (with
            ``permission_prompt_tool_name="stdio"`` when a ``can_use_tool`` is set,
            as the SDK's own client sets it).
        processes: the daemon's tool processes (spawn, stop, watchdog).
        workspace: the CLI's working directory (the session's workspace).
        env: the variables it gets beyond the tool environment's three.
        grace_s: how long a closing CLI has to exit on its own before its group is stopped.
    """

    def __init__(
        self,
        options: ClaudeAgentOptions,
        processes: ToolProcesses,
        workspace: str,
        env: Mapping[str, str],
        grace_s: float = 2.0,
    ) -> None:
        self._options = options
        self._processes = processes
        self._workspace = workspace
        self._env = dict(env)
        self._grace_s = grace_s
        self.process: trio.Process | None = None
        self._write_lock = trio.Lock()
        self._ready = False
        self._stdin_closed = False

    @property
    def pid(self) -> int | None:
        """The CLI's pid, which is also its process group's id."""
        return self.process.pid if self.process is not None else None

    async def connect(self) -> None:
        if self.process is not None:
            return
        command = await trio.to_thread.run_sync(cli_command, self._options)
        try:
            self.process = await self._processes.spawn(
                command,
                workspace=self._workspace,
                env=self._env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
            )
        except OSError as exc:
            raise CLIConnectionError(f"cannot start Claude Code: {exc}") from exc
        self._ready = True

    async def write(self, data: str) -> None:
        async with self._write_lock:
            proc = self.process
            if proc is None or proc.stdin is None or not self._ready or self._stdin_closed:
                raise CLIConnectionError("the Claude Code process is not running")
            try:
                await proc.stdin.send_all(data.encode())
            except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                self._ready = False
                raise CLIConnectionError(f"the Claude Code process went away: {exc}") from exc

    def read_messages(self) -> AsyncIterator[dict[str, Any]]:
        proc = self.process
        if proc is None or proc.stdout is None:
            raise CLIConnectionError("not connected")
        return _Messages(self, proc)

    async def end_input(self) -> None:
        async with self._write_lock:
            proc = self.process
            if proc is not None and proc.stdin is not None and not self._stdin_closed:
                self._stdin_closed = True
                await proc.stdin.aclose()

    async def close(self) -> None:
        """End stdin, wait ``grace_s`` for the CLI to exit, then stop its group (shielded)."""
        proc = self.process
        self._ready = False
        if proc is None:
            return
        with trio.CancelScope(shield=True):
            if proc.stdin is not None and not self._stdin_closed:
                self._stdin_closed = True
                await proc.stdin.aclose()
            with trio.move_on_after(self._grace_s):
                await proc.wait()
            await self._processes.stop(proc, self._grace_s)

    def is_ready(self) -> bool:
        return self._ready


class _Messages:
    """The CLI's stdout, one JSON object a line, until it exits (its status checked).

    An iterator, not an async generator: the SDK's reader task may be cancelled
    before the stream ends, and an unfinished async generator is left for the
    garbage collector to finalize (a ``ResourceWarning``); this needs none.
    """

    def __init__(self, transport: ToolProcessTransport, proc: trio.Process) -> None:
        self._transport = transport
        self._proc = proc
        self._lines: collections.deque[dict[str, Any]] = collections.deque()
        self._pending = b""
        self._ended = False
        self._broken: CLIConnectionError | None = None  # raised once the lines before it are read

    def __aiter__(self) -> _Messages:
        return self

    async def __anext__(self) -> dict[str, Any]:
        while not self._lines:
            if self._broken is not None:
                raise self._broken
            if self._ended:
                raise StopAsyncIteration
            await self._receive()
        return self._lines.popleft()

    async def _receive(self) -> None:
        assert self._proc.stdout is not None
        try:
            chunk = await self._proc.stdout.receive_some(65536)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            chunk = b""
        if not chunk:
            self._ended = True
            self._transport._ready = False
            code = await self._proc.wait()
            if code != 0:
                raise ProcessError(f"Claude Code exited with status {code}", exit_code=code)
            return
        self._pending += chunk
        *lines, self._pending = self._pending.split(b"\n")
        self._lines.extend(data for data in map(_parse, lines) if data is not None)
        if len(self._pending) > _MAX_LINE:
            self._broken = CLIConnectionError("a line of the Claude Code process exceeded 16 MiB")


def _parse(line: bytes) -> dict[str, Any] | None:
    """One line of the CLI's stdout: a JSON object, or None for anything else (a debug line)."""
    line = line.strip()
    if not line.startswith(b"{"):
        return None
    try:
        data = json.loads(line)
    except json.JSONDecodeError:
        log.debug("a line of Claude Code that is not JSON: %r", line[:200])
        return None
    return data if isinstance(data, dict) else None

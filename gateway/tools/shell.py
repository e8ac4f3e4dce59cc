"""The ``shell`` tool (docs/reference.md "Built-in tools"), and how it stops (docs/protocol.md §8).

``shell`` runs whatever the model asks for, so it is opt-in: a gateway lists it
in ``[tools] enabled`` deliberately.

A call owns a whole process group. The command runs as ``/bin/sh -c`` in a new
session (``start_new_session=True``), so the shell and everything it starts
share one process group whose id is the shell's pid, and the call signals that
group, never a lone pid. However the call ends, nothing of it survives:

- the shell exits: whatever it left running in the background is SIGKILLed.
  The contract is silent here; a tool call that leaked processes would outlive
  its own turn, so the call owns its group until it returns.
- the timeout passes, or the turn is cancelled (``trio.Cancelled``): the group
  gets SIGTERM, the shell has ``ToolContext.kill_grace_s`` to exit, then the
  group gets SIGKILL (docs/protocol.md §8). The stop is shielded: a cancelled
  task may still wait for its child, briefly. A timeout then fails the call
  with ``timeout``; a cancellation propagates untouched, for the turn to emit
  ``tool.failed (cancelled)``.

A process that leaves the group (``setsid``) escapes all this, as it would
escape any supervisor that is not a container.

Output is read as it comes, stdout and stderr concurrently: the first
:data:`MAX_KEPT_BYTES` of each are kept, the rest read and dropped, so a chatty
command neither blocks on a full pipe nor fills the gateway's memory. A non-zero
exit code is a normal result: the model sees it and decides.

The command is a tool process (gateway.tools.process): its environment is
``PATH``, ``HOME`` (the workspace), ``LANG`` and ``[tools] env``, never the
gateway's, which holds provider API keys a model-written command has no
business reading; ``[tools]`` rlimits apply; the watchdog kills it if the
daemon dies. Its working directory is the session's workspace, checked when the
call starts (gateway.tools.workspace). Nothing more confines it: it runs as the
daemon's user and can read whatever that user can (``cat /etc/passwd``), which
is why it is opt-in.
"""

from __future__ import annotations

import subprocess
from typing import Annotated

import msgspec
import trio

from gateway.errors import ToolError
from gateway.tools.process import ToolProcesses
from gateway.tools.registry import FunctionTool, ToolContext, ToolOutput
from gateway.tools.workspace import Workspaces

DEFAULT_TIMEOUT_S = 300.0
"""The timeout of a call that gives no ``timeout_s``."""

MAX_TIMEOUT_S = 3600.0
"""The largest ``timeout_s`` a call may ask for."""

MAX_KEPT_BYTES = 64 * 1024
"""How much of each of stdout and stderr a result keeps."""

MAX_TIMEOUT_REPORT_CHARS = 4096
"""A timeout's message carries the partial output only if it is at most this long."""


class ShellInput(msgspec.Struct, forbid_unknown_fields=True):
    command: str
    timeout_s: Annotated[float, msgspec.Meta(gt=0, le=MAX_TIMEOUT_S)] | None = None


class _Capture:
    """The head of one output stream: the first :data:`MAX_KEPT_BYTES` kept, the rest counted."""

    def __init__(self) -> None:
        self._kept = bytearray()
        self.dropped = 0

    async def drain(self, stream: trio.abc.ReceiveStream) -> None:
        async for chunk in stream:
            room = MAX_KEPT_BYTES - len(self._kept)
            self._kept += chunk[:room]
            self.dropped += max(0, len(chunk) - room)

    def text(self) -> str:
        text = self._kept.decode("utf-8", errors="replace")
        if self.dropped:
            text += f"\n[truncated: {self.dropped} more bytes]"
        return text


async def _shell(
    processes: ToolProcesses, workspaces: Workspaces, args: ShellInput, ctx: ToolContext
) -> ToolOutput:
    timeout_s = DEFAULT_TIMEOUT_S if args.timeout_s is None else args.timeout_s
    stdout, stderr = _Capture(), _Capture()
    workspace = await trio.to_thread.run_sync(workspaces.host_path, ctx.workspace_path)
    proc = await processes.spawn(
        ["/bin/sh", "-c", args.command],
        workspace=workspace,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    # No checkpoint lies between the spawn and the ``try``: a cancellation
    # cannot slip in before the ``finally`` that stops the group is armed.
    async with proc.stdout, proc.stderr, trio.open_nursery() as nursery:
        nursery.start_soon(stdout.drain, proc.stdout)
        nursery.start_soon(stderr.drain, proc.stderr)
        try:
            with trio.move_on_after(timeout_s) as deadline:
                await proc.wait()
        finally:
            with trio.CancelScope(shield=True):
                await processes.stop(proc, ctx.kill_grace_s)
        # The group is dead, so the pipes reach end-of-file at once, unless a
        # process that left the group still holds them: wait no longer than the grace.
        nursery.cancel_scope.deadline = trio.current_time() + ctx.kill_grace_s
    if deadline.cancelled_caught:
        raise ToolError("timeout", _timeout_message(timeout_s, stdout.text(), stderr.text()))
    exit_code = proc.returncode
    assert exit_code is not None  # stop() reaped the shell
    return _result(exit_code, stdout, stderr)


def _sections(stdout: str, stderr: str) -> str:
    return f"--- stdout ---\n{stdout}\n--- stderr ---\n{stderr}"


def _result(exit_code: int, stdout: _Capture, stderr: _Capture) -> ToolOutput:
    out, err = stdout.text(), stderr.text()
    return ToolOutput(
        content=f"exit code {exit_code}\n{_sections(out, err)}",
        structured={
            "exit_code": exit_code,
            "stdout": out,
            "stderr": err,
            "truncated": bool(stdout.dropped or stderr.dropped),
        },
    )


def _timeout_message(timeout_s: float, stdout: str, stderr: str) -> str:
    message = f"command timed out after {timeout_s:g} s"
    if not stdout and not stderr:
        return message
    if len(stdout) + len(stderr) > MAX_TIMEOUT_REPORT_CHARS:
        return f"{message} (partial output omitted: too long)"
    return f"{message}\n{_sections(stdout, stderr)}"


def shell_tool(processes: ToolProcesses, workspaces: Workspaces) -> FunctionTool[ShellInput]:
    """The ``shell`` tool of a daemon, with its tool processes and workspace rules."""

    async def shell(args: ShellInput, ctx: ToolContext) -> ToolOutput:
        return await _shell(processes, workspaces, args, ctx)

    return FunctionTool(
        "shell",
        "Run a command with /bin/sh -c in the session's workspace and return its exit code, "
        f"stdout and stderr (each cut at {MAX_KEPT_BYTES // 1024} KiB). stdin is empty. "
        f"timeout_s defaults to {DEFAULT_TIMEOUT_S:g} s, at most {MAX_TIMEOUT_S:g} s. "
        "Background processes are killed when the command exits.",
        ShellInput,
        shell,
    )

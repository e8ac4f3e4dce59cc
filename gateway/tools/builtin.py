"""The registry of built-in tools (docs/reference.md "Built-in tools").

``sleep`` and ``read_file`` live here; ``shell`` (opt-in) in
:mod:`gateway.tools.shell`; ``delegate`` in :mod:`gateway.tools.delegate`.
``build_registry`` takes the names that ``[tools] enabled`` lists, and the
daemon's workspace rules and tool processes (docs/protocol.md §15), which the
file and process tools are made with.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable
from typing import Annotated, Any

import msgspec
import trio

from gateway.config import SessionsConfig
from gateway.tools.delegate import DELEGATE
from gateway.tools.process import ToolProcesses
from gateway.tools.registry import FunctionTool, ToolContext, ToolOutput, ToolRegistry
from gateway.tools.shell import shell_tool
from gateway.tools.workspace import Workspaces, open_file_beneath


class SleepInput(msgspec.Struct, forbid_unknown_fields=True):
    seconds: Annotated[float, msgspec.Meta(ge=0, le=86_400)]


async def _sleep(args: SleepInput, ctx: ToolContext) -> ToolOutput:
    await trio.sleep(args.seconds)
    return ToolOutput(f"slept {args.seconds:g} s")


class ReadFileInput(msgspec.Struct, forbid_unknown_fields=True):
    path: str


MAX_READ_BYTES = 1_048_576


def _read_limited(workspaces: Workspaces, workspace: str, path: str) -> str:
    """Read ``path`` inside the recorded workspace, both opened now by descriptor. Blocking.

    (gateway.tools.workspace: no absolute path, no ``..``, no symlink; the
    check is the open itself, so nothing swapped in meanwhile gets through.)
    """
    dir_fd = workspaces.open_dir(workspace)
    try:
        fd = open_file_beneath(dir_fd, path)
    finally:
        os.close(dir_fd)
    with os.fdopen(fd, "rb") as f:
        data = f.read(MAX_READ_BYTES + 1)
    text = data[:MAX_READ_BYTES].decode("utf-8", errors="replace")
    if len(data) > MAX_READ_BYTES:
        text += f"\n[truncated at {MAX_READ_BYTES} bytes]"
    return text


def read_file_tool(workspaces: Workspaces) -> FunctionTool[ReadFileInput]:
    """The ``read_file`` tool of a daemon whose workspaces follow ``workspaces``."""

    async def read_file(args: ReadFileInput, ctx: ToolContext) -> ToolOutput:
        read = functools.partial(_read_limited, workspaces, ctx.workspace_path, args.path)
        return ToolOutput(await trio.to_thread.run_sync(read))

    return FunctionTool(
        "read_file",
        "Read a UTF-8 text file inside the session's workspace (a relative path; "
        "symbolic links are not followed).",
        ReadFileInput,
        read_file,
    )


SLEEP = FunctionTool("sleep", "Wait for the given number of seconds.", SleepInput, _sleep)


def build_registry(
    enabled: Iterable[str],
    extra: dict[str, Any] | None = None,
    *,
    workspaces: Workspaces | None = None,
    processes: ToolProcesses | None = None,
) -> ToolRegistry:
    """A registry of the enabled tools among the built-in ones (and ``extra``).

    Args:
        workspaces: the daemon's workspace rules (default: ``[sessions]``'s defaults).
        processes: the daemon's tool processes (default: ``[tools]``'s defaults,
            with no watchdog until its ``run`` is started).
    """
    workspaces = workspaces or Workspaces.from_config(SessionsConfig())
    processes = processes or ToolProcesses()
    builtin: dict[str, Any] = {
        "sleep": SLEEP,
        "read_file": read_file_tool(workspaces),
        "delegate": DELEGATE,
        "shell": shell_tool(processes, workspaces),
    }
    available = {**builtin, **(extra or {})}
    return ToolRegistry(available[name] for name in enabled if name in available)

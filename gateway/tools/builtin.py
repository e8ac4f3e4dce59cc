"""The registry of built-in tools (RUNNING.md "Built-in tools").

``sleep`` and ``read_file`` live here; ``shell`` (opt-in) in
:mod:`gateway.tools.shell`; ``delegate`` in :mod:`gateway.tools.delegate`.
``build_registry`` takes the names that ``[tools] enabled`` lists.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Annotated, Any

import msgspec
import trio

from gateway.errors import ToolError
from gateway.tools.delegate import DELEGATE
from gateway.tools.registry import FunctionTool, ToolContext, ToolOutput, ToolRegistry
from gateway.tools.shell import SHELL


class SleepInput(msgspec.Struct, forbid_unknown_fields=True):
    seconds: Annotated[float, msgspec.Meta(ge=0, le=86_400)]


async def _sleep(args: SleepInput, ctx: ToolContext) -> ToolOutput:
    await trio.sleep(args.seconds)
    return ToolOutput(f"slept {args.seconds:g} s")


class ReadFileInput(msgspec.Struct, forbid_unknown_fields=True):
    path: str


MAX_READ_BYTES = 1_048_576


def resolve_in_workspace(workspace: str, path: str) -> str:
    """The real path of ``path`` inside ``workspace``, refusing anything that leaves it.

    Both sides are resolved with ``os.path.realpath``, so ``..`` and symlinks
    that point outside are caught alike.

    Raises:
        ToolError: ``invalid_input`` naming the path.
    """
    root = os.path.realpath(workspace)
    target = os.path.realpath(os.path.join(root, path))
    if os.path.commonpath([root, target]) != root:
        raise ToolError("invalid_input", f"path {path!r} is outside the workspace")
    return target


def _read_limited(target: str) -> str:
    with open(target, "rb") as f:
        data = f.read(MAX_READ_BYTES + 1)
    text = data[:MAX_READ_BYTES].decode("utf-8", errors="replace")
    if len(data) > MAX_READ_BYTES:
        text += f"\n[truncated at {MAX_READ_BYTES} bytes]"
    return text


async def _read_file(args: ReadFileInput, ctx: ToolContext) -> ToolOutput:
    target = resolve_in_workspace(ctx.workspace_path, args.path)
    try:
        text = await trio.to_thread.run_sync(_read_limited, target)
    except FileNotFoundError:
        raise ToolError("error", f"no such file: {args.path}") from None
    except IsADirectoryError:
        raise ToolError("error", f"is a directory: {args.path}") from None
    return ToolOutput(text)


SLEEP = FunctionTool("sleep", "Wait for the given number of seconds.", SleepInput, _sleep)
READ_FILE = FunctionTool(
    "read_file", "Read a UTF-8 text file inside the session's workspace.", ReadFileInput, _read_file
)


BUILTIN: dict[str, Any] = {
    "sleep": SLEEP,
    "read_file": READ_FILE,
    "delegate": DELEGATE,
    "shell": SHELL,
}


def build_registry(enabled: Iterable[str], extra: dict[str, Any] | None = None) -> ToolRegistry:
    """A registry of the enabled tools among the built-in ones (and ``extra``)."""
    available = {**BUILTIN, **(extra or {})}
    return ToolRegistry(available[name] for name in enabled if name in available)

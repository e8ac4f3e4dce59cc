"""The workspace holds for Claude Code's own tools (docs/protocol.md §11, "The boundary").

Two layers, because Claude Code runs its tools itself:

- **The file tools** (:data:`PATH_ARGS`: ``Read``, ``Write``, ``Edit``,
  ``MultiEdit``, ``NotebookEdit``, ``NotebookRead``, ``Grep``, ``Glob``,
  ``LS``) are decided by a ``PreToolUse`` hook (:func:`path_hook`), which
  Claude Code runs for every use of them, sub-agents' included, before any
  permission rule or ``can_use_tool``: a path outside the session's
  workspace is denied there (``permission_denied``, no request to the
  client, whatever ``allowed_tools`` or ``permission_mode`` say). The
  decision (:func:`refusal`) takes each path argument relative to the tool's
  working directory, then resolves it as the file system will at use
  (symlinks followed, ``..`` taken after them: :func:`os.path.realpath`),
  and the result must be the workspace or below it (itself resolved). ``~``
  is refused (Claude Code's ``HOME`` is the state directory). ``Grep`` and
  ``Glob`` with no ``path`` search the working directory; a ``Glob``
  ``pattern`` or ``Grep`` ``glob`` with a ``..`` segment or a leading ``~`` is
  refused, and an absolute one is checked by its part before the first
  wildcard. A path or pattern with white space at either end is refused
  (Claude Code trims it before use, so it is not the path checked). Known
  gap: the check runs just before Claude Code opens the file, not at the
  open itself, so a symlink swapped in between (by a
  background command of the same session) is followed.
- **File mentions** (``@path`` in a prompt), which Claude Code would read
  itself with no tool use, are off: ``CLAUDE_CODE_DISABLE_FILE_MENTIONS``
  (:func:`~gateway.runtimes.claude_code.options.cli_environment`).
- **Other sessions.** The same hook refuses a ``SendMessage`` whose ``to`` is
  an address (:data:`PEER_ARGS`: ``uds:<socket>``, ``bridge:<id>``, a path):
  Claude Code delivers it to that CLI, another session's, which answers it
  as a prompt with its own tools. Its own sub-agents and teammates, named,
  stay reachable.
- **Bash** runs in Claude Code's sandbox (``[agents.NAME] sandbox``,
  default on; :func:`sandbox_settings`): bubblewrap on Linux, its own PID
  namespace and no network, the root file system read-only; writable only
  the workspace (and the CLI's own temporary directory, private to the
  session: ``TMPDIR``); unreadable the workspace root (every other
  workspace, ``.claude-code`` and its transcripts), ``[sessions]
  allowed_workspaces``, the store's files, ``[auth] api_keys_file`` and the
  config file, except this session's workspace and state directory.
  ``dangerouslyDisableSandbox`` is refused, and ``require_approval`` still
  asks (``autoAllowBashIfSandboxed`` is off). Claude Code needs ``bwrap``
  and ``socat`` for it (:func:`sandbox_missing`); without them every
  ``Bash`` fails.

Everything here is sans-IO but :func:`path_hook` (which resolves in a thread)
and :func:`sandbox_missing`.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable, Iterable, Mapping
from typing import Any, cast

import trio
from claude_agent_sdk.types import (
    HookCallback,
    HookContext,
    HookInput,
    HookJSONOutput,
    HookMatcher,
    SandboxSettings,
)

PATH_ARGS: Mapping[str, tuple[str, ...]] = {
    "Read": ("file_path",),
    "Write": ("file_path",),
    "Edit": ("file_path",),
    "MultiEdit": ("file_path",),
    "NotebookEdit": ("notebook_path",),
    "NotebookRead": ("notebook_path",),
    "Grep": ("path",),
    "Glob": ("path",),
    "LS": ("path",),
}
"""Claude Code's tools that take paths, and their path arguments."""

PEER_ARGS: Mapping[str, str] = {"SendMessage": "to"}
"""Claude Code's tools that may reach another Claude Code session, and the argument
naming where: an address there (``uds:<socket>``, ``bridge:<id>``, a path) is refused."""

SEARCHES_CWD = frozenset({"Grep", "Glob"})
"""The tools that search the working directory when given no ``path``."""

PATTERN_ARGS: Mapping[str, str] = {"Glob": "pattern", "Grep": "glob"}
"""The glob arguments of the search tools."""

_WILDCARDS = frozenset("*?[{")
_ADDRESS = re.compile(r"\s*([A-Za-z][A-Za-z0-9+.-]*:|.*[/\\]|.*\.sock\s*$)")

Resolve = Callable[[str], str]


def inside(path: str, directory: str) -> bool:
    """Whether ``path`` is ``directory`` or below it (both absolute and normalized)."""
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def _padded(value: str) -> bool:
    """White space at either end: Claude Code trims a path (JavaScript's ``trim``, the
    byte-order mark included) before it uses it, so ``" /etc"`` checked as a name in the
    working directory would be used as ``/etc``."""
    return any(ch.isspace() or ch == "\ufeff" for ch in (value[0], value[-1]))


def candidates(tool_name: str, tool_input: Mapping[str, Any], cwd: str) -> list[str] | str:
    """The paths a tool use reaches (joined to ``cwd``, not resolved), or why it is refused.

    Only the tools of :data:`PATH_ARGS` have any; another tool's list is empty.
    """
    out: list[str] = []
    base = cwd
    for arg in PATH_ARGS.get(tool_name, ()):
        value = tool_input.get(arg)
        if value is None or value == "":
            continue
        if not isinstance(value, str):
            return f"{arg} is not a string"
        if "\0" in value:
            return f"{arg} contains a NUL character"
        if _padded(value):
            return f"{arg} {value!r} starts or ends with white space"
        if value.startswith("~"):
            return f"{arg} {value!r} is outside the session's workspace"
        base = os.path.join(cwd, value)
        out.append(base)
    if tool_name in SEARCHES_CWD and not out:
        out.append(cwd)
    pattern = tool_input.get(PATTERN_ARGS.get(tool_name, ""))
    if isinstance(pattern, str) and pattern:
        if _padded(pattern):
            return f"pattern {pattern!r} starts or ends with white space"
        if pattern.startswith("~") or "\0" in pattern or ".." in pattern.split("/"):
            return f"pattern {pattern!r} leads outside the session's workspace"
        literal: list[str] = []
        for segment in pattern.split("/"):
            if _WILDCARDS.intersection(segment):
                break
            literal.append(segment)
        if pattern.startswith("/"):
            out.append("/" + "/".join(s for s in literal if s))
        elif literal:
            out.append(os.path.join(base, *literal))
    return out


def refusal(
    tool_name: str,
    tool_input: Mapping[str, Any],
    cwd: str,
    workspace: str,
    resolve: Resolve = os.path.realpath,
) -> str | None:
    """Why a tool use is refused (a path outside ``workspace``, another session), or None
    (module docstring).

    ``resolve`` is how a path is resolved at use (:func:`os.path.realpath`:
    blocking; a test gives its own).
    """
    peer = tool_input.get(PEER_ARGS.get(tool_name, ""))
    if isinstance(peer, str) and _ADDRESS.match(peer):
        return f"{peer!r} is another session: a session's Claude Code reaches no other"
    found = candidates(tool_name, tool_input, cwd)
    if isinstance(found, str):
        return found
    if not found:
        return None
    root = resolve(workspace)
    for path in found:
        if not inside(resolve(path), root):
            return f"{path!r} is outside the session's workspace"
    return None


def path_hook(workspace: str, on_refused: Callable[[str], None]) -> HookMatcher:
    """The ``PreToolUse`` hook of the file tools: a use outside ``workspace`` is denied.

    ``on_refused`` is told the tool use's id first (its ``tool.failed`` is then
    ``permission_denied``). A hook that fails blocks the tool (``on_failure``).
    """

    async def hook(
        data: HookInput, tool_use_id: str | None, context: HookContext
    ) -> HookJSONOutput:
        if data["hook_event_name"] != "PreToolUse":
            return {}
        name, tool_input = data["tool_name"], data["tool_input"]
        cwd = data.get("cwd") or workspace
        why = await trio.to_thread.run_sync(refusal, name, tool_input, cwd, workspace)
        if why is None:
            return {}
        on_refused(data.get("tool_use_id") or tool_use_id or "")
        return {
            "hookSpecificOutput": {
                "hookEventName": "PreToolUse",
                "permissionDecision": "deny",
                "permissionDecisionReason": f"{name} refused: {why}",
            }
        }

    callback: HookCallback = hook
    matcher = "|".join([*PATH_ARGS, *PEER_ARGS])
    return HookMatcher(matcher=matcher, hooks=[callback], on_failure="block")


def sandbox_settings(
    workspace: str,
    own: Iterable[str],
    denied: Iterable[str],
    resolve: Resolve = os.path.realpath,
) -> SandboxSettings:
    """Claude Code's ``sandbox`` settings for a session's ``Bash`` (module docstring).

    ``denied``: what no command may read (:func:`denied_reads`), but for the
    session's ``workspace`` and ``own`` directories (its state directory and
    ``TMPDIR``), which stay readable; the workspace is writable.
    """
    own = [resolve(workspace), *(resolve(p) for p in own)]
    settings: dict[str, Any] = {
        "enabled": True,
        "autoAllowBashIfSandboxed": False,
        "allowUnsandboxedCommands": False,
        "filesystem": {
            "denyRead": sorted({resolve(p) for p in denied}),
            "allowRead": own,
            "allowWrite": [own[0]],
        },
    }
    return cast(SandboxSettings, settings)  # ``filesystem`` is the CLI's, not in the SDK's type


def denied_reads(
    workspace_root: str,
    allowed_workspaces: Iterable[str],
    store_path: str | None,
    secrets: Iterable[str],
) -> list[str]:
    """What a sandboxed command may not read: every workspace and state, the store, secrets.

    ``store_path``: the SQLite file (with its ``-wal``, ``-shm`` and
    ``-journal``), None on Redis; ``secrets``: the config file and ``[auth]
    api_keys_file`` (empty ones skipped).
    """
    out = [os.path.abspath(workspace_root), *(os.path.abspath(p) for p in allowed_workspaces)]
    if store_path:
        db = os.path.abspath(store_path)
        out += [db, f"{db}-wal", f"{db}-shm", f"{db}-journal"]
    out += [os.path.abspath(p) for p in secrets if p]
    return out


def sandbox_missing() -> list[str]:
    """The programs Claude Code's sandbox needs that are not on ``PATH`` (blocking)."""
    return [name for name in ("bwrap", "socat") if shutil.which(name) is None]

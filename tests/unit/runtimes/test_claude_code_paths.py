"""The workspace's boundary for Claude Code's file tools, sans-IO (docs/protocol.md §11).

:func:`gateway.runtimes.claude_code.boundary.refusal` with a resolver of its
own (a map of symlinks, ``..`` taken after them as the kernel does), then
once with the real file system. Needs the claude-code extra (the SDK's types).
"""

from __future__ import annotations

import os
import posixpath
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("claude_agent_sdk", reason="needs the claude-code extra")

from gateway.runtimes.claude_code.boundary import (
    candidates,
    denied_reads,
    refusal,
    sandbox_settings,
)

WS = "/srv/ws/local/proj"
LINKS = {
    f"{WS}/out": "/etc",  # a symlink out of the workspace
    f"{WS}/in": f"{WS}/src",  # one that stays inside
    f"{WS}/up": "..",  # a relative one, to the tenant's directory
}


def resolve(path: str) -> str:
    """Resolve ``path`` component by component through :data:`LINKS` (a fake realpath)."""
    out = "/"
    parts = [p for p in path.split("/") if p]
    while parts:
        part = parts.pop(0)
        if part == ".":
            continue
        if part == "..":
            out = posixpath.dirname(out)
            continue
        candidate = posixpath.join(out, part)
        target = LINKS.get(candidate)
        if target is None:
            out = candidate
            continue
        parts = [p for p in target.split("/") if p] + parts
        if target.startswith("/"):
            out = "/"
    return out


def decide(tool: str, cwd: str = WS, **tool_input: Any) -> str | None:
    return refusal(tool, tool_input, cwd, WS, resolve)


@pytest.mark.parametrize(
    ("tool", "args"),
    [
        ("Read", {"file_path": "notes.txt"}),
        ("Read", {"file_path": f"{WS}/notes.txt"}),
        ("Read", {"file_path": "src/../notes.txt"}),
        ("Read", {"file_path": "in/main.py"}),  # a symlink that stays inside
        ("Write", {"file_path": "new/dir/file.txt"}),  # not there yet
        ("Edit", {"file_path": "./a.py"}),
        ("MultiEdit", {"file_path": "a.py"}),
        ("NotebookEdit", {"notebook_path": "nb.ipynb"}),
        ("Grep", {"pattern": "TODO"}),  # no path: the working directory
        ("Grep", {"pattern": "TODO", "path": "src", "glob": "*.py"}),
        ("Glob", {"pattern": "**/*.py"}),
        ("Glob", {"pattern": f"{WS}/src/**/*.py"}),
        ("Glob", {"pattern": "*.md", "path": "in"}),
        ("LS", {"path": WS}),
        ("Bash", {"command": "cat /etc/passwd"}),  # not a file tool: the sandbox's
        ("mcp__x__read", {"file_path": "/etc/passwd"}),
    ],
)
def test_paths_inside_the_workspace_pass(tool: str, args: dict[str, Any]) -> None:
    assert decide(tool, **args) is None


@pytest.mark.parametrize(
    ("tool", "args"),
    [
        ("Read", {"file_path": "/etc/passwd"}),  # absolute
        ("Read", {"file_path": "../other/secret.txt"}),  # ..
        ("Read", {"file_path": "src/../../other/x"}),
        ("Read", {"file_path": "out/passwd"}),  # a symlink out
        ("Read", {"file_path": "up/other/x"}),  # a relative symlink out
        ("Read", {"file_path": "in/../../other"}),  # .. after a symlink: the kernel's order
        ("Read", {"file_path": "~/.claude/settings.json"}),
        ("Read", {"file_path": "a\0b"}),
        ("Write", {"file_path": "/tmp/x"}),
        ("Edit", {"file_path": f"{WS}/../proj2/a.py"}),
        ("MultiEdit", {"file_path": "out/hosts"}),
        ("NotebookEdit", {"notebook_path": "/srv/ws/local/other/nb.ipynb"}),
        ("NotebookEdit", {"notebook_path": "../nb.ipynb"}),
        ("Grep", {"pattern": "x", "path": "/"}),
        ("Grep", {"pattern": "x", "path": "out"}),
        ("Grep", {"pattern": "x", "glob": "../**/*.py"}),
        ("Glob", {"pattern": "/etc/*"}),
        ("Glob", {"pattern": "../*/secret*"}),
        ("Glob", {"pattern": "src/**/../../../*"}),
        ("Glob", {"pattern": "~/*"}),
        ("Glob", {"pattern": "*.txt", "path": "/srv"}),
        ("Glob", {"pattern": "out/*"}),
        ("LS", {"path": ".."}),
        ("Read", {"file_path": 42}),
        # Claude Code trims a path before use: " /etc" would be checked as a name here
        ("Grep", {"pattern": "x", "path": " /etc"}),
        ("Glob", {"pattern": "*", "path": "\n/etc"}),
        ("Glob", {"pattern": "*", "path": "\ufeff/etc"}),
        ("Grep", {"pattern": "x", "path": "/etc "}),
        ("LS", {"path": "\t/"}),
        ("Read", {"file_path": " notes.txt"}),
        ("Glob", {"pattern": " /etc/*"}),
    ],
)
def test_paths_outside_the_workspace_are_refused(tool: str, args: dict[str, Any]) -> None:
    assert decide(tool, **args) is not None


@pytest.mark.parametrize(
    ("to", "refused"),
    [
        ("main", False),  # its own main thread, a sub-agent, a teammate: by name
        ("a1b2c3d4", False),
        ("uds:/tmp/gateway-cc-0/0123456789abcdef/cc-socks/42.sock", True),  # another CLI
        ("bridge:session_01abc", True),
        ("UDS:/x.sock", True),
        (" uds:/x.sock", True),
        ("/tmp/gateway-cc-0/0123456789abcdef/cc-socks/42.sock", True),
        ("../42.sock", True),
        ("42.sock", True),
    ],
)
def test_send_message_reaches_no_other_session(to: str, refused: bool) -> None:
    assert (decide("SendMessage", to=to, message="hi") is not None) is refused


def test_the_working_directory_is_where_relative_paths_and_bare_searches_start() -> None:
    # Claude Code's cwd moved out (a Bash cd): a relative path, a bare search follow it.
    assert decide("Read", cwd="/srv/ws/local", file_path="proj/a.py") is None
    assert decide("Read", cwd="/srv/ws/local", file_path="other/a.py") is not None
    assert decide("Grep", cwd="/srv", pattern="x") is not None
    assert decide("Glob", cwd="/srv", pattern="*") is not None
    assert decide("Read", cwd="/srv", file_path=f"{WS}/a.py") is None


def test_candidates_name_each_path_a_tool_reaches() -> None:
    assert candidates("Read", {"file_path": "a"}, WS) == [f"{WS}/a"]
    assert candidates("Grep", {"pattern": "x"}, WS) == [WS]
    assert candidates("Glob", {"pattern": "src/*/x.py", "path": "p"}, WS) == [
        f"{WS}/p",
        f"{WS}/p/src",
    ]
    assert candidates("Glob", {"pattern": "/abs/dir/*.py"}, WS) == [WS, "/abs/dir"]
    assert candidates("Bash", {"command": "ls"}, WS) == []
    assert isinstance(candidates("Glob", {"pattern": "a/../b"}, WS), str)


def test_with_the_real_file_system(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / "src").mkdir(parents=True)
    (tmp_path / "secret.txt").write_text("no")
    os.symlink(tmp_path / "secret.txt", ws / "link")
    os.symlink(ws / "src", ws / "inner")
    os.symlink("../secret.txt", ws / "rel")
    real = str(ws)
    assert refusal("Read", {"file_path": "link"}, real, real) is not None
    assert refusal("Read", {"file_path": "rel"}, real, real) is not None
    assert refusal("Read", {"file_path": "inner/x.py"}, real, real) is None
    assert refusal("Write", {"file_path": "new.txt"}, real, real) is None
    assert refusal("Read", {"file_path": str(tmp_path / "secret.txt")}, real, real) is not None


def test_the_sandbox_denies_reading_every_workspace_and_secret_but_its_own() -> None:
    denied = denied_reads(
        "/srv/ws", ["/data/shared"], "/var/lib/gw/gateway.db", ["/etc/gw.toml", ""]
    )
    assert denied == [
        "/srv/ws",
        "/data/shared",
        "/var/lib/gw/gateway.db",
        "/var/lib/gw/gateway.db-wal",
        "/var/lib/gw/gateway.db-shm",
        "/var/lib/gw/gateway.db-journal",
        "/etc/gw.toml",
    ]
    settings: Any = sandbox_settings(WS, ["/srv/ws/.claude-code/s1"], denied, resolve=str)
    assert settings["enabled"] and not settings["autoAllowBashIfSandboxed"]
    assert settings["allowUnsandboxedCommands"] is False
    assert settings["filesystem"]["allowRead"] == [WS, "/srv/ws/.claude-code/s1"]
    assert settings["filesystem"]["allowWrite"] == [WS]
    assert "/srv/ws" in settings["filesystem"]["denyRead"]

"""Where a session's Claude Code CLI keeps its state (docs/protocol.md §11), without the SDK.

**The state directory.** The CLI's ``HOME`` and ``CLAUDE_CONFIG_DIR`` are
``.claude-code/<session id>`` beside ``[sessions] workspace_root``
(:func:`state_dir`: its transcripts live there), never the operator's
``~/.claude``. The Claude Code session id is derived from the gateway
session's (:func:`claude_session_id`), so whenever a CLI starts again (after
an idle stop, a crash, a restart of the daemon, on another node sharing the
directory) it resumes the transcript it finds there, but only its own
session's: a new session never resumes what a deleted one of the same id
left (:func:`own_state`). Deleting a session removes its
state directory with its workspace (:func:`remove_state`, gateway.node.deletion).

**The temporary directory.** Each CLI's ``TMPDIR`` is its own directory
under :func:`tmp_root` (short: Claude Code binds Unix sockets there, whose
paths must stay under 108 bytes), which the daemon makes private before it
uses it (:func:`private_dir`: its own, no symlink, closed to others): a name
another local user could have made first is refused, never used. Beside the
``TMPDIR`` s, not in one (a sandboxed ``Bash`` reads its own), is each CLI's
MCP configuration (:func:`write_mcp_config`): on the command line, its
servers' ``env`` and ``headers`` would be in ``/proc/<pid>/cmdline``, which
every user of the host may read. Both are removed when the CLI ends
(:func:`remove_tmp`).

No import of the Claude Agent SDK here: the node deletes the state of
sessions whether or not the claude-code extra is installed.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import shutil
import stat
import tempfile
import uuid
from collections.abc import Mapping
from typing import Any

_NAMESPACE = uuid.UUID("5b0c6a8e-3f1d-4a57-9c2e-7d4b1e0f9a63")  # of claude_session_id


def state_dir(workspace_root: str, session_id: str) -> str:
    """The CLI's ``HOME`` and ``CLAUDE_CONFIG_DIR`` of a session (module docstring).

    Under the workspace root (``.claude-code`` is no tenant's name: tenants are
    ``local`` and key ids), so the one directory an operator shares between
    nodes carries both the workspaces and the CLI's transcripts.
    """
    return os.path.join(os.path.abspath(workspace_root), ".claude-code", session_id)


def claude_session_id(session_id: str) -> str:
    """The Claude Code session id of a gateway session: a UUID derived from its id.

    Derived, not stored: every start of the session's CLI (after an idle stop,
    a crash, a restart of the daemon) finds the same transcript by it.
    """
    return str(uuid.uuid5(_NAMESPACE, session_id))


def has_transcript(home: str, claude_id: str) -> bool:
    """Whether the CLI wrote a transcript of ``claude_id`` under ``home`` (blocking)."""
    return transcript_path(home, claude_id) is not None


def transcript_path(home: str, claude_id: str) -> str | None:
    """The transcript of ``claude_id`` under ``home``, in any project; ``None``: none (blocking)."""
    projects = os.path.join(home, ".claude", "projects")
    found = glob.glob(os.path.join(glob.escape(projects), "*", f"{claude_id}.jsonl"))
    return found[0] if found else None


def tmp_root() -> str:
    """Where the CLIs' ``TMPDIR`` s are: ``<the system's>/gateway-cc-<uid>`` (short: Claude
    Code binds Unix sockets in it, whose paths must stay under 108 bytes)."""
    return os.path.join(tempfile.gettempdir(), f"gateway-cc-{os.getuid()}")


def tmp_dir(session_id: str) -> str:
    """A session's CLI's ``TMPDIR`` (:func:`tmp_root`): its own, which no other CLI shares."""
    return os.path.join(tmp_root(), uuid.uuid5(_NAMESPACE, session_id).hex[:16])


def mcp_config(session_id: str) -> str:
    """Where a session's CLI reads its MCP servers from (module docstring): in
    :func:`tmp_root`, which a sandboxed ``Bash`` may not read, outside its ``TMPDIR``."""
    return os.path.join(tmp_root(), f"mcp-{uuid.uuid5(_NAMESPACE, session_id).hex[:16]}.json")


def write_mcp_config(session_id: str, servers: Mapping[str, Any]) -> str:
    """Write the CLI's ``--mcp-config`` to :func:`mcp_config` (mode 0600); its path.

    Blocking; :func:`tmp_root` is made private first (:func:`private_dir`).
    """
    path = mcp_config(session_id)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with open(fd, "w") as f:
        json.dump({"mcpServers": dict(servers)}, f)
    return path


def remove_tmp(session_id: str) -> None:
    """Remove the ``TMPDIR`` and the MCP configuration of a CLI that ended. Blocking."""
    shutil.rmtree(tmp_dir(session_id), ignore_errors=True)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(mcp_config(session_id))


CREATED = ".created_at"
"""The file of a state directory that says which session made it: its ``created_at``."""


def own_state(home: str, created_at: int) -> None:
    """Make the state directory of the session created at ``created_at`` (mode 0700).

    One another session of the same id left (deleted, then its id named again:
    docs/protocol.md §14) is removed first: a new session never resumes an old
    one's transcript. A directory with no :data:`CREATED` file is kept, and
    marked (made before this check existed). Blocking.
    """
    marker = os.path.join(home, CREATED)
    try:
        with open(marker) as f:
            mine = f.read().strip() == str(created_at)
    except FileNotFoundError:
        mine = True
    if not mine:
        shutil.rmtree(home, ignore_errors=True)
    os.makedirs(home, mode=0o700, exist_ok=True)
    if not os.path.exists(marker):
        with open(marker, "w") as f:
            f.write(str(created_at))


def remove_state(workspace_root: str, session_id: str) -> None:
    """Remove a deleted session's state directory (its transcripts). Blocking."""
    shutil.rmtree(state_dir(workspace_root, session_id), ignore_errors=True)


class UnsafeDirectory(OSError):
    """A directory the daemon would use is not its own and private."""


def private_dir(path: str) -> None:
    """Make ``path`` (mode 0700) if missing; refuse one that is not the daemon's own.

    One of its own that others may enter (made by an earlier version, as a
    parent directory, with the umask's mode) is closed to them (0700).

    Raises:
        UnsafeDirectory: ``path`` is a symlink, not a directory, or another
            user's (another local user made it first).
    """
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode):
        raise UnsafeDirectory(f"{path} is not a directory (a symlink?): not used")
    if info.st_uid != os.getuid():
        raise UnsafeDirectory(f"{path} belongs to uid {info.st_uid}, not this daemon's: not used")
    if info.st_mode & 0o077:
        os.chmod(path, 0o700)

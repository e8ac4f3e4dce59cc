"""Workspaces: the directory a session works in, and the only one its built-in tools reach.

docs/protocol.md §15 "Workspaces": a client never picks a directory of the host.

Layout. ``[sessions] workspace_root`` (relative: to the daemon's working
directory at start-up, made absolute then, created mode 0700) holds one
directory per tenant, and the workspaces in it::

    <root>/<tenant>/<name>

The tenant is the owner's key id (16 hex digits, gateway.tenancy) or
``local`` for sessions made without API keys, so two API keys never share a
named workspace, whatever names their clients pick.

Names. ``POST /sessions`` with no ``workspace_path`` gets a fresh directory
named after the session id (its *own* workspace, deleted with it:
:meth:`Workspaces.remove`), under ``<tenant>/.own/``, where no name can lead
(a name's segments never start with ``.``): a session whose id a client could
also give as a name (an AG-UI ``threadId``) never gets, nor deletes, a named
workspace. A relative ``workspace_path`` is a name: one to
:data:`MAX_SEGMENTS` segments of ``A-Z a-z 0-9 . _ -``, each starting with a
letter, digit or ``_`` (so no ``.``, ``..``, hidden or option-like segment),
made if missing. Two sessions of one tenant that give the same name share the
directory: a name is how a client comes back to its files. An absolute
``workspace_path`` is allowed only when it is, or is under, one of ``[sessions]
allowed_workspaces``; it must then exist and be a directory, and the part below
the allowed directory follows the same segment rules. A symlink anywhere below
the root (or below the allowed directory) is refused: 422 ``invalid_workspace``.

What is recorded (``SessionRecord.workspace_path``) is ``<tenant>/<name>`` for
a workspace under the root, the absolute path for an allowed one; a client is
shown :func:`display_name` of it (the name, never the host's path of the root).
A worker records its parent's (gateway.node: it works in its parent's workspace).

At use. Built-in tools open the workspace again for each call, by file
descriptor: the root (or allowed directory) by its path, the operator's, then
each segment below it with ``O_NOFOLLOW | O_DIRECTORY`` (:meth:`Workspaces.open_dir`),
and a tool's own path is walked the same way below that descriptor
(:func:`open_file_beneath`), so a symlink swapped in between a check and an
open cannot lead outside: there is no separate check. Every symlink below the
workspace is refused, even one pointing inside it (simplest, and safe). A
recorded workspace that is no longer allowed (an absolute path recorded before
this rule, or whose root the operator removed from ``allowed_workspaces``) is
refused at use: its tools fail.

Copies (``POST /sessions/{id}/fork``, docs/protocol.md §2, "Forks"). A fork
works in a fresh directory of its own, a copy of its source's workspace as it
is at that moment (:meth:`Workspaces.copy`): directories and regular files
only, each opened by descriptor below the previous one without following a
symlink, so a copy never reads outside the workspace; symlinks, FIFOs,
sockets and devices are left out. Files keep their permission bits (not
setuid or setgid) and times. Past ``[sessions] fork_copy_max_mb`` of file
contents, measured before and held while copying, nothing is copied
(:class:`WorkspaceTooLarge`).

Everything here that touches the file system blocks: call it through
``trio.to_thread`` (the ``async`` methods do).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import stat
from collections.abc import Iterator
from dataclasses import dataclass

import trio

from gateway.config import SessionsConfig
from gateway.errors import ToolError

MAX_SEGMENTS = 8
"""The most path segments a workspace name may have."""

MAX_NAME_CHARS = 512
"""The longest workspace name (absolute ones included)."""

LOCAL_TENANT = "local"
"""The tenant directory of sessions made without API keys (not a key id: those are hex)."""

DIR_MODE = 0o700
"""The mode of every directory made here: the daemon's user only."""

_SEGMENT = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}")
_KEY_ID = re.compile(r"[0-9a-f]{16}")
_SESSION_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")  # sess_… or an AG-UI threadId

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_BELOW_FLAGS = _DIR_FLAGS | os.O_NOFOLLOW


class WorkspaceError(Exception):
    """A refused ``workspace_path``; the message names the problem (422 ``invalid_workspace``)."""


class WorkspaceTooLarge(Exception):
    """A workspace holds more than a copy may take (:meth:`Workspaces.copy`)."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"the workspace holds {size} bytes of files, more than {limit}")
        self.size = size  # what it holds (at least: a copy stops once past the limit)
        self.limit = limit


OWN = ".own"
"""The directory of a tenant that holds its sessions' own workspaces (module docstring)."""


def display_name(recorded: str) -> str:
    """What clients see of a recorded workspace (``SessionSummary.workspace_path``).

    ``<tenant>/<name>`` shows as ``<name>``; an allowed absolute path as itself.
    """
    if os.path.isabs(recorded):
        return recorded
    return recorded.partition("/")[2] or recorded


def tenant_of(owner: str) -> str:
    """The tenant directory of a session's owner (module docstring)."""
    if owner == "":
        return LOCAL_TENANT
    if not _KEY_ID.fullmatch(owner):
        raise ValueError(f"not a key id: {owner!r}")
    return owner


@dataclass(frozen=True, slots=True)
class Workspaces:
    """The workspace rules of one daemon: its root and the absolute directories it allows."""

    root: str
    """``[sessions] workspace_root``, absolute."""
    allowed: tuple[str, ...] = ()
    """``[sessions] allowed_workspaces``, normalized."""

    @classmethod
    def from_config(cls, config: SessionsConfig) -> Workspaces:
        """The rules of ``[sessions]``; a relative root is taken from the working directory now."""
        return cls(
            os.path.abspath(config.workspace_root),
            tuple(os.path.normpath(p) for p in config.allowed_workspaces),
        )

    def ensure_root(self) -> None:
        """Create the root if it is missing (mode 0700); at start-up. Blocking.

        Raises:
            OSError: it cannot be made (the daemon then does not start).
        """
        os.makedirs(self.root, mode=DIR_MODE, exist_ok=True)

    # --- creating ------------------------------------------------------------------

    async def create(self, *, session_id: str, owner: str, name: str | None) -> str:
        """Resolve (and make) the workspace of a new session; what to record.

        Args:
            name: the ``workspace_path`` of ``POST /sessions``; None for the
                session's own directory, named after ``session_id``.

        Raises:
            WorkspaceError: the name is refused (the message says why, without host paths).
        """
        tenant = tenant_of(owner)
        if name is None:
            if not _SESSION_ID.fullmatch(session_id):
                raise WorkspaceError(f"session id {session_id!r} cannot name a directory")
            segments = [OWN, session_id]
        elif os.path.isabs(name):
            _check_text(name)
            base, segments = self._allowed_base(name)
            await trio.to_thread.run_sync(_walk_existing, base, segments, name)
            return name
        else:
            segments = _relative_segments(name)
        await trio.to_thread.run_sync(self._make, [tenant, *segments])
        return "/".join([tenant, *segments])

    def _allowed_base(self, name: str) -> tuple[str, list[str]]:
        """The allowed directory ``name`` is, or is under, and the segments below it."""
        parts = name.split("/")[1:]
        if name != "/" and any(p in ("", ".", "..") for p in parts):
            raise WorkspaceError(
                f"workspace_path {name!r} is not a plain path (an empty, '.' or '..' segment)"
            )
        if not self.allowed:
            raise WorkspaceError(
                f"workspace_path {name!r} is absolute: give a relative name"
                " (this gateway allows no absolute workspace)"
            )
        for base in sorted(self.allowed, key=len, reverse=True):
            if name == base:
                return base, []
            prefix = base.rstrip("/") + "/"
            if name.startswith(prefix):
                rest = name[len(prefix) :]
                return base, _relative_segments(rest, shown=name)
        raise WorkspaceError(
            f"workspace_path {name!r} is not under [sessions] allowed_workspaces;"
            " give a relative name"
        )

    def _make(self, segments: list[str]) -> None:
        """Make ``<root>/<segments>`` as needed, never through a symlink. Blocking."""
        try:
            self.ensure_root()  # deleted under the daemon: made again
            fd = os.open(self.root, _DIR_FLAGS)
        except OSError as exc:
            raise WorkspaceError(f"the workspace root cannot be used ({exc.strerror})") from None
        os.close(_walk(fd, segments, f"workspace_path {'/'.join(segments[1:])!r}", make=True))

    # --- at use ----------------------------------------------------------------------

    def open_dir(self, recorded: str) -> int:
        """A descriptor of the recorded workspace, opened now without following symlinks. Blocking.

        Raises:
            ToolError: ``error``: the workspace is gone, or no longer allowed.
        """
        if os.path.isabs(recorded):
            try:
                base, segments = self._allowed_base(recorded)
            except WorkspaceError as exc:
                raise ToolError(
                    "error", f"this session's workspace is not allowed: {exc}"
                ) from None
        else:
            base, segments = self.root, recorded.split("/")
        try:
            return _walk_existing(base, segments, display_name(recorded))
        except WorkspaceError as exc:
            raise ToolError("error", f"this session's workspace cannot be used: {exc}") from None

    def host_path(self, recorded: str) -> str:
        """The host path of a recorded workspace, checked now (:meth:`open_dir`). Blocking.

        For what needs a path (a process's working directory and ``HOME``).
        """
        os.close(self.open_dir(recorded))
        if os.path.isabs(recorded):
            return recorded
        return os.path.join(self.root, recorded)

    # --- copying (a fork) ---------------------------------------------------------------

    async def copy(self, *, recorded: str, session_id: str, owner: str, max_bytes: int) -> str:
        """Copy the recorded workspace into a fresh own directory of ``session_id``; what
        to record (module docstring, "Copies").

        The new directory is ``<tenant of owner>/.own/<session_id>``, whatever the
        source was (its own, a named one, an allowed absolute one); one left there
        by an attempt that died is replaced. Nothing is left behind on a refusal.

        Args:
            max_bytes: the most bytes of files the copy takes; 0: no limit.

        Raises:
            WorkspaceError: the source cannot be used (gone, no longer allowed).
            WorkspaceTooLarge: it holds more than ``max_bytes``.
        """
        tenant = tenant_of(owner)
        if not _SESSION_ID.fullmatch(session_id):
            raise WorkspaceError(f"session id {session_id!r} cannot name a directory")
        return await trio.to_thread.run_sync(
            self._copy, recorded, tenant, session_id, max_bytes, abandon_on_cancel=False
        )

    def _copy(self, recorded: str, tenant: str, session_id: str, max_bytes: int) -> str:
        try:
            source = self.open_dir(recorded)
        except ToolError as exc:
            raise WorkspaceError(exc.message) from None
        target = [tenant, OWN, session_id]
        try:
            size = _measure(source, max_bytes)
            if max_bytes and size > max_bytes:
                raise WorkspaceTooLarge(size, max_bytes)
            self._remove(tenant, session_id)  # an attempt that died left it
            self._make(target)
            try:
                copy = _walk_existing(self.root, target, "the copy")
                try:
                    _copy_tree(source, copy, max_bytes)
                finally:
                    os.close(copy)
            except BaseException:
                self._remove(tenant, session_id)
                raise
        finally:
            os.close(source)
        return "/".join(target)

    # --- deleting --------------------------------------------------------------------

    async def remove(self, *, session_id: str, recorded: str) -> bool:
        """Delete a session's own workspace, with everything in it; whether one was deleted.

        ``DELETE /sessions/{id}`` calls this for the session and each of its
        workers (docs/protocol.md §13 and 15: a session's own directory goes
        with it). Only the directory made for it (recorded as
        ``<tenant>/.own/<session id>``) is deleted: a named workspace, an allowed
        absolute one and a worker's (its parent's) stay. Nothing is followed:
        ``shutil.rmtree`` works by descriptor below the tenant directory, which
        is itself opened without following a symlink; a symlink in the
        workspace's place is unlinked, not followed.
        """
        tenant, _, own = recorded.partition("/")
        if os.path.isabs(recorded) or own != f"{OWN}/{session_id}":
            return False
        if not _SESSION_ID.fullmatch(session_id):
            return False
        return await trio.to_thread.run_sync(self._remove, tenant, session_id)

    def _remove(self, tenant: str, own: str) -> bool:
        try:
            root = os.open(self.root, _DIR_FLAGS)
        except FileNotFoundError:
            return False
        try:
            tenant_fd = _walk(root, [tenant, OWN], "the tenant's own workspaces")  # closes root
        except WorkspaceError:
            return False
        try:
            try:
                st = os.lstat(own, dir_fd=tenant_fd)
            except FileNotFoundError:
                return False
            if stat.S_ISDIR(st.st_mode):
                shutil.rmtree(own, dir_fd=tenant_fd)
            else:
                os.unlink(own, dir_fd=tenant_fd)
            return True
        finally:
            os.close(tenant_fd)


# --- paths below a descriptor ----------------------------------------------------------


def _check_text(name: str) -> None:
    if not name:
        raise WorkspaceError("workspace_path is empty")
    if "\0" in name:
        raise WorkspaceError("workspace_path contains a NUL character")
    if len(name) > MAX_NAME_CHARS:
        raise WorkspaceError(f"workspace_path is longer than {MAX_NAME_CHARS} characters")


def _relative_segments(name: str, shown: str | None = None) -> list[str]:
    """The segments of a relative workspace name, each checked (module docstring)."""
    shown = name if shown is None else shown
    _check_text(name)
    segments = name.split("/")
    if len(segments) > MAX_SEGMENTS:
        raise WorkspaceError(f"workspace_path {shown!r} has more than {MAX_SEGMENTS} segments")
    for segment in segments:
        if segment == "..":
            raise WorkspaceError(f"workspace_path {shown!r} contains '..'")
        if segment == "":
            raise WorkspaceError(f"workspace_path {shown!r} has an empty segment")
        if not _SEGMENT.fullmatch(segment):
            raise WorkspaceError(
                f"workspace_path {shown!r}: segment {segment[:40]!r} is not 1 to 128 of"
                " A-Z a-z 0-9 . _ - starting with a letter, digit or _"
            )
    return segments


def _walk(fd: int, segments: list[str], what: str, *, make: bool = False) -> int:
    """Open directory ``segments`` below ``fd``, never following a symlink; closes ``fd``.

    With ``make``, each missing segment is made (mode 0700) first.

    Raises:
        WorkspaceError: a segment is a symlink, not a directory, missing or unusable.
    """
    try:
        for segment in segments:
            if make:
                try:
                    os.mkdir(segment, DIR_MODE, dir_fd=fd)
                except FileExistsError:
                    pass
                except OSError as exc:
                    raise _refusal(fd, segment, exc, what) from None
            try:
                below = os.open(segment, _BELOW_FLAGS, dir_fd=fd)
            except OSError as exc:
                raise _refusal(fd, segment, exc, what) from None
            os.close(fd)
            fd = below
    except BaseException:
        os.close(fd)
        raise
    return fd


def _refusal(fd: int, segment: str, exc: OSError, what: str) -> WorkspaceError:
    """Why ``segment`` below ``fd`` could not be opened as a directory, in words."""
    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
        with contextlib.suppress(OSError):
            if stat.S_ISLNK(os.lstat(segment, dir_fd=fd).st_mode):
                return WorkspaceError(f"{what}: {segment!r} is a symbolic link")
        return WorkspaceError(f"{what}: {segment!r} is not a directory")
    if exc.errno == errno.ENOENT:
        return WorkspaceError(f"{what}: {segment!r} does not exist")
    return WorkspaceError(f"{what}: {segment!r}: {exc.strerror}")


def _walk_existing(base: str, segments: list[str], shown: str) -> int:
    """A descriptor of ``base/segments``: ``base`` by path, the segments without symlinks."""
    try:
        fd = os.open(base, _DIR_FLAGS)
    except OSError as exc:
        raise WorkspaceError(f"{shown!r} cannot be opened ({exc.strerror})") from None
    return _walk(fd, segments, f"workspace {shown!r}")


def _tool_segments(path: str) -> Iterator[str]:
    """The segments of a tool's path inside the workspace (``.`` and empty ones skipped)."""
    if "\0" in path:
        raise ToolError("invalid_input", "the path contains a NUL character")
    if path.startswith("/"):
        raise ToolError(
            "invalid_input", f"path {path!r} is absolute; give a path inside the workspace"
        )
    for segment in path.split("/"):
        if segment == "..":
            raise ToolError(
                "invalid_input", f"path {path!r} contains '..'; it stays in the workspace"
            )
        if segment not in ("", "."):
            yield segment


def open_file_beneath(dir_fd: int, path: str) -> int:
    """Open regular file ``path`` below directory ``dir_fd`` for reading, at use. Blocking.

    Each directory on the way is opened with ``O_NOFOLLOW | O_DIRECTORY`` below
    the previous one's descriptor, the file with ``O_NOFOLLOW``: a symlink
    anywhere, an absolute path or ``..`` is refused, and nothing swapped in
    meanwhile can lead elsewhere. ``dir_fd`` stays open (the caller's).

    Raises:
        ToolError: ``invalid_input`` for a path that would leave the workspace
            (or goes through a symlink), ``error`` for one that does not exist
            or is not a regular file.
    """
    segments = list(_tool_segments(path))
    if not segments:
        raise ToolError("error", f"is a directory: {path}")
    what = f"path {path!r}"
    try:
        fd = _walk(os.dup(dir_fd), segments[:-1], what)
    except WorkspaceError as exc:
        raise _tool_refusal(exc, path) from None
    try:
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        file_fd = os.open(segments[-1], flags, dir_fd=fd)
    except OSError as exc:
        raise _tool_refusal(_refusal(fd, segments[-1], exc, what), path) from None
    finally:
        os.close(fd)
    mode = os.fstat(file_fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(file_fd)
        kind = "a directory" if stat.S_ISDIR(mode) else "not a regular file"
        raise ToolError("error", f"is {kind}: {path}")
    return file_fd


def _tool_refusal(exc: WorkspaceError, path: str) -> ToolError:
    message = str(exc)
    if message.endswith("is a symbolic link"):
        return ToolError(
            "invalid_input", f"{message}: symbolic links are not followed inside the workspace"
        )
    if message.endswith("does not exist"):
        return ToolError("error", f"no such file: {path}")
    return ToolError("error", message)


# --- copies (module docstring, "Copies") ----------------------------------------------

_CHUNK = 1 << 20
"""How much of a file one read of a copy takes."""


def _below(root: int, segments: tuple[str, ...]) -> int | None:
    """Directory ``segments`` below ``root`` (kept open), never through a symlink; ``None``
    if it is gone or was swapped for something else meanwhile."""
    try:
        return _walk(os.dup(root), list(segments), "a directory of the workspace")
    except WorkspaceError:
        return None


def _entries(fd: int) -> list[tuple[str, os.stat_result]]:
    """A directory's entries with what they are (symlinks not followed)."""
    with os.scandir(fd) as entries:
        out = []
        for entry in entries:
            try:
                out.append((entry.name, entry.stat(follow_symlinks=False)))
            except FileNotFoundError:  # gone meanwhile
                continue
        return out


def _measure(root: int, limit: int) -> int:
    """The bytes of the regular files below ``root``; stops once past ``limit`` (0: none)."""
    total = 0
    pending: list[tuple[str, ...]] = [()]
    while pending:
        where = pending.pop()
        fd = _below(root, where)
        if fd is None:
            continue
        try:
            for name, st in _entries(fd):
                if stat.S_ISDIR(st.st_mode):
                    pending.append((*where, name))
                elif stat.S_ISREG(st.st_mode):
                    total += st.st_size
                    if limit and total > limit:
                        return total
        finally:
            os.close(fd)
    return total


def _copy_tree(source: int, target: int, limit: int) -> int:
    """Copy the directories and regular files below ``source`` into ``target``; the bytes.

    Raises:
        WorkspaceTooLarge: past ``limit`` bytes (0: none).
    """
    copied = 0
    itself = os.fstat(target)  # an allowed workspace holding the root holds the copy too
    pending: list[tuple[str, ...]] = [()]
    while pending:
        where = pending.pop()
        src = _below(source, where)
        if src is None:
            continue
        try:
            dst = _walk(os.dup(target), list(where), "the copy")
            try:
                for name, st in _entries(src):
                    if (st.st_dev, st.st_ino) == (itself.st_dev, itself.st_ino):
                        continue
                    if stat.S_ISDIR(st.st_mode):
                        os.mkdir(name, DIR_MODE, dir_fd=dst)
                        pending.append((*where, name))
                    elif stat.S_ISREG(st.st_mode):
                        copied = _copy_file(src, dst, name, copied, limit)
            finally:
                os.close(dst)
        finally:
            os.close(src)
    return copied


def _copy_file(src_dir: int, dst_dir: int, name: str, copied: int, limit: int) -> int:
    """Copy regular file ``name``, never through a symlink; ``copied`` plus its bytes."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        src = os.open(name, flags, dir_fd=src_dir)
    except OSError:  # gone, or swapped for a symlink meanwhile: not copied
        return copied
    try:
        st = os.fstat(src)
        if not stat.S_ISREG(st.st_mode):
            return copied
        create = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        dst = os.open(name, create, 0o600, dir_fd=dst_dir)
        try:
            while chunk := os.read(src, _CHUNK):
                copied += len(chunk)
                if limit and copied > limit:
                    raise WorkspaceTooLarge(copied, limit)
                view = memoryview(chunk)
                while view:
                    view = view[os.write(dst, view) :]
            os.fchmod(dst, stat.S_IMODE(st.st_mode) & ~(stat.S_ISUID | stat.S_ISGID))
            os.utime(dst, ns=(st.st_atime_ns, st.st_mtime_ns))
        finally:
            os.close(dst)
    finally:
        os.close(src)
    return copied

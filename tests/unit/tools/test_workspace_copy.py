"""A fork's copy of a workspace (gateway.tools.workspace, ``Workspaces.copy``; docs/protocol.md
§2, "Forks"; §15, "Workspaces").

On real directories under ``tmp_path``, no gateway: what is copied (directories
and regular files, their permission bits and times), what is not (symlinks,
whether they lead out of the workspace or stay in it, FIFOs; setuid bits), the
bound (measured first: nothing made; held while copying: nothing left), an
attempt's leftover replaced, an allowed workspace that holds the copy itself,
and a source that cannot be used.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from gateway.tools import workspace as ws
from gateway.tools.workspace import WorkspaceError, Workspaces, WorkspaceTooLarge

FORK = "sess_fork"


def names(path: Path) -> list[str]:
    return sorted(p.name for p in path.iterdir())


def contents(path: Path) -> bytes:
    """Every file below ``path``, its bytes run together."""
    return b"".join(p.read_bytes() for p in path.rglob("*") if p.is_file())


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


async def made(tmp_path: Path, **allowed: str) -> tuple[Workspaces, Path]:
    """The rules of a root under ``tmp_path``, and a session's own workspace in it."""
    spaces = Workspaces(str(tmp_path / "root"), tuple(allowed.values()))
    spaces.ensure_root()
    recorded = await spaces.create(session_id="sess_src", owner="", name=None)
    return spaces, Path(spaces.host_path(recorded))


async def test_directories_and_files_are_copied_with_their_bits_and_times(tmp_path: Path) -> None:
    spaces, source = await made(tmp_path)
    (source / "a" / "b").mkdir(parents=True)
    (source / "a" / "b" / "deep.txt").write_text("deep")
    (source / "tool").write_bytes(b"\x7fELF")
    (source / "tool").chmod(0o4755)  # setuid: not copied as such
    (source / "empty").mkdir()
    os.utime(source / "a" / "b" / "deep.txt", ns=(1_000_000_000, 2_000_000_000))
    recorded = await spaces.copy(
        recorded="local/.own/sess_src", session_id=FORK, owner="", max_bytes=0
    )
    assert recorded == f"local/.own/{FORK}"
    copy = Path(spaces.host_path(recorded))
    assert (copy / "a" / "b" / "deep.txt").read_text() == "deep"
    assert (copy / "a" / "b" / "deep.txt").stat().st_mtime_ns == 2_000_000_000
    assert mode(copy / "tool") == 0o755
    assert (copy / "empty").is_dir()
    assert mode(copy) == 0o700


async def test_symlinks_fifos_and_what_they_lead_to_are_not_copied(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("SECRET")
    spaces, source = await made(tmp_path)
    (source / "kept").write_text("kept")
    (source / "to_file").symlink_to(outside / "secret")
    (source / "to_dir").symlink_to(outside)
    (source / "inside").symlink_to("kept")
    (source / "dangling").symlink_to(tmp_path / "nothing")
    os.mkfifo(source / "fifo")
    recorded = await spaces.copy(
        recorded="local/.own/sess_src", session_id=FORK, owner="", max_bytes=0
    )
    copy = Path(spaces.host_path(recorded))
    assert names(copy) == ["kept"]
    assert b"SECRET" not in contents(copy)


async def test_past_the_bound_nothing_is_made(tmp_path: Path) -> None:
    spaces, source = await made(tmp_path)
    (source / "a").write_bytes(b"x" * 600)
    (source / "b").write_bytes(b"y" * 600)
    with pytest.raises(WorkspaceTooLarge) as too_large:
        await spaces.copy(recorded="local/.own/sess_src", session_id=FORK, owner="", max_bytes=1000)
    assert too_large.value.limit == 1000 and too_large.value.size > 1000
    assert not (tmp_path / "root" / "local" / ".own" / FORK).exists()
    recorded = await spaces.copy(
        recorded="local/.own/sess_src", session_id=FORK, owner="", max_bytes=1200
    )  # at the bound
    assert len(contents(Path(spaces.host_path(recorded)))) == 1200


async def test_a_workspace_that_grows_past_the_bound_while_copied_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spaces, source = await made(tmp_path)
    (source / "a").write_bytes(b"x" * 2000)
    monkeypatch.setattr(ws, "_measure", lambda root, limit: 10)  # as measured before it grew
    with pytest.raises(WorkspaceTooLarge):
        await spaces.copy(recorded="local/.own/sess_src", session_id=FORK, owner="", max_bytes=1000)
    assert not (tmp_path / "root" / "local" / ".own" / FORK).exists()


async def test_an_attempts_leftover_is_replaced(tmp_path: Path) -> None:
    spaces, source = await made(tmp_path)
    (source / "new").write_text("new")
    leftover = tmp_path / "root" / "local" / ".own" / FORK
    leftover.mkdir()
    (leftover / "half").write_text("from an attempt that died")
    await spaces.copy(recorded="local/.own/sess_src", session_id=FORK, owner="", max_bytes=0)
    assert names(leftover) == ["new"]


async def test_an_allowed_workspace_holding_the_root_does_not_copy_the_copy(
    tmp_path: Path,
) -> None:
    spaces, _ = await made(tmp_path, top=str(tmp_path))
    (tmp_path / "project.txt").write_text("p")
    recorded = await spaces.copy(recorded=str(tmp_path), session_id=FORK, owner="", max_bytes=0)
    copy = Path(spaces.host_path(recorded))
    assert (copy / "project.txt").read_text() == "p"
    assert (copy / "root" / "local" / ".own" / "sess_src").is_dir()
    assert not (copy / "root" / "local" / ".own" / FORK).exists()


async def test_a_source_that_cannot_be_used_is_refused(tmp_path: Path) -> None:
    spaces, source = await made(tmp_path)
    source.rmdir()
    with pytest.raises(WorkspaceError, match="cannot be used"):
        await spaces.copy(recorded="local/.own/sess_src", session_id=FORK, owner="", max_bytes=0)
    with pytest.raises(WorkspaceError, match="cannot name a directory"):
        await spaces.copy(recorded="local/.own/x", session_id="../up", owner="", max_bytes=0)
    assert not (tmp_path / "root" / "local" / ".own" / FORK).exists()

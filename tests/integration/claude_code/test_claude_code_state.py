"""A Claude Code session's state is its own, and goes with it (docs/protocol.md §11, §13).

Found by an adversarial review: a client-named Claude Code session deleted
and named again by another key resumed the old transcript (its
``.claude-code/<id>`` state directory was never removed, and the Claude
Code session id is derived from the reusable name): the new tenant's model
saw the old tenant's text. And the CLIs' temporary root, a predictable
name under ``/tmp``, was used as found, even made by another local user.
Now:

- deleting a session removes its state directory (whether or not the
  claude-code extra is installed: nothing here imports the SDK);
- a state directory says which session made it (its ``created_at``); one
  another session of the same id left is removed before a CLI starts;
- the temporary root, and each CLI's directory in it, is used only if it
  is the daemon's own directory (not a symlink), and closed to others.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import trio

from gateway.runtimes.claude_code.paths import (
    CREATED,
    UnsafeDirectory,
    own_state,
    private_dir,
    state_dir,
)
from tests.conftest import Harness


def test_a_state_directory_another_session_of_the_id_left_is_removed(tmp_path: Path) -> None:
    home = str(tmp_path / "state")
    own_state(home, 1000)
    Path(home, "transcript.jsonl").write_text("the first session's words")
    own_state(home, 1000)  # the same session's CLI again: kept
    assert Path(home, "transcript.jsonl").exists()
    own_state(home, 2000)  # a new session of the same id: nothing of the old one
    assert not Path(home, "transcript.jsonl").exists()
    assert Path(home, CREATED).read_text() == "2000"
    assert os.stat(home).st_mode & 0o777 == 0o700


def test_a_state_directory_from_before_the_mark_is_kept_and_marked(tmp_path: Path) -> None:
    home = tmp_path / "legacy"
    home.mkdir()
    (home / "transcript.jsonl").write_text("kept")
    own_state(str(home), 1234)
    assert (home / "transcript.jsonl").exists() and (home / CREATED).read_text() == "1234"


def test_the_temporary_root_must_be_the_daemons_own_and_is_made_private(tmp_path: Path) -> None:
    mine = tmp_path / "mine"
    private_dir(str(mine))
    private_dir(str(mine))  # already there, ours: fine
    assert os.stat(mine).st_mode & 0o777 == 0o700
    open_to_all = tmp_path / "open"  # ours, as an earlier version made it: closed
    open_to_all.mkdir()
    os.chmod(open_to_all, 0o777)
    private_dir(str(open_to_all))
    assert os.stat(open_to_all).st_mode & 0o777 == 0o700
    link = tmp_path / "link"
    link.symlink_to(mine)
    with pytest.raises(UnsafeDirectory, match="not a directory"):
        private_dir(str(link))
    if os.getuid() == 0:  # another user's (made by root as nobody's)
        theirs = tmp_path / "theirs"
        theirs.mkdir(mode=0o700)
        os.chown(theirs, 65534, 65534)
        with pytest.raises(UnsafeDirectory, match="belongs to uid 65534"):
            private_dir(str(theirs))


async def test_deleting_a_session_removes_its_claude_code_state(gw: Harness) -> None:
    sid = await gw.create_session()
    home = trio.Path(state_dir(gw.node.workspaces.root, sid))
    await home.mkdir(parents=True)
    await (home / "transcript.jsonl").write_text("words of the deleted session")
    assert (await gw.http.delete(f"/sessions/{sid}")).status_code == 204
    assert not await home.exists()

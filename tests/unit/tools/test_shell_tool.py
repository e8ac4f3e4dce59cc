"""The ``shell`` tool: results, bounds, and that no process of a call survives it.

These tests run real processes on the real clock: trio's MockClock cannot drive
a subprocess. Each is capped with ``fail_after`` and none sleeps to wait: a
command reports that it has started its children through a FIFO, and a test
waits for processes to exit on their pidfds before it reads the process table
(``/proc``), where zombies count as dead (killed children are reparented to
init, which reaps them in its own time).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import trio

from gateway.errors import ToolError
from gateway.tools.builtin import build_registry
from gateway.tools.registry import ToolContext, ToolOutput, ToolRegistry
from gateway.tools.shell import MAX_KEPT_BYTES
from gateway.tools.workspace import Workspaces


def _registry(tmp_path: Path) -> ToolRegistry:
    """The way a gateway gets it: opted into by name (``[tools] enabled``).

    The test's directory is the workspace: an absolute one the operator allows.
    """
    workspaces = Workspaces(str(tmp_path / "workspaces"), (str(tmp_path),))
    return build_registry(["shell"], workspaces=workspaces)


# The command reports its pid, which is its process group id (it leads a new
# session), once its children are started, through a FIFO the test reads.
REPORT_PGID = "echo $$ > ready"


def _ctx(tmp_path: Path, kill_grace_s: float = 1.0) -> ToolContext:
    return ToolContext(
        session_id="s",
        turn_id="t",
        tool_use_id="tu",
        workspace_path=str(tmp_path),
        kill_grace_s=kill_grace_s,
    )


async def _run(tmp_path: Path, command: str, **extra: Any) -> ToolOutput:
    with trio.fail_after(5):
        return await _registry(tmp_path).execute(
            "shell", {"command": command, **extra}, _ctx(tmp_path)
        )


def _live_members(pgid: int) -> list[int]:
    """The pids of the group's processes that are not zombies, from /proc."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except (FileNotFoundError, ProcessLookupError):
            continue
        # Fields after the ")" closing the command name: state, ppid, pgrp, ...
        state, _ppid, pgrp = stat.rsplit(")", 1)[1].split()[:3]
        if int(pgrp) == pgid and state != "Z":
            pids.append(int(entry))
    return pids


async def _assert_group_gone(pgid: int) -> None:
    """Wait for each process of the group to exit, then check the process table.

    A SIGKILLed process takes a moment to exit; a survivor would stay for 100 s.
    """
    with trio.fail_after(1):
        for pid in _live_members(pgid):
            try:
                pidfd = os.pidfd_open(pid)
            except ProcessLookupError:
                continue
            try:
                await trio.lowlevel.wait_readable(pidfd)  # readable once the process exits
            finally:
                os.close(pidfd)
    assert _live_members(pgid) == []


async def _read_pgid(fifo: Path) -> int:
    """The pgid the command writes into ``fifo``, as soon as it does."""
    # Opened read-write so that it never reads end-of-file for want of a writer.
    async with trio.lowlevel.FdStream(os.open(fifo, os.O_RDWR)) as stream:
        return int(await stream.receive_some())


async def _cancel_when_started(
    tmp_path: Path, command: str, kill_grace_s: float
) -> tuple[int, float]:
    """Run ``command``, cancel the call once it reports its pgid; the pgid and the time it took.

    Asserts that the cancellation propagated out of the call, not a result.
    """
    scope = trio.CancelScope()
    returned: list[ToolOutput] = []

    async def call() -> None:
        with scope:
            ctx = _ctx(tmp_path, kill_grace_s)
            returned.append(await _registry(tmp_path).execute("shell", {"command": command}, ctx))

    os.mkfifo(tmp_path / "ready")
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(call)
            pgid = await _read_pgid(tmp_path / "ready")
            assert _live_members(pgid) != []
            cancelled_at = trio.current_time()
            scope.cancel()
    assert scope.cancelled_caught
    assert returned == []
    return pgid, trio.current_time() - cancelled_at


async def test_exit_code_and_both_streams_are_the_result(tmp_path: Path) -> None:
    output = await _run(tmp_path, "echo out; echo err >&2; exit 3")
    assert output.structured == {
        "exit_code": 3,
        "stdout": "out\n",
        "stderr": "err\n",
        "truncated": False,
    }
    assert output.content == "exit code 3\n--- stdout ---\nout\n\n--- stderr ---\nerr\n"


async def test_runs_in_the_workspace(tmp_path: Path) -> None:
    output = await _run(tmp_path, "pwd")
    workspace = await trio.Path(tmp_path).resolve()
    assert output.structured["stdout"] == f"{workspace}\n"


async def test_stdin_is_empty(tmp_path: Path) -> None:
    output = await _run(tmp_path, "wc -c")
    assert output.structured["stdout"].strip() == "0"


async def test_a_signal_gives_a_negative_exit_code(tmp_path: Path) -> None:
    output = await _run(tmp_path, "kill -9 $$")
    assert output.structured["exit_code"] == -9


async def test_environment_leaves_secrets_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-secret")
    output = await _run(tmp_path, 'echo "key=$ANTHROPIC_API_KEY path=${PATH:+set}"')
    assert output.structured["stdout"] == "key= path=set\n"


async def test_output_beyond_the_cap_is_dropped_and_marked(tmp_path: Path) -> None:
    output = await _run(tmp_path, "head -c 204800 /dev/zero | tr '\\0' a; echo small >&2")
    dropped = 204800 - MAX_KEPT_BYTES
    assert output.structured == {
        "exit_code": 0,
        "stdout": "a" * MAX_KEPT_BYTES + f"\n[truncated: {dropped} more bytes]",
        "stderr": "small\n",
        "truncated": True,
    }


async def test_invalid_utf8_is_replaced(tmp_path: Path) -> None:
    output = await _run(tmp_path, "printf 'a\\377b'")
    assert output.structured["stdout"] == "a\ufffdb"


async def test_timeout_stops_the_command_and_fails_the_call(tmp_path: Path) -> None:
    started = trio.current_time()
    with pytest.raises(ToolError) as caught:
        await _run(tmp_path, "echo partial; sleep 30", timeout_s=0.2)
    assert caught.value.error_class == "timeout"
    assert str(caught.value) == (
        "command timed out after 0.2 s\n--- stdout ---\npartial\n\n--- stderr ---\n"
    )
    assert trio.current_time() - started < 2


async def test_cancel_kills_the_shell_and_its_children(tmp_path: Path) -> None:
    command = f"sleep 100 & sleep 100 & {REPORT_PGID}; wait"
    pgid, _ = await _cancel_when_started(tmp_path, command, kill_grace_s=1.0)
    await _assert_group_gone(pgid)


async def test_cancel_kills_what_ignores_sigterm_after_the_grace(tmp_path: Path) -> None:
    command = f"trap '' TERM; {REPORT_PGID}; sleep 100"
    pgid, took = await _cancel_when_started(tmp_path, command, kill_grace_s=0.3)
    assert 0.3 <= took < 3
    await _assert_group_gone(pgid)


async def test_normal_exit_leaves_no_background_child(tmp_path: Path) -> None:
    started = trio.current_time()
    output = await _run(tmp_path, "sleep 100 & echo $$ > pgid; echo started")
    assert trio.current_time() - started < 2
    assert output.structured["stdout"] == "started\n"
    await _assert_group_gone(int(await trio.Path(tmp_path / "pgid").read_text()))


@pytest.mark.parametrize(
    "raw_input",
    [
        {},
        {"command": "true", "bogus": 1},
        {"command": "true", "timeout_s": 0},
        {"command": "true", "timeout_s": 3601},
    ],
)
async def test_invalid_input_is_refused_before_running(
    tmp_path: Path, raw_input: dict[str, Any]
) -> None:
    with pytest.raises(ToolError) as caught:
        await _registry(tmp_path).execute("shell", raw_input, _ctx(tmp_path))
    assert caught.value.error_class == "invalid_input"

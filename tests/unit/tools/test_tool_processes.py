"""Tool processes (docs/protocol.md §15 "What tools inherit", gateway.tools.process).

What an adversarial trial found, each reproduced here: a shell tool saw the
daemon's ``USER``, ``LOGNAME``, ``LC_ALL``, ``TZ``, ``TMPDIR`` and ``HOME``; and
a ``sleep 30`` it started kept running after the daemon was killed with -9.
The daemon runs as operators run it (``gateway serve``, a real process in a
tmp directory of its own); these tests run real processes on the real clock,
waiting for processes to die by polling ``/proc``, bounded.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from gateway.config import ToolsConfig
from gateway.tools import process as process_module
from gateway.tools.builtin import build_registry
from gateway.tools.process import ToolProcesses, tool_environment
from gateway.tools.registry import ToolContext
from gateway.tools.workspace import Workspaces
from tests.system.cli.test_cli_serve import gateway_process
from tests.unit.tools.test_shell_tool import _live_members, _read_pgid

SHELL_CONFIG = """\
[model]
provider = "scripted"
[tools]
enabled = ["shell"]
kill_grace_s = 0.5
env = {{ FROM_CONFIG = "yes" }}
[store]
path = "{db}"
"""


def shell_turn(command: str) -> str:
    return json.dumps(
        {
            "script": {
                "rounds": [
                    [{"tool_use": {"name": "shell", "input": {"command": command}}}],
                    [{"text": "done"}],
                ]
            }
        }
    )


def daemon_args(tmp_path: Path) -> tuple[str, ...]:
    config = tmp_path / "gw.toml"
    config.write_text(SHELL_CONFIG.format(db=tmp_path / "gateway.db"))
    return "--config", str(config), "--port", "0"


async def tool_result(http: httpx.AsyncClient, sid: str) -> dict[str, Any]:
    """The turn's tool result, once it is stored (polled, bounded)."""
    with trio.fail_after(10):
        while True:
            r = await http.get(f"/sessions/{sid}/messages")
            for message in r.json()["messages"]:
                for block in message["content"]:
                    if block["type"] == "tool_result":
                        return dict(block)
            await trio.sleep(0.05)


def children_of(pid: int) -> list[tuple[int, str]]:
    """The (pid, command line) of ``pid``'s live children, from /proc."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (FileNotFoundError, ProcessLookupError):
            continue
        state, ppid = stat.rsplit(")", 1)[1].split()[:2]
        if int(ppid) == pid and state != "Z":
            found.append((int(entry), cmdline))
    return found


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


async def gone_within(seconds: float, check: Any) -> None:
    """Poll ``check()`` until it is true, at most ``seconds``."""
    with trio.fail_after(seconds):
        while not check():  # noqa: ASYNC110 (the process table: no event to wait on)
            await trio.sleep(0.02)


# --- environment ---------------------------------------------------------------------


@pytest.mark.slow  # over a second on two cores (measured with --durations)
async def test_the_shell_sees_path_home_lang_and_tools_env_only(tmp_path: Path) -> None:
    """The daemon's secrets, GATEWAY_* and its USER/TZ/TMPDIR stay behind (the reported leak)."""
    env = {
        "ANTHROPIC_API_KEY": "sk-secret",
        "GATEWAY_LOG_LEVEL": "info",
        "USER": "daemon-user",
        "LOGNAME": "daemon-user",
        "LC_ALL": "C",
        "TZ": "Europe/Paris",
        "TMPDIR": "/var/tmp",
        "HOME": "/root-of-the-daemon",
        "LANG": "C.UTF-8",
    }
    async with gateway_process(tmp_path, *daemon_args(tmp_path), env=env) as (proc, port):
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
            sid = (await http.post("/sessions", json={})).json()["session_id"]
            r = await http.post(f"/sessions/{sid}/turns", json={"content": shell_turn("env")})
            assert r.status_code == 202, r.text
            result = await tool_result(http, sid)
        proc.send_signal(signal.SIGTERM)
        with trio.fail_after(10):
            assert await proc.wait() == 0
    assert not result["is_error"], result
    stdout = result["content"].split("--- stdout ---\n", 1)[1].split("\n--- stderr ---")[0]
    seen = dict(line.split("=", 1) for line in stdout.splitlines() if "=" in line)
    added_by_sh = {"PWD", "OLDPWD", "SHLVL", "_"}
    assert set(seen) - added_by_sh == {"PATH", "HOME", "LANG", "FROM_CONFIG"}, seen
    assert seen["HOME"] == str(tmp_path / "workspaces" / "local" / ".own" / sid)
    assert seen["FROM_CONFIG"] == "yes" and seen["LANG"] == "C.UTF-8"
    assert "sk-secret" not in result["content"]


def test_the_environment_is_built_from_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    monkeypatch.delenv("LANG", raising=False)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret")
    assert tool_environment("/w", {"A": "1"}) == {
        "PATH": "/usr/bin:/bin",
        "HOME": "/w",
        "LANG": "C.UTF-8",
        "A": "1",
    }
    monkeypatch.delenv("PATH")
    assert tool_environment("/w")["PATH"] == os.defpath


# --- limits ---------------------------------------------------------------------------


async def test_rlimits_apply_to_the_command_and_what_it_starts(tmp_path: Path) -> None:
    processes = ToolProcesses(ToolsConfig(rlimit_cpu_s=7, rlimit_memory_mb=900, rlimit_file_mb=1))
    workspaces = Workspaces(str(tmp_path / "workspaces"), (str(tmp_path),))
    registry = build_registry(["shell"], workspaces=workspaces, processes=processes)
    ctx = ToolContext("s", "t", "tu", str(tmp_path), kill_grace_s=0.5)
    with trio.fail_after(10):
        limits = await registry.execute("shell", {"command": "ulimit -t; ulimit -v"}, ctx)
        big = await registry.execute(
            "shell", {"command": "head -c 2000000 /dev/zero > f; echo $?"}, ctx
        )
    assert limits.structured["stdout"].split() == ["7", str(900 * 1024)]
    assert big.structured["stdout"].strip() != "0"  # head was stopped (SIGXFSZ)
    assert (tmp_path / "f").stat().st_size <= 1024 * 1024


async def test_no_limit_by_default(tmp_path: Path) -> None:
    workspaces = Workspaces(str(tmp_path / "workspaces"), (str(tmp_path),))
    registry = build_registry(["shell"], workspaces=workspaces)
    ctx = ToolContext("s", "t", "tu", str(tmp_path), kill_grace_s=0.5)
    with trio.fail_after(10):
        out = await registry.execute("shell", {"command": "ulimit -f; ulimit -t"}, ctx)
    assert out.structured["stdout"].split() == ["unlimited", "unlimited"]


def ptrace_bit(status: str, field: str) -> bool:
    """Whether ``CAP_SYS_PTRACE`` is in a capability set of a ``/proc/<pid>/status`` text."""
    [line] = [x for x in status.splitlines() if x.startswith(f"{field}:")]
    return bool(int(line.split()[1], 16) >> process_module.CAP_SYS_PTRACE & 1)


@pytest.mark.skipif(not process_module.ptrace_held(), reason="this process has no CAP_SYS_PTRACE")
async def test_a_tool_process_and_what_it_starts_hold_no_cap_sys_ptrace(tmp_path: Path) -> None:
    """Root (these tests) holds ``CAP_SYS_PTRACE``: a tool, and a program it execs, do not,
    in any set, and cannot read another process's memory (this one's, dumpable or not)."""
    workspaces = Workspaces(str(tmp_path / "workspaces"), (str(tmp_path),))
    registry = build_registry(["shell"], workspaces=workspaces)
    ctx = ToolContext("s", "t", "tu", str(tmp_path), kill_grace_s=0.5)
    mine = await trio.Path("/proc/self/status").read_text()
    command = (
        "grep Cap /proc/self/status; sh -c 'grep CapBnd /proc/self/status' | sed s/Bnd/Sub/;"
        f" (exec 3< /proc/{os.getpid()}/mem) 2>&1 | sed 's/.*: //'"
    )
    with trio.fail_after(10):
        out = await registry.execute("shell", {"command": command}, ctx)
    status = out.structured["stdout"]
    assert ptrace_bit(mine, "CapBnd") and ptrace_bit(mine, "CapEff")
    for field in ("CapBnd", "CapSub", "CapPrm", "CapEff", "CapInh", "CapAmb"):
        assert not ptrace_bit(status, field), status
    assert "Permission denied" in status or "Operation not permitted" in status, status


# --- dying with the daemon --------------------------------------------------------------


@pytest.mark.slow  # over a second on two cores (measured with --durations)
async def test_kill_9_of_the_daemon_kills_its_tool_processes(tmp_path: Path) -> None:
    """The reported survivor: a shell tool's ``sleep 30`` outlived a kill -9 of the daemon."""
    async with gateway_process(tmp_path, *daemon_args(tmp_path)) as (proc, port):
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
            sid = (await http.post("/sessions", json={})).json()["session_id"]
            os.mkfifo(tmp_path / "workspaces" / "local" / ".own" / sid / "ready")
            turn = shell_turn("sleep 30 & echo $$ > ready; wait")  # the sleep is forked first
            r = await http.post(f"/sessions/{sid}/turns", json={"content": turn})
            assert r.status_code == 202, r.text
            with trio.fail_after(10):
                pgid = await _read_pgid(tmp_path / "workspaces" / "local" / ".own" / sid / "ready")
            assert len(_live_members(pgid)) == 2  # the shell and its sleep
            [(reaper, cmdline)] = [c for c in children_of(proc.pid) if "reaper" in c[1]]
            assert "-I" in cmdline.split()
        proc.kill()  # kill -9
        await proc.wait()
    await gone_within(3, lambda: _live_members(pgid) == [])
    await gone_within(3, lambda: not alive(reaper))


@pytest.mark.slow  # over a second on two cores (measured with --durations)
async def test_sigterm_leaves_no_watchdog_and_no_tool_process(tmp_path: Path) -> None:
    async with gateway_process(tmp_path, *daemon_args(tmp_path)) as (proc, port):
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
            sid = (await http.post("/sessions", json={})).json()["session_id"]
            os.mkfifo(tmp_path / "workspaces" / "local" / ".own" / sid / "ready")
            turn = shell_turn("sleep 60 & echo $$ > ready; wait")
            await http.post(f"/sessions/{sid}/turns", json={"content": turn})
            with trio.fail_after(10):
                pgid = await _read_pgid(tmp_path / "workspaces" / "local" / ".own" / sid / "ready")
            [(reaper, _)] = [c for c in children_of(proc.pid) if "reaper" in c[1]]
        proc.send_signal(signal.SIGTERM)
        with trio.fail_after(10):
            assert await proc.wait() == 0
    assert _live_members(pgid) == []
    assert not alive(reaper)


async def test_a_dead_watchdog_is_replaced_and_told_of_live_groups(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(process_module, "REAPER_RESTART_DELAY_S", 0.05)
    processes = ToolProcesses()
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(processes.run)
            proc = await processes.spawn(["sleep", "30"], workspace=str(tmp_path))
            first = processes.reaper_pid
            assert first is not None
            os.kill(first, signal.SIGKILL)
            await gone_within(5, lambda: processes.reaper_pid not in (None, first))
            assert alive(proc.pid)
            # The daemon "dies": the new watchdog's pipe closes, and it kills the group.
            processes._close_pipe()
            await proc.wait()
            assert proc.returncode == -signal.SIGKILL
            nursery.cancel_scope.cancel()


async def test_a_spawn_right_after_the_watchdog_died_waits_for_the_next_one(
    tmp_path: Path,
) -> None:
    """Killed a moment ago, not yet seen by its task: a spawn then waits for the next watchdog
    (else its group, known to no watchdog, would outlive a daemon killed meanwhile)."""
    processes = ToolProcesses()
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(processes.run)
            first_tool = await processes.spawn(["sleep", "30"], workspace=str(tmp_path))
            first = processes.reaper_pid
            assert first is not None
            os.kill(first, signal.SIGKILL)
            while not _zombie(first):  # no checkpoint: its task cannot notice meanwhile
                time.sleep(0.001)  # noqa: ASYNC251
            assert processes._up.is_set()  # its task has not noticed: no checkpoint since
            proc = await processes.spawn(["sleep", "30"], workspace=str(tmp_path))
            second = processes.reaper_pid
            assert second not in (None, first) and alive(second)
            processes._close_pipe()  # the daemon "dies": both groups go with it
            await proc.wait()
            await first_tool.wait()
            assert proc.returncode == first_tool.returncode == -signal.SIGKILL
            nursery.cancel_scope.cancel()


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


async def test_a_group_stopped_by_the_daemon_is_struck_off(tmp_path: Path) -> None:
    """``-PGID`` once the group is dead: the watchdog never kills a reused id."""
    processes = ToolProcesses()
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(processes.run)
            proc = await processes.spawn(["sleep", "30"], workspace=str(tmp_path))
            assert processes._groups == {proc.pid}
            await processes.stop(proc, 0.5)
            assert processes._groups == set()
            assert proc.returncode == -signal.SIGTERM
            nursery.cancel_scope.cancel()


@pytest.mark.skipif(not process_module.GATED, reason="the gate needs /proc")
async def test_a_command_runs_only_once_the_watchdog_has_answered(tmp_path: Path) -> None:
    """The gate (gateway.tools.process): a watchdog that cannot answer holds the command back.

    A watchdog stopped (SIGSTOP) reads nothing: the process is started, in its
    group, but its command has not run; once the watchdog answers, it runs.
    """
    processes = ToolProcesses()
    marker = tmp_path / "ran"
    async with trio.open_nursery() as nursery:
        await nursery.start(processes.run)
        first = await processes.spawn(["true"], workspace=str(tmp_path))  # the watchdog is up
        await first.wait()
        assert processes.reaper_pid is not None
        os.kill(processes.reaper_pid, signal.SIGSTOP)
        try:
            spawned: list[trio.Process] = []

            async def start() -> None:
                spawned.append(
                    await processes.spawn(["touch", str(marker)], workspace=str(tmp_path))
                )

            nursery.start_soon(start)
            await trio.sleep(0.5)
            assert not marker.exists() and not spawned  # waiting for the answer
        finally:
            os.kill(processes.reaper_pid, signal.SIGCONT)
        with trio.fail_after(5):
            while not spawned:  # noqa: ASYNC110 (the spawn returns once answered)
                await trio.sleep(0.01)
            assert await spawned[0].wait() == 0
        assert marker.exists()
        nursery.cancel_scope.cancel()

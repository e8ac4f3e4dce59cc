"""Adversarial checks of docs/protocol.md §15 "The boundary", as merged.

Each test reproduces an attack of an adversarial review of the change: the
ones that got through at first (a tool reading the daemon's environment
through ``/proc``, a thread's workspace deletion reaching a named one, a
streaming message of thousands of blocks over the snapshot cap, refused
requests that still made directories or sessions, a tool started while the
watchdog restarted) and some that never did, cheap to keep. Real gateways on
127.0.0.1 (in-process, or ``gateway serve`` subprocesses where a process
boundary is the point).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx
import pytest
import trio

from gateway.tools.process import signal_group
from gateway.tools.workspace import Workspaces
from tests.conftest import make_config, ready_port, running_gateway
from tests.paths import ROOT
from tests.system.cli.test_cli_serve import gateway_process
from tests.unit.tools.test_shell_tool import _live_members, _read_pgid
from tests.unit.tools.test_tool_processes import children_of, daemon_args, shell_turn, tool_result

# --- workspaces ------------------------------------------------------------------------


async def test_removing_a_thread_keeps_a_named_workspace_of_the_same_name(tmp_path: Path) -> None:
    spaces = Workspaces(str(tmp_path / "workspaces"))
    named = await spaces.create(session_id="sess_keeper", owner="", name="proj")
    files = tmp_path / "workspaces" / named
    (files / "notes.txt").write_text("the keeper's work")
    # An AG-UI run on threadId "proj" makes session "proj", its own workspace <local>/proj.
    own = await spaces.create(session_id="proj", owner="", name=None)
    assert own != named, "a thread's own workspace is another session's named workspace"
    await spaces.remove(session_id="proj", recorded=own)
    assert (files / "notes.txt").exists(), "a named workspace was deleted with a thread"


# --- what tools inherit ------------------------------------------------------------------


NOBODY = 65534
REPO = ROOT


@pytest.mark.slow  # over a second on two cores (measured with --durations)
@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root")
async def test_a_shell_tool_cannot_read_the_daemons_environment_through_proc() -> None:
    # The daemon runs as an unprivileged user, as operators run it (root reads any /proc).
    home = Path(tempfile.mkdtemp(prefix="gw-adv-"))
    try:
        os.chmod(home, 0o777)
        config = home / "gw.toml"
        config.write_text(
            '[model]\nprovider = "scripted"\n[tools]\nenabled = ["shell"]\nkill_grace_s = 0.5\n'
            f'[store]\npath = "{home / "gateway.db"}"\n'
            f'[sessions]\nworkspace_root = "{home / "ws"}"\n'
        )
        env = {
            "PATH": os.environ.get("PATH", os.defpath),
            "PYTHONPATH": str(REPO),
            "ANTHROPIC_API_KEY": "sk-ant-the-daemons-secret",
        }
        argv = [
            "setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
            sys.executable, "-m", "gateway", "serve", "--config", str(config), "--port", "0",
        ]  # fmt: skip
        proc = await trio.lowlevel.open_process(
            argv, cwd=home, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
        )
        try:
            port = await ready_port(proc, 20)
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
                sid = (await http.post("/sessions", json={})).json()["session_id"]
                command = "tr '\\0' '\\n' < /proc/$PPID/environ"
                r = await http.post(f"/sessions/{sid}/turns", json={"content": shell_turn(command)})
                assert r.status_code == 202, r.text
                result = await tool_result(http, sid)
            text = json.dumps(result)
            assert "exit code" in text
            assert "sk-ant-the-daemons-secret" not in text
        finally:
            proc.kill()
            await proc.wait()
            await proc.stdout.aclose()  # type: ignore[union-attr]
    finally:
        shutil.rmtree(home, ignore_errors=True)


SECRETS = {
    "ANTHROPIC_API_KEY": "sk-ant-the-daemons-secret",
    "GATEWAY_AUTH_API_KEYS": '["gw-key-the-daemons-secret"]',
    "CRM_SERVICE_TOKEN": "crm-token-the-daemons-secret",
    "REDIS_URL": "redis://gateway:redis-password-the-daemons-secret@10.0.0.7:6379/0",
}


@pytest.mark.slow  # a daemon process
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: the daemon runs as root")
async def test_a_daemon_running_as_root_keeps_no_secret_in_its_proc_environ(
    tmp_path: Path,
) -> None:
    """Root reads any ``/proc/<pid>/environ``, non-dumpable or not: the secrets are not there.

    Read from this test (root, with ``CAP_SYS_PTRACE``); the daemon still uses
    what it read (its API key authenticates). A shell tool the daemon runs as
    root has no ``CAP_SYS_PTRACE`` (issue 38): the daemon's memory
    (``/proc/$PPID/mem``, where the keys are) is permission denied. (Its
    ``environ`` stays readable to a root tool on Linux 6.18, capabilities or
    not: the secrets' bytes there are overwritten.)
    """
    config = tmp_path / "gw.toml"
    config.write_text(
        '[model]\nprovider = "scripted"\n[tools]\nenabled = ["shell"]\nkill_grace_s = 0.5\n'
        f'[store]\npath = "{tmp_path / "gateway.db"}"\n'
        f'[sessions]\nworkspace_root = "{tmp_path / "ws"}"\n'
    )
    env = {"PATH": os.environ.get("PATH", os.defpath), "PYTHONPATH": str(REPO), **SECRETS}
    argv = [sys.executable, "-m", "gateway", "serve", "--config", str(config), "--port", "0"]
    proc = await trio.lowlevel.open_process(
        argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
    )
    try:
        port = await ready_port(proc, 20)
        environ = await trio.Path(f"/proc/{proc.pid}/environ").read_bytes()
        assert f"PYTHONPATH={REPO}".encode() in environ.split(b"\0")  # the rest is kept
        key = {"Authorization": "Bearer gw-key-the-daemons-secret"}
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", headers=key) as http:
            assert (
                await http.post("/sessions", json={}, headers={"Authorization": ""})
            ).status_code == 401
            r = await http.post("/sessions", json={})
            assert r.status_code == 201, r.text  # the key still authenticates
            sid = r.json()["session_id"]
            command = (
                "tr '\\0' '\\n' < /proc/$PPID/environ; echo environ=$?;"
                " (exec 3< /proc/$PPID/mem); echo mem=$?; grep CapBnd /proc/self/status;"
                " env; echo uid=$(id -u)"
            )
            r = await http.post(f"/sessions/{sid}/turns", json={"content": shell_turn(command)})
            assert r.status_code == 202, r.text
            tool = await tool_result(http, sid)
            result = json.dumps(tool)
        assert "uid=0" in result, result  # the tool ran as root...
        assert "/mem: Permission denied" in result and "mem=0" not in result, result
        bounding = re.search(r"CapBnd:\s*([0-9a-f]+)", str(tool["content"]))
        assert bounding is not None and not int(bounding[1], 16) >> 19 & 1, result
        assert "PYTHONPATH" in result and "environ=0" in result, result  # read, scrubbed
        for name, value in SECRETS.items():
            secret = value.split("the-daemons-secret")[0] + "the-daemons-secret"
            assert secret.encode() not in environ and name.encode() not in environ, name
            assert secret not in result and name not in result, name
    finally:
        proc.kill()
        await proc.wait()
        await proc.stdout.aclose()  # type: ignore[union-attr]


# --- snapshots that fit ------------------------------------------------------------------


async def test_a_complete_message_of_many_tiny_blocks_is_left_out_not_sent_over_the_cap(
    tmp_path: Path,
) -> None:
    """3000 one-character blocks: the newest message alone is over the cap, so it is left out."""
    from tests.integration.session.test_snapshot_cap import CAP, capped, snapshot_of

    async with capped(tmp_path) as gw:
        sid = await gw.create_session()
        await gw.submit(sid, {"script": {"rounds": [[{"text": "a"}, {"thinking": "b"}] * 1500]}})
        with trio.fail_after(30):
            while len((await gw.http.get(f"/sessions/{sid}/messages")).json()["messages"]) < 2:  # noqa: ASYNC110 (polled over HTTP)
                await trio.sleep(0.05)
        data, snap = await snapshot_of(gw, sid)
        assert len(data) <= CAP and snap.has_more


async def test_a_streaming_message_of_many_tiny_blocks_gives_a_snapshot_under_the_cap(
    tmp_path: Path,
) -> None:
    from tests.integration.session.test_snapshot_cap import CAP, capped

    async with capped(tmp_path) as gw:
        sid = await gw.create_session()
        script = {"delay_ms": 1, "rounds": [[{"text": "a"}, {"thinking": "b"}] * 2500]}
        await gw.submit(sid, {"script": script})
        biggest = 0
        with trio.fail_after(60):
            while len((await gw.http.get(f"/sessions/{sid}/messages")).json()["messages"]) < 2:
                async with gw.client(sid, max_message_size=64 * CAP) as client:
                    await client.send(
                        {"type": "subscribe", "filter": "preset:full", "snapshot": True}
                    )
                    await client.ws.get_message()  # the ack
                    raw = await client.ws.get_message()
                biggest = max(biggest, len(raw))
                if biggest > CAP:
                    break
                await trio.sleep(0.2)
        assert biggest <= CAP


async def test_a_refused_post_sessions_leaves_no_directory(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    with trio.fail_after(30):
        async with running_gateway(config) as gw:
            for n in range(3):
                body = {"workspace_path": f"n{n}/b/c/d/e/f/g/h", "model": "nope:nope"}
                r = await gw.http.post("/sessions", json=body)
                assert r.status_code == 422, r.text
            r = await gw.http.post("/sessions", json={"model": "nope:nope"})
            assert r.status_code == 422, r.text
    made = [p for p, _, _ in os.walk(tmp_path / "workspaces")]
    assert made in ([str(tmp_path / "workspaces")], [])


@pytest.mark.slow  # over a second on two cores (measured with --durations)
async def test_a_tool_started_while_the_watchdog_restarts_dies_with_the_daemon(
    tmp_path: Path,
) -> None:
    async with gateway_process(tmp_path, *daemon_args(tmp_path)) as (proc, port):
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
            sid = (await http.post("/sessions", json={})).json()["session_id"]
            r = await http.post(f"/sessions/{sid}/turns", json={"content": shell_turn("true")})
            assert r.status_code == 202, r.text
            await tool_result(http, sid)  # the watchdog is up
            [(reaper, _)] = [c for c in children_of(proc.pid) if "reaper" in c[1]]
            while (  # noqa: ASYNC110 (polled over HTTP: the first turn ends)
                any(
                    m["status"] != "complete"
                    for m in (await http.get(f"/sessions/{sid}/messages")).json()["messages"]
                )
                or (await http.get(f"/sessions/{sid}")).json().get("status") == "running"
            ):
                await trio.sleep(0.02)
            ready = tmp_path / "workspaces" / "local" / ".own" / sid / "ready"
            os.mkfifo(ready)
            os.kill(reaper, signal.SIGKILL)  # it crashed, or someone killed it
            turn = shell_turn("sleep 30 & echo $$ > ready; wait")
            r = await http.post(f"/sessions/{sid}/turns", json={"content": turn})
            assert r.status_code == 202, r.text
            with trio.fail_after(10):
                pgid = await _read_pgid(ready)
        proc.kill()  # kill -9, within the second the daemon waits to restart its watchdog
        await proc.wait()
    try:
        with trio.move_on_after(3):
            while _live_members(pgid):  # noqa: ASYNC110 (the process table)
                await trio.sleep(0.05)
        assert _live_members(pgid) == [], "a tool group outlived the daemon"
    finally:
        signal_group(pgid, signal.SIGKILL)


@pytest.mark.slow  # over a second on two cores (measured with --durations)
async def test_eight_concurrent_shells_each_with_a_double_fork_die_with_the_daemon(
    tmp_path: Path,
) -> None:
    """kill -9 of a daemon running 8 shells at once, each with a grandchild that ignores TERM."""
    async with gateway_process(tmp_path, *daemon_args(tmp_path)) as (proc, port):
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
            sid = (await http.post("/sessions", json={})).json()["session_id"]
            space = tmp_path / "workspaces" / "local" / ".own" / sid
            uses = []
            for n in range(8):
                os.mkfifo(space / f"ready{n}")
                command = f"(trap '' TERM; sleep 30 &) ; sleep 30 & echo $$ > ready{n}; wait"
                uses.append({"tool_use": {"name": "shell", "input": {"command": command}}})
            turn = json.dumps({"script": {"rounds": [uses, [{"text": "done"}]]}})
            r = await http.post(f"/sessions/{sid}/turns", json={"content": turn})
            assert r.status_code == 202, r.text
            pgids = []
            with trio.fail_after(15):
                for n in range(8):
                    pgids.append(await _read_pgid(space / f"ready{n}"))
            assert all(len(_live_members(g)) >= 2 for g in pgids)
        proc.kill()
        await proc.wait()
    try:
        with trio.move_on_after(3):
            while any(_live_members(g) for g in pgids):  # noqa: ASYNC110 (the process table)
                await trio.sleep(0.05)
        assert [g for g in pgids if _live_members(g)] == []
    finally:
        for g in pgids:
            signal_group(g, signal.SIGKILL)


# --- limits that hold --------------------------------------------------------------------


async def test_a_rate_limited_agui_run_creates_no_session(tmp_path: Path) -> None:
    from tests.integration.doors.agui.test_agui_http import run_input
    from tests.integration.tenancy.test_tenants import tenants

    limits = {"limits.turns_per_minute_per_key": 1, "limits.max_sessions_per_key": 3}
    async with tenants(tmp_path, **limits) as (a, _):
        r = await a.http.post("/agui", json=run_input("first", "hi"))
        assert r.status_code == 200
        for thread in ("second", "third"):
            r = await a.http.post("/agui", json=run_input(thread, "hi"))
            assert (r.status_code, r.json()["error"]["code"]) == (429, "rate_limited")
        assert (await a.http.get("/sessions/second")).status_code == 404
        r = await a.http.post("/sessions", json={})
        assert r.status_code == 201, r.text  # 2 of 3 sessions: room for one


async def test_an_agui_run_refused_422_creates_no_session(tmp_path: Path) -> None:
    from tests.integration.doors.agui.test_agui_http import run_input

    with trio.fail_after(30):
        async with running_gateway(make_config(tmp_path)) as gw:
            body = {**run_input("empty", "hi"), "messages": []}
            r = await gw.http.post("/agui", json=body)
            assert (r.status_code, r.json()["error"]["code"]) == (422, "invalid_body")
            assert (await gw.http.get("/sessions/empty")).status_code == 404

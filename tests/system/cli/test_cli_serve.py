"""``gateway serve`` as an operator runs it (docs/reference.md "Command line").

A real process: the embedded defaults (store in the working directory), the
readiness line with the real port, env and flag overrides, and SIGTERM/SIGINT
shutting down gracefully: in-flight turns cancelled with ``reason:
"shutdown"``, clients closed with 1001, the store flushed, exit status 0.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest
import trio
from trio_websocket import ConnectionClosed

from tests.conftest import Client, open_ws, ready_port

# slow: gateway serve as a process
pytestmark = pytest.mark.slow


@asynccontextmanager
async def gateway_process(
    cwd: Path, *args: str, env: dict[str, str] | None = None
) -> AsyncIterator[tuple[trio.Process, int]]:
    """``python -m gateway serve ARGS`` in ``cwd``; yields the process and its port."""
    proc = await trio.lowlevel.open_process(
        [sys.executable, "-m", "gateway", "serve", *args],
        cwd=cwd,
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        yield proc, await ready_port(proc, 20)
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                await pipe.aclose()


async def test_serve_on_embedded_defaults_then_sigterm_shuts_down_gracefully(
    tmp_path: Path,
) -> None:
    async with gateway_process(tmp_path, "--port", "0") as (proc, port):
        base = f"http://127.0.0.1:{port}"
        async with httpx.AsyncClient(base_url=base) as http:
            assert (await http.get("/healthz")).json() == {"status": "ok"}
            sid = (await http.post("/sessions", json={})).json()["session_id"]
            url = (await http.get(f"/sessions/{sid}")).json()["ws_url"]
            async with open_ws(url) as ws:
                client = Client(ws, sid)
                await client.subscribe()
                script = {
                    "script": {
                        "rounds": [[{"tool_use": {"name": "sleep", "input": {"seconds": 60}}}]]
                    }
                }
                r = await http.post(f"/sessions/{sid}/turns", json={"content": json.dumps(script)})
                assert r.status_code == 202
                with trio.fail_after(10):
                    await client.until(lambda e: e.type == "tool.called")
                    proc.send_signal(signal.SIGTERM)
                    events = await client.until_turn_ends()
                    assert [e.type for e in events[-2:]] == ["tool.failed", "turn.cancelled"]
                    assert events[-1].payload.reason == "shutdown"
                    with pytest.raises(ConnectionClosed) as closed:
                        while True:
                            await client.recv()
                assert closed.value.reason.code == 1001
                assert json.loads(closed.value.reason.reason)["code"] == "shutdown"
        with trio.fail_after(10):
            assert await proc.wait() == 0
    # the store was flushed: the session and the cancellation are on disk, in the cwd
    db = sqlite3.connect(tmp_path / "gateway.db")
    try:
        kinds = [row[0] for row in db.execute("SELECT type FROM events ORDER BY seq")]
        assert kinds[-2:] == ["turn.cancelled", "bus.subscriber_unregistered"]
        assert db.execute("SELECT count(*) FROM sessions").fetchone() == (1,)
    finally:
        db.close()


async def test_a_store_that_cannot_write_at_shutdown_costs_one_line_and_exit_1(
    tmp_path: Path,
) -> None:
    """docs/reference.md "Command line": another process holds the database's write lock
    (a backup tool, an outage) when SIGTERM comes. The close insists for 10 s, then the
    daemon exits 1 with one line saying how many writes were lost: no hang, no traceback;
    what was written before the lock is on disk."""
    env = {"GATEWAY_STORE_COMMIT_TIMEOUT_S": "1", "GATEWAY_SERVER_SHUTDOWN_GRACE_S": "1"}
    async with gateway_process(tmp_path, "--port", "0", env=env) as (proc, port):
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
            sid = (await http.post("/sessions", json={})).json()["session_id"]
            lock = sqlite3.connect(tmp_path / "gateway.db", timeout=0, isolation_level=None)
            lock.execute("BEGIN EXCLUSIVE")  # every write of the daemon now fails, retried
            try:
                r = await http.post(f"/sessions/{sid}/turns", json={"content": "hello"})
                assert r.status_code in (202, 503), r.text  # its events wait, retried
                proc.send_signal(signal.SIGTERM)
                with trio.fail_after(60):  # 10 s of insisting, each attempt up to 5 s busy
                    status = await proc.wait()
            finally:
                lock.execute("ROLLBACK")
                lock.close()
        assert proc.stderr is not None
        said = b""
        while chunk := await proc.stderr.receive_some():
            said += chunk
        lines = said.decode().splitlines()
    assert status == 1
    assert "Traceback" not in "\n".join(lines)
    assert lines[-1].startswith("gateway: store "), lines
    assert "writes could not be made durable within 10 s of closing" in lines[-1], lines
    db = sqlite3.connect(tmp_path / "gateway.db")
    try:
        assert db.execute("SELECT id FROM sessions").fetchall() == [(sid,)]
    finally:
        db.close()


async def test_sigint_also_shuts_down_and_env_and_flags_override_the_file(tmp_path: Path) -> None:
    config = tmp_path / "gw.toml"
    config.write_text('[server]\nport = 1\n[store]\npath = "from-file.db"\n')
    env = {"GATEWAY_STORE_PATH": str(tmp_path / "from-env.db")}
    async with gateway_process(tmp_path, "--config", str(config), "--port", "0", env=env) as (
        proc,
        port,
    ):
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
            assert (await http.post("/sessions", json={})).status_code == 201
        proc.send_signal(signal.SIGINT)
        with trio.fail_after(10):
            assert await proc.wait() == 0
    assert (tmp_path / "from-env.db").exists()
    assert not (tmp_path / "from-file.db").exists()


async def test_a_bad_config_is_one_line_and_exit_2_with_nothing_started(tmp_path: Path) -> None:
    config = tmp_path / "gw.toml"
    config.write_text("[stream]\nqueue_max_events = 0\n")
    result = await trio.run_process(
        [sys.executable, "-m", "gateway", "serve", "--config", str(config)],
        cwd=tmp_path,
        capture_stdout=True,
        capture_stderr=True,
        check=False,
    )
    assert result.returncode == 2
    assert result.stdout == b""
    lines = result.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and "stream.queue_max_events" in lines[0], lines
    assert not (tmp_path / "gateway.db").exists()


async def test_a_missing_api_key_is_a_config_error_before_anything_starts(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "ANTHROPIC_API_KEY"}
    env |= {"GATEWAY_MODEL_PROVIDER": "anthropic", "GATEWAY_MODEL_NAME": "anthropic:claude-x"}
    result = await trio.run_process(
        [sys.executable, "-m", "gateway", "serve", "--port", "0"],
        cwd=tmp_path,
        env=env,
        capture_stdout=True,
        capture_stderr=True,
        check=False,
    )
    assert result.returncode == 2 and result.stdout == b""
    lines = result.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and "ANTHROPIC_API_KEY" in lines[0], lines


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("port-taken", "address already in use"),
        ("bad-host", "'999.1.1.1' is not a usable address"),
        ("no-directory", "does not exist"),
        ("not-a-database", "file is not a database"),
    ],
)
async def test_a_start_up_failure_is_one_line_and_a_non_zero_exit(
    tmp_path: Path, case: str, expected: str
) -> None:
    """docs/reference.md "Command line": one line naming the problem, no traceback."""
    args = ["--port", "0"]
    env: dict[str, str] = {}
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    if case == "port-taken":
        args = ["--port", str(taken.getsockname()[1])]
    elif case == "bad-host":
        args += ["--host", "999.1.1.1"]
    elif case == "no-directory":
        env["GATEWAY_STORE_PATH"] = str(tmp_path / "missing" / "gateway.db")
    else:
        (tmp_path / "notes.db").write_text("these are not the pages of a database\n" * 200)
        env["GATEWAY_STORE_PATH"] = str(tmp_path / "notes.db")
    with trio.fail_after(30):
        result = await trio.run_process(
            [sys.executable, "-m", "gateway", "serve", *args],
            cwd=tmp_path,
            env={**os.environ, **env},
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    taken.close()
    assert result.returncode == 1 and result.stdout == b""
    lines = result.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gateway: ") and expected in lines[0], lines


async def test_a_workspace_root_deleted_under_the_daemon_is_made_again_not_a_500(
    tmp_path: Path,
) -> None:
    """docs/protocol.md §2 (no 5xx) and 15: the root is made at start-up, and again if deleted."""
    cwd, store = tmp_path / "cwd", tmp_path / "store"
    cwd.mkdir()
    store.mkdir()
    config = tmp_path / "gw.toml"
    config.write_text(f'[store]\npath = "{store / "gateway.db"}"\n')
    async with gateway_process(cwd, "--config", str(config), "--port", "0") as (proc, port):
        root = cwd / "workspaces"
        assert root.is_dir() and root.stat().st_mode & 0o777 == 0o700  # made at start-up
        shutil.rmtree(cwd)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
            r = await http.post("/sessions", json={})
            assert r.status_code == 201, r.text
            assert (root / "local" / ".own" / r.json()["session_id"]).is_dir()
        proc.send_signal(signal.SIGTERM)
        with trio.fail_after(10):
            assert await proc.wait() == 0

"""Webhooks across restarts (docs/doors/webhooks.md): the outbox is durable, so nothing is lost.

``gateway serve`` as a process, killed with SIGKILL between the commit of an
event and its delivery, or stopped while its receiver fails: the next process
delivers what the last one owed, with the same ``webhook-id``. On both stores:
SQLite, and Redis (a redis-server of the test's own, ``lease_s`` = 1 s: the
killed process's claims lapse before the next one can deliver).
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from tests.conftest import JSON_TYPE, ready_port
from tests.redis_support import RedisServer, own_redis
from tests.webhook_support import Receiver, redis_outbox_size, webhook_toml

__all__ = ["own_redis"]  # the fixture, used through ``backend``

pytestmark = pytest.mark.slow  # gateway serve as a process


class Backend:
    """A test's store: its ``[store]`` table, and how many deliveries its outbox holds."""

    def __init__(self, table: str, pending: Callable[[], int]) -> None:
        self.table = table
        self.pending = pending


@pytest.fixture(params=["sqlite", "redis"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    if request.param == "sqlite":
        path = tmp_path / "gateway.db"
        return Backend(f'path = "{path}"\n', lambda: len(outbox(path)))
    server: RedisServer = request.getfixturevalue("own_redis")
    table = f'backend = "redis"\nurl = "{server.url}"\nlease_s = 1\n'
    return Backend(table, lambda: redis_outbox_size(server.port))


def write_config(tmp_path: Path, backend: Backend, receiver: Receiver, **keys: Any) -> Path:
    path = tmp_path / "gateway.toml"
    path.write_text(
        f"[server]\nport = 0\n[store]\n{backend.table}"
        f'[sessions]\nworkspace_root = "{tmp_path / "workspaces"}"\n'
        + webhook_toml("crm", receiver.url, ["turn.completed"], **keys)
    )
    return path


@asynccontextmanager
async def serving(tmp_path: Path, config: Path) -> AsyncIterator[tuple[trio.Process, int]]:
    with (tmp_path / "stderr.log").open("ab") as stderr:
        proc = await trio.lowlevel.open_process(
            [sys.executable, "-m", "gateway", "serve", "--config", str(config)],
            cwd=tmp_path,
            env=dict(os.environ),
            stdout=subprocess.PIPE,
            stderr=stderr,
        )
    try:
        yield proc, await ready_port(proc, 20)
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()
        if proc.stdout is not None:
            await proc.stdout.aclose()


async def one_turn(port: int) -> str:
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
        r = await http.post("/sessions", json={})
        assert r.status_code == 201, r.text
        sid = str(r.json()["session_id"])
        r = await http.post(
            f"/sessions/{sid}/turns", content=b'{"content": "hi"}', headers=JSON_TYPE
        )
        assert r.status_code == 202, r.text
        return sid


async def until_outbox_empty(backend: Backend) -> None:
    """The daemon took its delivery out of the outbox (read from the store meanwhile)."""
    with trio.fail_after(10):
        while True:
            if not backend.pending():
                return
            await trio.sleep(0.05)


def outbox(path: Path) -> list[tuple[str, int]]:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        rows: list[tuple[str, int]] = conn.execute("SELECT hook, seq FROM outbox").fetchall()
        return rows
    finally:
        conn.close()

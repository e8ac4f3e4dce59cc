"""The kill -9 torture test (PROTOCOL section 9), on a real ``gateway serve`` process.

Kill points are spread over every phase of a turn: a first and a later LLM
call streaming, tools running, the seam (a tool waiting for approval), a
delegate's worker streaming, right after a turn ended and right after a
session was created. Each is reached by waiting until a live client received
a given event (plus a random few milliseconds), then the process gets
SIGKILL, and the same store is opened again by a new process. Checked each
time:

- before the restart, in the database file: every catalog event any client
  received is stored; per session, the stored catalog events begin with
  exactly the ones the client received, in order (no gap); a session whose
  ``POST /sessions`` was answered exists;
- after it: every turn of every session ends in ``turn.completed`` or
  ``turn.cancelled``, the interrupted one with ``reason: "server_restart"``;
  no message is ``in_progress`` and no session has a turn in flight; ids
  issued after the restart are above every id issued before;
- a client resuming with its last ``since`` ends in the same reduced state as
  one that subscribes fresh with a snapshot.

It runs by hand (``KILL9_POINTS=N``, e.g. 210: thirty per phase; the counts
are printed at the end with ``pytest -s``); the suite's kill -9 test is
tests/test_torture.py, which checks a ledger of the whole run.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import sqlite3
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from gateway.protocol.events import CATALOG_TYPES, Event
from gateway.protocol.frames import SubscribeAck
from tests.conftest import Client, open_ws

KILLS = int(os.environ.get("KILL9_POINTS", "0"))
READY = re.compile(rb"gateway listening on http://127\.0\.0\.1:(\d+)")
WORKERS = {"event_types": None, "actors": None, "include_worker_sessions": True}
SLOW_WORKER = json.dumps({"script": {"delay_ms": 10, "rounds": [[{"lorem": 300}]]}})


def tool(name: str, **args: Any) -> dict[str, Any]:
    return {"tool_use": {"name": name, "input": args}}


# phase: (script or None for "create a session only", the event to kill after, how many of it)
PHASES: dict[str, tuple[dict[str, Any] | None, str, int]] = {
    "llm": (
        {"delay_ms": 3, "rounds": [[{"thinking": "hm " * 10}, {"lorem": 300}]]},
        "text.delta",
        12,
    ),
    "later-llm": (
        {"delay_ms": 3, "rounds": [[tool("sleep", seconds=0.01)], [{"lorem": 300}]]},
        "text.delta",
        8,
    ),
    "tools": (
        {"rounds": [[tool("sleep", seconds=60), tool("sleep", seconds=60)]]},
        "tool.called",
        1,
    ),
    "seam": ({"rounds": [[tool("read_file", path="x")]]}, "permission.requested", 1),
    "delegate": ({"rounds": [[tool("delegate", task=SLOW_WORKER)]]}, "text.delta", 6),
    "turn-ended": ({"rounds": [[{"text": "short and done"}]]}, "turn.completed", 1),
    "session-created": (None, "", 0),
}


class Daemon:
    """One ``gateway serve`` process on the test's store."""

    def __init__(self, proc: trio.Process, port: int) -> None:
        self.proc = proc
        self.port = port
        self.base = f"http://127.0.0.1:{port}"

    @classmethod
    async def start(cls, workdir: Path, config: Path) -> Daemon:
        proc = await trio.lowlevel.open_process(
            [sys.executable, "-m", "gateway", "serve", "--config", str(config), "--port", "0"],
            cwd=workdir,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        assert proc.stdout is not None
        line = b""
        with trio.fail_after(30):
            while not line.endswith(b"\n"):
                chunk = await proc.stdout.receive_some(1)
                assert chunk, "the gateway exited before its readiness line"
                line += chunk
        match = READY.search(line)
        assert match, line
        return cls(proc, int(match.group(1)))

    async def kill(self) -> None:
        self.proc.kill()  # SIGKILL
        await self.proc.wait()
        if self.proc.stdout is not None:
            await self.proc.stdout.aclose()


class Store:
    """The database file, read directly (read-only) between two processes."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def query(self, sql: str, *args: Any) -> list[Any]:
        conn = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True)
        try:
            return conn.execute(sql, args).fetchall()
        finally:
            conn.close()

    def catalog(self, session_id: str) -> list[tuple[str, str]]:
        rows = self.query("SELECT data FROM events WHERE session_id = ? ORDER BY seq", session_id)
        return [(e["id"], e["type"]) for e in (json.loads(r[0]) for r in rows)]

    def max_id(self) -> str:
        (seq,) = self.query("SELECT coalesce(max(seq), 0) FROM events")[0]
        return f"evt_{seq:020d}"


def comparable(state: dict[str, Any]) -> dict[str, Any]:
    results = {k: {**v, "error_class": None} for k, v in state["tool_results"].items()}
    return {"messages": state["messages"], "streaming": state["streaming"], "tool_results": results}


async def ws_url(http: httpx.AsyncClient, sid: str) -> str:
    r = await http.get(f"/sessions/{sid}")
    assert r.status_code == 200, r.text
    return str(r.json()["ws_url"])


async def run_to_kill_point(
    daemon: Daemon, workspace: Path, phase: str, rng: random.Random
) -> tuple[str | None, Client | None, Any]:
    """Create a session, drive it into ``phase``, and return once the kill is due."""
    script, wait_for, count = PHASES[phase]
    async with httpx.AsyncClient(base_url=daemon.base) as http:
        r = await http.post("/sessions", json={"workspace_path": str(workspace)})
        assert r.status_code == 201, r.text
        sid = str(r.json()["session_id"])
        if script is None:
            return sid, None, None
        url = await ws_url(http, sid)
        ws_cm = open_ws(url)
        ws = await ws_cm.__aenter__()
        client = Client(ws, sid)
        ack = await client.subscribe(filter=WORKERS)
        assert isinstance(ack, SubscribeAck)
        r = await http.post(
            f"/sessions/{sid}/turns", json={"content": json.dumps({"script": script})}
        )
        assert r.status_code == 202, r.text
        n = rng.randint(1, count)
        seen = 0

        def due(e: Event) -> bool:
            nonlocal seen
            if e.type == wait_for and (phase != "delegate" or e.session_id != sid):
                seen += 1
            return seen >= n

        with trio.fail_after(30):
            await client.until(due)
            with trio.move_on_after(rng.random() * 0.02):  # a few ms more, at random
                while True:
                    await client.recv()
        return sid, client, ws_cm


async def check_before_restart(store: Store, sid: str, client: Client | None) -> int:
    """Durability: what the client got is stored, as a prefix of each session's events."""
    assert store.query("SELECT count(*) FROM sessions WHERE id = ?", sid)[0][0] == 1
    if client is None:
        return 0
    got: dict[str, list[tuple[str, str]]] = {}
    for e in client.events:
        if e.type in CATALOG_TYPES:
            got.setdefault(e.session_id, []).append((e.id, e.type))
    checked = 0
    for session_id, events in got.items():
        stored = store.catalog(session_id)
        assert stored[: len(events)] == events, (
            session_id,
            events[-3:],
            stored[: len(events)][-3:],
        )
        checked += len(events)
    return checked


async def check_after_restart(
    daemon: Daemon,
    store: Store,
    sid: str,
    client: Client | None,
    high_water: str,
    known: set[int],
) -> str | None:
    """Every turn closed, nothing in progress, and resume == snapshot. The closing phase."""
    sessions = [r[0] for r in store.query("SELECT id FROM sessions")]
    closing_phase = None
    for session_id in sessions:
        turns: dict[str, str] = {}
        for _id, type_ in store.catalog(session_id):
            if type_ == "turn.started":
                turns[_id] = "open"
        rows = store.query(
            "SELECT data FROM events WHERE session_id = ? AND type IN"
            " ('turn.started', 'turn.completed', 'turn.cancelled') ORDER BY seq",
            session_id,
        )
        open_turn: str | None = None
        for (data,) in rows:
            e = json.loads(data)
            if e["type"] == "turn.started":
                assert open_turn is None, f"{session_id}: a turn started before the last ended"
                open_turn = e["turn_id"]
            else:
                assert e["turn_id"] == open_turn
                open_turn = None
                restart = (
                    e["type"] == "turn.cancelled" and e["payload"]["reason"] == "server_restart"
                )
                if restart and e["id"] > high_water and session_id == sid:
                    closing_phase = e["payload"]["phase"]
        assert open_turn is None, f"{session_id}: turn {open_turn} never ended"
    # Ids issued after the restart are above every id issued before it.
    new = {seq for (seq,) in store.query("SELECT seq FROM events")} - known
    assert all(seq > int(high_water[4:]) for seq in new), (sorted(new)[:3], high_water)
    statuses = store.query("SELECT json_extract(CAST(data AS TEXT), '$.status') FROM messages")
    assert ("in_progress",) not in statuses
    assert store.query("SELECT count(*) FROM sessions WHERE current_turn_id IS NOT NULL")[0][0] == 0
    if client is not None and client.events:
        async with httpx.AsyncClient(base_url=daemon.base) as http:
            async with open_ws(await ws_url(http, sid)) as ws:
                resumed = Client(ws, sid)
                resumed.reducer, resumed.events = client.reducer, list(client.events)
                ack = await resumed.subscribe(filter=WORKERS, since=client.events[-1].id)
                assert isinstance(ack, SubscribeAck), ack
                for _ in range(ack.replay_event_count):
                    await resumed.recv()
            async with open_ws(await ws_url(http, sid)) as ws:
                fresh = Client(ws, sid)
                await fresh.subscribe(filter=WORKERS, snapshot=True)
                await fresh.recv()
        assert comparable(fresh.reducer.state()) == comparable(client.reducer.state())
        assert client.reducer.streaming is None
    return closing_phase


@pytest.mark.skipif(
    not KILLS, reason="the long kill -9 run: set KILL9_POINTS (the suite runs test_torture.py)"
)
async def test_kill_9_at_every_phase_loses_nothing_a_client_was_shown(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "x").write_text("x")
    db = tmp_path / "gateway.db"
    config = tmp_path / "gateway.toml"
    config.write_text(
        f'[store]\npath = "{db}"\n'
        '[tools]\nenabled = ["sleep", "read_file", "delegate"]\nrequire_approval = ["read_file"]\n'
    )
    store = Store(db)
    rng = random.Random(int(os.environ.get("KILL9_SEED", "9")))
    phases = [p for _ in range(-(-KILLS // len(PHASES))) for p in PHASES][:KILLS]
    tally: Counter[str] = Counter()
    closed_in: Counter[str] = Counter()
    events_checked = 0
    daemon = await Daemon.start(tmp_path, config)
    try:
        for phase in phases:
            sid, client, ws_cm = await run_to_kill_point(daemon, workspace, phase, rng)
            high_water = store.max_id() if client is None else max(
                [store.max_id(), *(e.id for e in client.events)]
            )  # fmt: skip
            await daemon.kill()
            if ws_cm is not None:
                with trio.CancelScope(shield=True), contextlib.suppress(Exception):
                    await ws_cm.__aexit__(None, None, None)  # the server is gone
            assert sid is not None
            events_checked += await check_before_restart(store, sid, client)
            known = {seq for (seq,) in store.query("SELECT seq FROM events")}
            daemon = await Daemon.start(tmp_path, config)
            closing = await check_after_restart(daemon, store, sid, client, high_water, known)
            tally[phase] += 1
            closed_in[closing or "-"] += 1
    finally:
        await daemon.kill()
    print(
        f"\nkill -9 torture: {sum(tally.values())} kill points {dict(tally)};"
        f" turns closed at restart by phase {dict(closed_in)};"
        f" {events_checked} delivered catalog events checked; violations 0"
    )
    assert sum(tally.values()) == KILLS
    # Every phase of section 8 was among the interrupted turns' phases.
    assert {"llm", "tools", "seam"} <= set(closed_in)

"""Crashes and restarts (docs/protocol.md §9), in process.

A crash is simulated exactly: SQLite's online backup copies what is committed
at that instant, which is what a ``kill -9`` leaves on disk (the WAL holds
every committed transaction; nothing else survives). A second gateway then
starts on the copy. (tests/system/store/test_torture.py kills real processes.)

Each test stops a turn in one phase and checks that:

- every catalog event the live client had received is in the copy (events
  are held until committed, so a client never holds one the store lacks);
- the restarted gateway closed the turn with section 8's sequence for that
  phase and ``reason: "server_restart"``, stored the interrupted message as
  ``cancelled``, and left no message ``in_progress``;
- a client resuming with its last ``since`` ends in the same reduced state
  as one that attaches fresh with a snapshot;
- the session takes its next turn, with ids above every id issued before.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest
import trio

from gateway.protocol.events import CATALOG_TYPES, Event
from gateway.protocol.frames import SubscribeAck
from tests.conftest import Client, Harness, make_config, running_gateway, types

WORKERS = {"event_types": None, "actors": None, "include_worker_sessions": True}

SLOW_WORKER = '{"script": {"delay_ms": 20, "rounds": [[{"lorem": 500}]]}}'

SCENARIOS: dict[str, tuple[dict[str, Any], list[str], str]] = {
    # name: (script, the events after which the process "dies", in order; the phase it is in)
    "llm": (
        {"script": {"delay_ms": 2, "rounds": [[{"thinking": "hmm " * 5}, {"lorem": 400}]]}},
        ["text.delta", "text.delta"],
        "llm",
    ),
    "later-llm": (
        {
            "script": {
                "delay_ms": 2,
                "rounds": [
                    [{"tool_use": {"name": "sleep", "input": {"seconds": 0.01}}}],
                    [{"text": "and then " * 50}, {"tool_use": {"name": "sleep", "input": {}}}],
                ],
            }
        },
        ["tool.completed", "text.delta"],
        "llm",
    ),
    "tools": (
        {"script": {"rounds": [[{"tool_use": {"name": "sleep", "input": {"seconds": 60}}}]]}},
        ["tool.called"],
        "tools",
    ),
    "seam": (
        {"script": {"rounds": [[{"tool_use": {"name": "read_file", "input": {"path": "x"}}}]]}},
        ["permission.requested"],
        "seam",
    ),
    "delegate": (
        {
            "script": {
                "rounds": [[{"tool_use": {"name": "delegate", "input": {"task": SLOW_WORKER}}}]]
            }
        },
        ["delegate.started"],
        "tools",
    ),
}


def crash_copy(src: str, dst: str) -> None:
    """What a kill -9 at this instant would leave: every committed transaction."""
    source = sqlite3.connect(src)
    target = sqlite3.connect(dst)
    with target:
        source.backup(target)
    source.close()
    target.close()


def stored_events(path: str) -> dict[str, bytes]:
    conn = sqlite3.connect(path)
    rows = conn.execute("SELECT data FROM events").fetchall()
    conn.close()
    import json

    return {json.loads(data)["id"]: bytes(data) for (data,) in rows}


def comparable(state: dict[str, Any]) -> dict[str, Any]:
    """The reduced state, less the cursor (a snapshot's cut is not an event id of the stream)."""
    turn = state["turn"]
    # A snapshot's tool_result blocks carry no error_class; events do.
    results = {k: {**v, "error_class": None} for k, v in state["tool_results"].items()}
    return {
        "messages": state["messages"],
        "streaming": state["streaming"],
        "tool_results": results,
        "turn_in_flight": turn is not None and turn.get("status") == "in_flight",
    }


async def resume(gw: Harness, sid: str, since: str, live: Client) -> list[Event]:
    async with gw.client(sid) as resumed:
        resumed.reducer = live.reducer  # the same client, reconnected
        resumed.events = list(live.events)
        ack = await resumed.subscribe(filter=WORKERS, since=since)
        assert isinstance(ack, SubscribeAck), ack
        for _ in range(ack.replay_event_count):
            await resumed.recv()
        return resumed.events[len(live.events) :]


@pytest.mark.parametrize("name", list(SCENARIOS))
async def test_a_turn_cut_by_a_crash_is_closed_at_restart(tmp_path: Path, name: str) -> None:
    script, waits, phase = SCENARIOS[name]
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "x").write_text("x")
    live_db, crashed_db = str(tmp_path / "live.db"), str(tmp_path / "crashed.db")
    overrides = {
        "tools.enabled": ["sleep", "read_file", "delegate"],
        "tools.require_approval": ["read_file"],
        "sessions.allowed_workspaces": [str(workspace)],
    }
    with trio.fail_after(30):
        async with running_gateway(
            make_config(tmp_path, **{"store.path": live_db}, **overrides)
        ) as gw:
            sid = await gw.create_session(workspace_path=str(workspace))
            async with gw.client(sid) as live:
                await live.subscribe(filter=WORKERS)
                await gw.submit(sid, script)
                for wait in waits:
                    await live.until(lambda e, t=wait: e.type == t and e.session_id == sid)
                crash_copy(live_db, crashed_db)  # no await since: the gateway is where it was
                received = list(live.events)
                before_ids = gw.node.sequencer.last

    # Durable before delivered: every catalog event the client got is in the copy.
    stored = stored_events(crashed_db)
    for e in received:
        if e.type in CATALOG_TYPES:
            assert e.id in stored, f"{e.type} {e.id} was delivered but not committed"

    config = make_config(tmp_path, **{"store.path": crashed_db}, **overrides)
    async with running_gateway(config) as gw:
        with trio.fail_after(20):
            replay = await resume(gw, sid, received[-1].id, live)
            mine = [e for e in replay if e.session_id == sid]
            cancelled = mine[-1]
            assert cancelled.type == "turn.cancelled", types(mine)
            assert (cancelled.payload.reason, cancelled.payload.phase) == ("server_restart", phase)
            if phase == "llm":
                assert types(mine)[-3:] == ["message.complete", "llm.call_failed", "turn.cancelled"]
                assert mine[-3].payload.stop_reason == "cancelled"
            if name == "delegate":
                assert "delegate.failed" in types(mine)
                worker = [e for e in replay if e.session_id != sid]
                assert not worker or worker[-1].type in ("turn.cancelled", "turn.completed")
            # New ids are above every id issued before the crash.
            assert all(int(e.id[4:]) > before_ids for e in replay if e.id not in stored)

            async with gw.client(sid) as fresh:
                await fresh.subscribe(filter=WORKERS, snapshot=True)
                await fresh.recv()  # the snapshot
                assert comparable(fresh.reducer.state()) == comparable(live.reducer.state())
                assert live.reducer.streaming is None

            messages = (await gw.http.get(f"/sessions/{sid}/messages")).json()["messages"]
            assert all(m["status"] != "in_progress" for m in messages)
            if phase == "llm":
                assert messages[-1]["status"] == "cancelled" and messages[-1]["content"]

            # The session goes on.
            async with gw.client(sid) as again:
                await again.subscribe()
                await gw.submit(sid, "hello again")
                events = await again.until_turn_ends()
                assert events[-1].payload.stop_reason == "end_turn"
    conn = sqlite3.connect(crashed_db)
    statuses = [
        row[0]
        for row in conn.execute("SELECT json_extract(CAST(data AS TEXT), '$.status') FROM messages")
    ]
    open_turns = conn.execute("SELECT count(*) FROM sessions WHERE current_turn_id IS NOT NULL")
    assert "in_progress" not in statuses and open_turns.fetchone()[0] == 0
    conn.close()

"""Durable before delivered (docs/protocol.md §9), checked against the database file itself.

Every catalog event is committed before any client receives it, so no client
ever holds a catalog event the store lacks; streaming deltas behind a pending
catalog event wait with it (the order on the wire is unchanged); a session is
durable when ``POST /sessions`` answers; a snapshot shows nothing that is not
durable. Each test reads the SQLite file with a connection of its own at the
instant the client got what it got.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest
import trio

from gateway.protocol.events import CATALOG_TYPES
from gateway.protocol.frames import EventFrame, Snapshot
from tests.conftest import TOOL_SCRIPT, Harness, make_config, running_gateway, types


def committed_ids(path: str) -> set[str]:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        rows = conn.execute("SELECT json_extract(CAST(data AS TEXT), '$.id') FROM events")
        return {row[0] for row in rows}
    finally:
        conn.close()


async def test_every_catalog_event_is_committed_before_a_client_gets_it(tmp_path: Path) -> None:
    db = str(tmp_path / "gateway.db")
    async with running_gateway(make_config(tmp_path, **{"store.path": db})) as gw:
        sid = await gw.create_session()
        async with gw.client(sid) as client:
            await client.subscribe()
            await gw.submit(sid, TOOL_SCRIPT)
            checked = 0
            with trio.fail_after(10):
                while True:
                    frame = await client.recv()
                    if not isinstance(frame, EventFrame):
                        continue
                    event = frame.event
                    if event.type in CATALOG_TYPES:
                        # Read at once, before the gateway runs another step.
                        assert event.id in committed_ids(db), f"{event.type} not committed"
                        checked += 1
                    if event.type == "turn.completed":
                        break
    assert checked >= 8


async def test_a_stalled_store_holds_the_stream_and_loses_nothing(tmp_path: Path) -> None:
    """While commits stall, the session's live events wait, in order; then all arrive."""
    async with running_gateway(make_config(tmp_path)) as gw:
        sid = await gw.create_session()
        db: Any = gw.node.store._database()  # type: ignore[attr-defined]
        real_write = db.write
        gate = threading.Event()

        def stalled_write(batch: Any) -> None:
            gate.wait(10)
            real_write(batch)

        async with gw.client(sid) as client, gw.client(sid) as other:
            await client.subscribe()
            await other.subscribe()
            db.write = stalled_write
            async with trio.open_nursery() as nursery:
                # POST .../turns answers once the turn is durable: not yet.
                nursery.start_soon(gw.submit, sid, TOOL_SCRIPT)
                with trio.move_on_after(0.3):
                    await client.recv()
                    raise AssertionError("an event reached a client before its commit")
                gate.set()
            with trio.fail_after(10):
                events = await client.until_turn_ends()
                others = await other.until_turn_ends()
        assert types(events)[0] == "turn.started" and events[-1].type == "turn.completed"
        assert [e.id for e in events] == sorted(e.id for e in events)
        assert [e.id for e in events] == [e.id for e in others]


async def test_a_session_is_durable_when_post_sessions_answers(tmp_path: Path) -> None:
    db = str(tmp_path / "gateway.db")
    async with running_gateway(make_config(tmp_path, **{"store.path": db})) as gw:
        sid = await gw.create_session()
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        (n,) = conn.execute("SELECT count(*) FROM sessions WHERE id = ?", (sid,)).fetchone()
        conn.close()
        assert n == 1


async def test_a_snapshot_waits_for_the_commit_of_what_it_shows(gw: Harness) -> None:
    sid = await gw.create_session()
    async with gw.client(sid) as live:
        await live.subscribe()
        await gw.submit(sid, "hello")
        with trio.fail_after(10):
            await live.until_turn_ends()
    db: Any = gw.node.store._database()  # type: ignore[attr-defined]
    real_write = db.write
    gate = threading.Event()

    def stalled_write(batch: Any) -> None:
        gate.wait(10)
        real_write(batch)

    db.write = stalled_write
    gw.node.sessions[sid].add_message(gw.node.sessions[sid].messages[-1])  # a write pending
    async with gw.client(sid) as fresh:
        await fresh.send({"type": "subscribe", "filter": "preset:full", "snapshot": True})
        with trio.move_on_after(0.3):
            await fresh.recv()  # the ack goes with the snapshot
            raise AssertionError("a snapshot went out before its state was committed")
        gate.set()
        with trio.fail_after(10):
            await fresh.recv()  # the ack
            snap = await fresh.recv()
        assert isinstance(snap, Snapshot)


async def test_a_turn_is_durable_when_post_turns_answers(tmp_path: Path) -> None:
    db = str(tmp_path / "gateway.db")
    async with running_gateway(make_config(tmp_path, **{"store.path": db})) as gw:
        sid = await gw.create_session()
        turn_id = await gw.submit(sid, "remember me")
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        try:
            started = conn.execute(
                "SELECT count(*) FROM events WHERE session_id = ? AND type = 'turn.started'"
                " AND json_extract(CAST(data AS TEXT), '$.turn_id') = ?",
                (sid, turn_id),
            ).fetchone()[0]
            users = conn.execute(
                "SELECT count(*) FROM messages WHERE session_id = ?"
                " AND json_extract(CAST(data AS TEXT), '$.role') = 'user'",
                (sid,),
            ).fetchone()[0]
        finally:
            conn.close()
        assert (started, users) == (1, 1)


def stored_text(path: str, session_id: str) -> str | None:
    """The text of the session's stored assistant message, or None when none is stored."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        rows = conn.execute(
            "SELECT CAST(data AS TEXT) FROM messages WHERE session_id = ?", (session_id,)
        ).fetchall()
    finally:
        conn.close()
    for (data,) in rows:
        message = json.loads(data)
        message = message.get("message", message)
        if message.get("role") == "assistant":
            return "".join(b.get("text", "") for b in message["content"])
    return None


LONG_BLOCK = {"script": {"delay_ms": 20, "rounds": [[{"lorem": 400}]]}}
"""One text block that streams for about 8 s: what a kill in its middle can lose."""


@pytest.mark.slow  # over a second on two cores (measured with --durations)
@pytest.mark.parametrize("checkpoint_ms", [100, 0])
async def test_a_streaming_block_is_stored_every_checkpoint(
    tmp_path: Path, checkpoint_ms: int
) -> None:
    """``[store] checkpoint_ms``: the text of a block still streaming is stored that often.

    So a kill -9 loses at most the text of the last checkpoint's interval
    (docs/operating.md "Reliability"; bench/crash_loss.py measures it); with 0, only what
    blocks that ended held.
    """
    db = str(tmp_path / "gateway.db")
    config = make_config(tmp_path, **{"store.path": db, "store.checkpoint_ms": checkpoint_ms})
    async with running_gateway(config) as gw:
        sid = await gw.create_session()
        async with gw.client(sid) as client:
            await client.subscribe()
            await gw.submit(sid, LONG_BLOCK)
            shown = ""
            with trio.fail_after(10):
                while len(shown.split()) < 60:  # over a second of streaming
                    frame = await client.recv()
                    if isinstance(frame, EventFrame) and frame.event.type == "text.delta":
                        shown += frame.event.payload.text  # type: ignore[union-attr]
            kept = stored_text(db, sid)
            assert "text.end" not in types(client.events)  # the block still streams
            assert kept is not None and shown.startswith(kept)
            if checkpoint_ms:
                assert len(kept.split()) >= 20, (kept, shown)
            else:
                assert kept == ""

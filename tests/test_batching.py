"""Batches grow with load, and only with load (gateway.session.session, the translator task).

A recording subscriber sits on a real session's hub (the fan-out's own
interface), so each published batch is seen exactly as the clients' fan-out
gets it. Virtual time (``autojump_clock``) paces the scripted model.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio
import trio.testing

from gateway.ids import new_message_id, new_turn_id, now_ms
from gateway.node import Node
from gateway.protocol.filters import resolve_filter
from gateway.protocol.shapes import Message, TextBlock
from gateway.providers.scripted import ScriptedProvider
from gateway.session.hub import FrameBatch
from gateway.session.session import Session
from gateway.store.sqlite import SqliteStore
from gateway.tools.builtin import build_registry
from tests.conftest import make_config


class Recorder:
    """A subscriber that keeps the event types of every batch it is handed."""

    name = "recorder"

    def __init__(self) -> None:
        self.batches: list[list[str]] = []
        self.ended = trio.Event()

    def deliver(self, batch: FrameBatch, now: float) -> bool:
        types = [_event(frame)["type"] for frame in batch.frames]
        self.batches.append(types)
        if "turn.completed" in types:
            self.ended.set()
        return True

    def overflowed(self) -> None:  # pragma: no cover - never overflows
        raise AssertionError("a recorder never overflows")

    def deltas_per_batch(self) -> list[int]:
        return [b.count("text.delta") for b in self.batches if "text.delta" in b]


def _event(frame: bytes) -> dict[str, Any]:
    """The event inside one unmasked server text frame (RFC 6455 section 5.2)."""
    size = frame[1] & 0x7F
    head = 2 if size < 126 else 4 if size == 126 else 10
    event: dict[str, Any] = json.loads(frame[head:])["event"]
    return event


@asynccontextmanager
async def recorded_session(
    tmp_path: Path, **overrides: Any
) -> AsyncIterator[tuple[Session, Recorder]]:
    node = Node(
        make_config(tmp_path, **overrides),
        SqliteStore(str(tmp_path / "gateway.db"), inline=True),
        ScriptedProvider(),
        build_registry([]),
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(node.run)
        session = await node.create_session(workspace_path=str(tmp_path))
        recorder = Recorder()
        session.hub.subscribe(recorder, resolve_filter("preset:chat")[1])
        yield session, recorder
        node.stop()


def lorem_turn(session: Session, words: int, delay_ms: float) -> None:
    script = {"script": {"delay_ms": delay_ms, "rounds": [[{"lorem": words}]]}}
    message = Message(
        new_message_id(), session.id, new_turn_id(), "user",
        [TextBlock(json.dumps(script))], "complete", now_ms(),
    )  # fmt: skip
    session.submit_turn(message)


async def test_a_stream_faster_than_the_window_is_fanned_out_in_batches(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with recorded_session(tmp_path) as (session, rec):
        lorem_turn(session, 300, delay_ms=0)
        await rec.ended.wait()
    deltas = rec.deltas_per_batch()
    assert sum(deltas) == 300  # every delta, exactly once
    assert max(deltas) > 1  # the provider outran the fan-out: batches grew
    assert len(deltas) < 300


async def test_a_stream_slower_than_the_window_goes_out_event_by_event(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    # 10 ms between deltas, a 2 ms window: waiting could gather nothing more
    async with recorded_session(tmp_path, **{"stream.batch_window_ms": 2.0}) as (session, rec):
        lorem_turn(session, 50, delay_ms=10)
        await rec.ended.wait()
    assert rec.deltas_per_batch() == [1] * 50


async def test_a_zero_window_never_waits_for_a_batch(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with recorded_session(tmp_path, **{"stream.batch_window_ms": 0}) as (session, rec):
        lorem_turn(session, 100, delay_ms=0)
        with trio.fail_after(5):  # virtual: only a wait that never ends trips it
            await rec.ended.wait()
    assert sum(rec.deltas_per_batch()) == 100

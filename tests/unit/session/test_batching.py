"""Batches grow with load, and only with load (gateway.session.call, the translator task).

A recording subscriber sits on a real session's hub (the fan-out's own
interface), so each published batch is seen exactly as the clients' fan-out
gets it, with the trio time it was handed over. It can stand for a client
whose writer takes a while to drain: it counts each batch in the session's
:class:`~gateway.session.hub.Backlog` and takes it back after ``drain_after``
seconds (``None``: never). Virtual time (``autojump_clock``) paces the
scripted model.
"""

from __future__ import annotations

import itertools
import json
import statistics
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
from gateway.session.hub import Backlog, FrameBatch
from gateway.session.session import Session
from gateway.store.sqlite.store import SqliteStore
from gateway.tools.builtin import build_registry
from tests.conftest import make_config


class Recorder:
    """A subscriber that keeps the event types of every batch it is handed, and when."""

    name = "recorder"

    def __init__(self, backlog: Backlog, nursery: trio.Nursery) -> None:
        self.batches: list[list[str]] = []
        self.times: list[float] = []
        self.ended = trio.Event()
        self.backlog = backlog
        self.nursery = nursery
        self.writer: float | None = 0.0  # stands for a writer: None, never drains

    def deliver(self, batch: FrameBatch, now: float) -> bool:
        types = [_event(e.frame)["type"] for e in batch.events]
        self.batches.append(types)
        self.times.append(trio.current_time())
        if "turn.completed" in types:
            self.ended.set()
        if self.writer != 0.0:
            self.backlog.add(batch.n)
            if self.writer is not None:
                self.nursery.start_soon(self._drain, batch.n, self.writer)
        return True

    async def _drain(self, n: int, after: float) -> None:
        await trio.sleep(after)
        self.backlog.take(n)

    async def wait_ended(self) -> None:
        """Until ``turn.completed`` was delivered (virtual time: fails at once if never)."""
        with trio.fail_after(600):
            await self.ended.wait()

    def overflowed(self) -> None:  # pragma: no cover - never overflows
        raise AssertionError("a recorder never overflows")

    def deltas_per_batch(self) -> list[int]:
        return [b.count("text.delta") for b in self.batches if "text.delta" in b]

    def delta_gaps(self) -> list[float]:
        """The trio time between consecutive batches of text deltas."""
        times = [t for t, b in zip(self.times, self.batches, strict=True) if "text.delta" in b]
        return [b - a for a, b in itertools.pairwise(times)]


def _event(frame: bytes) -> dict[str, Any]:
    """The event inside one unmasked server text frame (RFC 6455 section 5.2)."""
    size = frame[1] & 0x7F
    head = 2 if size < 126 else 4 if size == 126 else 10
    event: dict[str, Any] = json.loads(frame[head:])["event"]
    return event


@asynccontextmanager
async def recorded_session(
    tmp_path: Path, writer: float | None = 0.0, **overrides: Any
) -> AsyncIterator[tuple[Session, Recorder]]:
    node = Node(
        make_config(tmp_path, **overrides),
        SqliteStore(str(tmp_path / "gateway.db"), inline=True),
        ScriptedProvider(),
        build_registry([]),
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(node.run)
        session = await node.create_session()
        recorder = Recorder(session.hub.backlog, nursery)
        recorder.writer = writer
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
        await rec.wait_ended()
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
        await rec.wait_ended()
    assert rec.deltas_per_batch() == [1] * 50


async def test_the_translator_waits_for_the_writers_not_for_the_window(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """A writer that drains in 0.5 ms: each next batch goes out as it has, not at 2 ms.

    The model streams a delta every 0.2 ms (faster than the 2 ms window).
    """
    async with recorded_session(tmp_path, writer=0.0005) as (session, rec):
        lorem_turn(session, 300, delay_ms=0.2)
        await rec.wait_ended()
    deltas = rec.deltas_per_batch()
    assert sum(deltas) == 300
    assert max(deltas) > 1
    gaps = rec.delta_gaps()
    assert max(gaps) < 0.001, gaps  # never the window
    assert abs(statistics.median(gaps) - 0.0005) < 1e-6, gaps  # the writer's pace


async def test_a_writer_that_never_drains_holds_each_batch_at_most_the_window(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """The window bounds the wait: a stuck client costs the others 2 ms a batch, no more."""
    async with recorded_session(tmp_path, writer=None) as (session, rec):
        lorem_turn(session, 300, delay_ms=0.2)
        await rec.wait_ended()
    deltas = rec.deltas_per_batch()
    assert sum(deltas) == 300
    assert max(deltas) > 1
    gaps = rec.delta_gaps()
    # Never more than the window from the wake-up that follows a batch (a
    # delta every 0.2 ms), and mostly all of it. (The call's last batch is
    # settled by the agent loop at once, the first ones leave with a commit.)
    assert max(gaps) < 0.0022 + 1e-6, gaps
    assert statistics.median(gaps) > 0.002 - 1e-6, gaps


async def test_a_zero_window_never_waits_for_a_batch(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """With batching off, a writer that never drains holds nothing: no batch waits at all."""
    async with recorded_session(tmp_path, writer=None, **{"stream.batch_window_ms": 0}) as (
        session,
        rec,
    ):
        lorem_turn(session, 100, delay_ms=0)
        with trio.fail_after(5):  # virtual: only a wait that never ends trips it
            await rec.wait_ended()
    assert sum(rec.deltas_per_batch()) == 100
    # delay_ms=0: the whole stream takes no virtual time unless a batch waits
    assert rec.times[-1] - rec.times[0] == 0.0, rec.delta_gaps()


async def test_the_backlog_signal(autojump_clock: trio.testing.MockClock) -> None:
    """Drained at once when nothing is queued; else once every writer (here, up) took its share."""
    parent = Backlog()
    child = Backlog(parent)
    start = trio.current_time()
    await child.drained()
    assert trio.current_time() == start
    child.add(3)
    parent.add(1)

    async def take_later() -> None:
        await trio.sleep(1)
        child.take(2)
        await trio.sleep(1)
        child.take(1)  # the child has drained; the parent has not
        await trio.sleep(1)
        parent.take(1)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(take_later)
        await child.drained()
    assert trio.current_time() - start == 3
    assert child.events == parent.events == 0

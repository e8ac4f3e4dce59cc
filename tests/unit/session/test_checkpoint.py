"""``[store] checkpoint_ms``: when the streaming message is stored (docs/protocol.md §9).

The call's translator task (:class:`gateway.session.call.CallStream`) driven
with raw provider events under Trio's MockClock, against a host that records
each ``keep_partial``: the message is stored at ``message.start``, then at
most ``checkpoint_s`` after it changed, even when the provider goes quiet,
and never more often than that however many blocks end.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterable

import pytest
import trio
import trio.testing

from gateway.protocol.events import Payload, StreamEvent
from gateway.protocol.shapes import Message, TextBlock
from gateway.providers.raw import (
    RawContentBlockDelta,
    RawContentBlockStart,
    RawContentBlockStop,
    RawMessage,
    RawMessageStart,
    RawTextBlock,
    RawTextDelta,
)
from gateway.session.call import Call, CallStream, Completion
from gateway.session.checkpoints import Checkpoints
from gateway.session.hub import Backlog, Emitted
from gateway.translate import Translator


class Host:
    """A session that emits nothing anywhere and records what was stored, and when."""

    id = "sess_checkpoint"

    def __init__(self) -> None:
        self.kept: list[tuple[float, str]] = []  # (time, the message's text)
        self.seq = 0

    def emit(self, payloads: Iterable[Payload | StreamEvent], turn_id: str | None) -> list[Emitted]:
        out = []
        for p in payloads:
            self.seq += 1
            out.append(Emitted(self.seq, "x", "llm", self.id, turn_id, 0, b"", b""))
            del p
        return out

    def add_message(self, message: Message, completion: Completion | None = None) -> None:
        pass

    def keep_partial(self, message: Message) -> None:
        text = "".join(b.text for b in message.content if isinstance(b, TextBlock))
        self.kept.append((trio.current_time(), text))

    def failed(self, component: str, exc: BaseException, turn_id: str | None = None) -> None:
        raise AssertionError(f"{component} failed: {exc!r}")


def start(host: Host, checkpoints: Checkpoints | None) -> tuple[CallStream, Call]:
    calls = CallStream(host, Backlog(), 0.0, None, checkpoints)
    translator = Translator(session_id=host.id, turn_id="turn_1", model="m", created_at=0)
    call = Call("turn_1", translator)
    calls.start(call)
    return calls, call


async def test_the_message_is_stored_at_start_then_within_the_checkpoint_of_a_change(
    autojump_clock: trio.testing.MockClock,
) -> None:
    host = Host()
    checkpoints = Checkpoints(1.0)
    calls, _ = start(host, checkpoints)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(checkpoints.run)
        nursery.start_soon(calls.run)
        await calls.feed(RawMessageStart(RawMessage("msg_1", "m")))
        await calls.feed(RawContentBlockStart(0, RawTextBlock("")))
        await trio.sleep(0.01)
        assert host.kept == [(0.0, "")]  # message.start
        await calls.feed(RawContentBlockDelta(0, RawTextDelta("one ")))
        await trio.sleep(0.2)
        await calls.feed(RawContentBlockDelta(0, RawTextDelta("two")))
        # Then the provider goes quiet for a minute: the change is stored anyway,
        # a period after the first change not stored (t = 0.01), not at the next delta.
        await trio.sleep(60)
        assert host.kept[1:] == [(pytest.approx(1.01), "one two")]
        nursery.cancel_scope.cancel()


async def test_many_blocks_ending_are_stored_once_a_checkpoint(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A message of 1,000 blocks is not stored 1,000 times (each store snapshots it whole)."""
    host = Host()
    checkpoints = Checkpoints(1.0)
    calls, _ = start(host, checkpoints)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(checkpoints.run)
        nursery.start_soon(calls.run)
        await calls.feed(RawMessageStart(RawMessage("msg_1", "m")))
        for index in range(1000):  # 10 s of blocks, one every 10 ms
            await calls.feed(RawContentBlockStart(index, RawTextBlock("")))
            await calls.feed(RawContentBlockDelta(index, RawTextDelta("x")))
            await calls.feed(RawContentBlockStop(index))
            await trio.sleep(0.01)
        await trio.sleep(5)
        # An emission in the last tenth of the period stores (it is awake anyway):
        # a store every 0.9 s at the closest, never more often.
        assert 11 <= len(host.kept) <= 13, len(host.kept)
        assert host.kept[-1][1] == "x" * 1000
        gaps = [b[0] - a[0] for a, b in zip(host.kept[1:], host.kept[2:], strict=False)]
        assert min(gaps) >= 0.9 - 1e-9
        nursery.cancel_scope.cancel()


async def test_without_a_checkpoint_each_block_end_is_stored(
    autojump_clock: trio.testing.MockClock,
) -> None:
    host = Host()
    calls, _ = start(host, None)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(calls.run)
        await calls.feed(RawMessageStart(RawMessage("msg_1", "m")))
        for index in range(3):
            await calls.feed(RawContentBlockStart(index, RawTextBlock("")))
            await calls.feed(RawContentBlockDelta(index, RawTextDelta("y")))
            await trio.sleep(5)
            await calls.feed(RawContentBlockStop(index))
            await trio.sleep(0.01)
        assert [text for _, text in host.kept] == ["y", "y", "yy", "yyy"]  # start, 3 ends
        nursery.cancel_scope.cancel()


async def test_every_marked_session_is_stored_in_one_step_so_they_share_a_commit(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Two sessions that changed 0.1 s apart are stored at the same instant.

    The first change not stored sets the node's due time (that change plus
    ``checkpoint_s``); every message marked by then is stored in the same step
    and lands in one group commit (docs/performance.md "The checkpoint's cost
    (issue 36)"), each at most ``checkpoint_s`` after its change.
    """
    hosts = [Host(), Host()]
    checkpoints = Checkpoints(1.0)
    streams = [start(host, checkpoints)[0] for host in hosts]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(checkpoints.run)
        for calls in streams:  # their messages start 0.3 s apart
            nursery.start_soon(calls.run)
            await calls.feed(RawMessageStart(RawMessage("msg_1", "m")))
            await calls.feed(RawContentBlockStart(0, RawTextBlock("")))
            await trio.sleep(0.3)
        await trio.sleep(0.1)  # t = 0.7
        await streams[0].feed(RawContentBlockDelta(0, RawTextDelta("a")))
        await trio.sleep(0.1)  # t = 0.8
        await streams[1].feed(RawContentBlockDelta(0, RawTextDelta("b")))
        await trio.sleep(0.8)  # t = 1.6: neither is due yet
        assert [len(host.kept) for host in hosts] == [1, 1]
        await trio.sleep(0.2)
        assert hosts[0].kept[1:] == [(pytest.approx(1.7), "a")]
        assert hosts[1].kept[1:] == [(pytest.approx(1.7), "b")]
        await streams[1].feed(RawContentBlockDelta(0, RawTextDelta("c")))  # t = 1.8
        await trio.sleep(1.5)
        assert hosts[1].kept[2:] == [(pytest.approx(2.8), "bc")]
        assert len(hosts[0].kept) == 2  # unchanged since: not stored again
        nursery.cancel_scope.cancel()


class Marked:
    """A keeper that records when it was told to keep."""

    def __init__(self, log: list[tuple[float, int]], n: int) -> None:
        self.log, self.n = log, n

    def keep_due(self) -> None:
        self.log.append((trio.current_time(), self.n))


async def test_the_node_stores_every_marked_message_in_one_step_and_idles_unmarked(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """gateway.session.checkpoints: one step a period after the first mark for every
    mark, each once however often it was marked, and nothing while nothing is marked."""
    log: list[tuple[float, int]] = []
    keepers = [Marked(log, n) for n in range(100)]
    checkpoints = Checkpoints(0.5)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(checkpoints.run)
        for keeper in keepers:  # marked over 0.3 s, some twice
            checkpoints.mark(keeper)
            checkpoints.mark(keepers[0])
            await trio.sleep(0.003)
        await trio.sleep(0.3)
        assert log == [(0.5, n) for n in range(100)]
        await trio.sleep(60)
        assert len(log) == 100  # nothing marked since: no tick
        checkpoints.mark(keepers[7])  # t = 60.6
        await trio.sleep(1)
        assert log[100:] == [(pytest.approx(61.1), 7)]
        nursery.cancel_scope.cancel()


async def test_an_emission_near_the_due_time_stores_and_the_node_does_not_wake_for_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """:meth:`Checkpoints.ride`: the node is awake for an emission anyway; one in the last
    tenth of the period stores everything marked, and the node's task then sleeps on."""
    log: list[tuple[float, int]] = []
    checkpoints = Checkpoints(1.0)
    steps = Steps("checkpoints")
    trio.lowlevel.add_instrument(steps)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(checkpoints.run, name="checkpoints")
        await trio.sleep(0.01)
        checkpoints.mark(Marked(log, 1))  # due at 1.01
        await trio.sleep(0.5)
        checkpoints.ride()  # too early: nothing
        assert log == []
        await trio.sleep(0.45)
        checkpoints.mark(Marked(log, 2))
        checkpoints.ride()  # t = 0.96: both
        assert log == [(pytest.approx(0.96), 1), (pytest.approx(0.96), 2)]
        await trio.sleep(30)
        assert log[2:] == [] and checkpoints.due == float("inf")
        nursery.cancel_scope.cancel()
    trio.lowlevel.remove_instrument(steps)
    assert steps.count == 2  # its start, its cancellation: it never woke in between


class Steps(trio.abc.Instrument):
    """Counts the steps of the task named ``name``."""

    def __init__(self, name: str) -> None:
        self.name, self.count = name, 0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self.count += task.name == self.name


async def test_every_change_is_stored_within_the_period_however_emissions_fall(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The bound (docs/protocol.md §9 "Crashes and restarts") under random marks and
    emissions: a change is stored at most ``checkpoint_s`` after it was marked."""
    rng = random.Random(36)
    stores: list[float] = []
    marks: list[float] = []

    class Keeper:
        def keep_due(self) -> None:
            stores.append(trio.current_time())

    keeper = Keeper()
    checkpoints = Checkpoints(0.5)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(checkpoints.run)
        for _ in range(2000):
            await trio.sleep(rng.expovariate(1 / 0.07))
            if rng.random() < 0.5:
                marks.append(trio.current_time())
                checkpoints.mark(keeper)
            checkpoints.ride()
        await trio.sleep(1)
        nursery.cancel_scope.cancel()
    for at in marks:
        stored = min(t for t in stores if t >= at)
        assert stored - at <= 0.5 + 1e-9
    gaps = [b - a for a, b in itertools.pairwise(stores)]
    assert min(gaps) >= 0.45 - 1e-9  # never more often than 0.9 of the period

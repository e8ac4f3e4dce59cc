"""``[store] checkpoint_ms``: when the streaming message is stored (docs/protocol.md §9).

The call's translator task (:class:`gateway.session.call.CallStream`) driven
with raw provider events under Trio's MockClock, against a host that records
each ``keep_partial``: the message is stored at ``message.start``, then at
most ``checkpoint_s`` after it changed, even when the provider goes quiet,
and never more often than that however many blocks end.
"""

from __future__ import annotations

from collections.abc import Iterable

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
        # a checkpoint after the last store, not at the next delta.
        await trio.sleep(60)
        assert host.kept[1:] == [(1.0, "one two")]
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
        assert 10 <= len(host.kept) <= 12, len(host.kept)
        assert host.kept[-1][1] == "x" * 1000
        gaps = [b[0] - a[0] for a, b in zip(host.kept[1:], host.kept[2:], strict=False)]
        assert min(gaps) >= 1.0
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


async def test_every_session_checkpoints_on_one_grid_so_they_share_a_commit(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Two sessions whose messages started 0.3 s apart are stored at the same instant.

    The checkpoint is the next multiple of ``checkpoint_s`` on the Trio clock,
    shared by every session of a node: their stores are enqueued in one step
    and land in one group commit (docs/performance.md "The checkpoint's cost
    (issue 36)"), each still at most ``checkpoint_s`` after its change.
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
        await trio.sleep(0.1)  # t = 0.9: neither is due yet
        assert [len(host.kept) for host in hosts] == [1, 1]
        await trio.sleep(0.2)
        assert hosts[0].kept[1:] == [(1.0, "a")]
        assert hosts[1].kept[1:] == [(1.0, "b")]
        await streams[1].feed(RawContentBlockDelta(0, RawTextDelta("c")))
        await trio.sleep(1.5)
        assert hosts[1].kept[2:] == [(2.0, "bc")]  # t = 1.1 + 0.9
        assert len(hosts[0].kept) == 2  # unchanged since: not stored again
        nursery.cancel_scope.cancel()


class Marked:
    """A keeper that records when it was told to keep."""

    def __init__(self, log: list[tuple[float, int]], n: int) -> None:
        self.log, self.n = log, n

    def keep_due(self) -> None:
        self.log.append((trio.current_time(), self.n))


async def test_the_node_stores_every_marked_message_in_one_step_a_tick_and_idles_unmarked(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The ticker (gateway.session.checkpoints): one step a tick for every mark, each
    once however often it was marked, and nothing while nothing is marked."""
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
        checkpoints.mark(keepers[7])
        await trio.sleep(1)
        assert log[100:] == [(61.0, 7)]
        nursery.cancel_scope.cancel()

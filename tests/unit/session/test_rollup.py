"""The delta rollup, sans-IO, and its wiring into the hub and the seam (docs/protocol.md §3
"Delta rollup"): consecutive deltas of one block within a window become one delta, the
text joined and the last part's envelope; anything else flushes first; a rolled-up delta
straddling a cut is rolled up again from its parts above it."""

from __future__ import annotations

import math
import random
from collections.abc import Callable

import msgspec
import trio
import trio.testing

from gateway.client.codec import decode_server_frame
from gateway.protocol.events import (
    Payload,
    TextDelta,
    TextEnd,
    TextStart,
    ThinkingDelta,
    ToolUseInputDelta,
)
from gateway.protocol.filters import resolve_filter
from gateway.protocol.frames import EventFrame
from gateway.session.hub import Emitted, FrameBatch, Hub
from gateway.session.rollup import Rollup, RollupClock, join
from gateway.session.seam import past_cut
from gateway.session.session import emitted

M = "msg_1"


class Stream:
    """Events with consecutive ids, as a session emits them."""

    def __init__(self) -> None:
        self.seq = 0

    def __call__(self, payload: Payload, session: str = "sess_1") -> Emitted:
        self.seq += 1
        return emitted(self.seq, payload, session, "turn_1", 1000 + self.seq)[0]


def payload(em: Emitted) -> dict[str, object]:
    frame = decode_server_frame(em.frame[2:] if em.frame[1] < 126 else em.frame[4:])
    assert isinstance(frame, EventFrame)
    out: dict[str, object] = msgspec.json.decode(em.data)
    assert frame.event.id == out["id"]  # the frame is the data's, spliced
    return out


def text(em: Emitted) -> str:
    body = payload(em)["payload"]
    assert isinstance(body, dict)
    return str(body.get("text", body.get("partial_json")))


def test_deltas_of_one_block_become_one_with_the_last_envelope() -> None:
    s, r = Stream(), Rollup(0.04)
    start = s(TextStart(M, 0))
    deltas = [s(TextDelta(M, 0, w)) for w in ("Hel", "lo", " wor", "ld")]
    end = s(TextEnd(M, 0))
    assert r.feed([start, deltas[0]], 0.0) == [start]  # the delta is held
    assert (r.closes_at, r.deadline) == (0.04, 0.06)  # the clock waits half a window more
    assert r.feed(deltas[1:3], 0.01) == []
    assert r.feed([deltas[3]], 0.02) == []
    out = r.feed([end], 0.03)  # another event sends what is held first
    assert [e.type for e in out] == ["text.delta", "text.end"]
    rolled = out[0]
    assert text(rolled) == "Hello world"
    assert (rolled.seq, rolled.ts) == (deltas[3].seq, deltas[3].ts)
    assert payload(rolled)["id"] == payload(deltas[3])["id"]
    assert rolled.parts == tuple(deltas)
    assert r.deadline == r.closes_at == math.inf and not r.held


def test_the_window_ends_with_or_without_an_event_behind_it() -> None:
    s, r = Stream(), Rollup(0.04)
    a, b, c = (s(TextDelta(M, 0, x)) for x in "abc")
    assert r.feed([a], 1.0) == []
    assert r.due(1.039) is None
    rolled = r.due(1.04)
    assert rolled is not None and text(rolled) == "a"
    assert rolled is a  # one part: the same bytes, not re-encoded
    assert r.feed([b], 2.0) == []
    out = r.feed([c], 2.05)  # past the window: c joins, and all goes out
    assert [text(e) for e in out] == ["bc"]


def test_the_delta_that_comes_after_the_window_closes_it_and_goes_with_it() -> None:
    """50 tokens/s under 40 ms: tokens at 0, 20 and 40 ms (a little late, as a model's
    are) go out as one, when the third comes; one frame every third token."""
    s, r = Stream(), Rollup(0.04)
    out: list[Emitted] = []
    for i in range(30):
        now = i * 0.02 + 0.0005 * (i % 3)  # a sleeping model wakes a little late
        out += r.feed([s(TextDelta(M, 0, f"{i} "))], now)
        if (due := r.due(now + 0.001)) is not None:  # the clock is not due before the next
            out.append(due)
    assert [len(e.parts) for e in out] == [3] * 10
    assert "".join(text(e) for e in out) == "".join(f"{i} " for i in range(30))


def test_a_delta_of_another_block_flushes_the_held_one() -> None:
    s, r = Stream(), Rollup(0.1)
    think = [s(ThinkingDelta(M, 0, "hm", None)), s(ThinkingDelta(M, 0, "m", "sig"))]
    tool = [s(ToolUseInputDelta(M, 1, "tu_1", '{"a"')), s(ToolUseInputDelta(M, 1, "tu_1", ":1}"))]
    other_session = s(TextDelta(M, 2, "x"), session="sess_w")
    mine = s(TextDelta(M, 2, "y"))
    out = r.feed([*think, *tool, other_session, mine], 0.0)
    assert [(e.type, text(e)) for e in out] == [
        ("thinking.delta", "hmm"),
        ("tool.use_input_delta", '{"a":1}'),
        ("text.delta", "x"),
    ]
    body = payload(out[0])["payload"]
    assert isinstance(body, dict) and body["signature"] == "sig"
    assert [e.seq for e in r.held] == [mine.seq]


def test_a_client_resumes_exactly_from_any_rolled_up_id() -> None:
    """Whatever the batches and the clock, the text up to a rolled-up event's id is the
    text of every delta up to that id: ``since`` resumes exactly."""
    rng = random.Random(36)
    for _ in range(50):
        s, r = Stream(), Rollup(rng.choice([0.01, 0.04, 0.25]))
        events = [s(TextStart(M, 0))]
        events += [s(TextDelta(M, 0, f"t{i} ")) for i in range(rng.randrange(1, 60))]
        events.append(s(TextEnd(M, 0)))
        upto = {
            e.seq: "".join(text(d) for d in events[1 : i + 1] if d.type == "text.delta")
            for i, e in enumerate(events)
        }
        out, now, i = [], 0.0, 0
        while i < len(events):
            n = rng.randrange(1, 4)
            now += rng.random() * 0.03
            out += r.feed(events[i : i + n], now)
            if (due := r.due(now + rng.random() * 0.02)) is not None:
                out.append(due)
            i += n
        assert not r.held
        seen = ""
        for em in out:
            if em.type == "text.delta":
                seen += text(em)
                assert seen == upto[em.seq]
        assert seen == upto[events[-1].seq]
        assert [e.seq for e in out] == sorted(e.seq for e in out)


class Sink:
    def __init__(self, name: str) -> None:
        self.name = name
        self.batches: list[FrameBatch] = []

    def deliver(self, batch: FrameBatch, now: float) -> bool:
        self.batches.append(batch)
        return True

    def deliver_short(self, batch: FrameBatch, sent: int, now: float) -> bool:
        return True

    def overflowed(self) -> None:
        raise AssertionError("no overflow here")

    def request_close(self, code: str) -> None:
        raise AssertionError("no close here")


class FakeTimer:
    def __init__(self) -> None:
        self.calls: list[tuple[float, Callable[[float], None]]] = []
        self.cancelled: list[int] = []  # indexes in calls

    def at(self, deadline: float, call: Callable[[float], None], /) -> object:
        self.calls.append((deadline, call))
        return len(self.calls) - 1

    def cancel(self, handle: object, /) -> None:
        assert isinstance(handle, int)
        self.cancelled.append(handle)


class CountingClock(RollupClock):
    """The node's clock, its wake-ups counted (each one a ``fire``)."""

    def __init__(self) -> None:
        super().__init__()
        self.wakes: list[float] = []

    def fire(self, now: float) -> None:
        self.wakes.append(now)
        super().fire(now)


def test_the_hub_groups_by_filter_and_window_and_shares_the_rolled_up_bytes() -> None:
    timer = FakeTimer()
    hub = Hub(rollup=Rollup, timer=timer)
    _, chat = resolve_filter("preset:chat")
    a, b, c = Sink("a"), Sink("b"), Sink("c")
    hub.subscribe(a, chat, 40)
    hub.subscribe(b, chat, 40)
    hub.subscribe(c, chat)  # no window: every delta as it comes
    s = Stream()
    d1, d2, d3 = (s(TextDelta(M, 0, x)) for x in "xyz")
    assert hub.publish([d1], 0.0) == []
    assert hub.publish([d2], 0.01) == []
    assert [e.seq for bt in c.batches for e in bt.events] == [1, 2]
    assert a.batches == [] and [round(d, 3) for d, _ in timer.calls] == [0.06]  # one per window
    timer.calls[0][1](0.06)  # nothing came after the window: the clock sends it
    assert a.batches[0] is b.batches[0]  # built once for the group
    (rolled,) = a.batches[0].events
    assert text(rolled) == "xy" and rolled.seq == 2
    hub.publish([d3], 0.07)
    assert [round(d, 3) for d, _ in timer.calls] == [0.06, 0.13]
    timer.calls[0][1](0.2)  # the first window's timer again: stale, it sends nothing
    assert len(a.batches) == 1
    hub.unsubscribe(a)
    assert timer.cancelled == []
    hub.unsubscribe(b)
    assert timer.cancelled == [1]  # a group gone: its timer cancelled
    timer.calls[1][1](0.13)  # (and were it called anyway, it sends nothing)
    assert len(a.batches) == len(b.batches) == 1


def test_a_window_an_event_closes_cancels_its_timer() -> None:
    timer = FakeTimer()
    hub = Hub(rollup=Rollup, timer=timer)
    _, chat = resolve_filter("preset:chat")
    a = Sink("a")
    hub.subscribe(a, chat, 40)
    s = Stream()
    hub.publish([s(TextDelta(M, 0, "x"))], 0.0)
    hub.publish([s(TextDelta(M, 0, "y"))], 0.02)
    assert timer.cancelled == [] and a.batches == []
    hub.publish([s(TextDelta(M, 0, "z"))], 0.04)  # at the window's end: it closes it
    assert [text(e) for bt in a.batches for e in bt.events] == ["xyz"]
    assert timer.cancelled == [0]  # the clock need not wake at 0.06 for nothing
    hub.publish([s(TextDelta(M, 0, "w"))], 0.06)  # a new window, a new timer
    assert [round(d, 3) for d, _ in timer.calls] == [0.06, 0.12] and timer.cancelled == [0]


def test_a_hub_without_a_timer_rolls_nothing_up() -> None:
    hub = Hub()
    _, chat = resolve_filter("preset:chat")
    a = Sink("a")
    hub.subscribe(a, chat, 40)
    s = Stream()
    hub.publish([s(TextDelta(M, 0, "x"))], 0.0)
    assert len(a.batches) == 1


def test_a_rolled_up_delta_straddling_the_cut_keeps_only_its_parts_above_it() -> None:
    s = Stream()
    deltas = [s(TextDelta(M, 0, x)) for x in "abcd"]
    rolled = join(deltas)
    end = s(TextEnd(M, 0))
    batch = FrameBatch([rolled, end])
    assert past_cut(batch, 0) is batch
    cut = past_cut(batch, 2)  # a snapshot covered a and b
    assert cut is not None
    assert [text(cut.events[0]), cut.events[0].seq, cut.events[1].seq] == ["cd", 4, 5]
    only_end = past_cut(batch, 4)
    assert only_end is not None and [e.seq for e in only_end.events] == [5]
    assert past_cut(batch, 5) is None


async def test_the_clock_calls_back_at_each_deadline(
    autojump_clock: trio.testing.MockClock,
) -> None:
    clock = CountingClock()
    fired: list[tuple[str, float]] = []

    def call(name: str) -> Callable[[float], None]:
        return lambda now: fired.append((name, round(now - start, 3)))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(clock.run)
        start = trio.current_time()
        clock.at(start + 0.2, call("late"))
        await trio.sleep(0.01)
        clock.at(start + 0.05, call("early"))  # an earlier deadline: the clock's sleep shortened
        clock.at(start + 0.05, lambda now: 1 / 0)  # a failing call is logged, not raised
        cancelled = clock.at(start + 0.03, call("cancelled"))
        clock.cancel(cancelled)  # its deadline dropped: no wake-up at 0.03
        clock.cancel(cancelled)  # (twice: nothing)
        await trio.sleep(1)
        nursery.cancel_scope.cancel()
    assert fired == [("early", 0.05), ("late", 0.2)]
    assert [round(t - start, 3) for t in clock.wakes] == [0.05, 0.2]  # woken for nothing else


async def test_the_clock_sleeps_on_when_its_earliest_deadline_is_cancelled(
    autojump_clock: trio.testing.MockClock,
) -> None:
    clock = CountingClock()
    fired: list[float] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(clock.run)
        await trio.testing.wait_all_tasks_blocked()  # the clock asleep
        start = trio.current_time()
        first = clock.at(start + 0.05, fired.append)
        clock.at(start + 0.1, fired.append)
        clock.cancel(first)
        after = clock.at(start + 0.3, fired.append)
        clock.cancel(after)  # not the earliest: dropped before the clock sleeps until it
        await trio.sleep(1)
        nursery.cancel_scope.cancel()
    assert [round(t - start, 3) for t in fired] == [0.1]
    assert [round(t - start, 3) for t in clock.wakes] == [0.1]

"""The sans-IO pieces of fan-out and the seam, tested synchronously.

The hub matches a batch once per distinct filter and hands every subscriber of
that filter the same :class:`FrameBatch`; a batch cut at the seam keeps only
the events after the cut; the heartbeat's bookkeeping; the turn's phase table
refuses impossible moves (docs/protocol.md sections 3, 7 and 8).
"""

from __future__ import annotations

import msgspec
import pytest

from gateway.client.codec import decode_server_frame
from gateway.doors.websocket.connection import Heartbeat
from gateway.http.websocket import SocketWriter
from gateway.ids import format_event_id
from gateway.protocol.events import Event, TextDelta
from gateway.protocol.filters import Filter, resolve_filter
from gateway.protocol.frames import EventFrame, encode
from gateway.protocol.framing import event_frame, text_frame
from gateway.protocol.shapes import Message, TextBlock
from gateway.session.hub import Emitted, FrameBatch, Hub
from gateway.session.seam import past_cut
from gateway.session.turn import IllegalPhase, Turn


def emitted(seq: int, type_: str = "text.delta", actor: str = "llm") -> Emitted:
    data = f'{{"id":"{format_event_id(seq)}","type":"{type_}"}}'.encode()
    return Emitted(seq, type_, actor, "sess_1", None, 0, data, text_frame(data))


def seqs(batch: FrameBatch) -> list[int]:
    return [e.seq for e in batch.events]


class Sink:
    def __init__(self, name: str, room: int = 10**6) -> None:
        self.name = name
        self.room = room
        self.batches: list[FrameBatch] = []
        self.shorts: list[tuple[FrameBatch, int]] = []
        self.overflows = 0

    def deliver(self, batch: FrameBatch, now: float) -> bool:
        if len(batch) > self.room:
            return False
        self.room -= len(batch)
        self.batches.append(batch)
        return True

    def deliver_short(self, batch: FrameBatch, sent: int, now: float) -> bool:
        self.shorts.append((batch, sent))
        return True

    def overflowed(self) -> None:
        self.overflows += 1


def test_one_shared_batch_per_distinct_filter() -> None:
    hub = Hub()
    _, full = resolve_filter("preset:full")
    _, deltas_only = resolve_filter(msgspec.convert({"event_types": ["text.delta"]}, type=Filter))
    a, b, c = Sink("a"), Sink("b"), Sink("c")
    hub.subscribe(a, full)
    hub.subscribe(b, full)
    hub.subscribe(c, deltas_only)
    events = [emitted(1, "turn.started", "user"), emitted(2), emitted(3)]
    assert hub.publish(events, 0.0) == []
    assert a.batches[0] is b.batches[0]  # matched once, shared
    assert seqs(a.batches[0]) == [1, 2, 3]
    assert seqs(c.batches[0]) == [2, 3]
    assert a.batches[0].blob == b"".join(e.frame for e in events)


def test_overflowing_subscribers_are_reported_not_dropped_midway() -> None:
    hub = Hub()
    _, full = resolve_filter("preset:full")
    slow, fast = Sink("slow", room=1), Sink("fast")
    hub.subscribe(slow, full)
    hub.subscribe(fast, full)
    assert hub.publish([emitted(1), emitted(2)], 0.0) == [slow]
    assert seqs(fast.batches[0]) == [1, 2]  # the others are unaffected


def test_worker_events_reach_only_parents_subscriptions_that_ask() -> None:
    parent = Hub()
    worker = Hub(parent)
    _, plain = resolve_filter("preset:full")
    _, with_workers = resolve_filter(
        msgspec.convert({"include_worker_sessions": True}, type=Filter)
    )
    a, b = Sink("a"), Sink("b")
    parent.subscribe(a, plain)
    parent.subscribe(b, with_workers)
    worker.publish([emitted(7)], 0.0)
    assert a.batches == [] and [seqs(x) for x in b.batches] == [[7]]


class Kernel:
    """``os.write`` as a socket's writer sees it: each descriptor takes up to its room."""

    def __init__(self, room: dict[int, int]) -> None:
        self.room = room
        self.got: dict[int, bytes] = {fd: b"" for fd in room}

    def write(self, fd: int, data: bytes) -> int:
        room = self.room[fd]
        if room < 0:
            raise BrokenPipeError(fd)
        if room == 0:
            raise BlockingIOError(fd)
        took = data[:room]
        self.room[fd] -= len(took)
        self.got[fd] += took
        return len(took)


class Counted:
    frames_sent = 0


def test_direct_subscribers_are_written_straight_to_the_others_delivered() -> None:
    kernel, counted = Kernel({3: 10**6, 4: 10**6}), Counted()
    hub = Hub(counter=counted)
    _, full = resolve_filter("preset:full")
    a, b, c = Sink("a"), Sink("b"), Sink("c")
    group = hub.subscribe(a, full)
    hub.subscribe(b, full)
    hub.subscribe(c, full)
    hub.set_direct(a, SocketWriter(3, kernel.write))
    hub.set_direct(b, SocketWriter(4, kernel.write))
    events = [emitted(1), emitted(2)]
    assert hub.publish(events, 7.0) == []
    blob = b"".join(e.frame for e in events)
    assert kernel.got == {3: blob, 4: blob}  # one write each, the shared bytes
    assert a.batches == b.batches == [] and [seqs(x) for x in c.batches] == [[1, 2]]
    assert counted.frames_sent == 4  # two events to each of two direct clients
    assert group.written_at == 7.0  # the direct subscribers' heartbeat clock
    hub.set_direct(a, None)  # a writer started for a: back to deliver
    hub.publish([emitted(3)], 8.0)
    assert [seqs(x) for x in a.batches] == [[3]] and kernel.got[3] == blob


def test_a_short_or_failed_direct_write_is_handed_to_the_subscriber_once() -> None:
    kernel = Kernel({3: 5, 4: 0, 5: -1})
    hub = Hub()
    _, full = resolve_filter("preset:full")
    subs = [Sink("short"), Sink("full"), Sink("broken")]
    for fd, sub in zip((3, 4, 5), subs, strict=True):
        hub.subscribe(sub, full)
        hub.set_direct(sub, SocketWriter(fd, kernel.write))

    class Moving(Sink):
        """Stops being direct when handed the rest, as a connection starting a writer does."""

        def deliver_short(self, batch: FrameBatch, sent: int, now: float) -> bool:
            hub.set_direct(self, None)
            return super().deliver_short(batch, sent, now)

    mover = Moving("mover")
    hub.subscribe(mover, full)
    kernel.room[6] = 1
    kernel.got[6] = b""
    hub.set_direct(mover, SocketWriter(6, kernel.write))
    hub.publish([emitted(1)], 0.0)
    assert [sent for _, sent in subs[0].shorts] == [5]
    assert [sent for _, sent in subs[1].shorts] == [0]
    assert [sent for _, sent in subs[2].shorts] == [-1]
    # handed over once: not delivered a second time now that it is queued
    assert [sent for _, sent in mover.shorts] == [1] and mover.batches == []
    hub.publish([emitted(2)], 0.0)
    assert [seqs(x) for x in mover.batches] == [[2]]


def test_unsubscribing_takes_the_writer_back() -> None:
    kernel = Kernel({3: 10**6})
    hub = Hub()
    _, full = resolve_filter("preset:full")
    a = Sink("a")
    hub.subscribe(a, full)
    hub.set_direct(a, SocketWriter(3, kernel.write))
    assert hub.unsubscribe(a) and len(hub) == 0
    hub.set_direct(a, SocketWriter(3, kernel.write))  # too late: not subscribed any more
    hub.publish([emitted(1)], 0.0)
    assert kernel.got[3] == b"" and not hub.unsubscribe(a)


def test_the_seam_cut_keeps_only_events_after_it() -> None:
    batch = FrameBatch([emitted(10), emitted(11), emitted(12)])
    assert past_cut(batch, 9) is batch  # all above the cut: the batch itself, no copy
    rest = past_cut(batch, 10)
    assert rest is not None and [e.seq for e in rest.events] == [11, 12]
    assert rest.blob == emitted(11).frame + emitted(12).frame and len(rest) == 2
    assert past_cut(batch, 12) is None


def test_the_spliced_event_frame_is_the_event_frame_it_stands_for() -> None:
    event = Event(format_event_id(5), "text.delta", "sess_1", "turn_1", 1, "llm",
                  TextDelta("msg_1", 0, "hi"))  # fmt: skip
    spliced = event_frame(encode(event))
    assert spliced == text_frame(encode(EventFrame(event)))
    header = {126: 4, 127: 10}.get(spliced[1], 2)  # FIN+opcode, then a 7/16/64-bit length
    assert decode_server_frame(spliced[header:]) == EventFrame(event)


def test_heartbeat_counts_unanswered_pings_and_a_pong_resets_it() -> None:
    hb = Heartbeat(max_missed=2)
    first = hb.on_idle()
    second = hb.on_idle()
    assert first and second and first != second
    assert hb.on_idle() is None  # two unanswered: close
    assert not hb.on_pong("not-a-nonce")
    assert hb.on_pong(first)  # any outstanding nonce resets the count
    assert hb.on_idle() is not None


def test_the_turn_phase_table_refuses_impossible_moves() -> None:
    turn = Turn("turn_1", Message("m", "s", "turn_1", "user", [TextBlock("x")], "complete", 0))
    turn.enter("llm")
    with pytest.raises(IllegalPhase, match="cannot go from 'llm' to 'tools'"):
        turn.enter("tools")  # tools only after the seam
    turn.enter("seam")
    turn.enter("tools")
    turn.enter("llm")
    assert turn.request_cancel("user") is True
    assert turn.request_cancel("again") is False  # already cancelling: a no-op
    turn.finish("cancelled")
    assert turn.done.is_set() and not turn.in_flight
    with pytest.raises(IllegalPhase):
        turn.enter("llm")
    assert turn.request_cancel("late") is False

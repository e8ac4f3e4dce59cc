"""One mapping per batch for the direct clients in the same state (gateway.doors.shared).

A real hub, real :class:`~gateway.http.body.StreamBody` objects over fake
streams and a fake ``os.write``, and a reader with state of its own (it
numbers what it maps): clients in the same state share one mapping (mapped
once per batch, the same bytes to each); a client in another state maps on
its own; a client that leaves the direct path takes the share's state with
it (its numbering goes on where the share's was), and a finished mapping
ends every client's stream. The shares are the hub group's (one filter and
one rollup window): clients of one filter in two windows never share one.
"""

from __future__ import annotations

from collections.abc import Sequence

import trio
import trio.testing

from gateway.config import StreamConfig
from gateway.doors.oneway import OneWayQueue, direct_reader, pump
from gateway.http.body import StreamBody, chunk
from gateway.metrics import Metrics
from gateway.protocol.filters import FilterKey
from gateway.session.hub import Emitted, Group, Hub
from gateway.session.rollup import Rollup, RollupClock
from gateway.session.seam import Gate
from tests.session_fakes import FakeSession

KEY = FilterKey(None, None, False)
END = 99  # the event that finishes a mapping


class _Session(FakeSession):
    def __init__(self) -> None:
        super().__init__()
        self.hub = Hub()  # type: ignore[assignment]


class _Queue(OneWayQueue):
    queue_name = "test queue"
    prefix = "test"
    left_as = "done"


class _Numbering:
    """A mapping with state: each event numbered from ``start``; ``END`` finishes it."""

    mapped = 0  # live() calls, over every instance

    def __init__(self, start: int = 0) -> None:
        self.n = start
        self.finished = False

    def live(self, events: Sequence[Emitted]) -> bytes:
        _Numbering.mapped += 1
        out = b""
        for e in events:
            out += b"%d:%d\n" % (self.n, e.seq)
            self.n += 1
            self.finished = self.finished or e.seq == END
        return out

    def replay(self, frames: bytes) -> bytes:
        return b""

    def pause(self) -> bytes:
        return b""

    def closed(self, code: str | None) -> bytes | None:
        return None


class _Stream:
    def __init__(self, wire: list[bytes]) -> None:
        self.wire = wire

    async def send_all(self, data: bytes) -> None:
        self.wire.append(bytes(data))


class _Client:
    """One stream: its queue, its body, what reached its socket."""

    def __init__(self, session: _Session, start: int = 0, coalesce_ms: int = 0) -> None:
        self.queue = _Queue(session, StreamConfig(queue_max_events=8), Metrics())  # type: ignore[arg-type]
        self.wire: list[bytes] = []  # every byte of the body, the pump's and the hub's
        self.stream = _Stream(self.wire)
        self.written: list[bytes] = []  # the hub's alone
        self.room: int | None = None
        self.body = StreamBody(self.stream, chunked=True, fd=3, write=self.write)  # type: ignore[arg-type]
        self.gate = Gate()
        self.queue.enqueue(self.gate)
        self.group: Group = session.hub.subscribe(self.queue, KEY, coalesce_ms)
        self.queue.registered(self.group)
        self.reader = direct_reader(self.queue, _Numbering(start), self.body)
        self.done = False

    def write(self, fd: int, data: bytes) -> int:
        take = len(data) if self.room is None else min(self.room, len(data))
        self.written.append(data[:take])
        self.wire.append(data[:take])
        return take

    async def run(self) -> None:
        await pump(self.queue, self.reader, self.body, 60.0)
        self.done = True

    def got(self) -> bytes:
        """Every byte of the body, as the client reads it (chunked)."""
        return b"".join(self.wire)


def _publish(session: _Session, *seqs: int, type_: str = "text.delta") -> None:
    events = [Emitted(s, type_, "llm", "sess_1", "turn_1", 0, b"{}", b"") for s in seqs]
    assert session.hub.publish(events, trio.current_time()) == []


async def _started(nursery: trio.Nursery, *clients: _Client) -> None:
    for client in clients:
        nursery.start_soon(client.run)
        client.gate.open(b"", 0)
    await trio.testing.wait_all_tasks_blocked()


async def test_clients_in_the_same_state_share_one_mapping_per_batch() -> None:
    session = _Session()
    a, b, other = _Client(session), _Client(session), _Client(session, start=100)
    async with trio.open_nursery() as nursery:
        await _started(nursery, a, b, other)
        [shares] = a.group.shares.values()
        assert len(shares) == 2  # a and b together, other alone
        _Numbering.mapped = 0
        _publish(session, 1, 2)
        assert _Numbering.mapped == 2  # once for a and b, once for other
        assert a.written == b.written == [chunk(b"0:1\n1:2\n")]
        assert other.written == [chunk(b"100:1\n101:2\n")]
        nursery.cancel_scope.cancel()
    for client in (a, b, other):
        client.body.finish()  # as the transport does once the stream is over
    assert not a.group.shares  # every client left its share


async def test_a_client_leaving_the_share_keeps_its_state_and_a_finish_ends_every_stream() -> None:
    session = _Session()
    a, b = _Client(session), _Client(session)
    async with trio.open_nursery() as nursery:
        await _started(nursery, a, b)
        _publish(session, 1)
        b.room = 3  # b's socket is full: the rest is owed, b maps on its own from here
        _publish(session, 2)
        b.room = None
        _publish(session, 3)  # mapped twice: by the share for a, by b's pump for b
        await trio.testing.wait_all_tasks_blocked()  # b's backlog written: in a's share again
        _Numbering.mapped = 0
        _publish(session, 4, END)
        assert _Numbering.mapped == 1
        await trio.testing.wait_all_tasks_blocked()
        assert a.done and b.done  # the finished mapping woke both pumps: both ended
    want = chunk(b"0:1\n") + chunk(b"1:2\n") + chunk(b"2:3\n") + chunk(b"3:4\n4:99\n")
    assert a.got() == b.got() == want
    assert not a.group.shares  # both left when their pumps took the wake-up


async def test_clients_of_one_filter_in_two_rollup_windows_never_share_a_mapping() -> None:
    session = _Session()
    session.hub = Hub(rollup=Rollup, timer=RollupClock())  # type: ignore[assignment]
    now, later = _Client(session), _Client(session, coalesce_ms=40)
    assert now.group is not later.group
    async with trio.open_nursery() as nursery:
        await _started(nursery, now, later)
        _Numbering.mapped = 0
        _publish(session, 1, type_="message.start")  # no delta: both windows send it now
        assert _Numbering.mapped == 2  # each group's batch mapped by its own client
        assert now.written == later.written == [chunk(b"0:1\n")]
        nursery.cancel_scope.cancel()
    for client in (now, later):
        client.body.finish()
    assert not now.group.shares and not later.group.shares

"""The one-way streams' direct path (gateway.doors.oneway, docs/performance.md "Doors").

A real hub, a real :class:`~gateway.http.body.StreamBody` over a fake stream
and a fake ``os.write``: an idle stream is written straight from the fan-out
(the shared bytes, framed once per batch, the pump's task never woken); one
whose direct write came up short owes the rest, which the pump writes first,
and is queued from then on, so the bound and the slow-client rule apply as
before; once its backlog is written it is direct again.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import trio
import trio.testing

from gateway.config import StreamConfig
from gateway.doors.oneway import OneWayQueue, pump
from gateway.http.body import StreamBody, chunk
from gateway.metrics import Metrics
from gateway.protocol.filters import FilterKey
from gateway.session.hub import Emitted, FrameBatch, Hub, encoded
from gateway.session.seam import Gate
from tests.session_fakes import FakeSession

KEY = FilterKey(None, None, False)


class _Session(FakeSession):
    def __init__(self) -> None:
        super().__init__()
        self.hub = Hub()  # type: ignore[assignment]


class _Queue(OneWayQueue):
    queue_name = "test queue"
    prefix = "test"
    slow_cuts = False  # the reader writes the close


class _Reader:
    finished = False

    def live(self, events: Sequence[Emitted]) -> bytes:
        return b"".join(b"cut %d\n" % e.seq for e in events)

    def replay(self, frames: bytes) -> bytes:
        return b"replay\n"

    def pause(self) -> bytes:
        return b""

    def closed(self, code: str | None) -> bytes | None:
        return None if code is None else f"closed {code}\n".encode()


encodes = 0


def _live(batch: FrameBatch) -> bytes:
    global encodes
    encodes += 1
    return b"".join(b"live %d\n" % e.seq for e in batch.events)


def _framed(batch: FrameBatch) -> bytes:
    return chunk(encoded(batch, _live))


class _Stream:
    """What the pump's writes reach: recorded; ``stuck`` holds them until set."""

    def __init__(self) -> None:
        self.sent: list[bytes] = []
        self.stuck: trio.Event | None = None
        self.broken = False

    async def send_all(self, data: bytes) -> None:
        if self.broken:
            raise trio.BrokenResourceError
        if self.stuck is not None:
            await self.stuck.wait()
        self.sent.append(bytes(data))


class _Socket:
    """The fake ``os.write``: takes up to ``room`` bytes (None: all)."""

    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.room: int | None = None

    def write(self, fd: int, data: bytes) -> int:
        if self.room == -1:
            raise BrokenPipeError
        take = len(data) if self.room is None else min(self.room, len(data))
        if take == 0:
            raise BlockingIOError
        self.written.append(data[:take])
        return take


def _emitted(seq: int) -> Emitted:
    return Emitted(seq, "text.delta", "llm", "sess_1", "turn_1", 0, b"{}", b"")


def _stream(
    max_events: int = 4,
) -> tuple[_Queue, _Session, StreamBody, _Stream, _Socket, Gate]:
    session = _Session()
    queue = _Queue(session, StreamConfig(queue_max_events=max_events), Metrics())  # type: ignore[arg-type]
    stream, socket = _Stream(), _Socket()
    body = StreamBody(stream, chunked=True, fd=7, write=socket.write)  # type: ignore[arg-type]
    gate = Gate()  # as the seam does: the gate, then the registration
    queue.enqueue(gate)
    queue.registered(session.hub.subscribe(queue, KEY))
    queue.direct_through(body, _live, _framed)
    return queue, session, body, stream, socket, gate


def _publish(session: _Session, *seqs: int) -> list[object]:
    return list(session.hub.publish([_emitted(s) for s in seqs], trio.current_time()))


async def test_an_idle_stream_is_written_straight_from_the_fan_out() -> None:
    global encodes
    queue, session, body, stream, socket, gate = _stream()
    other, *_ = _stream()  # a second client of the same filter, on the same hub
    other.session = session
    session.hub.subscribe(other, KEY)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(pump, queue, _Reader(), body, 60.0)
        _publish(session, 1)  # behind the gate: queued, not direct
        assert socket.written == []
        gate.open(b"frames", 0)
        await trio.testing.wait_all_tasks_blocked()
        assert stream.sent == [chunk(b"replay\nlive 1\n")]  # the pump: past the gate
        assert queue.subscribed and body.direct is not None
        encodes = 0
        before = len(stream.sent)
        _publish(session, 2, 3)
        assert socket.written == [chunk(b"live 2\nlive 3\n")]  # one write, from the fan-out
        assert encodes == 1  # encoded once for the batch
        await trio.testing.wait_all_tasks_blocked()
        assert len(stream.sent) == before and queue.queued == 0  # the pump never woke
        nursery.cancel_scope.cancel()


async def test_a_short_write_queues_the_stream_and_the_slow_client_rule_closes_it() -> None:
    queue, session, body, stream, socket, gate = _stream(max_events=4)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(pump, queue, _Reader(), body, 60.0)
        gate.open(b"", 0)
        await trio.testing.wait_all_tasks_blocked()
        stream.sent.clear()
        socket.room = 5
        stream.stuck = trio.Event()  # the socket is full: the pump's write waits
        assert _publish(session, 1) == []
        whole = chunk(b"live 1\n")
        assert socket.written == [whole[:5]]
        assert body.owes and body.direct is None
        await trio.testing.wait_all_tasks_blocked()  # the pump is writing the rest
        socket.written.clear()
        assert _publish(session, 2, 3) == []  # queued: the bound holds
        assert _publish(session, 4, 5) == []
        assert socket.written == []  # never direct while there is a backlog
        slow = _publish(session, 6, 7, 8)  # over queue_max_events=4: a slow client
        assert slow == [queue]
        queue.overflowed()  # what the session does after the fan-out
        assert session.warnings[0][1] == "client_too_slow"
        stream.stuck.set()
        await trio.testing.wait_all_tasks_blocked()
        assert stream.sent[-1] == chunk(b"closed client_too_slow\n")
        assert stream.sent[0] == whole[5:]  # the rest of the short write, first
        # the close drops the queue (a slow client resumes with replay)
        assert b"live 2" not in b"".join(stream.sent)
        assert queue.queued == 0 and not queue.subscribed
        nursery.cancel_scope.cancel()


async def test_a_backlog_written_makes_the_stream_direct_again() -> None:
    queue, session, body, stream, socket, gate = _stream(max_events=16)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(pump, queue, _Reader(), body, 60.0)
        gate.open(b"", 0)
        await trio.testing.wait_all_tasks_blocked()
        stream.sent.clear()
        socket.room = 0  # nothing fits
        _publish(session, 1)
        socket.room = None
        _publish(session, 2)  # queued behind it
        assert socket.written == []
        await trio.testing.wait_all_tasks_blocked()
        assert stream.sent == [chunk(b"live 1\n") + chunk(b"live 2\n")]  # one write, in order
        _publish(session, 3)
        assert socket.written == [chunk(b"live 3\n")]  # direct again
        nursery.cancel_scope.cancel()


async def test_a_failed_direct_write_ends_the_stream_through_the_pump() -> None:
    queue, session, body, stream, socket, gate = _stream()
    with trio.fail_after(5), pytest.raises(ExceptionGroup) as failed:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(pump, queue, _Reader(), body, 60.0)
            gate.open(b"", 0)
            await trio.testing.wait_all_tasks_blocked()
            socket.room = -1  # the client is gone
            stream.broken = True
            _publish(session, 1)
            assert body.owes and body.direct is None  # the whole batch owed: the pump writes it
    assert failed.value.subgroup(trio.BrokenResourceError) is not None  # the pump's write

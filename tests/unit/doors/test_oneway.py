"""The one-way streams' pump (gateway.doors.oneway), without a socket or a door.

The reader writes one line per piece, so what the pump makes of its queue
shows as text: one send per drain (the gate waited for, its cut applied, the
pause after), the ping of an idle stream, the close, the slow-client cut,
and the hub left when the stream is over. The doors' own readers run in
tests/unit/doors/agui, tests/unit/doors/aisdk and the integration tests of each stream.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import trio
import trio.testing

from gateway.config import StreamConfig
from gateway.doors.oneway import PING, OneWayQueue, SlowClient, frame_payloads, pump
from gateway.metrics import Metrics
from gateway.protocol.framing import text_frame
from gateway.session.hub import Emitted, FrameBatch
from gateway.session.seam import Gate
from tests.session_fakes import FakeSession


class _Session(FakeSession):
    def __init__(self) -> None:
        super().__init__()
        self.left: list[str] = []

    def unregistered(self, sub: object, reason: str) -> None:
        self.left.append(reason)


class _Queue(OneWayQueue):
    queue_name = "test queue"
    prefix = "test"
    left_as = "done"


class _Reader:
    def __init__(self, finish_after: int | None = None) -> None:
        self.finish_after = finish_after
        self.finished = False

    def live(self, events: Sequence[Emitted]) -> bytes:
        if self.finish_after is not None and any(e.seq >= self.finish_after for e in events):
            self.finished = True
        return b"".join(b"live %d\n" % e.seq for e in events)

    def replay(self, frames: bytes) -> bytes:
        return b"replay " + frames + b"\n"

    def pause(self) -> bytes:
        return b"pause\n"

    def closed(self, code: str | None) -> bytes | None:
        return None if code is None else f"closed {code}\n".encode()


def _batch(*seqs: int) -> FrameBatch:
    return FrameBatch(
        [Emitted(s, "text.delta", "llm", "sess_1", "turn_1", 0, b"{}", b"") for s in seqs]
    )


def _queue(slow_cuts: bool = True) -> tuple[_Queue, _Session]:
    session = _Session()
    queue = _Queue(session, StreamConfig(queue_max_events=4), Metrics())  # type: ignore[arg-type]
    queue.slow_cuts = slow_cuts  # type: ignore[misc]
    queue.subscribed = True
    return queue, session


async def _pumped(queue: _Queue, reader: _Reader, idle_s: float = 60.0) -> list[bytes]:
    sent: list[bytes] = []

    async def send(data: bytes) -> None:
        sent.append(data)

    with trio.fail_after(5):
        await pump(queue, reader, send, idle_s, opening=b"opening\n")
    return sent


async def test_one_send_per_drain_past_the_gates_cut_then_the_close() -> None:
    queue, _ = _queue()
    gate = Gate()
    queue.enqueue(gate)
    assert queue.deliver(_batch(1, 2), 0.0) and queue.deliver(_batch(3), 0.0)
    gate.open(b"frames", 2)  # the replay holds up to 2: only 3 goes on
    queue.request_close("session_deleted")  # drains: what was queued first
    sent = await _pumped(queue, _Reader())
    assert sent == [b"opening\n", b"replay frames\nlive 3\npause\n", b"closed session_deleted\n"]
    assert queue.queued == 0 and not queue.subscribed


async def test_an_idle_stream_pings_and_a_finished_reader_leaves_the_hub(
    autojump_clock: trio.testing.MockClock,
) -> None:
    queue, session = _queue()
    sent: list[bytes] = []

    async def send(data: bytes) -> None:
        sent.append(data)

    async def later() -> None:
        await trio.sleep(1.5)
        queue.deliver(_batch(7), 0.0)

    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(later)
            await pump(queue, _Reader(finish_after=7), send, 1.0)
    assert sent == [PING, b"live 7\npause\n"]
    assert session.left == ["done"]


async def test_too_slow_cuts_the_stream_or_writes_its_close() -> None:
    queue, _ = _queue()
    queue.deliver(_batch(1), 0.0)
    queue.overflowed()
    with pytest.raises(SlowClient):
        await _pumped(queue, _Reader())
    native, session = _queue(slow_cuts=False)
    native.overflowed()
    assert await _pumped(native, _Reader()) == [b"opening\n", b"closed client_too_slow\n"]
    assert session.left == []  # unsubscribed by the slow-client rule: nothing left to leave


def test_frame_payloads_reads_7_16_and_64_bit_lengths() -> None:
    payloads = [b"a", b"b" * 200, b"c" * 70000]
    assert frame_payloads(b"".join(text_frame(p) for p in payloads)) == payloads

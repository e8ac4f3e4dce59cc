"""``max_processes`` (gateway.tools.process_slots): a slot per running or reserved CLI."""

from __future__ import annotations

import trio
import trio.testing

from gateway.tools.process_slots import ProcessSlots


class FakeProcess:
    """A session's process as the slots see it; stopping it frees its slot after ``stop_s``."""

    def __init__(self, slots: ProcessSlots, sid: str, since: float, busy: bool = False) -> None:
        self.slots, self.sid, self.since, self.busy = slots, sid, since, busy
        self.stopped = 0

    def idle(self) -> bool:
        return not self.busy

    def idle_since(self) -> float:
        return self.since

    def stop(self) -> None:
        self.stopped += 1


async def test_a_slot_is_held_once_per_session_and_the_oldest_idle_process_makes_room(
    autojump_clock: trio.testing.MockClock,
) -> None:
    slots = ProcessSlots()
    assert await slots.acquire("a", 2, "s1", 1.0)
    assert await slots.acquire("a", 2, "s1", 1.0)  # the same session: the same slot
    assert await slots.acquire("a", 2, "s2", 1.0)
    assert await slots.acquire("b", 2, "s3", 1.0)  # another agent: slots of its own
    assert slots.held("a") == 2
    old, new = FakeProcess(slots, "s1", 10.0), FakeProcess(slots, "s2", 20.0)
    slots.attach("a", "s1", old)
    slots.attach("a", "s2", new)
    got: list[bool] = []

    async def want(sid: str) -> None:
        got.append(await slots.acquire("a", 2, sid, 5.0))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(want, "s4")
        await trio.sleep(1)
        assert (old.stopped, new.stopped) == (1, 0)  # the least recently active, once
        assert got == []  # it waits for the process to end
        slots.release("a", "s1")
    assert got == [True] and slots.holds("a", "s4") and not slots.holds("a", "s1")


async def test_no_idle_process_is_a_refusal_after_the_bounded_wait(
    autojump_clock: trio.testing.MockClock,
) -> None:
    slots = ProcessSlots()
    assert await slots.acquire("a", 1, "s1", 1.0)
    busy = FakeProcess(slots, "s1", 0.0, busy=True)
    slots.attach("a", "s1", busy)
    start = trio.current_time()
    assert not await slots.acquire("a", 1, "s2", 5.0)
    assert trio.current_time() - start == 5.0 and busy.stopped == 0
    assert not slots.holds("a", "s2")
    # A reserved slot (no process yet) is never taken from its session either.
    slots.release("a", "s1")
    assert await slots.acquire("a", 1, "s2", 1.0)
    assert not await slots.acquire("a", 1, "s3", 1.0)

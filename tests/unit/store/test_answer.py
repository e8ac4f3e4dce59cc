"""A worker thread's answer taken quietly unless wanted (gateway.store.answer).

Real worker threads; where the patience matters the loop's clock is
pytest-trio's ``mock_clock``, which stands still unless a test moves it, so
"nobody asked yet" is a state the test can look at, not a race against a timer.
"""

from __future__ import annotations

import threading

import trio
import trio.testing

from gateway.store.answer import PATIENCE_S, QuietAnswer


async def parked(nursery: trio.Nursery, call: Call) -> None:
    """Start ``call``'s waiter; return once its thread has run (in real time) and the
    loop has nothing left to do."""
    nursery.start_soon(call.wait)
    await trio.to_thread.run_sync(call.ran.wait, 10)
    assert call.ran.is_set()
    await trio.testing.wait_all_tasks_blocked()


class Call:
    """A worker-thread call that says when it ran, and the task that waits for its answer."""

    def __init__(self, *, urgent: bool, fails: bool = False) -> None:
        self.answer: QuietAnswer[int] = QuietAnswer(urgent=urgent)
        self.ran = threading.Event()
        self.result: int | BaseException | None = None
        self.taken = trio.Event()
        self.fails = fails

    def work(self) -> int:
        self.ran.set()
        if self.fails:
            raise OSError("disk full")
        return 42

    async def wait(self) -> None:
        try:
            self.result = await self.answer.run(
                self.work, limiter=trio.CapacityLimiter(1), name="test write"
            )
        except OSError as exc:
            self.result = exc
        self.taken.set()


async def test_a_quiet_answer_waits_until_it_is_asked_for(
    mock_clock: trio.testing.MockClock,
) -> None:
    call = Call(urgent=False)
    async with trio.open_nursery() as nursery:
        await parked(nursery, call)
        assert not call.taken.is_set()  # done in its thread, the loop not woken for it
        call.answer.hurry()
        await call.taken.wait()
    assert call.result == 42
    assert call.answer.answered_at is not None


async def test_an_answer_hurried_before_it_is_done_wakes_the_loop_when_it_is() -> None:
    gate = threading.Event()
    call = Call(urgent=False)
    work = call.work
    call.work = lambda: gate.wait(10) and work()  # type: ignore[method-assign]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(call.wait)
        await trio.testing.wait_all_tasks_blocked()
        call.answer.hurry()  # wanted now, done later
        gate.set()
        with trio.fail_after(10):
            await call.taken.wait()
    assert call.result == 42


async def test_an_urgent_answer_and_a_failure_wake_the_loop_at_once() -> None:
    urgent, failing = Call(urgent=True), Call(urgent=False, fails=True)
    for call in (urgent, failing):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(call.wait)
            with trio.fail_after(10):  # nobody hurries: the thread wakes the loop
                await call.taken.wait()
    assert urgent.result == 42
    assert isinstance(failing.result, OSError)


async def test_an_answer_nobody_asks_for_is_taken_after_the_patience(
    mock_clock: trio.testing.MockClock,
) -> None:
    call = Call(urgent=False)
    async with trio.open_nursery() as nursery:
        await parked(nursery, call)
        mock_clock.jump(PATIENCE_S / 2)
        await trio.testing.wait_all_tasks_blocked()
        assert not call.taken.is_set()
        mock_clock.jump(PATIENCE_S / 2)
        await call.taken.wait()
    assert call.result == 42


async def test_a_cancelled_waiter_still_takes_its_answer(
    mock_clock: trio.testing.MockClock,
) -> None:
    """A write, once sent, runs to its answer; a cancellation wants it now."""
    call = Call(urgent=False)
    async with trio.open_nursery() as nursery:
        await parked(nursery, call)
        nursery.cancel_scope.cancel()
    assert call.result == 42 and call.taken.is_set()

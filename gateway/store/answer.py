"""A worker thread's answer that wakes the Trio loop only when someone waits for it.

The SQLite store writes in a worker thread (``trio.to_thread``'s rule: nothing
blocking on the event loop). ``trio.to_thread.run_sync`` hands the answer back
through the loop's wake-up socket the moment the thread is done, which wakes
an idle loop: some hundreds of microseconds of CPU on this class of machine
(docs/performance.md "The checkpoint's cost (issue 36)"). A write that nobody
waits for (a streaming message's checkpoint, docs/protocol.md §9) does not
need that: :class:`QuietAnswer` keeps its answer until the loop is awake
anyway and asks (:meth:`QuietAnswer.hurry`: a put, a waiter, a close), and
wakes the loop at once only for an answer that is wanted (``urgent``, or
hurried while the thread works) or is an error (a failed write is retried,
and reported, at once).

The waiting task owns the thread as it would with ``trio.to_thread``: it waits
for the answer (uncancellably: a write, once sent, runs to its answer), and a
thread never outlives it. An answer nobody asked for is taken after
:data:`PATIENCE_S` at the latest, so a task waiting for one is never stuck
(a shutdown whose cancellation cannot reach it, as it waits shielded, included).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

import outcome
import trio

T = TypeVar("T")

PATIENCE_S = 1.0  # an answer nobody asked for is taken after this, at the latest


class QuietAnswer(Generic[T]):
    """One call in a worker thread, answered quietly unless wanted (module docstring).

    Args:
        urgent: someone waits for it already: wake the loop when it is done.
    """

    def __init__(self, *, urgent: bool) -> None:
        self._lock = threading.Lock()  # the thread's delivery against the loop's hurry
        self._urgent = urgent
        self._answer: outcome.Outcome[T] | None = None
        self._waiter: trio.lowlevel.Task | None = None
        self._token = trio.lowlevel.current_trio_token()
        self.answered_at: float | None = None  # time.perf_counter() when the thread was done

    async def run(self, fn: Callable[[], T], *, limiter: trio.CapacityLimiter, name: str) -> T:
        """``fn()`` in a worker thread under ``limiter``; its result, once asked for or wanted."""
        async with limiter:
            self._waiter = trio.lowlevel.current_task()
            trio.lowlevel.start_thread_soon(fn, self._deliver, name=name)
            with trio.move_on_after(PATIENCE_S):  # asked for by then (module docstring)
                answer: outcome.Outcome[T] = await trio.lowlevel.wait_task_rescheduled(self._abort)
        return answer.unwrap()

    def _abort(self, _: trio.lowlevel.RaiseCancelT) -> trio.lowlevel.Abort:
        """Patience ran out (or a cancellation): the answer is wanted, the wait goes on."""
        with self._lock:
            self._urgent = True
            done = self._answer is not None
        if done:
            self._token.run_sync_soon(self._resume)
        return trio.lowlevel.Abort.FAILED  # runs to its answer

    def hurry(self) -> None:
        """The loop wants the answer: now if it is there, else as soon as it is."""
        with self._lock:
            self._urgent = True
            done = self._answer is not None
        if done:
            self._resume()

    def _deliver(self, answer: outcome.Outcome[T]) -> None:
        """In the worker thread: keep the answer; wake the loop only if it is wanted."""
        with self._lock:
            self._answer = answer
            self.answered_at = time.perf_counter()
            wake = self._urgent or isinstance(answer, outcome.Error)
        if wake:
            self._token.run_sync_soon(self._resume)

    def _resume(self) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and self._answer is not None:
            trio.lowlevel.reschedule(waiter, outcome.Value(self._answer))

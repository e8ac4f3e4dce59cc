"""An MCP tool call's progress, paced for the session's clients (docs/protocol.md §5, §11).

A server's ``notifications/progress`` for a call (its request's
``progressToken``, set by the SDK) is the call's ``tool.progress``. A server
may send thousands a second (a loop that reports every item): a tool use's
progress reaches the session at most once every :data:`PROGRESS_INTERVAL_S`,
the last value kept. The first goes out at once; those that come within the
interval after it wait for its end, where only the newest of them goes out;
when the call ends, the value still waiting goes out before its result, so the
last progress a client sees is the server's last. Nothing goes out once the
call has ended (a late notification, or one for a token the call never had:
the SDK drops those, since no request of that token is in flight).

The SDK runs each notification's callback in a task of its own, and Trio
does not run tasks in the order they were started: MCP's progress only
increases, so a value below the highest one seen is an older notification
run late, and is dropped. The waiting is done by one of the tasks (the first
to find the interval still open), so a flood costs a comparison and a tuple
per notification and one sleeping task per call.
"""

from __future__ import annotations

from collections.abc import Callable

import trio

PROGRESS_INTERVAL_S = 0.1
"""The least time between two ``tool.progress`` of one tool use: at most 10 a second."""

Report = Callable[[float, float | None, str | None], None]


def _finite(value: float | None) -> float | None:
    """A number JSON can carry (a server's ``NaN`` or ``inf`` is dropped)."""
    if value is None or value != value or value in (float("inf"), float("-inf")):
        return None
    return value


class ProgressPacer:
    """One call's progress, one report per :data:`PROGRESS_INTERVAL_S` at most (module doc)."""

    def __init__(self, report: Report, interval_s: float = PROGRESS_INTERVAL_S) -> None:
        self._report = report
        self._interval_s = interval_s
        self._sent_at = -float("inf")
        self._waiting: tuple[float, float | None, str | None] | None = None
        self._highest = -float("inf")  # MCP's progress only increases (module docstring)
        self._sleeping = False
        self._ended = False

    async def __call__(self, progress: float, total: float | None, message: str | None) -> None:
        """The SDK's ``progress_callback``: one notification."""
        value = _finite(progress)
        if self._ended or value is None or value < self._highest:
            return
        self._highest = value
        self._waiting = (value, _finite(total), message[:1000] if message else message)
        if self._sleeping:
            return  # the sleeping task sends the newest at the interval's end
        due = self._sent_at + self._interval_s
        if trio.current_time() < due:
            self._sleeping = True
            try:
                await trio.sleep_until(due)
            finally:
                self._sleeping = False
        self._flush()

    def end(self) -> None:
        """The call ended: what waits goes out now (before its result), nothing after."""
        if not self._ended:
            self._flush()
            self._ended = True

    def _flush(self) -> None:
        if self._waiting is None or self._ended:
            return
        value, total, message = self._waiting
        self._waiting = None
        self._sent_at = trio.current_time()
        self._report(value, total, message)

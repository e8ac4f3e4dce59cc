"""The node's checkpoint: streaming messages stored on one clock (docs/protocol.md §9).

``[store] checkpoint_ms`` bounds what a ``kill -9`` loses of a message that is
streaming: it is stored at most that long after it changed ("Crashes and
restarts"). Each session's call marks its stream here when its message
changes (:meth:`Checkpoints.mark`); the first mark since the last store sets
the node's *due* time, that change plus the period, and every marked message
is stored in one step at or before it. So the sessions' checkpoints land in
**one group commit** (gateway.store.group_commit), and the node stores once a
period, not once per session.

Waking costs: at the lightest load nothing else writes while a message
streams, and a wake-up of an idle Trio loop costs some hundreds of
microseconds of CPU on its own (docs/performance.md "The checkpoint's cost
(issue 36)", ``python -m bench.wakeups --tick``). So the store rides a wake-up
that happens anyway: a session's emission in the last tenth of the period
before the due time stores everything marked then (:meth:`Checkpoints.ride`),
and the node's task (:meth:`Checkpoints.run`) wakes at the due time only when
no emission came first. Storing early never loosens the bound; it costs at
most a tenth more stores while a message streams. Nothing is marked while no
message changes: an idle node never wakes for it.
"""

from __future__ import annotations

import math
from typing import Protocol

import trio


class Keeper(Protocol):
    """What is marked: a session's call stream (:class:`gateway.session.call.CallStream`)."""

    def keep_due(self) -> None:
        """Store the streaming message now if it changed since it was last stored.

        Its failures are its own (reported to its session); it never raises.
        """
        ...


class Checkpoints:
    """The marked streams, their due time, and the task that stores them (module docstring).

    Args:
        period_s: ``[store] checkpoint_ms``, in seconds (> 0).
    """

    @classmethod
    def every(cls, checkpoint_ms: int) -> Checkpoints | None:
        """The node's checkpoint for ``[store] checkpoint_ms``; ``None`` for 0 (at block ends)."""
        return cls(checkpoint_ms / 1000) if checkpoint_ms else None

    def __init__(self, period_s: float) -> None:
        self.period = period_s
        self.early = period_s / 10  # an emission this close to the due time stores
        self._marked: dict[Keeper, None] = {}  # in marking order
        self.due = math.inf  # when the oldest change not stored must be
        self._timer: trio.CancelScope | None = None  # the task's wait, until ``due``

    def mark(self, keeper: Keeper) -> None:
        """``keeper``'s message changed: store it within the period."""
        self._marked[keeper] = None
        if self.due == math.inf:
            self.due = trio.current_time() + self.period
            if self._timer is not None:
                self._timer.deadline = self.due

    def ride(self) -> None:
        """A session emitted, so the node is awake: store what is marked if it is due soon."""
        if trio.current_time() >= self.due - self.early:
            self._store()

    def _store(self) -> None:
        marked, self._marked = self._marked, {}
        self.due = math.inf
        if self._timer is not None:
            self._timer.deadline = math.inf
        for keeper in marked:
            keeper.keep_due()

    async def run(self) -> None:
        """The node's task: wake at the due time, if no emission stored first."""
        while True:
            with trio.CancelScope(deadline=self.due) as self._timer:
                await trio.sleep_forever()
            self._timer = None
            if trio.current_time() >= self.due:
                self._store()

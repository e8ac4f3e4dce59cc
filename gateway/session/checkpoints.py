"""The node's checkpoint: streaming messages stored on one clock (docs/protocol.md §9).

``[store] checkpoint_ms`` bounds what a ``kill -9`` loses of a message that is
streaming: it is stored at most that long after it changed ("Crashes and
restarts"). Each session's call marks its stream here when its message
changes (:meth:`Checkpoints.mark`); one task of the node (:meth:`Checkpoints.run`)
wakes at the next multiple of the period on the Trio clock and stores every
marked message in the same step. So the sessions' checkpoints are put in one
step and land in **one group commit** (gateway.store.group_commit), and the
node wakes once a tick, not once per session: at the lightest load nothing
else writes while a message streams, and a commit (a transaction, the
writer's thread hop) costs some hundreds of microseconds where encoding a
message costs one (docs/performance.md "The checkpoint's cost (issue 36)").
Nothing is marked while no message changes: an idle node never wakes for it.
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


def next_tick(now: float, period: float) -> float:
    """The first multiple of ``period`` after ``now``: the node's next checkpoint."""
    return (math.floor(now / period) + 1) * period


class Checkpoints:
    """The marked streams and the task that stores them on the tick (module docstring).

    Args:
        period_s: ``[store] checkpoint_ms``, in seconds (> 0).
    """

    @classmethod
    def every(cls, checkpoint_ms: int) -> Checkpoints | None:
        """The node's ticker for ``[store] checkpoint_ms``; ``None`` for 0 (at block ends)."""
        return cls(checkpoint_ms / 1000) if checkpoint_ms else None

    def __init__(self, period_s: float) -> None:
        self.period = period_s
        self._marked: dict[Keeper, None] = {}  # in marking order
        self._wake = trio.Event()

    def mark(self, keeper: Keeper) -> None:
        """``keeper``'s message changed: store it at the next tick."""
        self._marked[keeper] = None
        self._wake.set()

    async def run(self) -> None:
        """The node's task: wait for a mark, then for the tick, then store what is marked."""
        while True:
            if not self._marked:
                self._wake = trio.Event()
                await self._wake.wait()
            await trio.sleep_until(next_tick(trio.current_time(), self.period))
            marked, self._marked = self._marked, {}
            for keeper in marked:
                keeper.keep_due()

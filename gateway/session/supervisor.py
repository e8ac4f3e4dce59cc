"""A session's supervisor: the queue its agent loop reads, and the failure boundary around it.

The queue holds a turn, and at most one compaction ahead of it
(``POST .../compact``, docs/protocol.md §12), and the queued turns put back
before the loop took them (gateway.session.busy: done, the loop skips them),
one per cancel or interrupt that lands in that moment: so it is unbounded.

The failure boundary (:meth:`Supervisor.run`): if the agent loop or the
translator fails, the failure is logged and counted, the turn in flight is
closed for every client, and both tasks start again for the next turn; a
session failing over and over (five times within a second) pauses a second
before it starts again. A session whose lease another node took is stopped
here (:meth:`Supervisor.stop`) and starts again as a replica.
"""

from __future__ import annotations

import math
import time
from collections import deque
from typing import TYPE_CHECKING

import trio

from gateway.errors import Refused
from gateway.session import compaction_live
from gateway.session.core import SessionCore
from gateway.session.turn import Turn

if TYPE_CHECKING:
    from gateway.session.agent import AgentLoop


class Supervisor:
    """The turns and compactions queued for one session's agent loop, and its tasks' scope."""

    def __init__(self) -> None:
        self._tx, self._rx = trio.open_memory_channel[Turn | compaction_live.Request](math.inf)
        self.compaction: compaction_live.Request | None = None  # POST .../compact, until it ran
        # Turns sent with if_busy "interrupt", to start next (gateway.session.busy).
        self.interrupters: deque[Turn] = deque()
        self._scope = trio.CancelScope()

    def queue_turn(self, turn: Turn) -> None:
        self._tx.send_nowait(turn)

    @property
    def compaction_queued(self) -> bool:
        """A compaction is queued and has not run yet."""
        return self.compaction is not None and not self.compaction.done.is_set()

    def queue_compaction(self) -> None:
        self.compaction = compaction_live.Request()
        self._tx.send_nowait(self.compaction)

    async def compacted(self) -> None:
        """Return once the compaction queued (if any) has run."""
        if self.compaction is not None:
            await self.compaction.done.wait()

    async def run(
        self, session: SessionCore, agent: AgentLoop, task_status: trio.TaskStatus[None]
    ) -> None:
        """The session's tasks, started again after each failure (module docstring)."""
        recent: deque[float] = deque(maxlen=5)
        while True:
            self._scope = trio.CancelScope()
            try:
                with self._scope:
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(session.calls.run, name=f"translator {session.id}")
                        nursery.start_soon(agent.run, self._rx, name=f"agent-loop {session.id}")
                        task_status.started()
                        task_status = trio.TASK_STATUS_IGNORED
                if not self._scope.cancelled_caught:
                    return
                self._clear(agent)
                session.stopped_here()
            except Exception as exc:
                session.failed("session", exc)
                agent.abort()
                recent.append(time.monotonic())
                if len(recent) == recent.maxlen and recent[-1] - recent[0] < 1.0:
                    await trio.sleep(1.0)

    def stop(self) -> None:
        """Tear the session's tasks down at once (they start again: :meth:`run`)."""
        self._scope.cancel()

    def _clear(self, agent: AgentLoop) -> None:
        """After :meth:`stop`: nothing in flight, nothing queued."""
        agent.current = None
        while self.interrupters:  # not started: their requests answer as the session now does
            self.interrupters.popleft().drop(
                Refused("session_elsewhere", "the session moved to another node: send it again")
            )
        if self.compaction is not None:  # dropped with the channel's contents below
            self.compaction.done.set()
            self.compaction = None
        while True:
            try:
                self._rx.receive_nowait()
            except trio.WouldBlock:
                break

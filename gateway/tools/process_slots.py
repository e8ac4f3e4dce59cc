"""``max_processes``: how many Claude Code processes an agent runs at once on a node.

docs/reference.md "Agents": each ``claude-code`` agent's ``max_processes`` bounds its
CLI processes on this node (each is some 200 MB). A session holds a slot from
the moment a turn of it is accepted with no process running until its process
ends (an idle stop, a crash, the session's end): :class:`ProcessSlots`.

A turn that needs a slot when all are held waits for one **before** its
``POST /sessions/{id}/turns`` answers (docs/protocol.md §2 leaves the wait to
the runtime; this one answers 503 after a bounded wait):

- while it waits, the least recently active of the agent's **idle** processes
  (its session has no turn in flight or queued) is stopped to make room: an
  idle process costs nothing to stop, its next turn resumes the transcript;
- after ``[tools] process_slot_wait_s`` (:attr:`ProcessSlots.wait_s`, 5 s by
  default) with no slot, the POST answers 503 ``over_capacity`` with
  ``Retry-After`` (:meth:`ProcessSlots.over_capacity`), and no turn was
  started. A turn posted on another node and forwarded to the session's
  owner waits there as long: the sender waits for the owner's answer
  ``process_slot_wait_s`` longer than for any other (``commit_timeout_s``), so
  its client gets this 503, not ``session_owner_unreachable``.

This module has no dependency on the ``claude-code`` extra: the node asks it
before the session's runtime exists.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Protocol

import trio

from gateway.errors import Refused


class Holder(Protocol):
    """A session's running process, as the slots see it (the runtime)."""

    def idle(self) -> bool:
        """Whether its session has no turn in flight or queued (it may be stopped)."""
        ...

    def idle_since(self) -> float:
        """When its last turn started or ended (``trio.current_time()``)."""
        ...

    def stop(self) -> None:
        """Stop the process; :meth:`ProcessSlots.release` follows once it has ended."""
        ...


@dataclass
class _Agent:
    held: dict[str, Holder | None] = field(default_factory=dict)  # session id -> its process
    stopping: set[str] = field(default_factory=set)  # stopped to make room, not yet ended
    changed: trio.Event = field(default_factory=trio.Event)


class ProcessSlots:
    """The node's Claude Code process slots, per agent (module docstring).

    Args:
        wait_s: how long a turn's POST waits for a slot before it is 503
            ``over_capacity`` (``[tools] process_slot_wait_s``).
    """

    def __init__(self, wait_s: float = 5.0) -> None:
        self.wait_s = wait_s
        self._agents: dict[str, _Agent] = {}

    def _of(self, agent: str) -> _Agent:
        return self._agents.setdefault(agent, _Agent())

    def held(self, agent: str) -> int:
        """How many slots of ``agent`` are held (running or reserved processes)."""
        return len(self._of(agent).held)

    def holds(self, agent: str, session_id: str) -> bool:
        return session_id in self._of(agent).held

    async def acquire(self, agent: str, limit: int, session_id: str, wait_s: float) -> bool:
        """Hold a slot for ``session_id`` (at once if it holds one); False after ``wait_s``.

        While every slot is held, the least recently active idle process of the
        agent is stopped, one at a time, and the wait goes on until it has ended.
        """
        a = self._of(agent)
        with trio.move_on_after(wait_s):
            while True:
                if session_id in a.held:
                    return True
                if len(a.held) < limit:
                    a.held[session_id] = None
                    return True
                if len(a.stopping) < len(a.held) - limit + 1:
                    idle = [
                        (h.idle_since(), sid, h)
                        for sid, h in a.held.items()
                        if h is not None and sid not in a.stopping and h.idle()
                    ]
                    if idle:
                        _, sid, holder = min(idle, key=lambda t: t[0])
                        a.stopping.add(sid)
                        holder.stop()
                await a.changed.wait()
        return False

    def attach(self, agent: str, session_id: str, holder: Holder) -> None:
        """The session's process runs: it is the holder of the session's slot."""
        a = self._of(agent)
        a.held[session_id] = holder
        self._changed(a)

    def release(self, agent: str, session_id: str) -> None:
        """The session's process ended (or never started): its slot is free."""
        a = self._of(agent)
        a.held.pop(session_id, None)
        a.stopping.discard(session_id)
        self._changed(a)

    def _changed(self, a: _Agent) -> None:
        a.changed.set()
        a.changed = trio.Event()

    def over_capacity(self, agent: str, limit: int) -> Refused:
        """The refusal of a turn that found no slot in :attr:`wait_s` (module docstring)."""
        wait = max(1, math.ceil(self.wait_s))
        return Refused(
            "over_capacity",
            f"agent {agent!r} runs its max_processes = {limit} Claude Code processes on this"
            f" node, none idle; retry in {wait} s",
            retry_after_s=wait,
        )

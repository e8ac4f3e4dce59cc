"""Session leases: each session's agent loop runs on one node at a time (docs/scale-out.md).

A lease is a claim on one session by one node (its :attr:`Leases.node_id`, a
uuid per process), valid for ``[store] lease_s`` unless renewed. The node that
holds a session's lease is the one that may run its turns and close a turn a
dead node left in flight (docs/protocol.md §9); when the holder dies (kill -9)
its leases expire and another node may take them. How long a failover takes
is therefore the lease time.

Two implementations behind :class:`Leases`, given by the store
(:meth:`gateway.store.base.Store.leases`):

- ``LocalLeases`` (:mod:`gateway.store.sqlite.leases`, one node): every lease
  is this node's.
- ``RedisLeases`` (:mod:`gateway.store.redis.leases`): a key per session,
  ``SET key node_id NX PX ttl`` to take it, a compare-and-``PEXPIRE`` script to
  renew it, a compare-and-``DEL`` script to release it.

:class:`LeaseKeeper` is the node's side: the leases it holds, and the
``lease-keeper`` task that renews them all every third of the lease time. A
lease it fails to renew (another node holds it now, or Redis did not answer
for a whole lease time), or whose session's writes the store fenced
(:meth:`LeaseKeeper.fenced`), is reported to ``on_lost``: the session must
stop acting on it.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import trio

from gateway.errors import StoreError


def new_node_id() -> str:
    """A node's id for its leases: one per process, never reused (a restart is a new node)."""
    return f"node_{uuid.uuid4().hex}"


@dataclass(frozen=True)
class Taken:
    """A lease just taken.

    ``counter``: the store's event id counter read right after the lease was
    taken (0 where there is no such counter: SQLite). Every id the previous
    holder could have issued is at most this, so the new holder issues the
    session's next ids from a block granted at or above it
    (:meth:`gateway.session.sequencer.EventSequencer.needs_block_above`).
    """

    counter: int = 0
    new: bool = False  # the lease was not this node's before (Redis: it was free)


class Leases(Protocol):
    """One node's view of the session leases of a store."""

    node_id: str
    ttl_ms: int
    shared: bool
    """Whether other nodes hold leases too (Redis); ``False``: every lease is this node's."""

    async def acquire(self, session_id: str) -> Taken | None:
        """Take the session's lease if it is free or already this node's; ``None``: held elsewhere.

        Raises:
            StoreError: the store did not answer.
        """
        ...

    async def renew(self, session_ids: Sequence[str]) -> list[str]:
        """Extend these leases by the lease time; the ones this node no longer holds.

        Raises:
            StoreError: the store did not answer (nothing is known of any of them).
        """
        ...

    async def release(self, session_ids: Sequence[str]) -> None:
        """Give up these leases (those still this node's), so another node may take them at once."""
        ...

    async def holder(self, session_id: str) -> str | None:
        """The node id holding the session's lease, ``None`` if nobody does."""
        ...


class LeaseKeeper:
    """The leases this node holds, kept alive by the ``lease-keeper`` task.

    Time is Trio's clock (testable with ``MockClock`` where the leases are
    local; Redis expires its keys on its own, real clock).

    Args:
        leases: the store's leases for this node.
        on_lost: told each session whose lease this node lost.
        on_error: told each renewal the store did not answer (retried next round).
    """

    def __init__(
        self,
        leases: Leases,
        on_lost: Callable[[str], None],
        on_error: Callable[[StoreError], None] | None = None,
    ) -> None:
        self.leases = leases
        self.ttl_s = leases.ttl_ms / 1000
        self.held: dict[str, float] = {}  # session -> when its lease was last known extended
        self._on_lost = on_lost
        self._on_error = on_error

    @property
    def node_id(self) -> str:
        return self.leases.node_id

    def holds(self, session_id: str) -> bool:
        return session_id in self.held

    async def take(self, session_id: str) -> Taken | None:
        """Take the session's lease; ``None`` if a live node holds it.

        A lease this node already holds is :class:`Taken` with counter 0 (its
        ids are this node's already).

        Raises:
            StoreError: the store did not answer.
        """
        if session_id in self.held:
            return Taken()
        started = trio.current_time()
        taken = await self.leases.acquire(session_id)
        if taken is not None:
            self.held[session_id] = started
        return taken

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Renew every held lease every third of the lease time, until cancelled."""
        task_status.started()
        if not self.leases.shared:
            await trio.sleep_forever()  # nothing expires: nothing to renew
        while True:
            await trio.sleep(self.ttl_s / 3)
            await self.renew_all()

    async def renew_all(self) -> None:
        """One round of renewals (what :meth:`run` does each period)."""
        sessions = list(self.held)
        if not sessions:
            return
        started = trio.current_time()
        try:
            lost = await self.leases.renew(sessions)
        except StoreError as exc:
            if self._on_error is not None:
                self._on_error(exc)
            # Not known either way: a lease not extended for a whole lease time
            # may have expired, and another node may have taken it.
            lost = [s for s in sessions if started - self.held.get(s, started) >= self.ttl_s]
        else:
            for sid in sessions:
                if sid in self.held:
                    self.held[sid] = started
        for sid in lost:
            if self.held.pop(sid, None) is not None:
                self._on_lost(sid)

    def fenced(self, session_id: str) -> None:
        """The store dropped a write of the session: another node holds its lease now.

        (Before this node's next renewal could say so: a stall past the lease
        time.) Reported to ``on_lost`` as a lease the renewal found gone.
        """
        if self.held.pop(session_id, None) is not None:
            self._on_lost(session_id)

    async def release(self, session_ids: list[str]) -> None:
        """Give these leases up (their sessions left memory: docs/protocol.md §13).

        Raises:
            StoreError: the store did not answer (the leases lapse within ``lease_s``).
        """
        mine = [sid for sid in session_ids if self.held.pop(sid, None) is not None]
        if mine:
            await self.leases.release(mine)

    async def release_all(self) -> None:
        """Give every held lease up (a clean shutdown: another node need not wait for them)."""
        sessions, self.held = list(self.held), {}
        if sessions:
            await self.leases.release(sessions)

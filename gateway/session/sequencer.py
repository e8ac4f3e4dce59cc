"""The node-wide event id sequence (docs/protocol.md §1).

Ids are strictly increasing in emission order across all sessions of the node
and never reused, including the ids of streaming-only events that are never
persisted. So the sequence does not resume from the largest persisted id but
from *blocks* the store allocates to the node: before handing out ids the
sequencer asks the store for a block, and it asks for the next block when half
of the current one is used. A restart resumes above every block allocated
before it, skipping at most one unused block; skipped numbers are harmless
(ids are opaque to clients and only compared).

How a block is allocated is the store's (:meth:`gateway.store.base.Store.reserve_event_ids`):

- SQLite (one node): the block is simply the next one above the stored
  ceiling, granted at once; the raised ceiling is enqueued on the batching
  writer (flushed within ``flush_interval_ms``). With a block of 1,000,000 ids
  that leaves 500,000 ids of margin for that flush to land, several seconds of
  the fastest stream.
- Redis (several nodes): the block is an atomic increment of the deployment's
  counter, granted once Redis answers it, so two nodes never hold overlapping
  blocks. The 500,000 ids of margin are the time Redis has to answer.

Should a block be used up before the next one is granted (Redis unreachable
for that long under full load), the sequencer keeps counting past it rather
than stop the sessions (``on_overrun`` is told, once per block): ids stay
strictly increasing on this node, but another node may be granted those
numbers meanwhile. When the late block comes, the sequence continues in it,
above everything it handed out.

A node that takes over a session another node ran (its lease expired) must
issue that session's next ids above every id the previous owner could have
issued: :meth:`EventSequencer.needs_block_above` says whether the block in use
was granted before the counter reached a given value, and
:meth:`EventSequencer.renew` asks for a fresh block, used as soon as it is
granted (the rest of the current one is skipped).
"""

from __future__ import annotations

from collections.abc import Callable

from gateway.ids import format_event_id

Reserve = Callable[[int, Callable[[int], None]], None]
"""``reserve(block, granted)``: the store's :meth:`~gateway.store.base.Store.reserve_event_ids`."""


class EventSequencer:
    """Hands out event sequence numbers from the blocks the store grants this node.

    Args:
        reserve: asks the store for a block of ``block`` ids; it calls back
            ``granted(top)`` with the block's last id (at once, or later).
        block: the block size.
        on_overrun: told the sequence number at which the ids ran past the
            granted blocks (module docstring).

    The first block is asked for at construction; :attr:`ready` says whether
    it has been granted (the node waits for it before any id is issued).
    """

    def __init__(
        self,
        reserve: Reserve,
        block: int = 1_000_000,
        on_overrun: Callable[[int], None] | None = None,
    ):
        self.last = 0  # the last id issued (or the base of the first block)
        self.ceiling = 0  # the last id of the block in use
        self.ready = False  # the first block was granted
        self._block = block
        self._reserve = reserve
        self._on_overrun = on_overrun
        self._next: int | None = None  # the top of a block granted ahead, not in use yet
        self._asked = False  # a block was asked for and not granted yet
        self._fresh = False  # the block asked for replaces the current one (renew)
        self._overran = False
        self._ask()

    def next(self) -> int:
        if self.last >= self.ceiling and self._next is not None:
            self._switch(self._next)
        self.last += 1
        if self.last > self.ceiling and not self._overran:
            self._overran = True
            if self._on_overrun is not None:
                self._on_overrun(self.last)
        if not self._asked and self._next is None and self.last > self.ceiling - self._block // 2:
            self._ask()
        return self.last

    def needs_block_above(self, counter: int) -> bool:
        """Whether the block in use was granted before the store's counter reached ``counter``.

        ``counter`` is what the store's block counter read (a lease taken:
        :class:`gateway.store.lease.Taken`); every id any node could have issued
        before then is at most ``counter``. A block granted at a counter of at
        least that value lies above all of them.
        """
        if self.ceiling >= counter:
            return False
        if self._next is not None and self._next >= counter:
            self._switch(self._next)  # a block granted ahead is high enough: use it now
            return False
        return True

    def renew(self) -> None:
        """Ask for a fresh block, used as soon as it is granted (see :meth:`needs_block_above`).

        The caller waits for the grant (the store's ``flush``) and asks
        :meth:`needs_block_above` again: a request already in flight may be
        granted first, below the counter it needs.
        """
        self._fresh = True
        self._ask()

    # --- blocks ----------------------------------------------------------------

    def _ask(self) -> None:
        self._asked = True
        self._reserve(self._block, self._granted)

    def _granted(self, top: int) -> None:
        self._asked = False
        if not self.ready:
            self.ready = True
            self.last = top - self._block
            self.ceiling = top
        elif self._fresh or self.last >= self.ceiling:
            # Renewed, or the current block is used up (an overrun): continue in it.
            self._fresh = False
            if top > self.ceiling:
                self._switch(top)
        elif top > self.ceiling:
            self._next = top

    def _switch(self, top: int) -> None:
        """Continue in the block ending at ``top``: the next id is in it, above every one issued."""
        self.last = max(self.last, top - self._block)
        self.ceiling = top
        self._next = None
        self._overran = False

    @property
    def last_id(self) -> str | None:
        """The id of the last event issued on this node, ``None`` before the first ever."""
        return format_event_id(self.last) if self.last else None

"""The node-wide event id sequence (PROTOCOL section 1).

Ids are strictly increasing in emission order across all sessions of the node
and never reused, including the ids of streaming-only events that are never
persisted. So the sequence does not resume from the largest persisted id but
from a *reserved ceiling*: before handing out ids the sequencer reserves a
block above the last one in the store, and it reserves the next block when
half of the current one is used. A restart resumes above the ceiling, skipping
at most one unused block; skipped numbers are harmless (ids are opaque to
clients and only compared).

The reservation is enqueued on the store's batching writer (flushed within
``flush_interval_ms``); with a block of 1,000,000 ids that leaves 500,000 ids
of margin for that flush to land, several seconds of the fastest stream.
"""

from __future__ import annotations

from collections.abc import Callable

from gateway.ids import format_event_id


class EventSequencer:
    """Hands out event sequence numbers and keeps the reserved ceiling ahead of them."""

    def __init__(self, ceiling: int, reserve: Callable[[int], None], block: int = 1_000_000):
        self.last = ceiling  # every number up to the stored ceiling may have been used
        self._block = block
        self._reserve = reserve
        self.ceiling = ceiling + block
        reserve(self.ceiling)

    def next(self) -> int:
        self.last += 1
        if self.last > self.ceiling - self._block // 2:
            self.ceiling += self._block
            self._reserve(self.ceiling)
        return self.last

    @property
    def last_id(self) -> str | None:
        """The id of the last event issued on this node, ``None`` before the first ever."""
        return format_event_id(self.last) if self.last else None

"""A session's tail: its latest catalog events, in memory, for a replay (docs/protocol.md §3).

Bounded by ``[stream] replay_max_events`` and ``tail_max_bytes`` (each
event's JSON and its frame counted); what it drops is in the store, and
:attr:`Tail.floor` says up to where a replay must read the store first.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

from gateway.session.hub import Emitted


class Tail:
    """A session's latest catalog events, oldest first (module docstring).

    Args:
        max_events: how many it keeps at the most.
        max_bytes: how many bytes of JSON and frames it keeps at the most.
        floor: every event id up to it may be only in the store.
    """

    def __init__(self, max_events: int, max_bytes: int, floor: int) -> None:
        self.events: deque[Emitted] = deque()
        self.max_events = max_events
        self.max_bytes = max_bytes
        self.bytes = 0  # what its events hold (their JSON and their frames)
        self.floor = floor

    def __iter__(self) -> Iterator[Emitted]:
        return iter(self.events)

    def __reversed__(self) -> Iterator[Emitted]:
        return reversed(self.events)

    def __len__(self) -> int:
        return len(self.events)

    def append(self, em: Emitted) -> None:
        """Keep a catalog event; drop the oldest down to the bounds."""
        self.events.append(em)
        self.bytes += len(em.data) + len(em.frame)
        events = self.events
        while events and (len(events) > self.max_events or self.bytes > self.max_bytes):
            old = events.popleft()
            self.bytes -= len(old.data) + len(old.frame)
            self.floor = old.seq

    def reset(self, floor: int) -> None:
        """Empty it: everything up to ``floor`` (or its own floor, if later) is in the store."""
        self.events.clear()
        self.bytes = 0
        self.floor = max(self.floor, floor)

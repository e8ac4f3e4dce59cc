"""Fan-out: one session's subscriptions, grouped by distinct filter (PROTOCOL section 3).

The hot path of the gateway. An emitted batch of events is matched once per
*distinct* filter (not once per client), the matching events' frames (each
encoded and framed once, for every client) are wrapped in one shared
:class:`FrameBatch`, and each subscriber of the group gets that batch with one
non-blocking ``deliver``. Enqueueing never blocks the session: a subscriber
whose bounded queue would overflow says so, and the session applies the
slow-client rule (``bus.handler_warning``, close 1008) after the fan-out.

A worker session's hub forwards every batch to its parent's hub, where only
subscriptions with ``include_worker_sessions`` match it (PROTOCOL section 5).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from gateway.protocol.filters import FilterKey


@dataclass(slots=True)
class Emitted:
    """One event as emitted: its sequence number, routing facts and wire bytes.

    ``data`` is the event's JSON (what the trace store keeps); ``frame`` is the
    complete WebSocket text frame of ``{"type": "event", "event": data}``.
    """

    seq: int
    type: str
    actor: str
    session_id: str
    turn_id: str | None
    ts: int
    data: bytes
    frame: bytes


class FrameBatch:
    """Frames of consecutive matching events, shared by every client of one filter.

    ``blob`` is every frame joined, once for all the clients that send this
    batch whole; ``n`` is how many events it holds.
    """

    __slots__ = ("blob", "frames", "n", "seqs")

    def __init__(self, frames: list[bytes], seqs: list[int]) -> None:
        self.frames = frames
        self.seqs = seqs
        self.n = len(seqs)
        self.blob = frames[0] if len(frames) == 1 else b"".join(frames)

    def __len__(self) -> int:
        return self.n

    def after(self, cut: int) -> bytes:
        """The frames of events with id > ``cut`` (the seam, PROTOCOL section 3)."""
        if self.seqs[0] > cut:
            return self.blob
        return b"".join(f for f, s in zip(self.frames, self.seqs, strict=True) if s > cut)


class Subscriber(Protocol):
    """A connection's side of a subscription."""

    name: str

    def deliver(self, batch: FrameBatch, now: float) -> bool:
        """Write or enqueue without blocking; ``False`` when the bounded queue would overflow.

        ``now`` is the trio clock at the fan-out (read once for all clients).
        """
        ...

    def overflowed(self) -> None:
        """Apply the slow-client rule to this subscription (called after the fan-out)."""
        ...


class Hub:
    """The subscriptions of one session, and their parent hub for worker sessions."""

    def __init__(self, parent: Hub | None = None) -> None:
        self.parent = parent
        self._groups: dict[FilterKey, list[Subscriber]] = {}

    def __len__(self) -> int:
        return sum(len(subs) for subs in self._groups.values())

    def subscribe(self, sub: Subscriber, key: FilterKey) -> None:
        self._groups.setdefault(key, []).append(sub)

    def unsubscribe(self, sub: Subscriber) -> bool:
        """Remove ``sub`` wherever it is; ``True`` if it was subscribed."""
        for key, subs in self._groups.items():
            if sub in subs:
                subs.remove(sub)
                if not subs:
                    del self._groups[key]
                return True
        return False

    def publish(
        self, events: list[Emitted], now: float, *, from_worker: bool = False
    ) -> list[Subscriber]:
        """Fan a batch out to every matching subscription, here and up the parent chain.

        Args:
            events: one emitted batch, in id order.
            now: the trio clock, read once by the caller for every client.

        Returns:
            The subscribers whose queue overflowed (still subscribed: the
            caller applies the slow-client rule).
        """
        overflowed: list[Subscriber] = []
        for key, subs in self._groups.items():
            batch = _select(events, key, from_worker)
            if batch is None:
                continue
            for sub in subs:
                if not sub.deliver(batch, now):
                    overflowed.append(sub)
        if self.parent is not None:
            overflowed += self.parent.publish(events, now, from_worker=True)
        return overflowed


def _select(events: list[Emitted], key: FilterKey, from_worker: bool) -> FrameBatch | None:
    chosen = key.select(events, from_worker)
    if not chosen:
        return None
    return FrameBatch([e.frame for e in chosen], [e.seq for e in chosen])

"""Latency histograms and the counters a measured window produces.

End-to-end latency is "receipt time minus the event's ``ts``" (the issue's
definition). ``ts`` is whole milliseconds (docs/protocol.md §4), truncated, so
every sample is the true latency plus up to 1 ms: figures are upper bounds,
and they are the same kind of bound for the gateway and its peers, whose
frames carry a ``ts`` made the same way.

Workers keep a fixed-bin :class:`Histogram` (0.1 ms bins up to 5 s) instead of
samples: recording is one list increment, and histograms from many processes
add up exactly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

BIN_MS = 0.1
BINS = 50_000  # 5 s; slower samples land in the last bin


class Histogram:
    """Counts of latency samples in :data:`BIN_MS` bins."""

    __slots__ = ("counts",)

    def __init__(self) -> None:
        self.counts = [0] * (BINS + 1)

    def add(self, latency_ms: float) -> None:
        index = int(latency_ms * 10.0)  # 1 / BIN_MS
        self.counts[index if 0 <= index < BINS else (0 if index < 0 else BINS)] += 1

    def sparse(self) -> dict[int, int]:
        """The non-empty bins, for sending to the parent process."""
        return {i: c for i, c in enumerate(self.counts) if c}

    def merge_sparse(self, bins: dict[int, int]) -> None:
        for i, c in bins.items():
            self.counts[i] += c

    def percentile(self, p: float) -> float | None:
        """The upper edge of the bin holding the ``p``-th percentile, in ms; None if empty."""
        total = sum(self.counts)
        if not total:
            return None
        rank = p / 100.0 * total
        seen = 0
        for i, c in enumerate(self.counts):
            seen += c
            if seen >= rank and c:
                return round((i + 1) * BIN_MS, 1)
        return round(BINS * BIN_MS, 1)

    def summary(self) -> dict[str, float | None]:
        return {
            "p50_ms": self.percentile(50),
            "p99_ms": self.percentile(99),
            "p999_ms": self.percentile(99.9),
        }


@dataclass
class GroupCounts:
    """What the connections of one group saw during a window (summed over workers)."""

    events: int = 0
    bytes: int = 0
    connections: int = 0  # open at the end of the window
    latency: Histogram = field(default_factory=Histogram)

    def merge(self, part: dict[str, Any]) -> None:
        self.events += part["events"]
        self.bytes += part["bytes"]
        self.connections += part["connections"]
        self.latency.merge_sparse(part["latency"])


@dataclass
class Window:
    """One measured window, all workers together.

    ``client_cpu_s`` is per worker: a worker that used nearly a CPU second
    per second of the window was saturated, so the clients may have limited
    the figure.
    """

    groups: dict[str, GroupCounts]
    client_cpu_s: list[float]

    def group(self, name: str) -> GroupCounts:
        return self.groups.get(name) or GroupCounts()

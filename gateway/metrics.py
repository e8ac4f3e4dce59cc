"""Prometheus metrics (``GET /metrics``, PROTOCOL section 2).

One :class:`Metrics` per node with its own registry, so that several gateways
in one process (the tests) never share counters. Counters on the hot path are
bumped once per emitted batch, not once per event or per client.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator
from typing import Any

import trio
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST

CONTENT_TYPE = CONTENT_TYPE_LATEST


class Metrics:
    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        # Hot-path totals: plain integers, read only when /metrics is scraped.
        self.events_by_type: defaultdict[str, int] = defaultdict(int)
        self.frames_sent = 0
        r.register(_HotTotals(self))
        self.ws_connections = Gauge(
            "gateway_ws_connections", "Open WebSocket connections", registry=r
        )
        self.ws_closed = Counter(
            "gateway_ws_closed", "WebSocket connections closed, by reason", ["reason"], registry=r
        )
        self.slow_clients = Counter(
            "gateway_slow_client_closes", "Connections closed as too slow (1008)", registry=r
        )
        self.http_requests = Counter(
            "gateway_http_requests", "HTTP requests, by route and status",
            ["route", "status"], registry=r,
        )  # fmt: skip
        self.sessions_live = Gauge("gateway_sessions_live", "Sessions loaded", registry=r)
        self.turns = Counter("gateway_turns", "Turns ended, by outcome", ["outcome"], registry=r)
        self.replays = Counter("gateway_replay_events", "Event frames sent by replays", registry=r)
        self.session_failures = Counter(
            "gateway_session_failures",
            "Failures caught at a session's boundary (a gateway bug or a broken component)",
            ["component"], registry=r,
        )  # fmt: skip
        self.store_write_failures = Counter(
            "gateway_store_write_failures", "Store writes that failed and were retried", registry=r
        )
        self.tasks = Gauge("gateway_tasks", "Trio tasks alive in the daemon", registry=r)
        self.tasks.set_function(_count_tasks)
        # process_open_fds, process_resident_memory_bytes, ... (the soak watches them)
        ProcessCollector(registry=r)

    def events_emitted(self, emitted: Iterable[Any]) -> None:
        tally = self.events_by_type
        for e in emitted:
            tally[e.type] += 1

    def render(self) -> bytes:
        return generate_latest(self.registry)


def _count_tasks() -> float:
    """Every task under the Trio root task (0 outside a Trio run)."""
    try:
        root = trio.lowlevel.current_root_task()
    except RuntimeError:
        return 0.0
    if root is None:
        return 0.0
    count, stack = 0, [root]
    while stack:
        task = stack.pop()
        count += 1
        for nursery in task.child_nurseries:
            stack.extend(nursery.child_tasks)
    return float(count)


class _HotTotals:
    """Exports the hot-path totals of :class:`Metrics` as Prometheus counters."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        events = CounterMetricFamily(
            "gateway_events_emitted", "Events emitted, by type", labels=["type"]
        )
        for type_, n in sorted(self.metrics.events_by_type.items()):
            events.add_metric([type_], n)
        yield events
        yield CounterMetricFamily(
            "gateway_event_frames_sent",
            "Event frames written to WebSocket clients",
            value=self.metrics.frames_sent,
        )

"""Prometheus metrics (``GET /metrics``, docs/protocol.md §2; listed in docs/operating.md).

One :class:`Metrics` per node with its own registry, so that several gateways
in one process (the tests) never share counters. Names follow Prometheus'
conventions: the unit in the name (``_seconds``, ``_events``, ``_rows``),
``_total`` on counters (added by the client library), and bounded label sets
only (a route name, a close code, a tool of the fixed registry, an error class
of the catalog; never a session or turn id).

Keeping the hot path cheap: the per-event fan-out (the hub's direct writes)
makes no metric call at all; its totals are plain integers exported when
``/metrics`` is scraped (:class:`_HotTotals`). The queued path observes the
queue depth once per delivery into a :class:`FastHistogram` (a bisect and two
additions, no lock: the gateway is one Trio thread). Gauges that describe the
node (turns in flight, connections by state) are computed at scrape time from
the node itself (:meth:`Metrics.watch`), so nothing keeps them up to date.
Everything else (a turn, a tool call, a replay, a store flush) is observed once
per occurrence, with ``prometheus_client``'s own histograms.
"""

from __future__ import annotations

import contextlib
import gc
import threading
import time
from bisect import bisect_left
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import trio
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST

CONTENT_TYPE = CONTENT_TYPE_LATEST

CONNECTION_STATES = ("subscribing", "live", "closing")
"""``gateway_ws_connections_by_state``: before a subscribe, subscribed, a close decided."""

DOORS = ("websocket", "sse", "agui", "ai_sdk", "ai_sdk_ws", "a2a")
"""``gateway_streams_open``: each door a stream comes through (docs/protocol.md §14)."""

# Close codes a label may carry (RFC 6455 section 7.4.1, plus what the gateway
# sends); any other code a client picks (4000-4999 are free) is "other".
_KNOWN_CLOSE_CODES = frozenset(
    {1000, 1001, 1002, 1003, 1005, 1006, 1007, 1008, 1009, 1010, 1011, 1012, 1013, 1014}
)


def close_code_label(code: int | None) -> str:
    """The ``code`` label of a close: a known code, ``"other"``, or ``"none"``."""
    if code is None:
        return "none"
    return str(code) if code in _KNOWN_CLOSE_CODES else "other"


class LogLinesDropped:
    """``gateway_log_lines_dropped_total``: log lines dropped for a reader that fell behind.

    One per process, like the log it counts (gateway.logs): every node's
    ``/metrics`` exports it. Added to from whichever thread logged or wrote the
    line, hence the lock (taken only when a line is dropped).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.total = 0

    def add(self, n: int = 1) -> None:
        with self._lock:
            self.total += n


LOG_LINES_DROPPED = LogLinesDropped()
"""The process's one count of dropped log lines (:class:`LogLinesDropped`)."""


class FastHistogram:
    """A histogram for the hot path: :meth:`observe` is a bisect and two additions.

    Not thread-safe, and needs none: it is only observed from the Trio thread.
    Exported as a Prometheus histogram at scrape time (:class:`_HotTotals`).
    """

    def __init__(self, name: str, documentation: str, buckets: Sequence[float]) -> None:
        if list(buckets) != sorted(set(buckets)):
            raise ValueError(f"{name}: buckets must be strictly increasing, got {buckets}")
        self.name = name
        self.documentation = documentation
        self.bounds = list(buckets)
        self.counts = [0] * (len(self.bounds) + 1)  # the last one is +Inf
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value

    def family(self) -> HistogramMetricFamily:
        buckets, total = self.buckets_and_sum()
        return HistogramMetricFamily(
            self.name, self.documentation, buckets=buckets, sum_value=total
        )

    def buckets_and_sum(self) -> tuple[list[tuple[str, float]], float]:
        """The cumulative buckets (``le`` label, count) and the sum, as exported."""
        buckets: list[tuple[str, float]] = []
        running = 0
        for bound, n in zip([*self.bounds, float("inf")], self.counts, strict=True):
            running += n
            buckets.append(("+Inf" if bound == float("inf") else _le(bound), running))
        return buckets, self.sum


class GcPauses:
    """``gateway_gc_pause_seconds``: how long each garbage collection stopped the process.

    One per process, like the collector it times (``gc.callbacks``): ``gateway
    serve`` installs it while it runs (:meth:`installed`). A collection runs in
    whichever thread allocated, with the GIL held and never two at once, so
    its start and stop pair up and the histograms need no lock. The daemon's
    start-up objects (some 52,000: its modules and their tables) are frozen
    out of the collector once it serves (docs/operating.md "Garbage
    collection"), so a full collection scans what came since, not them.
    """

    BUCKETS = (0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0)

    def __init__(self) -> None:
        self.by_generation = [
            FastHistogram("gateway_gc_pause_seconds", "", self.BUCKETS) for _ in range(3)
        ]
        self._started = 0.0

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.by_generation[info["generation"]].observe(time.perf_counter() - self._started)

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        """Time every collection while the block runs."""
        gc.callbacks.append(self._callback)
        try:
            yield
        finally:
            gc.callbacks.remove(self._callback)

    def families(self) -> Iterator[Metric]:
        pauses = HistogramMetricFamily(
            "gateway_gc_pause_seconds",
            "Python garbage collections, by generation, and how long each stopped the process",
            labels=["generation"],
        )
        for generation, histogram in enumerate(self.by_generation):
            pauses.add_metric([str(generation)], *histogram.buckets_and_sum())
        yield pauses
        yield GaugeMetricFamily(
            "gateway_gc_frozen_objects",
            "Objects frozen out of garbage collection (the daemon's start-up objects)",
            value=gc.get_freeze_count(),
        )


GC_PAUSES = GcPauses()
"""The process's timing of its garbage collections (:class:`GcPauses`)."""


def _le(bound: float) -> str:
    return repr(float(bound))  # what prometheus_client writes: "1.0", "0.005"


class Metrics:
    """Every metric family of one node (module docstring)."""

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        # Hot-path totals: plain integers, read only when /metrics is scraped.
        self.events_by_type: defaultdict[str, int] = defaultdict(int)
        self.frames_sent = 0
        self.outbound_queue_depth = FastHistogram(
            "gateway_outbound_queue_depth_events",
            "Events queued for a client right after a delivery to its queue (the queued path)",
            (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000),
        )
        self._turns_in_flight: Callable[[], int] = lambda: 0
        self._connection_states: Callable[[], Iterable[str]] = lambda: ()
        r.register(_HotTotals(self))
        # The families by what they watch; registered (and so exported) in this order.
        self._connection_families(r)
        self._turn_families(r)
        self._replay_families(r)
        self._failure_families(r)
        self._store_families(r)
        self._webhook_families(r)
        self.tasks = Gauge("gateway_tasks", "Trio tasks alive in the daemon", registry=r)
        self.tasks.set_function(_count_tasks)
        self.turns_in_flight = Gauge(
            "gateway_turns_in_flight", "Turns started and not yet ended", registry=r
        )
        self.turns_in_flight.set_function(lambda: float(self._turns_in_flight()))
        # process_open_fds, process_resident_memory_bytes, ... (the soak watches them)
        ProcessCollector(registry=r)

    def _connection_families(self, r: CollectorRegistry) -> None:
        """WebSocket connections, HTTP requests and the sessions loaded."""
        self.ws_connections = Gauge(
            "gateway_ws_connections", "Open WebSocket connections", registry=r
        )
        self.ws_closed = Counter(
            "gateway_ws_closed",
            "WebSocket connections closed, by the close's name and its WebSocket code",
            ["reason", "code"], registry=r,
        )  # fmt: skip
        self.slow_clients = Counter(
            "gateway_slow_client_closes", "Connections closed as too slow (1008)", registry=r
        )
        self.http_requests = Counter(
            "gateway_http_requests", "HTTP requests, by route and status",
            ["route", "status"], registry=r,
        )  # fmt: skip
        self.sessions_live = Gauge("gateway_sessions_live", "Sessions loaded", registry=r)
        self.sessions_unloaded = Counter(
            "gateway_sessions_unloaded", "Sessions that left memory, unused", registry=r
        )
        self.idempotent_replays = Counter(
            "gateway_idempotent_replays",
            "POSTs answered with the answer recorded under their Idempotency-Key",
            registry=r,
        )

    def _turn_families(self, r: CollectorRegistry) -> None:
        """Turns, the LLM calls and the tool calls they make."""
        self.turns = Counter(
            "gateway_turns", "Turns ended, by outcome (stop reason, or cancelled)", ["outcome"],
            registry=r,
        )  # fmt: skip
        self.turn_duration = Histogram(
            "gateway_turn_duration_seconds",
            "Turns, from turn.started to their end, by outcome",
            ["outcome"], registry=r,
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600),
        )  # fmt: skip
        self.time_to_first_token = Histogram(
            "gateway_time_to_first_token_seconds",
            "Each LLM call, from its start to its first text or thinking delta emitted",
            registry=r,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
        )  # fmt: skip
        self.tool_duration = Histogram(
            "gateway_tool_duration_seconds",
            "Tool calls, by tool (unknown names are 'unknown') and outcome",
            ["tool", "outcome"], registry=r,
            buckets=(0.001, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300),
        )  # fmt: skip
        self.provider_errors = Counter(
            "gateway_provider_errors",
            "LLM calls that failed, by error class (llm.call_failed; cancels not counted)",
            ["error_class"], registry=r,
        )  # fmt: skip
        self.unknown_events = Counter(
            "gateway_unknown_events",
            "Stream events and content blocks of a type the gateway does not know, skipped",
            ["runtime"], registry=r,
        )  # fmt: skip

    def _replay_families(self, r: CollectorRegistry) -> None:
        """Replays: a subscribe with ``since`` (docs/protocol.md §5)."""
        self.replays = Counter("gateway_replay_events", "Event frames sent by replays", registry=r)
        self.replay_size = Histogram(
            "gateway_replay_size_events",
            "Events sent by each replay (a subscribe with since)",
            registry=r,
            buckets=(0, 1, 10, 50, 100, 500, 1000, 5000, 10000, 50000),
        )  # fmt: skip
        self.replay_duration = Histogram(
            "gateway_replay_duration_seconds",
            "Each replay, from the subscribe to its frames ready (store reads included)",
            registry=r,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5),
        )  # fmt: skip

    def _failure_families(self, r: CollectorRegistry) -> None:
        """Failures caught where they are contained: a session's boundary, an MCP server."""
        self.session_failures = Counter(
            "gateway_session_failures",
            "Failures caught at a session's boundary (a gateway bug or a broken component)",
            ["component"], registry=r,
        )  # fmt: skip
        self.mcp_server_failures = Counter(
            "gateway_mcp_server_failures",
            "MCP servers that failed to start, died or hung (mcp_server_failed), by server",
            ["server"], registry=r,
        )  # fmt: skip

    def _store_families(self, r: CollectorRegistry) -> None:
        """The store's commits: their failures, time and size."""
        self.store_write_failures = Counter(
            "gateway_store_write_failures", "Store writes that failed and were retried", registry=r
        )
        self.store_flush_duration = Histogram(
            "gateway_store_flush_duration_seconds",
            "Store commits (one batch, one transaction; retries included)",
            registry=r,
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5),
        )  # fmt: skip
        self.store_flush_rows = Histogram(
            "gateway_store_flush_rows",
            "Rows (sessions, messages, events) written by each store commit",
            registry=r,
            buckets=(1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 5000),
        )  # fmt: skip

    def _webhook_families(self, r: CollectorRegistry) -> None:
        """Webhook deliveries (gateway.webhooks): made, failed, dropped, pending."""
        self.webhook_deliveries = Counter(
            "gateway_webhook_deliveries", "Webhook deliveries a receiver accepted (2xx)",
            ["webhook"], registry=r,
        )  # fmt: skip
        self.webhook_failures = Counter(
            "gateway_webhook_failures",
            "Webhook delivery attempts that failed (no answer in time, no connection, not 2xx)",
            ["webhook"], registry=r,
        )  # fmt: skip
        self.webhook_dropped = Counter(
            "gateway_webhook_dropped",
            "Webhook deliveries dropped after max_attempts failed attempts (webhook_dropped)",
            ["webhook"], registry=r,
        )  # fmt: skip
        self.webhook_outbox = Gauge(
            "gateway_webhook_outbox",
            "Webhook deliveries pending in the store's outbox (read at each delivery round)",
            registry=r,
        )

    def watch(
        self,
        *,
        turns_in_flight: Callable[[], int],
        connection_states: Callable[[], Iterable[str]],
        streams_by_door: Callable[[], Mapping[str, int]] = dict,
    ) -> None:
        """Where the scrape-time gauges read the node (module docstring).

        Args:
            turns_in_flight: how many turns are in flight now.
            connection_states: the state of each open connection, one of
                :data:`CONNECTION_STATES`.
            streams_by_door: the streams open now, by door (:data:`DOORS`).
        """
        self._turns_in_flight = turns_in_flight
        self._connection_states = connection_states
        self._streams_by_door = streams_by_door

    def streams_by_door(self) -> Mapping[str, int]:
        counts = dict.fromkeys(DOORS, 0)
        counts.update(self._streams_by_door())
        return counts

    def connections_by_state(self) -> Mapping[str, int]:
        counts = dict.fromkeys(CONNECTION_STATES, 0)
        for state in self._connection_states():
            counts[state] = counts.get(state, 0) + 1
        return counts

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
    """Exports what :class:`Metrics` keeps without prometheus_client, at scrape time."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        m = self.metrics
        events = CounterMetricFamily(
            "gateway_events_emitted", "Events emitted, by type", labels=["type"]
        )
        for type_, n in sorted(m.events_by_type.items()):
            events.add_metric([type_], n)
        yield events
        yield CounterMetricFamily(
            "gateway_event_frames_sent",
            "Event frames written to WebSocket clients",
            value=m.frames_sent,
        )
        yield m.outbound_queue_depth.family()
        yield CounterMetricFamily(
            "gateway_log_lines_dropped",
            "Log lines dropped because the log's queue was full (its reader fell behind)",
            value=LOG_LINES_DROPPED.total,
        )
        yield from GC_PAUSES.families()
        states = GaugeMetricFamily(
            "gateway_ws_connections_by_state",
            "Open WebSocket connections: subscribing (no subscribe yet), live, closing",
            labels=["state"],
        )
        for state, n in m.connections_by_state().items():
            states.add_metric([state], n)
        yield states
        doors = GaugeMetricFamily(
            "gateway_streams_open",
            "Open streams (each counted against max_connections), by the door they came through",
            labels=["door"],
        )
        for door, n in m.streams_by_door().items():
            doors.add_metric([door], n)
        yield doors

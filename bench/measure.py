"""One measured window: what the clients got, what the server and the machine spent.

A window's figures are only as good as the machine was quiet and the clients
were idle enough: :class:`Step` carries both checks (``noisy``,
``client_limited``) beside the figures, and the report repeats them.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

import psutil  # type: ignore[import-untyped]

from bench.servers import Server
from bench.stats import Window

SUSTAINED_SHARE = 0.9  # delivered / offered at or above this: the load is sustained
SUSTAINED_P99_MS = 50.0  # ... and p99 at or under this
CLIENT_BUSY = 0.85  # a worker using this share of a core may be what limits a figure
NOISY = 0.25  # other processes took this many cores during a window: its figures are noisy


@dataclass
class Step:
    """One measured window of the fan-out."""

    clients: int
    rate: float  # text deltas per second per session, as asked
    offered_events_per_s: float  # what the load asks for, all clients together
    events_per_s: float  # what the clients received
    server_cpu_util: float | None  # server CPU seconds per wall second
    cpu_us_per_event: float | None
    p50_ms: float | None
    p99_ms: float | None
    p999_ms: float | None
    client_cpu_util: float  # the busiest client worker, share of one core
    clients_cpu_util: float  # all client workers together, in cores
    other_cpu_util: float  # processes outside the bench, in cores (a shared machine)
    clients_open: int
    # The server's store process (redis-server), when it has one; left out of
    # as_dict otherwise, so that a SQLite run's result reads as it always has.
    store_cpu_util: float | None = None
    store_cpu_us_per_event: float | None = None
    # Several nodes (bench.nodes): each node's CPU, redis-server's commands.
    # Left out of as_dict when None, as the store's figures are.
    nodes: dict[str, Any] | None = None

    @property
    def sustained(self) -> bool:
        return (
            self.events_per_s >= SUSTAINED_SHARE * self.offered_events_per_s
            and self.p99_ms is not None
            and self.p99_ms <= SUSTAINED_P99_MS
            and self.clients_open == self.clients
        )

    @property
    def client_limited(self) -> bool:
        return self.client_cpu_util >= CLIENT_BUSY

    @property
    def noisy(self) -> bool:
        return self.other_cpu_util >= NOISY

    def as_dict(self) -> dict[str, Any]:
        fields = asdict(self)
        if self.store_cpu_util is None:
            del fields["store_cpu_util"], fields["store_cpu_us_per_event"]
        if self.nodes is None:
            del fields["nodes"]
        return {
            **fields,
            "sustained": self.sustained,
            "client_limited": self.client_limited,
            "noisy": self.noisy,
        }


class Meter:
    """CPU seconds over a window: the server's, its store's, the bench's own, everyone else's.

    The last one matters on a shared machine: CPU that other processes took
    during the window is CPU the server or the clients could not have, so a
    window where it is high is flagged as noisy.
    """

    def __init__(self, server: Server) -> None:
        self.server = server
        self.t0 = time.monotonic()
        self.server0 = server.cpu_seconds()
        self.store0 = server.store_cpu_seconds()
        self.own0 = time.process_time()
        self.busy0 = machine_busy_s()
        self.wall_s = 0.0  # the window's length, once :meth:`step` has closed it

    def step(
        self, window: Window, group: str, *, clients: int, rate: float, offered: float
    ) -> Step:
        wall = self.wall_s = time.monotonic() - self.t0
        server1 = self.server.cpu_seconds()
        server = None if self.server0 is None or server1 is None else server1 - self.server0
        store1 = self.server.store_cpu_seconds()
        store = None if self.store0 is None or store1 is None else store1 - self.store0
        bench = time.process_time() - self.own0 + sum(window.client_cpu_s)
        others = machine_busy_s() - self.busy0 - bench - (server or 0.0) - (store or 0.0)
        live = window.group(group)
        latency = live.latency.summary()
        return Step(
            clients=clients,
            rate=rate,
            offered_events_per_s=round(offered, 1),
            events_per_s=round(live.events / wall, 1),
            server_cpu_util=None if server is None else round(server / wall, 3),
            cpu_us_per_event=None if server is None or not live.events else round(
                server / live.events * 1e6, 2
            ),
            p50_ms=latency["p50_ms"],
            p99_ms=latency["p99_ms"],
            p999_ms=latency["p999_ms"],
            client_cpu_util=round(max(window.client_cpu_s, default=0.0) / wall, 3),
            clients_cpu_util=round(sum(window.client_cpu_s) / wall, 3),
            other_cpu_util=round(max(0.0, others) / wall, 3),
            clients_open=live.connections,
            store_cpu_util=None if store is None else round(store / wall, 3),
            store_cpu_us_per_event=None if store is None or not live.events else round(
                store / live.events * 1e6, 2
            ),
        )  # fmt: skip


def machine_busy_s() -> float:
    t = psutil.cpu_times()
    return float(t.user + t.nice + t.system + t.irq + t.softirq + getattr(t, "steal", 0.0))

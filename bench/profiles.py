"""Bench profiles: how big each phase is.

``default`` is the documented profile (bench/README.md): it produces every
figure of the issue's targets on a 2-core machine in under five minutes.
``smoke`` is the same run shrunk to seconds, for CI: every phase runs and
every key of the result exists, but its figures mean nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

PEERS = ("ws_queue", "ws_broadcast", "raw")


@dataclass(frozen=True)
class Profile:
    """The size of every phase of a run (bench/README.md explains each phase)."""

    name: str
    # Fan-out: ``sessions`` sessions, clients added up to each count of
    # ``client_counts`` (the last is the reference point) at ``rate`` deltas/s
    # per session; then, at the last count, the rate stepped through ``rates``.
    sessions: int = 10
    client_counts: tuple[int, ...] = (100, 300, 1000)
    rate: float = 3.0
    rates: tuple[float, ...] = (9.0, 27.0, 81.0, 243.0)
    words: int = 200  # lorem words per turn
    window_s: float = 3.0  # one measured window
    # The windows whose p99 is a target (half load; the slow clients'
    # baseline): longer, so that one scheduling hiccup of the machine does
    # not decide a p99 of a few milliseconds.
    latency_window_s: float = 6.0
    settle_s: float = 1.0  # load running before a window opens
    # Slow clients: a share of the clients stop reading.
    slow_sessions: int = 2
    slow_clients: int = 10  # per session
    slow_rate: float = 200.0
    stalled_share: float = 0.1
    stall_timeout_s: float = 30.0
    # Replay.
    replay_events: int = 10_000
    storm_clients: int = 1000
    storm_events: int = 300
    # Idle connections: server RSS per connection at each count.
    idle_counts: tuple[int, ...] = (1000, 10_000)
    idle_sessions: int = 100
    idle_settle_s: float = 1.0  # before reading RSS
    # Who else runs, and how many client processes.
    peers: tuple[str, ...] = PEERS
    workers: int = 2
    ttft: bool = True
    ttft_runs: int = 100  # per path (bench/ttft.py)
    ttft_warmup: int = 10
    # Gateway config keys the profile sets (RUNNING.md names), unless the
    # operator brings a config file.
    gateway_config: dict[str, dict[str, Any]] = field(default_factory=dict)


_BENCH_GATEWAY_CONFIG: dict[str, dict[str, Any]] = {
    # Loopback sockets get multi-megabyte kernel send buffers, which would hide
    # a stalled client for minutes. 64 KiB keeps that to a few seconds; smaller
    # buffers slow bulk writes down sharply (a 10,000-event replay takes 1.4 s
    # at 16 KiB, 50 ms at 64 KiB).
    "server": {"send_buffer_bytes": 65536},
    "tools": {"enabled": ["sleep"]},
}

DEFAULT = Profile(name="default", gateway_config=_BENCH_GATEWAY_CONFIG)

SMOKE = Profile(
    name="smoke",
    sessions=2,
    client_counts=(4, 10),
    rate=50.0,
    rates=(100.0,),
    words=40,
    window_s=0.5,
    latency_window_s=0.5,
    settle_s=0.2,
    slow_sessions=1,
    slow_clients=10,
    slow_rate=400.0,
    stall_timeout_s=15.0,
    replay_events=500,
    storm_clients=20,
    storm_events=100,
    idle_counts=(50, 100),
    idle_sessions=4,
    idle_settle_s=0.2,
    workers=2,
    ttft_runs=5,
    ttft_warmup=1,
    gateway_config={
        **_BENCH_GATEWAY_CONFIG,
        # A small queue bound so that a stalled client overflows in a second
        # (still above the hundred events of one tool round, bench.scenarios).
        "stream": {"queue_max_events": 300},
    },
)

PROFILES = {p.name: p for p in (DEFAULT, SMOKE)}


def with_overrides(profile: Profile, **overrides: Any) -> Profile:
    """``profile`` with the fields given on the command line (None means "keep")."""
    return replace(profile, **{k: v for k, v in overrides.items() if v is not None})


def config_toml(sections: dict[str, dict[str, Any]], store_path: str) -> str:
    """A gateway TOML config (RUNNING.md "Config file") with the store at ``store_path``."""
    merged = {**sections, "store": {**sections.get("store", {}), "path": store_path}}
    lines: list[str] = []
    for section, keys in merged.items():
        lines.append(f"[{section}]")
        lines += [f"{key} = {_toml_value(value)}" for key, value in keys.items()]
        lines.append("")
    return "\n".join(lines)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return str(value)

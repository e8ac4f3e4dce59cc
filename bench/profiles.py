"""Bench profiles: how big each phase is.

``default`` is the documented profile (bench/README.md): it produces every
figure of the issue's targets on a 2-core machine in under five minutes.
``smoke`` is the same run shrunk to seconds, for CI: every phase runs and
every key of the result exists, but its figures mean nothing.

``soak`` and ``soak-smoke`` are of another kind, :class:`SoakProfile` (``bench.soak``):
ten minutes of churn against one daemon, and the same for 20 seconds.
``sessions`` and ``sessions-smoke``, :class:`SessionsProfile` (``bench.sessions``):
what an idle session costs in memory, with and without unloading.
``doors`` and ``doors-smoke``, :class:`DoorsProfile` (``bench.doors``): the
gateway's CPU per delivered event on each door to a session's stream (the
WebSocket, the native SSE, the AI SDK's SSE, AG-UI), in one run.
``rollup`` and ``rollup-smoke``, :class:`RollupProfile` (``bench.rollup``): the
delta rollup on and off, frames, bytes and CPU per delivered token, in one run.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

PEERS = ("ws_queue", "ws_broadcast", "raw")

_P = TypeVar("_P", "Profile", "SoakProfile", "SessionsProfile", "DoorsProfile", "RollupProfile")


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
    # The rate sweep of the multi-node profile (--nodes), one node and several
    # alike: finer, since the most each sustains is what it compares.
    node_rates: tuple[float, ...] = (27.0, 54.0, 81.0, 108.0, 135.0, 162.0, 216.0, 243.0)
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
    # Gateway config keys the profile sets (docs/reference.md names), unless the
    # operator brings a config file.
    gateway_config: dict[str, dict[str, Any]] = field(default_factory=dict)


_BENCH_GATEWAY_CONFIG: dict[str, dict[str, Any]] = {
    # Loopback sockets get multi-megabyte kernel send buffers, which would hide
    # a stalled client for minutes. 64 KiB keeps that to a few seconds; smaller
    # buffers slow bulk writes down sharply (a 10,000-event replay takes 1.4 s
    # at 16 KiB, 50 ms at 64 KiB).
    "server": {"send_buffer_bytes": 65536},
    "tools": {"enabled": ["sleep"]},
    # The replay phase's history is one turn of about 50 tool rounds: past the
    # default max_rounds (25), it would end early with too few events.
    "turns": {"max_rounds": 200},
}

DEFAULT = Profile(name="default", gateway_config=_BENCH_GATEWAY_CONFIG)

SMOKE = Profile(
    name="smoke",
    sessions=2,
    client_counts=(4, 10),
    rate=50.0,
    rates=(100.0,),
    node_rates=(100.0,),
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
        # Each session keeps its last replay_max_events catalog events in memory
        # for replays: a bounded cost by design, but at the default 10,000 the
        # soak's sessions (some 500 catalog events a minute each) would take 20
        # minutes to fill it and it would read as growth. 1,000 fill within the
        # warm-up; the audits replay 30 s (some 250 events) at a time.
        "stream": {"queue_max_events": 300, "replay_max_events": 1000},
    },
)

PROFILES = {p.name: p for p in (DEFAULT, SMOKE)}

# The checkpoint's cost (bench/checkpoint.py): the fan-out's reference step
# only, 100 clients at 3 tokens/s, with the checkpoint on and off in one run.
CHECKPOINT = Profile(
    name="checkpoint",
    client_counts=(100,),
    rates=(),
    window_s=5.0,
    peers=(),
    ttft=False,
    gateway_config=_BENCH_GATEWAY_CONFIG,
)
CHECKPOINT_SMOKE = replace(
    CHECKPOINT, name="checkpoint-smoke", sessions=2, client_counts=(4,), rate=20.0,
    words=40, window_s=0.5, settle_s=0.2,
)  # fmt: skip
CHECKPOINT_PROFILES = {p.name: p for p in (CHECKPOINT, CHECKPOINT_SMOKE)}


@dataclass(frozen=True)
class SoakProfile:
    """The size and the pass thresholds of a soak run (bench/README.md, "Soak").

    A soak is a warm-up of ``warmup_s``, a quiet point (the *baseline*), the
    load for ``duration_s``, and a second quiet point (the *end*). Slopes are
    least-squares fits over the samples of the load; they are judged only when
    the load lasts ``judge_slopes_after_s`` or more (over half a minute a
    slope is noise), the end-against-baseline figures always.
    """

    name: str
    duration_s: float = 600.0
    warmup_s: float = 150.0
    sessions: int = 6  # each with a stayer and a turn runner
    churners: int = 6
    slow_clients: int = 2  # each on a session of its own (at most ``sessions``)
    killers: int = 2
    # Sessions no client holds, each visited again after visitor_away_s (more than
    # [sessions] idle_unload_s): in and out of memory all through the run.
    visitors: int = 4
    visitor_away_s: float = 6.0
    sample_every_s: float = 5.0
    audit_every_s: float = 30.0  # per session: replay from the last audit's cursor
    turn_gap_s: float = 0.3  # a runner's pause between two turns
    turn_timeout_s: float = 60.0
    lorem_words: int = 800  # the text turn (fills a stalled client's queue)
    lorem_delay_ms: float = 4.0
    churn_read_s: tuple[float, float] = (0.3, 2.5)
    churn_pause_s: tuple[float, float] = (0.05, 0.5)
    kill_pause_s: float = 0.5
    max_stall_s: float = 30.0
    quiet_timeout_s: float = 20.0
    # Pass thresholds.
    fd_slack: int = 2  # end - baseline
    task_slack: int = 2
    fd_slope_max: float = 0.5  # per minute, absolute
    task_slope_max: float = 0.5
    # RSS may grow with what the daemon keeps by design: every message of a
    # loaded session (the history, measured at both quiet points). Its slope
    # must stay within rss_per_history times the history's growth (as JSON,
    # MiB per minute) plus rss_slope_slack_mib per minute.
    rss_per_history: float = 3.0
    rss_slope_slack_mib: float = 0.5
    judge_slopes_after_s: float = 300.0
    slope_after_s: float = 30.0  # the load's start is left out of the fits
    seed: int = 1
    gateway_config: dict[str, dict[str, Any]] = field(default_factory=dict)


_SOAK_GATEWAY_CONFIG: dict[str, dict[str, Any]] = {
    "server": {"send_buffer_bytes": 65536},  # as the load profiles (a stalled client shows)
    # A small queue bound: a stalled client overflows within seconds, well
    # above a live client's worst backlog.
    # Each session keeps its last replay_max_events catalog events in memory
    # for replays: a bounded cost by design, but at the default 10,000 the
    # soak's sessions (some 500 catalog events a minute each) would take 20
    # minutes to fill it and it would read as growth. 1,000 fill within the
    # warm-up; the audits replay 30 s (some 250 events) at a time.
    "stream": {"queue_max_events": 300, "replay_max_events": 1000},
    "tools": {
        "enabled": ["sleep", "read_file"],
        "require_approval": ["read_file"],  # a turn waiting at the seam (docs/protocol.md §8)
        "approval_timeout_s": 120,
    },
    # Sessions no client holds leave memory within seconds (bench/soak/visitors.py).
    "sessions": {"idle_unload_s": 2},
}

SOAK = SoakProfile(name="soak", gateway_config=_SOAK_GATEWAY_CONFIG)

SOAK_SMOKE = SoakProfile(
    name="soak-smoke",
    duration_s=20.0,
    warmup_s=5.0,
    sessions=3,
    churners=3,
    slow_clients=1,
    killers=1,
    visitors=2,
    visitor_away_s=3.0,
    sample_every_s=2.0,
    audit_every_s=10.0,
    max_stall_s=12.0,
    gateway_config=_SOAK_GATEWAY_CONFIG,
)

SOAK_PROFILES = {p.name: p for p in (SOAK, SOAK_SMOKE)}


@dataclass(frozen=True)
class SessionsProfile:
    """The sizes of a sessions run (bench/README.md, "Sessions": memory per idle session).

    Two daemons, one after the other: ``[sessions] idle_unload_s`` short (the
    daemon under test) and very long (the peer: nothing unloads). Each gets
    ``sessions`` sessions with one short turn each, then ``churn_rounds``
    rounds of ``churn_sessions`` more; attaches are timed on
    ``attach_samples`` sessions per path (snapshot, ``since`` replay).
    """

    name: str
    sessions: int = 20_000
    churn_rounds: int = 5
    churn_sessions: int = 1_000
    attach_samples: int = 500  # per path and daemon, each on a session of its own
    warmup_sessions: int = 10  # before the baseline RSS: lazy imports, caches
    concurrency: int = 32  # HTTP connections creating sessions at once
    idle_unload_s: float = 1.0  # the daemon under test
    peer_idle_unload_s: float = 1e7  # the peer: about four months, never within a run
    # The wait for gateway_sessions_live to drop back: at most unload_wait_s, and
    # given up once it has not fallen for unload_stall_s (nothing unloads).
    unload_wait_s: float = 600.0
    unload_stall_s: float = 10.0
    turns_wait_s: float = 300.0  # the longest wait for every turn to end
    settle_s: float = 1.0  # before reading RSS
    seed: int = 1
    gateway_config: dict[str, dict[str, Any]] = field(default_factory=dict)


SESSIONS = SessionsProfile(name="sessions")

SESSIONS_SMOKE = SessionsProfile(
    name="sessions-smoke",
    sessions=200,
    churn_rounds=1,
    churn_sessions=50,
    attach_samples=10,
    warmup_sessions=2,
    concurrency=8,
    unload_wait_s=10.0,
    unload_stall_s=2.5,
    turns_wait_s=30.0,
    settle_s=0.2,
)

SESSIONS_PROFILES = {p.name: p for p in (SESSIONS, SESSIONS_SMOKE)}


@dataclass(frozen=True)
class DoorsProfile:
    """The sizes of a doors run (bench/README.md, "Doors": CPU per delivered event by door).

    One daemon; ``repetitions`` rounds (after ``warmup`` rounds not counted),
    each measuring every door in a phase of its own: ``sessions`` fresh
    sessions, ``clients_per_session`` clients of that door on each, one turn
    per session (a ``sleep`` of ``sleep_s`` while the clients settle, then
    ``words`` words of ``lorem``, one text delta every ``delay_ms``).
    """

    name: str
    sessions: int = 4
    clients_per_session: int = 10
    words: int = 200  # text deltas per turn: one a word
    delay_ms: float = 10.0  # between two deltas: 100 deltas/s per session
    sleep_s: float = 1.0  # the tool round before the text: clients attach and settle
    repetitions: int = 5
    warmup: int = 1
    filter: str = "preset:chat"  # the native doors' subscription (the AI SDK's is its own)
    turn_timeout_s: float = 60.0
    gateway_config: dict[str, dict[str, Any]] = field(
        default_factory=lambda: dict(_BENCH_GATEWAY_CONFIG)
    )


DOORS = DoorsProfile(name="doors")

DOORS_SMOKE = DoorsProfile(
    name="doors-smoke",
    sessions=1,
    clients_per_session=2,
    words=20,
    delay_ms=2.0,
    sleep_s=0.2,
    repetitions=1,
    warmup=0,
    turn_timeout_s=20.0,
)

DOORS_PROFILES = {p.name: p for p in (DOORS, DOORS_SMOKE)}


@dataclass(frozen=True)
class RollupProfile:
    """The sizes of a rollup run (bench/README.md, "Delta rollup": rollup on and off).

    One daemon; ``repetitions`` rounds (after ``warmup``), each measuring every
    ``coalesce_ms`` of ``windows`` (0: off) in a phase of its own: ``sessions``
    fresh sessions, ``clients`` WebSocket clients spread evenly over them, one
    turn per session (a ``sleep`` of ``sleep_s``, then ``words`` words of
    ``lorem``, one every ``delay_ms``).
    """

    name: str
    sessions: int = 10  # --sessions 1: one session of 1,000 viewers
    clients: int = 1000
    words: int = 200
    delay_ms: float = 20.0  # 50 tokens/s per session
    sleep_s: float = 2.0
    windows: tuple[int, ...] = (0, 40)
    repetitions: int = 3
    warmup: int = 1
    filter: str = "preset:chat"
    turn_timeout_s: float = 60.0
    gateway_config: dict[str, dict[str, Any]] = field(
        default_factory=lambda: dict(_BENCH_GATEWAY_CONFIG)
    )

    @property
    def clients_per_session(self) -> int:
        return max(1, self.clients // self.sessions)


ROLLUP = RollupProfile(name="rollup")

ROLLUP_SMOKE = RollupProfile(
    name="rollup-smoke",
    sessions=1,
    clients=3,
    words=20,
    delay_ms=5.0,
    sleep_s=0.2,
    repetitions=1,
    warmup=0,
    turn_timeout_s=20.0,
)

ROLLUP_PROFILES = {p.name: p for p in (ROLLUP, ROLLUP_SMOKE)}


def with_overrides(profile: _P, **overrides: Any) -> _P:
    """``profile`` with the fields given on the command line (None means "keep")."""
    return replace(profile, **{k: v for k, v in overrides.items() if v is not None})


def config_toml(sections: dict[str, dict[str, Any]], store_path: str) -> str:
    """A gateway config (docs/reference.md "Configuration file"), its store at ``store_path``."""
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

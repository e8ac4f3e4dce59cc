"""``python -m bench``: load-test the gateway against its peers and print the table.

Examples::

    python -m bench                              # the default profile (bench/README.md)
    python -m bench --profile smoke              # seconds; what CI runs
    python -m bench --config my-gateway.toml     # size a deployment: your config
    python -m bench --url http://127.0.0.1:8421 --pid 1234 --peers none
    python -m bench --profile soak               # ten minutes of churn: fds, tasks, RSS flat?
    python -m bench --profile soak --minutes 30  # a longer soak
    python -m bench --profile fuzz               # hostile HTTP: never a 5xx, still answering?
    python -m bench --profile sessions           # RSS per idle session, unloading on vs off
    python -m bench --profile sessions --sessions 5000 --churn-rounds 3
    python -m bench --profile doors              # CPU per delivered event: WebSocket, SSE, AI SDK
    python -m bench --profile rollup             # delta rollup on/off: 1,000 clients, 50 tokens/s
    python -m bench --backend redis              # the gateway on [store] backend = "redis"
    python -m bench --backend both               # one node on SQLite vs one on Redis
    python -m bench --backend both --nodes 2     # ... and one node vs two on one Redis

Writes ``<out>/<stamp>-<profile>.json`` and ``.md``, and the plots
``<out>/<stamp>-<profile>-latency.png`` and ``-throughput.png``, then prints
the markdown table. Exit status 0 when the run completed (whether or not the
targets were met), 1 when it failed. A soak (``--profile soak`` or
``soak-smoke``, bench/README.md "Soak") writes ``<stamp>-<profile>.json`` and
``.md``; its exit status is 0 when every check passed, 1 otherwise. A fuzz
(``--profile fuzz`` or ``fuzz-smoke``, bench/README.md "Fuzz") writes
``<stamp>-<profile>.json``; its exit status is 0 when every check passed.
A sessions run (``--profile sessions`` or ``sessions-smoke``, bench/README.md
"Sessions") writes ``<stamp>-<profile>.json`` and ``.md``; exit status 0 when
it completed. So does a doors run (``--profile doors`` or ``doors-smoke``,
bench/README.md "Doors"), and a rollup run (``--profile rollup`` or
``rollup-smoke``, bench/README.md "Delta rollup").

``--backend redis`` runs every gateway of the run on ``[store] backend =
"redis"``, each against a redis-server the bench starts in its work dir
(``bench/redis_server.py``; it installs nothing: without redis-server the run
stops, saying so); ``--backend both`` runs only the fan-out, of one node on
SQLite and then one on Redis at the same loads, and reports their ratios
(``<stamp>-<profile>-redis-compare``). ``--nodes N`` (N >= 2, with
``--backend both`` or ``redis``) adds the multi-node profile
(:mod:`bench.nodes`): the fan-out of one node (with ``both``, the
comparison's node on Redis, whose rate sweep is then the profile's finer
``node_rates``, or ``--rates``) and then of N nodes on one redis-server in
each ``--shapes`` (``local``: clients on their session's node; ``remote``:
on another node; ``split``: every session on one node, every client on the
others), each node's CPU, redis-server's and its publishes per window, and
a capacity model; with ``redis`` only that
(``<stamp>-<profile>-redis[-compare]-nodesN``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench import report
from bench.fuzz import FUZZ_PROFILES
from bench.nodes import SHAPES, NodesServer
from bench.pool import WorkerPool
from bench.profiles import (
    CHECKPOINT_PROFILES,
    DOORS_PROFILES,
    PEERS,
    PROFILES,
    ROLLUP_PROFILES,
    SESSIONS_PROFILES,
    SOAK_PROFILES,
    Profile,
    config_toml,
    with_overrides,
)
from bench.redis_server import RedisMissing, redis_binary
from bench.scenarios import Run
from bench.servers import GatewayServer
from bench.worker import raise_fd_limit

RESULTS = Path(__file__).parent / "results"
BACKENDS = ("sqlite", "redis", "both")


def _counts(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(","))


def _rates(text: str) -> tuple[float, ...]:
    return tuple(float(x) for x in text.split(","))


def _shapes(text: str) -> tuple[str, ...]:
    names = tuple(text.split(","))
    for name in names:
        if name not in SHAPES:
            raise argparse.ArgumentTypeError(f"unknown shape {name!r}; choose from {SHAPES}")
    return names


def _peers(text: str) -> tuple[str, ...]:
    names = () if text == "none" else tuple(text.split(","))
    for name in names:
        if name not in PEERS:
            raise argparse.ArgumentTypeError(f"unknown peer {name!r}; choose from {PEERS}")
    return names


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m bench", description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    ap.add_argument("--profile", default="default",
                    choices=sorted([*PROFILES, *SOAK_PROFILES, *FUZZ_PROFILES, *SESSIONS_PROFILES,
                                    *DOORS_PROFILES, *ROLLUP_PROFILES, *CHECKPOINT_PROFILES]),
                    help="phase sizes (bench/README.md, Profiles; soak: Soak)")  # fmt: skip
    ap.add_argument("--minutes", type=float,
                    help="soak profiles: minutes of load after the warm-up")  # fmt: skip
    ap.add_argument("--config", metavar="FILE", help="the gateway's TOML config (yours)")
    ap.add_argument("--url", help="target a running gateway instead of starting one")
    ap.add_argument("--pid", type=int, help="with --url: its process id, to measure CPU and RSS")
    ap.add_argument("--sessions", type=int,
                    help="sessions of the fan-out; --profile sessions: sessions measured idle "
                         "(default 20000); --profile doors: per door (default 4)")  # fmt: skip
    ap.add_argument("--repetitions", type=int, metavar="N",
                    help="--profile doors: rounds measured (default 5); rollup: (3); "
                         "checkpoint: rounds of each setting (3)")  # fmt: skip
    ap.add_argument("--windows", type=_counts, metavar="MS,MS,..",
                    help="--profile rollup: the coalesce_ms, 0 first (default 0,40)")  # fmt: skip
    ap.add_argument("--checkpoint-ms", type=int, metavar="MS",
                    help="--profile checkpoint: the setting measured beside checkpoint_ms = 0 "
                         "(default: the gateway's default)")  # fmt: skip
    ap.add_argument("--churn-rounds", type=int, metavar="N",
                    help="--profile sessions: rounds of the churn (default 5)")  # fmt: skip
    ap.add_argument("--churn-sessions", type=int, metavar="N",
                    help="--profile sessions: sessions per churn round (default 1000)")  # fmt: skip
    ap.add_argument("--clients", type=_counts, metavar="N,N,..",
                    help="total clients at each fan-out step (last = reference)")  # fmt: skip
    ap.add_argument(
        "--rate",
        type=float,
        help="tokens/s per session at the reference step; --profile rollup: the turn's",
    )
    ap.add_argument("--rates", type=_rates, metavar="R,R,..", help="rate sweep, tokens/s")
    ap.add_argument("--window", type=float, dest="window_s", help="seconds per window")
    ap.add_argument("--idle", type=_counts, dest="idle_counts", metavar="N,N",
                    help="idle connection counts (RSS per connection at each)")  # fmt: skip
    ap.add_argument("--workers", type=int, help="client processes")
    ap.add_argument("--peers", type=_peers, help="comma list of ws_queue,ws_broadcast,raw or none")
    ap.add_argument("--no-ttft", action="store_true", help="skip the time-to-first-token phase")
    ap.add_argument("--backend", choices=BACKENDS, default="sqlite",
                    help="the store; both: one node on each, compared")  # fmt: skip
    ap.add_argument("--nodes", type=int, default=1, metavar="N",
                    help="N >= 2: the multi-node profile (bench/nodes.py)")  # fmt: skip
    ap.add_argument("--shapes", type=_shapes, default=SHAPES, metavar="S,S,..",
                    help=f"with --nodes: where clients go, of {','.join(SHAPES)}")  # fmt: skip
    ap.add_argument("--out", type=Path, default=RESULTS, help="results directory")
    return ap


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = parser()
    args = ap.parse_args(argv)
    command = " ".join(["python -m bench", *argv])
    if args.profile in SOAK_PROFILES:
        return _soak(ap, args, command)
    if args.profile in FUZZ_PROFILES:
        return _fuzz(ap, args, command)
    if args.profile in SESSIONS_PROFILES:
        return _sessions(ap, args, command)
    if args.profile in DOORS_PROFILES:
        return _doors(ap, args, command)
    if args.profile in ROLLUP_PROFILES:
        return _rollup(ap, args, command)
    if args.profile in CHECKPOINT_PROFILES:
        return _checkpoint(ap, args, command)
    if args.checkpoint_ms is not None:
        ap.error("--checkpoint-ms is for the checkpoint profiles")
    if args.repetitions is not None:
        ap.error("--repetitions is for the doors, rollup and checkpoint profiles")
    if args.windows is not None:
        ap.error("--windows is for the rollup profiles")
    if args.churn_rounds is not None or args.churn_sessions is not None:
        ap.error("--churn-rounds and --churn-sessions are for the sessions profiles")
    if args.minutes is not None:
        ap.error("--minutes is for the soak profiles")
    if args.backend != "sqlite" and args.url:
        ap.error("--backend redis or both starts gateways of its own: not with --url")
    if args.nodes < 1 or (args.nodes > 1 and args.backend == "sqlite"):
        ap.error("--nodes N: N >= 2 nodes share one Redis: with --backend both or redis")
    if args.backend != "sqlite":
        try:
            redis_binary()
        except RedisMissing as missing:
            print(f"bench: {missing}", file=sys.stderr)
            return 1
    profile = with_overrides(
        PROFILES[args.profile],
        sessions=args.sessions,
        client_counts=args.clients,
        rate=args.rate,
        rates=args.rates,
        node_rates=args.rates if args.nodes > 1 else None,
        window_s=args.window_s,
        idle_counts=args.idle_counts,
        workers=args.workers,
        peers=args.peers,
        ttft=False if args.no_ttft else None,
    )
    raise_fd_limit()
    started = time.monotonic()
    try:
        config_text = Path(args.config).read_text() if args.config else None
        result = asyncio.run(run(profile, args, config_text))
        result["command"] = command
    except KeyboardInterrupt:
        return 130
    result["elapsed_s"] = round(time.monotonic() - started, 1)
    report.summarize(result)
    suffix = {"sqlite": "", "redis": "-redis", "both": "-redis-compare"}[args.backend]
    suffix += f"-nodes{args.nodes}" if args.nodes > 1 else ""
    stem = args.out / f"{time.strftime('%Y%m%d-%H%M%S')}-{profile.name}{suffix}"
    json_path, md_path, pngs = report.write(result, stem)
    print()
    print(f"# bench {profile.name}: {result['command']}")
    print(md_path.read_text())
    print(f"wrote {json_path}, {md_path}, " + ", ".join(str(p) for p in pngs))
    print(f"elapsed {result['elapsed_s']} s")
    return 0


def _fuzz(ap: argparse.ArgumentParser, args: argparse.Namespace, command: str) -> int:
    from bench import fuzz  # (its profiles are imported above; the run is here)

    if args.url or args.config or args.backend != "sqlite" or args.minutes is not None:
        ap.error("a fuzz runs a daemon of its own with its own config (bench/README.md, Fuzz)")
    try:
        return fuzz.main(FUZZ_PROFILES[args.profile], args.out, command)
    except KeyboardInterrupt:
        return 130


def _sessions(ap: argparse.ArgumentParser, args: argparse.Namespace, command: str) -> int:
    from bench import sessions

    if args.url or args.config or args.backend != "sqlite" or args.minutes is not None:
        ap.error("a sessions run starts daemons of its own (bench/README.md, Sessions)")
    profile = with_overrides(
        SESSIONS_PROFILES[args.profile],
        sessions=args.sessions,
        churn_rounds=args.churn_rounds,
        churn_sessions=args.churn_sessions,
    )
    if profile.sessions < 1 or profile.churn_rounds < 0 or profile.churn_sessions < 1:
        ap.error("--sessions and --churn-sessions must be >= 1, --churn-rounds >= 0")
    raise_fd_limit()
    try:
        return sessions.main(profile, args.out, command)
    except KeyboardInterrupt:
        return 130


def _rollup(ap: argparse.ArgumentParser, args: argparse.Namespace, command: str) -> int:
    from bench import rollup

    if args.url or args.config or args.backend != "sqlite" or args.minutes is not None:
        ap.error("a rollup run starts a daemon of its own (bench/README.md, Delta rollup)")
    if args.rate is not None and not 0 < args.rate <= 1000:
        ap.error("--rate: tokens/s per session, above 0 and at most 1000")
    profile = with_overrides(
        ROLLUP_PROFILES[args.profile], sessions=args.sessions, repetitions=args.repetitions,
        windows=args.windows, delay_ms=1000 / args.rate if args.rate else None,
    )  # fmt: skip
    if profile.sessions < 1 or profile.repetitions < 1:
        ap.error("--sessions and --repetitions must be >= 1")
    if profile.windows[0] != 0 or not all(0 <= w <= 250 for w in profile.windows):
        ap.error("--windows: 0 first (rollup off, the peer), each 0..250")
    raise_fd_limit()
    try:
        return rollup.main(profile, args.out, command)
    except KeyboardInterrupt:
        return 130


def _doors(ap: argparse.ArgumentParser, args: argparse.Namespace, command: str) -> int:
    from bench import doors

    if args.url or args.config or args.backend != "sqlite" or args.minutes is not None:
        ap.error("a doors run starts a daemon of its own (bench/README.md, Doors)")
    profile = with_overrides(
        DOORS_PROFILES[args.profile], sessions=args.sessions, repetitions=args.repetitions
    )
    if profile.sessions < 1 or profile.repetitions < 1:
        ap.error("--sessions and --repetitions must be >= 1")
    raise_fd_limit()
    try:
        return doors.main(profile, args.out, command)
    except KeyboardInterrupt:
        return 130


def _checkpoint(ap: argparse.ArgumentParser, args: argparse.Namespace, command: str) -> int:
    from bench import checkpoint

    if args.url or args.config or args.backend == "both" or args.minutes is not None:
        ap.error("a checkpoint run starts daemons of its own (bench/README.md, Checkpoint)")
    if args.backend == "redis":
        try:
            redis_binary()
        except RedisMissing as missing:
            print(f"bench: {missing}", file=sys.stderr)
            return 1
    profile = with_overrides(
        CHECKPOINT_PROFILES[args.profile],
        sessions=args.sessions,
        client_counts=args.clients,
        rate=args.rate,
        window_s=args.window_s,
        workers=args.workers,
        peers=args.peers,
    )
    rounds = 3 if args.repetitions is None else args.repetitions
    if rounds < 1 or profile.sessions < 1:
        ap.error("--repetitions and --sessions must be >= 1")
    raise_fd_limit()
    try:
        return checkpoint.main(
            profile, args.checkpoint_ms, rounds, args.out, command, backend=args.backend
        )
    except KeyboardInterrupt:
        return 130


def _soak(ap: argparse.ArgumentParser, args: argparse.Namespace, command: str) -> int:
    from bench import soak  # Trio: imported only for a soak

    if args.url or args.config or args.backend != "sqlite":
        ap.error("a soak runs a daemon of its own with its own config (bench/README.md, Soak)")
    profile = with_overrides(
        SOAK_PROFILES[args.profile],
        duration_s=None if args.minutes is None else args.minutes * 60.0,
        sessions=args.sessions,
    )
    try:
        return soak.main(profile, args.out, command)
    except KeyboardInterrupt:
        return 130


async def run(
    profile: Profile, args: argparse.Namespace, config_text: str | None
) -> dict[str, Any]:
    def log(message: str) -> None:
        print(f"[{time.monotonic() - t0:6.1f}s] {message}", file=sys.stderr, flush=True)

    t0 = time.monotonic()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        workdir = Path(tmp)

        def make_gateway(name: str, backend: str = args.backend) -> GatewayServer:
            path = workdir / name
            text = config_text or config_toml(profile.gateway_config, str(path / "gateway.db"))
            return GatewayServer(
                path, text, url=args.url, pid=args.pid, words=profile.words, backend=backend
            )

        def make_nodes(count: int, shape: str) -> NodesServer:
            text = config_text or config_toml(profile.gateway_config, "gateway.db")
            return NodesServer(workdir / f"nodes{count}-{shape}", text, count=count,
                               shape=shape, words=profile.words)  # fmt: skip

        pool = WorkerPool(profile.workers)
        try:
            if args.nodes > 1:
                bench = Run(profile, pool, workdir, make_gateway("main"),
                            fresh_gateway=lambda: make_gateway("idle"), log=log)  # fmt: skip
                result: dict[str, Any] = {"servers": {}}
                one_node = None
                if args.backend == "both":  # at the multi-node profile's steps
                    gateways = {b: make_gateway(b, b) for b in ("sqlite", "redis")}
                    result = await bench.compare_backends(gateways, rates=profile.node_rates)
                    one_node = result["servers"]["redis"]["fanout"]
                nodes = await bench.several_nodes(make_nodes, args.nodes, args.shapes, one_node)
                result.setdefault("frames", nodes.pop("frames", None))
                result["nodes"] = nodes
            elif args.backend == "both":
                gateways = {b: make_gateway(b, b) for b in ("sqlite", "redis")}
                bench = Run(profile, pool, workdir, gateways["sqlite"],
                            fresh_gateway=lambda: make_gateway("idle"), log=log)  # fmt: skip
                result = await bench.compare_backends(gateways)
            else:
                bench = Run(
                    profile, pool, workdir, make_gateway("main"),
                    fresh_gateway=lambda: make_gateway("idle"), log=log,
                )  # fmt: skip
                result = await bench.run()
        finally:
            await pool.shutdown()
    if args.backend != "sqlite":
        result["backend"] = args.backend
    result["profile"] = asdict(profile)
    result["machine"] = {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "client_workers": profile.workers,
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
    }
    return result

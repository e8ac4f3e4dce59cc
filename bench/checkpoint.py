"""``python -m bench --profile checkpoint``: the checkpoint's cost at the lightest load.

``[store] checkpoint_ms`` (default 500) stores a streaming message this often,
so that a ``kill -9`` loses at most that much of it (docs/protocol.md "Crashes and
restarts"; :mod:`bench.crash_loss` measures the loss). At the lightest load (3
tokens/s per session) nothing else writes while a message streams, so the
checkpoint is the store's whole work there: this profile measures what it
costs, as the CPU per delivered event of two gateways in one run, one with
``checkpoint_ms`` as the profile sets it (``--checkpoint-ms``, default the
gateway's default) and one with ``checkpoint_ms = 0`` (stored only at each
block's end: the pre-checkpoint figure).

Each round starts each gateway in turn (fresh process, fresh store), opens
``sessions`` sessions, connects ``clients`` clients (``preset:chat``), loads
every session at ``rate`` tokens/s, measures one window (:meth:`Run.window`,
the fan-out's unit) and stops it; the rounds alternate the two, so that a
machine that got busier halfway costs both. The figure is the ratio of the
medians over the rounds (checkpoint on / off); the spread of each side's
rounds says how noisy the run was.

With ``--peers`` (bench/README.md, "The checkpoint's cost"), the peers of
the default profile (:mod:`bench.peers`: ``ws_queue``, ``ws_broadcast``,
``raw``) are measured in the same rounds, the same way, playing a turn
recorded from the gateway first; the summary gives the gateway's CPU per
event over each peer's, checkpoint on and off (the issue's light-load
target: 1,000 clients at 3 tokens/s, on / ``ws_queue`` <= 1/3). With
``--backend redis`` each gateway runs on a redis-server of its own
(:mod:`bench.redis_server`), whose CPU is reported beside the gateway's.
"""

from __future__ import annotations

import asyncio
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.measure import NOISY
from bench.pool import WorkerPool
from bench.profiles import Profile, config_toml
from bench.scenarios import CHAT, Run
from bench.servers import GatewayServer, PeerServer, Server
from bench.tables import Log, announce, fmt, ratio, run_profile, stem, write_files

OFF = "checkpoint_ms = 0"


async def run_checkpoint(
    profile: Profile,
    checkpoint_ms: int | None,
    rounds: int,
    workdir: Path,
    log: Log,
    backend: str = "sqlite",
) -> dict[str, Any]:
    """The rounds (module docstring); every window's figures, by setting (and peer)."""
    on = "checkpoint_ms = " + ("default" if checkpoint_ms is None else str(checkpoint_ms))
    settings: dict[str, int | None] = {on: checkpoint_ms, OFF: 0}
    names = [*settings, *profile.peers]
    windows: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    pool = WorkerPool(profile.workers)
    result: dict[str, Any] = {"profile": profile.name, "rounds": rounds, "backend": backend}
    try:
        recorder = _gateway(profile, checkpoint_ms, workdir / "record", backend)
        bench = Run(profile, pool, workdir, recorder, fresh_gateway=_no_fresh, log=log)
        if profile.peers:  # the turn the peers play, as the gateway's clients saw it
            await recorder.start()
            try:
                result["frames"] = await bench.record_turn()
            finally:
                await recorder.stop()
        for n in range(rounds):
            order = names if n % 2 == 0 else list(reversed(names))
            for name in order:
                server: Server
                if name in settings:
                    path = workdir / f"r{n}-{name.split()[-1]}"
                    server = _gateway(profile, settings[name], path, backend)
                else:
                    server = PeerServer(name, bench.frames_file, workdir)
                await server.start()
                try:
                    step = await _window(bench, server, profile, pool)
                finally:
                    await server.stop()
                log(f"round {n + 1}, {name}: {step.cpu_us_per_event} us/event")
                windows[name].append(step.as_dict())
    finally:
        await pool.shutdown()
    return {**result, "windows": windows, "on": on, "off": OFF, "peers": list(profile.peers),
            "summary": summary(windows, on, OFF, profile.peers)}  # fmt: skip


async def _window(bench: Run, server: Server, profile: Profile, pool: WorkerPool) -> Any:
    """One server's window: its sessions, its clients, the load, one measured window."""
    sessions = await server.open_sessions(profile.sessions)
    per = profile.client_counts[0] // profile.sessions
    await pool.open("live", [server.target(s, CHAT) for s in sessions for _ in range(per)])
    await server.load(sessions, profile.rate)
    step = await bench.window(server, per * profile.sessions, profile.rate)
    await server.unload()
    await pool.close("live")
    return step


def _no_fresh() -> GatewayServer:
    raise AssertionError("a checkpoint run has no idle phase")


def _gateway(
    profile: Profile, checkpoint_ms: int | None, path: Path, backend: str = "sqlite"
) -> GatewayServer:
    config = {**profile.gateway_config}
    if checkpoint_ms is not None:
        config["store"] = {**config.get("store", {}), "checkpoint_ms": checkpoint_ms}
    text = config_toml(config, str(path / "gateway.db"))
    return GatewayServer(path, text, words=profile.words, backend=backend)


def summary(
    windows: dict[str, list[dict[str, Any]]], on: str, off: str, peers: Sequence[str] = ()
) -> dict[str, Any]:
    """Each setting's CPU per event over the rounds (median, lowest, highest), the ratio;
    with peers, each gateway setting's over each peer's (the ratio of the medians, and
    the lowest and highest of the rounds' own ratios)."""
    out: dict[str, Any] = {}
    for name, steps in windows.items():
        cpu = [s["cpu_us_per_event"] for s in steps if s.get("cpu_us_per_event") is not None]
        store = [s["store_cpu_us_per_event"] for s in steps
                 if s.get("store_cpu_us_per_event") is not None]  # fmt: skip
        out[name] = {
            "cpu_us_per_event": statistics.median(cpu) if cpu else None,
            "lowest": min(cpu, default=None),
            "highest": max(cpu, default=None),
            "noisy_windows": sum(1 for s in steps if s.get("other_cpu_util", 0) >= NOISY),
            "windows": len(steps),
        }
        if store:
            out[name]["store_cpu_us_per_event"] = statistics.median(store)
    out["ratio"] = ratio(out[on]["cpu_us_per_event"], out[off]["cpu_us_per_event"])
    out["to_peers"] = {
        f"{setting} / {peer}": _over(windows[setting], windows[peer], out, setting, peer)
        for peer in peers
        for setting in (on, off)
    }
    return out


def _over(
    mine: list[dict[str, Any]], theirs: list[dict[str, Any]], out: dict[str, Any], a: str, b: str
) -> dict[str, Any]:
    """A gateway setting's CPU per event over a peer's: the medians' ratio, the rounds' range."""
    rounds = [ratio(x.get("cpu_us_per_event"), y.get("cpu_us_per_event"))
              for x, y in zip(mine, theirs, strict=False)]  # fmt: skip
    figures = [r for r in rounds if r is not None]
    return {
        "ratio": ratio(out[a]["cpu_us_per_event"], out[b]["cpu_us_per_event"]),
        "lowest": min(figures, default=None),
        "highest": max(figures, default=None),
    }


def table(result: dict[str, Any]) -> str:
    """The report (bench/README.md, "The checkpoint's cost")."""
    rows = ["| setting | CPU per delivered event, median (us) | lowest - highest | noisy windows |",
            "|---|---|---|---|"]  # fmt: skip
    figures = result["summary"]
    for name in (result["on"], result["off"], *result.get("peers", ())):
        f = figures[name]
        spread = f"{fmt(f['lowest'])} - {fmt(f['highest'])}"
        rows.append(f"| {name} | {fmt(f['cpu_us_per_event'])} | {spread} | "
                    f"{f['noisy_windows']} of {f['windows']} |")  # fmt: skip
    rows += ["", f"checkpoint on / off: **{fmt(figures['ratio'])}** (target <= 1.1)", ""]
    if result.get("backend") == "redis":
        rows += ["redis-server's CPU per delivered event, median (us), beside the gateway's: "
                 + ", ".join(f"{name} {fmt(figures[name].get('store_cpu_us_per_event'))}"
                             for name in (result["on"], result["off"])), ""]  # fmt: skip
    if figures.get("to_peers"):
        rows += ["| gateway / peer, CPU per delivered event | ratio of the medians | "
                 "lowest - highest round |", "|---|---|---|"]  # fmt: skip
        for name, f in figures["to_peers"].items():
            spread = f"{fmt(f['lowest'])} - {fmt(f['highest'])}"
            rows.append(f"| {name} | {fmt(f['ratio'])} | {spread} |")
        rows.append("")
    return "\n".join(rows)


def main(
    profile: Profile,
    checkpoint_ms: int | None,
    rounds: int,
    out: Path,
    command: str,
    backend: str = "sqlite",
) -> int:
    """Run it, write ``<out>/<stamp>-<profile>[-redis].json`` and ``.md``, print the table."""
    result = run_profile(
        "bench-checkpoint-",
        command,
        lambda tmp, log: asyncio.run(
            run_checkpoint(profile, checkpoint_ms, rounds, tmp, log, backend)
        ),
    )
    name = profile.name + ("-redis" if backend == "redis" else "")
    announce(result, *write_files(stem(out, name), result, table(result)))
    return 0

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
"""

from __future__ import annotations

import asyncio
import statistics
from pathlib import Path
from typing import Any

from bench.measure import NOISY
from bench.pool import WorkerPool
from bench.profiles import Profile, config_toml
from bench.scenarios import CHAT, Run
from bench.servers import GatewayServer
from bench.tables import Log, announce, fmt, ratio, run_profile, stem, write_files

OFF = "checkpoint_ms = 0"


async def run_checkpoint(
    profile: Profile, checkpoint_ms: int | None, rounds: int, workdir: Path, log: Log
) -> dict[str, Any]:
    """The rounds (module docstring); every window's figures, by setting."""
    on = "checkpoint_ms = " + ("default" if checkpoint_ms is None else str(checkpoint_ms))
    settings: dict[str, int | None] = {on: checkpoint_ms, OFF: 0}
    windows: dict[str, list[dict[str, Any]]] = {name: [] for name in settings}
    pool = WorkerPool(profile.workers)
    try:
        for n in range(rounds):
            order = list(settings) if n % 2 == 0 else list(reversed(settings))
            for name in order:
                gw = _gateway(profile, settings[name], workdir / f"r{n}-{name.split()[-1]}")
                bench = Run(profile, pool, workdir, gw, fresh_gateway=_no_fresh, log=log)
                await gw.start()
                try:
                    sessions = await gw.open_sessions(profile.sessions)
                    per = profile.client_counts[0] // profile.sessions
                    targets = [gw.target(s, CHAT) for s in sessions for _ in range(per)]
                    await pool.open("live", targets)
                    await gw.load(sessions, profile.rate)
                    step = await bench.window(gw, per * profile.sessions, profile.rate)
                    await gw.unload()
                    await pool.close("live")
                finally:
                    await gw.stop()
                log(f"round {n + 1}, {name}: {step.cpu_us_per_event} us/event")
                windows[name].append(step.as_dict())
    finally:
        await pool.shutdown()
    return {"profile": profile.name, "rounds": rounds, "windows": windows, "on": on, "off": OFF,
            "summary": summary(windows, on, OFF)}  # fmt: skip


def _no_fresh() -> GatewayServer:
    raise AssertionError("a checkpoint run has no idle phase")


def _gateway(profile: Profile, checkpoint_ms: int | None, path: Path) -> GatewayServer:
    config = {**profile.gateway_config}
    if checkpoint_ms is not None:
        config["store"] = {**config.get("store", {}), "checkpoint_ms": checkpoint_ms}
    text = config_toml(config, str(path / "gateway.db"))
    return GatewayServer(path, text, words=profile.words)


def summary(windows: dict[str, list[dict[str, Any]]], on: str, off: str) -> dict[str, Any]:
    """Each setting's CPU per event over the rounds (median, lowest, highest), the ratio."""
    out: dict[str, Any] = {}
    for name, steps in windows.items():
        cpu = [s["cpu_us_per_event"] for s in steps if s.get("cpu_us_per_event") is not None]
        out[name] = {
            "cpu_us_per_event": statistics.median(cpu) if cpu else None,
            "lowest": min(cpu, default=None),
            "highest": max(cpu, default=None),
            "noisy_windows": sum(1 for s in steps if s.get("other_cpu_util", 0) >= NOISY),
            "windows": len(steps),
        }
    out["ratio"] = ratio(out[on]["cpu_us_per_event"], out[off]["cpu_us_per_event"])
    return out


def table(result: dict[str, Any]) -> str:
    """The report (bench/README.md, "The checkpoint's cost")."""
    rows = ["| setting | CPU per delivered event, median (us) | lowest - highest | noisy windows |",
            "|---|---|---|---|"]  # fmt: skip
    figures = result["summary"]
    for name in (result["on"], result["off"]):
        f = figures[name]
        spread = f"{fmt(f['lowest'])} - {fmt(f['highest'])}"
        rows.append(f"| {name} | {fmt(f['cpu_us_per_event'])} | {spread} | "
                    f"{f['noisy_windows']} of {f['windows']} |")  # fmt: skip
    rows += ["", f"checkpoint on / off: **{fmt(figures['ratio'])}** (target <= 1.1)", ""]
    return "\n".join(rows)


def main(profile: Profile, checkpoint_ms: int | None, rounds: int, out: Path, command: str) -> int:
    """Run it, write ``<out>/<stamp>-<profile>.json`` and ``.md``, print the table."""
    result = run_profile(
        "bench-checkpoint-",
        command,
        lambda tmp, log: asyncio.run(run_checkpoint(profile, checkpoint_ms, rounds, tmp, log)),
    )
    announce(result, *write_files(stem(out, profile.name), result, table(result)))
    return 0

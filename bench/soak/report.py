"""The soak's verdict and its tables: slopes, end against baseline, the clients' checks.

A **slope** is the least-squares fit of a figure against time over the load's
samples (``statistics.linear_regression``), per minute. **Baseline** and
**end** are the two quiet points (bench/soak/run.py): the same clients
connected (the stayers), no turn in flight; a leak of file descriptors or
tasks per connection, turn or cancel shows as end > baseline, whatever the
noise of the load. Every check names its threshold; the run passes when all
pass.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.profiles import SoakProfile
from bench.soak.clients import KILLS
from bench.tables import write_files

FIGURES = ("fds", "tasks", "rss_bytes", "ws_connections", "sessions_live")
MIB = 1024 * 1024


@dataclass(frozen=True)
class Check:
    name: str
    value: str
    threshold: str
    passed: bool


def slope_per_min(points: list[tuple[float, float]]) -> float | None:
    """The least-squares slope of ``(seconds, value)`` points, per minute (None: too few)."""
    if len(points) < 3 or len({t for t, _ in points}) < 2:
        return None
    xs = [t / 60.0 for t, _ in points]
    ys = [v for _, v in points]
    return statistics.linear_regression(xs, ys).slope


def figures(result: dict[str, Any]) -> dict[str, dict[str, float | None]]:
    """Per followed figure: baseline, first and last load sample, end, min, max, slope/min.

    The slope leaves out the load's first ``slope_after_s``: its start (every
    client connecting at once) is a transient, not a trend.
    """
    load = [s for s in result["samples"] if s["phase"] == "load"]
    settled = [s for s in load if s["t"] >= result["profile"]["slope_after_s"]]
    base, end = result.get("baseline") or {}, result.get("end") or {}
    out: dict[str, dict[str, float | None]] = {}
    for name in FIGURES:
        values = [s[name] for s in load]
        out[name] = {
            "baseline": base.get(name),
            "load_first": values[0] if values else None,
            "load_last": values[-1] if values else None,
            "end": end.get(name),
            "min": min(values) if values else None,
            "max": max(values) if values else None,
            "slope_per_min": slope_per_min([(s["t"], s[name]) for s in settled]),
        }
    return out


def verdict(result: dict[str, Any], profile: SoakProfile) -> list[Check]:
    """Every check of the run against its threshold (module docstring)."""
    checks: list[Check] = []

    def check(name: str, value: Any, threshold: str, passed: bool) -> None:
        checks.append(Check(name, str(value), threshold, bool(passed)))

    def zero(name: str, value: Any) -> None:
        count = value if isinstance(value, int) else len(value)
        check(name, count, "0", count == 0)

    daemon = result["daemon"]
    check("daemon stayed alive", "yes" if daemon["alive"] else
          f"no (exit status {daemon['exit_code']})", "yes", daemon["alive"])  # fmt: skip
    check("daemon shut down cleanly (SIGTERM)", daemon["shutdown_code"], "0",
          daemon["shutdown_code"] == 0)  # fmt: skip
    end = result.get("end") or {}
    zero("gateway_session_failures_total", int(end.get("session_failures", 0)))
    st = result["stayers"]
    check("stayers: events received", st["events"], "> 0", st["events"] > 0)
    check("stayers: replay audits", st["audits"], f">= {st['sessions']}",
          st["audits"] >= st["sessions"])  # fmt: skip
    for key in ("lost", "duplicated", "out_of_order", "unexpected", "order_differs",
                "violations", "dropped", "audit_errors", "error_frames"):  # fmt: skip
        zero(f"stayers: {key.replace('_', ' ')}", st[key])
    turns = result["turns"]
    check("turns run", sum(t["run"] for t in turns.values()), "> 0",
          all(t["run"] > 0 for t in turns.values()))  # fmt: skip
    zero("turns: not as expected", sum(t["unexpected"] for t in turns.values()))
    zero("turns: stuck", sum(t["stuck"] for t in turns.values()))
    ch = result["churn"]
    check("churn: connections", ch["connections"], "> 0", ch["connections"] > 0)
    for key in ("duplicated", "out_of_order", "violations"):
        zero(f"churn: {key.replace('_', ' ')}", ch[key])
    slow = result["slow"]
    check("slow clients closed 1008 client_too_slow", slow["closed_too_slow"], ">= 1",
          slow["closed_too_slow"] >= 1)  # fmt: skip
    zero("slow clients: other closes", slow["other_closes"])
    kills = result["kills"]
    check("killed clients, each kind", ", ".join(f"{k} {kills.get(k, 0)}" for k in KILLS),
          ">= 1 each", all(kills.get(k, 0) >= 1 for k in KILLS))  # fmt: skip
    zero("quiet point not reached", result["quiet_timeouts"])
    vis = result.get("visitors") or {"sessions": 0}
    if vis["sessions"]:
        check("visitors: visits", vis["visits"], f">= {vis['sessions']}",
              vis["visits"] >= vis["sessions"])  # fmt: skip
        zero("visitors: lost, repeated or stuck", vis["problems"])
        unloaded = int((result.get("end") or {}).get("sessions_unloaded", 0))
        check("sessions unloaded (in and out of memory)", unloaded,
              f">= visits / 2 = {vis['visits'] // 2}", unloaded >= vis["visits"] // 2)  # fmt: skip
    figs = figures(result)
    for name, slack in (("fds", profile.fd_slack), ("tasks", profile.task_slack)):
        base, last = figs[name]["baseline"], figs[name]["end"]
        grown = None if base is None or last is None else last - base
        check(f"{name}: end - baseline", _num(grown), f"<= {slack}",
              grown is not None and grown <= slack)  # fmt: skip
    if profile.duration_s >= profile.judge_slopes_after_s:
        for name, bound in (("fds", profile.fd_slope_max), ("tasks", profile.task_slope_max)):
            slope = figs[name]["slope_per_min"]
            check(f"{name}: slope over the load", f"{_num(slope)}/min", f"|slope| <= {bound:g}/min",
                  slope is not None and abs(slope) <= bound)  # fmt: skip
        rss = figs["rss_bytes"]["slope_per_min"]
        history = history_mib_per_min(result)
        allowed = None if history is None else (
            profile.rss_per_history * max(history, 0.0) + profile.rss_slope_slack_mib
        )  # fmt: skip
        check("RSS: slope over the load", f"{_num(None if rss is None else rss / MIB)} MiB/min",
              f"<= {profile.rss_per_history:g} x history {_num(history)} + "
              f"{profile.rss_slope_slack_mib:g} = {_num(allowed)} MiB/min",
              rss is not None and allowed is not None and rss / MIB <= allowed)  # fmt: skip
    return checks


def history_mib_per_min(result: dict[str, Any]) -> float | None:
    """How fast the sessions' history grew (JSON MiB per minute of load), None if unmeasured."""
    history = result.get("history") or {}
    if "baseline" not in history or "end" not in history:
        return None
    grown = history["end"]["bytes"] - history["baseline"]["bytes"]
    return float(grown / MIB / (result["profile"]["duration_s"] / 60.0))


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


def markdown(result: dict[str, Any], checks: list[Check]) -> str:
    """The run as Markdown: verdict, figures, checks, turns, problems."""
    passed = all(c.passed for c in checks)
    prof = result["profile"]
    lines = [
        f"## Soak `{prof['name']}`: {'PASS' if passed else 'FAIL'}",
        "",
        f"`{result.get('command', '')}`: {prof['warmup_s']:g} s warm-up, "
        f"{prof['duration_s']:g} s of load, {prof['sessions']} sessions (one stayer each), "
        f"{prof['churners']} churning clients, {prof['slow_clients']} slow, "
        f"{prof['killers']} killers; {result.get('elapsed_s', '-')} s in all.",
        "",
        "| figure | baseline | load first | load last | end | min | max | slope /min |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, f in figures(result).items():
        scale, label = (MIB, "RSS (MiB)") if name == "rss_bytes" else (1.0, name)
        cells = [f[k] for k in ("baseline", "load_first", "load_last", "end", "min", "max")]
        slope = f["slope_per_min"]
        lines.append(
            f"| {label} | "
            + " | ".join(_num(None if v is None else v / scale) for v in cells)
            + f" | {_num(None if slope is None else slope / scale)} |"
        )
    history = result.get("history") or {}
    if "baseline" in history and "end" in history:
        b, e = history["baseline"], history["end"]
        lines += [
            "",
            "Session history, which the daemon keeps in memory (every message of a loaded "
            f"session, as `GET /sessions/{{id}}/messages` returns it): {b['messages']} messages, "
            f"{b['bytes'] / MIB:.2f} MiB of JSON at the baseline; {e['messages']}, "
            f"{e['bytes'] / MIB:.2f} MiB at the end: "
            f"{_num(history_mib_per_min(result))} MiB per minute of load.",
        ]
    lines += ["", "| check | value | threshold | |", "|---|---|---|---|"]
    lines += [
        f"| {c.name} | {c.value} | {c.threshold} | {'pass' if c.passed else '**FAIL**'} |"
        for c in checks
    ]
    lines += ["", "| turn | run | as expected | not | stuck |", "|---|---|---|---|---|"]
    for name, t in result["turns"].items():
        lines.append(f"| {name} | {t['run']} | {t['as_expected']} | {t['unexpected']} | "
                     f"{t['stuck']} |")  # fmt: skip
    st, ch, slow = result["stayers"], result["churn"], result["slow"]
    lines += [
        "",
        f"Stayers: {st['events']} events received, {st['compared']} replayable events "
        f"compared with {st['audits']} replays; lost {st['lost']}, duplicated "
        f"{st['duplicated']}, out of order {st['out_of_order']}.",
        f"Churn: {ch['connections']} connections, {ch['events']} events, "
        f"{ch['connect_errors']} connect errors. Slow clients: {slow['stalls']} stalls, "
        f"{slow['closed_too_slow']} closed with 1008, {slow['stalls_without_overflow']} "
        "without an overflow. Killed: "
        + ", ".join(f"{k} {v}" for k, v in result["kills"].items())
        + ".",
    ]
    problems = (
        result["turn_problems"] + st["details"] + ch["details"] + st["dropped"]
        + st["audit_errors"] + ch["subscribe_errors"] + slow["other_closes"]
    )  # fmt: skip
    if problems:
        lines += ["", "Problems (first of each kind):", ""]
        lines += [f"- {p}" for p in problems[:40]]
    daemon = result["daemon"]
    if not daemon["alive"]:
        lines += ["", "The daemon's log, its end:", "", "```", daemon["log_tail"], "```"]
    return "\n".join(lines) + "\n"


def write(result: dict[str, Any], checks: list[Check], stem: Path) -> tuple[Path, Path]:
    """``<stem>.json`` (everything, the checks included) and ``<stem>.md``."""
    full = {**result, "figures": figures(result), "checks": [asdict(c) for c in checks],
            "passed": all(c.passed for c in checks)}  # fmt: skip
    return write_files(stem, full, markdown(result, checks), indent=1)

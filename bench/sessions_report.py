"""The sessions profile's figures, its ratios to the peer, its tables (bench/sessions.py).

Every figure of the daemon under test (``unload``) comes with the same figure
of the peer measured in the same run (``peer``: nothing unloads) and their
ratio. The goals are the issue's: at most 1 KiB of RSS per idle session
after unloading, and RSS flat over a churn of sessions (here: at most 1 KiB
per churned session, the slope over the rounds).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.tables import number, ratio, row, write_files

GOAL_BYTES_PER_SESSION = 1024.0

FIGURES = (
    "rss_per_idle_session_bytes",
    "churn_rss_slope_bytes_per_round",
    "churn_rss_slope_bytes_per_session",
    "attach_snapshot_p50_ms",
    "attach_snapshot_p99_ms",
    "attach_since_p50_ms",
    "attach_since_p99_ms",
    "sessions_per_s",
)
"""Each a number for both daemons, in ``summary[figure]["unload" | "peer" | "ratio"]``."""


def _figures(daemon: dict[str, Any]) -> dict[str, Any]:
    attach, churn = daemon["attach"], daemon["churn"]
    return {
        "rss_per_idle_session_bytes": daemon["idle"]["rss_per_session_bytes"],
        "churn_rss_slope_bytes_per_round": churn["rss_slope_bytes_per_round"],
        "churn_rss_slope_bytes_per_session": churn["rss_slope_bytes_per_session"],
        "attach_snapshot_p50_ms": attach["snapshot"]["total_ms"]["p50"],
        "attach_snapshot_p99_ms": attach["snapshot"]["total_ms"]["p99"],
        "attach_since_p50_ms": attach["since"]["total_ms"]["p50"],
        "attach_since_p99_ms": attach["since"]["total_ms"]["p99"],
        "sessions_per_s": daemon["idle"]["sessions_per_s"],
    }


def unloading(daemon: dict[str, Any]) -> dict[str, Any]:
    """Whether the sessions left memory: after the big batch, and after every churn round."""
    rounds = daemon["churn"]["rounds"]
    idle = daemon["idle"]
    return {
        "idle": bool(idle.get("unloaded")),
        "churn_rounds": sum(1 for r in rounds if r.get("unloaded")),
        "of_rounds": len(rounds),
        "live_before": idle["live_before"],
        "live_loaded": idle["live_loaded"],
        "live_after": idle["live_after"],
        "waited_s": idle.get("unload_wait_s"),
    }


def summarize(result: dict[str, Any]) -> dict[str, Any]:
    """``result["summary"]``: figures by daemon with ratios, whether unloading happened, goals."""
    by_kind = {kind: _figures(result["daemons"][kind]) for kind in ("unload", "peer")}
    summary: dict[str, Any] = {
        name: {
            "unload": by_kind["unload"][name],
            "peer": by_kind["peer"][name],
            "ratio": ratio(by_kind["unload"][name], by_kind["peer"][name]),
        }
        for name in FIGURES
    }
    summary["unloading"] = unloading(result["daemons"]["unload"])
    idle = by_kind["unload"]["rss_per_idle_session_bytes"]
    churn = by_kind["unload"]["churn_rss_slope_bytes_per_session"]
    summary["targets"] = [
        _target("RSS per idle session after unload (bytes)", idle),
        _target("RSS slope over the churn, per churned session (bytes)", churn),
    ]
    result["summary"] = summary
    return summary


def _target(name: str, value: Any) -> dict[str, Any]:
    met = number(value) and value <= GOAL_BYTES_PER_SESSION
    return {"name": name, "value": value, "goal": f"<= {GOAL_BYTES_PER_SESSION:g}", "met": met}


def markdown(result: dict[str, Any]) -> str:
    """The report's tables (bench/README.md, "Sessions")."""
    s = result["summary"]
    sizes = result["sizes"]
    un = s["unloading"]
    n, rounds, k = sizes["sessions"], sizes["churn_rounds"], sizes["churn_sessions"]
    if un["idle"]:
        status = (f"Unloaded: `gateway_sessions_live` went from {un['live_loaded']:,} back to "
                  f"{un['live_after']:,} within {un['waited_s']} s of the last turn; the churn "
                  f"unloaded in {un['churn_rounds']} of {un['of_rounds']} rounds.")  # fmt: skip
    else:
        status = (f"**Not unloaded**: `gateway_sessions_live` was still {un['live_after']:,} "
                  f"({un['live_before']:,} before the sessions) after {un['waited_s']} s: "
                  "every \"unloaded\" figure below is of loaded sessions.")  # fmt: skip
    idle_s = result["daemons"]["unload"]["idle_unload_s"]
    lines = [
        f"Two daemons in one run: `idle_unload_s = {idle_s:g}` (unloading on) and the peer "
        f"with `idle_unload_s = {result['daemons']['peer']['idle_unload_s']:g}` (off). {status}",
        "",
        row(["figure", "unloading on", "unloading off (peer)", "on / off"]),
        row(["---"] * 4),
    ]

    def add(label: str, name: str, scale: float = 1.0) -> None:
        f = s[name]
        scaled = [None if not number(v) else v / scale for v in (f["unload"], f["peer"])]
        lines.append(row([label, *scaled, f["ratio"]]))

    add(f"RSS per idle session, {n:,} sessions (bytes)", "rss_per_idle_session_bytes")
    add(f"RSS slope over a churn of {rounds} x {k:,} sessions (KiB per round)",
        "churn_rss_slope_bytes_per_round", 1024.0)  # fmt: skip
    add("... per churned session (bytes)", "churn_rss_slope_bytes_per_session")
    for path, words in (("snapshot", "a snapshot"), ("since", "a `since` replay")):
        for q in ("p50", "p99"):
            add(f"attach with {words}, {q}: unloaded / loaded session (ms)",
                f"attach_{path}_{q}_ms")  # fmt: skip
    add("sessions created per second (each with a turn)", "sessions_per_s")
    lines += ["", row(["target", "value", "goal", "met"]), row(["---"] * 4)]
    lines += [row([t["name"], t["value"], t["goal"], t["met"]]) for t in s["targets"]]
    lines += ["", f"Elapsed {result.get('elapsed_s')} s. Command: `{result.get('command')}`."]
    return "\n".join(lines) + "\n"


def write(result: dict[str, Any], stem: Path) -> tuple[Path, Path]:
    """Summarize, then write ``<stem>.json`` and ``<stem>.md``."""
    summarize(result)
    return write_files(stem, result, markdown(result))

"""The doors profile's figures, its ratios to the WebSocket, its tables (bench/doors.py).

Every figure is the median over the run's rounds; every ratio is a door's
figure over the WebSocket's **in the same round** (the peer: each round
measures the three doors one after the other on the same daemon, with the
same script), and its median, lowest and highest over the rounds. Absolute
times are reported beside them, for reading only: a shared machine moves
them from run to run, the ratios far less.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.doors import DOORS, PEER
from bench.tables import fmt, median, number, ratio, row, write_files

NOISY = 0.25  # cores taken outside the bench during a window (bench.measure's threshold)
CLIENT_BUSY = 0.85  # the client process's share of a core: it may be what limits

COSTS = ("cpu_us_per_event", "cpu_us_per_delta", "cpu_us_per_kib")
"""The daemon's CPU per delivered unit: each with a ratio to the WebSocket's."""

FIGURES = (*COSTS, "events_per_client", "bytes_per_event", "server_cores", "clients_cores",
           "other_cores")  # fmt: skip
"""Each a number for every door, in ``summary["doors"][door][figure]`` (the median)."""

LABELS = {"websocket": "WebSocket", "sse": "native SSE", "aisdk": "AI SDK SSE", "agui": "AG-UI"}

EVENT = {
    "websocket": "an `event` frame (one gateway event)",
    "sse": "an SSE event whose `data` is an `event` frame (one gateway event)",
    "aisdk": "an SSE event whose `data` is a UI message chunk (`[DONE]` not counted)",
    "agui": "an SSE event whose `data` is an AG-UI event",
}
"""What a client counts as one delivered event, by door (bench/doors.py)."""


def summarize(result: dict[str, Any]) -> dict[str, Any]:
    """``result["summary"]``: medians by door, ratios to the peer by round, flagged windows."""
    rounds = result["rounds"]
    doors: dict[str, dict[str, Any]] = {
        door: {name: median([r["doors"][door][name] for r in rounds]) for name in FIGURES}
        for door in DOORS
    }
    ratios: dict[str, dict[str, Any]] = {}
    for door in DOORS:
        ratios[door] = {}
        for name in COSTS:
            by_round = [ratio(r["doors"][door][name], r["doors"][PEER][name]) for r in rounds]
            known = [x for x in by_round if x is not None]
            ratios[door][name] = {"median": median(known), "rounds": by_round,
                                  "min": min(known, default=None),
                                  "max": max(known, default=None)}  # fmt: skip
    flags: dict[str, list[str]] = {"noisy": [], "client_limited": [], "incomplete": []}
    for r in rounds:
        for door, w in r["doors"].items():
            where = f"round {r['round']} {door}"
            if number(w["other_cores"]) and w["other_cores"] >= NOISY:
                flags["noisy"].append(where)
            if number(w["clients_cores"]) and w["clients_cores"] >= CLIENT_BUSY:
                flags["client_limited"].append(where)
            if (
                w["late_clients"]
                or w["unfinished_clients"]
                or w["text_deltas"] < w["deltas_expected"]
            ):
                flags["incomplete"].append(where)
    summary = {"peer": PEER, "doors": doors, "ratios": ratios, "flags": flags, "event": EVENT}
    result["summary"] = summary
    return summary


def markdown(result: dict[str, Any]) -> str:
    """The report's table (bench/README.md, "Doors")."""
    s = result["summary"]
    p = result["sizes"]
    others = [d for d in DOORS if d != PEER]
    clients = p["sessions"] * p["clients_per_session"]
    lines = [
        f"One daemon, {len(result['rounds'])} rounds (after {p['warmup']} not counted), each "
        f"door in a phase of its own: {p['sessions']} sessions x {p['clients_per_session']} "
        f"clients ({clients} per door), one turn per session of {p['words']} text deltas, one "
        f"every {p['delay_ms']:g} ms. The native doors subscribe with `{p['filter']}`. Medians "
        "over the rounds; each ratio is the door's figure over the WebSocket's in the same "
        "round (median, and its range over the rounds).",
        "",
        row(
            [
                "figure",
                *(LABELS[d] for d in DOORS),
                *(f"{LABELS[d]} / {LABELS[PEER]}" for d in others),
            ]
        ),
        row(["---"] * (len(DOORS) + len(others) + 1)),
    ]

    def ratio_cell(door: str, name: str) -> str:
        r = s["ratios"][door][name]
        if r["median"] is None:
            return "-"
        if r["min"] == r["max"]:
            return fmt(r["median"])
        return f"{fmt(r['median'])} ({fmt(r['min'])} to {fmt(r['max'])})"

    rows = (
        ("gateway CPU per delivered event (µs)", "cpu_us_per_event", True),
        ("gateway CPU per text delta delivered (µs)", "cpu_us_per_delta", True),
        ("gateway CPU per KiB delivered (µs)", "cpu_us_per_kib", True),
        ("events delivered per client per turn", "events_per_client", False),
        ("bytes per event", "bytes_per_event", False),
        ("gateway cores in the window", "server_cores", False),
        ("client process cores in the window", "clients_cores", False),
    )
    for label, name, with_ratio in rows:
        values = [s["doors"][d][name] for d in DOORS]
        cells = [ratio_cell(d, name) if with_ratio else "" for d in others]
        lines.append(row([label, *values, *cells]))
    lines += ["", "A delivered event is, on each door:", ""]
    lines += [f"- {LABELS[d]}: {EVENT[d]}." for d in DOORS]
    lines += [
        "",
        "A text delta is a `text.delta` event (the AI SDK: a `text-delta` chunk; AG-UI: "
        "`TEXT_MESSAGE_CONTENT`), one per word "
        "on every door. A byte: the WebSocket's event frames (payload and header); SSE's "
        "response body as it arrives (`data:`, `id:` and blank lines; not HTTP's chunked "
        "framing).",
        "",
    ]
    flags = s["flags"]
    notes = {
        "noisy": "Noisy windows (processes outside the bench used >= 0.25 cores)",
        "client_limited": "Client-limited windows (the client process used >= 0.85 of a core)",
        "incomplete": "Incomplete windows (a client late, unfinished, or short of text deltas)",
    }
    for key, text in notes.items():
        lines.append(f"{text}: {', '.join(flags[key]) if flags[key] else 'none'}.")
    lines += ["", f"Elapsed {result.get('elapsed_s')} s. Command: `{result.get('command')}`."]
    return "\n".join(lines) + "\n"


def write(result: dict[str, Any], stem: Path) -> tuple[Path, Path]:
    """Summarize, then write ``<stem>.json`` and ``<stem>.md``."""
    summarize(result)
    return write_files(stem, result, markdown(result))

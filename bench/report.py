"""What a run leaves behind: the JSON result, the markdown table, the plots.

:func:`summarize` adds to the raw phase results the headline figures, the
gateway's ratio to each peer, and each target of the issue with whether it was
met. Ratios are gateway / peer, so for costs (CPU, memory, latency) below 1
means the gateway is cheaper, and for throughput above 1 means it is faster.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

KIB = 1024


def _get(data: Any, *path: str) -> Any:
    for key in path:
        if not isinstance(data, dict) or key not in data:
            return None
        data = data[key]
    return data


def _ratio(a: Any, b: Any) -> float | None:
    if not isinstance(a, int | float) or not isinstance(b, int | float) or not b:
        return None
    return round(a / b, 3)


# figure name -> where it is in a server's result
FIGURES: dict[str, tuple[str, ...]] = {
    "max_sustained_events_per_s": ("fanout", "max_sustained", "events_per_s"),
    "peak_events_per_s": ("fanout", "peak", "events_per_s"),
    "cpu_us_per_event": ("fanout", "reference", "cpu_us_per_event"),
    "cpu_us_per_event_half_load": ("fanout", "half_load", "cpu_us_per_event"),
    "p50_ms_half_load": ("fanout", "half_load", "p50_ms"),
    "p99_ms_half_load": ("fanout", "half_load", "p99_ms"),
    "p999_ms_half_load": ("fanout", "half_load", "p999_ms"),
    "idle_bytes_per_conn_first": ("idle", "points", "0", "bytes_per_connection"),
    "idle_bytes_per_conn_last": ("idle", "points", "-1", "bytes_per_connection"),
}


def _figure(server: dict[str, Any], path: tuple[str, ...]) -> Any:
    data: Any = server
    for key in path:
        if isinstance(data, list):
            try:
                data = data[int(key)]
            except (IndexError, ValueError):
                return None
        elif isinstance(data, dict):
            data = data.get(key)
        else:
            return None
    return data


def summarize(result: dict[str, Any]) -> dict[str, Any]:
    """Headline figures, ratios and targets (module docstring), added to ``result``."""
    servers: dict[str, Any] = result["servers"]
    figures = {
        name: {fig: _figure(data, path) for fig, path in FIGURES.items()}
        for name, data in servers.items()
    }
    gw = figures.get("gateway", {})
    ratios = {
        peer: {fig: _ratio(gw.get(fig), values.get(fig)) for fig in FIGURES}
        for peer, values in figures.items()
        if peer != "gateway"
    }
    # The live rate a replay storm is compared with: the busiest sustained
    # window, or the busiest window at all when none was sustained.
    live = gw.get("max_sustained_events_per_s") or gw.get("peak_events_per_s")
    storm_rate = _get(result, "replay", "storm", "events_per_s")
    result["figures"] = figures
    result["ratios"] = ratios
    result["storm_to_live"] = _ratio(storm_rate, live)
    result["targets"] = _targets(result, gw, ratios)
    result["client_limited"] = _flagged(result, "client_limited")
    result["noisy"] = _flagged(result, "noisy")
    return result


def _flagged(result: dict[str, Any], flag: str) -> dict[str, list[str]]:
    """Every measured window with ``flag`` set, by server.

    Fan-out windows read ``clients x rate`` (the half-load one too); the
    gateway's slow-client windows read ``slow clients: baseline`` or
    ``slow clients: stalled``.
    """
    out: dict[str, list[str]] = {}
    for name, data in result["servers"].items():
        steps = [
            step
            for phase in ("by_clients", "by_rate")
            for step in _get(data, "fanout", phase) or []
        ]
        half = _get(data, "fanout", "half_load")
        steps += [half] if half else []
        out[name] = sorted({f"{s['clients']}x{s['rate']:g}/s" for s in steps if s[flag]})
    slow = result.get("slow_clients") or {}
    for window in ("baseline", "stalled_window"):
        step = slow.get(window)
        if step and step.get(flag) and "gateway" in out:
            out["gateway"].append(f"slow clients: {window.removesuffix('_window')}")
    return out


def _targets(result: dict[str, Any], gw: dict[str, Any], ratios: dict[str, Any]) -> list[Any]:
    def cpu_ratio(peer: str, figure: str = "cpu_us_per_event") -> Any:
        return _get(ratios, peer, figure)

    half = "cpu_us_per_event_half_load"
    light, loaded = _rate(result, "reference"), _rate(result, "half_load")

    slow = result.get("slow_clients", {})
    n = _clients(result)
    idle = _idle_count(result, -1)
    checks: list[tuple[str, Any, str, Any]] = [
        (f"CPU/event / ws_queue's ({n} clients, {light}/s)", cpu_ratio("ws_queue"), "<= 0.333",
         1 / 3),
        (f"CPU/event / ws_broadcast's ({n} clients, {light}/s)", cpu_ratio("ws_broadcast"),
         "<= 0.667", 2 / 3),
        (f"CPU/event / raw ceiling's ({n} clients, {light}/s)", cpu_ratio("raw"), "<= 3", 3.0),
        (f"CPU/event / ws_queue's ({n} clients, {loaded}/s)", cpu_ratio("ws_queue", half),
         "<= 0.333", 1 / 3),
        (f"CPU/event / ws_broadcast's ({n} clients, {loaded}/s)", cpu_ratio("ws_broadcast", half),
         "<= 0.667", 2 / 3),
        (f"CPU/event / raw ceiling's ({n} clients, {loaded}/s)", cpu_ratio("raw", half), "<= 3",
         3.0),
        ("p99 at half max load (ms)", gw.get("p99_ms_half_load"), "<= 5", 5.0),
        (f"idle RSS per connection at {idle} (KiB)", _kib(gw.get("idle_bytes_per_conn_last")),
         "<= 16", 16.0),
        (f"{_replayed(result)}-event replay to one client (ms)",
         _get(result, "replay", "one_client", "ms"), "< 100", 100.0),
        ("replay storm rate / live rate", result.get("storm_to_live"), ">= 5", -5.0),
        ("others' p99 with 10% stalled / without", slow.get("others_p99_ratio"), "<= 1.2", 1.2),
        ("every stalled client got 1008", slow.get("stalled_got_1008"), "true", True),
    ]  # fmt: skip
    out = []
    for name, value, target, bound in checks:
        if value is None:
            met = None
        elif isinstance(bound, bool):
            met = value is bound
        elif bound < 0:  # at least |bound|
            met = value >= -bound
        elif target.startswith("<="):
            met = value <= bound
        else:
            met = value < bound
        out.append({"target": name, "value": value, "goal": target, "met": met})
    return out


def _kib(value: Any) -> float | None:
    return None if value is None else round(value / KIB, 2)


def _replayed(result: dict[str, Any]) -> str:
    return _fmt(_get(result, "replay", "one_client", "events"))


def _rate(result: dict[str, Any], step: str) -> str:
    """The token rate per session of one of the gateway's fan-out steps."""
    return _fmt(_get(result, "servers", "gateway", "fanout", step, "rate"))


def _clients(result: dict[str, Any]) -> str:
    return _fmt(_get(result, "servers", "gateway", "fanout", "reference", "clients"))


def _idle_count(result: dict[str, Any], index: int) -> str:
    points = _get(result, "servers", "gateway", "idle", "points") or [{}]
    return _fmt(points[index].get("connections"))


# --- markdown --------------------------------------------------------------------------


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:,.3g}" if abs(value) < 100 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def _labels(result: dict[str, Any]) -> dict[str, str]:
    n = _clients(result)
    return {
        "max_sustained_events_per_s": f"max sustained events/s delivered ({n} clients)",
        "peak_events_per_s": "peak events/s delivered, sustained or not",
        "cpu_us_per_event": f"server CPU per delivered event, {n} clients at"
        f" {_rate(result, 'reference')} tokens/s per session (us)",
        "cpu_us_per_event_half_load": f"server CPU per delivered event, {n} clients at"
        f" {_rate(result, 'half_load')} tokens/s per session: half the gateway's max load (us)",
        "p50_ms_half_load": "p50 latency at half the gateway's max load (ms)",
        "p99_ms_half_load": "p99 latency at half the gateway's max load (ms)",
        "p999_ms_half_load": "p99.9 latency at half the gateway's max load (ms)",
        "idle_bytes_per_conn_first": f"server RSS per idle connection, {_idle_count(result, 0)}"
        " connections (KiB)",
        "idle_bytes_per_conn_last": f"server RSS per idle connection, {_idle_count(result, -1)}"
        " connections (KiB)",
    }


def markdown(result: dict[str, Any]) -> str:
    """The run as markdown: the comparison table, the gateway-only figures, the targets."""
    figures: dict[str, dict[str, Any]] = result["figures"]
    peers = [name for name in figures if name != "gateway"]
    names = ["gateway", *peers]
    head = ["figure", *names, *(f"gateway / {p}" for p in peers)]
    lines = [_row(head), _row(["---"] * len(head))]
    for fig, label in _labels(result).items():
        values = [figures[n].get(fig) for n in names]
        if fig.startswith("idle_"):
            values = [_kib(v) for v in values]
        ratios = [result["ratios"][p].get(fig) for p in peers]
        lines.append(_row([label, *map(_fmt, values), *map(_fmt, ratios)]))
    replay = result.get("replay", {})
    slow = result.get("slow_clients", {})
    storm = replay.get("storm", {})
    ttft = result.get("ttft") or {}
    lines += [
        "",
        _row(["gateway only", "value"]),
        _row(["---", "---"]),
        _row([f"{_replayed(result)}-event replay to one client (ms)",
              _fmt(_get(replay, "one_client", "ms"))]),
        _row([
            f"replay storm: {_fmt(storm.get('clients'))} clients x "
            f"{_fmt(storm.get('events_each'))} events (s)", _fmt(storm.get("s")),
        ]),
        _row(["... of which until the last client had connected and subscribed (s)",
              _fmt(storm.get("connecting_s"))]),
        _row(["replay storm events/s", _fmt(storm.get("events_per_s"))]),
        _row(["replay storm: server CPU / busiest client worker CPU (cores)",
              f"{_fmt(storm.get('server_cpu_util'))} / {_fmt(storm.get('client_cpu_util'))}"]),
        _row(["replay storm rate / max live rate", _fmt(result.get("storm_to_live"))]),
        _row([
            f"stalled clients ({_fmt(slow.get('stalled'))} of {_fmt(slow.get('clients'))}) "
            "closed with 1008", _fmt(slow.get("stalled_got_1008")),
        ]),
        _row(["others' p99 without / with stalled clients (ms)",
              f"{_fmt(slow.get('others_p99_ms_baseline'))} / "
              f"{_fmt(slow.get('others_p99_ms_stalled'))}"]),
        _row(["others' p99 ratio (stalled / baseline)", _fmt(slow.get("others_p99_ratio"))]),
        _row(["time to first token added by the gateway (ms)", _fmt(ttft.get("added_ms"))]),
        "",
        _row(["target", "value", "goal", "met"]),
        _row(["---", "---", "---", "---"]),
    ]  # fmt: skip
    for t in result["targets"]:
        lines.append(_row([t["target"], _fmt(t["value"]), t["goal"], _fmt(t["met"])]))
    lines.append("")
    lines.append(_flag_note(result, "client_limited", (
        "Client-limited windows (a client worker used >= 85% of a core, so the figure may be "
        "the clients' limit, not the server's)"), "No window was client-limited (every client "
        "worker stayed under 85% of a core)."))  # fmt: skip
    lines.append("")
    lines.append(_flag_note(result, "noisy", (
        "Noisy windows (processes outside the bench used >= 0.25 cores meanwhile)"),
        "No window was noisy (processes outside the bench used < 0.25 cores)."))  # fmt: skip
    return "\n".join(lines) + "\n"


def _flag_note(result: dict[str, Any], flag: str, some: str, none: str) -> str:
    flagged = {k: v for k, v in result.get(flag, {}).items() if v}
    if not flagged:
        return none
    return some + ": " + "; ".join(f"{k}: {', '.join(v)}" for k, v in flagged.items())


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


# --- plots ------------------------------------------------------------------------------


def plots(result: dict[str, Any], stem: Path) -> list[Path]:
    """Latency percentiles against load, and events/s against client count (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    servers: dict[str, Any] = result["servers"]
    written = []
    fig, ax = plt.subplots(figsize=(8, 5))
    for name, data in servers.items():
        fanout = _get(data, "fanout") or {}
        steps = [*fanout.get("by_rate", []), fanout.get("half_load")]
        steps = sorted(
            (s for s in steps if s and s["p99_ms"] is not None), key=lambda s: s["events_per_s"]
        )
        if not steps:
            continue
        x = [s["events_per_s"] for s in steps]
        line = ax.plot(x, [s["p99_ms"] for s in steps], marker="o", label=f"{name} p99")[0]
        ax.plot(x, [s["p50_ms"] for s in steps], ls=":", color=line.get_color(),
                label=f"{name} p50")  # fmt: skip
        ax.plot(x, [s["p999_ms"] for s in steps], ls="--", color=line.get_color(),
                label=f"{name} p99.9", alpha=0.6)  # fmt: skip
    ax.set_xlabel("events delivered per second")
    ax.set_ylabel("end-to-end latency (ms)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_title(f"Latency against load ({_clients(result)} clients)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    path = stem.with_name(stem.name + "-latency.png")
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    written.append(path)

    fig, (ax, cost) = plt.subplots(1, 2, figsize=(12, 5))
    for name, data in servers.items():
        steps = _get(data, "fanout", "by_clients") or []
        if not steps:
            continue
        clients = [s["clients"] for s in steps]
        ax.plot(clients, [s["events_per_s"] for s in steps], marker="o", label=name)
        cost.plot(clients, [s["cpu_us_per_event"] for s in steps], marker="o", label=name)
    rate = _get(result, "profile", "rate")
    ax.set_title(f"Events/s against client count ({_fmt(rate)} tokens/s per session)")
    ax.set_xlabel("clients")
    ax.set_ylabel("events delivered per second")
    cost.set_title("Server CPU per delivered event, same windows")
    cost.set_xlabel("clients")
    cost.set_ylabel("microseconds of server CPU per event")
    cost.set_yscale("log")
    for axis in (ax, cost):
        axis.grid(True, which="both", alpha=0.3)
        axis.legend()
    path = stem.with_name(stem.name + "-throughput.png")
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    written.append(path)
    return written


def write(result: dict[str, Any], stem: Path) -> tuple[Path, Path, list[Path]]:
    """``stem``.json, ``stem``.md and the plots; returns their paths."""
    stem.parent.mkdir(parents=True, exist_ok=True)
    json_path = stem.with_suffix(".json")
    json_path.write_text(json.dumps(result, indent=2) + "\n")
    md_path = stem.with_suffix(".md")
    md_path.write_text(markdown(result))
    return json_path, md_path, plots(result, stem)

"""What a run leaves behind: the JSON result, the markdown table, the plots.

:func:`summarize` adds to the raw phase results the headline figures, the
gateway's ratio to each peer, and each target of the issue with whether it was
met. Ratios are gateway / peer, so for costs (CPU, memory, latency) below 1
means the gateway is cheaper, and for throughput above 1 means it is faster.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.tables import fmt, number, ratio, row, write_files

KIB = 1024


def _get(data: Any, *path: str) -> Any:
    for key in path:
        if not isinstance(data, dict) or key not in data:
            return None
        data = data[key]
    return data


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


# With the gateway on Redis (``--backend redis``): redis-server's own CPU per event.
STORE_FIGURES: dict[str, tuple[str, ...]] = {
    "store_cpu_us_per_event": ("fanout", "reference", "store_cpu_us_per_event"),
    "store_cpu_us_per_event_half_load": ("fanout", "half_load", "store_cpu_us_per_event"),
}


def summarize(result: dict[str, Any]) -> dict[str, Any]:
    """Headline figures, ratios and targets (module docstring), added to ``result``."""
    if "nodes" in result:  # --nodes: the comparison of the backends, if run, and the nodes
        if result.get("backend") == "both":
            summarize_backends(result)
        else:
            result.update(figures={}, ratios={}, targets=[], client_limited={}, noisy={})
        return summarize_nodes(result)
    if result.get("backend") == "both":
        return summarize_backends(result)
    servers: dict[str, Any] = result["servers"]
    figures = {
        name: {fig: _figure(data, path) for fig, path in FIGURES.items()}
        for name, data in servers.items()
    }
    if result.get("backend") == "redis" and "gateway" in figures:
        figures["gateway"] |= {f: _figure(servers["gateway"], p) for f, p in STORE_FIGURES.items()}
    gw = figures.get("gateway", {})
    ratios = {
        peer: {fig: ratio(gw.get(fig), values.get(fig)) for fig in FIGURES}
        for peer, values in figures.items()
        if peer != "gateway"
    }
    # The live rate a replay storm is compared with: the busiest sustained
    # window, or the busiest window at all when none was sustained.
    live = gw.get("max_sustained_events_per_s") or gw.get("peak_events_per_s")
    storm_rate = _get(result, "replay", "storm", "events_per_s")
    result["figures"] = figures
    result["ratios"] = ratios
    result["storm_to_live"] = ratio(storm_rate, live)
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
    return fmt(_get(result, "replay", "one_client", "events"))


def _rate(result: dict[str, Any], step: str) -> str:
    """The token rate per session of one of the gateway's fan-out steps."""
    return fmt(_get(result, "servers", "gateway", "fanout", step, "rate"))


def _clients(result: dict[str, Any]) -> str:
    return fmt(_get(result, "servers", "gateway", "fanout", "reference", "clients"))


def _idle_count(result: dict[str, Any], index: int) -> str:
    points = _get(result, "servers", "gateway", "idle", "points") or [{}]
    return fmt(points[index].get("connections"))


# --- markdown --------------------------------------------------------------------------


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
    } | (_store_labels(result) if result.get("backend") == "redis" else {})


def _store_labels(result: dict[str, Any]) -> dict[str, str]:
    n = _clients(result)
    return {
        "store_cpu_us_per_event": f"redis-server CPU per delivered event, {n} clients at"
        f" {_rate(result, 'reference')} tokens/s per session (us; beside the server's)",
        "store_cpu_us_per_event_half_load": f"redis-server CPU per delivered event, {n} clients"
        f" at {_rate(result, 'half_load')} tokens/s per session (us; beside the server's)",
    }


def markdown(result: dict[str, Any]) -> str:
    """The run as markdown: the comparison table, the gateway-only figures, the targets."""
    if "nodes" in result:
        backends = markdown_backends(result) + "\n" if result.get("backend") == "both" else ""
        return backends + markdown_nodes(result)
    if result.get("backend") == "both":
        return markdown_backends(result)
    figures: dict[str, dict[str, Any]] = result["figures"]
    peers = [name for name in figures if name != "gateway"]
    names = ["gateway", *peers]
    head = ["figure", *names, *(f"gateway / {p}" for p in peers)]
    lines = [row(head), row(["---"] * len(head))]
    for fig, label in _labels(result).items():
        values = [figures[n].get(fig) for n in names]
        if fig.startswith("idle_"):
            values = [_kib(v) for v in values]
        ratios = [result["ratios"][p].get(fig) for p in peers]
        lines.append(row([label, *map(fmt, values), *map(fmt, ratios)]))
    replay = result.get("replay", {})
    slow = result.get("slow_clients", {})
    storm = replay.get("storm", {})
    ttft = result.get("ttft") or {}
    lines += [
        "",
        row(["gateway only", "value"]),
        row(["---", "---"]),
        row([f"{_replayed(result)}-event replay to one client (ms)",
              fmt(_get(replay, "one_client", "ms"))]),
        row([
            f"replay storm: {fmt(storm.get('clients'))} clients x "
            f"{fmt(storm.get('events_each'))} events (s)", fmt(storm.get("s")),
        ]),
        row(["... of which until the last client had connected and subscribed (s)",
              fmt(storm.get("connecting_s"))]),
        row(["replay storm events/s", fmt(storm.get("events_per_s"))]),
        row(["replay storm: server CPU / busiest client worker CPU (cores)",
              f"{fmt(storm.get('server_cpu_util'))} / {fmt(storm.get('client_cpu_util'))}"]),
        row(["replay storm rate / max live rate", fmt(result.get("storm_to_live"))]),
        row([
            f"stalled clients ({fmt(slow.get('stalled'))} of {fmt(slow.get('clients'))}) "
            "closed with 1008", fmt(slow.get("stalled_got_1008")),
        ]),
        row(["others' p99 without / with stalled clients (ms)",
              f"{fmt(slow.get('others_p99_ms_baseline'))} / "
              f"{fmt(slow.get('others_p99_ms_stalled'))}"]),
        row(["others' p99 ratio (stalled / baseline)", fmt(slow.get("others_p99_ratio"))]),
        row(["time to first token added by the gateway (ms)", fmt(ttft.get("added_ms"))]),
        "",
        row(["target", "value", "goal", "met"]),
        row(["---", "---", "---", "---"]),
    ]  # fmt: skip
    for t in result["targets"]:
        lines.append(row([t["target"], fmt(t["value"]), t["goal"], fmt(t["met"])]))
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


# --- one node on SQLite vs one node on Redis (--backend both) ----------------------------

# The targets: Redis / SQLite at most these (CPU per event, p99 at half load).
CPU_RATIO_MAX = 1.3
P99_RATIO_MAX = 1.5
NOISY = 0.25  # bench.measure.NOISY: other processes' cores that make a window noisy

# figure -> where it is in a backend's result; () is the sum of the two figures
# before it: the gateway's CPU plus redis-server's.
BACKEND_FIGURES: dict[str, tuple[str, ...]] = {
    "max_sustained_events_per_s": ("fanout", "max_sustained", "events_per_s"),
    "peak_events_per_s": ("fanout", "peak", "events_per_s"),
    "gateway_cpu_us_per_event": ("fanout", "reference", "cpu_us_per_event"),
    "redis_cpu_us_per_event": ("fanout", "reference", "store_cpu_us_per_event"),
    "cpu_us_per_event": (),
    "gateway_cpu_us_per_event_half_load": ("fanout", "half_load", "cpu_us_per_event"),
    "redis_cpu_us_per_event_half_load": ("fanout", "half_load", "store_cpu_us_per_event"),
    "cpu_us_per_event_half_load": (),
    "p50_ms_half_load": ("fanout", "half_load", "p50_ms"),
    "p99_ms_half_load": ("fanout", "half_load", "p99_ms"),
    "p999_ms_half_load": ("fanout", "half_load", "p999_ms"),
    "events_per_s_half_load": ("fanout", "half_load", "events_per_s"),
    "gateway_cores_half_load": ("fanout", "half_load", "server_cpu_util"),
    "redis_cores_half_load": ("fanout", "half_load", "store_cpu_util"),
    "clients_cores_half_load": ("fanout", "half_load", "clients_cpu_util"),
    "other_cores_half_load": ("fanout", "half_load", "other_cpu_util"),
    "gateway_cpu_us_per_event_catalog": ("catalog", "cpu_us_per_event"),
    "redis_cpu_us_per_event_catalog": ("catalog", "store_cpu_us_per_event"),
    "cpu_us_per_event_catalog": (),
    "catalog_turn_s": ("catalog", "s"),
}
_STORE_KEYS = ("store_cpu_us_per_event", "store_cpu_util")


def _backend_figures(server: dict[str, Any], backend: str) -> dict[str, Any]:
    """One backend's figures; on SQLite the store is in the gateway's process (0 beside it)."""
    out: dict[str, Any] = {}
    for fig, path in BACKEND_FIGURES.items():
        if not path:  # the sum: the gateway's CPU plus redis-server's
            parts = (out[f"gateway_{fig}"], out[f"redis_{fig}"])
            out[fig] = round(sum(parts), 2) if all(number(p) for p in parts) else None
        elif path[-1] in _STORE_KEYS and backend == "sqlite":
            out[fig] = 0.0 if _get(server, *path[:-1]) else None
        else:
            out[fig] = _get(server, *path)
    return out


def summarize_backends(result: dict[str, Any]) -> dict[str, Any]:
    """Figures of each backend, the ratios Redis / SQLite, and the issue's two targets."""
    servers: dict[str, Any] = result["servers"]
    figures = {name: _backend_figures(data, name) for name, data in servers.items()}
    sqlite, redis = figures.get("sqlite", {}), figures.get("redis", {})
    ratios = {fig: ratio(redis.get(fig), sqlite.get(fig)) for fig in BACKEND_FIGURES}
    result["figures"] = figures
    result["ratios"] = {"redis / sqlite": ratios}
    n = _get(servers, "sqlite", "fanout", "reference", "clients")
    light = fmt(_get(servers, "sqlite", "fanout", "reference", "rate"))
    loaded = fmt(_get(servers, "sqlite", "fanout", "half_load", "rate"))
    checks = [
        (f"CPU/event, gateway + redis-server, Redis / SQLite ({fmt(n)} clients, {light}/s)",
         ratios["cpu_us_per_event"], CPU_RATIO_MAX),
        (f"CPU/event, gateway + redis-server, Redis / SQLite ({fmt(n)} clients, {loaded}/s)",
         ratios["cpu_us_per_event_half_load"], CPU_RATIO_MAX),
        ("p99 at half load, Redis / SQLite", ratios["p99_ms_half_load"], P99_RATIO_MAX),
        ("CPU/event, gateway + redis-server, Redis / SQLite (a turn of tool rounds)",
         ratios["cpu_us_per_event_catalog"], CPU_RATIO_MAX),
    ]  # fmt: skip
    result["targets"] = [
        {"target": name, "value": value, "goal": f"<= {bound:g}",
         "met": None if value is None else value <= bound}
        for name, value, bound in checks
    ]  # fmt: skip
    result["client_limited"] = _flagged(result, "client_limited")
    result["noisy"] = _flagged(result, "noisy")
    for name, data in servers.items():
        if (_get(data, "catalog", "other_cpu_util") or 0.0) >= NOISY:
            result["noisy"].setdefault(name, []).append("the turn of tool rounds")
    return result


def _backend_labels(result: dict[str, Any]) -> dict[str, str]:
    servers = result["servers"]
    n = fmt(_get(servers, "sqlite", "fanout", "reference", "clients"))
    light = fmt(_get(servers, "sqlite", "fanout", "reference", "rate"))
    half = fmt(_get(servers, "sqlite", "fanout", "half_load", "rate"))
    at_light = f"{n} clients at {light} tokens/s per session"
    at_half = f"{n} clients at {half} tokens/s per session: half SQLite's max load"
    catalog = _get(servers, "sqlite", "catalog") or {}
    events, stored = fmt(catalog.get("events")), fmt(catalog.get("stored_events"))
    tools = f"a turn of tool rounds to 1 client ({events} events, {stored} of them stored)"
    return {
        "max_sustained_events_per_s": f"max sustained events/s delivered ({n} clients)",
        "peak_events_per_s": "peak events/s delivered, sustained or not",
        "gateway_cpu_us_per_event": f"gateway CPU per delivered event, {at_light} (us)",
        "redis_cpu_us_per_event": f"redis-server CPU per delivered event, {at_light} (us)",
        "cpu_us_per_event": f"**gateway + redis-server CPU per delivered event**, {at_light} (us)",
        "gateway_cpu_us_per_event_half_load": f"gateway CPU per delivered event, {at_half} (us)",
        "redis_cpu_us_per_event_half_load": f"redis-server CPU per delivered event, {at_half} (us)",
        "cpu_us_per_event_half_load":
            f"**gateway + redis-server CPU per delivered event**, {at_half} (us)",
        "p50_ms_half_load": "p50 latency at half load (ms)",
        "p99_ms_half_load": "**p99 latency at half load (ms)**",
        "p999_ms_half_load": "p99.9 latency at half load (ms)",
        "events_per_s_half_load": "events/s delivered at half load",
        "gateway_cores_half_load": "at half load, cores used by the gateway",
        "redis_cores_half_load": "... by redis-server",
        "clients_cores_half_load": "... by the client workers (all together)",
        "other_cores_half_load": "... by processes outside the bench",
        "gateway_cpu_us_per_event_catalog": f"gateway CPU per delivered event, {tools} (us)",
        "redis_cpu_us_per_event_catalog": f"redis-server CPU per delivered event, {tools} (us)",
        "cpu_us_per_event_catalog":
            f"**gateway + redis-server CPU per delivered event**, {tools} (us)",
        "catalog_turn_s": f"{tools}: the turn took (s)",
    }  # fmt: skip


def markdown_backends(result: dict[str, Any]) -> str:
    """``--backend both`` as markdown: one node on SQLite vs on Redis, then the targets."""
    figures: dict[str, dict[str, Any]] = result["figures"]
    ratios = result["ratios"]["redis / sqlite"]
    lines = [row(["figure", "SQLite", "Redis", "Redis / SQLite"]), row(["---"] * 4)]
    for fig, label in _backend_labels(result).items():
        values = [figures.get(b, {}).get(fig) for b in ("sqlite", "redis")]
        if fig.startswith("redis_") and values[0] == 0.0:
            values[0] = "(in the gateway)"
        lines.append(row([label, *map(fmt, values), fmt(ratios.get(fig))]))
    lines += ["", row(["target", "value", "goal", "met"]), row(["---"] * 4)]
    for t in result["targets"]:
        lines.append(row([t["target"], fmt(t["value"]), t["goal"], fmt(t["met"])]))
    lines.append("")
    lines.append(
        f"The machine has {fmt(_get(result, 'machine', 'cpus'))} cores, shared by the gateway,"
        " redis-server, the client workers and the bench itself: the cores rows above say what"
        " each had at half load."
    )
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


# --- one node and several on one Redis (--nodes N) --------------------------------------

US = 1e6


def _div(a: Any, b: Any, scale: float = 1.0, digits: int = 2) -> float | None:
    if not number(a) or not number(b) or not b:
        return None
    return round(float(a) / float(b) * scale, digits)


def _window_figures(step: dict[str, Any] | None, split: bool) -> dict[str, Any]:
    """One window of a configuration: throughput, the cores each process had, unit costs.

    ``split``: node 0 owns every session and the others have every client, so
    node 0's CPU is per published batch and the others' per delivered event.
    """
    if not step:
        return {}
    nodes = step.get("nodes") or {}
    wall = nodes.get("wall_s")
    events = step["events_per_s"] * wall if wall else None
    cpu = nodes.get("node_cpu_s") or []
    publishes = nodes.get("publishes")
    store_s = None if step.get("store_cpu_util") is None or not wall else (
        step["store_cpu_util"] * wall)  # fmt: skip
    out: dict[str, Any] = {
        "rate": step["rate"],
        "events_per_s": step["events_per_s"],
        "sustained": step["sustained"],
        "p50_ms": step["p50_ms"],
        "p99_ms": step["p99_ms"],
        "nodes_cores": step["server_cpu_util"],
        "node_cores": [_div(c, wall, digits=3) for c in cpu],
        "redis_cores": step.get("store_cpu_util"),
        "clients_cores": step["clients_cpu_util"],
        "other_cores": step["other_cpu_util"],
        "nodes_cpu_us_per_event": step["cpu_us_per_event"],
        "redis_cpu_us_per_event": step.get("store_cpu_us_per_event"),
        "publishes_per_s": _div(publishes, wall, digits=1),
        "events_per_publish": _div(events, publishes, digits=1),
        "publish_usec_per_call": _div(nodes.get("publish_usec"), publishes),
        "redis_cpu_us_per_publish": _div(store_s, publishes, US),
    }
    if split and len(cpu) > 1 and publishes:
        out["owner_cores"] = _div(cpu[0], wall, digits=3)
        out["owner_cpu_us_per_publish"] = _div(cpu[0], publishes, US)
        out["receiver_cpu_us_per_event"] = _div(sum(cpu[1:]), events, US)
    return out


def summarize_nodes(result: dict[str, Any]) -> dict[str, Any]:
    """Each configuration's figures at its maximum and at its half load, and the model."""
    configurations: dict[str, Any] = result["nodes"]["configurations"]
    figures = {}
    for name, data in configurations.items():
        fanout, split = data.get("fanout") or {}, data["placement"]["shape"] == "split"
        figures[name] = {
            "max_sustained": _window_figures(fanout.get("max_sustained"), split),
            "half_load": _window_figures(fanout.get("half_load"), split),
        }
        if "error" in data:
            figures[name]["error"] = data["error"]
    result["nodes"]["figures"] = figures
    result["nodes"]["model"] = capacity_model(result)
    for name, data in configurations.items():
        flagged = _flagged({"servers": {name: data}}, "noisy")[name]
        if flagged:
            result["noisy"][name] = flagged
        limited = _flagged({"servers": {name: data}}, "client_limited")[name]
        if limited:
            result["client_limited"][name] = limited
    return result


def capacity_model(result: dict[str, Any]) -> dict[str, Any]:
    """What N nodes and one Redis (or a Cluster sharded by session) carry, from the costs.

    Costs are taken at the busiest sustained window (the half-load one where
    none was), each process's whole CPU over the window divided by what it
    did: an upper bound, since what a process spends whatever the load
    (redis-server's cron and fsync, a node's lease renewals) is in it. (The
    difference between two windows would take that out, but redis-server's
    share of a 2-core machine is too small to difference: it came out
    negative in a noisy run.)

    - A node delivers ``1e6 / node_us`` events/s per core to its own clients
      (one node's CPU per event), and ``1e6 / receiver_us`` of other nodes'
      sessions (the split shape's receiving nodes).
    - An owner publishes each batch once; Redis spends ``redis_us_per_publish``
      per batch (the publish, its delivery to each watching node, the store's
      few writes of a streaming turn), so one Redis core carries ``1e6 /`` that
      batches/s, ``events_per_publish`` delivered events each (the clients
      per session).
    - Streaming text, nodes are the bottleneck until that is reached:
      ``nodes_per_redis_core`` nodes. With tool rounds, where every event is
      stored (``--backend both``), one Redis core keeps
      ``nodes_per_redis_core_tools`` nodes busy (the gateway's CPU per event
      over redis-server's in that turn) and stores
      ``redis_stored_events_per_s_per_core`` events/s.
    - A Cluster sharded by session spreads the publishes and each session's
      keys over its shards; the deployment's counter and indexes stay on one
      shard each (docs/scale-out.md), written once per store batch.
    """
    figures = result["nodes"].get("figures", {})

    def busiest(suffix: str) -> dict[str, Any]:
        found = [f for n, f in figures.items() if n.endswith(suffix)]
        if not found:
            return {}
        return dict(found[0].get("max_sustained") or found[0].get("half_load") or {})

    one, split, remote = busiest("1 node"), busiest("split"), busiest("remote")
    node_us = one.get("nodes_cpu_us_per_event")
    receiver_us = split.get("receiver_cpu_us_per_event")
    redis_us = split.get("redis_cpu_us_per_publish") or remote.get("redis_cpu_us_per_publish")
    per_publish = split.get("events_per_publish") or remote.get("events_per_publish")
    catalog = _get(result, "servers", "redis", "catalog") or {}
    stored_us = (
        _div(
            (catalog.get("store_cpu_us_per_event") or 0) * (catalog.get("events") or 0),
            catalog.get("stored_events"),
        )
        or None
    )
    tools_nodes = _div(catalog.get("cpu_us_per_event"), catalog.get("store_cpu_us_per_event"),
                       digits=1)  # fmt: skip
    node_rate = _div(US, node_us, digits=0)
    redis_batches = _div(US, redis_us, digits=0)
    redis_events = None if redis_batches is None or per_publish is None else round(
        redis_batches * per_publish)  # fmt: skip
    nodes_per_core = _div(redis_events, node_rate, digits=1)
    bottleneck = None
    if nodes_per_core is not None:
        who = "the nodes' CPU (the fan-out to clients)" if nodes_per_core >= 1 else (
            "Redis's one thread (a publish per batch)")  # fmt: skip
        bottleneck = (
            f"{who}: streaming text at {fmt(per_publish)} clients per session, one Redis"
            f" core keeps about {fmt(nodes_per_core)} nodes busy (a publish per batch: fewer"
            " clients per session, fewer nodes)"
        )
        if tools_nodes is not None:
            bottleneck += (
                f"; with tool rounds, where every event is written to Redis, about"
                f" {fmt(tools_nodes)} nodes, past which Redis's one thread is the bottleneck"
            )
    commands: set[str] = set()
    for data in result["nodes"]["configurations"].values():
        commands |= set(_get(data, "fanout", "half_load", "nodes", "by_command") or {})
    sharded = "spublish" in commands
    cluster = (
        "a Redis Cluster sharded by session spreads each session's keys and writes over its"
        " shards; the deployment's counter and indexes (gw:meta, gw:ets, gw:sessions ...) stay"
        " on one shard each, written once per store batch: that shard is the Cluster's"
        " bottleneck for stored events. Live batches go out with "
        + ("SPUBLISH, which stays on the session's shard: publishes scale with the shards"
           if sharded else "PUBLISH, which a Cluster forwards to every shard: publishes do not"
           " scale with the shards (SPUBLISH/SSUBSCRIBE would)")
    )  # fmt: skip
    return {
        "node_cpu_us_per_event": node_us,
        "receiver_cpu_us_per_event": receiver_us,
        "owner_cpu_us_per_publish": split.get("owner_cpu_us_per_publish"),
        "redis_cpu_us_per_publish": redis_us,
        "publish_usec_per_call": split.get("publish_usec_per_call")
        or remote.get("publish_usec_per_call"),
        "events_per_publish": per_publish,
        "node_events_per_s_per_core": node_rate,
        "receiver_events_per_s_per_core": _div(US, receiver_us, digits=0),
        "redis_batches_per_s_per_core": redis_batches,
        "redis_events_per_s_per_core": redis_events,
        "nodes_per_redis_core": nodes_per_core,
        "redis_cpu_us_per_stored_event": stored_us,
        "redis_stored_events_per_s_per_core": _div(US, stored_us, digits=0),
        "nodes_per_redis_core_tools": tools_nodes,
        "bottleneck": bottleneck,
        "cluster": cluster if commands else None,
    }  # fmt: skip


_NODE_ROWS: dict[str, str] = {
    "events_per_s": "**max sustained events/s delivered**",
    "rate": "... at tokens/s per session",
    "p99_ms": "... p99 (ms)",
    "nodes_cores": "... cores used by the gateway nodes (together)",
    "node_cores": "... by each node",
    "redis_cores": "... by redis-server",
    "clients_cores": "... by the client workers (together)",
    "other_cores": "... by processes outside the bench",
}
_HALF_ROWS: dict[str, str] = {
    "rate": "half load: tokens/s per session",
    "events_per_s": "... events/s delivered",
    "p50_ms": "... p50 (ms)",
    "p99_ms": "... p99 (ms)",
    "nodes_cpu_us_per_event": "... nodes' CPU per delivered event (us)",
    "redis_cpu_us_per_event": "... redis-server CPU per delivered event (us)",
    "publishes_per_s": "... PUBLISH/SPUBLISH per second (batches)",
    "events_per_publish": "... delivered events per publish",
    "publish_usec_per_call": "... Redis's usec per publish call (commandstats)",
    "redis_cpu_us_per_publish": "... redis-server CPU per publish, everything included (us)",
    "owner_cpu_us_per_publish": "... owner node CPU per published batch (us)",
    "receiver_cpu_us_per_event": "... receiving node CPU per delivered event (us)",
}


def markdown_nodes(result: dict[str, Any]) -> str:
    """``--nodes``: one table, a column per configuration, then the model."""
    figures: dict[str, Any] = result["nodes"]["figures"]
    names = list(figures)
    lines = [row(["figure", *names]), row(["---"] * (1 + len(names)))]
    clients = {_get(d, "fanout", "reference", "clients")
               for d in result["nodes"]["configurations"].values()}  # fmt: skip
    for part, rows in (("max_sustained", _NODE_ROWS), ("half_load", _HALF_ROWS)):
        for key, label in rows.items():
            values = [figures[n][part].get(key) for n in names]
            if all(v is None or v == [] for v in values):
                continue
            cells = [" + ".join(map(fmt, v)) if isinstance(v, list) else fmt(v) for v in values]
            lines.append(row([label, *cells]))
    errors = [f"{name}: {figures[name]['error']}" for name in names if "error" in figures[name]]
    placements = "; ".join(
        f"{name}: sessions owned {d['placement']['sessions_owned']}, with clients "
        f"{d['placement']['sessions_served']}"
        for name, d in result["nodes"]["configurations"].items()
    )
    model = result["nodes"]["model"]
    lines += [f"\n**Failed**: {error}" for error in errors]
    lines += [
        "",
        f"Clients: {', '.join(map(fmt, sorted(c for c in clients if c)))}, the same in every"
        f" configuration, on the same {fmt(_get(result, 'machine', 'cpus'))}-core machine as"
        f" every node and redis-server. Sessions per node: {placements}.",
        "",
        row(["capacity model (at the busiest sustained step; a core per node)", "value"]),
        row(["---", "---"]),
    ]
    for key, label in (
        ("node_cpu_us_per_event", "a node's CPU per event to its own clients (us)"),
        ("receiver_cpu_us_per_event", "a node's CPU per event of another node's session (us)"),
        ("owner_cpu_us_per_publish", "the owner's CPU per published batch (us)"),
        ("redis_cpu_us_per_publish", "redis-server CPU per published batch (us)"),
        ("publish_usec_per_call", "... of which in PUBLISH itself (us)"),
        ("events_per_publish", "delivered events per batch (clients per session)"),
        ("node_events_per_s_per_core", "events/s one node delivers per core"),
        ("receiver_events_per_s_per_core", "... of other nodes' sessions"),
        ("redis_batches_per_s_per_core", "batches/s one Redis core carries"),
        ("redis_events_per_s_per_core", "... as delivered events/s"),
        ("nodes_per_redis_core", "nodes one Redis core keeps busy"),
        ("redis_cpu_us_per_stored_event", "redis-server CPU per stored event (tool rounds, us)"),
        ("redis_stored_events_per_s_per_core", "stored events/s one Redis core carries"),
        ("nodes_per_redis_core_tools", "nodes one Redis core keeps busy (tool rounds)"),
    ):  # fmt: skip
        lines.append(row([label, fmt(model.get(key))]))
    lines += ["", f"Bottleneck: {model.get('bottleneck') or '-'}.", ""]
    if model.get("cluster"):
        lines += [f"Cluster: {model['cluster']}.", ""]
    lines.append(_flag_note(result, "client_limited", (
        "Client-limited windows (a client worker used >= 85% of a core, so the figure may be "
        "the clients' limit, not the server's)"), "No window was client-limited (every client "
        "worker stayed under 85% of a core)."))  # fmt: skip
    lines.append("")
    lines.append(_flag_note(result, "noisy", (
        "Noisy windows (processes outside the bench used >= 0.25 cores meanwhile)"),
        "No window was noisy (processes outside the bench used < 0.25 cores)."))  # fmt: skip
    return "\n".join(lines) + "\n"


# --- plots ------------------------------------------------------------------------------


def plots(result: dict[str, Any], stem: Path) -> list[Path]:
    """Latency percentiles against load, and events/s against client count (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    configurations = _get(result, "nodes", "configurations") or {}
    servers: dict[str, Any] = {**result["servers"], **configurations}
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
    ax.set_title(f"Events/s against client count ({fmt(rate)} tokens/s per session)")
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
    json_path, md_path = write_files(stem, result, markdown(result))
    return json_path, md_path, plots(result, stem)

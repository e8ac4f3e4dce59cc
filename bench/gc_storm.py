"""``python -m bench.gc_storm``: what Python's garbage collector costs the daemon in a storm.

Thousands of clients reconnecting at once (a deploy, a network blip) leave
thousands of connection objects alive, and live objects are what make a
full collection (generation 2) come and what it scans. This starts one
gateway (the bench's configuration, its store in a temporary directory),
then ``--storms`` times connects ``--clients`` subscribed WebSocket clients
all at once through the bench's workers and closes them, and reads the
daemon's own ``gateway_gc_pause_seconds`` and ``gateway_gc_frozen_objects``
(docs/operating.md "Garbage collection") before and after: how many
collections of each generation ran, their total time and the largest
bucket a pause fell in, beside the daemon's CPU and the wall time over the
storms. The other side of a comparison is another tree
(``PYTHONPATH``): the bench times whatever gateway it starts. Prints one
JSON object; figures are reported, never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from bench.pool import WorkerPool
from bench.profiles import DEFAULT, config_toml
from bench.scenarios import CHAT
from bench.servers import GatewayServer


def gc_figures(text: str) -> dict[str, Any]:
    """Per generation: collections, seconds in them, the smallest bucket holding every
    pause (s); and the frozen objects."""
    out: dict[str, Any] = {"frozen_objects": None, "generations": {}}
    for family in text_string_to_metric_families(text):
        if family.name == "gateway_gc_frozen_objects":
            out["frozen_objects"] = int(family.samples[0].value)
        if family.name != "gateway_gc_pause_seconds":
            continue
        for sample in family.samples:
            gen = out["generations"].setdefault(sample.labels["generation"], {"buckets": []})
            if sample.name.endswith("_count"):
                gen["count"] = int(sample.value)
            elif sample.name.endswith("_sum"):
                gen["seconds"] = sample.value
            elif sample.name.endswith("_bucket"):
                gen["buckets"].append((float(sample.labels["le"]), int(sample.value)))
    return out


def difference(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """What ran between two readings, by generation."""
    out: dict[str, Any] = {}
    for name, late in after["generations"].items():
        early = before["generations"].get(name, {"count": 0, "seconds": 0.0, "buckets": []})
        counts = dict(early["buckets"])
        count = late["count"] - early["count"]
        holding = [le for le, n in late["buckets"] if n - counts.get(le, 0) == count]
        out[name] = {
            "collections": count,
            "ms": round((late["seconds"] - early["seconds"]) * 1000, 1),
            "longest_ms_at_most": min(holding) * 1000 if count else None,
        }
    return out


async def run(clients: int, storms: int, workdir: Path) -> dict[str, Any]:
    config = config_toml(DEFAULT.gateway_config, str(workdir / "gateway.db"))
    server = GatewayServer(workdir, config)
    pool = WorkerPool(DEFAULT.workers)
    await server.start()
    try:
        assert server.http is not None
        sessions = await server.open_sessions(10)
        before = gc_figures((await server.http.request_bytes("GET", "/metrics")).decode())
        cpu_before, started = server.cpu_seconds() or 0.0, time.monotonic()
        for _ in range(storms):
            targets = [server.target(sessions[i % 10], CHAT) for i in range(clients)]
            await pool.prepare("storm", targets)
            await pool.connect("storm", all_at_once=True)
            await pool.close("storm")
        after = gc_figures((await server.http.request_bytes("GET", "/metrics")).decode())
        cpu_s, wall_s = (server.cpu_seconds() or 0.0) - cpu_before, time.monotonic() - started
    finally:
        await pool.shutdown()
        await server.stop()
    return {
        "clients": clients,
        "storms": storms,
        "frozen_objects": after["frozen_objects"],
        "wall_s": round(wall_s, 2),
        "daemon_cpu_s": round(cpu_s, 2),
        "during_the_storms": difference(before, after),
    }


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.gc_storm", description=__doc__)
    ap.add_argument("--clients", type=int, default=2000, help="clients a storm (2000)")
    ap.add_argument("--storms", type=int, default=5, help="storms, one after the other (5)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-gc-") as tmp:
        result = asyncio.run(run(args.clients, args.storms, Path(tmp)))
    json.dump(result, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

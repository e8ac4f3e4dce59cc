"""``python -m bench.storm``: the delegate storm, and what it costs the other sessions.

The turn an adversarial trial sent (docs/protocol.md §15, "Limits that hold"):
one scripted turn (docs/reference.md "The scripted model") whose first round asks for
1,000 ``delegate`` tool uses. This measures, on a real daemon (``python -m
gateway serve --port 0``, its store in a temporary directory):

- another session's ``POST /sessions/{id}/turns`` latency, ``--probes``
  requests (each on a fresh session, so none waits for a turn to end) with
  no storm, then one every 25 ms for as long as the storm turn runs (up to
  ``SPARE`` of them): median and max, and their ratio;
- the storm turn's duration (from its 202 to its final message, polled), the
  workers it started, and the daemon's resident memory before and after.

``--control`` sends the same number of ``text`` blocks instead of tool uses:
what a message of that many blocks costs by itself, with no tool at all.
``--no-limits`` runs it with ``max_tool_uses_per_turn``,
``max_workers_per_turn`` and ``max_delegate_depth`` at 0 (no limit): the
gateway as the trial found it. It prints one JSON object. Figures are
reported, never asserted (tests/integration/tenancy/test_turn_limits.py asserts the counts).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import psutil  # type: ignore[import-untyped]

from bench.profiles import config_toml

_READY = re.compile(r"gateway listening on http://\S+:(\d+)")


def _start(workdir: Path, limits: dict[str, Any]) -> tuple[subprocess.Popen[str], str]:
    config = workdir / "gateway.toml"
    sections = {"limits": limits, "log": {"level": "warning"}}
    config.write_text(config_toml(sections, str(workdir / "gateway.db")))
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway", "serve", "--config", str(config), "--port", "0"],
        cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    deadline = time.monotonic() + 30
    for line in proc.stdout:
        found = _READY.search(line)
        if found:
            return proc, f"http://127.0.0.1:{found.group(1)}"
        if time.monotonic() > deadline:
            break
    proc.kill()
    raise SystemExit("the gateway did not start")


def _rss_mb(pid: int) -> float:
    rss: int = psutil.Process(pid).memory_info().rss
    return round(rss / 2**20, 1)


def _probe(http: httpx.Client, sid: str) -> float:
    """One ``POST .../turns`` on ``sid``: its latency in ms."""
    start = time.perf_counter()
    r = http.post(f"/sessions/{sid}/turns", json={"content": "hi"})
    elapsed = (time.perf_counter() - start) * 1000
    assert r.status_code == 202, r.text
    return elapsed


def _finished(http: httpx.Client, sid: str) -> bool:
    page = http.get(f"/sessions/{sid}/messages", params={"limit": 1}).json()["messages"]
    last = page[-1] if page else None
    return bool(last and last["role"] == "assistant" and last["content"][-1:] == [DONE])


DONE = {"type": "text", "text": "done"}
SPARE = 400  # sessions kept for the probes during the storm


def _workers(http: httpx.Client, parent: str) -> int:
    """How many sessions have ``parent`` as their parent (GET /sessions, every page)."""
    count, before = 0, None
    while True:
        params: dict[str, Any] = {"limit": 200} | ({"before": before} if before else {})
        page = http.get("/sessions", params=params).json()
        count += sum(1 for s in page["sessions"] if s["session"]["parent_session_id"] == parent)
        if not page["has_more"]:
            return count
        before = page["sessions"][-1]["session"]["id"]


def _figures(ms: list[float]) -> dict[str, float]:
    return {
        "n": len(ms),
        "median_ms": round(statistics.median(ms), 1),
        "max_ms": round(max(ms), 1),
    }


def run(delegates: int, probes: int, no_limits: bool, control: bool = False) -> dict[str, Any]:
    limits: dict[str, Any] = {}
    if no_limits:
        limits = {"max_tool_uses_per_turn": 0, "max_workers_per_turn": 0, "max_delegate_depth": 0}
    with tempfile.TemporaryDirectory(prefix="gateway-storm-") as tmp:
        proc, base = _start(Path(tmp), limits)
        try:
            with httpx.Client(base_url=base, timeout=120) as http:
                others = [
                    http.post("/sessions", json={}).json()["session_id"]
                    for _ in range(probes + SPARE + 1)
                ]
                storm = http.post("/sessions", json={}).json()["session_id"]
                _probe(http, others.pop())  # warm up
                quiet: list[float] = []
                for sid in others[:probes]:
                    quiet.append(_probe(http, sid))
                    time.sleep(0.025)
                time.sleep(0.5)  # the probes' turns end
                rss_before = _rss_mb(proc.pid)
                go: dict[str, Any] = {"tool_use": {"name": "delegate", "input": {"task": "go"}}}
                if control:
                    go = {"text": "go"}
                done = {"text": "done"}  # the last block of the storm turn (_finished)
                rounds = [[go] * delegates + [done]] if control else [[go] * delegates, [done]]
                script = {"script": {"rounds": rounds}}
                started = time.perf_counter()
                r = http.post(f"/sessions/{storm}/turns", json={"content": json.dumps(script)})
                accepted_ms = (time.perf_counter() - started) * 1000
                assert r.status_code == 202, r.text
                during: list[float] = []
                rss_peak = rss_before
                done_at = None
                for sid in others[probes:]:
                    during.append(_probe(http, sid))
                    rss_peak = max(rss_peak, _rss_mb(proc.pid))
                    if _finished(http, storm):
                        done_at = time.perf_counter()
                        break
                    time.sleep(0.025)
                while done_at is None:
                    rss_peak = max(rss_peak, _rss_mb(proc.pid))
                    if _finished(http, storm):
                        done_at = time.perf_counter()
                    else:
                        time.sleep(0.02)
                rss_after = _rss_mb(proc.pid)
                workers = _workers(http, storm)
        finally:
            proc.terminate()
            proc.wait(30)
    return {
        "blocks": delegates,
        "kind": "text (control)" if control else "delegate",
        "limits": "none (0)" if no_limits else "defaults",
        "workers_started": workers,
        "storm_turn_accepted_ms": round(accepted_ms, 1),
        "storm_turn_s": round(done_at - started, 2),
        "post_turns_no_storm": _figures(quiet),
        "post_turns_during_storm": _figures(during),
        "ratio_median": round(statistics.median(during) / statistics.median(quiet), 2),
        "ratio_max": round(max(during) / max(quiet), 2),
        "rss_mb": {"before": rss_before, "peak": rss_peak, "after": rss_after},
        "cpus": os.cpu_count(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.storm", description=__doc__)
    parser.add_argument("--delegates", type=int, default=1000)
    parser.add_argument("--probes", type=int, default=20)
    parser.add_argument("--no-limits", action="store_true", help="[limits] per turn at 0")
    parser.add_argument("--control", action="store_true", help="text blocks, no tool uses")
    args = parser.parse_args(argv)
    print(json.dumps(run(args.delegates, args.probes, args.no_limits, args.control), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

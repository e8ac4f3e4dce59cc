"""``python -m bench --profile sessions-smoke``: the sessions profile end to end, in seconds.

Two real daemons (unloading on, and the peer with it off), 200 sessions each
with one turn, one churn round of 50, attaches timed on a few sessions
(bench/sessions.py). Its figures mean nothing at this size; what this test
pins is the report's shape: every figure of both daemons a finite number,
the ones that cannot be anything but positive positive, the ratios computed,
the replay of a ``since`` attach holding events. Whether sessions unloaded is
reported either way (the unloading itself is the daemon's, issue 23), so it
is only checked to be said.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from bench.sessions_report import FIGURES
from tests.paths import ROOT

# slow: two daemons and 500 sessions
pytestmark = pytest.mark.slow

SIGNED = {  # may be 0 or below once sessions leave memory
    "rss_per_idle_session_bytes",
    "churn_rss_slope_bytes_per_round",
    "churn_rss_slope_bytes_per_session",
}


def _finite(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def test_sessions_smoke_reports_every_figure_of_both_daemons(tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "bench", "--profile", "sessions-smoke", "--sessions", "200",
         "--churn-rounds", "1", "--churn-sessions", "50", "--out", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    [json_path] = tmp_path.glob("*-sessions-smoke.json")
    [md_path] = tmp_path.glob("*-sessions-smoke.md")
    result = json.loads(json_path.read_text())
    summary = result["summary"]

    for name in FIGURES:
        figure = summary[name]
        for kind in ("unload", "peer"):
            assert _finite(figure[kind]), (name, kind, figure)
            if name not in SIGNED:
                assert figure[kind] > 0, (name, kind, figure)
        assert figure["ratio"] is None or _finite(figure["ratio"]), (name, figure)
    # Nothing unloads on the peer: its sessions cost memory.
    assert summary["rss_per_idle_session_bytes"]["peer"] > 0
    assert isinstance(summary["unloading"]["idle"], bool)
    assert [t["name"] for t in summary["targets"]] and all(
        isinstance(t["met"], bool) for t in summary["targets"]
    )

    for kind in ("unload", "peer"):
        daemon = result["daemons"][kind]
        assert daemon["rss_0"] > 0
        assert daemon["idle"]["created"] == 200
        if kind == "peer":  # (on the other, sessions may leave memory while others are made)
            assert daemon["idle"]["live_loaded"] >= 200  # the gauge saw them loaded
        [churn_round] = daemon["churn"]["rounds"]
        assert churn_round["created"] == 50 and churn_round["rss_after"] > 0
        attach = daemon["attach"]
        assert attach["snapshot"]["total_ms"]["n"] == attach["since"]["total_ms"]["n"] > 0
        assert attach["since"]["events"]["p50"] > 0  # the replay is the session's history
        assert attach["snapshot"]["events"]["p99"] == 0  # a snapshot replays nothing
    assert (
        "unload" in result["daemons"] and result["daemons"]["peer"]["idle"].get("unloaded") is None
    )  # the peer does not wait for unloading

    text = md_path.read_text()
    assert "| figure | unloading on | unloading off (peer) | on / off |" in text
    assert "RSS per idle session, 200 sessions (bytes)" in text

"""The bench harness's smoke profile, end to end, so that the harness cannot rot.

``python -m bench --profile smoke`` runs every phase of the default profile,
shrunk to seconds: a real gateway process and the three peer servers, client
worker processes, slow clients, replays, idle connections and time to first
token. Its figures mean nothing (the machine is shared and the windows are
tiny); what this test pins is that the run completes, that the result has
every figure and every ratio as a number, and that the slow-client rule fired
(docs/protocol.md §3: a client that stops reading is closed with 1008).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.profiles import PEERS
from bench.report import FIGURES
from tests.paths import ROOT

# slow: the bench's smoke profile
pytestmark = pytest.mark.slow

ROOT = ROOT

# A smoke run may sustain no step at all (tiny windows on a shared machine), so the
# maximum sustained rate may be null; every other figure and ratio must be a number.
RATIOS = [f for f in FIGURES if f != "max_sustained_events_per_s"]


def test_smoke_profile_produces_every_figure(tmp_path: Path) -> None:
    missing = [m for m in ("websockets", "psutil", "matplotlib") if not importlib.util.find_spec(m)]
    assert not missing, f"the bench needs {missing}: pip install -e '.[test,bench]'"
    run = subprocess.run(
        [sys.executable, "-m", "bench", "--profile", "smoke", "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    (result_file,) = tmp_path.glob("*-smoke.json")
    result = json.loads(result_file.read_text())

    assert set(result["servers"]) == {"gateway", *PEERS}
    for name, figures in result["figures"].items():
        assert set(figures) == set(FIGURES), name
    for figure in RATIOS:
        assert isinstance(result["figures"]["gateway"][figure], int | float), figure
    for peer in PEERS:
        for figure in RATIOS:
            assert isinstance(result["ratios"][peer][figure], int | float), (peer, figure)

    slow = result["slow_clients"]
    assert slow["stalled"] == 1
    assert slow["stalled_close_codes"] == {"1008": 1}
    assert slow["stalled_got_1008"] is True
    assert isinstance(slow["others_p99_ratio"], int | float)

    replay = result["replay"]
    assert replay["one_client"]["received"] == replay["one_client"]["events"] == 500
    storm = replay["storm"]
    assert storm["received"] == storm["events"] == 20 * 100
    assert storm["complete_clients"] == 20
    assert isinstance(result["storm_to_live"], int | float)

    assert isinstance(result["ttft"]["added_ms"], int | float)
    assert len(result["targets"]) == 12
    assert (tmp_path / f"{result_file.stem}.md").read_text().startswith("| figure |")
    assert (tmp_path / f"{result_file.stem}-latency.png").stat().st_size > 0
    assert (tmp_path / f"{result_file.stem}-throughput.png").stat().st_size > 0

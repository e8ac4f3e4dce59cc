"""``python -m bench --profile checkpoint-smoke``: the checkpoint's cost, on and off, in seconds.

Two real daemons per round (``[store] checkpoint_ms`` at its default and 0),
one window each (bench/checkpoint.py). Its figures mean nothing at this
size; what this test pins is the report's shape: both settings measured, a
CPU per event each, the ratio computed and printed.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

from tests.paths import ROOT


def test_checkpoint_smoke_reports_both_settings_and_their_ratio(tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "bench", "--profile", "checkpoint-smoke", "--repetitions", "1",
         "--out", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    [json_path] = tmp_path.glob("*-checkpoint-smoke.json")
    result = json.loads(json_path.read_text())
    assert (result["on"], result["off"]) == ("checkpoint_ms = default", "checkpoint_ms = 0")
    for name in (result["on"], result["off"]):
        [window] = result["windows"][name]
        assert window["events_per_s"] > 0, window
        cpu = result["summary"][name]["cpu_us_per_event"]
        assert isinstance(cpu, float) and math.isfinite(cpu) and cpu > 0, result["summary"]
    assert result["summary"]["ratio"] > 0
    assert "checkpoint on / off: **" in run.stdout


def test_checkpoint_smoke_with_a_peer_reports_the_gateway_over_it(tmp_path: Path) -> None:
    """``--peers``: the peer measured in the same rounds, each gateway setting over it."""
    run = subprocess.run(
        [sys.executable, "-m", "bench", "--profile", "checkpoint-smoke", "--repetitions", "1",
         "--peers", "ws_queue", "--out", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    [json_path] = tmp_path.glob("*-checkpoint-smoke.json")
    result = json.loads(json_path.read_text())
    assert result["peers"] == ["ws_queue"] and result["frames"]["events_per_turn"] > 0
    [window] = result["windows"]["ws_queue"]
    assert window["events_per_s"] > 0, window
    over = result["summary"]["to_peers"]
    assert set(over) == {"checkpoint_ms = default / ws_queue", "checkpoint_ms = 0 / ws_queue"}
    for figures in over.values():
        assert figures["ratio"] > 0 and figures["lowest"] == figures["highest"] == figures["ratio"]
    assert "checkpoint_ms = default / ws_queue" in run.stdout

"""``python -m bench --profile doors-smoke``: the doors profile end to end, in seconds.

One real daemon, one round: a session with two clients on each door (the
WebSocket, the native SSE, the AI SDK's SSE, AG-UI), one short turn each
(bench/doors.py). Its figures mean nothing at this size; what this test pins
is the report's shape: every figure of every door a finite number, the costs
positive, the ratios to the WebSocket computed (the WebSocket's own is 1),
every client given every text delta of the script, and the table saying what
an event is on each door. Never how big a figure is. Kept in the quick loop
(not ``slow``): one daemon, about ten seconds.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

from bench.doors import DOORS, PEER
from bench.doors_report import COSTS, EVENT, FIGURES, LABELS
from bench.profiles import DOORS_SMOKE
from tests.paths import ROOT


def _finite(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def test_doors_smoke_reports_every_figure_of_every_door(tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "bench", "--profile", "doors-smoke", "--out", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=90,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    [json_path] = tmp_path.glob("*-doors-smoke.json")
    [md_path] = tmp_path.glob("*-doors-smoke.md")
    result = json.loads(json_path.read_text())
    summary = result["summary"]

    clients = DOORS_SMOKE.sessions * DOORS_SMOKE.clients_per_session
    assert len(result["rounds"]) == DOORS_SMOKE.repetitions
    for measured in result["rounds"]:
        assert sorted(measured["order"]) == sorted(DOORS)
        for door in DOORS:
            window = measured["doors"][door]
            assert window["clients"] == clients
            # Every client got every word of the script as a text delta.
            assert window["text_deltas"] == window["deltas_expected"] == DOORS_SMOKE.words * clients
            assert window["events"] >= window["text_deltas"]
            assert window["bytes"] > window["events"]
            assert window["unfinished_clients"] == 0

    for door in DOORS:
        for name in FIGURES:
            assert _finite(summary["doors"][door][name]), (door, name, summary["doors"][door])
        for name in COSTS:
            assert summary["doors"][door][name] > 0, (door, name)
            ratio = summary["ratios"][door][name]
            assert _finite(ratio["median"]) and ratio["median"] > 0, (door, name, ratio)
            assert ratio["min"] <= ratio["median"] <= ratio["max"]
            if door == PEER:
                assert ratio["median"] == 1.0
    assert set(summary["flags"]) == {"noisy", "client_limited", "incomplete"}

    text = md_path.read_text()
    header = ["figure", *(LABELS[d] for d in DOORS),
              *(f"{LABELS[d]} / {LABELS[PEER]}" for d in DOORS if d != PEER)]  # fmt: skip
    assert "| " + " | ".join(header) + " |" in text
    for label in ("gateway CPU per delivered event (µs)",
                  "gateway CPU per text delta delivered (µs)",
                  "gateway CPU per KiB delivered (µs)"):  # fmt: skip
        assert f"| {label} |" in text
    for door in DOORS:
        assert f"- {LABELS[door]}: {EVENT[door]}." in text
    assert "python -m bench --profile doors-smoke" in text

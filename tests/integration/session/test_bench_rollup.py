"""``python -m bench --profile rollup-smoke``: the rollup profile end to end, in seconds.

One real daemon, one round: a session with three WebSocket clients per window
(``coalesce_ms`` 0 and 40), one short turn each (bench/rollup.py). Its figures
mean nothing at this size; what this test pins is the report's shape: every
figure of every window a finite number, the ratios to rollup off computed (off's
own is 1), every client at the turn's end with the same text, and the rolled-up
window never sending more frames than off. Never how big a saving is.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from bench import cli, rollup
from bench.profiles import ROLLUP_SMOKE, RollupProfile
from bench.rollup import FIGURES, RATIOS
from tests.paths import ROOT


def _finite(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def test_rollup_smoke_reports_every_figure_of_every_window(tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "bench", "--profile", "rollup-smoke", "--out", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=90,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    [json_path] = tmp_path.glob("*-rollup-smoke.json")
    [md_path] = tmp_path.glob("*-rollup-smoke.md")
    result = json.loads(json_path.read_text())
    summary = result["summary"]
    clients = ROLLUP_SMOKE.clients
    windows = [str(w) for w in ROLLUP_SMOKE.windows]
    assert len(result["rounds"]) == ROLLUP_SMOKE.repetitions
    for measured in result["rounds"]:
        for w in windows:
            window = measured["windows"][w]
            assert window["clients"] == clients
            assert window["unfinished_clients"] == 0
            assert window["tokens"] == ROLLUP_SMOKE.words * clients
            assert len(window["sample_texts"]) == 1
        off, on = measured["windows"]["0"], measured["windows"]["40"]
        assert off["text_delta_frames"] == ROLLUP_SMOKE.words * clients  # a frame a word
        assert on["frames"] <= off["frames"]
    assert summary["same_text"] is True
    for w in windows:
        for name in FIGURES:
            assert _finite(summary["windows"][w][name]), (w, name)
        for name in RATIOS:
            ratio = summary["ratios"][w][name]
            assert _finite(ratio["median"]) and ratio["min"] <= ratio["median"] <= ratio["max"]
    assert all(summary["ratios"]["0"][name]["median"] == 1.0 for name in RATIOS)
    text = md_path.read_text()
    assert "| figure | coalesce_ms 0 | coalesce_ms 40 | 40 / 0 |" in text
    assert "| gateway CPU per delivered token (µs) |" in text
    assert "python -m bench --profile rollup-smoke" in text


def test_rollup_rate_sets_the_models_delay_and_refuses_nonsense(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``--rate R``: the turn's ``delay_ms`` is 1000/R; 0 or above 1000 is refused."""
    seen: list[float] = []

    def fake_main(profile: RollupProfile, out: Path, command: str) -> int:
        seen.append(profile.delay_ms)
        return 0

    monkeypatch.setattr(rollup, "main", fake_main)
    assert cli.main(["--profile", "rollup-smoke", "--rate", "100"]) == 0
    assert seen == [10.0]
    for bad in ("0", "1001"):
        with pytest.raises(SystemExit) as exc:
            cli.main(["--profile", "rollup-smoke", "--rate", bad])
        assert exc.value.code == 2

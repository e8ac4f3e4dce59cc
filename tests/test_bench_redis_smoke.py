"""The bench's comparison of the store backends, end to end: ``--backend both``.

``python -m bench --profile smoke --backend both`` runs the fan-out of one
gateway on SQLite and then of one on Redis (a redis-server the bench starts
itself), then a turn of tool rounds on each, and reports each one's CPU per
delivered event (the gateway's and redis-server's apart and summed) at the
same loads and latency at the same half load, with the ratios Redis / SQLite
and the issue's targets. The figures of a smoke run
mean nothing (tiny windows, a shared machine); this pins that the run
completes in seconds and that every figure, ratio and target is there.

redis-server comes from tests/redis_support.py (installed from Debian's
archive when missing); the test skips, saying why, only where it cannot be.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench import cli
from bench.report import BACKEND_FIGURES
from tests.redis_support import ensure_redis_server

ROOT = Path(__file__).resolve().parents[1]

# A smoke run may sustain no step at all; every other figure must be a number.
NUMBERS = [f for f in BACKEND_FIGURES if f != "max_sustained_events_per_s"]
# SQLite has no redis-server: its store CPU is 0 (in the gateway), so these have no
# ratio; nor has the CPU of processes outside the bench, 0 on a quiet machine.
NO_RATIO = {"max_sustained_events_per_s", "redis_cpu_us_per_event",
            "redis_cpu_us_per_event_half_load", "redis_cores_half_load",
            "redis_cpu_us_per_event_catalog", "other_cores_half_load"}  # fmt: skip


def test_backend_comparison_produces_every_figure(tmp_path: Path) -> None:
    binary = ensure_redis_server()
    env = {**os.environ, "PATH": f"{Path(binary).parent}:{os.environ.get('PATH', '')}"}
    run = subprocess.run(
        [sys.executable, "-m", "bench", "--profile", "smoke", "--backend", "both",
         "--out", str(tmp_path)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    (result_file,) = tmp_path.glob("*-smoke-redis-compare.json")
    result = json.loads(result_file.read_text())

    assert result["backend"] == "both"
    assert set(result["servers"]) == {"sqlite", "redis"}
    for backend in ("sqlite", "redis"):
        figures = result["figures"][backend]
        assert set(figures) == set(BACKEND_FIGURES), backend
        for figure in NUMBERS:
            assert isinstance(figures[figure], int | float), (backend, figure)
    sqlite, redis = result["figures"]["sqlite"], result["figures"]["redis"]
    assert sqlite["redis_cpu_us_per_event"] == sqlite["redis_cores_half_load"] == 0.0
    assert redis["redis_cpu_us_per_event"] > 0 and redis["redis_cpu_us_per_event_catalog"] > 0
    for load in ("", "_half_load", "_catalog"):
        total = redis[f"gateway_cpu_us_per_event{load}"] + redis[f"redis_cpu_us_per_event{load}"]
        assert abs(redis[f"cpu_us_per_event{load}"] - total) < 0.02, load
    # The turn of tool rounds: every event delivered, nearly all of them stored.
    for backend in ("sqlite", "redis"):
        catalog = result["servers"][backend]["catalog"]
        assert catalog["events"] >= catalog["stored_events"] >= 500, (backend, catalog)
    # Both at the same loads: the half load is SQLite's.
    steps = {b: result["servers"][b]["fanout"] for b in ("sqlite", "redis")}
    assert steps["redis"]["half_load"]["rate"] == steps["sqlite"]["half_load"]["rate"]
    assert steps["redis"]["reference"]["rate"] == steps["sqlite"]["reference"]["rate"]

    ratios = result["ratios"]["redis / sqlite"]
    for figure in set(NUMBERS) - NO_RATIO:
        assert isinstance(ratios[figure], int | float), figure
    targets = {t["goal"]: t for t in result["targets"]}
    assert len(result["targets"]) == 4 and set(targets) == {"<= 1.3", "<= 1.5"}
    assert all(isinstance(t["value"], int | float) and isinstance(t["met"], bool)
               for t in result["targets"])  # fmt: skip

    table = (tmp_path / f"{result_file.stem}.md").read_text()
    assert table.startswith("| figure | SQLite | Redis | Redis / SQLite |")
    assert "gateway + redis-server CPU per delivered event" in table
    assert (tmp_path / f"{result_file.stem}-latency.png").stat().st_size > 0


def test_backend_redis_without_redis_server_is_one_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(shutil, "which", lambda *args, **kwargs: None)
    for backend in ("redis", "both"):
        argv = ["--profile", "smoke", "--backend", backend, "--out", str(tmp_path)]
        assert cli.main(argv) == 1
        err = capsys.readouterr().err
        assert err.startswith("bench: --backend redis needs redis-server"), err
        assert "apt-get install redis-server" in err and err.count("\n") == 1
    assert not list(tmp_path.iterdir())

"""The bench on Redis, end to end: ``--backend both``, ``--backend redis``, ``--nodes 2``.

``python -m bench --profile smoke --backend both`` runs the fan-out of one
gateway on SQLite and then of one on Redis (a redis-server the bench starts
itself), then a turn of tool rounds on each, and reports each one's CPU per
delivered event (the gateway's and redis-server's apart and summed) at the
same loads and latency at the same half load, with the ratios Redis / SQLite
and the issue's targets. The figures of a smoke run
mean nothing (tiny windows, a shared machine); this pins that the run
completes in seconds and that every figure, ratio and target is there.

``--backend redis`` alone runs every phase with the gateway on Redis, shrunk
further (no peers, no time to first token, tiny windows); ``--backend redis
--nodes 2 --shapes split`` runs the multi-node profile (bench/nodes.py): one
node, then two nodes on one redis-server, every session on node 0 and every
client on node 1, so every event reaches its client over the owner's publish
(docs/scale-out.md, "live fan-out between nodes").

redis-server comes from tests/redis_support.py (installed from Debian's
archive when missing); the test skips, saying why, only where it cannot be.
Every ``GATEWAY_*`` variable is left out of the bench's environment: each is
a config key of the gateways it starts.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench import cli
from bench.report import BACKEND_FIGURES
from tests.paths import ROOT
from tests.redis_support import ensure_redis_server

# slow: the bench on Redis
pytestmark = pytest.mark.slow

ROOT = ROOT

# A smoke run may sustain no step at all; every other figure must be a number.
NUMBERS = [f for f in BACKEND_FIGURES if f != "max_sustained_events_per_s"]
# SQLite has no redis-server: its store CPU is 0 (in the gateway), so these have no
# ratio; nor has the CPU of processes outside the bench, 0 on a quiet machine.
NO_RATIO = {"max_sustained_events_per_s", "redis_cpu_us_per_event",
            "redis_cpu_us_per_event_half_load", "redis_cores_half_load",
            "redis_cpu_us_per_event_catalog", "other_cores_half_load"}  # fmt: skip


def _bench(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``python -m bench --profile smoke ARGS`` with a redis-server on the PATH."""
    binary = ensure_redis_server()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    env["PATH"] = f"{Path(binary).parent}:{env.get('PATH', '')}"
    run = subprocess.run(
        [sys.executable, "-m", "bench", "--profile", "smoke", *args, "--out", str(tmp_path)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    return run


def test_backend_comparison_and_two_nodes_in_one_run(tmp_path: Path) -> None:
    _bench(tmp_path, "--backend", "both", "--nodes", "2", "--shapes", "split", "--clients", "4")
    (result_file,) = tmp_path.glob("*-smoke-redis-compare-nodes2.json")
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
    _check_two_nodes(result, table, one_node=result["servers"]["redis"]["fanout"])


def test_backend_redis_runs_every_phase_on_redis(tmp_path: Path) -> None:
    _bench(tmp_path, "--backend", "redis", "--peers", "none", "--no-ttft",
           "--clients", "4", "--idle", "20", "--window", "0.3")  # fmt: skip
    (result_file,) = tmp_path.glob("*-smoke-redis.json")
    result = json.loads(result_file.read_text())
    assert result["backend"] == "redis" and set(result["servers"]) == {"gateway"}
    gateway = result["figures"]["gateway"]
    for figure in ("cpu_us_per_event", "store_cpu_us_per_event", "p99_ms_half_load"):
        assert isinstance(gateway[figure], int | float), figure
    assert gateway["store_cpu_us_per_event"] > 0  # redis-server measured, beside the gateway
    one = result["replay"]["one_client"]
    assert one["received"] == one["events"] == 500
    assert result["slow_clients"]["stalled_got_1008"] is True
    assert result["servers"]["gateway"]["idle"]["points"][0]["connections"] == 20
    table = (tmp_path / f"{result_file.stem}.md").read_text()
    assert "redis-server CPU per delivered event" in table


def _check_two_nodes(result: dict[str, Any], table: str, one_node: dict[str, Any]) -> None:
    """The multi-node profile's part of a run: one node (the comparison's), two split."""
    nodes = result["nodes"]
    assert nodes["count"] == 2 and set(nodes["configurations"]) == {"1 node", "2 nodes, split"}
    assert nodes["configurations"]["1 node"]["fanout"] == one_node
    split = nodes["configurations"]["2 nodes, split"]
    assert split["placement"] == {
        "shape": "split", "sessions_owned": [2, 0], "sessions_served": [0, 2]
    }  # fmt: skip
    # Every event went from node 0 to its clients on node 1 through Redis.
    half = split["fanout"]["half_load"]
    assert half["clients_open"] == 4 and half["events_per_s"] >= 0.5 * half["offered_events_per_s"]
    assert half["nodes"]["publishes"] > 0 and half["nodes"]["by_command"]
    figures = nodes["figures"]["2 nodes, split"]["half_load"]
    assert len(figures["node_cores"]) == 2
    for figure in (
        "owner_cpu_us_per_publish",
        "receiver_cpu_us_per_event",
        "redis_cpu_us_per_publish",
        "publish_usec_per_call",
        "events_per_publish",
    ):
        assert isinstance(figures[figure], int | float) and figures[figure] > 0, figure
    # One node: its own clients only (no receiver, no owner-per-publish figure).
    assert "receiver_cpu_us_per_event" not in nodes["figures"]["1 node"]["half_load"]
    model = nodes["model"]
    for figure in (
        "node_events_per_s_per_core",
        "receiver_events_per_s_per_core",
        "redis_batches_per_s_per_core",
        "nodes_per_redis_core",
        "redis_stored_events_per_s_per_core",
    ):
        assert isinstance(model[figure], int | float) and model[figure] > 0, figure
    assert model["bottleneck"].startswith(("the nodes' CPU", "Redis's one thread"))
    assert "| figure | 1 node | 2 nodes, split |" in table and "capacity model" in table


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

"""The soak: one daemon under churn for minutes; file descriptors, tasks and RSS must stay flat.

``python -m bench --profile soak`` (ten minutes; ``--minutes N`` for another
length) or ``--profile soak-smoke`` (20 seconds, what the suite runs). What
runs, what is checked and the thresholds: bench/README.md, "Soak".

Modules: :mod:`~bench.soak.run` (the timeline), :mod:`~bench.soak.clients`
(stayers, churners, slow clients, killers), :mod:`~bench.soak.scripts` (the
turns and what must follow each), :mod:`~bench.soak.audit` (what a client
checks, sans-IO), :mod:`~bench.soak.daemon` (the process and its
``/metrics``), :mod:`~bench.soak.report` (slopes, verdict, tables).
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import trio

from bench.profiles import SoakProfile
from bench.soak.report import verdict, write
from bench.soak.run import run_soak

__all__ = ["main", "run_soak"]


def main(profile: SoakProfile, out: Path, command: str) -> int:
    """Run ``profile``, write ``<out>/<stamp>-<profile>.json`` and ``.md``, print the table.

    Returns:
        0 when every check passed, 1 otherwise.
    """
    t0 = time.monotonic()

    def log(message: str) -> None:
        print(f"[{time.monotonic() - t0:6.1f}s] {message}", file=sys.stderr, flush=True)

    with tempfile.TemporaryDirectory(prefix="soak-") as tmp:
        result = trio.run(run_soak, profile, Path(tmp), log)
    result["command"] = command
    result["elapsed_s"] = round(time.monotonic() - t0, 1)
    checks = verdict(result, profile)
    stem = out / f"{time.strftime('%Y%m%d-%H%M%S')}-{profile.name}"
    json_path, md_path = write(result, checks, stem)
    print(md_path.read_text())
    print(f"wrote {json_path}, {md_path}")
    return 0 if all(c.passed for c in checks) else 1

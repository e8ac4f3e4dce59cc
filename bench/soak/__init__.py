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

from pathlib import Path

import trio

from bench.profiles import SoakProfile
from bench.soak.report import verdict, write
from bench.soak.run import run_soak
from bench.tables import run_profile, stem

__all__ = ["main", "run_soak"]


def main(profile: SoakProfile, out: Path, command: str) -> int:
    """Run ``profile``, write ``<out>/<stamp>-<profile>.json`` and ``.md``, print the table.

    Returns:
        0 when every check passed, 1 otherwise.
    """
    result = run_profile("soak-", command, lambda tmp, log: trio.run(run_soak, profile, tmp, log))
    checks = verdict(result, profile)
    json_path, md_path = write(result, checks, stem(out, profile.name))
    print(md_path.read_text())
    print(f"wrote {json_path}, {md_path}")
    return 0 if all(c.passed for c in checks) else 1

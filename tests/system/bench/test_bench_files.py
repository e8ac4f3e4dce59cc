"""``python -m bench.files`` in small: every path measured, the daemon's memory read."""

from __future__ import annotations

import pytest

from bench.files import PATHS, measure, report

# slow: a gateway process and 5 MiB images
pytestmark = pytest.mark.slow


async def test_one_round_measures_every_path_and_the_daemons_memory() -> None:
    measured = await measure(runs=1, warmup=1)
    assert sorted(measured["seconds"]) == sorted(PATHS)
    assert all(len(v) == 1 and v[0] > 0 for v in measured["seconds"].values())
    assert measured["file_bytes"] > 5 * 1024 * 1024
    memory = measured["memory_kib"]
    assert memory["end"]["VmHWM"] >= memory["start"]["VmRSS"] > 0
    assert "| turn_file |" in report(measured, 1, 1)

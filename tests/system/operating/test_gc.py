"""``gateway serve`` freezes what it built to start (docs/operating.md "Garbage collection").

The daemon as a process: once it serves, ``/metrics`` reports tens of
thousands of frozen objects, and its collections are timed as it works.
"""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest

from tests.system.cli.test_cli_serve import gateway_process

# slow: gateway serve as a process
pytestmark = pytest.mark.slow

FROZEN = re.compile(rb"^gateway_gc_frozen_objects (\S+)$", re.MULTILINE)
YOUNG = re.compile(rb'^gateway_gc_pause_seconds_count\{generation="0"\} (\S+)$', re.MULTILINE)


def figure(pattern: re.Pattern[bytes], body: bytes) -> float:
    match = pattern.search(body)
    assert match, f"{pattern.pattern!r} not in /metrics"
    return float(match.group(1))


async def test_the_daemon_freezes_its_start_up_objects_and_times_its_collections(
    tmp_path: Path,
) -> None:
    async with gateway_process(tmp_path, "--port", "0") as (_, port):
        base = f"http://127.0.0.1:{port}"
        async with httpx.AsyncClient(base_url=base, timeout=10) as http:
            first = (await http.get("/metrics")).content
            assert figure(FROZEN, first) > 50_000
            for _ in range(100):  # some work: allocations, hence young collections
                assert (await http.post("/sessions", json={})).status_code == 201
            later = (await http.get("/metrics")).content
            assert figure(YOUNG, later) > figure(YOUNG, first)

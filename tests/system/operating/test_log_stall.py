"""A reader of the daemon's stderr that stalls does not stall the daemon (docs/operating.md "Logs").

The adversary: ``gateway serve`` under ``[log] format = "json"`` whose stderr
is a pipe nobody reads. The test makes it log (sessions created) until the
pipe's 64 KiB buffer and the log's queue are full and ``/metrics`` counts
dropped lines; meanwhile and after, ``/healthz`` answers and a turn runs
within seconds. Then the pipe is read to the end: every line is whole and
JSON, and the drops were reported by a ``log_lines_dropped`` record.
"""

from __future__ import annotations

import json
import re
import signal
from pathlib import Path

import httpx
import pytest
import trio

from tests.conftest import Client, open_ws
from tests.system.cli.test_cli_serve import gateway_process

# slow: gateway serve as a process
pytestmark = pytest.mark.slow

DROPPED = re.compile(rb"^gateway_log_lines_dropped_total (\S+)$", re.MULTILINE)


async def dropped(http: httpx.AsyncClient) -> float:
    r = await http.get("/metrics")
    assert r.status_code == 200
    match = DROPPED.search(r.content)
    assert match, "no gateway_log_lines_dropped_total in /metrics"
    return float(match.group(1))


async def test_a_stalled_stderr_drops_counted_lines_and_the_daemon_keeps_serving(
    tmp_path: Path,
) -> None:
    config = tmp_path / "gw.toml"
    config.write_text('[log]\nformat = "json"\nqueue_lines = 16\n')
    args = ("--config", str(config), "--port", "0")
    async with gateway_process(tmp_path, *args) as (proc, port):
        assert proc.stderr is not None
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as http:
            # Each session is a session_created line (~200 bytes): some 330 fill
            # the pipe, 16 more the queue. Before the queue, this loop hung.
            with trio.fail_after(60):
                created = 0
                while await dropped(http) == 0:
                    assert created < 5000, "no line was ever dropped"
                    for _ in range(50):
                        r = await http.post("/sessions", json={})
                        assert r.status_code == 201, r.text
                    created += 50
            # Still nobody reads stderr: the daemon answers and runs a turn.
            with trio.fail_after(5):
                assert (await http.get("/healthz")).status_code == 200
                sid = (await http.post("/sessions", json={})).json()["session_id"]
                url = (await http.get(f"/sessions/{sid}")).json()["ws_url"]
                async with open_ws(url) as ws:
                    client = Client(ws, sid)
                    await client.subscribe()
                    r = await http.post(f"/sessions/{sid}/turns", json={"content": "hello"})
                    assert r.status_code == 202, r.text
                    events = await client.until_turn_ends()
                    assert events[-1].type == "turn.completed", [e.type for e in events]
            seen = await dropped(http)
            assert seen > 0

        # Now read the pipe to its end while the daemon shuts down.
        stderr = bytearray()

        async def read_stderr() -> None:
            assert proc.stderr is not None
            while chunk := await proc.stderr.receive_some():
                stderr.extend(chunk)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(read_stderr, name="read stderr")
            proc.send_signal(signal.SIGTERM)
            with trio.fail_after(15):
                assert await proc.wait() == 0

    assert stderr.endswith(b"\n")
    lines = [json.loads(line) for line in stderr.decode().splitlines()]  # whole, JSON
    reports = [x for x in lines if x["event"] == "log_lines_dropped"]
    assert reports, "the drops were never reported"
    assert all(x["dropped"] > 0 and x["level"] == "warning" for x in reports)
    assert sum(x["dropped"] for x in reports) >= seen  # every drop counted was reported
    assert reports[-1]["dropped_total"] == sum(x["dropped"] for x in reports)
    names = [x["event"] for x in lines]
    # The turn's own lines may well be among those dropped: the pipe was full.
    assert names[0] == "gateway_started" and names[-1] == "gateway_stopped", names[-5:]

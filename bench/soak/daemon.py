"""The daemon under soak: a real ``gateway serve`` process, and its ``/metrics`` read from outside.

:class:`Daemon` runs ``python -m gateway serve --config F --port 0``
(docs/reference.md "Command line"), waits for its ``gateway listening on`` line, and
watches it: an exit the soak did not ask for is reported (``on_death``) with
the tail of its log, so a crash is visible as a crash and not as timeouts.

:func:`scrape` reads ``GET /metrics`` (docs/protocol.md §2; the Prometheus
text format, parsed with ``prometheus_client``'s own parser) into the
figures the soak follows: ``process_open_fds``,
``process_resident_memory_bytes``, ``gateway_tasks``, the connection and
session gauges and the failure counters.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import httpx
import trio
from prometheus_client.parser import text_string_to_metric_families

_READY = re.compile(rb"gateway listening on http://(\S+):(\d+)")
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 20.0

# Sample name in the exposition -> the soak's name for it.
FOLLOWED = {
    "process_open_fds": "fds",
    "process_resident_memory_bytes": "rss_bytes",
    "gateway_tasks": "tasks",
    "gateway_ws_connections": "ws_connections",
    "gateway_sessions_live": "sessions_live",
    "gateway_session_failures_total": "session_failures",
    "gateway_slow_client_closes_total": "slow_client_closes",
    "gateway_sessions_unloaded_total": "sessions_unloaded",
}


class Daemon:
    """One ``gateway serve`` process (module docstring).

    Args:
        config: the TOML config file.
        log: where its stderr goes.
        on_death: called once if the process exits before :meth:`stop`.
    """

    def __init__(self, config: Path, log: Path, on_death: Callable[[], None]) -> None:
        self.config = config
        self.log = log
        self.on_death = on_death
        self.host = "127.0.0.1"
        self.port = 0
        self.pid: int | None = None
        self.exit_code: int | None = None
        self.stopping = False
        self._proc: trio.Process | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def alive(self) -> bool:
        return self._proc is not None and self.exit_code is None

    def exited(self) -> bool:
        """The process has exited (whether or not :meth:`run` has seen it yet)."""
        return self._proc is not None and self._proc.poll() is not None

    async def run(self, *, task_status: trio.TaskStatus[Daemon] = trio.TASK_STATUS_IGNORED) -> None:
        """Start the daemon, report it ready, wait for its exit (killing it if cancelled)."""
        with self.log.open("wb") as err:
            proc = await trio.lowlevel.open_process(
                [sys.executable, "-m", "gateway", "serve", "--config", str(self.config),
                 "--port", "0"],
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
                cwd=self.config.parent,  # its workspaces beside its config, in the run's dir
            )  # fmt: skip
        self._proc = proc
        try:
            assert proc.stdout is not None
            await self._ready(proc.stdout)
            self.pid = proc.pid
            task_status.started(self)
            self.exit_code = await proc.wait()
            if not self.stopping:
                self.on_death()
        finally:
            if proc.returncode is None:
                with trio.CancelScope(shield=True):
                    proc.kill()
                    await proc.wait()
            self.exit_code = proc.returncode
            if proc.stdout is not None:
                await proc.stdout.aclose()

    async def _ready(self, stdout: trio.abc.ReceiveStream) -> None:
        line = b""
        with trio.move_on_after(START_TIMEOUT_S):
            while b"\n" not in line:
                chunk = await stdout.receive_some(4096)
                if not chunk:
                    break
                line += chunk
        match = _READY.search(line)
        if match is None:
            raise RuntimeError(f"the gateway did not start: {line!r}\n{self.log_tail()}")
        self.host, self.port = match.group(1).decode(), int(match.group(2))

    async def stop(self) -> int | None:
        """SIGTERM, as an operator would (graceful shutdown); SIGKILL if it hangs."""
        self.stopping = True
        proc = self._proc
        if proc is None or proc.returncode is not None:
            return self.exit_code if proc is None else proc.returncode
        proc.terminate()
        with trio.move_on_after(STOP_TIMEOUT_S):
            return await proc.wait()
        proc.kill()
        return await proc.wait()

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


async def scrape(http: httpx.AsyncClient) -> dict[str, float]:
    """The followed figures from ``GET /metrics`` (counters summed over their labels)."""
    answer = await http.get("/metrics")
    answer.raise_for_status()
    figures = dict.fromkeys(FOLLOWED.values(), 0.0)
    for family in text_string_to_metric_families(answer.text):
        for sample in family.samples:
            name = FOLLOWED.get(sample.name)
            if name is not None:
                figures[name] += float(sample.value)
    return figures

"""The servers under test, each in a process of its own, and the load each one is given.

:class:`GatewayServer` runs the real command line (``python -m gateway serve
--config F --port 0``, docs/reference.md "Command line") with its store in a temporary
directory, or targets a gateway already running at a URL. Its load is turns
of ``lorem`` scripts (docs/reference.md "The scripted model"), driven by
:class:`bench.driver.GatewayDriver`. :class:`PeerServer` runs one of
:mod:`bench.peers`, whose load is its built-in producer.

Both measure the server process from outside, with the process's own
accounting (``psutil``): CPU seconds (user + system) and resident memory.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import resource
import sys
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, BinaryIO

import psutil  # type: ignore[import-untyped]

from bench.driver import GatewayDriver
from bench.redis_server import RedisProcess, nodes_window
from bench.wire import HttpClient
from bench.worker import Target

_READY = re.compile(rb"(?:gateway listening on http://\S+:|peer listening on )(\d+)")
START_TIMEOUT_S = 30.0


def _raise_fd_limit() -> None:  # runs in the child, before exec
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def _write_config(workdir: Path, text: str) -> Path:
    workdir.mkdir(parents=True, exist_ok=True)
    config = workdir / "gateway.toml"
    config.write_text(text)
    return config


def _open_log(log: Path) -> BinaryIO:
    return log.open("wb")


def _log_tail(log: Path) -> str:
    return log.read_text(errors="replace")[-2000:]


def process_cpu_seconds(pid: int) -> float:
    """CPU seconds process ``pid`` has run, to the nanosecond where Linux says so.

    The sum of ``/proc/PID/task/*/schedstat`` (each thread's on-CPU time, in
    ns): ``psutil``'s user + system time is in 10 ms ticks, too coarse for a
    short window of a cheap server. A thread that exits mid-window takes its
    share with it (the gateway's store threads stay while it is busy).
    Elsewhere, ``psutil``.
    """
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        times = psutil.Process(pid).cpu_times()
        return float(times.user + times.system)
    total = 0
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as file:
                total += int(file.read().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # the thread has just exited
    return total / 1e9


class Server(ABC):
    """A server under test: where it listens, how to load it, how to measure it."""

    name: str
    host = "127.0.0.1"
    port = 0
    pid: int | None = None
    _proc: asyncio.subprocess.Process | None = None

    @abstractmethod
    async def start(self) -> None: ...

    async def stop(self) -> None:
        proc = self._proc
        if proc is None or proc.returncode is not None:
            return
        proc.terminate()
        try:
            await asyncio.wait_for(proc.wait(), 15)
        except TimeoutError:
            proc.kill()
            await proc.wait()

    @abstractmethod
    async def open_sessions(self, count: int) -> list[str]:
        """``count`` sessions (gateway) or channels (peers) to load and subscribe to."""

    @abstractmethod
    async def load(self, sessions: list[str], rate: float) -> None:
        """Stream on every session in ``sessions`` at ``rate`` text deltas per second each."""

    @abstractmethod
    async def unload(self) -> None:
        """Stop streaming."""

    @abstractmethod
    def target(self, session: str, subscribe: bytes, **kw: Any) -> Target:
        """A client connection to ``session``."""

    def cpu_seconds(self) -> float | None:
        """CPU seconds the server has run (:func:`process_cpu_seconds`)."""
        return None if self.pid is None else process_cpu_seconds(self.pid)

    def store_cpu_seconds(self) -> float | None:
        """CPU seconds of the server's store process (redis-server), if it has one."""
        return None

    async def counters(self) -> Any:
        """Counters of its own that a window reads before and after (:meth:`window_figures`)."""
        return None

    def window_figures(self, before: Any, after: Any, wall_s: float) -> dict[str, Any] | None:
        """What :meth:`counters` moved over a window of ``wall_s`` seconds; None: nothing."""
        return None

    def rss_bytes(self) -> int | None:
        return None if self.pid is None else int(psutil.Process(self.pid).memory_info().rss)

    async def _spawn(
        self, *args: str, log: Path, stdin: bool = False, env: dict[str, str] | None = None
    ) -> None:
        with _open_log(log) as err:
            self._proc = await asyncio.create_subprocess_exec(
                sys.executable,
                *args,
                cwd=log.parent,  # the run's own directory: a gateway's workspaces go there
                stdin=asyncio.subprocess.PIPE if stdin else asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=err,
                preexec_fn=_raise_fd_limit,
                env={**os.environ, **(env or {})},
            )
        assert self._proc.stdout is not None
        try:
            line = await asyncio.wait_for(self._proc.stdout.readline(), START_TIMEOUT_S)
        except TimeoutError:
            line = b""
        match = _READY.search(line)
        if match is None:
            await self.stop()
            raise RuntimeError(f"{self.name} did not start: {line!r}\n{_log_tail(log)}")
        self.port = int(match.group(1))
        self.pid = self._proc.pid


class GatewayServer(Server):
    """The gateway: a fresh ``gateway serve`` process, or one already running at ``url``.

    Args:
        workdir: where the config, the store and the log go.
        config_text: the TOML config; ignored with ``url``. Its store path is
            overridden (``GATEWAY_STORE_PATH``) with one in ``workdir``, so an
            operator's own config never touches their real store.
        url: a running gateway (``http://host:port``); CPU and memory are then
            measured only if ``pid`` is given.
        words: ``lorem`` words per turn.
        backend: the store: ``"sqlite"`` (the config's own, its file in
            ``workdir``) or ``"redis"``: a redis-server of its own, started in
            ``workdir`` before the gateway and stopped after it
            (:mod:`bench.redis_server`), named by ``GATEWAY_STORE_BACKEND`` and
            ``GATEWAY_STORE_URL`` over whatever the config says.
        store_url: with ``backend="redis"``, a redis-server someone else runs
            (the nodes of :mod:`bench.nodes` share one) instead of its own;
            ``""``: one to be set after construction, before :meth:`start`.
    """

    name = "gateway"

    def __init__(
        self,
        workdir: Path,
        config_text: str,
        *,
        url: str | None = None,
        pid: int | None = None,
        words: int = 200,
        backend: str = "sqlite",
        store_url: str | None = None,
    ) -> None:
        self.workdir = workdir
        self.backend = backend
        self.store_url = store_url
        own_redis = backend == "redis" and url is None and store_url is None
        self.redis = RedisProcess(workdir / "redis") if own_redis else None
        self.config_text = config_text
        self.url = url
        self.pid = pid
        self.words = words
        self.driver: GatewayDriver | None = None
        self.http: HttpClient | None = None

    async def start(self) -> None:
        if self.url is not None:
            host_port = self.url.split("://", 1)[-1].rstrip("/")
            host, _, port = host_port.rpartition(":")
            self.host, self.port = host, int(port)
        else:
            config = _write_config(self.workdir, self.config_text)
            # The store in workdir, whatever the config says: never an operator's real one.
            env = {"GATEWAY_STORE_PATH": str(self.workdir / "gateway.db"),
                   "GATEWAY_STORE_BACKEND": "sqlite"}  # fmt: skip
            if self.redis is not None:
                await self.redis.start()
                env |= {"GATEWAY_STORE_BACKEND": "redis", "GATEWAY_STORE_URL": self.redis.url}
            elif self.backend == "redis":
                assert self.store_url, "backend redis: its own redis-server or a store_url"
                env |= {"GATEWAY_STORE_BACKEND": "redis", "GATEWAY_STORE_URL": self.store_url}
            try:
                await self._spawn(
                    "-m", "gateway", "serve", "--config", str(config), "--port", "0",
                    log=self.workdir / "gateway.log", env=env,
                )  # fmt: skip
            except BaseException:
                if self.redis is not None:
                    await self.redis.stop()
                raise
        self.http = HttpClient(self.host, self.port)
        self.driver = GatewayDriver(self.http, self.host, self.port, words=self.words)

    async def stop(self) -> None:
        if self.driver is not None:
            await self.driver.close()
        if self.http is not None:
            await self.http.aclose()
        if self.url is None:
            await super().stop()
        if self.redis is not None:
            await self.redis.stop()

    def store_cpu_seconds(self) -> float | None:
        pid = None if self.redis is None else self.redis.pid
        return None if pid is None else process_cpu_seconds(pid)

    async def counters(self) -> dict[str, Any] | None:
        """With a redis-server of its own: as one node of :mod:`bench.nodes` (its publishes)."""
        if self.redis is None or self.redis.pid is None:
            return None
        return {"node_cpu_s": [self.cpu_seconds() or 0.0],
                "commands": await self.redis.command_stats()}  # fmt: skip

    def window_figures(self, before: Any, after: Any, wall_s: float) -> dict[str, Any] | None:
        return None if before is None or after is None else nodes_window(before, after, wall_s)

    async def open_sessions(self, count: int) -> list[str]:
        assert self.http is not None
        created = [await self.http.request("POST", "/sessions", {}) for _ in range(count)]
        return [str(c["session_id"]) for c in created]

    async def load(self, sessions: list[str], rate: float) -> None:
        assert self.driver is not None
        await self.driver.run(sessions, rate)

    async def unload(self) -> None:
        assert self.driver is not None
        await self.driver.stop()

    def target(self, session: str, subscribe: bytes, **kw: Any) -> Target:
        return Target(self.host, self.port, session, subscribe, attach=True, **kw)


class PeerServer(Server):
    """One of :mod:`bench.peers`, playing the recorded turn (``frames``)."""

    def __init__(self, kind: str, frames: Path, workdir: Path) -> None:
        self.name = kind
        self.frames = frames
        self.workdir = workdir

    async def start(self) -> None:
        await self._spawn(
            "-m", "bench.peers", self.name, "--frames", str(self.frames),
            log=self.workdir / f"{self.name}.log", stdin=True,
        )  # fmt: skip

    async def open_sessions(self, count: int) -> list[str]:
        return [f"peer-{i}" for i in range(count)]

    async def load(self, sessions: list[str], rate: float) -> None:
        await self._command({"op": "load", "sessions": len(sessions), "rate": rate})

    async def unload(self) -> None:
        await self._command({"op": "stop"})

    async def _command(self, command: dict[str, Any]) -> None:
        assert self._proc is not None and self._proc.stdin is not None
        self._proc.stdin.write(json.dumps(command).encode() + b"\n")
        await self._proc.stdin.drain()

    def target(self, session: str, subscribe: bytes, **kw: Any) -> Target:
        return Target(self.host, self.port, session, subscribe, attach=False, **kw)

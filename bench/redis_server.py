"""The redis-server a bench run on ``[store] backend = "redis"`` starts for itself.

One ``redis-server`` process per gateway process the bench starts, on a free
loopback port, with everything of its own in the bench's work dir: its
append-only file with the documented setting (docs/operating.md) (``appendonly yes``,
``appendfsync everysec``), no RDB snapshots, no log file. The bench installs
nothing: without a ``redis-server`` on the ``PATH`` (or in ``/usr/bin``,
``/usr/sbin``, ``/usr/local/bin``) the run stops with :class:`RedisMissing`,
which says how to install one.

Its CPU is measured like the server's (:func:`bench.servers.process_cpu_seconds`):
the sum of its threads' on-CPU time, the background threads that fsync the
AOF included.
"""

from __future__ import annotations

import asyncio
import shutil
import socket
from pathlib import Path
from typing import Any

SEARCH_PATH = "/usr/bin:/usr/sbin:/usr/local/bin"
START_TIMEOUT_S = 10.0


class RedisMissing(RuntimeError):
    """No redis-server binary to run (the message says how to get one)."""


def redis_binary() -> str:
    """The redis-server binary.

    Raises:
        RedisMissing: none is installed.
    """
    found = shutil.which("redis-server") or shutil.which("redis-server", path=SEARCH_PATH)
    if found is None:
        raise RedisMissing(
            "--backend redis needs redis-server, and none is installed (the bench installs"
            " nothing): apt-get install redis-server (Debian's 7.0 is enough), or put one"
            " on the PATH"
        )
    return found


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class RedisProcess:
    """One redis-server on 127.0.0.1 with its files in ``workdir`` (module docstring)."""

    def __init__(self, workdir: Path) -> None:
        self.binary = redis_binary()
        self.workdir = workdir
        self.port = 0
        self.pid: int | None = None
        self._proc: asyncio.subprocess.Process | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    async def start(self) -> None:
        """Start it and wait until it answers PING; a port taken meanwhile: another one.

        Raises:
            RuntimeError: it did not start (three ports tried) or did not answer.
        """
        self.workdir.mkdir(parents=True, exist_ok=True)
        error = ""
        for _ in range(3):
            self.port = _free_port()
            error = await self._start_once()
            if not error:
                return
        raise RuntimeError(f"redis-server did not start: {error}")

    async def _start_once(self) -> str:
        command = [
            "--bind", "127.0.0.1",
            "--port", str(self.port),
            "--dir", str(self.workdir),
            "--appendonly", "yes",
            "--appendfsync", "everysec",
            "--save", "",  # no RDB snapshots: the AOF is what persists
            "--logfile", "",
            "--daemonize", "no",
            "--protected-mode", "yes",
        ]  # fmt: skip
        proc = await asyncio.create_subprocess_exec(
            self.binary, *command,
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE, cwd=self.workdir,
        )  # fmt: skip
        self._proc = proc
        deadline = asyncio.get_running_loop().time() + START_TIMEOUT_S
        while asyncio.get_running_loop().time() < deadline:
            if proc.returncode is not None:
                err = await proc.stderr.read() if proc.stderr else b""
                self._proc = None
                return f"it exited ({proc.returncode}): {err.decode(errors='replace')[-500:]}"
            if await self._answers():
                self.pid = proc.pid
                return ""
            await asyncio.sleep(0.02)
        await self.stop()
        return f"no answer on port {self.port} within {START_TIMEOUT_S:g} s"

    async def _answers(self) -> bool:
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        except OSError:
            return False
        try:
            writer.write(b"PING\r\n")
            await writer.drain()
            return (await asyncio.wait_for(reader.read(64), 1.0)).startswith(b"+PONG")
        except (OSError, TimeoutError):
            return False
        finally:
            writer.close()

    async def command_stats(self) -> dict[str, tuple[int, float]]:
        """``INFO commandstats``: each command's calls and microseconds spent in it, so far.

        The microseconds are Redis's own measure of executing the command
        (``usec``), not the I/O around it: redis-server's CPU over a window
        (:func:`bench.servers.process_cpu_seconds`) holds both.
        """
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        try:
            writer.write(b"*2\r\n$4\r\nINFO\r\n$12\r\ncommandstats\r\n")
            await writer.drain()
            head = await reader.readline()  # $<length>
            if not head.startswith(b"$"):
                raise RuntimeError(f"redis-server answered INFO with {head!r}")
            body = await reader.readexactly(int(head[1:]) + 2)
        finally:
            writer.close()
        return parse_command_stats(body.decode())

    async def stop(self) -> None:
        proc, self._proc = self._proc, None
        self.pid = None
        if proc is None or proc.returncode is not None:
            return
        proc.terminate()
        try:
            await asyncio.wait_for(proc.wait(), 15)
        except TimeoutError:
            proc.kill()
            await proc.wait()


def parse_command_stats(text: str) -> dict[str, tuple[int, float]]:
    """``cmdstat_<name>:calls=N,usec=U,...`` lines as ``{name: (calls, usec)}``."""
    stats: dict[str, tuple[int, float]] = {}
    for line in text.splitlines():
        name, _, fields = line.partition(":")
        if not name.startswith("cmdstat_"):
            continue
        values = dict(field.split("=", 1) for field in fields.split(",") if "=" in field)
        stats[name.removeprefix("cmdstat_")] = (int(values["calls"]), float(values["usec"]))
    return stats


PUBLISH_COMMANDS = ("publish", "spublish")


def window_commands(
    before: dict[str, tuple[int, float]], after: dict[str, tuple[int, float]]
) -> dict[str, Any]:
    """What redis-server did between two :meth:`RedisProcess.command_stats`.

    ``publishes``: ``PUBLISH`` + ``SPUBLISH`` calls (a node publishes each
    live batch once, docs/scale-out.md); ``publish_usec``: Redis's own
    microseconds in them; ``redis_calls`` and ``redis_usec``: every command;
    ``by_command``: ``[calls, usec]`` of each command called.
    """

    def moved(name: str) -> tuple[int, float]:
        calls0, usec0 = before.get(name, (0, 0.0))
        calls1, usec1 = after.get(name, (0, 0.0))
        return calls1 - calls0, usec1 - usec0

    publishes = [moved(name) for name in PUBLISH_COMMANDS]
    everything = {name: moved(name) for name in after}
    return {
        "publishes": sum(c for c, _ in publishes),
        "publish_usec": round(sum(u for _, u in publishes), 1),
        "redis_calls": sum(c for c, _ in everything.values()),
        "redis_usec": round(sum(u for _, u in everything.values()), 1),
        "by_command": {name: [c, round(u, 1)] for name, (c, u) in everything.items() if c},
    }


def nodes_window(before: dict[str, Any], after: dict[str, Any], wall_s: float) -> dict[str, Any]:
    """A window of gateway nodes on one redis-server: each node's CPU seconds, Redis's commands.

    ``before`` and ``after``: ``{"node_cpu_s": [...], "commands": command_stats}``.
    """
    return {
        "wall_s": round(wall_s, 3),
        "node_cpu_s": [round(b - a, 4) for a, b in zip(before["node_cpu_s"],
                                                      after["node_cpu_s"], strict=True)],
        **window_commands(before["commands"], after["commands"]),
    }  # fmt: skip

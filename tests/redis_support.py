"""A real redis-server for the tests of the Redis store (docs/scale-out.md).

Debian's ``redis-server`` runs on a free loopback port with everything of its
own in a temporary directory: its append-only file (``appendonly yes``,
``appendfsync everysec``: the setting docs/operating.md documents), no RDB snapshot
file, no log file, no pid file. Nothing of the machine's own Redis (if any) is
touched. The server can be killed (``kill -9``: what a crash leaves) and
started again on the same directory and port, which is how a test checks what
the AOF kept.

``redis-server`` is installed with apt-get if it is missing (quietly; once: the
second run finds it); a test skips, saying why, only where it cannot be.
"""

from __future__ import annotations

import itertools
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import free_port
from tests.debian import debian_binary


def ensure_redis_server() -> str:
    """The redis-server binary, installed from Debian's archive if missing (or the test skips)."""
    return debian_binary("redis-server", "redis-server")


class RedisServer:
    """One redis-server process on 127.0.0.1 with its files in ``workdir``."""

    _prefixes = itertools.count(1)

    def __init__(self, binary: str, workdir: Path) -> None:
        self.binary = binary
        self.workdir = workdir
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self.started = False  # once: later starts are restarts on the same port
        self.last_error = ""

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def new_prefix(self) -> str:
        """A key prefix no other test of this server has used (one Redis, many tests)."""
        return f"t{next(self._prefixes)}:"

    def start(self) -> None:
        """Start it, and wait until it answers; a restart keeps the port and the directory.

        A first start whose port was taken meanwhile (``free_port`` can race)
        tries another port, up to three times.
        """
        for attempt in range(3):
            if self._start_once():
                return
            if attempt < 2:
                self.port = free_port()
        pytest.fail(f"redis-server could not start: {self.last_error}")

    def _start_once(self) -> bool:
        self.workdir.mkdir(parents=True, exist_ok=True)
        command = [
            self.binary,
            "--bind", "127.0.0.1",
            "--port", str(self.port),
            "--dir", str(self.workdir),
            "--appendonly", "yes",
            "--appendfsync", "everysec",
            "--save", "",  # no RDB snapshots: the AOF is what persists
            "--logfile", "",  # stdout, discarded
            "--daemonize", "no",
            "--protected-mode", "yes",
        ]  # fmt: skip
        self.process = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=self.workdir
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                err = self.process.stderr.read().decode() if self.process.stderr else ""
                self.last_error = f"it exited at start ({self.process.returncode}): {err}"
                self._stop(signal.SIGKILL)
                if self.started:  # a restart: the port is the point
                    pytest.fail(f"redis-server could not restart: {self.last_error}")
                return False
            if self._answers():
                self.started = True
                return True
            time.sleep(0.01)
        self.kill()
        pytest.fail("redis-server did not answer within 10 s")

    def _answers(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                s.sendall(b"PING\r\n")
                return s.recv(64).startswith(b"+PONG")
        except OSError:
            return False

    def kill(self) -> None:
        """``kill -9``: what a crash of Redis leaves is what the AOF has."""
        self._stop(signal.SIGKILL)

    def wait_aof_written(self, timeout_s: float = 5.0) -> None:
        """Return once Redis has written to its AOF everything it answered.

        What ``appendfsync everysec`` promises (docs/operating.md "Redis backend"): an
        answered write is in the file at once (a crash of Redis keeps it),
        unless an fsync still running makes Redis postpone its write, for up
        to 2 s. A busy machine makes that fsync slow: a test that kills Redis
        right after an answer waits for the write first (``aof_buffer_length``
        0 in ``INFO persistence``), or it tests more than the setting promises.
        """
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                s.sendall(b"INFO persistence\r\n")
                info = b""
                while b"aof_delayed_fsync" not in info:
                    chunk = s.recv(65536)
                    if not chunk:
                        break
                    info += chunk
            if b"aof_buffer_length:0\r\n" in info:
                return
            time.sleep(0.01)
        pytest.fail(f"redis-server did not write its AOF within {timeout_s:g} s")

    def stop(self) -> None:
        self._stop(signal.SIGTERM)

    def _stop(self, how: signal.Signals) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(how)
            self.process.wait(timeout=10)
        if self.process is not None and self.process.stderr is not None:
            self.process.stderr.close()
        self.process = None


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """One redis-server for the whole run; each test takes its own key prefix."""
    server = RedisServer(ensure_redis_server(), tmp_path_factory.mktemp("redis"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server of this test's own: to kill, restart, or use at the default prefix."""
    server = RedisServer(ensure_redis_server(), tmp_path / "redis")
    server.start()
    yield server
    server.stop()

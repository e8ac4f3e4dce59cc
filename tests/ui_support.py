"""What the browser tests need around them (tests/system/client/test_ui_browser.py,
test_aisdk_browser.py, test_boundary_browser.py): Debian's chromium, Playwright, a daemon.

- :func:`chromium` finds ``/usr/bin/chromium`` or installs Debian's package
  (quietly; nothing to do when it is there), as root or through passwordless
  sudo. Playwright drives that binary: no browser download (``playwright
  install`` is never run). Only where neither can be had does the test skip,
  and it says why.
- :class:`Daemon` is a real ``gateway serve`` on port 0 in its own directory,
  with its own config file, stopped with SIGTERM. The browser tests are
  synchronous (Playwright's sync API blocks), so the gateway runs in its own
  process rather than in the test's Trio loop.
- :func:`launched_chromium` and :func:`serving` hold each for a ``with``: the
  browser closed after it, the daemon stopped, its exit clean (status 0, no
  traceback in its log) or the test fails.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.debian import debian_binary

ROOT = Path(__file__).resolve().parents[1]
READY = re.compile(rb"gateway listening on http://127\.0\.0\.1:(\d+)")
INSTALL_TIMEOUT_S = 900


def chromium() -> str:
    """The path of Debian's chromium, installed with apt-get if missing (or skip, saying why)."""
    return debian_binary("chromium", "chromium", "chromium-browser")


def playwright_sync_api() -> ModuleType:
    """``playwright.sync_api`` (the test extra installs it; pip installs it here if not)."""
    try:
        import playwright.sync_api as api
    except ImportError:
        done = subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "playwright"],
            capture_output=True,
            text=True,
            timeout=INSTALL_TIMEOUT_S,
        )
        if done.returncode != 0:
            pytest.skip(f"playwright could not be installed with pip: {done.stderr[-500:]}")
        import playwright.sync_api as api
    return api


class Daemon:
    """``python -m gateway serve --config CONFIG --port 0`` in ``workdir``; its log in a file."""

    def __init__(self, workdir: Path, config: str) -> None:
        self.workdir = workdir
        self.config = workdir / "gateway.toml"
        self.config.write_text(config)
        self.log = workdir / "gateway.log"
        # The shell's GATEWAY_* variables would override the test's config.
        env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
        # The gateway these tests import (this checkout), not whichever is installed.
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        with self.log.open("wb") as stderr:
            command = ["gateway", "serve", "--config", str(self.config), "--port", "0"]
            self.proc = subprocess.Popen(
                [sys.executable, "-m", *command],
                cwd=workdir,
                env=env,
                stdout=subprocess.PIPE,
                stderr=stderr,
            )
        self.port = self._ready()
        self.base = f"http://127.0.0.1:{self.port}"

    def _ready(self, timeout_s: float = 30.0) -> int:
        """The port from the readiness line (read in a thread: a pipe has no timeout)."""
        assert self.proc.stdout is not None
        stdout = self.proc.stdout
        line: list[bytes] = []
        reader = threading.Thread(target=lambda: line.append(stdout.readline()), daemon=True)
        reader.start()
        reader.join(timeout_s)
        match = READY.match(line[0]) if line else None
        if match is None:
            self.stop()
            raise AssertionError(f"no readiness line: {line!r}; log: {self.log.read_text()}")
        return int(match.group(1))

    def stop(self) -> int:
        """SIGTERM (a graceful shutdown), SIGKILL if it takes too long; the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        return self.proc.returncode

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


@contextmanager
def launched_chromium(expect_timeout_ms: float | None = None) -> Iterator[Any]:
    """Debian's chromium launched by Playwright (its ``expect`` waiting up to the timeout)."""
    executable = chromium()
    api = playwright_sync_api()
    if expect_timeout_ms is not None:
        api.expect.set_options(timeout=expect_timeout_ms)
    with api.sync_playwright() as pw:
        launched = pw.chromium.launch(executable_path=executable)
        try:
            yield launched
        finally:
            launched.close()


@contextmanager
def serving(workdir: Path, config: str) -> Iterator[Daemon]:
    """A :class:`Daemon`, stopped after the ``with``: it must exit 0, no traceback logged."""
    gateway = Daemon(workdir, config)
    try:
        yield gateway
    finally:
        status = gateway.stop()
        log = gateway.log_text()
        assert status == 0, log
        assert "Traceback" not in log, log

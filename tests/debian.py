"""Debian's packages the tests run for real: nginx, redis-server, chromium, node.

One rule for all of them: a binary already on the machine is used; a missing
one is installed with apt-get (quietly; once: the next run finds it; a failed
install refreshes the package lists and tries again); where it cannot be
(no apt-get, neither root nor passwordless sudo, apt-get failing) the calling
test is skipped with the reason.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

SEARCH = "/usr/bin:/usr/sbin:/usr/local/bin:/usr/local/sbin"
INSTALL_TIMEOUT_S = 900


def debian_binary(package: str, *names: str) -> str:
    """The path of the first of ``names`` found, installing ``package`` if none is.

    Skips the calling test, saying why, where it cannot be installed.
    """
    found = _find(names)
    if found:
        return found
    if shutil.which("apt-get") is None:
        pytest.skip(f"{package} is not installed, and there is no apt-get to install it with")
    apt = ["env", "DEBIAN_FRONTEND=noninteractive", "apt-get"]
    if os.geteuid() != 0:
        sudo = shutil.which("sudo")
        if sudo is None or subprocess.run([sudo, "-n", "true"], capture_output=True).returncode:
            pytest.skip(
                f"{package} is not installed, and installing it needs root or passwordless"
                f" sudo (apt-get install {package})"
            )
        apt = [sudo, "-n", *apt]
    install = [*apt, "install", "-y", "-q", "--no-install-recommends", package]

    def run(command: list[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            command, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S, check=False
        )

    result = run(install)
    if result.returncode != 0:  # stale or missing package lists: refresh them once
        run([*apt, "update", "-q"])
        result = run(install)
    found = _find(names)
    if result.returncode != 0 or found is None:
        last = (result.stderr.strip().splitlines() or ["(no output)"])[-1]
        pytest.skip(f"{package} is not installed and apt-get could not install it: {last}")
    return found


def _find(names: tuple[str, ...]) -> str | None:
    for name in names:
        found = shutil.which(name) or shutil.which(name, path=SEARCH)
        if found:
            return found
    return None

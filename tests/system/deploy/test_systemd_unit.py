"""deploy/systemd/gateway.service: graceful stop, restart on failure, hardening (docs/operating.md).

The unit is read as systemd reads it (sections, ``Key=value`` lines, repeats
kept, comments only on lines of their own) and checked against the daemon's
own defaults: the stop timeout must outlast a graceful shutdown
(docs/reference.md "Command line"; gateway.app), so that systemd's SIGKILL
only ever meets a hung gateway. Where ``systemd-analyze`` exists, it verifies
the unit and rates its exposure.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.config import Config
from tests.paths import ROOT

UNIT = ROOT / "deploy" / "systemd" / "gateway.service"

Unit = dict[str, list[tuple[str, str]]]


def parse_unit(text: str) -> Unit:
    """Sections of ``(key, value)`` in order; anything systemd would not read is an error."""
    unit: Unit = {}
    section: list[tuple[str, str]] | None = None
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped[0] in "#;":
            continue
        if header := re.fullmatch(r"\[([A-Za-z]+)\]", stripped):
            section = unit.setdefault(header[1], [])
            continue
        entry = re.fullmatch(r"([A-Za-z][A-Za-z0-9]*)=(.*)", stripped)
        assert entry and section is not None, f"line {number} is not Key=value: {line!r}"
        assert not stripped.endswith("\\"), f"line {number}: no continuation lines, please"
        # systemd has no end-of-line comments: a "#" would be part of the value
        assert "#" not in entry[2], f"line {number}: a comment after a value: {line!r}"
        section.append((entry[1], entry[2].strip()))
    return unit


def values(unit: Unit, section: str, key: str) -> list[str]:
    return [value for k, value in unit.get(section, []) if k == key]


def one(unit: Unit, section: str, key: str) -> str:
    found = values(unit, section, key)
    assert len(found) == 1, f"[{section}] {key}: expected one setting, got {found}"
    return found[0]


def seconds(span: str) -> float:
    """A systemd time span ("30", "30s", "1min 30s", "2m") in seconds."""
    units = {"": 1, "s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "ms": 0.001}
    parts = re.findall(r"(\d+(?:\.\d+)?)\s*([a-z]*)", span)
    assert parts and "".join(f"{n}{u}" for n, u in parts) == span.replace(" ", ""), span
    return sum(float(n) * units[u] for n, u in parts)


@pytest.fixture(scope="module")
def unit() -> Unit:
    return parse_unit(UNIT.read_text())


def test_the_parser_refuses_what_systemd_would_misread() -> None:
    with pytest.raises(AssertionError, match="a comment after a value"):
        parse_unit("[Service]\nRestart=on-failure  # why\n")
    with pytest.raises(AssertionError, match="not Key=value"):
        parse_unit("[Service]\nRestart on-failure\n")
    with pytest.raises(AssertionError, match="not Key=value"):
        parse_unit("Restart=on-failure\n")  # outside any section
    assert seconds("1min 30s") == 90 and seconds("30") == 30


def test_it_runs_gateway_serve_with_the_config_in_etc(unit: Unit) -> None:
    assert one(unit, "Service", "Type") == "simple"  # no sd_notify in the gateway
    command = one(unit, "Service", "ExecStart").split()
    assert Path(command[0]).is_absolute() and Path(command[0]).name == "gateway"
    assert command[1:] == ["serve", "--config", "/etc/gateway/gateway.toml"]
    assert one(unit, "Service", "ConfigurationDirectory") == "gateway"  # /etc/gateway
    assert one(unit, "Install", "WantedBy") == "multi-user.target"


def test_the_store_lives_in_the_writable_state_directory(unit: Unit) -> None:
    """The SQLite store's default path is relative: it lands in the working directory."""
    assert Config().store.path == "gateway.db"
    state = "/var/lib/" + one(unit, "Service", "StateDirectory")
    assert one(unit, "Service", "WorkingDirectory") == state == "/var/lib/gateway"
    assert state in values(unit, "Service", "ReadWritePaths")
    assert one(unit, "Service", "UMask") == "0077"
    dynamic = values(unit, "Service", "DynamicUser") == ["yes"]
    static = bool(values(unit, "Service", "User") and values(unit, "Service", "Group"))
    assert dynamic or static, "the gateway must not run as root"
    assert values(unit, "Service", "User") != ["root"]


def test_stopping_is_graceful_and_outlasts_the_shutdown(unit: Unit) -> None:
    """SIGTERM is the gateway's graceful shutdown; SIGKILL must only meet a hung one.

    gateway.app: turns get ``shutdown_grace_s``, then sockets get
    ``shutdown_grace_s`` (each close frame up to ``close_grace_s``), then
    the store's last flush.
    """
    defaults = Config()
    shutdown = 2 * defaults.server.shutdown_grace_s + defaults.stream.close_grace_s
    assert one(unit, "Service", "KillSignal") == "SIGTERM"
    assert one(unit, "Service", "KillMode") == "mixed"  # the gateway stops its own tools
    assert seconds(one(unit, "Service", "TimeoutStopSec")) > shutdown


def test_it_restarts_on_failure_but_not_on_a_bad_config(unit: Unit) -> None:
    assert one(unit, "Service", "Restart") == "on-failure"
    assert seconds(one(unit, "Service", "RestartSec")) >= 1
    # docs/reference.md "Command line": a bad config exits 2; restarting cannot fix it
    assert one(unit, "Service", "RestartPreventExitStatus") == "2"


def test_the_hardening_options_are_set(unit: Unit) -> None:
    for key in (
        "NoNewPrivileges",
        "PrivateTmp",
        "ProtectHome",
        "PrivateDevices",
        "ProtectKernelTunables",
        "ProtectKernelModules",
        "ProtectKernelLogs",
        "ProtectControlGroups",
        "ProtectClock",
        "ProtectHostname",
        "RestrictNamespaces",
        "RestrictRealtime",
        "RestrictSUIDSGID",
        "LockPersonality",
        "MemoryDenyWriteExecute",
    ):
        assert one(unit, "Service", key) == "yes", key
    assert one(unit, "Service", "ProtectSystem") == "strict"
    families = one(unit, "Service", "RestrictAddressFamilies").split()
    assert sorted(families) == ["AF_INET", "AF_INET6", "AF_UNIX"]
    assert one(unit, "Service", "CapabilityBoundingSet") == ""
    assert "@system-service" in values(unit, "Service", "SystemCallFilter")
    # /metrics reads /proc/stat (the process start time): ProcSubset=pid would hide it
    assert values(unit, "Service", "ProcSubset") == []


def runnable_copy(tmp_path: Path) -> Path:
    """The unit with ExecStart's binary replaced by this checkout's, which exists here."""
    text = UNIT.read_text()
    text, n = re.subn(r"^ExecStart=\S+", f"ExecStart={sys.executable} -m gateway", text, flags=re.M)
    assert n == 1
    copy = tmp_path / "gateway.service"
    copy.write_text(text)
    return copy


def systemd_analyze() -> str:
    found = shutil.which("systemd-analyze")
    if found is None:
        pytest.skip("systemd-analyze is not installed here (Debian: package systemd)")
    return found


def test_systemd_analyze_verify_accepts_it(tmp_path: Path) -> None:
    """No error, and no warning about the unit (an unknown key is only a warning)."""
    copy = runnable_copy(tmp_path)
    result = subprocess.run(
        [systemd_analyze(), "verify", "--man=no", str(copy)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    about_it = [line for line in result.stderr.splitlines() if "gateway.service" in line]
    assert (result.returncode, about_it) == (0, []), result.stderr


def test_systemd_analyze_security_rates_it_ok(tmp_path: Path) -> None:
    copy = runnable_copy(tmp_path)
    result = subprocess.run(
        [systemd_analyze(), "security", "--offline=true", "--no-pager", copy.name],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    rated = re.search(r"Overall exposure level for gateway\.service: ([\d.]+)", result.stdout)
    if rated is None and "--offline" in result.stderr:
        pytest.skip("this systemd-analyze cannot rate a unit file offline (systemd < 252)")
    assert rated, result.stdout + result.stderr
    assert float(rated[1]) <= 2.0, result.stdout  # 1.2 when written

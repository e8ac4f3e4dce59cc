"""The command line's outside (docs/reference.md "Command line"), run as a real process.

A bad config must give exit status 2, one line on stderr naming the key, and
nothing on stdout (the readiness line never appears: nothing started). A
successful ``serve`` needs the server and is tested with it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

from gateway.cli import main


def run_gateway(
    *args: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    return subprocess.run(
        [sys.executable, "-m", "gateway", *args],
        cwd=cwd,
        env={**clean, **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.slow  # gateway as a process
def test_bad_config_file_exits_2_with_one_line(tmp_path: Path) -> None:
    (tmp_path / "bad.toml").write_text('[stream]\nqueue_max_events = "lots"\n')
    result = run_gateway("serve", "--config", "bad.toml", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr == (
        'config error: bad.toml: stream.queue_max_events: expected an integer >= 1, got "lots"\n'
    )


@pytest.mark.slow  # gateway as a process
def test_unknown_key_exits_2(tmp_path: Path) -> None:
    (tmp_path / "bad.toml").write_text("[server]\nhots = 1\n")
    result = run_gateway("serve", "--config", "bad.toml", cwd=tmp_path)
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == "config error: bad.toml: unknown key server.hots\n"


@pytest.mark.slow  # gateway as a process
def test_missing_config_file_exits_2(tmp_path: Path) -> None:
    result = run_gateway("serve", "--config", "nope.toml", cwd=tmp_path)
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == "config error: no such config file: nope.toml\n"


@pytest.mark.slow  # gateway as a process
def test_bad_environment_exits_2(tmp_path: Path) -> None:
    result = run_gateway("serve", cwd=tmp_path, env={"GATEWAY_SERVER_PORT": "http"})
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == (
        "config error: environment GATEWAY_SERVER_PORT: expected an integer in 0..65535,"
        ' got "http"\n'
    )


@pytest.mark.slow  # gateway as a process
def test_bad_port_flag_exits_2(tmp_path: Path) -> None:
    result = run_gateway("serve", "--port", "70000", cwd=tmp_path)
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == (
        "config error: command line: server.port: expected an integer in 0..65535, got 70000\n"
    )


def test_version(tmp_path: Path) -> None:
    result = run_gateway("--version", cwd=tmp_path)
    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout == f"gateway {version('gateway')}\n"


def test_main_returns_the_exit_status(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    for name in [k for k in os.environ if k.startswith("GATEWAY_")]:
        monkeypatch.delenv(name)
    (tmp_path / "bad.toml").write_text("[servr]\n")
    assert main(["serve", "--config", "bad.toml"]) == 2
    assert capsys.readouterr().err == "config error: bad.toml: unknown section [servr]\n"
    assert main(["--version"]) == 0
    assert main([]) == 2  # no command: an argparse usage error


@pytest.mark.slow  # gateway as a process
def test_a_gateway_tool_in_a_claude_code_agent_exits_2(tmp_path: Path) -> None:
    """issue 32: a name Claude Code does not know is no longer dropped in silence."""
    (tmp_path / "bad.toml").write_text('[agents.cc]\nruntime = "claude-code"\ntools = ["sleep"]\n')
    result = run_gateway("serve", "--config", "bad.toml", cwd=tmp_path)
    assert (result.returncode, result.stdout) == (2, "")
    [line] = result.stderr.splitlines()
    assert line.startswith(
        'config error: bad.toml: agents.cc.tools[0]: "sleep" is a tool of the native runtime,'
        " not of claude-code; Claude Code's tools are "
    ), line

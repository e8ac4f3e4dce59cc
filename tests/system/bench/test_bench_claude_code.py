"""``python -m bench.claude_code``'s ``main`` runs end to end (its figures mean nothing
here), and skips cleanly without the claude-code extra."""

from __future__ import annotations

import importlib.util
import re
import warnings
from typing import Any

import pytest

from bench import claude_code

# slow: the bench, with Claude Code CLIs
pytestmark = pytest.mark.slow


@pytest.mark.slow  # the bench itself, CLIs and daemons
@pytest.mark.skipif(
    importlib.util.find_spec("claude_agent_sdk") is None,
    reason="needs the claude-code extra: pip install 'gateway[claude-code]'",
)
@pytest.mark.filterwarnings("default")  # any warning is reported, and fails the test below
def test_the_bench_reports_both_figures(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``main`` in this process: the command line's code, without a second interpreter
    importing the SDKs again (the tests' process has them already)."""
    # The SDK's own transport (the bench's ``sdk`` path) would first run ``claude -v``,
    # another CLI start, before the warm turns it measures.
    monkeypatch.setenv("CLAUDE_AGENT_SDK_SKIP_VERSION_CHECK", "1")
    args = ["--runs", "2", "--warmup", "0", "--cold", "0", "--sessions", "1"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert claude_code.main(args) == 0
    out = capsys.readouterr().out
    for path in ("warm sdk", "warm gateway"):
        assert re.search(rf"^{path} +[\d.]+ +[\d.]+ +[\d.]+$", out, re.M), out
    assert "warm gateway adds" in out and "cold" not in out.split("Memory")[0].split("starts)")[1]
    row = re.search(r"^ +1 +([\d.]+) +([\d.]+) +(-?[\d.]+) +([\d.]+)$", out, re.M)
    assert row is not None, out
    cli_rss, cli_uss, _daemon, state_kib = (float(g) for g in row.groups())
    assert 20 < cli_rss < 2000 and 0 < cli_uss <= cli_rss, out  # a CLI's tree, per session
    assert state_kib > 1, out  # the transcript of its turn, at least
    assert not [str(w.message) for w in caught if not ignorable(w)]


def ignorable(w: warnings.WarningMessage) -> bool:
    """What Python's default filters hide from ``python -m bench.claude_code``'s stderr."""
    hidden = (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning)
    return issubclass(w.category, hidden)


def test_without_the_extra_it_says_so_and_exits_0(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real = importlib.util.find_spec

    def find_spec(name: str, *args: Any) -> Any:
        return None if name == "claude_agent_sdk" else real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    assert claude_code.main(["--runs", "1"]) == 0
    assert "needs the claude-code extra" in capsys.readouterr().err

"""A Claude Code turn's ``[limits]``, counted in the ``PreToolUse`` hook (sans-IO).

:class:`~gateway.runtimes.claude_code.limits.TurnLimits` as the hook asks it:
the tool uses past ``max_tool_uses_per_turn`` (each sub-agent counted apart),
a sub-agent past ``max_workers_per_turn`` or at ``max_delegate_depth``,
refused before they run with the native loop's messages; 0 is no limit.
"""

from __future__ import annotations

import pytest

from gateway.runtimes.claude_code.limits import TurnLimits


def test_tool_uses_past_the_limit_are_refused_and_each_sub_agent_counts_apart() -> None:
    limits = TurnLimits(max_tool_uses=2, max_workers=8, max_depth=2, depth=0)
    assert limits.admit("t1", "Bash") is None
    assert limits.admit("t2", "Read") is None
    assert limits.admit("t3", "Bash") == (
        "not run: this turn asked for more than its max_tool_uses_per_turn (2) tool uses"
    )
    assert limits.admit("s1", "Bash", agent_id="sub-a") is None  # a worker's own count
    assert limits.admit("s2", "Bash", agent_id="sub-a") is None
    assert limits.admit("s3", "Bash", agent_id="sub-a") is not None
    assert set(limits.refused) == {"t3", "s3"}


def test_a_sub_agent_past_max_workers_per_turn_is_refused_before_it_runs() -> None:
    limits = TurnLimits(max_tool_uses=0, max_workers=1, max_depth=2, depth=0)
    assert limits.admit("a1", "Agent") is None
    assert limits.admit("a2", "Task") == (
        "delegate refused: this turn started its max_workers_per_turn (1) workers"
    )
    assert limits.admit("b1", "Bash") is None  # other tools: no worker
    assert limits.workers == 1 and list(limits.refused) == ["a2"]


@pytest.mark.parametrize(("depth", "agent_id", "refused"), [
    (0, None, False), (1, None, True), (0, "sub", True),
])  # fmt: skip
def test_a_sub_agent_at_max_delegate_depth_is_refused(
    depth: int, agent_id: str | None, refused: bool
) -> None:
    limits = TurnLimits(max_tool_uses=0, max_workers=0, max_depth=1, depth=depth)
    refusal = limits.admit("a1", "Agent", agent_id)
    assert (refusal is not None) == refused
    if refused:
        assert refusal == (
            "delegate refused: this session is a worker 1 deep, the max_delegate_depth is 1"
        )


def test_zero_is_no_limit() -> None:
    limits = TurnLimits(max_tool_uses=0, max_workers=0, max_depth=0, depth=5)
    assert all(limits.admit(f"t{i}", "Agent") is None for i in range(100))

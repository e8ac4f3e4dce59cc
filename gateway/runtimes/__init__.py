"""Runtimes other than the gateway's own agent loop (docs/protocol.md §11).

The agent loop asks :func:`factory` which runtime runs an agent's turns and
names none itself: a runtime sees the loop only as a
:class:`~gateway.session.loop_api.RuntimeHost`, so neither imports the other.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gateway.agents import AgentProfile
    from gateway.session.loop_api import RuntimeFactory


def factory(agent: AgentProfile) -> RuntimeFactory | None:
    """What makes the runtime of ``agent``'s loop; ``None``: the gateway's own loop runs it."""
    if agent.runtime != "claude-code":
        return None
    from gateway.runtimes.claude_code import ClaudeCode  # the extra: imported when used

    return ClaudeCode

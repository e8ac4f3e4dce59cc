"""The ``[limits]`` of a Claude Code turn's tool uses (sans-IO; docs/protocol.md §15).

Claude Code runs its own tools, so the gateway counts them where it sees
every one before it runs: the ``PreToolUse`` hook
(:mod:`gateway.runtimes.claude_code.hooks`), which calls :meth:`TurnLimits.admit`.
A refused tool use is denied with the refusal as its reason: it never runs,
and its result fails ``limit`` (``tool.failed``), as the native loop's
(:mod:`gateway.session.tool_round`, :func:`gateway.session.tool_host.spawn_worker`):

- ``max_tool_uses_per_turn``: the tool uses past it, the main thread's and
  each sub-agent's counted apart (a sub-agent is a worker, whose turn has
  its own count);
- ``max_workers_per_turn``: a sub-agent (the ``Agent``/``Task`` tool) past
  it is refused before it starts, so no refused sub-agent runs;
- ``max_delegate_depth``: so is a sub-agent of a session at that depth.

0 is no limit, as for the native loop.
"""

from __future__ import annotations

from gateway.protocol.claude_code_tools import is_sub_agent


class TurnLimits:
    """One turn's counts against the limits (module docstring).

    Args:
        max_tool_uses: ``max_tool_uses_per_turn``.
        max_workers: ``max_workers_per_turn``.
        max_depth: ``max_delegate_depth``.
        depth: the session's depth (0 for a root session).
    """

    def __init__(self, max_tool_uses: int, max_workers: int, max_depth: int, depth: int) -> None:
        self.max_tool_uses = max_tool_uses
        self.max_workers = max_workers
        self.max_depth = max_depth
        self.depth = depth
        self.tool_uses: dict[str | None, int] = {}  # by sub-agent id (None: the main thread)
        self.workers = 0  # sub-agents admitted
        self.refused: dict[str, str] = {}  # by tool use id: why

    def admit(self, tool_use_id: str, tool_name: str, agent_id: str | None = None) -> str | None:
        """Count a tool use about to run: None if it may, else why it may not (``limit``)."""
        used = self.tool_uses.get(agent_id, 0) + 1
        self.tool_uses[agent_id] = used
        refusal = None
        if self.max_tool_uses and used > self.max_tool_uses:
            refusal = (
                "not run: this turn asked for more than its max_tool_uses_per_turn"
                f" ({self.max_tool_uses}) tool uses"
            )
        elif is_sub_agent(tool_name):
            depth = self.depth + (agent_id is not None)  # the session that would delegate
            if self.max_depth and depth >= self.max_depth:
                refusal = (
                    f"delegate refused: this session is a worker {depth} deep, the"
                    f" max_delegate_depth is {self.max_depth}"
                )
            elif self.max_workers and self.workers >= self.max_workers:
                refusal = (
                    "delegate refused: this turn started its max_workers_per_turn"
                    f" ({self.max_workers}) workers"
                )
            else:
                self.workers += 1
        if refusal is not None:
            self.refused[tool_use_id] = refusal
        return refusal

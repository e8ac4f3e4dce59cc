"""Claude Code's ``PreToolUse`` hook: every tool use, before it runs (docs/protocol.md §11, §15).

Tools approved without asking never reach ``can_use_tool``; the hook sees
them all. It asks each check in turn and denies with the first refusal (the
model reads it as the tool's result); the runtime's checks are the turn's
steers, handed to the CLI there (:mod:`~gateway.runtimes.claude_code.steering`:
it refuses nothing), and the turn's limits
(:class:`~gateway.runtimes.claude_code.limits.TurnLimits`), then, for
a sub-agent they admit, the key's (its worker session made here, or refused:
:meth:`SubAgents.make_worker <gateway.runtimes.claude_code.subagents.SubAgents.make_worker>`).
A check is an async function of the hook's input and the tool use id
returning a refusal or None, so others join the same hook.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from claude_agent_sdk.types import HookCallback, HookContext, HookInput, HookJSONOutput

Check = Callable[[dict[str, Any], str], Awaitable[str | None]]
"""One check of a tool use: the hook's input and the tool use id; a refusal, or None."""


def deny(reason: str) -> HookJSONOutput:
    """The hook's answer that denies the tool use, ``reason`` being its result."""
    return {
        "hookSpecificOutput": {
            "hookEventName": "PreToolUse",
            "permissionDecision": "deny",
            "permissionDecisionReason": reason,
        }
    }


def pre_tool_use(checks: Sequence[Check]) -> HookCallback:
    """The ``PreToolUse`` hook running ``checks``: the first refusal denies."""

    async def hook(
        input: HookInput, tool_use_id: str | None, context: HookContext
    ) -> HookJSONOutput:
        data: dict[str, Any] = dict(input)
        use_id = tool_use_id or str(data.get("tool_use_id") or "")
        for check in checks:
            refusal = await check(data, use_id)
            if refusal is not None:
                return deny(refusal)
        return {}

    return hook

"""Claude Code's tool names: the one list the config, ``GET /agents`` and the runtime read.

docs/protocol.md §11, "Tools and approvals". A ``claude-code`` agent's
``tools`` and ``require_approval`` name these (or ``mcp__<server>__<tool>``,
a glob, or a rule of one of these such as ``Bash(git:*)``, as Claude Code's
own settings do); a name of neither list is a config error, and so is a
built-in gateway tool's (``sleep``, ``read_file``...), which Claude Code does
not know. This module imports nothing (not the SDK): :mod:`gateway.config`
checks names with it, with or without the ``claude-code`` extra.

From the CLI bundled with ``claude-agent-sdk`` 0.2.189: **Claude Code
2.1.332**. :data:`DEFAULT_TOOLS` is the ``tools`` of its ``init`` message
with no ``--tools``; :data:`TOOLS` adds those it offers when named (the
``init`` of ``--tools`` with every candidate) and the names its bundle
defines for tools it offers only in some modes (plan mode, an interactive
session, Windows). A new CLI version is checked by running the same probe
again (docs/reference.md, "Agents").
"""

from __future__ import annotations

from typing import Any

CLI_VERSION = "2.1.332"
"""The Claude Code version these lists are of (``claude_agent_sdk/_bundled/claude.version``)."""

DEFAULT_TOOLS: tuple[str, ...] = (
    "Task", "Bash", "CronCreate", "CronDelete", "CronList", "Edit", "EnterWorktree",
    "ExitWorktree", "ListAgents", "Monitor", "NotebookEdit", "Read", "ReportFindings",
    "ScheduleWakeup", "SendMessage", "Skill", "TaskCreate", "TaskGet", "TaskList", "TaskStop",
    "TaskUpdate", "ToolSearch", "WebFetch", "WebSearch", "Workflow", "Write",
)  # fmt: skip
"""Claude Code's own default set: what an agent without ``tools`` gets, in the CLI's order."""

SUB_AGENT_TOOLS: tuple[str, ...] = ("Agent", "Task")
"""The tool that runs a sub-agent: ``Agent``, and ``Task``, the name Claude Code also lists."""

TOOLS: frozenset[str] = frozenset(
    (
        *DEFAULT_TOOLS,
        *SUB_AGENT_TOOLS,
        "Glob", "Grep",  # offered when named
        # defined by the CLI, offered in some modes only
        "AskUserQuestion", "EnterPlanMode", "ExitPlanMode", "TodoWrite", "LSP",
        "ListMcpResourcesTool", "ReadMcpResourceTool", "PowerShell",
    )
)  # fmt: skip
"""Every name a ``claude-code`` agent's ``tools`` may give (besides MCP names and globs)."""


def rule_tool(pattern: str) -> str:
    """The tool a pattern names: ``Bash`` for the rule ``Bash(git:*)``, else the pattern."""
    name, paren, _ = pattern.partition("(")
    return name if paren and pattern.endswith(")") else pattern


def is_sub_agent(tool_name: str) -> bool:
    """Whether a tool use runs a sub-agent (``max_workers_per_turn``, ``max_delegate_depth``)."""
    return tool_name in SUB_AGENT_TOOLS


NEVER_ASK: tuple[str, ...] = ("Read", "Glob", "Grep")
"""Tools Claude Code approves itself, reading within the workspace (``default``, ``plan``)."""

EDITS: tuple[str, ...] = ("Edit", "Write", "NotebookEdit")
"""Tools ``acceptEdits`` approves too."""


def listing(
    patterns: tuple[str, ...], default_set: bool, permission_mode: str, needs_approval: Any
) -> list[tuple[str, bool]]:
    """An agent's Claude Code tools as ``GET /agents`` lists them: names, and which ask.

    docs/protocol.md §6 (``ToolInfo``, ``source: "claude-code"``). The plain
    names of ``tools`` (a rule's tool once; globs and MCP names are listed by
    the servers' own tools), each asking when ``require_approval`` matches
    it. Claude Code's default set (an agent without ``tools``) asks as its
    ``permission_mode`` says: nothing under ``bypassPermissions``, else every
    tool but :data:`NEVER_ASK` (and :data:`EDITS` under ``acceptEdits``).
    """
    names = dict.fromkeys(
        rule_tool(p) for p in patterns if "__" not in p and not any(c in p for c in "*?[")
    )
    if not default_set:
        return [(name, bool(needs_approval(name))) for name in names]
    quiet = {"bypassPermissions": TOOLS}.get(permission_mode, frozenset(NEVER_ASK))
    if permission_mode == "acceptEdits":
        quiet = frozenset((*NEVER_ASK, *EDITS))
    return [(name, name not in quiet) for name in names]

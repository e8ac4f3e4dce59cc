"""A ``claude-code`` agent's keys (docs/protocol.md §11, docs/reference.md "Agents").

Its ``tools`` and ``require_approval`` name Claude Code's tools (the one list,
:mod:`gateway.protocol.claude_code_tools`), rules of them, MCP names and
globs; a built-in gateway tool there is an error naming its runtime, and so is
a Claude Code tool in a native agent. Keys the CLI cannot honour are errors.
Each error is one line, the whole message asserted. No SDK needed.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.agents import resolve_agents
from gateway.config import load_config
from gateway.errors import ConfigError
from gateway.protocol import claude_code_tools as cc

CC_TOOLS = ", ".join(sorted(cc.TOOLS))


def load(tmp_path: Path, text: str) -> str | None:
    """The config error's line, or None when the config loads."""
    path = tmp_path / "gateway.toml"
    path.write_text(text, encoding="utf-8")
    try:
        load_config(str(path), {}, {})
    except ConfigError as exc:
        assert "\n" not in str(exc)
        return str(exc).removeprefix(f"config error: {path}: ")
    return None


def agent(tools: str = "", runtime: str = "claude-code", more: str = "") -> str:
    keys = f"tools = {tools}\n" if tools else ""
    return f'[agents.a]\nruntime = "{runtime}"\n{keys}{more}'


@pytest.mark.parametrize(
    "tools",
    [
        '["Bash", "Read", "Edit", "Write", "Glob", "Grep", "Agent", "Task", "TodoWrite"]',
        '["Bash(git:*)", "Read(./src/**)", "WebFetch(domain:example.com)"]',
        '["mcp__tickets__*", "mcp__tickets__close", "Web*"]',
    ],
)
def test_claude_codes_tools_rules_mcp_names_and_globs_pass(tmp_path: Path, tools: str) -> None:
    server = '[mcp_servers.tickets]\nurl = "http://h/mcp"\n'
    assert load(tmp_path, server + agent(tools)) is None


def test_an_unknown_claude_code_tool_is_one_line(tmp_path: Path) -> None:
    assert load(tmp_path, agent('["Bash", "bash"]')) == (
        f'agents.a.tools[1]: unknown Claude Code tool "bash"; Claude Code {cc.CLI_VERSION}\'s'
        f" tools are {CC_TOOLS}"
    )
    assert load(tmp_path, agent(more='require_approval = ["Bsh(rm:*)"]\ntools = ["Bash"]\n'))


def test_a_gateway_tool_in_a_claude_code_agent_names_its_runtime(tmp_path: Path) -> None:
    assert load(tmp_path, agent('["read_file"]')) == (
        'agents.a.tools[0]: "read_file" is a tool of the native runtime, not of claude-code;'
        f" Claude Code's tools are {CC_TOOLS}"
    )


def test_a_claude_code_tool_in_a_native_agent_names_its_runtime(tmp_path: Path) -> None:
    assert load(tmp_path, agent('["sleep", "Bash"]', runtime="native")) == (
        'agents.a.tools[1]: "Bash" is Claude Code\'s (runtime claude-code), not a tool of the'
        " native runtime; tools are sleep, read_file, shell, delegate and mcp__<server>__<tool>"
    )
    assert load(tmp_path, '[tools]\nrequire_approval = ["Bash(git:*)"]\n') == (
        'tools.require_approval[0]: "Bash(git:*)" is Claude Code\'s (runtime claude-code), not a'
        " tool of the native runtime; tools are sleep, read_file, shell, delegate and"
        " mcp__<server>__<tool>"
    )


@pytest.mark.parametrize(
    ("text", "line"),
    [
        (agent(more="temperature = 0.5\n"),
         "agents.a.temperature: Claude Code takes no temperature (runtime claude-code);"
         " leave it out"),
        ('[model]\ntemperature = 0\n[agents.default]\nruntime = "claude-code"\n',
         "model.temperature: Claude Code takes no temperature (runtime claude-code);"
         " leave it out"),
        (agent(more="context_max_tokens = 50000\n"),
         "agents.a.context_max_tokens: Claude Code's auto-compact window is at least 100000"
         " tokens (runtime claude-code), got 50000"),
        ("[model]\ncontext_max_tokens = 60000\n" + agent(),
         "model.context_max_tokens: Claude Code's auto-compact window is at least 100000"
         " tokens (runtime claude-code), got 60000"),
        (agent(more='require_approval = ["Bash"]\n'),
         "agents.a.require_approval: needs tools on a claude-code agent (without tools, Claude"
         " Code's default tools ask as its permission_mode says)"),
    ],
)  # fmt: skip
def test_keys_claude_code_cannot_honour_are_errors(tmp_path: Path, text: str, line: str) -> None:
    assert load(tmp_path, text) == line


def test_a_claude_code_agent_without_tools_gets_claude_codes_defaults(tmp_path: Path) -> None:
    """Not the default agent's built-in names, nor its [tools] require_approval or
    [model] temperature: Claude Code's own set, its permission_mode deciding what asks."""
    text = '[model]\ntemperature = 1.0\n[tools]\nrequire_approval = ["sleep"]\n' + agent()
    listed = agent('["Bash"]').replace("[agents.a]", "[agents.b]")
    (tmp_path / "gateway.toml").write_text(text + listed)
    agents = resolve_agents(load_config(str(tmp_path / "gateway.toml"), {}, {}))
    a = agents["a"]
    assert a.tools == cc.DEFAULT_TOOLS and "Bash" in a.tools and a.default_tools
    assert a.require_approval == () and a.temperature is None
    native = agents["default"]
    assert native.tools == ("sleep", "read_file", "delegate") and not native.default_tools
    assert agents["b"].tools == ("Bash",) and not agents["b"].default_tools


def test_the_tool_list_is_read_without_the_sdk() -> None:
    """The config checks names with or without the claude-code extra installed."""
    assert cc.rule_tool("Bash(git:*)") == "Bash" and cc.rule_tool("Bash") == "Bash"
    assert set(cc.DEFAULT_TOOLS) <= cc.TOOLS and set(cc.SUB_AGENT_TOOLS) <= cc.TOOLS

"""``runtime = "claude-code"`` without a CLI: what the runtime gives the CLI, what it makes
of the CLI's messages (docs/protocol.md §11).

Needs the claude-code extra (it imports the SDK's types), none of its processes:
these run with the fast tests. Those that run the CLI are tests/system/test_claude_code*.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("claude_agent_sdk", reason="needs the claude-code extra")

from bench.fake_api import FakeServer
from gateway.agents import resolve_agents
from gateway.runtimes.claude_code import messages, options
from tests.claude_code_support import cc_config
from tests.mcp_support import EVERYTHING
from tests.system.test_claude_code_more import MCP_TABLES


def test_the_cli_gets_the_mcp_servers_the_agent_reaches_and_may_use_their_tools(
    tmp_path: Path,
) -> None:
    """``[mcp_servers.*]`` as the CLI's options: only those the agent's ``tools`` reach."""
    server = FakeServer()
    config = cc_config(tmp_path, server, MCP_TABLES, tools='["Bash", "mcp__everything__*"]')
    agent = resolve_agents(config)["default"]
    servers = options.mcp_servers(agent, config.mcp_servers, "/daemon/cwd")
    assert list(servers) == ["everything"]
    stdio = servers["everything"]
    assert stdio["type"] == "stdio" and stdio.get("env") == {"MCP_TEST_ENV": "from-config"}
    # It runs in the daemon's directory (the native runtime's), whatever the CLI's cwd is.
    argv = [stdio["command"], *stdio.get("args", [])]
    assert argv[:3] == ["/bin/sh", "-c", 'cd "$0" && exec "$@"']
    assert argv[3:] == ["/daemon/cwd", *EVERYTHING]
    both = resolve_agents(
        cc_config(tmp_path, server, MCP_TABLES, tools='["mcp__*__*"]', require_approval="[]")
    )["default"]
    servers = options.mcp_servers(both, config.mcp_servers, "/daemon/cwd")
    assert servers["elsewhere"] == {
        "type": "http",
        "url": "http://127.0.0.1:9/mcp",
        "headers": {"authorization": "Bearer t"},
    }
    assert options.cli_rule("mcp__everything__*") == "mcp__everything"
    assert options.cli_rule("mcp__everything__echo") == "mcp__everything__echo"
    assert (
        options.cli_rule("mcp__*__echo") == "mcp__*__echo"
    )  # decided by can_use_tool against the agent's


def test_an_automatic_compact_boundary_is_an_auto_compaction() -> None:
    """Claude Code compacting on its own (``trigger: "auto"``), as its manual one is mapped."""
    from claude_agent_sdk import SystemMessage

    boundary = {"compact_metadata": {"trigger": "auto", "pre_tokens": 180_000}}
    compacting, compacted = messages.compaction(SystemMessage("compact_boundary", boundary))
    assert (compacting.trigger, compacting.pre_tokens) == ("auto", 180_000)
    assert (compacted.trigger, compacted.method, compacted.pre_tokens) == (
        "auto",
        "summary",
        180_000,
    )
    assert (compacted.post_tokens, compacted.summary_message_id) == (0, None)

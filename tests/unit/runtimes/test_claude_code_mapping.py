"""``runtime = "claude-code"`` without a CLI: what the runtime gives the CLI, what it makes
of the CLI's messages (docs/protocol.md §11).

Needs the claude-code extra (it imports the SDK's types), none of its processes:
these run with the fast tests. Those that run the CLI are in tests/system/claude_code/.
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
from tests.system.claude_code.test_claude_code_more import MCP_TABLES


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


# --- what the gateway does not know, structured results, the options (issue 32) ---------


def test_an_unknown_stream_event_delta_or_block_is_skipped_and_counted_never_a_failure() -> None:
    known = messages.KnownEvents()
    start = {"type": "message_start", "message": {"id": "msg_1", "model": "m", "usage": {}}}
    stream = [
        start,
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 0,
         "delta": {"type": "citations_delta", "citation": {}}},  # unknown delta: alone
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "a"}},
        {"type": "content_block_stop", "index": 0},
        {"type": "content_block_start", "index": 1,
         "content_block": {"type": "server_tool_use", "id": "s", "name": "web", "input": {}}},
        {"type": "content_block_delta", "index": 1,
         "delta": {"type": "input_json_delta", "partial_json": "{}"}},  # its block's: skipped
        {"type": "content_block_stop", "index": 1},
        {"type": "brand_new_event"},
        {"type": "message_stop"},
    ]  # fmt: skip
    read = [known.read(data) for data in stream]
    kept = [type(r).__name__ for r in read if r is not None]
    assert kept == [
        "RawMessageStart", "RawContentBlockStart", "RawContentBlockDelta",
        "RawContentBlockStop", "RawMessageStop",
    ]  # fmt: skip
    assert known.take() == 3 and known.take() == 0  # the delta, the block, the event
    assert known.read(start) is not None  # a new message: index 1 is known again
    block = {"type": "content_block_stop", "index": 1}
    assert known.read(block) is not None


def test_an_unknown_block_of_a_whole_message_is_skipped_and_counted() -> None:
    from claude_agent_sdk import AssistantMessage, TextBlock

    whole = messages.WholeMessages()
    message = AssistantMessage([TextBlock("hi"), object()], "m", message_id="msg_2")  # type: ignore[list-item]
    events = list(whole.message(message, set()))
    assert [e["type"] for e in events][:2] == ["message_start", "content_block_start"]
    assert whole.skipped == 1


def test_the_structured_result_of_a_tool_result_is_kept() -> None:
    from claude_agent_sdk import TextBlock, ToolResultBlock, UserMessage

    patch = {"filePath": "/w/a.txt", "structuredPatch": [{"oldStart": 1, "lines": ["-a", "+b"]}]}
    one = UserMessage([ToolResultBlock("t1", "edited")], tool_use_result=patch)
    assert messages.structured_result(one) == patch
    two = UserMessage(
        [ToolResultBlock("t1", "x"), ToolResultBlock("t2", "y")], tool_use_result=patch
    )
    assert messages.structured_result(two) is None  # whose? not kept
    assert messages.structured_result(UserMessage([TextBlock("hi")])) is None
    assert messages.structured_result(UserMessage("text", tool_use_result=patch)) is None


def test_the_agents_keys_reach_the_cli(tmp_path: Path) -> None:
    """No ``tools``: Claude Code's preset, nothing approved by the gateway; ``max_rounds``,
    ``max_tokens``, ``context_max_tokens`` as the CLI's; a rule's tool in its ``tools``."""
    server = FakeServer()
    config = cc_config(
        tmp_path, server, tools="", require_approval="", max_rounds="7", max_tokens="8000",
        context_max_tokens="120000",
    )  # fmt: skip
    agent = resolve_agents(config)["default"]
    cli = options.cli_options(agent, "ses_1", "/w", {}, None)  # type: ignore[arg-type]
    assert cli.tools == {"type": "preset", "preset": "claude_code"} and cli.allowed_tools == []
    assert cli.max_turns == 7 and cli.hooks is None
    env = options.cli_environment(agent, "/home", "/tmp/x", "gwcc-test", "http://127.0.0.1:1")
    assert env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] == "8000"
    assert env["CLAUDE_CODE_AUTO_COMPACT_WINDOW"] == "120000"
    ruled = resolve_agents(cc_config(tmp_path, server, tools='["Bash(git:*)", "Read"]'))["default"]
    cli = options.cli_options(ruled, "ses_1", "/w", {}, None)  # type: ignore[arg-type]
    assert cli.tools == ["Bash", "Read"] and cli.allowed_tools == ["Bash(git:*)", "Read"]


SUMMARY_MESSAGE = (
    "This session is being continued from a previous conversation that ran out of context."
    " The summary below covers the earlier portion of the conversation.\n\n<system-reminder>\n"
    "<tools-used-before-summary></tools-used-before-summary>\n</system-reminder>\nSummary:\n"
    "The user said words; the code word was MANGO.\n\nIf you need specific details from before"
    " compaction (like exact code snippets, error messages, or content you generated), read the"
    " full transcript at: /srv/ws/.claude-code/sess_1/.claude/projects/-w/0d1c.jsonl\nContinue"
    " the conversation from where it left off without asking the user any further questions."
)


def test_the_summary_is_taken_out_of_claude_codes_framing_without_the_host_path() -> None:
    """The user message Claude Code 2.1.332 sends after ``compact_boundary`` (as captured):
    the summary alone is kept; a text without the framing loses only the transcript's line."""
    assert messages.compact_summary(SUMMARY_MESSAGE) == (
        "The user said words; the code word was MANGO."
    )
    bare = "A summary.\nread the full transcript at: /srv/x.jsonl\nMore."
    assert messages.compact_summary(bare) == "A summary.\nMore."

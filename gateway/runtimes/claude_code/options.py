"""What a session's Claude Code CLI is started with: the SDK's options, its environment, its state.

docs/protocol.md §11, "Options":

- ``cwd`` is the session's workspace; the agent's ``system`` is appended to
  Claude Code's own prompt; the model is the part after ``anthropic:``; a
  thinking budget turns thinking on, and none (0) off (by itself Claude Code
  would think, adaptively); ``permission_mode`` is passed as is
  (``bypassPermissions`` is the operator's choice only).
- ``tools`` lists the tools Claude Code may use (their plain names become its
  ``tools``), those not matched by ``require_approval`` its ``allowed_tools``
  (approved without asking; ``mcp__<server>__*`` as Claude Code's
  ``mcp__<server>``: :func:`cli_rule`); the others ask ``can_use_tool``
  (:mod:`gateway.runtimes.claude_code.permissions`). A rule in
  ``require_approval`` (``Bash(rm:*)``) is Claude Code's ``ask`` rule
  (:func:`ask_rules`): the uses it matches ask though their tool is allowed. An agent without
  ``tools`` gets Claude Code's default set and no ``allowed_tools``: its
  ``permission_mode`` decides what asks.
- ``max_rounds`` is its ``max_turns``; ``max_tokens`` its
  ``CLAUDE_CODE_MAX_OUTPUT_TOKENS``; ``context_max_tokens`` its
  ``CLAUDE_CODE_AUTO_COMPACT_WINDOW`` (:func:`cli_environment`).
- The ``PreToolUse`` hook sees every tool use, those approved without asking
  too: the turn's limits (:mod:`gateway.runtimes.claude_code.hooks`).
- The ``[mcp_servers.*]`` the agent's ``tools`` reach are its ``mcp_servers``
  (:func:`mcp_servers`).
- ``[model] max_retries`` is its ``CLAUDE_CODE_MAX_RETRIES`` (Claude Code also
  sends a refused call, a 400, twice more with fewer beta headers, on its own).

**The boundary** (docs/protocol.md §11, "The key", "The boundary"): the CLI
gets a credential of its session and the gateway's loopback door
(:mod:`gateway.providers.model_proxy`), never the provider key; ``hooks`` and
``sandbox`` keep its tools in the workspace
(:mod:`gateway.runtimes.claude_code.boundary`).

**The state directory** and the CLI's temporary directory: where they are,
and who may have them, is :mod:`gateway.runtimes.claude_code.paths`.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Mapping
from typing import Any

from claude_agent_sdk import CanUseToolShadowedWarning, ClaudeAgentOptions
from claude_agent_sdk._version import __version__ as SDK_VERSION
from claude_agent_sdk.types import (
    CanUseTool,
    HookEvent,
    HookMatcher,
    McpHttpServerConfig,
    McpStdioServerConfig,
    SandboxSettings,
    SystemPromptPreset,
)
from claude_agent_sdk.types import McpServerConfig as McpServerConfigSdk

from gateway.agents import AgentProfile
from gateway.config import McpServerConfig
from gateway.protocol.claude_code_tools import rule_tool
from gateway.runtimes.claude_code.paths import claude_session_id

# ``allowed_tools`` are the tools approved without asking (not in ``require_approval``):
# that they never reach ``can_use_tool`` is the point, not a mistake to warn of.
warnings.filterwarnings("ignore", category=CanUseToolShadowedWarning)

QUIET_ENV = {
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "DISABLE_TELEMETRY": "1",
    "DISABLE_AUTOUPDATER": "1",
    "DISABLE_ERROR_REPORTING": "1",
}
"""What keeps the CLI from calling anything but the model API."""

LOOPBACK = "127.0.0.1"
"""The model API door's host (:mod:`gateway.providers.model_proxy`)."""

MODEL_PREFIX = "anthropic:"
"""The provider part of the gateway's model names; Claude Code's are without it."""


def cli_environment(
    agent: AgentProfile,
    home: str,
    tmp: str,
    credential: str,
    base_url: str,
    max_retries: int | None = None,
) -> dict[str, str]:
    """The variables the CLI gets beyond the tool environment (docs/protocol.md §11, §15).

    ``[model] max_retries`` is the CLI's ``CLAUDE_CODE_MAX_RETRIES`` (its own
    retries of a failed API call), unless the agent's ``env`` sets it. So is
    ``MCP_CONNECTION_NONBLOCKING=0``: the CLI's first query waits until its
    MCP servers are connected (within Claude Code's ``MCP_TIMEOUT``), as the
    native runtime's first turn waits for its servers' tools; by default the
    CLI would send it without the tools of a server still starting. The
    agent's ``env`` then; the gateway's own win: the session's credential as
    ``ANTHROPIC_API_KEY`` and the gateway's loopback door as
    ``ANTHROPIC_BASE_URL`` (``base_url``: :mod:`gateway.providers.model_proxy`;
    the provider key never enters the CLI), ``127.0.0.1`` added to
    ``NO_PROXY`` (the door is never reached through a proxy), the state
    directory as ``HOME``, ``tmp`` as ``TMPDIR`` (:func:`tmp_dir`: Claude
    Code's temporary files, its background shells' output included, private
    to the session), and the switches of :data:`QUIET_ENV`.
    The agent's ``max_tokens`` is ``CLAUDE_CODE_MAX_OUTPUT_TOKENS`` (the CLI
    caps it at the model's own limit) and its ``context_max_tokens``
    ``CLAUDE_CODE_AUTO_COMPACT_WINDOW``: Claude Code compacts once a call's
    context nears it (the window less its summary buffer and the output's
    room), as the native runtime at ``context_max_tokens``; both before the
    agent's ``env``, which may set them otherwise.
    ``CLAUDE_CODE_EMIT_SESSION_STATE_EVENTS=1`` asks for the CLI's
    ``session_state_changed`` frames: ``idle`` tells the runtime that no
    further query is owed (:class:`~gateway.runtimes.claude_code.process.CliProcess`).
    ``CLAUDE_CODE_DISABLE_FILE_MENTIONS=1``: Claude Code would read a file a
    prompt mentions (``@/any/path``) and send it to the model, with no tool
    use for the workspace's boundary to check (docs/protocol.md §11, "The
    boundary"); the agent's ``env`` cannot turn them back on.
    """
    out = {"MCP_CONNECTION_NONBLOCKING": "0"}
    if max_retries is not None:
        out["CLAUDE_CODE_MAX_RETRIES"] = str(max_retries)
    out["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] = str(agent.max_tokens)
    out["CLAUDE_CODE_AUTO_COMPACT_WINDOW"] = str(agent.context_max_tokens)
    out.update(agent.env)
    out.update(QUIET_ENV)
    no_proxy = [h for h in (out.get("NO_PROXY") or out.get("no_proxy") or "").split(",") if h]
    if LOOPBACK not in no_proxy:
        no_proxy.append(LOOPBACK)
    out.update(
        {
            "HOME": home,
            "CLAUDE_CONFIG_DIR": os.path.join(home, ".claude"),
            "TMPDIR": tmp,
            "ANTHROPIC_API_KEY": credential,
            "ANTHROPIC_BASE_URL": base_url,
            "NO_PROXY": ",".join(no_proxy),
            "no_proxy": ",".join(no_proxy),
            "CLAUDE_CODE_ENTRYPOINT": "sdk-py",
            "CLAUDE_AGENT_SDK_VERSION": SDK_VERSION,
            "CLAUDE_CODE_SDK_READS_SESSION_STATE": "1",
            "CLAUDE_CODE_EMIT_SESSION_STATE_EVENTS": "1",
            "CLAUDE_CODE_DISABLE_FILE_MENTIONS": "1",
        }
    )
    return out


def mcp_servers(
    agent: AgentProfile, servers: Mapping[str, McpServerConfig], daemon_cwd: str
) -> dict[str, McpServerConfigSdk]:
    """The ``[mcp_servers.*]`` the agent's ``tools`` reach, as the CLI's ``mcp_servers``.

    Claude Code starts and talks to them itself (its tools are then
    ``mcp__<server>__<tool>``, as the native runtime names them). A stdio
    server runs in its ``cwd`` (the daemon's when none is set), as the native
    runtime runs it: Claude Code has no such key, so the command goes through
    ``/bin/sh -c 'cd "$0" && exec "$@"'``. Each CLI runs its own servers
    (``scope`` is always ``session``); ``startup_timeout_s`` and
    ``tool_timeout_s`` are Claude Code's own (``MCP_TIMEOUT``,
    ``MCP_TOOL_TIMEOUT`` in the agent's ``env``).
    """
    out: dict[str, McpServerConfigSdk] = {}
    for name, server in servers.items():
        if not agent.uses_server(name):
            continue
        if server.url:
            out[name] = McpHttpServerConfig(
                type="http", url=server.url, headers=dict(server.headers)
            )
        else:
            cwd = server.cwd or daemon_cwd
            out[name] = McpStdioServerConfig(
                type="stdio",
                command="/bin/sh",
                args=["-c", 'cd "$0" && exec "$@"', cwd, *server.command],
                env=dict(server.env),
            )
    return out


def cli_rule(pattern: str) -> str:
    """A pattern of ``tools`` as a rule of Claude Code's ``allowed_tools``.

    ``mcp__<server>__*`` is Claude Code's ``mcp__<server>`` (every tool of the
    server); another glob is passed as is, and a tool it should match but
    Claude Code does not is decided by ``can_use_tool`` against the agent's
    own patterns (approved unless ``require_approval`` matches it).
    """
    if pattern.startswith("mcp__") and pattern.endswith("__*"):
        server = pattern[5:-3]
        if not any(c in server for c in "*?[") and "__" not in server:
            return f"mcp__{server}"
    return pattern


def ask_rules(agent: AgentProfile) -> list[str]:
    """The rules of ``require_approval`` (``Bash(rm:*)``): Claude Code's ``ask`` rules.

    Claude Code asks ``can_use_tool`` for a use they match even when its tool is
    one of ``allowed_tools`` (its ask rules come before its allow rules), so
    ``tools = ["Bash"]`` with ``require_approval = ["Bash(rm:*)"]`` asks for
    ``rm`` only (docs/protocol.md §11, "Tools and approvals").
    """
    return [p for p in agent.require_approval if rule_tool(p) != p]


def cli_options(
    agent: AgentProfile,
    session_id: str,
    workspace: str,
    servers: Mapping[str, McpServerConfig],
    can_use_tool: CanUseTool,
    resume: bool = False,
    hooks: dict[HookEvent, list[HookMatcher]] | None = None,
    sandbox: SandboxSettings | None = None,
    fork: tuple[str, str] | None = None,
    resume_at: str | None = None,
) -> ClaudeAgentOptions:
    """The SDK's options for a session's CLI (module docstring).

    ``resume``: the Claude Code session of this gateway session has a
    transcript already, which the CLI continues; ``resume_at``: from that
    entry of it (``resume_session_at``: a rewound turn, docs/protocol.md §2
    "Edit and regenerate", :mod:`gateway.runtimes.claude_code.rewind`). ``fork``:
    else, the session is a fork whose first CLI starts from another Claude Code
    session's conversation, ``(its session id, the uuid of the entry kept last)``
    (:mod:`gateway.runtimes.claude_code.forking`): ``resume`` that session
    with ``fork_session`` and ``resume_session_at``, under this session's own
    id. ``hooks``: the ``PreToolUse``
    hooks (the workspace's boundary, :mod:`gateway.runtimes.claude_code.boundary`,
    and the turn's limits, :mod:`gateway.runtimes.claude_code.hooks`);
    ``sandbox``: Bash's sandbox.
    """
    claude_id = claude_session_id(session_id)
    names = [rule_tool(t) for t in agent.tools if "__" not in t]  # Bash(git:*): Bash
    tools: Any = list(dict.fromkeys(t for t in names if not any(c in t for c in "*?[")))
    allowed = [cli_rule(t) for t in agent.tools if not agent.needs_approval(t)]
    if agent.default_tools:  # Claude Code's own set; its permission_mode decides what asks
        tools, allowed = {"type": "preset", "preset": "claude_code"}, []
    prompt = SystemPromptPreset(type="preset", preset="claude_code")
    if agent.system:
        prompt["append"] = agent.system
    budget = agent.thinking_budget_tokens
    thinking: Any = {"type": "enabled", "budget_tokens": budget} if budget else {"type": "disabled"}
    ask = ask_rules(agent)
    return ClaudeAgentOptions(
        include_partial_messages=True,
        cwd=workspace,
        model=agent.model.removeprefix(MODEL_PREFIX),
        system_prompt=prompt,
        tools=tools,
        allowed_tools=allowed,
        permission_mode=agent.permission_mode,  # type: ignore[arg-type]
        can_use_tool=can_use_tool,
        resume=claude_id if resume else fork[0] if fork else None,
        session_id=None if resume else claude_id,
        fork_session=not resume and fork is not None,
        resume_session_at=resume_at if resume else fork[1] if fork else None,
        setting_sources=[],
        settings=json.dumps({"permissions": {"ask": ask}}) if ask else None,
        mcp_servers=mcp_servers(agent, servers, os.getcwd()),
        thinking=thinking,
        max_turns=agent.max_rounds,
        hooks=hooks,
        sandbox=sandbox,
    )

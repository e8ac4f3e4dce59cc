"""What a session's Claude Code CLI is started with: the SDK's options, its environment, its state.

docs/protocol.md §11, "Options":

- ``cwd`` is the session's workspace; the agent's ``system`` is appended to
  Claude Code's own prompt; the model is the part after ``anthropic:``; a
  thinking budget turns thinking on; ``permission_mode`` is passed as is
  (``bypassPermissions`` is the operator's choice only).
- ``tools`` lists the tools Claude Code may use (their plain names become its
  ``tools``), those not matched by ``require_approval`` its ``allowed_tools``
  (approved without asking; ``mcp__<server>__*`` as Claude Code's
  ``mcp__<server>``: :func:`cli_rule`); the others ask ``can_use_tool``
  (:mod:`gateway.runtimes.claude_code.permissions`).
- The ``[mcp_servers.*]`` the agent's ``tools`` reach are its ``mcp_servers``
  (:func:`mcp_servers`).
- ``[model] max_retries`` is its ``CLAUDE_CODE_MAX_RETRIES`` (Claude Code also
  sends a refused call, a 400, twice more with fewer beta headers, on its own).

**The state directory.** The CLI's ``HOME`` and ``CLAUDE_CONFIG_DIR`` are
``.claude-code/<session id>`` beside ``[sessions] workspace_root``
(:func:`state_dir`: its transcripts live there), never the operator's
``~/.claude``. The Claude Code session id is derived from the gateway
session's (:func:`claude_session_id`), so whenever a CLI starts again (after
an idle stop, a crash, a restart of the daemon, on another node sharing the
directory) it resumes the transcript it finds there (``resume``).
"""

from __future__ import annotations

import glob
import os
import uuid
import warnings
from collections.abc import Mapping
from typing import Any

from claude_agent_sdk import CanUseToolShadowedWarning, ClaudeAgentOptions
from claude_agent_sdk._version import __version__ as SDK_VERSION
from claude_agent_sdk.types import (
    CanUseTool,
    McpHttpServerConfig,
    McpStdioServerConfig,
    SystemPromptPreset,
)
from claude_agent_sdk.types import McpServerConfig as McpServerConfigSdk

from gateway.agents import AgentProfile
from gateway.config import McpServerConfig
from gateway.environment import daemon_env

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

MODEL_PREFIX = "anthropic:"
"""The provider part of the gateway's model names; Claude Code's are without it."""

_NAMESPACE = uuid.UUID("5b0c6a8e-3f1d-4a57-9c2e-7d4b1e0f9a63")  # of claude_session_id


def state_dir(workspace_root: str, session_id: str) -> str:
    """The CLI's ``HOME`` and ``CLAUDE_CONFIG_DIR`` of a session (module docstring).

    Under the workspace root (``.claude-code`` is no tenant's name: tenants are
    ``local`` and key ids), so the one directory an operator shares between
    nodes carries both the workspaces and the CLI's transcripts.
    """
    return os.path.join(os.path.abspath(workspace_root), ".claude-code", session_id)


def claude_session_id(session_id: str) -> str:
    """The Claude Code session id of a gateway session: a UUID derived from its id.

    Derived, not stored: every start of the session's CLI (after an idle stop,
    a crash, a restart of the daemon) finds the same transcript by it.
    """
    return str(uuid.uuid5(_NAMESPACE, session_id))


def has_transcript(home: str, claude_id: str) -> bool:
    """Whether the CLI wrote a transcript of ``claude_id`` under ``home`` (blocking)."""
    projects = os.path.join(home, ".claude", "projects")
    return bool(glob.glob(os.path.join(glob.escape(projects), "*", f"{claude_id}.jsonl")))


def cli_environment(
    agent: AgentProfile,
    home: str,
    env: Mapping[str, str] | None = None,
    max_retries: int | None = None,
) -> dict[str, str]:
    """The variables the CLI gets beyond the tool environment (docs/protocol.md §15).

    ``[model] max_retries`` is the CLI's ``CLAUDE_CODE_MAX_RETRIES`` (its own
    retries of a failed API call), unless the agent's ``env`` sets it. So is
    ``MCP_CONNECTION_NONBLOCKING=0``: the CLI's first query waits until its
    MCP servers are connected (within Claude Code's ``MCP_TIMEOUT``), as the
    native runtime's first turn waits for its servers' tools; by default the
    CLI would send it without the tools of a server still starting. The
    agent's ``env`` then; the gateway's own win: the provider key, the
    endpoint, the state directory and the switches of :data:`QUIET_ENV`.
    ``CLAUDE_CODE_EMIT_SESSION_STATE_EVENTS=1`` asks for the CLI's
    ``session_state_changed`` frames: ``idle`` tells the runtime that no
    further query is owed (:class:`~gateway.runtimes.claude_code.process.CliProcess`).
    """
    source = daemon_env() if env is None else env  # its key: taken out of os.environ
    out = {"MCP_CONNECTION_NONBLOCKING": "0"}
    if max_retries is not None:
        out["CLAUDE_CODE_MAX_RETRIES"] = str(max_retries)
    out.update(agent.env)
    out.update(QUIET_ENV)
    out.update(
        {
            "HOME": home,
            "CLAUDE_CONFIG_DIR": os.path.join(home, ".claude"),
            "ANTHROPIC_API_KEY": source.get("ANTHROPIC_API_KEY", ""),
            "CLAUDE_CODE_ENTRYPOINT": "sdk-py",
            "CLAUDE_AGENT_SDK_VERSION": SDK_VERSION,
            "CLAUDE_CODE_SDK_READS_SESSION_STATE": "1",
            "CLAUDE_CODE_EMIT_SESSION_STATE_EVENTS": "1",
        }
    )
    if agent.base_url:
        out["ANTHROPIC_BASE_URL"] = agent.base_url
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


def cli_options(
    agent: AgentProfile,
    session_id: str,
    workspace: str,
    servers: Mapping[str, McpServerConfig],
    can_use_tool: CanUseTool,
    resume: bool = False,
) -> ClaudeAgentOptions:
    """The SDK's options for a session's CLI (module docstring).

    ``resume``: the Claude Code session of this gateway session has a
    transcript already, which the CLI continues.
    """
    claude_id = claude_session_id(session_id)
    plain = [t for t in agent.tools if not any(c in t for c in "*?[") and "__" not in t]
    prompt = SystemPromptPreset(type="preset", preset="claude_code")
    if agent.system:
        prompt["append"] = agent.system
    budget = agent.thinking_budget_tokens
    thinking: Any = {"type": "enabled", "budget_tokens": budget} if budget else None
    return ClaudeAgentOptions(
        include_partial_messages=True,
        cwd=workspace,
        model=agent.model.removeprefix(MODEL_PREFIX),
        system_prompt=prompt,
        tools=plain,
        allowed_tools=[cli_rule(t) for t in agent.tools if not agent.needs_approval(t)],
        permission_mode=agent.permission_mode,  # type: ignore[arg-type]
        can_use_tool=can_use_tool,
        resume=claude_id if resume else None,
        session_id=None if resume else claude_id,
        setting_sources=[],
        mcp_servers=mcp_servers(agent, servers, os.getcwd()),
        thinking=thinking,
    )

"""Agents: what a session runs (docs/protocol.md §11, docs/reference.md "Agents").

An agent is a runtime, a model, a system prompt, a set of tools with the ones
that wait for approval, and limits. ``[model]``, ``[tools]`` and ``[turns]``
describe the agent named ``default``; each ``[agents.NAME]`` table is another,
whose keys left out take those sections' values. :func:`resolve_agents` turns
the config into one :class:`AgentProfile` per name, every key filled in, so
nothing downstream asks "this agent's value or the section's?".

A session picks its agent when it is created (``POST /sessions {"agent"}``)
and keeps it for its life (:class:`gateway.store.base.SessionRecord.agent`);
its workers run the agent's ``delegate_agent``.

The system prompt reaches the model on every call and never a client: it is in
no event, no snapshot and no route's answer (``GET /agents`` lists an agent
without it). ``system_file`` is read at start-up (a missing or unreadable file
is a config error, exit 2) and again on SIGHUP (:meth:`Agents.reload`: a file
that cannot be read then keeps the prompt it had, and the failure is logged).
"""

from __future__ import annotations

import fnmatch
import logging
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from gateway.config import AgentConfig, Config
from gateway.errors import ConfigError
from gateway.logs import event
from gateway.protocol import claude_code_tools as claude_code_tools

log = logging.getLogger("gateway.agents")

DEFAULT_AGENT = "default"


READ_RESOURCE = "mcp_read_resource"
"""The built-in tool that reads an MCP server's resource (gateway.mcp.resources)."""


@dataclass(frozen=True, slots=True)
class AgentProfile:
    """One agent, every key resolved (docs/reference.md "Agents")."""

    name: str
    runtime: str  # "native" | "claude-code"
    model: str  # "<provider>:<model>"
    base_url: str  # "" = the provider's own
    system: str  # the literal prompt ("" = none), or what system_file held at the last read
    system_file: str  # "" = none
    tools: tuple[str, ...]  # names and globs (built-in, mcp__<server>__<tool>)
    require_approval: tuple[str, ...]
    delegate_agent: str
    max_tokens: int
    temperature: float | None
    thinking_budget_tokens: int
    max_rounds: int
    context_max_tokens: int
    turn_timeout_s: float
    permission_mode: str = "default"
    max_processes: int = 8
    idle_process_s: float = 300.0
    sandbox: bool = True  # claude-code: Bash in Claude Code's sandbox
    env: dict[str, str] = field(default_factory=dict)
    # claude-code without ``tools``: Claude Code's default set (``tools`` lists it), where
    # permission_mode decides what asks (docs/protocol.md §11)
    default_tools: bool = False
    # An MCP server's sampling request (docs/protocol.md §11): "ask", "allow" or "deny".
    mcp_sampling: str = "ask"

    @property
    def provider(self) -> str:
        """The provider part of ``model`` (``anthropic``, ``openai``, ``scripted``)."""
        return self.model.partition(":")[0]

    def allows(self, tool_name: str) -> bool:
        """Whether the agent may use the tool (a name or glob of ``tools`` matches it)."""
        return _matches(tool_name, self.tools)

    def needs_approval(self, tool_name: str, tool_input: Mapping[str, Any] | None = None) -> bool:
        """Whether a call of the tool waits for ``allow`` (``require_approval``).

        A read of an MCP server's resource (:data:`READ_RESOURCE`, its input's
        ``server``) waits too where the patterns cover every tool of that server
        (``mcp__notes__*``, ``mcp__*``, ``*``: they match ``mcp__notes__`` itself),
        so an agent whose server's tools are all asked for is asked for its reads
        (docs/protocol.md §11 "MCP tools").
        """
        if _matches(tool_name, self.require_approval):
            return True
        server = (tool_input or {}).get("server") if tool_name == READ_RESOURCE else None
        return isinstance(server, str) and _matches(f"mcp__{server}__", self.require_approval)

    def uses_server(self, server: str) -> bool:
        """Whether some pattern of ``tools`` may reach a tool of the MCP server ``server``."""
        for pattern in self.tools:
            if pattern.startswith("mcp__"):
                if fnmatch.fnmatchcase(server, pattern[5:].partition("__")[0]):
                    return True
            elif fnmatch.fnmatchcase(f"mcp__{server}__tool", pattern):
                return True
        return False


def _matches(name: str, patterns: tuple[str, ...]) -> bool:
    return any(name == p or fnmatch.fnmatchcase(name, p) for p in patterns)


def resolve_agents(config: Config) -> dict[str, AgentProfile]:
    """Every agent of the config, by name, ``default`` first (module docstring).

    Raises:
        ConfigError: a ``system_file`` that cannot be read (one line, exit 2).
    """
    base = AgentConfig()
    tables = {DEFAULT_AGENT: base, **config.agents}
    agents = {name: _resolve(name, table, config) for name, table in tables.items()}
    return agents


T = TypeVar("T")


def pick(value: T | None, fallback: T) -> T:
    """A table's value, or the section's when the table leaves the key out."""
    return fallback if value is None else value


def _resolve(name: str, table: AgentConfig, config: Config) -> AgentProfile:
    model, tools, turns = config.model, config.tools, config.turns

    # The prompt is one key in two spellings: a table that sets either replaces both.
    if table.system is not None or table.system_file is not None:
        literal, system_file, where = table.system or "", table.system_file or "", f"agents.{name}"
    else:
        literal, system_file, where = model.system, model.system_file, "model"
    system = read_system_file(system_file, where) if system_file else literal
    tool_list = pick(table.tools, tools.enabled)
    approval = pick(table.require_approval, tools.require_approval)
    temperature = table.temperature if table.temperature is not None else model.temperature
    if table.runtime == "claude-code":  # [tools] is native tools; Claude Code has no temperature
        tool_list = claude_code_tools.DEFAULT_TOOLS if table.tools is None else table.tools
        approval, temperature = table.require_approval or (), None
    return AgentProfile(
        name=name,
        runtime=table.runtime,
        model=pick(table.model, model.name),
        base_url=pick(table.base_url, model.base_url),
        system=system,
        system_file=system_file,
        tools=tool_list,
        require_approval=approval,
        delegate_agent=pick(table.delegate_agent, name),
        max_tokens=pick(table.max_tokens, model.max_tokens),
        temperature=temperature,
        thinking_budget_tokens=pick(table.thinking_budget_tokens, model.thinking_budget_tokens),
        max_rounds=pick(table.max_rounds, turns.max_rounds),
        context_max_tokens=pick(table.context_max_tokens, model.context_max_tokens),
        turn_timeout_s=pick(table.turn_timeout_s, turns.timeout_s),
        permission_mode=table.permission_mode,
        max_processes=table.max_processes,
        idle_process_s=table.idle_process_s,
        sandbox=table.sandbox,
        env=dict(table.env),
        default_tools=table.runtime == "claude-code" and table.tools is None,
        mcp_sampling=pick(table.mcp_sampling, tools.mcp_sampling),
    )


MAX_SYSTEM_FILE_BYTES = 1024 * 1024
"""The largest ``system_file`` read (1 MiB: far beyond any model's context for a prompt)."""


def read_system_file(path: str, where: str) -> str:
    """A system prompt file's text.

    Read in the daemon's Trio thread (start-up, SIGHUP), so only a regular
    file of at most :data:`MAX_SYSTEM_FILE_BYTES` is read: the path, or what
    a symlink there now points to, being a FIFO would block the open (and the
    whole daemon) until some writer came, ``/dev/zero`` would be read until
    memory ran out, and a directory is no prompt. The open does not block
    (``O_NONBLOCK``) and the kind and size are checked on the open file.

    Raises:
        ConfigError: the file is missing, unreadable, not a regular file, too
            big or not UTF-8 (named, with the key).
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        with open(fd, "rb") as file:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise ConfigError(
                    f"config error: {where}.system_file: {path} is not a regular file"
                )
            data = file.read(MAX_SYSTEM_FILE_BYTES + 1)
        if len(data) > MAX_SYSTEM_FILE_BYTES:
            raise ConfigError(
                f"config error: {where}.system_file: {path} is over {MAX_SYSTEM_FILE_BYTES} bytes"
            )
        return data.decode("utf-8")
    except FileNotFoundError:
        raise ConfigError(f"config error: {where}.system_file: no such file: {path}") from None
    except OSError as exc:
        problem = f"cannot read {path}: {exc.strerror}"
        raise ConfigError(f"config error: {where}.system_file: {problem}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"config error: {where}.system_file: {path} is not UTF-8 text") from None


def log_unsandboxed(profiles: list[AgentProfile]) -> None:
    """At start: each claude-code agent whose Bash runs outside Claude Code's sandbox, logged.

    ``sandbox = false`` is the operator's explicit choice (docs/protocol.md §11,
    "The boundary"): its Bash then reads and writes whatever the daemon's user can.
    """
    for profile in profiles:
        if profile.runtime == "claude-code" and not profile.sandbox:
            event(
                log, logging.WARNING, "claude_code_unsandboxed",
                f"agent {profile.name}: sandbox = false, so Claude Code's Bash runs outside its"
                " sandbox and can read and write whatever the daemon's user can",
                agent=profile.name,
            )  # fmt: skip


class Agents:
    """The agents of a running daemon, by name; their system prompts re-read on SIGHUP."""

    def __init__(self, config: Config) -> None:
        self._profiles = resolve_agents(config)
        self.default = config.default_agent

    def __contains__(self, name: object) -> bool:
        return name in self._profiles

    def __getitem__(self, name: str) -> AgentProfile:
        """The agent ``name``; a name no longer configured (a stored session's) runs the default."""
        return self._profiles.get(name) or self._profiles[self.default]

    def names(self) -> list[str]:
        return list(self._profiles)

    def profiles(self) -> list[AgentProfile]:
        return list(self._profiles.values())

    def reload(self) -> None:
        """Re-read every ``system_file`` (SIGHUP); one that fails keeps its prompt, logged."""
        for name, profile in list(self._profiles.items()):
            if not profile.system_file:
                continue
            try:
                text = read_system_file(profile.system_file, f"agents.{name}")
            except ConfigError as exc:
                event(
                    log, logging.ERROR, "system_file_unreadable",
                    f"agent {name}: {exc}; it keeps the prompt it had",
                    agent=name, path=profile.system_file,
                )  # fmt: skip
                continue
            if text != profile.system:
                self._profiles[name] = replace(profile, system=text)
                event(
                    log, logging.INFO, "system_file_reloaded",
                    f"agent {name}: system prompt re-read from {profile.system_file}",
                    agent=name, path=profile.system_file,
                )  # fmt: skip

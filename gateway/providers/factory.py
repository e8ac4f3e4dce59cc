"""Each agent's provider, built once at start-up (docs/protocol.md §11).

An agent's ``model`` is ``<provider>:<model>``; the part after the colon is
what the API is sent. Agents whose provider and ``base_url`` agree share one
provider (one HTTP client, one connection pool). ``[model] provider`` names
the default agent's provider, and its ``name`` must be one of that provider's.

Everything that would make every call fail is caught here, before the daemon
listens, as one :class:`~gateway.errors.ConfigError` line (docs/reference.md "Command
line": a bad config is one clear line and exit status 2, nothing started):

- ``anthropic`` needs ``ANTHROPIC_API_KEY``; ``openai`` takes
  ``OPENAI_API_KEY`` when set (local servers need none) and defaults
  ``base_url`` to OpenAI's own.
- A model must be ``<provider>:<model>`` of a known provider.
- With Anthropic, a thinking budget must be at least 1024 tokens and less
  than ``max_tokens``, as the API requires. An OpenAI-compatible server gets
  the budget as ``reasoning_effort`` (gateway.providers.openai).
- ``runtime = "claude-code"`` needs the ``claude-code`` extra installed.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from collections.abc import AsyncGenerator, Callable, Mapping

from gateway.agents import DEFAULT_AGENT, AgentProfile, Agents
from gateway.config import Config
from gateway.errors import ConfigError
from gateway.providers.base import ModelRequest, Provider
from gateway.providers.raw import RawEvent

OPENAI_BASE_URL = "https://api.openai.com/v1"
PROVIDERS = ("scripted", "anthropic", "openai")
_MIN_THINKING_BUDGET = 1024  # the Messages API's minimum budget_tokens


class Providers:
    """The provider of every agent, by agent name."""

    def __init__(self, by_agent: Mapping[str, Provider], fallback: Provider | None = None) -> None:
        self._by_agent = dict(by_agent)
        self._fallback = fallback

    @classmethod
    def single(cls, provider: Provider) -> Providers:
        """One provider for every agent (tests, and the bench, inject theirs so)."""
        return cls({}, provider)

    def for_agent(self, name: str) -> Provider:
        provider = self._by_agent.get(name) or self._fallback
        if provider is None:
            provider = self._by_agent[DEFAULT_AGENT]
        return provider

    def all(self) -> list[Provider]:
        """Each distinct provider once."""
        unique = {id(p): p for p in [*self._by_agent.values(), self._fallback] if p is not None}
        return list(unique.values())

    async def aclose(self) -> None:
        for provider in self.all():
            await provider.aclose()


def make_providers(config: Config, env: Mapping[str, str] = os.environ) -> Providers:
    """Build every agent's provider (module docstring).

    Raises:
        ConfigError: an agent cannot work as configured (named in the message),
            a ``system_file`` cannot be read.
    """
    built: dict[tuple[str, str, int], Provider] = {}
    by_agent: dict[str, Provider] = {}
    for profile in Agents(config).profiles():
        if profile.runtime == "claude-code":
            _check_claude_code(profile)
        key = _check(profile, config, env)
        if profile.runtime == "claude-code":  # Claude Code makes its own model calls
            build = functools.partial(_build, profile, config, env)
            by_agent[profile.name] = OnFirstUse(profile.provider, build)
            continue
        if key not in built:
            built[key] = _build(profile, config, env)
        by_agent[profile.name] = built[key]
    return Providers(by_agent)


class OnFirstUse:
    """A provider made at its first call (a Claude Code agent's: docs/agents.md).

    Claude Code calls its model itself: the gateway's loop never streams
    through this agent's provider, so its SDK is not imported at start-up
    (seconds of CPU on every node boot) unless something does call it.
    """

    def __init__(self, name: str, build: Callable[[], Provider]) -> None:
        self.name = name
        self._build = build
        self._provider: Provider | None = None

    def stream(self, request: ModelRequest) -> AsyncGenerator[RawEvent, None]:
        if self._provider is None:
            self._provider = self._build()
        return self._provider.stream(request)

    async def aclose(self) -> None:
        if self._provider is not None:
            await self._provider.aclose()


def make_provider(config: Config, env: Mapping[str, str] = os.environ) -> Provider:
    """The default agent's provider (``[model]``)."""
    return make_providers(config, env).for_agent(DEFAULT_AGENT)


def _where(profile: AgentProfile, key: str) -> str:
    if profile.name == DEFAULT_AGENT:
        return {"model": "model.name"}.get(key, f"model.{key}")
    return f"agents.{profile.name}.{key}"


def _check(profile: AgentProfile, config: Config, env: Mapping[str, str]) -> tuple[str, str, int]:
    kind, _, name = profile.model.partition(":")
    if profile.name == DEFAULT_AGENT and kind != config.model.provider:
        problem = f'is not an "{config.model.provider}:<model>" name'
        raise _error(f'{_where(profile, "model")} = "{profile.model}" {problem}')
    if kind not in PROVIDERS or not name:
        known = ", ".join(f'"{p}:<model>"' for p in PROVIDERS)
        raise _error(f'{_where(profile, "model")} = "{profile.model}" is not one of {known}')
    budget = profile.thinking_budget_tokens
    if kind == "anthropic":
        if not env.get("ANTHROPIC_API_KEY"):
            what = (
                'model.provider = "anthropic"'
                if profile.name == DEFAULT_AGENT
                else f'agents.{profile.name}.model = "{profile.model}"'
            )
            raise _error(f"{what} needs ANTHROPIC_API_KEY in the environment")
        where = _where(profile, "thinking_budget_tokens")
        if 0 < budget < _MIN_THINKING_BUDGET:
            raise _error(
                f"{where} = {budget}: extended thinking needs at least {_MIN_THINKING_BUDGET}"
            )
        if budget >= profile.max_tokens:
            raise _error(
                f"{where} = {budget} must be less than"
                f" {_where(profile, 'max_tokens')} = {profile.max_tokens}"
            )
    return kind, profile.base_url, 0


def _build(profile: AgentProfile, config: Config, env: Mapping[str, str]) -> Provider:
    kind = profile.provider
    model = config.model
    # Each provider's module is imported only when chosen: the SDKs take a while to import.
    if kind == "scripted":
        from gateway.providers.scripted import ScriptedProvider

        return ScriptedProvider(profile.model)
    if kind == "anthropic":
        from gateway.providers.anthropic import AnthropicProvider

        return AnthropicProvider(
            api_key=env["ANTHROPIC_API_KEY"],
            base_url=profile.base_url or None,
            max_retries=model.max_retries,
            timeout_s=model.timeout_s,
        )
    from gateway.providers.openai import OpenAIProvider

    return OpenAIProvider(
        base_url=profile.base_url or OPENAI_BASE_URL,
        api_key=env.get("OPENAI_API_KEY") or None,
        max_retries=model.max_retries,
        timeout_s=model.timeout_s,
    )


def _check_claude_code(profile: AgentProfile) -> None:
    if importlib.util.find_spec("claude_agent_sdk") is None:
        raise _error(
            f'agents.{profile.name}.runtime = "claude-code" needs the claude-code extra:'
            " pip install 'gateway[claude-code]'"
        )


def _error(problem: str) -> ConfigError:
    return ConfigError(f"config error: {problem}")

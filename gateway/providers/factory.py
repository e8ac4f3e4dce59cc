"""The provider named by ``[model] provider``, built once at start-up.

Everything that would make every call fail is caught here, before the daemon
listens, as one :class:`~gateway.errors.ConfigError` line (RUNNING.md "Command
line": a bad config is one clear line and exit status 2, nothing started):

- ``anthropic`` needs ``ANTHROPIC_API_KEY``; ``openai`` takes
  ``OPENAI_API_KEY`` when set (local servers need none) and defaults
  ``base_url`` to OpenAI's own.
- ``model.name`` must be ``<provider>:<model>``: the part after the colon is
  what the API is sent.
- With Anthropic, a thinking budget must be at least 1024 tokens and less
  than ``max_tokens``, as the API requires. The OpenAI-compatible provider has
  no budget to set (servers that think do so on their own) and ignores it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from gateway.config import Config
from gateway.errors import ConfigError
from gateway.providers.base import Provider

OPENAI_BASE_URL = "https://api.openai.com/v1"
_MIN_THINKING_BUDGET = 1024  # the Messages API's minimum budget_tokens


def make_provider(config: Config, env: Mapping[str, str] = os.environ) -> Provider:
    """Build the configured provider.

    Args:
        config: the daemon's configuration; ``[model]`` is read.
        env: the environment the API keys are read from.

    Raises:
        ConfigError: the provider cannot work as configured (named in the message).
    """
    model = config.model
    kind = model.provider
    if model.name.partition(":")[0] != kind or not model.name.partition(":")[2]:
        raise _error(f'model.name = "{model.name}" is not an "{kind}:<model>" name')
    # Each provider's module is imported only when chosen: the SDKs take a while to import.
    if kind == "scripted":
        from gateway.providers.scripted import ScriptedProvider

        return ScriptedProvider(model.name)
    if kind == "anthropic":
        from gateway.providers.anthropic import AnthropicProvider

        api_key = env.get("ANTHROPIC_API_KEY")
        if not api_key:
            raise _error('model.provider = "anthropic" needs ANTHROPIC_API_KEY in the environment')
        budget = model.thinking_budget_tokens
        if 0 < budget < _MIN_THINKING_BUDGET:
            raise _error(
                f"model.thinking_budget_tokens = {budget}:"
                f" extended thinking needs at least {_MIN_THINKING_BUDGET}"
            )
        if budget >= model.max_tokens:
            raise _error(
                f"model.thinking_budget_tokens = {budget}"
                f" must be less than model.max_tokens = {model.max_tokens}"
            )
        return AnthropicProvider(
            api_key=api_key,
            base_url=model.base_url or None,
            thinking_budget_tokens=budget,
            max_retries=model.max_retries,
            timeout_s=model.timeout_s,
        )
    from gateway.providers.openai import OpenAIProvider

    return OpenAIProvider(
        base_url=model.base_url or OPENAI_BASE_URL,
        api_key=env.get("OPENAI_API_KEY") or None,
        max_retries=model.max_retries,
        timeout_s=model.timeout_s,
    )


def _error(problem: str) -> ConfigError:
    return ConfigError(f"config error: {problem}")

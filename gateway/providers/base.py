"""The provider interface: what the agent loop asks of a model.

A provider turns a :class:`ModelRequest` (the conversation rebuilt from the
message store, the tool definitions) into an async stream of Anthropic-shaped
:mod:`raw events <gateway.providers.raw>`. It never emits canonical events
itself: the one translator does that for every provider (issue: "the scripted
provider emits exactly those raw events, so the Anthropic provider goes through
the same translator unchanged").

A failure before the first event raises :class:`~gateway.errors.ProviderError`
(with its ``error_class``); a failure mid-stream is either a ``RawError`` event
or a raised ``ProviderError``, and the translator closes what was open.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any, Protocol

import msgspec

from gateway.protocol.shapes import Message
from gateway.providers.raw import RawEvent


class ToolSpec(msgspec.Struct):
    """A tool as the model sees it (Anthropic's ``tools`` entry)."""

    name: str
    description: str
    input_schema: dict[str, Any]


class ModelRequest(msgspec.Struct):
    """One LLM call: the model, the conversation as the model sees it, the tools.

    ``system``, ``temperature`` and ``thinking_budget_tokens`` are the session's
    agent's (docs/protocol.md §11): the system prompt goes to the model on every
    call; a thinking budget > 0 is Anthropic's extended thinking with that
    budget, and an OpenAI-compatible server's ``reasoning_effort``.

    ``files`` holds the bytes of the files the conversation names, by file id:
    ``(media_type, bytes)`` (docs/protocol.md §2 "Files"). The messages carry
    only references; a provider puts the bytes in where its API wants them. A
    file named but missing (its session deleted meanwhile) is absent, and the
    provider says so in text.
    """

    model: str
    messages: list[Message]
    tools: list[ToolSpec]
    max_tokens: int
    system: str | None = None
    temperature: float | None = None
    thinking_budget_tokens: int = 0
    files: dict[str, tuple[str, bytes]] = {}


class Provider(Protocol):
    """A model provider (``[model] provider`` in docs/reference.md)."""

    name: str

    def stream(self, request: ModelRequest) -> AsyncGenerator[RawEvent, None]:
        """Stream the raw events of one call.

        Raises:
            ProviderError: the call failed; ``error_class`` says how.
        """
        ...

    async def aclose(self) -> None:
        """Release connections (an HTTP client, say)."""
        ...

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
from contextlib import aclosing
from typing import Any, Protocol

import msgspec

from gateway.errors import ProviderError
from gateway.protocol.shapes import Message, Usage
from gateway.providers.raw import (
    ERROR_CLASSES,
    RawContentBlockDelta,
    RawError,
    RawEvent,
    RawMessageDelta,
    RawMessageStart,
    RawMessageStop,
    RawTextDelta,
    RawUsage,
)


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


class TextReply(msgspec.Struct):
    """What a call answered in text alone (:func:`text_reply`)."""

    text: str
    usage: Usage  # its cost not yet priced
    stop_reason: str


async def text_reply(provider: Provider, request: ModelRequest) -> TextReply:
    """One call whose answer is read as text only: a compaction's summary (docs/protocol.md
    §12), an MCP server's sampling (§11). Its text deltas joined, its usage, its stop reason.

    Raises:
        ProviderError: the call failed, before or during its stream, or the stream ended
            before ``message_stop``.
    """
    text: list[str] = []
    raw_usage, stop, stopped = RawUsage(), "end_turn", False
    async with aclosing(provider.stream(request)) as stream:
        async for raw in stream:
            match raw:
                case RawMessageStart():
                    raw_usage = raw.message.usage
                case RawContentBlockDelta(delta=RawTextDelta(text=chunk)):
                    text.append(chunk)
                case RawMessageDelta():
                    raw_usage.output_tokens = raw.usage.output_tokens
                    stop = raw.delta.stop_reason or stop
                case RawMessageStop():
                    stopped = True
                case RawError():
                    error_class = ERROR_CLASSES.get(raw.error.type, "api_error")
                    raise ProviderError(error_class, raw.error.message)
    if not stopped:
        raise ProviderError("network", "the stream ended before message_stop")
    usage = Usage(
        raw_usage.input_tokens or 0,
        raw_usage.output_tokens or 0,
        raw_usage.cache_read_input_tokens,
        raw_usage.cache_creation_input_tokens,
    )
    return TextReply("".join(text), usage, stop)

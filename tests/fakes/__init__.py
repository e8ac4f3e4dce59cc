"""Stand-ins for the model APIs, shared by the provider tests and ``bench/ttft.py``.

- :mod:`tests.fakes.server`: a local HTTP server that replays recorded SSE
  transcripts byte for byte and records each request it was sent.
- ``tests/fakes/transcripts/``: the transcripts, written to the documented
  streaming formats (Anthropic Messages API events; OpenAI Chat Completions
  chunks).
- :func:`drive`: one provider call through the translator, as the session
  drives it.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Protocol

from gateway.errors import ProviderError
from gateway.protocol.events import StreamEvent
from gateway.providers.base import ModelRequest
from gateway.providers.raw import RawEvent
from gateway.translate import Translator
from tests.fakes.server import Cut, FakeServer, Json, Recorded, Replay, transcript

__all__ = [
    "Call",
    "Cut",
    "FakeServer",
    "Json",
    "Recorded",
    "Replay",
    "drive",
    "transcript",
]


class Streams(Protocol):
    """A provider whose streams can be closed early (every provider here is one)."""

    def stream(self, request: ModelRequest) -> AsyncGenerator[RawEvent, None]: ...


@dataclass
class Call:
    """What one driven call produced."""

    translator: Translator
    events: list[StreamEvent] = field(default_factory=list)
    raised: ProviderError | None = None  # what the provider raised, if it did


async def drive(provider: Streams, request: ModelRequest, translator: Translator) -> Call:
    """Stream one call into ``translator`` the way the session does.

    Raw events are fed in order; a raised ``ProviderError`` fails the
    translator (it closes the open blocks); a stream that ends before
    ``message_stop`` fails it with ``network``.
    """
    call = Call(translator)
    try:
        async with aclosing(provider.stream(request)) as stream:
            async for raw in stream:
                call.events += translator.feed(raw)
    except ProviderError as exc:
        call.raised = exc
        call.events += translator.fail(exc.error_class, exc.message)
    else:
        if not translator.finished:
            call.events += translator.fail("network", "the model stream ended before message_stop")
    return call

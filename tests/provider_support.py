"""What the provider test modules share (each states its rules in its docstring).

- :func:`server`: the fake model API (:mod:`bench.fake_api`) as a fixture.
  A module imports it as ``server as server``: the redundant alias tells ruff
  that the name is there for pytest, not unused.
- :func:`drive`: one provider call through the translator, as the session
  drives it; :func:`call` drives it through the tests' translator (session
  ``sess_1``, turn ``turn_1``, created at 7) under a ``fail_after`` cap.
- :func:`message`, :func:`request`: the conversation a call sends;
  :func:`final`: the message a call ends with.
- :func:`gateway_turn`: one turn through a real gateway on a provider.
- :func:`ignore_unfinalized_generators`: each module's ``pytestmark``.
- :data:`ANTHROPIC`, :data:`OPENAI`: each HTTP provider on the fake model
  API, in its own words (its transcripts, its error bodies, how its messages
  name the server), for its module and for tests/integration/providers/test_provider_contract.py;
  :func:`price`/:func:`priced`: the Anthropic prices those tests charge.

What only one provider's tests use (its request shapes, ids and configuration)
stays in its module.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import msgspec
import pytest
import trio

from bench.fake_api import FakeServer, Json, Replay, transcript
from gateway.config import Config
from gateway.errors import ProviderError
from gateway.protocol.events import Event, StreamEvent
from gateway.protocol.shapes import ContentBlock, Message, MessageStatus, Role, TextBlock, Usage
from gateway.providers.anthropic import AnthropicProvider
from gateway.providers.base import ModelRequest, Provider, ToolSpec
from gateway.providers.openai import OpenAIProvider
from gateway.providers.raw import RawEvent
from gateway.translate import Translator
from tests.conftest import running_gateway

SESSION_ID = "sess_1"
TURN_ID = "turn_1"
CREATED_AT = 7  # the translator's clock, in every final message


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


async def call(
    provider: Streams,
    req: ModelRequest | None = None,
    *,
    model: str,
    pricing: Callable[[Usage], float | None] | None = None,
) -> Call:
    """:func:`drive` one call (``req``, else "Hi") through a new translator, capped at 10 s."""
    translator = Translator(
        session_id=SESSION_ID,
        turn_id=TURN_ID,
        model=model,
        created_at=CREATED_AT,
        pricing=pricing,
    )
    with trio.fail_after(10):
        return await drive(provider, req or request(model), translator)


def message(role: Role, *content: ContentBlock, status: MessageStatus = "complete") -> Message:
    """A stored message of the conversation, as the message store gives it to a provider."""
    return Message("msg_x", SESSION_ID, TURN_ID, role, list(content), status, 0)


def request(model: str, *messages: Message, tools: list[ToolSpec] | None = None) -> ModelRequest:
    """One call of ``model`` on these messages (a user's "Hi" if none)."""
    history = list(messages) or [message("user", TextBlock("Hi"))]
    return ModelRequest(model=model, messages=history, tools=tools or [], max_tokens=1024)


def final(
    m: str, model: str, content: list[ContentBlock], usage: Usage, status: MessageStatus
) -> Message:
    """The assistant message a call of :func:`call` ends with."""
    return Message(m, SESSION_ID, TURN_ID, "assistant", content, status, CREATED_AT, model, usage)


@pytest.fixture
async def server(nursery: trio.Nursery) -> FakeServer:
    """The fake model API, serving until the test ends; its replies are enqueued by the test."""
    fake = FakeServer()
    await nursery.start(fake.serve)
    return fake


async def gateway_turn(
    config: Config, provider: Provider, workspace: Path, text: str
) -> tuple[list[Event], list[ToolSpec]]:
    """One turn through a real gateway on ``provider``, which is closed at the end.

    Returns:
        The turn's events, in order, and the tool definitions of the gateway's registry.
    """
    # The test's files are in ``workspace``: the operator allows it (docs/protocol.md §15).
    sessions = msgspec.structs.replace(config.sessions, allowed_workspaces=(str(workspace),))
    config = msgspec.structs.replace(config, sessions=sessions)
    try:
        with trio.fail_after(20):
            async with running_gateway(config, provider) as gw:
                session = await gw.create_session(workspace_path=str(workspace))
                async with gw.client(session) as client:
                    await client.subscribe()
                    await gw.submit(session, text)
                    events = await client.until_turn_ends()
                specs = gw.node.tools.specs()
    finally:
        await provider.aclose()
    return events, specs


def ignore_unfinalized_generators(*packages: str) -> list[pytest.MarkDecorator]:
    """Ignore Trio's ``ResourceWarning`` for async generators of these packages left to it."""
    return [
        pytest.mark.filterwarnings(f"ignore:Async generator '{package}.:ResourceWarning")
        for package in packages
    ]


def price(usage: Usage) -> float:
    """$3 / $15 / $0.30 / $3.75 per million tokens, as a ``[model.prices]`` entry would."""
    return (
        usage.input_tokens * 3.0
        + usage.output_tokens * 15.0
        + (usage.cache_read_input_tokens or 0) * 0.3
        + (usage.cache_creation_input_tokens or 0) * 3.75
    ) / 1_000_000


def priced(usage: Usage) -> Usage:
    """``usage`` with the cost :func:`price` gives it."""
    usage.cost_usd = price(usage)
    return usage


@dataclass(frozen=True)
class HttpProvider:
    """One provider on the fake model API, in its own words."""

    name: str
    """Its transcripts' folder in ``bench/fake_api/transcripts/``."""
    model: str
    key: str
    make: Callable[..., Provider]
    """``make(base_url, **options)``: a provider on the fake server at ``base_url``."""
    error_body: Callable[[str, str], dict[str, Any]]
    """``error_body(error_type, text)``: the JSON body of its refusals."""
    answered: str
    """How its error messages name the server: ``{answered} 400: ...``."""
    pricing: Callable[[Usage], float | None] | None = None

    def sse(self, name: str, **kw: Any) -> Replay:
        """Its recorded transcript ``name``, replayed."""
        return Replay(transcript(f"{self.name}/{name}.sse"), **kw)

    def api_error(self, status: int, error_type: str, text: str, *headers: tuple[str, str]) -> Json:
        """A refusal with this status, in its error body."""
        return Json(status, self.error_body(error_type, text), headers)

    def connect(self, server: FakeServer, **options: Any) -> aclosing[Provider]:
        """A provider on ``server`` (no retries, 5 s timeout unless said), closed at the end."""
        options = {"max_retries": 0, "timeout_s": 5.0, **options}
        return aclosing(self.make(server.base_url, **options))

    async def call(self, provider: Streams, req: ModelRequest | None = None) -> Call:
        """:func:`call` with its model and pricing."""
        return await call(provider, req, model=self.model, pricing=self.pricing)


def _anthropic(base_url: str, **options: Any) -> Provider:
    return AnthropicProvider(api_key=ANTHROPIC_KEY, base_url=base_url, **options)


def _openai(base_url: str, **options: Any) -> Provider:
    return OpenAIProvider(base_url=f"{base_url}/v1", **{"api_key": OPENAI_KEY, **options})


ANTHROPIC_KEY = "sk-ant-test"
OPENAI_KEY = "sk-local"

ANTHROPIC = HttpProvider(
    name="anthropic",
    model="anthropic:claude-sonnet-4-6",
    key=ANTHROPIC_KEY,
    make=_anthropic,
    error_body=lambda error_type, text: {
        "type": "error",
        "error": {"type": error_type, "message": text},
    },
    answered="the model API answered",
    pricing=price,
)
OPENAI = HttpProvider(
    name="openai",
    model="openai:gpt-4o-mini",
    key=OPENAI_KEY,
    make=_openai,
    error_body=lambda error_type, text: {
        "error": {"message": text, "type": error_type, "param": None, "code": None}
    },
    answered="the model server answered",
)

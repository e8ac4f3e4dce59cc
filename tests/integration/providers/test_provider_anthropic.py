"""gateway.providers.anthropic against a local server that speaks the Messages API.

What every provider does (text, thinking, tool uses as partial JSON, usage,
errors as error classes, retries, a broken stream, closing a stream early, a
refusal as too long) is tested once for all in
tests/integration/providers/test_provider_contract.py; this module holds what only
this provider does.

Rules of these tests:
- No internet. :class:`bench.fake_api.FakeServer` replays recorded SSE
  transcripts (``bench/fake_api/transcripts/anthropic/``, written to the
  documented streaming format) byte for byte, and the real ``anthropic`` SDK
  reads them: its HTTP client, SSE parser, retry policy and error classes are
  all in the loop.
- Every stream goes through the real :class:`Translator`, as in the session,
  and each test asserts the exact canonical events and the final message.
- What the SDK sent is asserted from the request the server recorded.
- Real clock with ``fail_after`` caps; retries are made fast by the server's
  ``retry-after-ms`` header, and the SDK's backoff is never waited out.

The SDK and httpx leave their inner async generators to Trio's finalizer when
a stream ends early (an ``error`` event, a broken connection), and Trio warns
about each with a ``ResourceWarning``; Python ignores those by default, and
these tests ignore them too (``pytestmark``).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import msgspec
import pytest

from bench.fake_api import FakeServer, Replay, transcript
from gateway.config import Config
from gateway.errors import ConfigError
from gateway.protocol.events import (
    MessageComplete,
    MessageStart,
    TextDelta,
    TextEnd,
    TextStart,
    ThinkingDelta,
    ThinkingEnd,
    ThinkingStart,
    stream_event,
)
from gateway.protocol.shapes import (
    ContentBlock,
    Message,
    MessageStatus,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
    Usage,
)
from gateway.providers.anthropic import AnthropicProvider, messages_param
from gateway.providers.factory import make_provider
from gateway.providers.scripted import ScriptedProvider
from tests import provider_support
from tests.conftest import make_config
from tests.provider_support import (
    ANTHROPIC,
    gateway_turn,
    ignore_unfinalized_generators,
    message,
    price,
    priced,
)
from tests.provider_support import server as server

pytestmark = ignore_unfinalized_generators("anthropic", "httpx2", "httpcore2")

MODEL = ANTHROPIC.model
KEY = ANTHROPIC.key
ev = stream_event
request = partial(provider_support.request, MODEL)
call = partial(provider_support.call, model=MODEL, pricing=price)
sse = ANTHROPIC.sse


@pytest.fixture
def connect(server: FakeServer) -> Callable[..., Any]:
    """``connect(**options)``: a provider on the fake server, closed at the end."""
    return partial(ANTHROPIC.connect, server)


def final(msg_id: str, content: list[ContentBlock], usage: Usage, status: MessageStatus) -> Message:
    return provider_support.final(msg_id, MODEL, content, usage, status)


# --- the transcripts (the shared ones: tests/integration/providers/test_provider_contract.py) -----


async def test_redacted_thinking(server: FakeServer, connect: Any) -> None:
    server.enqueue(sse("redacted_thinking"))
    async with connect(thinking_budget_tokens=1024) as provider:
        result = await call(provider)

    m = "msg_01Rz4oAAEbBxBDUuv4a2QAXm"
    data = (
        "EmwKAhgBEgy3va3pzix/LafPsn4aDFIT2Xlxh0L5L8rLVyIwxtE3rAFBa8cr3qpPkNRj2YfWXGmKDx"
        "H4mPnZ5sQ7vB5URj2pLmN1bkj5Ue7Ys0Ws"
    )
    sig = "ErUBCkYIBRgCIkB2"
    content: list[ContentBlock] = [
        RedactedThinkingBlock(data),
        ThinkingBlock("The answer is short.", sig),
        TextBlock("Done."),
    ]
    usage = priced(Usage(30, 40, 0, 0))
    assert result.events == [
        ev(MessageStart(m, "assistant", MODEL)),
        ev(ThinkingStart(m, 0, redacted=True)),
        ev(ThinkingDelta(m, 0, data, None)),
        ev(ThinkingEnd(m, 0, None)),
        ev(ThinkingStart(m, 1, redacted=False)),
        ev(ThinkingDelta(m, 1, "The answer is short.", None)),
        ev(ThinkingDelta(m, 1, "", sig)),
        ev(ThinkingEnd(m, 1, sig)),
        ev(TextStart(m, 2)),
        ev(TextDelta(m, 2, "Done.")),
        ev(TextEnd(m, 2)),
        ev(MessageComplete(m, "end_turn", content, usage)),
    ]
    assert result.translator.message == final(m, content, usage, "complete")


# --- failures before the stream ------------------------------------------------


# --- failures once streaming -------------------------------------------------------


async def test_a_block_type_the_gateway_does_not_know_fails_the_call(
    server: FakeServer, connect: Any
) -> None:
    body = transcript("anthropic/text.sse")
    start = body.index(b"event: content_block_start")
    server_tool = (
        b"event: content_block_start\n"
        b'data: {"type":"content_block_start","index":0,"content_block":'
        b'{"type":"server_tool_use","id":"srvtoolu_1","name":"web_search","input":{}}}\n\n'
    )
    server.enqueue(Replay(body[:start] + server_tool))
    async with connect() as provider:
        result = await call(provider)
    assert result.raised is not None
    assert result.raised.error_class == "api_error"
    assert result.raised.message.startswith("unsupported content_block_start event from the API")
    assert [e.type for e in result.events] == ["message.start", "message.complete"]


# --- the conversation sent ----------------------------------------------------------


def test_history_keeps_signed_thinking_and_pairs_tool_results() -> None:
    sig = "EqQBCgIYAhIM"
    history = [
        message("user", TextBlock("Read it")),
        message(
            "assistant",
            ThinkingBlock("Need the file.", sig),
            RedactedThinkingBlock("opaque"),
            TextBlock("Reading."),
            ToolUseBlock("toolu_1", "read_file", {"path": "a"}),
            ToolUseBlock("toolu_2", "read_file", {"path": "b"}),
        ),
        message(  # in the order the tools finished
            "user",
            ToolResultBlock("toolu_2", "no such file: b", is_error=True),
            ToolResultBlock("toolu_1", "alpha"),
        ),
    ]
    assert messages_param(request(*history)) == [
        {"role": "user", "content": [{"type": "text", "text": "Read it"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "Need the file.", "signature": sig},
                {"type": "redacted_thinking", "data": "opaque"},
                {"type": "text", "text": "Reading."},
                {"type": "tool_use", "id": "toolu_1", "name": "read_file", "input": {"path": "a"}},
                {"type": "tool_use", "id": "toolu_2", "name": "read_file", "input": {"path": "b"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_1",
                    "content": "alpha",
                    "is_error": False,
                },
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_2",
                    "content": "no such file: b",
                    "is_error": True,
                },
            ],
        },
    ]


def test_history_of_a_cancelled_call_keeps_what_the_api_accepts() -> None:
    history = [
        message("user", TextBlock("First")),
        # Cancelled mid-stream: thinking cut before its signature, an empty text
        # block, a tool use that never ran.
        message(
            "assistant",
            ThinkingBlock("Hmm", None),
            TextBlock("Partial"),
            TextBlock(""),
            ToolUseBlock("toolu_9", "sleep", {}),
            status="cancelled",
        ),
        message("user", TextBlock("Second")),
        # Failed before saying anything; then a turn cancelled before the model answered.
        message("assistant", ThinkingBlock("Only thought", "sig"), status="error"),
        message("user", TextBlock("Third")),
        message("user", TextBlock("Fourth")),
        message("assistant", TextBlock("streaming"), status="in_progress"),
    ]
    assert messages_param(request(*history)) == [
        {"role": "user", "content": [{"type": "text", "text": "First"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "Partial"}]},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Second"},
                {"type": "text", "text": "Third"},
                {"type": "text", "text": "Fourth"},
            ],
        },
    ]


def test_history_drops_unpaired_tool_uses_and_results() -> None:
    history = [
        message("user", ToolResultBlock("toolu_7", "answers nothing"), TextBlock("Go")),
        # Failed after its tool use: the tool never ran, so the message has nothing left.
        message("assistant", ToolUseBlock("toolu_1", "sleep", {}), status="error"),
        message("user", TextBlock("Again")),
    ]
    assert messages_param(request(*history)) == [
        {
            "role": "user",
            "content": [{"type": "text", "text": "Go"}, {"type": "text", "text": "Again"}],
        }
    ]


# --- a full tool loop through the gateway --------------------------------------------


def gateway_config(tmp_path: Path, base_url: str) -> Config:
    return make_config(
        tmp_path,
        **{
            "model.provider": "anthropic",
            "model.name": MODEL,
            "model.base_url": base_url,
            "model.max_tokens": 4096,
            "model.thinking_budget_tokens": 2048,
            "model.max_retries": 0,
            "model.prices": {MODEL: {"input_per_mtok": 3.0, "output_per_mtok": 15.0}},
            "tools.enabled": ["read_file"],
        },
    )


async def run_turn(tmp_path: Path, server: FakeServer, text: str) -> list[Any]:
    """One turn through a real gateway on the fake API; its events, in order."""
    config = gateway_config(tmp_path / "store", server.base_url)
    (tmp_path / "store").mkdir()
    provider = make_provider(config, {"ANTHROPIC_API_KEY": KEY})
    assert isinstance(provider, AnthropicProvider)
    events, specs = await gateway_turn(config, provider, tmp_path, text)
    tools = msgspec.to_builtins(specs)
    assert [r.body["tools"] for r in server.requests] == [tools] * len(server.requests)
    return events


async def test_tool_loop_sends_signed_thinking_tool_use_and_result(
    tmp_path: Path, server: FakeServer
) -> None:
    (tmp_path / "notes.txt").write_text("buy milk\n")
    server.enqueue(sse("thinking_tool_use"), sse("text"))
    events = await run_turn(tmp_path, server, "Summarize my notes.")

    completed = events[-1]
    assert completed.type == "turn.completed"
    assert completed.payload.stop_reason == "end_turn"
    assert completed.payload.usage == Usage(
        512 + 25, 61 + 15, 0, 0, cost_usd=price(Usage(512, 61)) + price(Usage(25, 15))
    )
    tool = next(e for e in events if e.type == "tool.completed")
    assert (tool.payload.tool_use_id, tool.payload.result) == (
        "toolu_01A09q90qw90lq917835lq9",
        "buy milk\n",
    )

    first, second = server.requests
    user = {"role": "user", "content": [{"type": "text", "text": "Summarize my notes."}]}
    assert first.body["messages"] == [user]
    assert second.body == {
        "model": "claude-sonnet-4-6",
        "max_tokens": 4096,
        "thinking": {"type": "enabled", "budget_tokens": 2048},
        "tools": second.body["tools"],  # the registry's, checked by run_turn
        "stream": True,
        "messages": [
            user,
            {
                "role": "assistant",
                "content": [
                    {
                        "type": "thinking",
                        "thinking": "The notes are in notes.txt; read it first.",
                        "signature": "EuYBCkQYAiJAgCs1le6/Pol5Z4",
                    },
                    {
                        "type": "tool_use",
                        "id": "toolu_01A09q90qw90lq917835lq9",
                        "name": "read_file",
                        "input": {"path": "notes.txt"},
                    },
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_01A09q90qw90lq917835lq9",
                        "content": "buy milk\n",
                        "is_error": False,
                    }
                ],
            },
        ],
    }


async def test_tool_loop_sends_a_failed_tool_as_is_error(
    tmp_path: Path, server: FakeServer
) -> None:
    (tmp_path / "a.txt").write_text("alpha")  # b.txt does not exist
    server.enqueue(sse("text_tool_uses"), sse("text"))
    events = await run_turn(tmp_path, server, "Compare a and b.")

    ends = ("tool.completed", "tool.failed")
    outcomes = {e.payload.tool_use_id: e.type for e in events if e.type in ends}
    assert outcomes == {
        "toolu_01T1x1fJ34qAmk2tNTrN7Up6": "tool.completed",
        "toolu_01D7FLrfh4GYq7yT1ULFeyMV": "tool.failed",
    }
    _, second = server.requests
    assert second.body["messages"][1:] == [
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Let me read both files."},
                {
                    "type": "tool_use",
                    "id": "toolu_01T1x1fJ34qAmk2tNTrN7Up6",
                    "name": "read_file",
                    "input": {"path": "a.txt"},
                },
                {
                    "type": "tool_use",
                    "id": "toolu_01D7FLrfh4GYq7yT1ULFeyMV",
                    "name": "read_file",
                    "input": {"path": "b.txt"},
                },
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_01T1x1fJ34qAmk2tNTrN7Up6",
                    "content": "alpha",
                    "is_error": False,
                },
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_01D7FLrfh4GYq7yT1ULFeyMV",
                    "content": "no such file: b.txt",
                    "is_error": True,
                },
            ],
        },
    ]


# --- the factory -------------------------------------------------------------------------


def test_factory_needs_the_api_key(tmp_path: Path) -> None:
    config = gateway_config(tmp_path, "")
    with pytest.raises(ConfigError) as raised:
        make_provider(config, {})
    assert str(raised.value) == (
        'config error: model.provider = "anthropic" needs ANTHROPIC_API_KEY in the environment'
    )


@pytest.mark.parametrize(
    ("overrides", "problem"),
    [
        (
            {"model.name": "scripted:echo"},
            'model.name = "scripted:echo" is not an "anthropic:<model>" name',
        ),
        (
            {"model.thinking_budget_tokens": 512},
            "model.thinking_budget_tokens = 512: extended thinking needs at least 1024",
        ),
        (
            {"model.thinking_budget_tokens": 4096},
            "model.thinking_budget_tokens = 4096 must be less than model.max_tokens = 4096",
        ),
    ],
)
def test_factory_refuses_an_unusable_model(
    tmp_path: Path, overrides: dict[str, Any], problem: str
) -> None:
    config = make_config(
        tmp_path, **{"model.provider": "anthropic", "model.name": MODEL, **overrides}
    )
    with pytest.raises(ConfigError) as raised:
        make_provider(config, {"ANTHROPIC_API_KEY": KEY})
    assert str(raised.value) == f"config error: {problem}"


def test_factory_makes_the_scripted_model_by_default(tmp_path: Path) -> None:
    provider = make_provider(make_config(tmp_path), {})
    assert isinstance(provider, ScriptedProvider)
    assert provider.default_model == "scripted:echo"

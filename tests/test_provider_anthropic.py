"""gateway.providers.anthropic against a local server that speaks the Messages API.

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
from contextlib import aclosing
from functools import partial
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio

from bench.fake_api import Cut, FakeServer, Json, Replay, transcript
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
    ToolUseEnd,
    ToolUseInputDelta,
    ToolUseStart,
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
from gateway.providers.base import ToolSpec
from gateway.providers.factory import make_provider
from gateway.providers.raw import RawMessageStart
from gateway.providers.scripted import ScriptedProvider
from tests import provider_support
from tests.conftest import make_config
from tests.provider_support import gateway_turn, ignore_unfinalized_generators, message
from tests.provider_support import server as server

pytestmark = ignore_unfinalized_generators("anthropic", "httpx2", "httpcore2")

MODEL = "anthropic:claude-sonnet-4-6"
KEY = "sk-ant-test"
ev = stream_event


def price(usage: Usage) -> float:
    """$3 / $15 / $0.30 / $3.75 per million tokens, as a ``[model.prices]`` entry would."""
    return (
        usage.input_tokens * 3.0
        + usage.output_tokens * 15.0
        + (usage.cache_read_input_tokens or 0) * 0.3
        + (usage.cache_creation_input_tokens or 0) * 3.75
    ) / 1_000_000


request = partial(provider_support.request, MODEL)
call = partial(provider_support.call, model=MODEL, pricing=price)


def sse(name: str, **kw: Any) -> Replay:
    return Replay(transcript(f"anthropic/{name}.sse"), **kw)


def api_error(status: int, error_type: str, text: str, *headers: tuple[str, str]) -> Json:
    body = {"type": "error", "error": {"type": error_type, "message": text}}
    return Json(status, body, headers)


@pytest.fixture
def connect(server: FakeServer) -> Callable[..., Any]:
    """``connect(**options)``: a provider on the fake server, closed at the end."""

    def provider(**options: Any) -> aclosing[AnthropicProvider]:
        options = {"max_retries": 0, "timeout_s": 5.0, **options}
        return aclosing(AnthropicProvider(api_key=KEY, base_url=server.base_url, **options))

    return provider


def final(msg_id: str, content: list[ContentBlock], usage: Usage, status: MessageStatus) -> Message:
    return provider_support.final(msg_id, MODEL, content, usage, status)


def priced(usage: Usage) -> Usage:
    usage.cost_usd = price(usage)
    return usage


# --- the transcripts ------------------------------------------------------------


@pytest.mark.parametrize("chunk_bytes", [0, 1, 7])
async def test_text_only(server: FakeServer, connect: Any, chunk_bytes: int) -> None:
    server.enqueue(sse("text", chunk_bytes=chunk_bytes))
    async with connect() as provider:
        result = await call(provider)

    m = "msg_01XFDUDYJgAACzvnptvVoYEL"
    usage = priced(Usage(25, 15, 0, 0))
    content: list[ContentBlock] = [TextBlock("Hello, world!")]
    assert result.events == [
        ev(MessageStart(m, "assistant", MODEL)),
        ev(TextStart(m, 0)),
        ev(TextDelta(m, 0, "Hello")),
        ev(TextDelta(m, 0, ", world")),
        ev(TextDelta(m, 0, "!")),
        ev(TextEnd(m, 0)),
        ev(MessageComplete(m, "end_turn", content, usage)),
    ]
    assert result.translator.message == final(m, content, usage, "complete")
    assert result.translator.error is None

    [sent] = server.requests
    assert (sent.method, sent.path) == ("POST", "/v1/messages")
    assert sent.headers["authorization"] == f"Bearer {KEY}"  # how this SDK sends api_key
    assert sent.body == {
        "model": "claude-sonnet-4-6",
        "max_tokens": 1024,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
        "stream": True,
    }


async def test_thinking_with_signature_then_text(server: FakeServer, connect: Any) -> None:
    server.enqueue(sse("thinking_text"))
    async with connect(thinking_budget_tokens=2048) as provider:
        result = await call(provider)

    m = "msg_01Bq9w938a90dw8q7mUBWZqE"
    first = "I need to find the GCD of 1071 and 462.\n\n1071 = 2 \u00d7 462 + 147"
    second = "\n462 = 3 \u00d7 147 + 21\n147 = 7 \u00d7 21 + 0"
    sig = "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds"
    answer = "The GCD of 1071 and 462 is **21**."
    usage = priced(Usage(42, 96, cache_read_input_tokens=1024, cache_creation_input_tokens=0))
    assert usage.cost_usd == (42 * 3.0 + 96 * 15.0 + 1024 * 0.3) / 1_000_000
    content: list[ContentBlock] = [ThinkingBlock(first + second, sig), TextBlock(answer)]
    assert result.events == [
        ev(MessageStart(m, "assistant", MODEL)),
        ev(ThinkingStart(m, 0, redacted=False)),
        ev(ThinkingDelta(m, 0, first, None)),
        ev(ThinkingDelta(m, 0, second, None)),
        ev(ThinkingDelta(m, 0, "", sig)),
        ev(ThinkingEnd(m, 0, sig)),
        ev(TextStart(m, 1)),
        ev(TextDelta(m, 1, answer)),
        ev(TextEnd(m, 1)),
        ev(MessageComplete(m, "end_turn", content, usage)),
    ]
    assert result.translator.message == final(m, content, usage, "complete")
    [sent] = server.requests
    assert sent.body["thinking"] == {"type": "enabled", "budget_tokens": 2048}


async def test_text_then_two_parallel_tool_uses(server: FakeServer, connect: Any) -> None:
    server.enqueue(sse("text_tool_uses", chunk_bytes=16))
    tools = [ToolSpec("read_file", "Read a file.", {"type": "object"})]
    async with connect() as provider:
        result = await call(provider, request(tools=tools))

    m = "msg_014p7gG3wDgGV9EUtLvnow3U"
    a, b = "toolu_01T1x1fJ34qAmk2tNTrN7Up6", "toolu_01D7FLrfh4GYq7yT1ULFeyMV"
    content: list[ContentBlock] = [
        TextBlock("Let me read both files."),
        ToolUseBlock(a, "read_file", {"path": "a.txt"}),
        ToolUseBlock(b, "read_file", {"path": "b.txt"}),
    ]
    usage = priced(Usage(472, 89, 0, 0))
    assert result.events == [
        ev(MessageStart(m, "assistant", MODEL)),
        ev(TextStart(m, 0)),
        ev(TextDelta(m, 0, "Let me read")),
        ev(TextDelta(m, 0, " both files.")),
        ev(TextEnd(m, 0)),
        ev(ToolUseStart(m, 1, a, "read_file")),
        ev(ToolUseInputDelta(m, 1, a, "")),
        ev(ToolUseInputDelta(m, 1, a, '{"pa')),
        ev(ToolUseInputDelta(m, 1, a, 'th": "a')),
        ev(ToolUseInputDelta(m, 1, a, '.txt"}')),
        ev(ToolUseEnd(m, 1, a, "read_file", {"path": "a.txt"})),
        ev(ToolUseStart(m, 2, b, "read_file")),
        ev(ToolUseInputDelta(m, 2, b, "")),
        ev(ToolUseInputDelta(m, 2, b, '{"path"')),
        ev(ToolUseInputDelta(m, 2, b, ': "b.tx')),
        ev(ToolUseInputDelta(m, 2, b, 't"}')),
        ev(ToolUseEnd(m, 2, b, "read_file", {"path": "b.txt"})),
        ev(MessageComplete(m, "tool_use", content, usage)),
    ]
    assert result.translator.message == final(m, content, usage, "complete")
    [sent] = server.requests
    assert sent.body["tools"] == [
        {"name": "read_file", "description": "Read a file.", "input_schema": {"type": "object"}}
    ]


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


async def test_overloaded_error_event_mid_stream(server: FakeServer, connect: Any) -> None:
    server.enqueue(sse("overloaded_mid_stream"), sse("text"))
    async with connect(max_retries=2) as provider:
        result = await call(provider)

    m = "msg_01Ov3r1oad3dMidStr3amAaa"
    content: list[ContentBlock] = [TextBlock("Partial ans")]
    usage = priced(Usage(25, 1, 0, 0))
    assert result.events == [
        ev(MessageStart(m, "assistant", MODEL)),
        ev(TextStart(m, 0)),
        ev(TextDelta(m, 0, "Partial ans")),
        ev(TextEnd(m, 0)),
        ev(MessageComplete(m, "error", content, usage)),
    ]
    assert result.translator.message == final(m, content, usage, "error")
    assert result.raised is None  # the error event reached the translator as one
    error = result.translator.error
    assert error is not None
    assert (error.error_class, error.message) == ("overloaded", "Overloaded")
    assert len(server.requests) == 1  # the stream had begun: never retried


# --- failures before the stream ------------------------------------------------


@pytest.mark.parametrize(
    ("status", "error_type", "error_class"),
    [
        (529, "overloaded_error", "overloaded"),
        (429, "rate_limit_error", "rate_limited"),
        (500, "api_error", "api_error"),
        (503, "unknown_error", "api_error"),
        (400, "invalid_request_error", "invalid_request"),
        (401, "authentication_error", "invalid_request"),
        (404, "unknown_error", "invalid_request"),
    ],
)
async def test_status_before_streaming(
    server: FakeServer, connect: Any, status: int, error_type: str, error_class: str
) -> None:
    server.enqueue(api_error(status, error_type, "Nope"))
    async with connect(max_retries=0) as provider:
        result = await call(provider)
    assert result.events == []
    assert result.translator.message is None
    assert result.raised is not None
    assert result.raised.error_class == error_class
    assert result.raised.message == f"the model API answered {status}: Nope"
    assert len(server.requests) == 1


async def test_529_is_retried_by_the_sdk_before_streaming(server: FakeServer, connect: Any) -> None:
    overloaded = api_error(529, "overloaded_error", "Overloaded", ("retry-after-ms", "1"))
    server.enqueue(overloaded, overloaded, sse("text"))
    async with connect(max_retries=2) as provider:
        result = await call(provider)
    assert result.translator.message is not None
    assert result.translator.message.status == "complete"
    assert [r.headers["x-stainless-retry-count"] for r in server.requests] == ["0", "1", "2"]


async def test_529_after_the_last_retry_fails(server: FakeServer, connect: Any) -> None:
    overloaded = api_error(529, "overloaded_error", "Overloaded", ("retry-after-ms", "1"))
    server.enqueue(overloaded, overloaded)
    async with connect(max_retries=1) as provider:
        result = await call(provider)
    assert result.raised is not None
    assert result.raised.error_class == "overloaded"
    assert result.events == []
    assert len(server.requests) == 2


async def test_400_is_not_retried(server: FakeServer, connect: Any) -> None:
    server.enqueue(api_error(400, "invalid_request_error", "max_tokens: too large"), sse("text"))
    async with connect(max_retries=2) as provider:
        result = await call(provider)
    assert result.raised is not None
    assert result.raised.error_class == "invalid_request"
    assert result.raised.message == "the model API answered 400: max_tokens: too large"
    assert len(server.requests) == 1


async def test_nothing_listening_is_a_network_error() -> None:
    with trio.socket.socket() as sock:
        await sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, never listening: connections are refused
        provider = AnthropicProvider(
            api_key=KEY, base_url=f"http://127.0.0.1:{port}", max_retries=0
        )
        try:
            result = await call(provider)
        finally:
            await provider.aclose()
    assert result.raised is not None
    assert result.raised.error_class == "network"
    assert result.events == []


# --- failures once streaming -------------------------------------------------------


async def test_a_dropped_connection_mid_stream_is_network_and_not_retried(
    server: FakeServer, connect: Any
) -> None:
    body = transcript("anthropic/text.sse")
    cut = body.index(b'"text":", world"')  # inside the second delta's event
    server.enqueue(Replay(body, cut=Cut(cut, "drop")), sse("text"))
    async with connect(max_retries=2) as provider:
        result = await call(provider)

    m = "msg_01XFDUDYJgAACzvnptvVoYEL"
    assert result.raised is not None
    assert result.raised.error_class == "network"
    assert [e.type for e in result.events] == [
        "message.start",
        "text.start",
        "text.delta",
        "text.end",
        "message.complete",
    ]
    assert result.events[-1] == ev(
        MessageComplete(m, "error", [TextBlock("Hello")], priced(Usage(25, 1, 0, 0)))
    )
    assert len(server.requests) == 1


async def test_a_stalled_stream_times_out(server: FakeServer, connect: Any) -> None:
    body = transcript("anthropic/text.sse")
    server.enqueue(Replay(body, cut=Cut(body.index(b"event: content_block_stop"), "stall")))
    async with connect(timeout_s=0.3, max_retries=2) as provider:
        result = await call(provider)
    assert result.raised is not None
    assert result.raised.error_class == "timeout"
    assert result.translator.message is not None
    assert result.translator.message.content == [TextBlock("Hello, world!")]
    assert result.translator.message.status == "error"
    assert len(server.requests) == 1


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


async def test_closing_the_stream_early_releases_the_connection(
    server: FakeServer, connect: Any
) -> None:
    """A cancelled call closes the provider's stream mid-way; the next call still works."""
    server.enqueue(sse("text"), sse("text"))
    async with connect() as provider:
        stream = provider.stream(request())
        first = await stream.__anext__()
        await stream.aclose()
        assert isinstance(first, RawMessageStart)
        assert first.message.id == "msg_01XFDUDYJgAACzvnptvVoYEL"
        result = await call(provider)
    assert result.translator.message is not None
    assert result.translator.message.status == "complete"
    assert len(server.requests) == 2


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

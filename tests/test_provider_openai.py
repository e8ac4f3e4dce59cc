"""gateway.providers.openai against a local server that speaks Chat Completions.

Rules of these tests (as in test_provider_anthropic):
- No internet. :class:`bench.fake_api.FakeServer` replays recorded SSE chunks
  (``bench/fake_api/transcripts/openai/``, in the shapes OpenAI, vLLM, llama.cpp
  and Ollama send) byte for byte to the provider's httpx client.
- Every stream goes through the real :class:`Translator`; each test asserts
  the exact canonical events (block indices contiguous from 0, one block open
  at a time) and the final message.
- What was sent is asserted from the request the server recorded.
- Real clock with ``fail_after`` caps; retries are made fast by the server's
  ``retry-after-ms`` header.

httpx leaves its inner async generators to Trio's finalizer when a stream ends
early, and Trio warns about each with a ``ResourceWarning``; Python ignores
those by default, and these tests ignore them too (``pytestmark``).
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
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
    Usage,
)
from gateway.providers.base import ToolSpec
from gateway.providers.factory import make_provider
from gateway.providers.openai import OpenAIProvider, chat_messages
from gateway.providers.raw import RawMessageStart
from tests import provider_support
from tests.conftest import make_config
from tests.provider_support import (
    Call,
    final,
    gateway_turn,
    ignore_unfinalized_generators,
    message,
)
from tests.provider_support import server as server

pytestmark = ignore_unfinalized_generators("httpx", "httpcore", "httpx_sse")

MODEL = "openai:gpt-4o-mini"
KEY = "sk-local"
ev = stream_event
request = partial(provider_support.request, MODEL)
call = partial(provider_support.call, model=MODEL)


def sse(name: str, **kw: Any) -> Replay:
    return Replay(transcript(f"openai/{name}.sse"), **kw)


def api_error(status: int, error_type: str, text: str, *headers: tuple[str, str]) -> Json:
    body = {"error": {"message": text, "type": error_type, "param": None, "code": None}}
    return Json(status, body, headers)


@pytest.fixture
def connect(server: FakeServer) -> Callable[..., Any]:
    """``connect(**options)``: a provider on the fake server, closed at the end."""

    def provider(**options: Any) -> aclosing[OpenAIProvider]:
        options = {"api_key": KEY, "max_retries": 0, "timeout_s": 5.0, **options}
        return aclosing(OpenAIProvider(base_url=f"{server.base_url}/v1", **options))

    return provider


def message_id(result: Call) -> str:
    """The gateway's own id of the streamed message (the module docstring says why)."""
    m = result.translator.message_id
    assert m is not None and m.startswith("msg_") and m != "msg_x"
    return m


def tool_use_ids(result: Call) -> list[str]:
    """The gateway's own ids of the streamed tool uses, in order (PROTOCOL section 1)."""
    ids = [e.payload.tool_use_id for e in result.events if e.type == "tool.use_start"]
    assert all(i.startswith("tu_") for i in ids) and len(set(ids)) == len(ids), ids
    return ids


# --- the transcripts ------------------------------------------------------------


@pytest.mark.parametrize("chunk_bytes", [0, 1, 50])
async def test_text_only(server: FakeServer, connect: Any, chunk_bytes: int) -> None:
    server.enqueue(sse("text", chunk_bytes=chunk_bytes))
    async with connect() as provider:
        result = await call(provider)

    m, model = message_id(result), "openai:gpt-4o-mini-2024-07-18"
    usage = Usage(19, 4, cache_read_input_tokens=0)
    content: list[ContentBlock] = [TextBlock("Hello, world!")]
    assert result.events == [
        ev(MessageStart(m, "assistant", model)),
        ev(TextStart(m, 0)),
        ev(TextDelta(m, 0, "Hello")),
        ev(TextDelta(m, 0, ", world")),
        ev(TextDelta(m, 0, "!")),
        ev(TextEnd(m, 0)),
        ev(MessageComplete(m, "end_turn", content, usage)),
    ]
    assert result.translator.message == final(m, model, content, usage, "complete")

    [sent] = server.requests
    assert (sent.method, sent.path) == ("POST", "/v1/chat/completions")
    assert sent.headers["authorization"] == f"Bearer {KEY}"
    assert sent.headers["accept"] == "text/event-stream"
    assert sent.body == {
        "model": "gpt-4o-mini",
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 1024,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


async def test_text_then_tool_calls_in_fragments(server: FakeServer, connect: Any) -> None:
    server.enqueue(sse("text_tool_calls", chunk_bytes=64))
    tools = [ToolSpec("read_file", "Read a file.", {"type": "object"})]
    async with connect() as provider:
        result = await call(provider, request(tools=tools))

    m, model = message_id(result), "openai:gpt-4o-mini-2024-07-18"
    a, b = tool_use_ids(result)  # not the server's call_DdmO9pD3xa9XTPNJ32zg2hcA, ...
    content: list[ContentBlock] = [
        TextBlock("Let me read both files."),
        ToolUseBlock(a, "read_file", {"path": "a.txt"}),
        ToolUseBlock(b, "read_file", {"path": "b.txt"}),
    ]
    usage = Usage(180 - 128, 52, cache_read_input_tokens=128)
    assert result.events == [
        ev(MessageStart(m, "assistant", model)),
        ev(TextStart(m, 0)),
        ev(TextDelta(m, 0, "Let me read")),
        ev(TextDelta(m, 0, " both files.")),
        ev(TextEnd(m, 0)),
        ev(ToolUseStart(m, 1, a, "read_file")),
        *[ev(ToolUseInputDelta(m, 1, a, f)) for f in ['{"', "path", '":"', "a.t", 'xt"', "}"]],
        ev(ToolUseEnd(m, 1, a, "read_file", {"path": "a.txt"})),
        ev(ToolUseStart(m, 2, b, "read_file")),
        *[ev(ToolUseInputDelta(m, 2, b, f)) for f in ['{"pa', 'th":', ' "b.', 'txt"}']],
        ev(ToolUseEnd(m, 2, b, "read_file", {"path": "b.txt"})),
        ev(MessageComplete(m, "tool_use", content, usage)),
    ]
    assert result.translator.message == final(m, model, content, usage, "complete")
    [sent] = server.requests
    assert sent.body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "read_file",
                "description": "Read a file.",
                "parameters": {"type": "object"},
            },
        }
    ]


async def test_reasoning_content_then_text(server: FakeServer, connect: Any) -> None:
    server.enqueue(sse("reasoning_content"))
    async with connect() as provider:
        result = await call(provider)

    m, model = message_id(result), "openai:Qwen/Qwen3-8B"
    content: list[ContentBlock] = [
        ThinkingBlock("The user wants a greeting.", None),
        TextBlock("Hi there."),
    ]
    usage = Usage(11, 20)
    assert result.events == [
        ev(MessageStart(m, "assistant", model)),
        ev(ThinkingStart(m, 0, redacted=False)),
        ev(ThinkingDelta(m, 0, "The user wants", None)),
        ev(ThinkingDelta(m, 0, " a greeting.", None)),
        ev(ThinkingEnd(m, 0, None)),
        ev(TextStart(m, 1)),
        ev(TextDelta(m, 1, "Hi")),
        ev(TextDelta(m, 1, " there.")),
        ev(TextEnd(m, 1)),
        ev(MessageComplete(m, "end_turn", content, usage)),
    ]
    assert result.translator.message == final(m, model, content, usage, "complete")


async def test_think_tags_in_the_content_are_a_thinking_block(
    server: FakeServer, connect: Any
) -> None:
    """PROTOCOL section 6: inline ``<think>`` reasoning, tags cut across chunks, is thinking."""
    server.enqueue(sse("think_tags"))
    async with connect() as provider:
        result = await call(provider)

    m, model = message_id(result), "openai:deepseek-r1:8b"
    content: list[ContentBlock] = [
        ThinkingBlock("The user wants a greeting.\n", None),
        TextBlock("Hi there <3"),
    ]
    usage = Usage(9, 17)
    assert result.events == [
        ev(MessageStart(m, "assistant", model)),
        ev(ThinkingStart(m, 0, redacted=False)),
        ev(ThinkingDelta(m, 0, "The user", None)),
        ev(ThinkingDelta(m, 0, " wants a greeting.\n", None)),
        ev(ThinkingEnd(m, 0, None)),
        ev(TextStart(m, 1)),
        ev(TextDelta(m, 1, "Hi")),
        ev(TextDelta(m, 1, " there ")),
        ev(TextDelta(m, 1, "<3")),
        ev(TextEnd(m, 1)),
        ev(MessageComplete(m, "end_turn", content, usage)),
    ]
    assert result.translator.message == final(m, model, content, usage, "complete")


async def test_reasoning_field_and_a_whole_tool_call_that_stops(
    server: FakeServer, connect: Any
) -> None:
    """Ollama's shape: ``reasoning``, a tool call in one chunk, ``finish_reason: stop``."""
    server.enqueue(sse("reasoning_tool_call_stop"))
    async with connect() as provider:
        result = await call(provider)

    m, model = message_id(result), "openai:qwen3:8b"
    [tool] = tool_use_ids(result)  # not the server's call_k2x9q1
    content: list[ContentBlock] = [
        ThinkingBlock("Need the file.", None),
        ToolUseBlock(tool, "read_file", {"path": "notes.txt"}),
    ]
    usage = Usage(90, 25)
    assert result.events == [
        ev(MessageStart(m, "assistant", model)),
        ev(ThinkingStart(m, 0, redacted=False)),
        ev(ThinkingDelta(m, 0, "Need the file.", None)),
        ev(ThinkingEnd(m, 0, None)),
        ev(ToolUseStart(m, 1, tool, "read_file")),
        ev(ToolUseInputDelta(m, 1, tool, '{"path":"notes.txt"}')),
        ev(ToolUseEnd(m, 1, tool, "read_file", {"path": "notes.txt"})),
        ev(MessageComplete(m, "tool_use", content, usage)),
    ]


async def test_error_chunk_mid_stream(server: FakeServer, connect: Any) -> None:
    server.enqueue(sse("error_mid_stream"), sse("text"))
    async with connect(max_retries=2) as provider:
        result = await call(provider)

    m, model = message_id(result), "openai:gpt-4o-mini-2024-07-18"
    content: list[ContentBlock] = [TextBlock("Partial ans")]
    assert result.events == [
        ev(MessageStart(m, "assistant", model)),
        ev(TextStart(m, 0)),
        ev(TextDelta(m, 0, "Partial ans")),
        ev(TextEnd(m, 0)),
        ev(MessageComplete(m, "error", content, Usage())),
    ]
    assert result.raised is None  # the error chunk reached the translator as an error event
    error = result.translator.error
    assert error is not None
    assert (error.error_class, error.message) == (
        "api_error",
        "The server had an error while processing your request. Sorry about that!",
    )
    assert len(server.requests) == 1  # the stream had begun: never retried


async def test_an_error_event_from_llama_cpp(server: FakeServer, connect: Any) -> None:
    body = b'event: error\ndata: {"error":{"code":429,"message":"slots busy","type":"busy"}}\n\n'
    server.enqueue(Replay(body))
    async with connect() as provider:
        result = await call(provider)
    assert result.events == []  # failed before anything began: no message
    error = result.translator.error
    assert error is not None
    assert (error.error_class, error.message) == ("rate_limited", "slots busy")


# --- failures before the stream ------------------------------------------------


@pytest.mark.parametrize(
    ("status", "error_type", "error_class"),
    [
        (503, "unavailable_error", "overloaded"),
        (429, "rate_limit_exceeded", "rate_limited"),
        (500, "server_error", "api_error"),
        (400, "invalid_request_error", "invalid_request"),
        (404, "NotFoundError", "invalid_request"),
        (408, "timeout", "timeout"),
    ],
)
async def test_status_before_streaming(
    server: FakeServer, connect: Any, status: int, error_type: str, error_class: str
) -> None:
    server.enqueue(api_error(status, error_type, "Nope"))
    async with connect() as provider:
        result = await call(provider)
    assert result.events == []
    assert result.raised is not None
    assert (result.raised.error_class, result.raised.message) == (
        error_class,
        f"the model server answered {status}: Nope",
    )
    assert len(server.requests) == 1


async def test_503_is_retried_before_streaming(server: FakeServer, connect: Any) -> None:
    busy = api_error(503, "unavailable_error", "Loading model", ("retry-after-ms", "1"))
    server.enqueue(busy, busy, sse("text"))
    async with connect(max_retries=2) as provider:
        result = await call(provider)
    assert result.translator.message is not None
    assert result.translator.message.status == "complete"
    assert len(server.requests) == 3
    assert server.requests[0].body == server.requests[2].body


async def test_503_after_the_last_retry_fails(server: FakeServer, connect: Any) -> None:
    busy = api_error(503, "unavailable_error", "Loading model", ("retry-after-ms", "1"))
    server.enqueue(busy, busy)
    async with connect(max_retries=1) as provider:
        result = await call(provider)
    assert result.raised is not None
    assert result.raised.error_class == "overloaded"
    assert len(server.requests) == 2


async def test_400_is_not_retried(server: FakeServer, connect: Any) -> None:
    server.enqueue(api_error(400, "invalid_request_error", "bad tools"), sse("text"))
    async with connect(max_retries=2) as provider:
        result = await call(provider)
    assert result.raised is not None
    assert result.raised.error_class == "invalid_request"
    assert len(server.requests) == 1


async def test_a_server_that_ignores_stream_is_an_api_error(
    server: FakeServer, connect: Any
) -> None:
    server.enqueue(Json(200, {"id": "chatcmpl-1", "object": "chat.completion", "choices": []}))
    async with connect() as provider:
        result = await call(provider)
    assert result.raised is not None
    assert result.raised.error_class == "api_error"
    assert result.events == []


async def test_nothing_listening_is_a_network_error() -> None:
    with trio.socket.socket() as sock:
        await sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, never listening: connections are refused
        provider = OpenAIProvider(base_url=f"http://127.0.0.1:{port}/v1", max_retries=0)
        try:
            result = await call(provider)
        finally:
            await provider.aclose()
    assert result.raised is not None
    assert result.raised.error_class == "network"


# --- failures once streaming -------------------------------------------------------


async def test_a_dropped_connection_mid_stream_is_network_and_not_retried(
    server: FakeServer, connect: Any
) -> None:
    body = transcript("openai/text.sse")
    server.enqueue(Replay(body, cut=Cut(body.index(b'", world"'), "drop")), sse("text"))
    async with connect(max_retries=2) as provider:
        result = await call(provider)
    assert result.raised is not None
    assert result.raised.error_class == "network"
    assert result.translator.message is not None
    assert result.translator.message.content == [TextBlock("Hello")]
    assert result.translator.message.status == "error"
    assert len(server.requests) == 1


async def test_a_stream_that_ends_without_finish_reason_is_network(
    server: FakeServer, connect: Any
) -> None:
    body = transcript("openai/text.sse")
    server.enqueue(Replay(body[: body.index(b'data: {"id":"chatcmpl-AQ3x1vZ9"', 900)]))
    async with connect() as provider:
        result = await call(provider)
    assert result.raised is not None
    assert (result.raised.error_class, result.raised.message) == (
        "network",
        "the model stream ended before its finish_reason",
    )
    assert result.translator.message is not None
    assert result.translator.message.status == "error"


async def test_a_stalled_stream_times_out(server: FakeServer, connect: Any) -> None:
    body = transcript("openai/text.sse")
    server.enqueue(Replay(body, cut=Cut(body.index(b'"finish_reason":"stop"'), "stall")))
    async with connect(timeout_s=0.3) as provider:
        result = await call(provider)
    assert result.raised is not None
    assert result.raised.error_class == "timeout"
    assert result.translator.message is not None
    assert result.translator.message.content == [TextBlock("Hello, world!")]


async def test_interleaved_tool_calls_fail_the_call(server: FakeServer, connect: Any) -> None:
    def chunk(index: int, **function: str) -> bytes:
        call = {"index": index, "function": function}
        if "name" in function:
            call["id"] = f"call_{index}"
        delta = {"choices": [{"index": 0, "delta": {"tool_calls": [call]}}]}
        return b"data: " + msgspec.json.encode(delta) + b"\n\n"

    body = (
        chunk(0, name="sleep", arguments="{")
        + chunk(1, name="sleep", arguments="{")
        + chunk(0, arguments="}")
    )
    server.enqueue(Replay(body))
    async with connect() as provider:
        result = await call(provider)
    assert result.raised is not None
    assert (result.raised.error_class, result.raised.message) == (
        "api_error",
        "tool call 0 resumed after another block began",
    )
    assert [e.type for e in result.events] == [
        "message.start",
        "tool.use_start",
        "tool.use_input_delta",
        "tool.use_end",
        "tool.use_start",
        "tool.use_input_delta",
        "tool.use_end",
        "message.complete",
    ]


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
        assert first.message.model == "openai:gpt-4o-mini-2024-07-18"
        result = await call(provider)
    assert result.translator.message is not None
    assert result.translator.message.status == "complete"
    assert len(server.requests) == 2


# --- the conversation sent ----------------------------------------------------------


def test_chat_messages_map_the_history_to_roles() -> None:
    history = [
        message("user", TextBlock("Read a and b")),
        message(
            "assistant",
            ThinkingBlock("Both files.", "sig"),
            RedactedThinkingBlock("opaque"),
            TextBlock("Reading."),
            ToolUseBlock("call_1", "read_file", {"path": "a"}),
            ToolUseBlock("call_2", "read_file", {"path": "b"}),
        ),
        message(
            "user",
            ToolResultBlock("call_2", "no such file: b", is_error=True),
            ToolResultBlock("call_1", "alpha"),
        ),
        message("assistant", ToolUseBlock("call_3", "sleep", {}), status="cancelled"),
        message("user", TextBlock("Thanks")),
    ]
    req = msgspec.structs.replace(request(*history), system="Be brief.")
    assert chat_messages(req) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Read a and b"},
        {
            "role": "assistant",
            "content": "Reading.",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "read_file", "arguments": '{"path":"a"}'},
                },
                {
                    "id": "call_2",
                    "type": "function",
                    "function": {"name": "read_file", "arguments": '{"path":"b"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "alpha"},
        {"role": "tool", "tool_call_id": "call_2", "content": "Error: no such file: b"},
        {"role": "user", "content": "Thanks"},
    ]


def test_an_assistant_message_of_tool_calls_alone_has_null_content() -> None:
    history = [
        message("user", TextBlock("Wait")),
        message("assistant", ToolUseBlock("call_1", "sleep", {"seconds": 1})),
        message("user", ToolResultBlock("call_1", "slept 1 s")),
    ]
    assert chat_messages(request(*history))[1] == {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "sleep", "arguments": '{"seconds":1}'},
            }
        ],
    }


# --- a full tool loop through the gateway --------------------------------------------


def gateway_config(store: Path, server: FakeServer) -> Config:
    """A gateway on the fake server with ``read_file``, its store in ``store`` (made here)."""
    store.mkdir()
    return make_config(
        store,
        **{
            "model.provider": "openai",
            "model.name": MODEL,
            "model.base_url": f"{server.base_url}/v1",
            "model.max_retries": 0,
            "tools.enabled": ["read_file"],
        },
    )


async def test_tool_loop_sends_tool_calls_and_tool_messages(
    tmp_path: Path, server: FakeServer
) -> None:
    (tmp_path / "a.txt").write_text("alpha")  # b.txt does not exist
    server.enqueue(sse("text_tool_calls"), sse("text"))
    config = gateway_config(tmp_path / "store", server)
    provider = make_provider(config, {"OPENAI_API_KEY": KEY})
    assert isinstance(provider, OpenAIProvider)
    events, [spec] = await gateway_turn(config, provider, tmp_path, "Compare a and b.")

    assert events[-1].type == "turn.completed"
    assert events[-1].payload.stop_reason == "end_turn"
    a, b = (e.payload.tool_use_id for e in events if e.type == "tool.called")
    assert a.startswith("tu_") and b.startswith("tu_") and a != b
    first, second = server.requests
    assert first.headers["authorization"] == f"Bearer {KEY}"
    tools = [
        {
            "type": "function",
            "function": {
                "name": "read_file",
                "description": spec.description,
                "parameters": spec.input_schema,
            },
        }
    ]
    user = {"role": "user", "content": "Compare a and b."}
    assert first.body["messages"] == [user]
    assert second.body == {
        "model": "gpt-4o-mini",
        "max_tokens": 4096,
        "stream": True,
        "stream_options": {"include_usage": True},
        "tools": tools,
        "messages": [
            user,
            {
                "role": "assistant",
                "content": "Let me read both files.",
                "tool_calls": [
                    {
                        "id": a,
                        "type": "function",
                        "function": {"name": "read_file", "arguments": '{"path":"a.txt"}'},
                    },
                    {
                        "id": b,
                        "type": "function",
                        "function": {"name": "read_file", "arguments": '{"path":"b.txt"}'},
                    },
                ],
            },
            {"role": "tool", "tool_call_id": a, "content": "alpha"},
            {
                "role": "tool",
                "tool_call_id": b,
                "content": "Error: no such file: b.txt",
            },
        ],
    }


def stream_of(*deltas: dict[str, Any], finish: str) -> Replay:
    """A Chat Completions stream of these deltas, then ``finish``, usage and ``[DONE]``."""
    chunks = [{"model": "llama3.2", "choices": [{"index": 0, "delta": d}]} for d in deltas]
    chunks.append(
        {"model": "llama3.2", "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]}
    )
    chunks.append(
        {"model": "llama3.2", "choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 3}}
    )
    body = b"".join(b"data: " + msgspec.json.encode(c) + b"\n\n" for c in chunks)
    return Replay(body + b"data: [DONE]\n\n")


def read(index: int, path: str) -> dict[str, Any]:
    """A whole tool call in one delta, under the id this server gives every call: ``call_0``."""
    function = {"name": "read_file", "arguments": msgspec.json.encode({"path": path}).decode()}
    return {
        "tool_calls": [{"index": index, "id": "call_0", "type": "function", "function": function}]
    }


async def test_a_server_that_repeats_tool_call_ids_still_gets_unique_pairs(
    tmp_path: Path, server: FakeServer
) -> None:
    """PROTOCOL section 1: tool use ids are unique within the gateway, whatever the server sends."""
    (tmp_path / "a.txt").write_text("alpha")  # b.txt does not exist
    server.enqueue(
        stream_of(read(0, "a.txt"), read(1, "b.txt"), finish="tool_calls"),
        stream_of(read(0, "a.txt"), finish="tool_calls"),
        stream_of({"content": "Done."}, finish="stop"),
    )
    config = gateway_config(tmp_path / "store", server)
    provider = make_provider(config, {})
    assert isinstance(provider, OpenAIProvider)
    events, _ = await gateway_turn(config, provider, tmp_path, "Read a and b, then a again.")

    assert events[-1].payload.stop_reason == "end_turn"
    called = [e.payload.tool_use_id for e in events if e.type == "tool.called"]
    assert len(called) == len(set(called)) == 3 and all(i.startswith("tu_") for i in called)
    for kind in ("tool.use_start", "tool.use_end"):
        assert [e.payload.tool_use_id for e in events if e.type == kind] == called
    outcomes = {
        e.payload.tool_use_id: e.type for e in events if e.type in ("tool.completed", "tool.failed")
    }
    assert outcomes == {
        called[0]: "tool.completed",
        called[1]: "tool.failed",
        called[2]: "tool.completed",
    }

    third = server.requests[2].body["messages"]
    sent = [
        (m["role"], [c["id"] for c in m.get("tool_calls", [])] or m.get("tool_call_id"))
        for m in third[1:]
    ]
    first, second, again = called
    assert sent == [
        ("assistant", [first, second]),
        ("tool", first),
        ("tool", second),
        ("assistant", [again]),
        ("tool", again),
    ]
    assert [m["content"] for m in third if m["role"] == "tool"] == [
        "alpha",
        "Error: no such file: b.txt",
        "alpha",
    ]


def test_factory_needs_no_key_for_a_local_server(tmp_path: Path) -> None:
    config = make_config(tmp_path, **{"model.provider": "openai", "model.name": "openai:llama3.2"})
    assert isinstance(make_provider(config, {}), OpenAIProvider)

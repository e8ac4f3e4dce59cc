"""gateway.providers.openai against a local server that speaks Chat Completions.

What every provider does (text, thinking, tool uses as partial JSON, usage,
errors as error classes, retries, a broken stream, closing a stream early, a
refusal as too long) is tested once for all in
tests/integration/providers/test_provider_contract.py; this module holds what only
this provider does.

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
from functools import partial
from pathlib import Path
from typing import Any

import msgspec
import pytest

from bench.fake_api import FakeServer, Json, Replay, transcript
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
from gateway.providers.factory import make_provider
from gateway.providers.openai import OpenAIProvider, chat_messages
from tests import provider_support
from tests.conftest import make_config
from tests.provider_support import (
    OPENAI,
    Call,
    final,
    gateway_turn,
    ignore_unfinalized_generators,
    message,
)
from tests.provider_support import server as server

pytestmark = ignore_unfinalized_generators("httpx", "httpcore", "httpx_sse")

MODEL = OPENAI.model
KEY = OPENAI.key
ev = stream_event
request = partial(provider_support.request, MODEL)
call = partial(provider_support.call, model=MODEL)
sse = OPENAI.sse


@pytest.fixture
def connect(server: FakeServer) -> Callable[..., Any]:
    """``connect(**options)``: a provider on the fake server, closed at the end."""
    return partial(OPENAI.connect, server)


def message_id(result: Call) -> str:
    """The gateway's own id of the streamed message (the module docstring says why)."""
    m = result.translator.message_id
    assert m is not None and m.startswith("msg_") and m != "msg_x"
    return m


def tool_use_ids(result: Call) -> list[str]:
    """The gateway's own ids of the streamed tool uses, in order (docs/protocol.md §1)."""
    ids = [e.payload.tool_use_id for e in result.events if e.type == "tool.use_start"]
    assert all(i.startswith("tu_") for i in ids) and len(set(ids)) == len(ids), ids
    return ids


# --- the transcripts (the shared ones: tests/integration/providers/test_provider_contract.py) -----


async def test_think_tags_in_the_content_are_a_thinking_block(
    server: FakeServer, connect: Any
) -> None:
    """docs/protocol.md §6: inline ``<think>`` reasoning, tags cut across chunks, is thinking."""
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


async def test_a_server_that_ignores_stream_is_an_api_error(
    server: FakeServer, connect: Any
) -> None:
    server.enqueue(Json(200, {"id": "chatcmpl-1", "object": "chat.completion", "choices": []}))
    async with connect() as provider:
        result = await call(provider)
    assert result.raised is not None
    assert result.raised.error_class == "api_error"
    assert result.events == []


# --- failures once streaming -------------------------------------------------------


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
    """docs/protocol.md §1: tool use ids are unique in the gateway, whatever the server sends."""
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

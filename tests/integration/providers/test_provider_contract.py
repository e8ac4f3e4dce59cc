"""The contract every model provider keeps, run against each of them (docs/protocol.md §5).

A provider turns one call into the raw events the translator reads: text,
thinking, tool uses whose input arrives as partial JSON, the usage, and the
failures as error classes. Each test here is one clause of that contract,
parametrised over the providers that keep it:

- ``anthropic`` and ``openai`` on :class:`bench.fake_api.FakeServer`, which
  replays their recorded transcripts byte for byte (no internet): their real
  HTTP clients, SSE parsers and retry policies are in the loop;
- ``scripted``, the built-in model, made to say the same by a script, where
  the clause is about what reaches the translator rather than about HTTP.

Every stream goes through the real :class:`Translator`, as in the session, and
each test asserts the exact canonical events and the final message; what a
provider said in its own words (its ids, chunking, usage, model name) is in the
tables of expectations below. What only one provider does (its history
mapping, its own stream shapes, its configuration) is tested in its module:
test_provider_anthropic.py, test_provider_openai.py, test_scripted.py.

Real clock with ``fail_after`` caps; retries are made fast by the server's
``retry-after-ms`` header, and no backoff is waited out.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import pytest
import trio

from bench.fake_api import Cut, FakeServer, Json, Replay, context_length_exceeded, prompt_too_long
from bench.fake_api import transcript as recorded
from gateway.protocol.events import (
    MessageComplete,
    MessageStart,
    StreamEvent,
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
from gateway.protocol.shapes import ContentBlock, TextBlock, ThinkingBlock, ToolUseBlock, Usage
from gateway.providers.base import ModelRequest, Provider, ToolSpec
from gateway.providers.raw import RawMessageStart
from gateway.providers.scripted import ScriptedProvider
from tests import provider_support
from tests.provider_support import (
    ANTHROPIC,
    OPENAI,
    Call,
    HttpProvider,
    final,
    ignore_unfinalized_generators,
    message,
    priced,
)
from tests.provider_support import server as server

pytestmark = ignore_unfinalized_generators(
    "anthropic", "httpx2", "httpcore2", "httpx", "httpcore", "httpx_sse"
)

ev = stream_event
HTTP = {"anthropic": ANTHROPIC, "openai": OPENAI}
SCRIPTED_MODEL = "scripted:test"
READ_FILE = [ToolSpec("read_file", "Read a file.", {"type": "object"})]


@dataclass
class Subject:
    """One provider under test, and how to make it say a scenario."""

    name: str
    server: FakeServer

    @property
    def http(self) -> HttpProvider:
        return HTTP[self.name]

    @property
    def model(self) -> str:
        return SCRIPTED_MODEL if self.name == "scripted" else self.http.model

    @asynccontextmanager
    async def open(self, **options: Any) -> AsyncIterator[Provider]:
        """The provider (on the fake server for HTTP), closed at the end."""
        if self.name == "scripted":
            yield ScriptedProvider()
            return
        async with self.http.connect(self.server, **options) as provider:
            yield provider

    def request(self, script: dict[str, Any] | None = None, **kw: Any) -> ModelRequest:
        """The call: "Hi" to an HTTP provider, the script's JSON to the scripted one."""
        if script is None or self.name != "scripted":
            return provider_support.request(self.model, **kw)
        said = message("user", TextBlock(json.dumps({"script": script})))
        return provider_support.request(self.model, said, **kw)

    async def call(self, req: ModelRequest | None = None, **options: Any) -> Call:
        async with self.open(**options) as provider:
            pricing = None if self.name == "scripted" else self.http.pricing
            return await provider_support.call(
                provider, req or self.request(), model=self.model, pricing=pricing
            )


@pytest.fixture
def subject(request: pytest.FixtureRequest, server: FakeServer) -> Subject:
    return Subject(request.param, server)


def subjects(*names: str) -> pytest.MarkDecorator:
    """Parametrise a test's ``subject`` over these providers."""
    return pytest.mark.parametrize("subject", names, indirect=True)


BOTH_HTTP = subjects("anthropic", "openai")
EVERY = subjects("anthropic", "openai", "scripted")


def tokens(text: str) -> int:
    """The scripted model's count: a token per four characters."""
    return math.ceil(len(text) / 4)


def script_chars(req: ModelRequest) -> int:
    [said] = req.messages
    [block] = said.content
    assert isinstance(block, TextBlock)
    return len(block.text)


def own_message_id(result: Call) -> str:
    """The gateway's own id of the streamed message (where the provider names none)."""
    m = result.translator.message_id
    assert m is not None and m.startswith("msg_") and m != "msg_x"
    return m


def tool_use_ids(result: Call) -> list[str]:
    """The ids of the streamed tool uses, in order, all distinct (docs/protocol.md §1)."""
    ids = [e.payload.tool_use_id for e in result.events if e.type == "tool.use_start"]
    assert len(set(ids)) == len(ids), ids
    return ids


def text_events(m: str, index: int, deltas: list[str]) -> list[StreamEvent]:
    return [
        ev(TextStart(m, index)),
        *[ev(TextDelta(m, index, d)) for d in deltas],
        ev(TextEnd(m, index)),
    ]


# --- text ------------------------------------------------------------------------


@dataclass
class Text:
    """What a provider says for "Hello, world!"."""

    message_id: str | None  # None: the gateway's own id
    model: str
    deltas: list[str]
    usage: Usage


TEXT = {
    "anthropic": Text(
        "msg_01XFDUDYJgAACzvnptvVoYEL",
        ANTHROPIC.model,
        ["Hello", ", world", "!"],
        priced(Usage(25, 15, 0, 0)),
    ),
    "openai": Text(
        None,
        "openai:gpt-4o-mini-2024-07-18",
        ["Hello", ", world", "!"],
        Usage(19, 4, cache_read_input_tokens=0),
    ),
    "scripted": Text(None, SCRIPTED_MODEL, ["Hello, ", "world!"], Usage()),
}

# What an HTTP provider sent for "Hi": (path, headers, body).
TEXT_SENT: dict[str, tuple[str, dict[str, str], dict[str, Any]]] = {
    "anthropic": (
        "/v1/messages",
        {"authorization": f"Bearer {ANTHROPIC.key}"},  # how this SDK sends api_key
        {
            "model": "claude-sonnet-4-6",
            "max_tokens": 1024,
            "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
            "stream": True,
        },
    ),
    "openai": (
        "/v1/chat/completions",
        {"authorization": f"Bearer {OPENAI.key}", "accept": "text/event-stream"},
        {
            "model": "gpt-4o-mini",
            "messages": [{"role": "user", "content": "Hi"}],
            "max_tokens": 1024,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    ),
}


def say_text(subject: Subject, **replay: Any) -> ModelRequest:
    if subject.name == "scripted":
        return subject.request({"rounds": [[{"text": "Hello, world!"}]]})
    subject.server.enqueue(subject.http.sse("text", **replay))
    return subject.request()


@pytest.mark.parametrize(
    ("subject", "chunk_bytes"),
    [(name, size) for name in HTTP for size in (0, 1, 7, 50)] + [("scripted", 0)],
    indirect=["subject"],
)
async def test_text(subject: Subject, chunk_bytes: int) -> None:
    req = say_text(subject, chunk_bytes=chunk_bytes)
    result = await subject.call(req)

    expected = TEXT[subject.name]
    m = expected.message_id or own_message_id(result)
    usage = expected.usage
    if subject.name == "scripted":
        usage = Usage(tokens("x" * script_chars(req)), tokens("Hello, world!"))
    content: list[ContentBlock] = [TextBlock("Hello, world!")]
    assert result.events == [
        ev(MessageStart(m, "assistant", expected.model)),
        *text_events(m, 0, expected.deltas),
        ev(MessageComplete(m, "end_turn", content, usage)),
    ]
    assert result.translator.message == final(m, expected.model, content, usage, "complete")
    assert result.translator.error is None
    if subject.name != "scripted":
        path, headers, body = TEXT_SENT[subject.name]
        [sent] = subject.server.requests
        assert (sent.method, sent.path) == ("POST", path)
        assert {name: sent.headers[name] for name in headers} == headers
        assert sent.body == body


# --- tool uses, their input as partial JSON ----------------------------------------


@dataclass
class ToolUses:
    """What a provider says for "Let me read both files." and two ``read_file`` calls."""

    message_id: str | None
    model: str
    tool_use_ids: tuple[str, str] | None  # None: the gateway's own ids
    fragments: tuple[list[str], list[str]]
    usage: Usage


TOOL_USES = {
    "anthropic": ToolUses(
        "msg_014p7gG3wDgGV9EUtLvnow3U",
        ANTHROPIC.model,
        ("toolu_01T1x1fJ34qAmk2tNTrN7Up6", "toolu_01D7FLrfh4GYq7yT1ULFeyMV"),
        (["", '{"pa', 'th": "a', '.txt"}'], ["", '{"path"', ': "b.tx', 't"}']),
        priced(Usage(472, 89, 0, 0)),
    ),
    "openai": ToolUses(
        None,  # not the server's call_DdmO9pD3xa9XTPNJ32zg2hcA, ...
        "openai:gpt-4o-mini-2024-07-18",
        None,
        (['{"', "path", '":"', "a.t", 'xt"', "}"], ['{"pa', 'th":', ' "b.', 'txt"}']),
        Usage(180 - 128, 52, cache_read_input_tokens=128),
    ),
    "scripted": ToolUses(
        None,
        SCRIPTED_MODEL,
        None,
        (['{"path":', '"a.txt"}'], ['{"path":', '"b.txt"}']),  # 8 characters at a time
        Usage(),
    ),
}

TOOLS_SENT = {
    "anthropic": [
        {"name": "read_file", "description": "Read a file.", "input_schema": {"type": "object"}}
    ],
    "openai": [
        {
            "type": "function",
            "function": {
                "name": "read_file",
                "description": "Read a file.",
                "parameters": {"type": "object"},
            },
        }
    ],
}


def say_tool_uses(subject: Subject) -> ModelRequest:
    if subject.name == "scripted":
        read = [
            {"tool_use": {"name": "read_file", "input": {"path": p}}} for p in ("a.txt", "b.txt")
        ]
        return subject.request({"rounds": [[{"text": "Let me read both files."}, *read]]})
    transcript, chunk_bytes = {
        "anthropic": ("text_tool_uses", 16),
        "openai": ("text_tool_calls", 64),
    }[subject.name]
    subject.server.enqueue(subject.http.sse(transcript, chunk_bytes=chunk_bytes))
    return subject.request(tools=READ_FILE)


@EVERY
async def test_text_then_two_tool_uses_in_partial_json(subject: Subject) -> None:
    req = say_tool_uses(subject)
    result = await subject.call(req)

    expected = TOOL_USES[subject.name]
    m = expected.message_id or own_message_id(result)
    a, b = expected.tool_use_ids or tool_use_ids(result)
    if subject.name == "openai":
        assert a.startswith("tu_") and b.startswith("tu_")
    content: list[ContentBlock] = [
        TextBlock("Let me read both files."),
        ToolUseBlock(a, "read_file", {"path": "a.txt"}),
        ToolUseBlock(b, "read_file", {"path": "b.txt"}),
    ]
    usage = expected.usage
    text_deltas = ["Let me read", " both files."]
    if subject.name == "scripted":
        text_deltas = ["Let ", "me ", "read ", "both ", "files."]
        said = "Let me read both files." + '{"path":"a.txt"}' * 2
        usage = Usage(tokens("x" * script_chars(req)), tokens(said))
    fragments_a, fragments_b = expected.fragments
    assert result.events == [
        ev(MessageStart(m, "assistant", expected.model)),
        *text_events(m, 0, text_deltas),
        ev(ToolUseStart(m, 1, a, "read_file")),
        *[ev(ToolUseInputDelta(m, 1, a, f)) for f in fragments_a],
        ev(ToolUseEnd(m, 1, a, "read_file", {"path": "a.txt"})),
        ev(ToolUseStart(m, 2, b, "read_file")),
        *[ev(ToolUseInputDelta(m, 2, b, f)) for f in fragments_b],
        ev(ToolUseEnd(m, 2, b, "read_file", {"path": "b.txt"})),
        ev(MessageComplete(m, "tool_use", content, usage)),
    ]
    assert result.translator.message == final(m, expected.model, content, usage, "complete")
    if subject.name != "scripted":
        [sent] = subject.server.requests
        assert sent.body["tools"] == TOOLS_SENT[subject.name]


# --- thinking ------------------------------------------------------------------------


@dataclass
class Thinking:
    """What a provider says for a piece of reasoning, then its answer."""

    message_id: str | None
    model: str
    thinking: list[str]
    signature: str | None
    text: list[str]
    usage: Usage


THINKING = {
    "anthropic": Thinking(
        "msg_01Bq9w938a90dw8q7mUBWZqE",
        ANTHROPIC.model,
        [
            "I need to find the GCD of 1071 and 462.\n\n1071 = 2 \u00d7 462 + 147",
            "\n462 = 3 \u00d7 147 + 21\n147 = 7 \u00d7 21 + 0",
        ],
        "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds",
        ["The GCD of 1071 and 462 is **21**."],
        priced(Usage(42, 96, cache_read_input_tokens=1024, cache_creation_input_tokens=0)),
    ),
    "openai": Thinking(
        None,
        "openai:Qwen/Qwen3-8B",
        ["The user wants", " a greeting."],
        None,
        ["Hi", " there."],
        Usage(11, 20),
    ),
    "scripted": Thinking(
        None,
        SCRIPTED_MODEL,
        ["The ", "user ", "wants ", "a ", "greeting."],
        "sig_" + hashlib.sha256(b"The user wants a greeting.").hexdigest()[:32],
        ["Hi ", "there."],
        Usage(),
    ),
}


def say_thinking(subject: Subject) -> tuple[ModelRequest, dict[str, Any]]:
    """The call, and the options of the provider that makes it."""
    if subject.name == "scripted":
        said = [{"thinking": "The user wants a greeting."}, {"text": "Hi there."}]
        return subject.request({"rounds": [said]}), {}
    if subject.name == "anthropic":
        subject.server.enqueue(subject.http.sse("thinking_text"))
        return subject.request(), {"thinking_budget_tokens": 2048}
    subject.server.enqueue(subject.http.sse("reasoning_content"))
    return subject.request(), {}


@EVERY
async def test_thinking_then_text(subject: Subject) -> None:
    req, options = say_thinking(subject)
    result = await subject.call(req, **options)

    expected = THINKING[subject.name]
    m = expected.message_id or own_message_id(result)
    sig = expected.signature
    usage = expected.usage
    if subject.name == "scripted":
        said = "The user wants a greeting." + "Hi there."
        usage = Usage(tokens("x" * script_chars(req)), tokens(said))
    if subject.name == "anthropic":
        assert usage.cost_usd == (42 * 3.0 + 96 * 15.0 + 1024 * 0.3) / 1_000_000
    content: list[ContentBlock] = [
        ThinkingBlock("".join(expected.thinking), sig),
        TextBlock("".join(expected.text)),
    ]
    assert result.events == [
        ev(MessageStart(m, "assistant", expected.model)),
        ev(ThinkingStart(m, 0, redacted=False)),
        *[ev(ThinkingDelta(m, 0, d, None)) for d in expected.thinking],
        *([ev(ThinkingDelta(m, 0, "", sig))] if sig is not None else []),
        ev(ThinkingEnd(m, 0, sig)),
        *text_events(m, 1, expected.text),
        ev(MessageComplete(m, "end_turn", content, usage)),
    ]
    assert result.translator.message == final(m, expected.model, content, usage, "complete")
    if subject.name == "anthropic":
        [sent] = subject.server.requests
        assert sent.body["thinking"] == {"type": "enabled", "budget_tokens": 2048}


# --- an error once streaming: the error class, never retried ---------------------


@dataclass
class MidStreamError:
    """What a provider says for "Partial ans" then an error event."""

    message_id: str | None
    model: str
    usage: Usage
    error_class: str
    message: str


MID_STREAM_ERROR = {
    "anthropic": MidStreamError(
        "msg_01Ov3r1oad3dMidStr3amAaa",
        ANTHROPIC.model,
        priced(Usage(25, 1, 0, 0)),
        "overloaded",
        "Overloaded",
    ),
    "openai": MidStreamError(
        None,
        "openai:gpt-4o-mini-2024-07-18",
        Usage(),
        "api_error",
        "The server had an error while processing your request. Sorry about that!",
    ),
    "scripted": MidStreamError(
        None, SCRIPTED_MODEL, Usage(), "overloaded", "scripted overloaded after 2 deltas"
    ),
}


@EVERY
async def test_an_error_event_mid_stream_fails_the_message_with_its_class(
    subject: Subject,
) -> None:
    if subject.name == "scripted":
        req = subject.request(
            {
                "rounds": [[{"text": "Partial ans wer"}]],
                "fail": {"round": 0, "after_deltas": 2, "error_class": "overloaded"},
            }
        )
    else:
        transcript = {"anthropic": "overloaded_mid_stream", "openai": "error_mid_stream"}
        subject.server.enqueue(subject.http.sse(transcript[subject.name]), subject.http.sse("text"))
        req = subject.request()
    result = await subject.call(req, **({} if subject.name == "scripted" else {"max_retries": 2}))

    expected = MID_STREAM_ERROR[subject.name]
    m = expected.message_id or own_message_id(result)
    usage = expected.usage
    deltas = ["Partial ans"]
    if subject.name == "scripted":
        deltas = ["Partial ", "ans "]
        usage = Usage(tokens("x" * script_chars(req)))
    content: list[ContentBlock] = [TextBlock("".join(deltas))]
    assert result.events == [
        ev(MessageStart(m, "assistant", expected.model)),
        *text_events(m, 0, deltas),
        ev(MessageComplete(m, "error", content, usage)),
    ]
    assert result.translator.message == final(m, expected.model, content, usage, "error")
    assert result.raised is None  # the error event reached the translator as one
    error = result.translator.error
    assert error is not None
    assert (error.error_class, error.message) == (expected.error_class, expected.message)
    if subject.name != "scripted":
        assert len(subject.server.requests) == 1  # the stream had begun: never retried


# --- failures before the stream ------------------------------------------------


@pytest.mark.parametrize(
    ("subject", "status", "error_type", "error_class"),
    [
        ("anthropic", 529, "overloaded_error", "overloaded"),
        ("anthropic", 429, "rate_limit_error", "rate_limited"),
        ("anthropic", 500, "api_error", "api_error"),
        ("anthropic", 503, "unknown_error", "api_error"),
        ("anthropic", 400, "invalid_request_error", "invalid_request"),
        ("anthropic", 401, "authentication_error", "invalid_request"),
        ("anthropic", 404, "unknown_error", "invalid_request"),
        ("openai", 503, "unavailable_error", "overloaded"),
        ("openai", 429, "rate_limit_exceeded", "rate_limited"),
        ("openai", 500, "server_error", "api_error"),
        ("openai", 400, "invalid_request_error", "invalid_request"),
        ("openai", 404, "NotFoundError", "invalid_request"),
        ("openai", 408, "timeout", "timeout"),
    ],
    indirect=["subject"],
)
async def test_a_status_before_streaming_is_its_error_class(
    subject: Subject, status: int, error_type: str, error_class: str
) -> None:
    subject.server.enqueue(subject.http.api_error(status, error_type, "Nope"))
    result = await subject.call()
    assert result.events == []
    assert result.translator.message is None
    assert result.raised is not None
    assert (result.raised.error_class, result.raised.message) == (
        error_class,
        f"{subject.http.answered} {status}: Nope",
    )
    assert len(subject.server.requests) == 1


# The "busy" refusal each retries before streaming: its status and error type.
BUSY = {"anthropic": (529, "overloaded_error"), "openai": (503, "unavailable_error")}


@BOTH_HTTP
async def test_busy_is_retried_before_streaming(subject: Subject) -> None:
    status, error_type = BUSY[subject.name]
    busy = subject.http.api_error(status, error_type, "Busy", ("retry-after-ms", "1"))
    subject.server.enqueue(busy, busy, subject.http.sse("text"))
    result = await subject.call(max_retries=2)
    assert result.translator.message is not None
    assert result.translator.message.status == "complete"
    sent = subject.server.requests
    assert len(sent) == 3
    assert sent[0].body == sent[2].body
    if subject.name == "anthropic":  # the SDK's retries, as it counts them
        assert [r.headers["x-stainless-retry-count"] for r in sent] == ["0", "1", "2"]


@BOTH_HTTP
async def test_busy_after_the_last_retry_fails(subject: Subject) -> None:
    status, error_type = BUSY[subject.name]
    busy = subject.http.api_error(status, error_type, "Busy", ("retry-after-ms", "1"))
    subject.server.enqueue(busy, busy)
    result = await subject.call(max_retries=1)
    assert result.raised is not None
    assert result.raised.error_class == "overloaded"
    assert result.events == []
    assert len(subject.server.requests) == 2


@BOTH_HTTP
async def test_400_is_not_retried(subject: Subject) -> None:
    refusal = subject.http.api_error(400, "invalid_request_error", "max_tokens: too large")
    subject.server.enqueue(refusal, subject.http.sse("text"))
    result = await subject.call(max_retries=2)
    assert result.raised is not None
    assert (result.raised.error_class, result.raised.message) == (
        "invalid_request",
        f"{subject.http.answered} 400: max_tokens: too large",
    )
    assert len(subject.server.requests) == 1


@BOTH_HTTP
async def test_nothing_listening_is_a_network_error(subject: Subject) -> None:
    with trio.socket.socket() as sock:
        await sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, never listening: connections are refused
        provider = subject.http.make(f"http://127.0.0.1:{port}", max_retries=0)
        try:
            result = await subject.http.call(provider)
        finally:
            await provider.aclose()
    assert result.raised is not None
    assert result.raised.error_class == "network"
    assert result.events == []


# --- overflow: a refusal as too long, told apart from any other (docs/protocol.md §12) ---


@pytest.mark.parametrize(
    ("subject", "reply", "overflow"),
    [
        ("anthropic", prompt_too_long(), True),
        (
            "anthropic",
            ANTHROPIC.api_error(400, "invalid_request_error", "max_tokens: too big"),
            False,
        ),
        ("anthropic", ANTHROPIC.api_error(413, "request_too_large", "prompt is too long"), False),
        ("openai", context_length_exceeded(), True),
        (
            "openai",
            Json(
                400,
                {
                    "error": {
                        "message": "This model's maximum context length is 4096 tokens",
                        "type": "BadRequestError",
                        "code": 400,
                    }
                },
            ),
            True,
        ),
        (
            "openai",
            Json(
                400,
                {
                    "error": {
                        "message": "bad tool schema",
                        "type": "invalid_request_error",
                        "code": "invalid_value",
                    }
                },
            ),
            False,
        ),
        ("scripted", None, True),
    ],
    indirect=["subject"],
)
async def test_a_refusal_as_too_long_is_context_overflow(
    subject: Subject, reply: Json | None, overflow: bool
) -> None:
    if reply is None:
        req = subject.request({"overflow": True, "rounds": [[{"text": "fits now"}]]})
    else:
        subject.server.enqueue(reply)
        req = subject.request()
    result = await subject.call(req)
    assert result.raised is not None
    assert (result.raised.error_class, result.raised.context_overflow) == (
        "invalid_request",
        overflow,
    )
    assert result.events == []


# --- failures once streaming -------------------------------------------------------


@dataclass
class Broken:
    """Where a provider's "Hello, world!" transcript is cut, and what was said by then."""

    drop_at: bytes  # inside the second delta
    stall_at: bytes  # after the last delta
    usage_at_drop: Usage


BROKEN = {
    "anthropic": Broken(
        b'"text":", world"', b"event: content_block_stop", priced(Usage(25, 1, 0, 0))
    ),
    "openai": Broken(b'", world"', b'"finish_reason":"stop"', Usage()),
}


@BOTH_HTTP
async def test_a_dropped_connection_mid_stream_is_network_and_not_retried(
    subject: Subject,
) -> None:
    body = recorded(f"{subject.name}/text.sse")
    cut = Cut(body.index(BROKEN[subject.name].drop_at), "drop")
    subject.server.enqueue(Replay(body, cut=cut), subject.http.sse("text"))
    result = await subject.call(max_retries=2)

    expected = TEXT[subject.name]
    m = expected.message_id or own_message_id(result)
    content: list[ContentBlock] = [TextBlock("Hello")]
    usage = BROKEN[subject.name].usage_at_drop
    assert result.raised is not None
    assert result.raised.error_class == "network"
    assert result.events == [
        ev(MessageStart(m, "assistant", expected.model)),
        *text_events(m, 0, ["Hello"]),
        ev(MessageComplete(m, "error", content, usage)),
    ]
    assert result.translator.message == final(m, expected.model, content, usage, "error")
    assert len(subject.server.requests) == 1


@BOTH_HTTP
async def test_a_stalled_stream_times_out(subject: Subject) -> None:
    body = recorded(f"{subject.name}/text.sse")
    cut = Cut(body.index(BROKEN[subject.name].stall_at), "stall")
    subject.server.enqueue(Replay(body, cut=cut))
    result = await subject.call(timeout_s=0.3, max_retries=2)
    assert result.raised is not None
    assert result.raised.error_class == "timeout"
    assert result.translator.message is not None
    assert result.translator.message.content == [TextBlock("Hello, world!")]
    assert result.translator.message.status == "error"
    assert len(subject.server.requests) == 1


@EVERY
async def test_closing_the_stream_early_releases_the_provider(subject: Subject) -> None:
    """A cancelled call closes the provider's stream mid-way; the next call still works."""
    first_request = say_text(subject)
    second_request = say_text(subject)
    async with subject.open() as provider:
        stream = provider.stream(first_request)
        first = await stream.__anext__()
        await stream.aclose()
        assert isinstance(first, RawMessageStart)
        expected = TEXT[subject.name]
        if expected.message_id is not None:  # the provider's own id
            assert first.message.id == expected.message_id
        else:
            assert first.message.model == expected.model
        pricing = None if subject.name == "scripted" else subject.http.pricing
        result = await provider_support.call(
            provider, second_request, model=subject.model, pricing=pricing
        )
    assert result.translator.message is not None
    assert result.translator.message.status == "complete"
    assert result.translator.message.content == [TextBlock("Hello, world!")]
    if subject.name != "scripted":
        assert len(subject.server.requests) == 2

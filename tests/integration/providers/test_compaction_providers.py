"""Context overflow through the real providers on the fake model APIs (docs/protocol.md §12).

- That each provider tells a refusal as too long apart from any other 400 is
  a clause of the provider contract: tests/integration/providers/test_provider_contract.py.
- Through a gateway: the refused call is compacted once and retried, and the
  fake server's recorded requests show what reached the model: the summary
  call (its system prompt, no tools, the replaced messages as text), then the
  retry, whose history is the summary then the kept turn.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio

from bench.fake_api import (
    FakeServer,
    Json,
    Replay,
    context_length_exceeded,
    prompt_too_long,
    transcript,
)
from gateway.providers.anthropic import AnthropicProvider
from gateway.providers.history import SUMMARY_PREFIX
from gateway.providers.openai import OpenAIProvider
from gateway.session.compaction import SUMMARY_MAX_TOKENS, SUMMARY_SYSTEM
from tests.conftest import make_config, running_gateway, types
from tests.provider_support import ignore_unfinalized_generators
from tests.provider_support import server as server

pytestmark = ignore_unfinalized_generators("anthropic", "httpx2", "httpcore2", "httpx", "httpcore")

ANTHROPIC = "anthropic:claude-sonnet-4-6"
OPENAI = "openai:gpt-4o-mini"


async def overflowing_session(
    tmp_path: Path, server: FakeServer, name: str, provider: Any, refusal: Json
) -> tuple[list[Any], list[dict[str, Any]]]:
    """Turn 1 answered; turn 2 refused as too long, summarised, retried: its events, messages."""
    model = ANTHROPIC if name == "anthropic" else OPENAI
    server.enqueue(
        Replay(transcript(f"{name}/text.sse")),  # turn 1
        refusal,  # turn 2, refused
        Replay(transcript(f"{name}/text.sse")),  # the summary
        Replay(transcript(f"{name}/text.sse")),  # the retry
    )
    config = make_config(
        tmp_path,
        **{"model.name": model, "tools.enabled": ["read_file"], "model.max_retries": 0},
    )
    try:
        with trio.fail_after(20):
            async with running_gateway(config, provider) as gw:
                sid = await gw.create_session()
                async with gw.client(sid) as client:
                    await client.subscribe()
                    await gw.submit(sid, "first")
                    await client.until_turn_ends()
                    await gw.submit(sid, "second")
                    events = await client.until_turn_ends()
                r = await gw.http.get(f"/sessions/{sid}/messages")
    finally:
        await provider.aclose()
    return events, r.json()["messages"]


def assert_overflow_events(events: list[Any]) -> None:
    assert types(events)[:7] == [
        "turn.started",
        "route.decided",
        "llm.call_started",
        "llm.call_failed",
        "context.compacting",
        "context.compacted",
        "llm.call_started",
    ]
    assert events[3].payload.error_class == "invalid_request"
    assert events[5].payload.trigger == "overflow" and events[5].payload.method == "summary"
    assert events[-1].type == "turn.completed" and events[-1].payload.stop_reason == "end_turn"


async def test_anthropic_overflow_retries_with_the_summary_then_the_turn(
    tmp_path: Path, server: FakeServer
) -> None:
    provider = AnthropicProvider(api_key="k", base_url=server.base_url, max_retries=0)
    events, stored = await overflowing_session(
        tmp_path, server, "anthropic", provider, prompt_too_long()
    )
    assert_overflow_events(events)
    _, refused, summary, retry = (r.body for r in server.requests)
    assert refused["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "first"}]},
        first_answer := refused["messages"][1],
        {"role": "user", "content": [{"type": "text", "text": "second"}]},
    ]
    assert first_answer["role"] == "assistant"
    assert summary["system"] == SUMMARY_SYSTEM and "tools" not in summary
    assert summary["max_tokens"] == SUMMARY_MAX_TOKENS
    [rendered] = summary["messages"]
    assert rendered["content"][0]["text"].startswith("user: first")
    ctx = next(m for m in stored if m["role"] == "context")
    text = ctx["content"][0]["summary"]
    assert text == "Hello, world!"  # what the fake model answered the summary call
    assert retry["messages"] == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": SUMMARY_PREFIX + text},
                {"type": "text", "text": "second"},
            ],
        }
    ]
    assert retry["tools"] == refused["tools"] and retry["tools"]


async def test_openai_overflow_retries_with_the_summary_then_the_turn(
    tmp_path: Path, server: FakeServer
) -> None:
    provider = OpenAIProvider(base_url=f"{server.base_url}/v1", max_retries=0)
    events, stored = await overflowing_session(
        tmp_path, server, "openai", provider, context_length_exceeded()
    )
    assert_overflow_events(events)
    _, refused, summary, retry = (r.body for r in server.requests)
    assert [m["role"] for m in refused["messages"]] == ["user", "assistant", "user"]
    assert summary["messages"][0] == {"role": "system", "content": SUMMARY_SYSTEM}
    assert "tools" not in summary and summary["max_tokens"] == SUMMARY_MAX_TOKENS
    ctx = next(m for m in stored if m["role"] == "context")
    text = ctx["content"][0]["summary"]
    assert text
    assert retry["messages"] == [{"role": "user", "content": f"{SUMMARY_PREFIX}{text}\n\nsecond"}]
    assert retry["tools"] == refused["tools"] and retry["tools"]

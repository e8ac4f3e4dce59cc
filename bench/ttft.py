"""``python -m bench.ttft``: time to first token, through the gateway and from the SDK directly.

Every path asks the same local stand-in for the Messages API
(:class:`bench.fake_api.FakeServer`, which replays ``anthropic/text.sse`` at once,
with no latency of its own) for the same stream, so the differences are what
each path adds on top of the SDK, not the model's latency:

- ``sdk``: ``AsyncAnthropic.messages.create(stream=True)`` called directly:
  from the call to the first ``text_delta`` event.
- ``provider``: the gateway's :class:`~gateway.providers.anthropic.AnthropicProvider`
  feeding its :class:`~gateway.translate.Translator`, in process: from the call
  to the first canonical ``text.delta``.
- ``gateway``: a real gateway on 127.0.0.1 (HTTP and WebSocket): from ``POST
  /sessions/{id}/turns`` to the first ``text.delta`` event frame on a
  WebSocket subscribed beforehand. Each run is a new session, so that every
  request carries the same one-message conversation.

The runs go in rounds, one run of each path per round, so that whatever else
the machine is doing weighs on every path alike; the first ``--warmup`` rounds
are discarded. Every path keeps its HTTP connection to the fake API alive
between runs, as the gateway does. Example::

    python -m bench.ttft --runs 300
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import anthropic
import httpx
import trio
from trio_websocket import WebSocketConnection, open_websocket_url

from bench.fake_api import FakeServer, Replay, transcript
from gateway.app import Gateway
from gateway.config import load_config
from gateway.protocol.shapes import Message, TextBlock
from gateway.providers.anthropic import AnthropicProvider
from gateway.providers.base import ModelRequest
from gateway.providers.factory import make_provider
from gateway.translate import Translator

MODEL = "anthropic:claude-sonnet-4-6"
KEY = "sk-ant-bench"
_TRANSCRIPT = transcript("anthropic/text.sse")
_MESSAGE_ID = b"msg_01XFDUDYJgAACzvnptvVoYEL"

Once = Callable[[], Awaitable[float]]
"""One run of a path: the seconds to its first token."""


@asynccontextmanager
async def sdk_path(base_url: str) -> AsyncIterator[Once]:
    client = anthropic.AsyncAnthropic(api_key=KEY, base_url=base_url, max_retries=0)

    async def once() -> float:
        started = time.perf_counter()
        events = await client.messages.create(
            model=MODEL.removeprefix("anthropic:"),
            max_tokens=1024,
            messages=[{"role": "user", "content": "Hi"}],
            stream=True,
        )
        first = None
        async for event in events:
            if first is None and event.type == "content_block_delta":
                first = time.perf_counter() - started
        assert first is not None, "the stream had no text_delta"
        return first

    try:
        yield once
    finally:
        await client.close()


@asynccontextmanager
async def provider_path(base_url: str) -> AsyncIterator[Once]:
    provider = AnthropicProvider(api_key=KEY, base_url=base_url, max_retries=0)
    user = Message("msg_user", "sess_bench", "turn_bench", "user", [TextBlock("Hi")], "complete", 0)
    request = ModelRequest(model=MODEL, messages=[user], tools=[], max_tokens=1024)

    async def once() -> float:
        translator = Translator(session_id="sess_bench", turn_id=None, model=MODEL, created_at=0)
        started = time.perf_counter()
        first = None
        async for raw in provider.stream(request):
            for event in translator.feed(raw):
                if first is None and event.type == "text.delta":
                    first = time.perf_counter() - started
        assert first is not None, "the stream had no text.delta"
        return first

    try:
        yield once
    finally:
        await provider.aclose()


@asynccontextmanager
async def gateway_path(base_url: str) -> AsyncIterator[Once]:
    with tempfile.TemporaryDirectory() as scratch:
        config = load_config(
            None,
            {},
            {
                "server.port": 0,
                "store.path": str(Path(scratch) / "bench.db"),
                "sessions.workspace_root": str(Path(scratch) / "workspaces"),
                "model.provider": "anthropic",
                "model.name": MODEL,
                "model.base_url": base_url,
                "model.max_retries": 0,
                "tools.enabled": [],
            },
        )
        provider = make_provider(config, {"ANTHROPIC_API_KEY": KEY})
        gateway = Gateway(config, provider)
        try:
            async with trio.open_nursery() as nursery:
                port = await nursery.start(gateway.run)
                async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
                    yield _gateway_turn(http)
                gateway.shutdown()
        finally:
            await provider.aclose()


def _gateway_turn(http: httpx.AsyncClient) -> Once:
    async def once() -> float:
        created = await http.post("/sessions", json={})
        session = created.json()["session_id"]
        ws_url = (await http.get(f"/sessions/{session}")).json()["ws_url"]
        async with open_websocket_url(ws_url) as ws:
            subscribe = {"type": "subscribe", "filter": "preset:chat", "since": None}
            await ws.send_message(json.dumps({**subscribe, "snapshot": False}))
            await _until(ws, lambda frame: frame["type"] == "subscribe_ack")
            started = time.perf_counter()
            answer = await http.post(f"/sessions/{session}/turns", json={"content": "Hi"})
            answer.raise_for_status()
            await _until(ws, lambda frame: _event_type(frame) == "text.delta")
            first = time.perf_counter() - started
            await _until(ws, lambda frame: _event_type(frame) == "turn.completed")
        return first

    return once


async def _until(ws: WebSocketConnection, done: Callable[[dict[str, object]], bool]) -> None:
    while not done(json.loads(await ws.get_message())):
        pass


def _event_type(frame: dict[str, object]) -> object:
    event = frame.get("event")
    return event.get("type") if frame["type"] == "event" and isinstance(event, dict) else None


async def measure(runs: int, warmup: int) -> dict[str, list[float]]:
    """The seconds to first token of every run of every path, warm-up rounds left out."""
    server = FakeServer()
    message_ids = itertools.count()
    async with trio.open_nursery() as nursery:
        base_url = await nursery.start(server.serve)
        async with (
            sdk_path(base_url) as sdk,
            provider_path(base_url) as provider,
            gateway_path(base_url) as gateway,
        ):
            paths = {"sdk": sdk, "provider": provider, "gateway": gateway}
            samples: dict[str, list[float]] = {name: [] for name in paths}
            for round_ in range(warmup + runs):
                for name, once in paths.items():
                    # A message id of its own: the gateway stores every message.
                    unique = f"msg_bench{next(message_ids):08d}".encode()
                    server.enqueue(Replay(_TRANSCRIPT.replace(_MESSAGE_ID, unique)))
                    seconds = await once()
                    if round_ >= warmup:
                        samples[name].append(seconds)
        nursery.cancel_scope.cancel()
    return samples


# --- the report --------------------------------------------------------------------


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:8.3f} ms"


def report(samples: dict[str, list[float]], runs: int, warmup: int) -> str:
    lines = [
        f"Time to first token against a local fake Messages API"
        f" ({runs} runs of each path, after {warmup} warm-up rounds)",
        f"{'path':<10} {'median':>11} {'p90':>11} {'min':>11}",
    ]
    for name, seconds in samples.items():
        p90 = statistics.quantiles(seconds, n=10)[-1]
        lines.append(f"{name:<10} {_ms(statistics.median(seconds))} {_ms(p90)} {_ms(min(seconds))}")
    sdk = statistics.median(samples["sdk"])
    for name in ("provider", "gateway"):
        added = statistics.median(samples[name]) - sdk
        lines.append(f"{name} adds {added * 1000:+.3f} ms to the SDK's median")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.ttft",
        description="Time to first token, through the gateway and from the SDK directly.",
    )
    parser.add_argument("--runs", type=int, default=200, help="measured runs of each path")
    parser.add_argument("--warmup", type=int, default=10, help="discarded rounds first")
    args = parser.parse_args(argv)
    print(report(trio.run(measure, args.runs, args.warmup), args.runs, args.warmup))
    return 0


if __name__ == "__main__":
    sys.exit(main())

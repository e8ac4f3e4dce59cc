"""``python -m bench.compaction``: what a context compaction adds to a turn (docs/protocol.md §12).

Two real gateways on 127.0.0.1 (HTTP and WebSocket), on the scripted model,
which answers at once: so the figure is what the gateway's compaction costs
(the plan, rendering the replaced messages, the summary call through the
provider interface, storing the ``context`` message, its two events), not a
model's latency, which a real summary call adds on top.

Each run is a new session with one turn of history (``--history-words``
words of scripted answer), then the measured turn: from ``POST .../turns`` to
``turn.completed`` on a WebSocket subscribed beforehand.

- ``plain``: ``context_max_tokens`` far above the history: no compaction.
- ``compacted``: ``context_max_tokens`` = 100: the measured turn compacts
  (``trigger: "auto"``) before its call, every run (checked: each of its
  turns has ``context.compacted``).

The runs go in rounds, one run of each path per round; the first
``--warmup`` rounds are discarded. Example::

    python -m bench.compaction --runs 200
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import trio
from trio_websocket import WebSocketConnection, open_websocket_url

from gateway.app import Gateway
from gateway.config import load_config

Once = Callable[[], Awaitable[float]]
"""One run: the seconds of the measured turn."""

PATHS = {"plain": 10**9, "compacted": 100}  # path -> context_max_tokens


@asynccontextmanager
async def gateway_path(context_max_tokens: int, history_words: int) -> AsyncIterator[Once]:
    """A gateway on the scripted model with this threshold, and one run of it."""
    with tempfile.TemporaryDirectory() as scratch:
        config = load_config(
            None,
            {},
            {
                "server.port": 0,
                "store.path": str(Path(scratch) / "bench.db"),
                "sessions.workspace_root": str(Path(scratch) / "workspaces"),
                "model.context_max_tokens": context_max_tokens,
                "tools.enabled": [],
            },
        )
        gateway = Gateway(config, None)
        async with trio.open_nursery() as nursery:
            port = await nursery.start(gateway.run)
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
                yield _run(http, history_words, expect_compaction=context_max_tokens < 10**6)
            gateway.shutdown()


def _run(http: httpx.AsyncClient, history_words: int, *, expect_compaction: bool) -> Once:
    history = json.dumps({"script": {"rounds": [[{"lorem": history_words}]]}})

    async def once() -> float:
        created = await http.post("/sessions", json={})
        session = created.json()["session_id"]
        ws_url = (await http.get(f"/sessions/{session}")).json()["ws_url"]
        async with open_websocket_url(ws_url) as ws:
            types = ["turn.completed", "context.compacted"]  # no deltas: a slow reader is cut off
            subscribe = {"type": "subscribe", "filter": {"event_types": types}, "since": None}
            await ws.send_message(json.dumps({**subscribe, "snapshot": False}))
            await _until(ws, lambda frame: frame["type"] == "subscribe_ack")
            await _turn(http, ws, session, history)
            started = time.perf_counter()
            seen = await _turn(http, ws, session, "and now?")
            elapsed = time.perf_counter() - started
        assert ("context.compacted" in seen) == expect_compaction, seen
        return elapsed

    return once


async def _turn(
    http: httpx.AsyncClient, ws: WebSocketConnection, session: str, text: str
) -> set[object]:
    answer = await http.post(f"/sessions/{session}/turns", json={"content": text})
    answer.raise_for_status()
    seen: set[object] = set()
    while True:
        kind = _event_type(json.loads(await ws.get_message()))
        seen.add(kind)
        if kind == "turn.completed":
            return seen


async def _until(ws: WebSocketConnection, done: Callable[[dict[str, object]], bool]) -> None:
    while not done(json.loads(await ws.get_message())):
        pass


def _event_type(frame: dict[str, object]) -> object:
    event = frame.get("event")
    return event.get("type") if frame["type"] == "event" and isinstance(event, dict) else None


async def measure(runs: int, warmup: int, history_words: int) -> dict[str, list[float]]:
    """The seconds of every measured turn of every path, warm-up rounds left out."""
    async with (
        gateway_path(PATHS["plain"], history_words) as plain,
        gateway_path(PATHS["compacted"], history_words) as compacted,
    ):
        paths = {"plain": plain, "compacted": compacted}
        results: dict[str, list[float]] = {name: [] for name in paths}
        for round_ in range(warmup + runs):
            for name, once in paths.items():
                seconds = await once()
                if round_ >= warmup:
                    results[name].append(seconds)
    return results


def report(results: dict[str, list[float]], runs: int, warmup: int, history_words: int) -> str:
    lines = [
        f"measured turn, {runs} runs per path after {warmup} warm-up rounds,"
        f" {history_words} words of history (ms):",
        f"{'path':<10} {'p50':>8} {'p95':>8} {'max':>8}",
    ]
    for name, seconds in results.items():
        ms = sorted(s * 1000 for s in seconds)
        p95 = statistics.quantiles(ms, n=20, method="inclusive")[-1] if len(ms) > 1 else ms[0]
        lines.append(f"{name:<10} {statistics.median(ms):>8.2f} {p95:>8.2f} {ms[-1]:>8.2f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.compaction",
        description="What a context compaction adds to a turn, on the scripted model.",
    )
    parser.add_argument("--runs", type=int, default=100, help="measured runs of each path")
    parser.add_argument("--warmup", type=int, default=5, help="discarded rounds first")
    parser.add_argument("--history-words", type=int, default=2000, help="words of history")
    args = parser.parse_args(argv)
    results = trio.run(measure, args.runs, args.warmup, args.history_words)
    print(report(results, args.runs, args.warmup, args.history_words))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

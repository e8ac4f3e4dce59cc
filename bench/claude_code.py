"""``python -m bench.claude_code``: what the gateway adds to a Claude Code turn; a session's memory.

Needs the claude-code extra (``pip install 'gateway[claude-code]'``: the
``claude-agent-sdk`` wheel and the CLI it bundles); without it the bench says
so and exits 0. Everything runs against one local stand-in for the Messages API
(:class:`bench.fake_api.FakeServer`, replaying ``anthropic/text.sse`` at once,
each reply with a message id of its own), which is also the CLI's proxy, so
nothing leaves the machine. Two figures, in one run:

**Time to first token**, the same CLI and transcript two ways:

- ``sdk``: ``ClaudeSDKClient`` used directly (``include_partial_messages``,
  its own subprocess transport): from ``query()`` to the first
  ``text_delta`` ``StreamEvent``; then the rest of the answer, to its result.
- ``gateway``: a real gateway on 127.0.0.1 whose agent is ``runtime =
  "claude-code"`` (HTTP and WebSocket): from ``POST /sessions/{id}/turns``
  to the first ``text.delta`` event frame on a WebSocket subscribed
  beforehand; then to ``turn.completed``. Its CLI's model calls go through
  the gateway's loopback door (:mod:`gateway.providers.model_proxy`).
- ``gateway-nodoor`` (warm only): the same, on a second gateway whose CLIs
  are pointed straight at the fake API with the key (the door bypassed:
  :class:`NoDoor`), so that ``gateway`` - ``gateway-nodoor`` is what the
  door adds to the first token.

*Warm*: one session (one SDK client) per path, its CLI already running; the
turns go in rounds, one of each path per round, so whatever else the machine
does weighs on both alike; the first ``--warmup`` rounds are discarded. Both
conversations grow alike, a turn per round. *Cold*: ``--cold`` times per path
(after one discarded round, the order alternating), a new session (a new
client): the CLI's start is in the figure.

**Memory per active session**: ``--sessions`` (e.g. 1, 4, 8) sessions of a
fresh gateway, each after one turn, so each holds its CLI: the RSS (and USS,
the pages no other process shares) of every CLI's process group, summed, per
session; the growth of the daemon's own RSS per session; and the bytes of each
session's CLI state directory (its config and transcript). The daemon is
this process (the gateway runs in it), so its growth is measured from just
before the first session to after the last turn. Example::

    python -m bench.claude_code --runs 50 --sessions 1 4 8
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import itertools
import json
import os
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import psutil  # type: ignore[import-untyped]
import trio
from trio_websocket import WebSocketConnection, open_websocket_url

from bench.fake_api import FakeServer, Replay, transcript

MODEL = "claude-sonnet-4-6"
KEY = "sk-ant-bench"
PROMPT = "You answer the gateway's bench."
_TRANSCRIPT = transcript("anthropic/text.sse")
_MESSAGE_ID = b"msg_01XFDUDYJgAACzvnptvVoYEL"

Once = Callable[[], Awaitable[float]]
"""One turn of a path: the seconds to its first token."""

AGENT = """
[model]
provider = "anthropic"
name = "anthropic:{model}"
base_url = "{base_url}"
max_retries = 0

[agents.default]
runtime = "claude-code"
system = "{prompt}"
tools = ["Bash"]
idle_process_s = 3600
env = {{ HTTPS_PROXY = "{base_url}", HTTP_PROXY = "{base_url}", NO_PROXY = "127.0.0.1" }}
"""


class Fake:
    """The fake API with one reply queued per turn, each with a message id of its own."""

    def __init__(self, server: FakeServer) -> None:
        self.server = server
        self._ids = itertools.count()

    def reply(self) -> None:
        unique = f"msg_bench{next(self._ids):08d}".encode()
        self.server.enqueue(Replay(_TRANSCRIPT.replace(_MESSAGE_ID, unique)))


# --- the SDK, directly -------------------------------------------------------------


def sdk_options(base_url: str, home: str, workspace: str) -> Any:
    """The SDK's options as the gateway's runtime sets them, on the SDK's own transport."""
    from claude_agent_sdk import ClaudeAgentOptions
    from claude_agent_sdk.types import SystemPromptPreset

    from gateway.runtimes.claude_code.options import QUIET_ENV

    env = {
        **QUIET_ENV,
        "HOME": home,
        "CLAUDE_CONFIG_DIR": os.path.join(home, ".claude"),
        "ANTHROPIC_API_KEY": KEY,
        "ANTHROPIC_BASE_URL": base_url,
        "HTTPS_PROXY": base_url,
        "HTTP_PROXY": base_url,
        "NO_PROXY": "127.0.0.1",
    }
    return ClaudeAgentOptions(
        include_partial_messages=True,
        cwd=workspace,
        model=MODEL,
        system_prompt=SystemPromptPreset(type="preset", preset="claude_code", append=PROMPT),
        tools=["Bash"],
        allowed_tools=["Bash"],
        setting_sources=[],
        env=env,
    )


@asynccontextmanager
async def sdk_path(base_url: str, scratch: str, fake: Fake) -> AsyncIterator[Once]:
    """``ClaudeSDKClient``: one client (one CLI) for every turn of this path."""
    from claude_agent_sdk import ClaudeSDKClient

    client = ClaudeSDKClient(sdk_options(base_url, *_dirs(scratch, "sdk")))
    await client.connect()
    try:
        yield lambda: _sdk_turn(client, fake)
    finally:
        await client.disconnect()


async def sdk_cold(base_url: str, scratch: str, fake: Fake, n: int) -> float:
    """A new client: its CLI's start, then the query to the first token."""
    from claude_agent_sdk import ClaudeSDKClient

    client = ClaudeSDKClient(sdk_options(base_url, *_dirs(scratch, f"sdk-cold-{n}")))
    started = time.perf_counter()
    await client.connect()
    try:
        return await _sdk_turn(client, fake, started)
    finally:
        await client.disconnect()


async def _sdk_turn(client: Any, fake: Fake, started: float | None = None) -> float:
    from claude_agent_sdk import ResultMessage, StreamEvent

    fake.reply()
    started = time.perf_counter() if started is None else started
    await client.query("Hi")
    first = None
    async for message in client.receive_response():
        if first is None and isinstance(message, StreamEvent):
            delta = message.event.get("delta") or {}
            if delta.get("type") == "text_delta":
                first = time.perf_counter() - started
        if isinstance(message, ResultMessage):
            assert not message.is_error, message
    assert first is not None, "the stream had no text_delta"
    return first


def _dirs(scratch: str, name: str) -> tuple[str, str]:
    home, workspace = os.path.join(scratch, name, "home"), os.path.join(scratch, name, "ws")
    os.makedirs(home, exist_ok=True)
    os.makedirs(workspace, exist_ok=True)
    return home, workspace


# --- the gateway -------------------------------------------------------------------


class NoDoor:
    """In place of a node's model door: its CLIs get the fake API's URL and the key itself."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self.live = 0

    async def ensure_running(self) -> str:
        return self.base_url

    def issue(self, session_id: str, upstream: str, key: str) -> str:
        return KEY

    def revoke(self, token: str) -> None:
        pass


@asynccontextmanager
async def gateway(
    base_url: str, scratch: str, door: bool = True
) -> AsyncIterator[tuple[Any, httpx.AsyncClient]]:
    """A gateway whose default agent is Claude Code on the fake API, and an HTTP client.

    ``door=False``: its CLIs bypass the model door (:class:`NoDoor`).
    """
    from gateway.app import Gateway
    from gateway.config import load_config
    from gateway.providers.factory import make_providers

    root = Path(tempfile.mkdtemp(dir=scratch, prefix="gateway-"))
    path = root / "gateway.toml"
    path.write_text(AGENT.format(model=MODEL, base_url=base_url, prompt=PROMPT))
    flat = {
        "server.port": 0,
        "store.path": str(root / "bench.db"),
        "sessions.workspace_root": str(root / "workspaces"),
    }
    config = load_config(str(path), {}, flat)
    providers = make_providers(config, {"ANTHROPIC_API_KEY": KEY})
    gw = Gateway(config, providers)
    try:
        async with trio.open_nursery() as nursery:
            port = await nursery.start(gw.run)
            if not door:
                gw.node.model_proxy = NoDoor(base_url)
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
                yield gw, http
            gw.shutdown()
    finally:
        await providers.aclose()


class GatewaySession:
    """One session of the gateway, a WebSocket subscribed to it."""

    def __init__(self, http: httpx.AsyncClient, fake: Fake) -> None:
        self.http, self.fake = http, fake
        self.id = ""
        self.ws: WebSocketConnection | None = None

    @asynccontextmanager
    async def open(self) -> AsyncIterator[GatewaySession]:
        created = await self.http.post("/sessions", json={})
        created.raise_for_status()
        self.id = created.json()["session_id"]
        ws_url = (await self.http.get(f"/sessions/{self.id}")).json()["ws_url"]
        async with open_websocket_url(ws_url) as ws:
            subscribe = {"type": "subscribe", "filter": "preset:chat", "since": None}
            await ws.send_message(json.dumps({**subscribe, "snapshot": False}))
            await _until(ws, lambda frame: frame["type"] == "subscribe_ack")
            self.ws = ws
            yield self

    async def turn(self) -> float:
        assert self.ws is not None
        self.fake.reply()
        started = time.perf_counter()
        answer = await self.http.post(f"/sessions/{self.id}/turns", json={"content": "Hi"})
        answer.raise_for_status()
        await _until(self.ws, lambda frame: _event_type(frame) == "text.delta")
        first = time.perf_counter() - started
        await _until(self.ws, lambda frame: _event_type(frame) == "turn.completed")
        return first


async def _until(ws: WebSocketConnection, done: Callable[[dict[str, Any]], bool]) -> None:
    while True:
        frame = json.loads(await ws.get_message())
        if _event_type(frame) == "turn.completed" and frame["event"]["payload"].get(
            "stop_reason"
        ) not in (None, "end_turn"):
            raise RuntimeError(f"the turn failed: {frame['event']['payload']}")
        if done(frame):
            return


def _event_type(frame: dict[str, Any]) -> object:
    event = frame.get("event")
    return event.get("type") if frame["type"] == "event" and isinstance(event, dict) else None


# --- memory ------------------------------------------------------------------------


def group_memory(pgid: int) -> tuple[int, int]:
    """RSS and USS (bytes) of every process in the group ``pgid`` (a session's CLI and children)."""
    rss = uss = 0
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) != pgid:
                continue
            full = proc.memory_full_info()
        except (psutil.Error, ProcessLookupError, PermissionError):
            continue
        rss += full.rss
        uss += full.uss
    return rss, uss


def cli_pid(gw: Any, session_id: str) -> int:
    """The pid (and group) of a session's CLI, from the running gateway."""
    runtime = gw.node.sessions[session_id].agent.runtime
    assert runtime is not None and runtime.transport is not None, "no CLI is running"
    pid = runtime.transport.pid
    assert pid is not None
    return int(pid)


async def memory(base_url: str, scratch: str, fake: Fake, n: int) -> dict[str, float]:
    """``n`` active sessions on a fresh gateway: MiB per session (module docstring)."""
    me = psutil.Process()
    async with gateway(base_url, scratch) as (gw, http):
        gc.collect()
        before = me.memory_info().rss
        sessions = [GatewaySession(http, fake) for _ in range(n)]
        async with trio.open_nursery() as nursery:
            for session in sessions:  # one after the other: a CLI start is heavy on 2 cores
                opened = trio.Event()

                async def hold(s: GatewaySession = session, ready: trio.Event = opened) -> None:
                    async with s.open():
                        await s.turn()
                        ready.set()
                        await trio.sleep_forever()

                nursery.start_soon(hold)
                await opened.wait()
            gc.collect()
            daemon = me.memory_info().rss - before
            trees = [group_memory(cli_pid(gw, s.id)) for s in sessions]
            disk = sum(state_bytes(gw, s.id) for s in sessions)
            nursery.cancel_scope.cancel()
    mib = 1024 * 1024
    return {
        "cli_rss": sum(r for r, _ in trees) / n / mib,
        "cli_uss": sum(u for _, u in trees) / n / mib,
        "daemon": daemon / n / mib,
        "state_kib": disk / n / 1024,
    }


def state_bytes(gw: Any, session_id: str) -> int:
    """The bytes under a session's CLI state directory (its config, its transcript)."""
    from gateway.runtimes.claude_code.paths import state_dir

    total = 0
    for folder, _dirs, files in os.walk(state_dir(gw.node.workspaces.root, session_id)):
        total += sum(os.path.getsize(os.path.join(folder, f)) for f in files)
    return total


# --- the run -----------------------------------------------------------------------


async def measure(runs: int, warmup: int, cold: int, counts: list[int]) -> dict[str, Any]:
    server = FakeServer()
    fake = Fake(server)
    os.environ["ANTHROPIC_API_KEY"] = KEY  # what the gateway's runtime passes on to its CLIs
    out: dict[str, Any] = {
        "warm": {"sdk": [], "gateway": [], "gateway-nodoor": []},
        "cold": {"sdk": [], "gateway": []},
    }
    with tempfile.TemporaryDirectory() as scratch:
        async with trio.open_nursery() as nursery:
            base_url = await nursery.start(server.serve)
            async with gateway(base_url, scratch) as (_gw, http):
                for n in range(cold + 1 if cold else 0):  # round 0 only warms the disk cache
                    order = ("sdk", "gateway") if n % 2 else ("gateway", "sdk")
                    for name in order:
                        if name == "sdk":
                            seconds = await sdk_cold(base_url, scratch, fake, n)
                        else:
                            async with GatewaySession(http, fake).open() as session:
                                seconds = await session.turn()
                        if n:
                            out["cold"][name].append(seconds)
                async with (
                    gateway(base_url, scratch, door=False) as (_direct, direct_http),
                    sdk_path(base_url, scratch, fake) as sdk,
                    GatewaySession(http, fake).open() as session,
                    GatewaySession(direct_http, fake).open() as direct,
                ):
                    paths: dict[str, Once] = {
                        "sdk": sdk,
                        "gateway": session.turn,
                        "gateway-nodoor": direct.turn,
                    }
                    for round_ in range(warmup + runs):
                        for name, once in paths.items():
                            seconds = await once()
                            if round_ >= warmup:
                                out["warm"][name].append(seconds)
            out["memory"] = {n: await memory(base_url, scratch, fake, n) for n in counts}
            calls = {(r.method, r.path) for r in server.requests}
            assert calls == {("POST", "/v1/messages?beta=true")}, calls  # nothing else was asked
            nursery.cancel_scope.cancel()
    return out


def _q(values: list[float], q: float) -> float:
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[round(q * 100) - 1]


def report(result: dict[str, Any], runs: int, warmup: int, cold: int) -> str:
    lines = [
        f"Claude Code: time to first token, the same CLI and transcript on a local fake API"
        f" ({runs} warm turns of each path after {warmup} warm-up rounds; {cold} cold starts)",
        f"{'path':<20} {'p50 ms':>9} {'p95 ms':>9} {'max ms':>9}",
    ]
    for kind in ("warm", "cold"):
        for name in ("sdk", "gateway", "gateway-nodoor"):
            ms = [s * 1000 for s in result[kind].get(name, [])]
            if ms:
                row = f"{kind} {name}"
                lines.append(f"{row:<20} {_q(ms, 0.5):>9.1f} {_q(ms, 0.95):>9.1f} {max(ms):>9.1f}")
        sdk, gw = result[kind]["sdk"], result[kind]["gateway"]
        if sdk and gw:
            p50 = (_q(gw, 0.5) - _q(sdk, 0.5)) * 1000
            p95 = (_q(gw, 0.95) - _q(sdk, 0.95)) * 1000
            lines.append(f"{kind} gateway adds {p50:+.1f} ms at p50, {p95:+.1f} ms at p95")
        nodoor = result[kind].get("gateway-nodoor", [])
        if gw and nodoor:
            p50 = (_q(gw, 0.5) - _q(nodoor, 0.5)) * 1000
            p95 = (_q(gw, 0.95) - _q(nodoor, 0.95)) * 1000
            lines.append(f"{kind} the model door adds {p50:+.1f} ms at p50, {p95:+.1f} ms at p95")
    lines += [
        "",
        "Memory per active session (MiB; each session after one turn, its CLI running):",
        f"{'sessions':>8} {'CLI RSS':>9} {'CLI USS':>9} {'daemon RSS growth':>18}"
        f" {'state dir KiB':>14}",
    ]
    for n, m in result["memory"].items():
        lines.append(
            f"{n:>8} {m['cli_rss']:>9.1f} {m['cli_uss']:>9.1f} {m['daemon']:>18.2f}"
            f" {m['state_kib']:>14.1f}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.claude_code",
        description="What the gateway adds to a Claude Code session's first token; its memory.",
    )
    parser.add_argument("--runs", type=int, default=50, help="measured warm turns of each path")
    parser.add_argument("--warmup", type=int, default=3, help="discarded rounds first")
    parser.add_argument("--cold", type=int, default=3, help="cold starts of each path")
    parser.add_argument(
        "--sessions", type=int, nargs="+", default=[1, 4, 8], help="active sessions to measure"
    )
    args = parser.parse_args(argv)
    if importlib.util.find_spec("claude_agent_sdk") is None:
        print(
            "skipped: needs the claude-code extra: pip install 'gateway[claude-code]'",
            file=sys.stderr,
        )
        return 0
    from claude_agent_sdk.types import CanUseToolShadowedWarning

    # The agent's tools are allowed without asking (no require_approval): the
    # SDK warns that can_use_tool will not be asked for them, which is the point.
    warnings.filterwarnings("ignore", category=CanUseToolShadowedWarning)
    result = trio.run(measure, args.runs, args.warmup, args.cold, args.sessions)
    print(report(result, args.runs, args.warmup, args.cold))
    return 0


if __name__ == "__main__":
    sys.exit(main())

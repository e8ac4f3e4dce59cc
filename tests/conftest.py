"""Shared fixtures: a real gateway on 127.0.0.1 port 0, and independent clients.

Rules of these tests (as trio-websocket's own suite states them):
- Integration tests talk to a real listener on 127.0.0.1, port 0, with an
  independent client: httpx for HTTP, trio-websocket for WebSockets. They run
  on the real clock with ``fail_after`` caps, never sleeping to wait for
  something: they wait for the event that says it happened.
- Time-dependent behaviour (heartbeats, TTLs, timeouts) is tested with
  ``autojump_clock`` over in-memory streams, where no real I/O is pending.
  Only what Trio's clock cannot drive (a real Redis TTL, a real process, a
  real socket's timing) waits on the real clock, and says why.
- ``slow`` (pyproject.toml's markers) marks every system test: one that needs
  nginx, Redis, chromium, node, a daemon process (``gateway serve``, the
  Claude Code CLI), or is torture, soak, bench or fuzz; and any other test
  over about a second on two cores (``--durations=0`` says which). A module
  of system tests is marked as a whole (``pytestmark``, with a comment
  saying what it needs), any other test by itself. ``python -m pytest
  -m "not slow"`` is the quick loop, under two minutes on two cores;
  ``python -m pytest`` runs everything.
- The tests run on one worker process per core (pytest-xdist, pyproject.toml's
  ``addopts``; ``-n 0`` runs them in one process), so each stands alone: its
  own gateway, port 0, its own directories (``tmp_path``), its own servers or
  a session fixture of its worker's; nothing one test leaves is another's.
"""

from __future__ import annotations

import compileall
import json
import os
import re
import socket
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import hypothesis
import msgspec
import pytest
import trio
from trio_websocket import WebSocketConnection

from gateway.app import Gateway
from gateway.client import Reducer, decode_server_frame
from gateway.client.attach import open_websocket as open_ws
from gateway.config import Config, load_config
from gateway.protocol.events import Event
from gateway.protocol.frames import EventFrame

# pytest keeps each test module it rewrote (for its assertion messages) as bytecode in
# __pycache__; PYTHONDONTWRITEBYTECODE turns that off too, and every run rewrote the
# ~390 modules again: some 20 s of collection on two cores, for -m "not slow" as well.
# The tests' own process writes bytecode; the processes they start read it.
sys.dont_write_bytecode = False


def pytest_sessionstart(session: pytest.Session) -> None:
    """Compile the checkout's modules once where Python writes no bytecode itself.

    Under ``PYTHONDONTWRITEBYTECODE`` every daemon, CLI and bench process the
    tests start compiled the checkout's modules again from source: about 0.4 s
    of each start (a daemon's start took 1.6 s rather than 1.2 s). Reading
    bytecode is not turned off by it, so it is written once here (the modules
    this process does not import itself included: ``gateway.__main__``, the
    bench's workers).
    """
    if os.environ.get("PYTHONDONTWRITEBYTECODE"):
        root = Path(__file__).resolve().parents[1]
        for package in ("gateway", "bench", "tests"):
            compileall.compile_dir(root / package, quiet=1)


# Property tests judge what is drawn, never how fast: on a shared 2-core machine
# an example can take longer than Hypothesis's default 200 ms deadline.
hypothesis.settings.register_profile("gateway", deadline=None)
hypothesis.settings.load_profile("gateway")

# One tool turn (docs/protocol.md §7): thinking, text and a tool, then text.
TOOL_SCRIPT = {
    "script": {
        "rounds": [
            [
                {"thinking": "Let me check."},
                {"text": "Running it now."},
                {"tool_use": {"name": "sleep", "input": {"seconds": 0.01}}},
            ],
            [{"text": "All done."}],
        ]
    }
}


JSON_TYPE = {"Content-Type": "application/json"}
"""What every POST says (docs/protocol.md §15), for the ones httpx's ``json=`` does not send."""


def free_port() -> int:
    """A loopback port nobody listens on now (for servers that take no port 0)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def make_config(tmp_path: Path, **overrides: Any) -> Config:
    """A config on port 0, the store and workspaces in ``tmp_path``; ``overrides`` by dotted key."""
    flat = {
        "server.port": 0,
        "store.path": str(tmp_path / "gateway.db"),
        "sessions.workspace_root": str(tmp_path / "workspaces"),
        **overrides,
    }
    return load_config(None, {}, flat)


REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session", autouse=True)
def no_workspaces_in_the_repo() -> Iterator[None]:
    """No test makes a ``workspaces`` directory in the repository (roots are in tmp dirs)."""
    before = (REPO / "workspaces").exists()
    yield
    assert before or not (REPO / "workspaces").exists(), "a test made ./workspaces in the repo"


READY_LINE = re.compile(r"gateway listening on http://[^\s:]+:(\d+)")


async def ready_port(proc: trio.Process, seconds: float = 30) -> int:
    """The port of a ``gateway serve`` process, from its readiness line on stdout.

    The line is ``gateway listening on http://HOST:PORT``, or under ``[log]
    format = "json"`` the ``gateway_started`` record (with ``port``).

    Fails (an AssertionError saying so) if it exits first or says anything else.
    """
    assert proc.stdout is not None
    line = b""
    with trio.fail_after(seconds):
        while not line.endswith(b"\n"):
            chunk = await proc.stdout.receive_some(1)
            assert chunk, "the gateway exited before its readiness line"
            line += chunk
    text = line.decode().strip()
    if text.startswith("{"):  # [log] format = "json": the line is the gateway_started record
        record = json.loads(text)
        assert record["event"] == "gateway_started", text
        return int(record["port"])
    match = READY_LINE.fullmatch(text)
    assert match, line
    return int(match.group(1))


class Harness:
    """A running gateway and the clients of one test."""

    def __init__(self, gateway: Gateway, http: httpx.AsyncClient) -> None:
        self.gateway = gateway
        self.node = gateway.node
        self.http = http
        self.base = str(http.base_url).rstrip("/")

    async def create_session(self, **body: Any) -> str:
        r = await self.http.post("/sessions", json=body)
        assert r.status_code == 201, r.text
        return str(r.json()["session_id"])

    async def ws_url(self, session_id: str) -> str:
        r = await self.http.get(f"/sessions/{session_id}")
        assert r.status_code == 200, r.text
        return str(r.json()["ws_url"])

    async def submit(self, session_id: str, content: Any) -> str:
        if not isinstance(content, str):
            content = json.dumps(content)
        r = await self.http.post(f"/sessions/{session_id}/turns", json={"content": content})
        assert r.status_code == 202, r.text
        return str(r.json()["turn_id"])

    @asynccontextmanager
    async def client(self, session_id: str, **kw: Any) -> AsyncIterator[Client]:
        url = await self.ws_url(session_id)
        async with open_ws(url, **kw) as ws:
            yield Client(ws, session_id)


class Client:
    """A trio-websocket client that decodes frames with the reference codec."""

    def __init__(self, ws: WebSocketConnection, session_id: str) -> None:
        self.ws = ws
        self.reducer = Reducer(session_id)
        self.events: list[Event] = []

    async def send(self, frame: dict[str, Any] | str) -> None:
        await self.ws.send_message(frame if isinstance(frame, str) else json.dumps(frame))

    async def recv(self) -> Any:
        frame = decode_server_frame(await self.ws.get_message())
        if isinstance(frame, EventFrame):
            self.events.append(frame.event)
        self.reducer.apply(frame)
        return frame

    async def subscribe(
        self, filter: Any = "preset:full", since: str | None = None, snapshot: bool = False
    ) -> Any:
        """Subscribe and return the ack (or the ``subscribe_error``)."""
        await self.send(
            {"type": "subscribe", "filter": filter, "since": since, "snapshot": snapshot}
        )
        return await self.recv()

    async def until(self, done: Callable[[Event], bool]) -> list[Event]:
        """Receive until an event satisfies ``done``; return the events received meanwhile."""
        start = len(self.events)
        while True:
            frame = await self.recv()
            if isinstance(frame, EventFrame) and done(frame.event):
                return self.events[start:]

    async def until_turn_ends(self) -> list[Event]:
        return await self.until(lambda e: e.type in ("turn.completed", "turn.cancelled"))


def types(events: list[Event]) -> list[str]:
    return [e.type for e in events]


def to_builtins(obj: Any) -> Any:
    return msgspec.to_builtins(obj)


@asynccontextmanager
async def running_gateway(config: Config, provider: Any = None) -> AsyncIterator[Harness]:
    gateway = Gateway(config, provider)
    async with trio.open_nursery() as nursery:
        port = await nursery.start(gateway.run)
        try:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
                yield Harness(gateway, http)
        finally:
            gateway.shutdown()


@pytest.fixture
async def gw(tmp_path: Path) -> AsyncIterator[Harness]:
    with trio.fail_after(60):
        async with running_gateway(make_config(tmp_path)) as harness:
            yield harness

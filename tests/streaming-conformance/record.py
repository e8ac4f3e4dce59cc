"""Re-record the streaming conformance traces from the current gateway, and show what changed.

    .venv/bin/python tests/streaming-conformance/record.py            # diff only (exit 1 if any)
    .venv/bin/python tests/streaming-conformance/record.py --write    # ... and store the new ones
    .venv/bin/python tests/streaming-conformance/record.py plain_text cancel_llm   # only these

Each scenario runs real turns through an in-process gateway on the scripted
model (tests/conftest.py ``running_gateway``, 127.0.0.1 port 0) and records
every server frame one client received, across its reconnects, one JSON frame
per line (``traces/NAME.jsonl``). Where a scenario needs a cut at an exact
point (a cancel, a snapshot or a disconnect mid-block), the scripted model is
wrapped in a :class:`Gate` that holds it before a given delta, so the trace is
the same on every run. Ids and times vary between runs, so a trace is stored
normalised (:func:`normalise`): each id becomes an ordinal placeholder of the
same form (event ids keep their order and width), every time becomes 0.

The expected views (``traces/NAME.expected.json``) are computed here by the
Python reference (gateway/client/views.py) from the normalised trace: the
final full and simple views, and the views after each frame that changes them
(the simple view after every such frame, the full view at each frame that is
not a delta). Review the diff this script prints before ``--write``: it is the
protocol change. The scenario ``slow_client_resume`` depends on the kernel's
buffers: its frames differ between runs (only its final views are compared).

A few traces are written by hand (:data:`HAND_WRITTEN`): paths the gateway
cannot produce yet, or not on the scripted model (a compaction, an MCP
elicitation), in the same normalised form. Nothing re-records them: this
script only rebuilds their expected views from the stored trace, and the
suite checks both reducers against them but does not compare them with what
the gateway sends.

The module is also imported by tests/integration/client/test_conformance.py (normalise, the
views of a trace, the gate).
"""

from __future__ import annotations

import argparse
import difflib
import importlib.util
import json
import os
import re
import socket
import sqlite3
import sys
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import aclosing, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import trio  # noqa: E402
from trio_websocket import WebSocketConnection  # noqa: E402
from wsproto import ConnectionType, WSConnection  # noqa: E402
from wsproto.events import (  # noqa: E402
    AcceptConnection,
    CloseConnection,
    Request,
    TextMessage,
)

from gateway.client.codec import decode_server_frame  # noqa: E402
from gateway.client.reducer import Reducer  # noqa: E402
from gateway.client.views import full_view, simple_view  # noqa: E402
from gateway.protocol.events import EVENT_TYPES  # noqa: E402
from gateway.providers.base import ModelRequest  # noqa: E402
from gateway.providers.raw import RawContentBlockDelta, RawContentBlockStart  # noqa: E402
from gateway.providers.scripted import ScriptedProvider  # noqa: E402

HERE = Path(__file__).resolve().parent
TRACES = HERE / "traces"
FULL = "preset:full"
CHAT = "preset:chat"
WORKERS = {"event_types": None, "actors": None, "include_worker_sessions": True}

Frame = dict[str, Any]

# --- normalisation ---------------------------------------------------------------

_EVENT_ID = re.compile(r"evt_\d{20}")
_IDS = re.compile(
    r"\b(?P<prefix>sess|turn|msg|call|perm|toolu|tu)_(?P<body>[0-9a-f]{12,})\b|\bws-(?P<ws>\d+)\b"
)
_ZEROED = {"ts", "created_at", "expires_at", "duration_ms"}


def normalise(frames: list[Frame]) -> list[Frame]:
    """The frames with ids as ordinal placeholders and every time 0 (module docstring).

    Event ids become ``evt_`` + the rank of the id among every event id of the
    trace, zero-padded to the real width, so they still compare in order as
    strings; other ids become ``<prefix>_<n>`` by first appearance; ``ts``,
    ``created_at``, ``expires_at`` and ``duration_ms`` become 0; a session's
    ``workspace_path`` becomes ``/workspace``.
    """
    text = json.dumps(frames)
    ranks = {id_: n for n, id_ in enumerate(sorted(set(_EVENT_ID.findall(text))), start=1)}
    ordinals: dict[str, str] = {}

    def placeholder(match: re.Match[str]) -> str:
        found = match.group(0)
        if found not in ordinals:
            prefix = "ws-" if match["ws"] else f"{match['prefix']}_"
            same = sum(1 for v in ordinals.values() if v.startswith(prefix))
            ordinals[found] = f"{prefix}{same + 1}"
        return ordinals[found]

    def walk(value: Any, key: str | None = None) -> Any:
        if isinstance(value, dict):
            return {k: walk(v, k) for k, v in value.items()}
        if isinstance(value, list):
            return [walk(v) for v in value]
        if key in _ZEROED and isinstance(value, int):
            return 0
        if key == "workspace_path" and isinstance(value, str):
            return "/workspace"
        if isinstance(value, str):
            value = _EVENT_ID.sub(lambda m: f"evt_{ranks[m.group(0)]:020d}", value)
            return _IDS.sub(placeholder, value)
        return value

    return [walk(frame) for frame in frames]


# --- the expected views --------------------------------------------------------------

_DELTAS = {"text.delta", "thinking.delta", "tool.use_input_delta"}


def decode(frame: Frame) -> Any:
    """A frame as the Python client decodes it (gateway/client/codec.py)."""
    return decode_server_frame(json.dumps(frame))


def views(reducer: Reducer, workers: bool) -> dict[str, Any]:
    return {"full": full_view(reducer, workers=workers), "simple": simple_view(reducer)}


def expected_views(frames: list[Frame], workers: bool) -> dict[str, Any]:
    """The steps and final views of a trace, by the Python reference (module docstring).

    A step ``{"after": n, ...}`` holds the views after the n-th frame (1-based)
    that differ from the last ones recorded: ``simple`` whenever it changed,
    ``full`` at a frame that is not a delta. So, after any frame, the simple
    view is the last one recorded, and so is the full view after any frame
    that is not a delta: that is how the runners check every frame.
    """
    reducer = Reducer(session_of(frames))
    steps: list[dict[str, Any]] = []
    last_simple: Any = simple_view(reducer)
    last_full: Any = full_view(reducer, workers=workers)
    for n, frame in enumerate(frames, start=1):
        reducer.apply(decode(frame))
        step: dict[str, Any] = {"after": n}
        simple = simple_view(reducer)
        if simple != last_simple:
            step["simple"] = last_simple = simple
        if not is_delta(frame):
            full = full_view(reducer, workers=workers)
            if full != last_full:
                step["full"] = last_full = full
        if len(step) > 1:
            steps.append(step)
    return {"final": views(reducer, workers), "steps": steps}


def is_delta(frame: Frame) -> bool:
    return frame.get("type") == "event" and frame["event"]["type"] in _DELTAS


def session_of(frames: list[Frame]) -> str:
    """The session a trace is of: its snapshot's, else its first event's."""
    for frame in frames:
        if frame.get("type") == "snapshot":
            return str(frame["session"]["id"])
        if frame.get("type") == "event":
            return str(frame["event"]["session_id"])
    raise ValueError("a trace without a snapshot or an event")


def dump_expected(meta: dict[str, Any], expected: dict[str, Any]) -> str:
    """The expected file: the final views indented, one step a line (diff-friendly)."""
    lines = ["{"]
    for key, value in meta.items():
        lines.append(f"  {json.dumps(key)}: {json.dumps(value)},")
    final = json.dumps(expected["final"], indent=2, sort_keys=True).replace("\n", "\n  ")
    lines.append(f'  "final": {final},')
    lines.append('  "steps": [')
    steps = [json.dumps(step, sort_keys=True) for step in expected["steps"]]
    lines.append(",\n".join(f"    {s}" for s in steps))
    lines.append("  ]")
    lines.append("}")
    return "\n".join(lines) + "\n"


def dump_trace(frames: list[Frame]) -> str:
    return "".join(json.dumps(frame) + "\n" for frame in frames)


def load_trace(name: str) -> list[Frame]:
    path = TRACES / f"{name}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def load_expected(name: str) -> dict[str, Any]:
    result: dict[str, Any] = json.loads((TRACES / f"{name}.expected.json").read_text())
    return result


# --- the gate ------------------------------------------------------------------------------


@dataclass
class Hold:
    """One stop of the :class:`Gate`: ``reached`` once the model waits there, ``go`` lets it on."""

    at: int
    reached: trio.Event = field(default_factory=trio.Event)
    go: trio.Event = field(default_factory=trio.Event)


class Gate:
    """The scripted model, held at chosen points (counted over the gateway's life).

    ``hold = gate.before(n)`` stops the model just before it yields its n-th
    ``content_block_delta`` (1-based), ``gate.before_block(n)`` before its
    n-th ``content_block_start``; ``await hold.reached.wait()`` returns once
    it waits there, with everything before it yielded; ``hold.go.set()`` lets
    it go on. A cancel of the turn ends the wait as it ends the stream.
    """

    name = "scripted"

    def __init__(self) -> None:
        self._model = ScriptedProvider()
        self._holds: dict[tuple[type[Any], int], Hold] = {}
        self._counts: dict[type[Any], int] = {RawContentBlockDelta: 0, RawContentBlockStart: 0}

    @property
    def deltas(self) -> int:
        """The content deltas the model has yielded or holds, so far."""
        return self._counts[RawContentBlockDelta]

    def before(self, delta: int) -> Hold:
        hold = self._holds[RawContentBlockDelta, delta] = Hold(delta)
        return hold

    def before_block(self, block: int) -> Hold:
        hold = self._holds[RawContentBlockStart, block] = Hold(block)
        return hold

    async def stream(self, request: ModelRequest) -> Any:
        async with aclosing(self._model.stream(request)) as stream:
            async for raw in stream:
                kind = type(raw)
                if kind in self._counts:
                    self._counts[kind] += 1
                    hold = self._holds.get((kind, self._counts[kind]))
                    if hold is not None:
                        hold.reached.set()
                        await hold.go.wait()
                yield raw

    async def aclose(self) -> None:
        await self._model.aclose()


# --- recording clients ------------------------------------------------------------------


class Recorder:
    """One logical client: the frames it received, across its connections, in order."""

    def __init__(self, gw: Any, session_id: str) -> None:
        self.gw = gw
        self.session_id = session_id
        self.frames: list[Frame] = []
        self.ws: WebSocketConnection | None = None

    @asynccontextmanager
    async def connect(
        self,
        filter: Any = FULL,
        since: str | None = None,
        snapshot: bool = False,
        coalesce_ms: int | None = None,
    ) -> AsyncIterator[Recorder]:
        """One connection: subscribe, and record everything received until the block ends."""
        from tests.conftest import open_ws

        url = await self.gw.ws_url(self.session_id)
        async with open_ws(url) as ws:
            self.ws = ws
            subscribe = {"type": "subscribe", "filter": filter, "since": since}
            if coalesce_ms is not None:
                subscribe["coalesce_ms"] = coalesce_ms
            await ws.send_message(json.dumps({**subscribe, "snapshot": snapshot}))
            ack = await self.recv()
            assert ack["type"] == "subscribe_ack", ack
            try:
                yield self
            finally:
                self.ws = None

    async def recv(self) -> Frame:
        assert self.ws is not None
        frame: Frame = json.loads(await self.ws.get_message())
        self.frames.append(frame)
        return frame

    async def until(self, done: Callable[[Frame], bool]) -> Frame:
        while True:
            frame = await self.recv()
            if done(frame):
                return frame

    async def until_event(self, type_: str, session_id: str | None = None, count: int = 1) -> Frame:
        seen = 0

        def done(frame: Frame) -> bool:
            nonlocal seen
            if frame["type"] != "event" or frame["event"]["type"] != type_:
                return False
            if session_id is not None and frame["event"]["session_id"] != session_id:
                return False
            seen += 1
            return seen == count

        return await self.until(done)

    async def until_turn_ends(self) -> Frame:
        sid = self.session_id
        return await self.until(
            lambda f: (
                f["type"] == "event"
                and f["event"]["session_id"] == sid
                and f["event"]["type"] in ("turn.completed", "turn.cancelled")
            )
        )

    @property
    def last_event_id(self) -> str:
        return str(next(f for f in reversed(self.frames) if f["type"] == "event")["event"]["id"])


class RawClient:
    """A bare WebSocket client (wsproto over TCP) with a tiny receive buffer, for a slow client.

    It subscribes, then reads nothing until told to; then it reads every frame
    up to the close.
    """

    def __init__(self, stream: trio.SocketStream, ws: WSConnection) -> None:
        self.stream, self.ws = stream, ws
        self.close: tuple[int, str] | None = None

    @classmethod
    async def open(cls, url: str, subscribe: Frame) -> RawClient:
        parts = urllib.parse.urlsplit(url)
        assert parts.hostname is not None and parts.port is not None
        sock = trio.socket.socket(trio.socket.AF_INET, trio.socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)
        await sock.connect((parts.hostname, parts.port))
        stream = trio.SocketStream(sock)
        ws = WSConnection(ConnectionType.CLIENT)
        await stream.send_all(
            ws.send(Request(host=parts.netloc, target=f"{parts.path}?{parts.query}"))
        )
        while True:
            ws.receive_data(await stream.receive_some())
            if any(isinstance(e, AcceptConnection) for e in ws.events()):
                break
        await stream.send_all(ws.send(TextMessage(json.dumps(subscribe))))
        return cls(stream, ws)

    async def read_to_close(self) -> list[Frame]:
        frames: list[Frame] = []
        pending = ""
        while self.close is None:
            data = await self.stream.receive_some()
            if not data:
                break
            self.ws.receive_data(data)
            for event in self.ws.events():
                if isinstance(event, TextMessage):
                    pending += event.data
                    if event.message_finished:
                        frames.append(json.loads(pending))
                        pending = ""
                elif isinstance(event, CloseConnection):
                    self.close = (event.code, event.reason or "")
        await self.stream.aclose()
        return frames


# --- scenarios ------------------------------------------------------------------------------


@dataclass
class Scenario:
    description: str
    run: Callable[[Any, Gate], Awaitable[list[Frame]]]
    config: dict[str, Any] = field(default_factory=dict)
    workers: bool = False
    deterministic: bool = True
    hand_written: bool = False  # a trace written by hand, never re-recorded (HAND_WRITTEN)
    runtime: str = "scripted"  # "claude-code": the agent is Claude Code on the fake API


def available(name: str) -> bool:
    """Whether a scenario can be recorded here: a Claude Code one needs the claude-code extra."""
    return SCENARIOS[name].runtime != "claude-code" or claude_code_available()


def claude_code_available() -> bool:
    return importlib.util.find_spec("claude_agent_sdk") is not None


SCENARIOS: dict[str, Scenario] = {}


def scenario(
    description: str, *, workers: bool = False, deterministic: bool = True, **config: Any
) -> Callable[[Callable[[Any, Gate], Awaitable[list[Frame]]]], Any]:
    def register(run: Callable[[Any, Gate], Awaitable[list[Frame]]]) -> Any:
        SCENARIOS[run.__name__] = Scenario(description, run, config, workers, deterministic)
        return run

    return register


def script(*rounds: list[dict[str, Any]], **options: Any) -> dict[str, Any]:
    return {"script": {"rounds": list(rounds), **options}}


def sleep(seconds: float) -> dict[str, Any]:
    return {"tool_use": {"name": "sleep", "input": {"seconds": seconds}}}


async def one_turn(gw: Any, content: Any, filter: Any = FULL) -> list[Frame]:
    """A client subscribed before the turn, recording it to its end."""
    sid = await gw.create_session()
    client = Recorder(gw, sid)
    async with client.connect(filter):
        await gw.submit(sid, content)
        await client.until_turn_ends()
    return client.frames


@scenario("a plain-text turn: the scripted model echoes it a word at a time")
async def plain_text(gw: Any, gate: Gate) -> list[Frame]:
    return await one_turn(gw, "Hello there, gateway")


@scenario("thinking, redacted thinking, then text, in one round")
async def thinking_then_text(gw: Any, gate: Gate) -> list[Frame]:
    return await one_turn(
        gw,
        script(
            [
                {"thinking": "The user greets me. I should greet back."},
                {"redacted_thinking": "opaque-data"},
                {"text": "Hello! Nice to meet you."},
            ]
        ),
    )


@scenario("two tools asked for in one round, run concurrently, then a second round")
async def parallel_tools(gw: Any, gate: Gate) -> list[Frame]:
    return await one_turn(
        gw,
        script(
            [
                {"thinking": "Two naps at once."},
                {"text": "Sleeping twice."},
                sleep(0.01),
                sleep(0.25),
            ],
            [{"text": "Both naps are over."}],
        ),
    )


@scenario("cancel during the LLM stream, inside a tool block: its input is what parses")
async def cancel_llm(gw: Any, gate: Gate) -> list[Frame]:
    sid = await gw.create_session()
    client = Recorder(gw, sid)
    # text: 4 word deltas; the tool input {"seconds":0.01,"note":"a long note"} in 8-char fragments
    hold = gate.before(7)  # the 3rd fragment of the tool input
    tool = {"tool_use": {"name": "sleep", "input": {"seconds": 0.01, "note": "a long note"}}}
    async with client.connect():
        turn_id = await gw.submit(sid, script([{"text": "Let me run it."}, tool]))
        await hold.reached.wait()
        await client.until_event("tool.use_input_delta", count=2)
        r = await gw.http.post(f"/sessions/{sid}/turns/{turn_id}/cancel", json={"reason": "user"})
        assert r.status_code == 202, r.text
        await client.until_turn_ends()
    return client.frames


@scenario(
    "cancel at the seam: the tool waits for approval and never runs",
    **{"tools.require_approval": ["sleep"]},
)
async def cancel_seam(gw: Any, gate: Gate) -> list[Frame]:
    sid = await gw.create_session()
    client = Recorder(gw, sid)
    async with client.connect():
        turn_id = await gw.submit(
            sid, script([{"text": "Sleeping."}, sleep(0.01)], [{"text": "never"}])
        )
        await client.until_event("permission.requested")
        r = await gw.http.post(f"/sessions/{sid}/turns/{turn_id}/cancel", json={})
        assert r.status_code == 202, r.text
        await client.until_turn_ends()
    return client.frames


@scenario("cancel while a tool runs: it fails with cancelled")
async def cancel_tools(gw: Any, gate: Gate) -> list[Frame]:
    sid = await gw.create_session()
    client = Recorder(gw, sid)
    async with client.connect():
        turn_id = await gw.submit(
            sid, script([{"text": "A long nap."}, sleep(60)], [{"text": "never"}])
        )
        await client.until_event("tool.called")
        r = await gw.http.post(f"/sessions/{sid}/turns/{turn_id}/cancel", json={})
        assert r.status_code == 202, r.text
        await client.until_turn_ends()
    return client.frames


@scenario("a provider error mid-stream (scripted fail): the partial message ends with error")
async def provider_error(gw: Any, gate: Gate) -> list[Frame]:
    return await one_turn(
        gw,
        script(
            [{"thinking": "Hmm."}, {"text": "This reply will break off here and never end."}],
            fail={"round": 0, "after_deltas": 5, "error_class": "overloaded"},
        ),
    )


async def post_turn(gw: Any, sid: str, content: str, if_busy: str) -> dict[str, Any]:
    """``POST .../turns`` with ``if_busy`` (docs/protocol.md §2 "A busy session"); its 202 body."""
    body = {"content": content, "if_busy": if_busy}
    r = await gw.http.post(f"/sessions/{sid}/turns", json=body)
    assert r.status_code == 202, r.text
    answer: dict[str, Any] = r.json()
    return answer


@scenario(
    "a running turn, three turns queued behind it (turn.queued), the second cancelled while"
    " queued (phase queued); the client attaches again with a snapshot (queued_turns), then"
    " the others run in order"
)
async def queue(gw: Any, gate: Gate) -> list[Frame]:
    sid = await gw.create_session()
    hold = gate.before(3)  # the running turn's reply, "You said: ...", at its third word
    client = Recorder(gw, sid)
    async with client.connect(CHAT):
        await gw.submit(sid, "Wait for me here")
        await hold.reached.wait()
        await client.until_event("text.delta", count=2)
        queued = []
        for text in ("The second question", "The third question", "The fourth question"):
            answer = await post_turn(gw, sid, text, "queue")
            assert answer["queued"] is True and answer["position"] == len(queued) + 1, answer
            queued.append(answer["turn_id"])
        await client.until_event("turn.queued", count=3)
        r = await gw.http.post(f"/sessions/{sid}/turns/{queued[1]}/cancel", json={})
        assert r.status_code == 202, r.text
        await client.until_turn_ends()  # its turn.cancelled, phase queued
    async with client.connect(CHAT, snapshot=True):
        snapshot = await client.recv()
        waiting = [q["turn_id"] for q in snapshot["session"]["queued_turns"]]
        assert waiting == [queued[0], queued[2]], snapshot["session"]
        hold.go.set()
        await client.until_event("turn.completed", count=3)
    return client.frames


@scenario(
    "a steer the running turn takes after its tool round, before its next call (turn.steered),"
    " and one sent during its last call, which becomes a queued turn of its own"
)
async def steer(gw: Any, gate: Gate) -> list[Frame]:
    sid = await gw.create_session()
    # The first round: "Let me look." (3 word deltas), the tool input (2 fragments); the
    # next call answers the steer, "You said: Also check the weather." (6 words).
    early = gate.before(2)
    late = gate.before(5 + 3)
    client = Recorder(gw, sid)
    async with client.connect():
        turn_id = await gw.submit(sid, script([{"text": "Let me look."}, sleep(0.01)]))
        await early.reached.wait()
        await client.until_event("text.delta")
        answer = await post_turn(gw, sid, "Also check the weather.", "steer")
        assert answer == {"turn_id": turn_id, "steered": True}, answer
        early.go.set()
        await late.reached.wait()
        await client.until_event("turn.steered")
        await client.until_event("text.delta", count=2)
        answer = await post_turn(gw, sid, "And one more thing.", "steer")
        assert answer == {"turn_id": turn_id, "steered": True}, answer
        late.go.set()
        await client.until_event("turn.completed", count=2)
    return client.frames


@scenario(
    "a client that stops reading is closed 1008 client_too_slow, then resumes with since",
    deterministic=False,
    **{"stream.queue_max_events": 5, "server.send_buffer_bytes": 4096},
)
async def slow_client_resume(gw: Any, gate: Gate) -> list[Frame]:
    sid = await gw.create_session()
    subscribe = {"type": "subscribe", "filter": FULL, "since": None, "snapshot": False}
    slow = await RawClient.open(await gw.ws_url(sid), subscribe)
    warnings = Recorder(gw, sid)
    async with warnings.connect({"event_types": ["bus.handler_warning"]}):
        await gw.submit(sid, script([{"lorem": 80}], delay_ms=1))
        await warnings.until_event("bus.handler_warning")
        frames = await slow.read_to_close()
        assert slow.close is not None and slow.close[0] == 1008, slow.close
        client = Recorder(gw, sid)
        client.frames = frames
        async with client.connect(since=client.last_event_id):
            if not any(
                f["type"] == "event" and f["event"]["type"] == "turn.completed"
                for f in client.frames
            ):
                await client.until_turn_ends()
    return client.frames


@scenario("a client attaches with a snapshot in the middle of a text block")
async def snapshot_mid_block(gw: Any, gate: Gate) -> list[Frame]:
    sid = await gw.create_session()
    hold = gate.before(7)  # thinking: 3 word deltas and its signature; text: its 3rd word
    watcher = Recorder(gw, sid)  # says when the gateway has sent all before the hold
    async with watcher.connect(CHAT):
        await gw.submit(
            sid, script([{"thinking": "Let me see."}, {"text": "One two three four five six."}])
        )
        await hold.reached.wait()
        await watcher.until_event("text.delta", count=2)
        client = Recorder(gw, sid)
        async with client.connect(snapshot=True):
            await client.recv()  # the snapshot
            hold.go.set()
            await client.until_turn_ends()
        await watcher.until_turn_ends()
    return client.frames


@scenario(
    "a client attaches with a snapshot while a tool waits for approval, and allows it",
    **{"tools.require_approval": ["sleep"]},
)
async def snapshot_mid_approval(gw: Any, gate: Gate) -> list[Frame]:
    sid = await gw.create_session()
    watcher = Recorder(gw, sid)
    async with watcher.connect(CHAT):
        await gw.submit(sid, script([{"text": "May I nap?"}, sleep(0.01)], [{"text": "Rested."}]))
        await watcher.until_event("permission.requested")
        client = Recorder(gw, sid)
        async with client.connect(CHAT, snapshot=True):
            snap = await client.recv()
            [pending] = snap["session"]["pending_permissions"]
            r = await gw.http.post(
                f"/sessions/{sid}/permissions/{pending['perm_id']}", json={"decision": "allow"}
            )
            assert r.status_code == 202, r.text
            await client.until_turn_ends()
        await watcher.until_turn_ends()
    return client.frames


@scenario("a client leaves mid-message and resumes with since: message.snapshot, then live deltas")
async def since_mid_message(gw: Any, gate: Gate) -> list[Frame]:
    sid = await gw.create_session()
    away = gate.before(4)  # the client has the first 3 words
    back = gate.before(7)  # it comes back after 6
    client = Recorder(gw, sid)
    watcher = Recorder(gw, sid)  # says when the gateway has sent all before the hold
    text = "Seven words make up this reply here."
    async with watcher.connect(CHAT):
        async with client.connect(CHAT):
            await gw.submit(sid, script([{"text": text}]))
            await away.reached.wait()
            await client.until_event("text.delta", count=3)
        away.go.set()
        await back.reached.wait()
        await watcher.until_event("text.delta", count=6)
        async with client.connect(CHAT, since=client.last_event_id):
            frame = await client.recv()
            assert frame["event"]["type"] == "message.snapshot", frame
            back.go.set()
            await client.until_turn_ends()
        await watcher.until_turn_ends()
    return client.frames


@scenario(
    "a turn under a 250 ms delta rollup: each block's deltas (thinking, text, a tool's input) "
    "arrive as one, the last one's id, flushed by the block's end",
    deterministic=False,  # a stall of the machine mid-block would split a block's deltas
)
async def rolled_up_turn(gw: Any, gate: Gate) -> list[Frame]:
    sid = await gw.create_session()
    client = Recorder(gw, sid)
    async with client.connect(coalesce_ms=250):
        await gw.submit(
            sid,
            script(
                [{"thinking": "A nap first."}, {"text": "Napping for a moment."}, sleep(0.01)],
                [{"text": "Rested and ready now."}],
            ),
        )
        await client.until_turn_ends()
    return client.frames


@scenario(
    "a client under a 250 ms rollup leaves mid-message and resumes with since = the id of the "
    "rolled-up delta it saw: message.snapshot, then the rest of the text rolled up"
)
async def rolled_up_since_mid_message(gw: Any, gate: Gate) -> list[Frame]:
    sid = await gw.create_session()
    away = gate.before(4)  # the client has the first 3 words, rolled up when the window ends
    back = gate.before(7)  # it comes back after 6
    client = Recorder(gw, sid)
    watcher = Recorder(gw, sid)  # says when the gateway has sent all before the hold
    text = "Seven words make up this reply here."
    async with watcher.connect(CHAT):
        async with client.connect(CHAT, coalesce_ms=250):
            await gw.submit(sid, script([{"text": text}]))
            await away.reached.wait()
            rolled = await client.until_event("text.delta")
            assert rolled["event"]["payload"]["text"] == "Seven words make ", rolled
        away.go.set()
        await back.reached.wait()
        await watcher.until_event("text.delta", count=6)
        async with client.connect(CHAT, since=client.last_event_id, coalesce_ms=250):
            frame = await client.recv()
            assert frame["event"]["type"] == "message.snapshot", frame
            back.go.set()
            await client.until_turn_ends()
        await watcher.until_turn_ends()
    return client.frames


@scenario(
    "worker events: a delegate runs a worker session, whose events the parent's stream carries",
    workers=True,
)
async def delegate_workers(gw: Any, gate: Gate) -> list[Frame]:
    sid = await gw.create_session()
    client = Recorder(gw, sid)
    task = "summarise the notes"
    delegate = {"tool_use": {"name": "delegate", "input": {"task": task}}}
    async with client.connect(WORKERS):
        await gw.submit(
            sid, script([{"text": "Asking a worker."}, delegate], [{"text": "The worker is done."}])
        )
        await client.until_turn_ends()
    return client.frames


@scenario(
    "three turns (the second with a tool), then an edit of the second's message (rewind_to):"
    " history.rewound, and the edited branch in place of the old one"
)
async def rewind(gw: Any, gate: Gate) -> list[Frame]:
    from gateway.ids import message_id_of

    sid = await gw.create_session()
    client = Recorder(gw, sid)
    async with client.connect(CHAT):
        await gw.submit(sid, "The first question")
        await client.until_turn_ends()
        second = await gw.submit(
            sid, script([{"text": "Napping."}, sleep(0.01)], [{"text": "Rested."}])
        )
        await client.until_turn_ends()
        await gw.submit(sid, "The third question")
        await client.until_turn_ends()
        body = {"content": "The second question, edited", "rewind_to": message_id_of(second)}
        r = await gw.http.post(f"/sessions/{sid}/turns", json=body)
        assert r.status_code == 202, r.text
        await client.until_turn_ends()
    return client.frames


@scenario(
    "a fork of a session of two turns (the second with a tool): its client attaches with a"
    " snapshot, which holds the copied history (no event of the fork carries it), then the"
    " fork takes a turn and one that edits a copied user message (rewind_to)"
)
async def fork(gw: Any, gate: Gate) -> list[Frame]:
    from gateway.ids import message_id_of

    source = await gw.create_session()
    watcher = Recorder(gw, source)  # says when the source's turns end; not recorded
    async with watcher.connect(CHAT):
        await gw.submit(source, "The first question")
        await watcher.until_turn_ends()
        second = await gw.submit(
            source, script([{"text": "Napping."}, sleep(0.01)], [{"text": "Rested."}])
        )
        await watcher.until_turn_ends()
    r = await gw.http.post(f"/sessions/{source}/fork", json={})
    assert r.status_code == 201, r.text
    sid = str(r.json()["session_id"])
    client = Recorder(gw, sid)
    # docs/protocol.md §2 "Forks": the copied history is in the fork's snapshot, never in
    # its events, so its client attaches with one; the trace starts with it.
    async with client.connect(CHAT, snapshot=True):
        snapshot = await client.recv()
        assert snapshot["type"] == "snapshot" and len(snapshot["messages"]) == 6, snapshot
        await gw.submit(sid, "The fork's own question")
        await client.until_turn_ends()
        body = {"content": "The second question, edited", "rewind_to": message_id_of(second)}
        r = await gw.http.post(f"/sessions/{sid}/turns", json=body)
        assert r.status_code == 202, r.text
        await client.until_turn_ends()
    return client.frames


@scenario(
    "the gateway dies mid-message; the restarted one closes the turn (server_restart)",
    **{"store.checkpoint_ms": 0},
)
async def server_restart(gw: Any, gate: Gate) -> list[Frame]:
    from tests.conftest import make_config, running_gateway

    sid = await gw.create_session()
    # Held before its third block starts: the first two have ended, and with
    # checkpoint_ms = 0 a message is stored as its blocks end (docs/protocol.md
    # §9; docs/protocol.md), so what the restarted gateway knows of it is exactly
    # those two.
    hold = gate.before_block(3)
    client = Recorder(gw, sid)
    rounds = [{"thinking": "Careful now."}, {"text": "This part survives."}, {"text": " Not this."}]
    async with client.connect(CHAT):
        await gw.submit(sid, script(rounds))
        await hold.reached.wait()
        await client.until_event("text.end")
        await gw.node.store.flush()
        live_db = gw.config.store.path
        crashed_db = str(Path(live_db).with_name("crashed.db"))
        crash_copy(live_db, crashed_db)  # what a kill -9 now would leave
    # The dead process sends nothing more: the rest of this gateway's life is not recorded.
    config = make_config(Path(crashed_db).parent, **{"store.path": crashed_db})
    async with running_gateway(config) as again:
        client.gw = again
        async with client.connect(CHAT, since=client.last_event_id):
            await client.until_turn_ends()
    hold.go.set()
    return client.frames


def crash_copy(src: str, dst: str) -> None:
    """What a kill -9 at this instant would leave: every committed transaction (test_restart.py)."""
    source, target = sqlite3.connect(src), sqlite3.connect(dst)
    with target:
        source.backup(target)
    source.close()
    target.close()


@scenario(
    "a user turn with an image and a document (files uploaded first, docs/protocol.md §2 "
    '"Files"): the turn\'s message holds them by reference, never their bytes'
)
async def files_in_turn(gw: Any, gate: Gate) -> list[Frame]:
    from tests.files_support import PDF, png

    sid = await gw.create_session()
    ids = []
    for media_type, data in (("image/png", png(6, 4)), ("application/pdf", PDF)):
        r = await gw.http.post(
            f"/sessions/{sid}/files", content=data, headers={"Content-Type": media_type}
        )
        assert r.status_code == 201, r.text
        ids.append(r.json()["file_id"])
    content = [
        {"type": "image", "file_id": ids[0]},
        {"type": "document", "file_id": ids[1]},
        {"type": "text", "text": json.dumps(script([{"text": "A picture and a paper."}]))},
    ]
    client = Recorder(gw, sid)
    async with client.connect():
        r = await gw.http.post(f"/sessions/{sid}/turns", json={"content": content})
        assert r.status_code == 202, r.text
        await client.until_turn_ends()
    return client.frames


UNKNOWN_BASE = "thinking_then_text"


def with_unknown_events(frames: list[Frame]) -> list[Frame]:
    """A normalised trace with what a newer server might send, which clients skip (section 4).

    Event ids are doubled to make room; an event of an unknown type goes after
    every third event, and the envelope, a payload and the ack get a field
    this client does not know.
    """
    text = json.dumps(frames)
    text = _EVENT_ID.sub(lambda m: f"evt_{int(m.group(0)[4:]) * 2:020d}", text)
    doubled: list[Frame] = json.loads(text)
    out: list[Frame] = []
    n = 0
    for frame in doubled:
        if frame["type"] == "subscribe_ack":
            frame = {**frame, "server_version": "9.9"}
        out.append(frame)
        if frame["type"] != "event":
            continue
        event = frame["event"]
        n += 1
        if event["type"] == "text.delta" and n % 2:
            event["payload"] = {**event["payload"], "annotations": [{"kind": "emphasis"}]}
            event["trace_id"] = "t-1"
        if n % 3 == 0:
            seq = int(event["id"][4:]) + 1
            kind = ("session.renamed", "text.citation", "future.widget")[(n // 3) % 3]
            unknown = {
                "id": f"evt_{seq:020d}",
                "type": kind,
                "session_id": event["session_id"],
                "turn_id": event["turn_id"],
                "ts": 0,
                "actor": "session",
                "payload": {"message_id": "msg_1", "content_block_index": 0, "name": "x"},
            }
            assert unknown["type"] not in EVENT_TYPES
            out.append({"type": "event", "event": unknown})
    return out


@scenario("events of types this client does not know, and fields it does not know: skipped")
async def unknown_events(gw: Any, gate: Gate) -> list[Frame]:
    frames = await SCENARIOS[UNKNOWN_BASE].run(gw, gate)
    return with_unknown_events(normalise(frames))


# --- Claude Code (runtime = "claude-code", docs/protocol.md §11) -------------------------------

FAKE_KEY = "sk-ant-conformance"


@asynccontextmanager
async def claude_code_gateway(tmp: Path) -> AsyncIterator[Any]:
    """A gateway whose agent is the real Claude Code CLI, on :class:`bench.fake_api.FakeServer`.

    The scenario queues the fake API's replies on ``gw.fake_api``. The CLI's
    own ids (the messages', the tool uses') are the transcripts', so the trace
    is the same on every run once the gateway's ids are normalised.
    """
    from bench.fake_api import FakeServer
    from gateway.providers.factory import make_providers
    from tests.claude_code_support import cc_config
    from tests.conftest import running_gateway

    server = FakeServer()
    had_key = os.environ.get("ANTHROPIC_API_KEY")
    os.environ["ANTHROPIC_API_KEY"] = FAKE_KEY  # what the runtime passes on to the CLI
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(server.serve)
            # Claude Code on the fake API, which is also its proxy: a request meant for
            # anywhere else would reach the fake server (a 500), never leave the machine.
            config = cc_config(tmp, server)
            providers = make_providers(config, {"ANTHROPIC_API_KEY": FAKE_KEY})
            try:
                async with running_gateway(config, providers) as harness:
                    gw: Any = harness
                    gw.config = config
                    gw.fake_api = server
                    yield gw
            finally:
                await providers.aclose()
            calls = {(r.method, r.path) for r in server.requests}
            assert calls <= {("POST", "/v1/messages?beta=true")}, calls  # nothing else was asked
            nursery.cancel_scope.cancel()
    finally:
        if had_key is None:
            os.environ.pop("ANTHROPIC_API_KEY", None)
        else:
            os.environ["ANTHROPIC_API_KEY"] = had_key


def claude_code_scenario(
    description: str,
) -> Callable[[Callable[[Any, Gate], Awaitable[list[Frame]]]], Any]:
    """A scenario whose agent is Claude Code (:func:`claude_code_gateway`)."""

    def register(run: Callable[[Any, Gate], Awaitable[list[Frame]]]) -> Any:
        SCENARIOS[run.__name__] = Scenario(description, run, runtime="claude-code")
        return run

    return register


@claude_code_scenario("Claude Code: a text turn with thinking (the CLI on the fake API)")
async def claude_code_text(gw: Any, gate: Gate) -> list[Frame]:
    from bench.fake_api import Replay, transcript

    gw.fake_api.enqueue(Replay(transcript("anthropic/thinking_text.sse"), chunk_bytes=300))
    return await one_turn(gw, "What is the GCD of 1071 and 462?")


@claude_code_scenario(
    "Claude Code: a Bash tool round, approved through the permissions route, then the answer"
)
async def claude_code_tool(gw: Any, gate: Gate) -> list[Frame]:
    from bench.fake_api import Replay, transcript

    gw.fake_api.enqueue(
        Replay(transcript("claude-code/bash_touch.sse")), Replay(transcript("anthropic/text.sse"))
    )
    sid = await gw.create_session()
    client = Recorder(gw, sid)
    async with client.connect():
        await gw.submit(sid, "make the file")
        asked = await client.until_event("permission.requested")
        perm_id = asked["event"]["payload"]["perm_id"]
        r = await gw.http.post(f"/sessions/{sid}/permissions/{perm_id}", json={"decision": "allow"})
        assert r.status_code == 202, r.text
        await client.until_turn_ends()
    return client.frames


# --- hand-written traces -----------------------------------------------------------------


def hand_written(name: str, description: str, *, workers: bool = False) -> None:
    """Register ``traces/NAME.jsonl``, written by hand (module docstring)."""

    async def run(gw: Any, gate: Gate) -> list[Frame]:
        return load_trace(name)

    SCENARIOS[name] = Scenario(description, run, {}, workers, True, hand_written=True)


hand_written(
    "compaction_between_turns",
    "a turn, a compaction (context.compacting, context.compacted), a reconnect whose "
    "snapshot holds the context message and every replaced message, then a second turn",
)
hand_written(
    "elicitation_pending",
    "a snapshot with an MCP elicitation and a worker's tool approval pending, then a live "
    "elicitation (permission.requested, kind elicitation) answered, and the turn's end",
)
hand_written(
    "tool_files",
    "the frames of parallel_tools, with files in a tool's outcome (tool.completed files: an "
    'image and audio an MCP tool returned, docs/protocol.md §2 "Files"), by reference',
)
hand_written(
    "tool_progress",
    "the frames of parallel_tools, with a running tool's progress (tool.progress, "
    "streaming-only, docs/protocol.md §5): no view changes, nothing breaks",
)
HAND_WRITTEN = frozenset(n for n, spec in SCENARIOS.items() if spec.hand_written)


# --- best-effort parsing of cut JSON (gateway/partial_json.py), for the JS port --------------

PARTIAL_JSON_DOCUMENTS = [
    '{"command": "ls -la", "n": 12, "ok": true, "none": null, "list": [1, 2.5, {"deep": "x"}]}',
    '{"esc":"a\\"b\\\\c\\u00e9\\n","emoji":"\\ud83d\\ude00 ok","neg":-3.5e2,"e":[]}',
    '{ "a" : [ { } , [ ] , "h\u00e9llo" ] , "b" : false , "c" : { "d" : [ 10 , -1 ] } }',
    '{"seconds":0.01,"note":"a long note"}',
]
PARTIAL_JSON_ODDITIES = [
    "",
    "   ",
    "[1, 2]",
    '"a string"',
    "42",
    "null",
    "{",
    "}",
    '{"a": 1,, "b": 2}',
    '{"a" 1}',
    '{"a": tru}',
    '{"a": 1} trailing',
    '{"a": 1}{"b": 2}',
    '{"a": [1, 2}',
    '{"a": "\\x"}',
    '{"a": "tab\there"}',
    '{"a": 01}',
    '{"a": 1.}',
    '{"a": -}',
    '{"a": "\\ud83d"}',
]


def partial_json_cases() -> list[dict[str, Any]]:
    """Every prefix of a few objects, and some odd inputs, with what Python's parse says."""
    from gateway.partial_json import best_effort

    texts = [doc[:n] for doc in PARTIAL_JSON_DOCUMENTS for n in range(len(doc) + 1)]
    texts += PARTIAL_JSON_ODDITIES
    return [{"text": text, "parsed": best_effort(text)} for text in dict.fromkeys(texts)]


def dump_partial_json_cases() -> str:
    return "[\n" + ",\n".join(json.dumps(case) for case in partial_json_cases()) + "\n]\n"


# --- running -------------------------------------------------------------------------------


async def record(name: str, tmp: Path) -> list[Frame]:
    if SCENARIOS[name].hand_written:
        return load_trace(name)  # nothing to record (module docstring)
    """Run one scenario on a fresh gateway; its normalised trace."""
    from tests.conftest import make_config, running_gateway

    spec = SCENARIOS[name]
    gate = Gate()
    if spec.runtime == "claude-code":
        with trio.fail_after(120):
            async with claude_code_gateway(tmp) as gw:
                frames = await spec.run(gw, gate)
        return normalise(frames)
    config = make_config(tmp, **spec.config)
    with trio.fail_after(60):
        async with running_gateway(config, gate) as gw:
            gw.config = config
            frames = await spec.run(gw, gate)
    return normalise(frames)


def meta_of(name: str) -> dict[str, Any]:
    spec = SCENARIOS[name]
    return {"description": spec.description, "workers": spec.workers}


def regenerate(name: str, frames: list[Frame]) -> dict[Path, str]:
    """The files of a scenario, from a new recording of it.

    A timing-dependent scenario keeps its stored frames while its new
    recording ends in the same views: then only its expected file is rebuilt
    (from the stored frames, so a change of the views still shows).
    """
    spec = SCENARIOS[name]
    if not spec.deterministic and (TRACES / f"{name}.jsonl").exists():
        stored = load_trace(name)
        final = expected_views(frames, spec.workers)["final"]
        if expected_views(stored, spec.workers)["final"] == final:
            frames = stored
    expected = expected_views(frames, spec.workers)
    return {
        TRACES / f"{name}.jsonl": dump_trace(frames),
        TRACES / f"{name}.expected.json": dump_expected(meta_of(name), expected),
    }


def diff(files: dict[Path, str]) -> Iterator[str]:
    """What changed against the stored files, as a unified diff."""
    for path, new in files.items():
        old = path.read_text() if path.exists() else ""
        yield from difflib.unified_diff(
            old.splitlines(keepends=True),
            new.splitlines(keepends=True),
            f"a/{path.relative_to(ROOT)}",
            f"b/{path.relative_to(ROOT)}",
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="scenarios to re-record (default: all)")
    parser.add_argument("--write", action="store_true", help="store the new traces")
    args = parser.parse_args(argv)
    names = args.names or list(SCENARIOS)
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        parser.error(f"unknown scenario(s) {', '.join(unknown)}; known: {', '.join(SCENARIOS)}")
    import tempfile

    changed = 0
    partial = HERE / "partial_json.json"
    if not partial.exists() or partial.read_text() != dump_partial_json_cases():
        changed += 1
        print("partial_json.json: changed", file=sys.stderr)
        if args.write:
            partial.write_text(dump_partial_json_cases())
    for name in names:
        if not available(name):
            print(f"{name}: skipped (needs the claude-code extra)", file=sys.stderr)
            continue
        if SCENARIOS[name].hand_written:
            frames = load_trace(name)  # only its expected views are rebuilt
        else:
            with tempfile.TemporaryDirectory() as tmp:
                frames = trio.run(record, name, Path(tmp))
        files = regenerate(name, frames)
        lines = list(diff(files))
        if lines:
            changed += 1
            sys.stdout.writelines(lines)
        state = "changed" if lines else "unchanged"
        print(f"{name}: {state} ({len(frames)} frames)", file=sys.stderr)
        if args.write and lines:
            TRACES.mkdir(exist_ok=True)
            for path, text in files.items():
                path.write_text(text)
    return 1 if changed and not args.write else 0


if __name__ == "__main__":
    sys.exit(main())

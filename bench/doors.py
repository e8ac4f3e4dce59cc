"""``python -m bench --profile doors``: the gateway's CPU per delivered event, door by door.

One real ``gateway serve`` daemon (:class:`bench.servers.GatewayServer`, the
bench's config, the scripted model) and three doors to a session's stream,
each measured in a phase of its own, in rounds, within one run:

- ``websocket``: ``GET /sessions/{id}/stream?attach=TOKEN`` and a ``subscribe``
  (docs/protocol.md §2, §3), the bench's own WebSocket client
  (:class:`bench.wire.WsClient`, as every other profile's);
- ``sse``: the native stream over server-sent events, ``GET
  /sessions/{id}/events?attach=TOKEN&filter=...`` (§14), read with ``httpx``
  and the client library's parser (:class:`gateway.client.sse.SseParser`);
- ``aisdk``: the AI SDK's UI message stream, ``POST /ai-sdk/chat`` (the
  client that starts the turn) and ``GET /ai-sdk/chat/{id}/stream`` (every
  other client of the session: the transport's resume), read the same way;
- ``agui``: AG-UI over SSE, ``POST /agui`` (the client that starts the run,
  its ``threadId`` the session) and ``GET /agui/{session}/runs/{run}/stream``
  (every other client: the re-attach), read the same way.

A phase: ``sessions`` fresh sessions, ``clients_per_session`` clients of the
door on each, one turn per session of the same script: a ``sleep`` tool round
of ``sleep_s`` (the clients attach and settle meanwhile: the AI SDK's
resumes can only attach once the turn runs), then ``words`` words of
``lorem``, one text delta every ``delay_ms``. Once every client has seen the
tool called, the window opens: every client's counters go to zero and the
daemon's CPU time is read (:func:`bench.servers.process_cpu_seconds`: the sum
of its threads' on-CPU time); it closes when every client has seen the turn
end, and the CPU time is read again. So each window holds the same gateway
work on every door: the sleep's end, the text round, the turn's end, to the
same number of clients.

What a client counts as **a delivered event** differs by door, and the
report says it beside every figure:

- ``websocket``: a text message whose JSON is an ``event`` frame (one gateway
  event);
- ``sse``: an SSE event whose ``data`` is an ``event`` frame (one gateway
  event);
- ``aisdk``: an SSE event whose ``data`` is a UI message chunk (``[DONE]``
  not counted): the mapping makes one chunk of each text delta, and none of
  some events (``turn.started``...), so a turn has other counts;
- ``agui``: an SSE event whose ``data`` is an AG-UI event (the same caveat).

Hence two more units, the same on every door: **a text delta** (a
``text.delta`` event, a ``text-delta`` chunk: one per word of the script on
each door) and **a byte** (WebSocket: each event frame's payload and its
2- or 4-byte header; SSE: the response body as it arrives, ``data:``,
``id:`` and blank lines included, HTTP's chunked framing not). Every figure is
reported as a ratio to the WebSocket's in the same round (the peer).

The report (:mod:`bench.doors_report`) is ``<out>/<stamp>-<profile>.json``
and ``.md``.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import msgspec

from bench.measure import machine_busy_s
from bench.profiles import DoorsProfile, config_toml
from bench.servers import GatewayServer, process_cpu_seconds
from bench.tables import Log, announce, run_profile, stem
from bench.wire import HttpClient, WsClient, open_ws
from gateway.client.sse import SseParser, attach_token, events_query

DOORS = ("websocket", "sse", "aisdk", "agui")
PEER = "websocket"


@dataclass
class Tally:
    """What one client received since the window opened, and where it is in the turn."""

    events: int = 0
    deltas: int = 0
    bytes: int = 0
    ready: bool = False  # subscribed (native) or its response started (AI SDK)
    marked: bool = False  # saw the tool called: the turn sleeps
    ended: bool = False  # saw the turn end
    error: str = ""

    def reset(self) -> None:
        self.events = self.deltas = self.bytes = 0


# What each door's client looks for in what it receives (module docstring).
_NATIVE_EVENT = '{"type":"event"'
_NATIVE_DELTA = '"type":"text.delta"'
_NATIVE_MARK = '"type":"tool.called"'
_NATIVE_END = '"type":"turn.completed"'
_AISDK_DELTA = '{"type":"text-delta"'
_AISDK_MARK = '"type":"tool-input-available"'
_AGUI_DELTA = '{"type":"TEXT_MESSAGE_CONTENT"'
_AGUI_MARK = '{"type":"TOOL_CALL_END"'
_AGUI_END = '{"type":"RUN_FINISHED"'


def count_native(tally: Tally, frame: str) -> None:
    """One server frame of the native stream (WebSocket message or SSE ``data``)."""
    if not frame.startswith(_NATIVE_EVENT):
        tally.ready = tally.ready or frame.startswith('{"type":"subscribe_ack"')
        return
    tally.events += 1
    if _NATIVE_DELTA in frame:
        tally.deltas += 1
    elif _NATIVE_MARK in frame:
        tally.marked = True
    elif _NATIVE_END in frame:
        tally.ended = True


def count_aisdk(tally: Tally, data: str) -> None:
    """One ``data`` of the UI message stream."""
    if data == "[DONE]":
        tally.ended = True
        return
    tally.events += 1
    if data.startswith(_AISDK_DELTA):
        tally.deltas += 1
    elif _AISDK_MARK in data:
        tally.marked = True


def count_agui(tally: Tally, data: str) -> None:
    """One ``data`` of an AG-UI run's stream (``RUN_FINISHED`` ends the turn)."""
    tally.events += 1
    if data.startswith(_AGUI_DELTA):
        tally.deltas += 1
    elif data.startswith(_AGUI_MARK):
        tally.marked = True
    elif data.startswith(_AGUI_END):
        tally.ended = True


COUNTS = {"websocket": count_native, "sse": count_native, "aisdk": count_aisdk,
          "agui": count_agui}  # fmt: skip


class WsDoorClient(WsClient):
    """A native WebSocket client that counts (:func:`count_native`)."""

    def __init__(self, host: str, port: int, path: str, subscribe: bytes, tally: Tally) -> None:
        super().__init__(host, port, path, subscribe)
        self.tally = tally

    def on_answer(self, payload: bytes, now: float) -> None:
        super().on_answer(payload, now)
        self.tally.ready = self.answered.exception() is None

    def on_text(self, payload: bytes, now: float) -> None:
        if payload.startswith(b'{"type":"event"'):
            self.tally.bytes += len(payload) + (2 if len(payload) < 126 else 4)
        count_native(self.tally, payload.decode())

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        if not self.tally.ended and not self.tally.error:
            self.tally.error = f"closed {self.close_code}"


async def read_sse(
    http: httpx.AsyncClient,
    method: str,
    url: str,
    tally: Tally,
    count: Callable[[Tally, str], None],
    **kw: Any,
) -> None:
    """One SSE client: counts every byte and every ``data`` until the turn ends."""
    parser = SseParser()
    try:
        async with http.stream(method, url, **kw) as response:
            if response.status_code != 200:
                tally.error = f"HTTP {response.status_code}"
                return
            if count is not count_native:
                tally.ready = True  # the response started: the turn is in flight
            async for chunk in response.aiter_raw():
                tally.bytes += len(chunk)
                for data in parser.feed(chunk):
                    count(tally, data)
                if tally.ended:
                    return
        tally.ended = True  # the body ended
    except (httpx.HTTPError, OSError) as exc:
        tally.error = f"{type(exc).__name__}: {exc}"


def turn_script(p: DoorsProfile) -> str:
    """The turn every session runs (docs/reference.md, "The scripted model")."""
    rounds = [[{"tool_use": {"name": "sleep", "input": {"seconds": p.sleep_s}}}],
              [{"lorem": p.words}]]  # fmt: skip
    return json.dumps({"script": {"delay_ms": p.delay_ms, "rounds": rounds}})


async def wait_for(check: Callable[[], bool], timeout_s: float) -> bool:
    """Poll ``check`` every 5 ms until it holds (True) or ``timeout_s`` passed (False)."""
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(0.005)
    return True


class Phase:
    """One door's clients on one round's sessions (module docstring)."""

    def __init__(self, run: DoorsRun, door: str, sessions: list[str]) -> None:
        self.run = run
        self.door = door
        self.sessions = sessions
        self.tallies: list[Tally] = []
        self.ws: list[WsDoorClient] = []
        self.tasks: list[asyncio.Task[None]] = []
        server = run.server  # the SSE doors' clients: a connection each, none kept
        self.http = httpx.AsyncClient(
            base_url=f"http://{server.host}:{server.port}",
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=0),
            timeout=httpx.Timeout(run.profile.turn_timeout_s),
        )

    def _sse(self, method: str, url: str, **kw: Any) -> Tally:
        tally = Tally()
        count = COUNTS[self.door]
        task = asyncio.create_task(read_sse(self.http, method, url, tally, count, **kw))
        self.tasks.append(task)
        self.tallies.append(tally)
        return tally

    async def _token(self, session_id: str) -> tuple[str, str]:
        answer = await self.run.http.request("GET", f"/sessions/{session_id}")
        url = urlsplit(str(answer["ws_url"]))
        return f"{url.path}?{url.query}", attach_token(str(answer["ws_url"]))

    async def attach_native(self) -> None:
        """Every client subscribed, before any turn (WebSocket or SSE)."""
        p, server = self.run.profile, self.run.server
        subscribe = msgspec.json.encode({"type": "subscribe", "filter": p.filter})
        for session_id in self.sessions:
            for _ in range(p.clients_per_session):
                path, token = await self._token(session_id)
                if self.door == "websocket":
                    tally = Tally()
                    client = WsDoorClient(server.host, server.port, path, subscribe, tally)
                    self.ws.append(client)
                    self.tallies.append(tally)
                    await open_ws(client)
                else:
                    query = events_query(token, p.filter, None, False)
                    self._sse("GET", f"/sessions/{session_id}/events", params=query)
        await self._until("subscribed", lambda t: t.ready, 30.0)
        script = turn_script(p)
        for session_id in self.sessions:
            await self.run.http.request("POST", f"/sessions/{session_id}/turns",
                                        {"content": script})  # fmt: skip

    async def attach_aisdk(self) -> None:
        """Every session's request that starts its turn, then the other clients' resumes."""
        p = self.run.profile
        script = turn_script(p)
        firsts = []
        for index, session_id in enumerate(self.sessions):
            body = {"id": session_id, "trigger": "submit-message",
                    "messages": [{"id": f"u{index}", "role": "user",
                                  "parts": [{"type": "text", "text": script}]}]}  # fmt: skip
            firsts.append(self._sse("POST", "/ai-sdk/chat", json=body))
        # A resume answers 204 until the turn runs: the POST's answer says it does.
        await wait_for(lambda: all(t.ready or t.error for t in firsts), 30.0)
        if not all(t.ready for t in firsts):
            raise RuntimeError(f"aisdk: POST /ai-sdk/chat did not answer: {firsts}")
        for session_id in self.sessions:
            for _ in range(p.clients_per_session - 1):
                self._sse("GET", f"/ai-sdk/chat/{session_id}/stream")

    async def attach_agui(self) -> None:
        """Every session's ``POST /agui`` that starts its run, then the others' re-attaches."""
        p = self.run.profile
        script = turn_script(p)
        firsts, runs = [], []
        for index, session_id in enumerate(self.sessions):
            run_id = f"run-{session_id}-{index}"
            body = {"threadId": session_id, "runId": run_id, "tools": [], "context": [],
                    "messages": [{"id": f"u{index}", "role": "user", "content": script}],
                    "state": {}, "forwardedProps": {}}  # fmt: skip
            firsts.append(self._sse("POST", "/agui", json=body))
            runs.append(run_id)
        await wait_for(lambda: all(t.ready or t.error for t in firsts), 30.0)
        if not all(t.ready for t in firsts):
            raise RuntimeError(f"agui: POST /agui did not answer: {firsts}")
        for session_id, run_id in zip(self.sessions, runs, strict=True):
            for _ in range(p.clients_per_session - 1):
                self._sse("GET", f"/agui/{session_id}/runs/{run_id}/stream")

    async def _until(self, what: str, check: Callable[[Tally], bool], timeout_s: float) -> int:
        """Wait until ``check`` holds for every client; the number for which it did not."""
        await wait_for(lambda: all(check(t) or t.error for t in self.tallies), timeout_s)
        errors = [t.error for t in self.tallies if t.error]
        if errors:
            raise RuntimeError(f"{self.door}: {len(errors)} clients failed ({what}): {errors[0]}")
        return sum(1 for t in self.tallies if not check(t))

    async def measure(self) -> dict[str, Any]:
        """Attach, open the window in the sleep, close it at the turn's end: the figures."""
        p = self.run.profile
        if self.door == "aisdk":
            await self.attach_aisdk()
        elif self.door == "agui":
            await self.attach_agui()
        else:
            await self.attach_native()
        late = await self._until("tool called", lambda t: t.marked, p.sleep_s + 10.0)
        for tally in self.tallies:
            tally.reset()
        meter = Meter(self.run.server_pid)
        unfinished = await self._until("turn ended", lambda t: t.ended, p.turn_timeout_s)
        window = meter.read()
        return figures(self.door, self.tallies, window, late=late, unfinished=unfinished,
                       words=p.words)  # fmt: skip

    async def close(self) -> None:
        for client in self.ws:
            client.abort()
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        await self.http.aclose()


class Meter:
    """CPU seconds over a window: the daemon's, this process's (the clients), everyone else's."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.t0 = time.monotonic()
        self.server0 = process_cpu_seconds(pid)
        self.own0 = time.process_time()
        self.busy0 = machine_busy_s()

    def read(self) -> dict[str, float]:
        wall = time.monotonic() - self.t0
        server = process_cpu_seconds(self.pid) - self.server0
        own = time.process_time() - self.own0
        others = max(0.0, machine_busy_s() - self.busy0 - server - own)
        return {"wall_s": wall, "server_cpu_s": server, "clients_cpu_s": own,
                "other_cpu_s": others}  # fmt: skip


def figures(
    door: str, tallies: list[Tally], window: dict[str, float], *, late: int, unfinished: int,
    words: int,
) -> dict[str, Any]:  # fmt: skip
    """One window's figures: what was delivered, and the daemon's CPU per unit of it."""
    events = sum(t.events for t in tallies)
    deltas = sum(t.deltas for t in tallies)
    size = sum(t.bytes for t in tallies)
    cpu, wall = window["server_cpu_s"], window["wall_s"]

    def per(unit: int, scale: float = 1.0) -> float | None:
        return round(cpu / unit * 1e6 * scale, 3) if unit else None

    return {
        "door": door,
        "clients": len(tallies),
        "events": events,
        "text_deltas": deltas,
        "bytes": size,
        "deltas_expected": words * len(tallies),
        "late_clients": late,  # not yet at the tool call when the window opened
        "unfinished_clients": unfinished,  # not at the turn's end when the window closed
        "wall_s": round(wall, 3),
        "server_cpu_s": round(cpu, 4),
        "server_cores": round(cpu / wall, 3) if wall else None,
        "clients_cores": round(window["clients_cpu_s"] / wall, 3) if wall else None,
        "other_cores": round(window["other_cpu_s"] / wall, 3) if wall else None,
        "cpu_us_per_event": per(events),
        "cpu_us_per_delta": per(deltas),
        "cpu_us_per_kib": per(size, 1024.0),
        "events_per_client": round(events / len(tallies), 1) if tallies else None,
        "bytes_per_event": round(size / events, 1) if events else None,
    }


class DoorsRun:
    """The daemon, the clients' HTTP, and the rounds (module docstring)."""

    def __init__(self, profile: DoorsProfile, workdir: Path, log: Log) -> None:
        self.profile = profile
        self.log = log
        text = config_toml(profile.gateway_config, str(workdir / "gateway.db"))
        self.server = GatewayServer(workdir, text)
        self.server_pid = 0

    async def start(self) -> None:
        await self.server.start()
        assert self.server.pid is not None
        self.server_pid = self.server.pid
        self.http = HttpClient(self.server.host, self.server.port)
        self.log(f"daemon {self.server_pid} listening on port {self.server.port}")

    async def stop(self) -> None:
        if hasattr(self, "http"):
            await self.http.aclose()
        await self.server.stop()

    async def phase(self, door: str) -> dict[str, Any]:
        created = [await self.http.request("POST", "/sessions", {})
                   for _ in range(self.profile.sessions)]  # fmt: skip
        phase = Phase(self, door, [str(c["session_id"]) for c in created])
        try:
            return await phase.measure()
        finally:  # (every client saw its turn end: no turn runs on)
            await phase.close()

    async def rounds(self) -> list[dict[str, Any]]:
        """``warmup`` rounds, then ``repetitions`` measured; each door in turn, rotated."""
        p = self.profile
        measured: list[dict[str, Any]] = []
        for index in range(p.warmup + p.repetitions):
            shift = index % len(DOORS)
            order = DOORS[shift:] + DOORS[:shift]  # no door always first, or always last
            windows = {door: await self.phase(door) for door in order}
            counted = index >= p.warmup
            self.log(f"round {index + 1}{'' if counted else ' (warm-up)'}: " + ", ".join(
                f"{d} {w['cpu_us_per_delta']} us/delta" for d, w in windows.items()))  # fmt: skip
            if counted:
                measured.append({"round": len(measured) + 1, "order": list(order),
                                 "doors": windows})  # fmt: skip
        return measured


async def run_doors(profile: DoorsProfile, workdir: Path, log: Log) -> dict[str, Any]:
    """The daemon started, every round measured, the daemon stopped."""
    run = DoorsRun(profile, workdir, log)
    try:
        await run.start()
        rounds = await run.rounds()
    finally:
        await run.stop()
    return {"profile": profile.name, "sizes": asdict(profile), "rounds": rounds}


def main(profile: DoorsProfile, out: Path, command: str) -> int:
    """Run ``profile``, write ``<out>/<stamp>-<profile>.json`` and ``.md``, print the table."""
    from bench.doors_report import write

    result = run_profile(
        "bench-doors-", command, lambda tmp, log: asyncio.run(run_doors(profile, tmp, log))
    )
    announce(result, *write(result, stem(out, profile.name)))
    return 0

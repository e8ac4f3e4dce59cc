"""The soak: a real gateway under churn for minutes, watched for leaks and losses.

``python -m bench.churn --minutes 10`` runs a ``gateway serve`` process (its
store in a temporary directory) and, at a steady pace, all at once:

- *stayers*: one client per session that stays attached the whole time and
  must get every event of its session exactly once, in id order, each turn
  closed and each block ended (the reference reducer checks every move);
- turns on those sessions: thinking, text and a tool round; made-up tool
  names and inputs that fail the tool's schema (the next round follows);
  slow turns cancelled over HTTP in the llm and tools phases;
- reconnect churn: clients that attach, read a while, close, and come back
  with ``since``;
- slow clients: a client that stops reading until the server closes it
  (1008) or its send buffer is full, then comes back;
- clients killed mid-frame: half a WebSocket frame then a reset (SO_LINGER 0),
  and connections reset in the middle of the HTTP handshake.

Every few seconds it reads ``/metrics``: ``process_open_fds``,
``process_resident_memory_bytes``, ``gateway_tasks`` and the connection
gauge. After a warm-up (a fifth of the run) it fits a least-squares slope to
each, per minute; at the end it stops the churn, waits for the daemon to
settle and compares open descriptors and tasks with the start. The verdict
(and the figures) go to ``bench/results/<stamp>-churn.{json,md}``.

The suite runs the 30-second soak of ``python -m bench --profile soak`` (tests/test_soak_smoke.py).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import socket
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import trio
from trio_websocket import ConnectionClosed, open_websocket_url

from gateway.client.codec import decode_server_frame
from gateway.client.reducer import Reducer
from gateway.protocol.frames import EventFrame, Ping

RESULTS = Path(__file__).parent / "results"
READY = re.compile(rb"gateway listening on http://127\.0\.0\.1:(\d+)")
WATCHED = (
    "process_open_fds",
    "process_resident_memory_bytes",
    "gateway_tasks",
    "gateway_ws_connections",
)


def _tool(name: str, **args: Any) -> dict[str, Any]:
    return {"tool_use": {"name": name, "input": args}}


TURNS: list[dict[str, Any]] = [
    {"delay_ms": 2, "rounds": [[{"thinking": "let me see " * 5}, {"text": "checking " * 10},
                                _tool("sleep", seconds=0.05)], [{"lorem": 60}]]},
    {"rounds": [[_tool("made_up_tool")], [{"text": "that tool does not exist"}]]},
    {"rounds": [[_tool("sleep", seconds="soon")], [{"text": "bad input, going on"}]]},
    {"delay_ms": 1, "rounds": [[{"lorem": 150}]]},
]  # fmt: skip
CANCELLED = [
    {"delay_ms": 20, "rounds": [[{"lorem": 400}]]},  # cancelled while streaming
    {"rounds": [[_tool("sleep", seconds=30)]]},  # cancelled while the tool runs
]


@dataclass
class Stayer:
    session: str
    events: int = 0
    duplicates: int = 0
    out_of_order: int = 0
    turns_ended: int = 0
    reducer_errors: list[str] = field(default_factory=list)
    last_id: str | None = None


@dataclass
class Tally:
    turns: int = 0
    cancels: int = 0
    reconnects: int = 0
    slow_closed: int = 0
    killed_mid_frame: int = 0
    errors: list[str] = field(default_factory=list)


class Soak:
    def __init__(self, seconds: float, *, sessions: int = 4, seed: int = 1) -> None:
        self.seconds = seconds
        self.n_sessions = sessions
        self.rng = random.Random(seed)
        self.tally = Tally()
        self.samples: list[dict[str, float]] = []
        self.stayers: dict[str, Stayer] = {}
        self.base = ""
        self.port = 0
        self.proc: trio.Process | None = None

    # --- the daemon ----------------------------------------------------------

    async def start(self, workdir: Path) -> None:
        config = workdir / "gateway.toml"
        config.write_text(
            f'[store]\npath = "{workdir / "gateway.db"}"\n'
            "[stream]\nqueue_max_events = 300\n"
            "[server]\nsend_buffer_bytes = 16384\n"
            '[tools]\nenabled = ["sleep", "read_file"]\n'
        )
        env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
        self.proc = await trio.lowlevel.open_process(
            [sys.executable, "-m", "gateway", "serve", "--config", str(config), "--port", "0"],
            cwd=workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        assert self.proc.stdout is not None
        line = b""
        with trio.fail_after(30):
            while not line.endswith(b"\n"):
                chunk = await self.proc.stdout.receive_some(1)
                if not chunk:
                    raise RuntimeError("the gateway exited before its readiness line")
                line += chunk
        match = READY.search(line)
        assert match, line
        self.port = int(match.group(1))
        self.base = f"http://127.0.0.1:{self.port}"

    def alive(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    async def metrics(self, http: httpx.AsyncClient) -> dict[str, float]:
        text = (await http.get("/metrics")).text
        out: dict[str, float] = {"t": time.monotonic()}
        for line in text.splitlines():
            name, _, value = line.partition(" ")
            if name in WATCHED:
                out[name] = float(value)
        return out

    # --- load ----------------------------------------------------------------

    async def ws_url(self, http: httpx.AsyncClient, sid: str) -> str:
        r = await http.get(f"/sessions/{sid}")
        r.raise_for_status()
        return str(r.json()["ws_url"])

    async def stayer(self, http: httpx.AsyncClient, sid: str, ready: trio.Event) -> None:
        state = self.stayers[sid] = Stayer(sid)
        reducer = Reducer(sid)
        sub = {"type": "subscribe", "filter": "preset:full", "since": None, "snapshot": False}
        async with open_websocket_url(await self.ws_url(http, sid), max_message_size=1 << 24) as ws:
            await ws.send_message(json.dumps(sub))
            await ws.get_message()  # the ack
            ready.set()
            while True:
                frame = decode_server_frame(await ws.get_message())
                if isinstance(frame, EventFrame):
                    e = frame.event
                    if state.last_id is not None and e.id <= state.last_id:
                        state.duplicates += e.id == state.last_id
                        state.out_of_order += e.id < state.last_id
                        continue
                    state.last_id = e.id
                    state.events += 1
                    state.turns_ended += e.type in ("turn.completed", "turn.cancelled")
                    try:
                        reducer.apply(frame)
                    except ValueError as exc:
                        state.reducer_errors.append(f"{e.type} {e.id}: {exc}")
                elif isinstance(frame, Ping):
                    await ws.send_message(json.dumps({"type": "pong", "nonce": frame.nonce}))

    async def turns(self, http: httpx.AsyncClient, sid: str, until: float) -> None:
        while trio.current_time() < until:
            cancel = self.rng.random() < 0.25
            script = self.rng.choice(CANCELLED if cancel else TURNS)
            r = await http.post(
                f"/sessions/{sid}/turns", json={"content": json.dumps({"script": script})}
            )
            if r.status_code != 202:
                self.tally.errors.append(f"submit: {r.status_code} {r.text[:100]}")
                await trio.sleep(0.5)
                continue
            turn_id = r.json()["turn_id"]
            self.tally.turns += 1
            if cancel:
                await trio.sleep(self.rng.uniform(0.05, 0.4))
                r = await http.post(f"/sessions/{sid}/turns/{turn_id}/cancel", json={})
                self.tally.cancels += r.status_code == 202
            await self.wait_idle(http, sid)
            await trio.sleep(self.rng.uniform(0.05, 0.3))

    async def wait_idle(self, http: httpx.AsyncClient, sid: str) -> None:
        """Until the session has no turn in flight (a snapshot says so)."""
        with trio.move_on_after(60):
            while True:
                url = await self.ws_url(http, sid)
                sub = {"type": "subscribe", "filter": {"event_types": [], "actors": None,
                       "include_worker_sessions": False}, "snapshot": True}  # fmt: skip
                async with open_websocket_url(url) as ws:
                    await ws.send_message(json.dumps(sub))
                    await ws.get_message()
                    snap = json.loads(await ws.get_message())
                if snap["session"]["current_turn_id"] is None:
                    return
                await trio.sleep(0.2)

    async def churner(self, http: httpx.AsyncClient, sessions: list[str], until: float) -> None:
        cursors: dict[str, str | None] = {}
        while trio.current_time() < until:
            sid = self.rng.choice(sessions)
            kind = self.rng.random()
            try:
                if kind < 0.15:
                    await self.kill_mid_frame(http, sid)
                elif kind < 0.25:
                    await self.slow_client(http, sid)
                else:
                    cursors[sid] = await self.reconnect(http, sid, cursors.get(sid))
            except (ConnectionClosed, OSError, httpx.HTTPError) as exc:
                self.tally.errors.append(f"churn: {type(exc).__name__}: {exc}"[:200])
            await trio.sleep(self.rng.uniform(0.01, 0.1))

    async def reconnect(self, http: httpx.AsyncClient, sid: str, since: str | None) -> str | None:
        sub = {"type": "subscribe", "filter": "preset:chat", "since": since, "snapshot": False}
        last = since
        async with open_websocket_url(await self.ws_url(http, sid), max_message_size=1 << 24) as ws:
            await ws.send_message(json.dumps(sub))
            ack = json.loads(await ws.get_message())
            if ack["type"] != "subscribe_ack":
                return None
            with trio.move_on_after(self.rng.uniform(0.05, 0.6)):
                while True:
                    frame = json.loads(await ws.get_message())
                    if frame["type"] == "event":
                        last = frame["event"]["id"]
        self.tally.reconnects += 1
        return last

    async def slow_client(self, http: httpx.AsyncClient, sid: str) -> None:
        """Subscribe, then read nothing for a while: a 1008 or a full buffer, then gone."""
        path = (await self.ws_url(http, sid)).split(str(self.port), 1)[1]
        sock = await self._raw_ws(path, rcvbuf=4096)
        try:
            sub = {"type": "subscribe", "filter": "preset:full", "since": None, "snapshot": False}
            await sock.send(_masked_text(json.dumps(sub).encode()))
            await trio.sleep(self.rng.uniform(0.5, 2.0))
            self.tally.slow_closed += 1
        finally:
            sock.close()

    async def kill_mid_frame(self, http: httpx.AsyncClient, sid: str) -> None:
        """Half a frame (or half a handshake), then a reset."""
        url = await self.ws_url(http, sid)
        path = url.split(str(self.port), 1)[1]
        if self.rng.random() < 0.5:
            sock = await self._raw_ws(path)
            frame = _masked_text(b'{"type":"subscribe","filter":"preset:chat"}')
            await sock.send(frame[: self.rng.randint(1, len(frame) - 1)])
        else:
            sock = trio.socket.socket()
            await sock.connect(("127.0.0.1", self.port))
            request = f"GET {path} HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n".encode()
            await sock.send(request[: self.rng.randint(1, len(request))])
        await trio.sleep(self.rng.uniform(0, 0.05))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()
        self.tally.killed_mid_frame += 1

    async def _raw_ws(self, path: str, rcvbuf: int = 0) -> trio.socket.SocketType:
        sock = trio.socket.socket()
        if rcvbuf:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        await sock.connect(("127.0.0.1", self.port))
        key = "dGhlIHNhbXBsZSBub25jZQ=="
        await sock.send(
            f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
            "Sec-WebSocket-Version: 13\r\n\r\n".encode()
        )
        head = b""
        with trio.fail_after(10):
            while b"\r\n\r\n" not in head:
                chunk = await sock.recv(4096)
                if not chunk:
                    break
                head += chunk
        return sock

    # --- the run -------------------------------------------------------------

    async def run(self) -> dict[str, Any]:
        with tempfile.TemporaryDirectory(prefix="soak-") as tmp:
            await self.start(Path(tmp))
            try:
                return await self._drive()
            finally:
                if self.proc is not None and self.alive():
                    self.proc.terminate()
                    with trio.move_on_after(10):
                        await self.proc.wait()
                    if self.alive():
                        self.proc.kill()
                        await self.proc.wait()

    async def _drive(self) -> dict[str, Any]:
        async with httpx.AsyncClient(base_url=self.base, timeout=30) as http:
            sessions = []
            for _ in range(self.n_sessions):
                r = await http.post("/sessions", json={})
                sessions.append(str(r.json()["session_id"]))
            baseline = await self.metrics(http)
            start = trio.current_time()
            until = start + self.seconds
            async with trio.open_nursery() as stayers:
                for sid in sessions:
                    ready = trio.Event()
                    stayers.start_soon(self.stayer, http, sid, ready)
                    await ready.wait()
                async with trio.open_nursery() as load:
                    for sid in sessions:
                        load.start_soon(self.turns, http, sid, until)
                    for _ in range(3):
                        load.start_soon(self.churner, http, sessions, until)
                    load.start_soon(self.sampler, http, until)
                # The churn is over: every turn ends, the stayers have all of it.
                for sid in sessions:
                    await self.wait_idle(http, sid)
                await trio.sleep(2)
                stayers.cancel_scope.cancel()
            await trio.sleep(2)  # the server lets the last connections go
            final = await self.metrics(http)
            alive = self.alive() and (await http.get("/healthz")).status_code == 200
        return self.report(baseline, final, alive)

    async def sampler(self, http: httpx.AsyncClient, until: float) -> None:
        step = max(1.0, min(5.0, self.seconds / 30))
        while trio.current_time() < until:
            self.samples.append(await self.metrics(http))
            await trio.sleep(step)

    def report(
        self, baseline: dict[str, float], final: dict[str, float], alive: bool
    ) -> dict[str, Any]:
        warm = self.samples[len(self.samples) // 5 :] if len(self.samples) >= 5 else self.samples
        slopes = {name: _slope_per_min(warm, name) for name in WATCHED}
        stayers = [asdict(s) for s in self.stayers.values()]
        lost_or_bad = sum(
            s.duplicates + s.out_of_order + len(s.reducer_errors) for s in self.stayers.values()
        )
        fds = abs(final["process_open_fds"] - baseline["process_open_fds"])
        tasks = abs(final["gateway_tasks"] - baseline["gateway_tasks"])
        checks = {
            "daemon alive": alive,
            "stayers: no duplicate, no reorder, every move valid": lost_or_bad == 0,
            "stayers: every turn ended": all(s.turns_ended > 0 for s in self.stayers.values()),
            "open fds back to the start (+-4)": fds <= 4,
            "tasks back to the start (+-4)": tasks <= 4,
        }  # fmt: skip
        return {
            "seconds": self.seconds,
            "sessions": self.n_sessions,
            "tally": asdict(self.tally) | {"errors": self.tally.errors[:20]},
            "baseline": baseline,
            "final": final,
            "slopes_per_min": slopes,
            "samples": self.samples,
            "stayers": stayers,
            "checks": checks,
            "passed": all(checks.values()),
        }


def _slope_per_min(samples: list[dict[str, float]], name: str) -> float:
    points = [(s["t"], s[name]) for s in samples if name in s]
    if len(points) < 2:
        return 0.0
    n = len(points)
    mt = sum(t for t, _ in points) / n
    mv = sum(v for _, v in points) / n
    var = sum((t - mt) ** 2 for t, _ in points)
    if var == 0:
        return 0.0
    return 60 * sum((t - mt) * (v - mv) for t, v in points) / var


def _masked_text(payload: bytes) -> bytes:
    """A client text frame (masked, RFC 6455 section 5.3)."""
    mask = os.urandom(4)
    size = len(payload)
    head = bytes([0x81, 0x80 | size]) if size < 126 else struct.pack("!BBH", 0x81, 0x80 | 126, size)
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


def _row(name: str, start: float, end: float, slope: float, fmt: str, sfmt: str) -> str:
    return f"| {name} | {fmt.format(start)} | {fmt.format(end)} | {sfmt.format(slope)} |"


def markdown(result: dict[str, Any]) -> str:
    b, f, s = result["baseline"], result["final"], result["slopes_per_min"]
    mib = 2**20
    rss = "process_resident_memory_bytes"
    rows = [
        "| figure | start | end | slope per minute (after warm-up) |",
        "| --- | --- | --- | --- |",
        _row("open file descriptors", b["process_open_fds"], f["process_open_fds"],
             s["process_open_fds"], "{:.0f}", "{:+.2f}"),
        _row("Trio tasks", b["gateway_tasks"], f["gateway_tasks"], s["gateway_tasks"],
             "{:.0f}", "{:+.2f}"),
        _row("RSS (MiB)", b[rss] / mib, f[rss] / mib, s[rss] / mib, "{:.1f}", "{:+.3f}"),
    ]  # fmt: skip
    t = result["tally"]
    stayers = result["stayers"]
    lines = [
        f"Soak: {result['seconds'] / 60:.1f} min, {result['sessions']} sessions: {t['turns']} turns"
        f" ({t['cancels']} cancelled), {t['reconnects']} reconnects, {t['slow_closed']} slow"
        f" clients, {t['killed_mid_frame']} clients killed mid-frame.",
        "",
        *rows,
        "",
        f"Stayers: {sum(x['events'] for x in stayers)} events,"
        f" {sum(x['turns_ended'] for x in stayers)} turns seen to their end,"
        f" duplicates {sum(x['duplicates'] for x in stayers)},"
        f" out of order {sum(x['out_of_order'] for x in stayers)},"
        f" invalid moves {sum(len(x['reducer_errors']) for x in stayers)}.",
        "",
        *(f"- {name}: {'yes' if ok else 'NO'}" for name, ok in result["checks"].items()),
        "",
        f"Verdict: {'pass' if result['passed'] else 'FAIL'}",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.churn", description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--sessions", type=int, default=4)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    soak = Soak(args.minutes * 60, sessions=args.sessions, seed=args.seed)
    result = trio.run(soak.run)
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    (args.out / f"{stamp}-churn.json").write_text(json.dumps(result, indent=1))
    text = markdown(result)
    (args.out / f"{stamp}-churn.md").write_text(text)
    print(text)
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())

"""The phases of a bench run, each one measured the same way for every server.

A run (:meth:`Run.run`) goes::

    gateway  record a turn -> fan-out -> slow clients -> replay 10k -> replay storm
    peers    fan-out (each: ws_queue, ws_broadcast, raw), with the recorded frames
    all      idle connections (each in a fresh process)
    gateway  time to first token (bench/ttft.py)

A *window* (:meth:`Run.window`) is the unit of measurement: the load runs for
``settle_s``, every worker's counters are reset, then after ``window_s`` they
are collected with the server's CPU seconds over the same wall time.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import msgspec

from bench.pool import WorkerPool
from bench.profiles import Profile
from bench.servers import GatewayServer, PeerServer, Server
from bench.stats import Window
from bench.wire import WsClient, open_ws
from bench.driver import attach_path, lorem_script

CHAT = b'{"type":"subscribe","filter":"preset:chat","since":null,"snapshot":false}'
SUSTAINED_SHARE = 0.9  # delivered / offered at or above this: the load is sustained
SUSTAINED_P99_MS = 50.0  # ... and p99 at or under this
CLIENT_BUSY = 0.85  # a worker using this share of a core may be what limits a figure


def replay_subscribe(since: str) -> bytes:
    return json.dumps(
        {"type": "subscribe", "filter": "preset:full", "since": since, "snapshot": False}
    ).encode()


@dataclass
class Step:
    """One measured window of the fan-out."""

    clients: int
    rate: float  # text deltas per second per session, as asked
    offered_events_per_s: float  # what the load asks for, all clients together
    events_per_s: float  # what the clients received
    server_cpu_util: float | None  # server CPU seconds per wall second
    cpu_us_per_event: float | None
    p50_ms: float | None
    p99_ms: float | None
    p999_ms: float | None
    client_cpu_util: float  # the busiest client worker, share of one core
    clients_open: int

    @property
    def sustained(self) -> bool:
        return (
            self.events_per_s >= SUSTAINED_SHARE * self.offered_events_per_s
            and self.p99_ms is not None
            and self.p99_ms <= SUSTAINED_P99_MS
            and self.clients_open == self.clients
        )

    @property
    def client_limited(self) -> bool:
        return self.client_cpu_util >= CLIENT_BUSY

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "sustained": self.sustained, "client_limited": self.client_limited}


class _Recorder(WsClient):
    """Keeps every event frame of a session until the turn in flight ends."""

    def __init__(self, host: str, port: int, path: str, subscribe: bytes) -> None:
        super().__init__(host, port, path, subscribe)
        self.frames: list[bytes] = []
        self.turn_over = asyncio.Event()

    def on_text(self, payload: bytes, now: float) -> None:
        if payload.startswith(b'{"type":"event"'):
            self.frames.append(payload)
            if b'"type":"turn.completed"' in payload or b'"type":"turn.cancelled"' in payload:
                self.turn_over.set()


class _Head(msgspec.Struct):
    id: str
    type: str


class _EventFrame(msgspec.Struct):
    event: _Head


class Run:
    """One bench run over one client pool (module docstring)."""

    def __init__(
        self,
        profile: Profile,
        pool: WorkerPool,
        workdir: Path,
        gateway: GatewayServer,
        fresh_gateway: Any,
        log: Any = print,
    ) -> None:
        self.p = profile
        self.pool = pool
        self.workdir = workdir
        self.gateway = gateway
        self.fresh_gateway = fresh_gateway  # () -> GatewayServer, for the idle phase
        self.log = log
        self.events_per_delta = 1.0
        self.frames_file = workdir / "frames.json"

    # --- the run -------------------------------------------------------------------

    async def run(self) -> dict[str, Any]:
        p = self.p
        result: dict[str, Any] = {"servers": {}}
        gw = self.gateway
        await gw.start()
        try:
            self.log("recording the load turn's frames")
            result["frames"] = await self.record_turn()
            self.log("gateway: fan-out")
            fanout = await self.fanout(gw, half_rate=None)
            result["servers"]["gateway"] = {"fanout": fanout}
            self.log("gateway: slow clients")
            result["slow_clients"] = await self.slow_clients(gw)
            self.log("gateway: replay")
            result["replay"] = await self.replays(gw)
        finally:
            await gw.stop()
        half = fanout["half_load"]["rate"]
        for kind in p.peers:
            peer = PeerServer(kind, self.frames_file, self.workdir)
            await peer.start()
            try:
                self.log(f"{kind}: fan-out")
                result["servers"][kind] = {"fanout": await self.fanout(peer, half_rate=half)}
            finally:
                await peer.stop()
        for name, make in [("gateway", self.fresh_gateway), *self._peer_makers()]:
            self.log(f"{name}: idle connections")
            server = make()
            await server.start()
            try:
                result["servers"][name]["idle"] = await self.idle(server)
            finally:
                await server.stop()
        result["ttft"] = await self.ttft() if p.ttft else {"skipped": True}
        return result

    def _peer_makers(self) -> list[tuple[str, Any]]:
        def maker(kind: str) -> Any:
            return lambda: PeerServer(kind, self.frames_file, self.workdir)

        return [(kind, maker(kind)) for kind in self.p.peers]

    # --- recording ------------------------------------------------------------------

    async def record_turn(self) -> dict[str, Any]:
        """One load turn on the gateway, its frames kept for the peers to replay."""
        gw = self.gateway
        assert gw.http is not None
        (session,) = await gw.open_sessions(1)
        path = await attach_path(gw.http, session)
        recorder = _Recorder(gw.host, gw.port, path, CHAT)
        await open_ws(recorder)
        await asyncio.sleep(0.05)
        content = lorem_script(1000.0, self.p.words)
        await gw.http.request("POST", f"/sessions/{session}/turns", {"content": content})
        await asyncio.wait_for(recorder.turn_over.wait(), 60)
        recorder.abort()
        frames = [
            {"data": f.decode(), "delta": b'"type":"text.delta"' in f} for f in recorder.frames
        ]
        self.frames_file.write_text(json.dumps(frames))
        deltas = sum(1 for f in frames if f["delta"])
        self.events_per_delta = len(frames) / deltas
        sizes = [len(f["data"]) for f in frames]
        return {
            "events_per_turn": len(frames),
            "deltas_per_turn": deltas,
            "mean_frame_bytes": round(sum(sizes) / len(sizes), 1),
        }

    # --- windows ----------------------------------------------------------------------

    async def window(self, server: Server, clients: int, rate: float, sessions: int) -> Step:
        await asyncio.sleep(self.p.settle_s)
        await self.pool.mark()
        cpu0, t0 = server.cpu_seconds(), time.monotonic()
        await asyncio.sleep(self.p.window_s)
        window = await self.pool.mark()
        cpu1, wall = server.cpu_seconds(), time.monotonic() - t0
        return self._step(window, wall, cpu0, cpu1, clients, rate, sessions, "live")

    def _step(
        self,
        window: Window,
        wall: float,
        cpu0: float | None,
        cpu1: float | None,
        clients: int,
        rate: float,
        sessions: int,
        group: str,
    ) -> Step:
        live = window.group(group)
        rate_per_s = live.events / wall
        cpu = None if cpu0 is None or cpu1 is None else cpu1 - cpu0
        latency = live.latency.summary()
        return Step(
            clients=clients,
            rate=rate,
            offered_events_per_s=round(clients * rate * self.events_per_delta, 1),
            events_per_s=round(rate_per_s, 1),
            server_cpu_util=None if cpu is None else round(cpu / wall, 3),
            cpu_us_per_event=None if cpu is None or not live.events else round(
                cpu / live.events * 1e6, 2
            ),
            p50_ms=latency["p50_ms"],
            p99_ms=latency["p99_ms"],
            p999_ms=latency["p999_ms"],
            client_cpu_util=round(max(window.client_cpu_s, default=0.0) / wall, 3),
            clients_open=live.connections,
        )  # fmt: skip

    # --- fan-out ------------------------------------------------------------------------

    async def fanout(self, server: Server, half_rate: float | None) -> dict[str, Any]:
        """Clients added step by step at ``rate``, then the rate stepped up at full size.

        The maximum sustained load is the last sustained step of the rate
        sweep. The latency figure is taken at half of it: the gateway's own
        half (``half_rate`` None), or the gateway's for a peer, so that every
        server is compared at the same load.
        """
        p = self.p
        sessions = await server.open_sessions(p.sessions)
        await server.load(sessions, p.rate)
        by_clients: list[Step] = []
        connected = 0
        for total in p.client_counts:
            per_session = total // p.sessions
            add = per_session - connected // p.sessions
            targets = [server.target(s, CHAT) for s in sessions for _ in range(add)]
            connected += await self.pool.open("live", targets)
            step = await self.window(server, connected, p.rate, p.sessions)
            by_clients.append(step)
            self.log(f"  {connected} clients: {_brief(step)}")
        by_rate = [by_clients[-1]]
        for rate in p.rates:
            await server.load(sessions, rate)
            step = await self.window(server, connected, rate, p.sessions)
            by_rate.append(step)
            self.log(f"  {rate:g}/s per session: {_brief(step)}")
            if not step.sustained:
                break
        sustained = [s for s in by_rate if s.sustained]
        best = max(sustained, key=lambda s: s.events_per_s) if sustained else by_rate[0]
        rate_half = half_rate if half_rate is not None else best.rate / 2
        await server.load(sessions, rate_half)
        half = await self.window(server, connected, rate_half, p.sessions)
        self.log(f"  half load ({rate_half:g}/s per session): {_brief(half)}")
        await server.unload()
        await self.pool.close("live")
        return {
            "by_clients": [s.as_dict() for s in by_clients],
            "by_rate": [s.as_dict() for s in by_rate],
            "reference": by_clients[-1].as_dict(),
            "max_sustained": {**best.as_dict(), "found": bool(sustained)},
            "half_load": half.as_dict(),
        }

    # --- slow clients -------------------------------------------------------------------

    async def slow_clients(self, gw: GatewayServer) -> dict[str, Any]:
        """A share of the clients stop reading: they must get 1008, the others must not notice.

        Two windows at the same load and the same connections: a baseline where
        every client reads, then one from the moment the stalled clients stop
        reading until the gateway has closed all of them (PROTOCOL section 3,
        backpressure). A stalled client has a small receive buffer, so what it
        does not read backs up into the gateway's queue rather than into the
        kernel's; it resumes reading once the gateway has reported the overflow
        (``bus.handler_warning``), within ``close_grace_s``, to read its 1008.
        """
        p = self.p
        driver = gw.driver
        assert driver is not None
        sessions = await gw.open_sessions(p.slow_sessions)
        stalled_per = max(1, round(p.slow_clients * p.stalled_share))
        others_per = p.slow_clients - stalled_per
        others = [gw.target(s, CHAT) for s in sessions for _ in range(others_per)]
        stalled = [gw.target(s, CHAT, rcvbuf=4096) for s in sessions for _ in range(stalled_per)]
        await self.pool.open("live", others)
        await self.pool.open("stalled", stalled)
        await gw.load(sessions, p.slow_rate)
        clients = len(others) + len(stalled)
        baseline = await self.window(gw, clients, p.slow_rate, p.slow_sessions)
        warned_before = driver.slow_client_warnings
        cpu0, t0 = gw.cpu_seconds(), time.monotonic()
        await self.pool.call("pause", group="stalled")
        deadline = t0 + p.stall_timeout_s
        while driver.slow_client_warnings - warned_before < len(stalled):
            if time.monotonic() > deadline:
                break
            await asyncio.sleep(0.01)
        overflow_s = time.monotonic() - t0
        await self.pool.call("resume", group="stalled")
        closed = await self.pool.call("wait_closed", group="stalled", timeout_s=15.0)
        window = await self.pool.mark()
        wall = time.monotonic() - t0
        during = self._step(
            window, wall, cpu0, gw.cpu_seconds(), len(others), p.slow_rate, p.slow_sessions, "live"
        )
        await gw.unload()
        await self.pool.close("live")
        await self.pool.close("stalled")
        codes: dict[int, int] = {}
        for reply in closed:
            for code, n in reply["codes"].items():
                codes[code] = codes.get(code, 0) + n
        base_p99 = baseline.p99_ms
        ratio = None
        if base_p99 and during.p99_ms is not None:
            ratio = round(during.p99_ms / base_p99, 2)
        return {
            "clients": clients,
            "stalled": len(stalled),
            "stalled_close_codes": {str(k): v for k, v in sorted(codes.items())},
            "stalled_got_1008": codes.get(1008, 0) == len(stalled),
            "overflow_s": round(overflow_s, 2),
            "others_p99_ms_baseline": base_p99,
            "others_p99_ms_stalled": during.p99_ms,
            "others_p99_ratio": ratio,
            "others_clients_open": during.clients_open,
            "baseline": baseline.as_dict(),
            "stalled_window": during.as_dict(),
        }

    # --- replay ---------------------------------------------------------------------------

    async def replays(self, gw: GatewayServer) -> dict[str, Any]:
        """10,000 events replayed to one client, then N clients reconnecting at once.

        The session's history is one turn of tool rounds (ten ``sleep 0`` tools
        per round), which makes mostly catalog events, the replayable kind
        (PROTOCOL section 5). ``since`` is chosen so that exactly
        ``replay_events`` (then ``storm_events``) events follow it.
        """
        p = self.p
        assert gw.http is not None
        (session,) = await gw.open_sessions(1)
        ids = await self._history(gw, session, p.replay_events + 50)
        one = await self._replay_group(gw, "replay", session, ids[-p.replay_events - 1], 1)
        storm = await self._replay_group(
            gw, "storm", session, ids[-p.storm_events - 1], p.storm_clients
        )
        await self.pool.close("replay")
        await self.pool.close("storm")
        storm_s = (storm["done_ms"] - storm["started_ms"]) / 1000
        return {
            "one_client": {
                "events": one["expected"],
                "received": one["received"],
                "ms": round(one["longest_ms"], 1),
            },
            "storm": {
                "clients": p.storm_clients,
                "events_each": p.storm_events,
                "events": storm["expected"],
                "received": storm["received"],
                "complete_clients": storm["complete"],
                "s": round(storm_s, 3),
                "events_per_s": round(storm["received"] / storm_s, 1) if storm_s > 0 else None,
                "slowest_client_ms": round(storm["longest_ms"], 1),
            },
        }

    async def _history(self, gw: GatewayServer, session: str, events: int) -> list[str]:
        """Run one long tool turn; return the ids of its replayable events, in order."""
        assert gw.http is not None
        full = b'{"type":"subscribe","filter":"preset:full","since":null,"snapshot":false}'
        recorder = _Recorder(gw.host, gw.port, await attach_path(gw.http, session), full)
        await open_ws(recorder)
        await asyncio.sleep(0.05)
        tools = 10
        rounds = -(-events // (3 + 2 * tools))
        tool = {"tool_use": {"name": "sleep", "input": {"seconds": 0}}}
        script = {"rounds": [[tool] * tools for _ in range(rounds)] + [[{"text": "done"}]]}
        await gw.http.request(
            "POST", f"/sessions/{session}/turns", {"content": json.dumps({"script": script})}
        )
        await asyncio.wait_for(recorder.turn_over.wait(), 120)
        replayable = _replayable_types()
        heads = [msgspec.json.decode(f, type=_EventFrame).event for f in recorder.frames]
        self._keep_open = recorder  # its close would add an event to the history
        return [h.id for h in heads if h.type in replayable]

    async def _replay_group(
        self, gw: GatewayServer, group: str, session: str, since: str, clients: int
    ) -> dict[str, Any]:
        targets = [gw.target(session, replay_subscribe(since), mode="count")] * clients
        await self.pool.prepare(group, targets)
        await self.pool.connect(group, all_at_once=True)
        replies = await self.pool.call("wait_replayed", group=group, timeout_s=60.0)
        busy = [r for r in replies if r["connections"]]
        return {
            "started_ms": min(r["started_ms"] for r in busy),
            "done_ms": max(r["done_ms"] for r in busy),
            "longest_ms": max(r["longest_ms"] for r in replies),
            "complete": sum(r["complete"] for r in replies),
            "expected": sum(r["expected"] for r in replies),
            "received": sum(r["received"] for r in replies),
        }

    # --- idle connections -----------------------------------------------------------------

    async def idle(self, server: Server) -> dict[str, Any]:
        """Server RSS per idle, subscribed connection, at each of ``idle_counts``."""
        p = self.p
        sessions = await server.open_sessions(p.idle_sessions)
        await asyncio.sleep(0.5)
        base = server.rss_bytes()
        points = []
        connected = 0
        for total in p.idle_counts:
            targets = [
                server.target(sessions[i % len(sessions)], CHAT)
                for i in range(connected, total)
            ]
            connected += await self.pool.open("idle", targets)
            await asyncio.sleep(1.0)
            rss = server.rss_bytes()
            per = None if rss is None or base is None else round((rss - base) / connected)
            points.append({"connections": connected, "rss_bytes": rss, "bytes_per_connection": per})
            self.log(f"  {connected} idle: {per} bytes each")
        await self.pool.close("idle")
        return {"base_rss_bytes": base, "points": points}


    # --- time to first token ---------------------------------------------------------------

    async def ttft(self) -> dict[str, Any]:
        """Time to first token added by the gateway: :mod:`bench.ttft`, when it is there."""
        try:
            from bench import ttft  # type: ignore[attr-defined]
        except ImportError:
            return {"available": False, "note": "bench/ttft.py is not in this tree"}
        self.log("gateway: time to first token")
        return dict(await ttft.measure(self.workdir / "ttft"))


def _replayable_types() -> set[str]:
    """Catalog types plus ``message.complete`` (PROTOCOL section 3, replay)."""
    from gateway.protocol.events import EVENT_TYPES

    return {t for t, spec in EVENT_TYPES.items() if spec.catalog} | {"message.complete"}


def _brief(step: Step) -> str:
    cpu = "-" if step.cpu_us_per_event is None else f"{step.cpu_us_per_event:.1f} us/event"
    flags = "" if step.sustained else " (not sustained)"
    flags += " (client-limited)" if step.client_limited else ""
    return (
        f"{step.events_per_s:,.0f} events/s of {step.offered_events_per_s:,.0f}, {cpu}, "
        f"p99 {step.p99_ms} ms, server {step.server_cpu_util}, "
        f"client {step.client_cpu_util}{flags}"
    )

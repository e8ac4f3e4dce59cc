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
import contextlib
import json
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import msgspec

from bench.driver import attach_path, lorem_script
from bench.measure import Meter, Step, machine_busy_s
from bench.nodes import NodesServer
from bench.pool import WorkerPool
from bench.profiles import Profile
from bench.servers import GatewayServer, PeerServer, Server
from bench.wire import WsClient, open_ws

CHAT = b'{"type":"subscribe","filter":"preset:chat","since":null,"snapshot":false}'


def replay_subscribe(since: str) -> bytes:
    return json.dumps(
        {"type": "subscribe", "filter": "preset:full", "since": since, "snapshot": False}
    ).encode()


class _Recorder(WsClient):
    """Keeps every event frame of a session until the turn in flight ends."""

    def __init__(self, host: str, port: int, path: str, subscribe: bytes) -> None:
        super().__init__(host, port, path, subscribe)
        self.frames: list[bytes] = []
        self._turn_over = asyncio.get_running_loop().create_future()

    def on_text(self, payload: bytes, now: float) -> None:
        if payload.startswith(b'{"type":"event"'):
            self.frames.append(payload)
            if b'"type":"turn.completed"' in payload or b'"type":"turn.cancelled"' in payload:
                self._turn_over.set_result(None)

    async def turn(self, timeout_s: float) -> list[bytes]:
        """The frames up to the end of the turn.

        Raises:
            RuntimeError: the gateway closed this connection first (a batch
                larger than ``queue_max_events`` closes any client with 1008).
        """
        await asyncio.wait([self._turn_over, self.closed], timeout=timeout_s,
                           return_when=asyncio.FIRST_COMPLETED)  # fmt: skip
        if not self._turn_over.done():
            raise RuntimeError(
                f"recording a turn: no turn end after {timeout_s} s (connection close code "
                f"{self.close_code}; a 1008 means queue_max_events is too small for the load)"
            )
        return self.frames


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
        fresh_gateway: Callable[[], GatewayServer],
        log: Callable[[str], None] = print,
    ) -> None:
        self.p = profile
        self.pool = pool
        self.workdir = workdir
        self.gateway = gateway
        self.fresh_gateway = fresh_gateway  # for the idle phase
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
        fresh: list[tuple[str, Callable[[], Server]]] = [("gateway", self.fresh_gateway)]
        fresh += [(kind, self._peer_maker(kind)) for kind in p.peers]
        for name, make in fresh:
            self.log(f"{name}: idle connections")
            server = make()
            await server.start()
            try:
                result["servers"][name]["idle"] = await self.idle(server)
            finally:
                await server.stop()
        result["ttft"] = await self.ttft() if p.ttft else {"skipped": True}
        return result

    def _peer_maker(self, kind: str) -> Callable[[], Server]:
        return lambda: PeerServer(kind, self.frames_file, self.workdir)

    async def compare_backends(
        self, gateways: dict[str, GatewayServer], rates: Sequence[float] | None = None
    ) -> dict[str, Any]:
        """The fan-out of one node on each store backend, in this order, at the same loads.

        The first gateway's sweep decides the half load (half its maximum
        sustained rate); every other gateway is measured at that same load,
        as the peers are, after a sweep of its own (its own maximum). Then
        each runs one turn of tool rounds (:meth:`catalog_turn`): the load
        where the store writes most. Nothing else runs: no peers, slow
        clients, replays, idle connections or time to first token. ``rates``:
        the rate sweep, if not the profile's ``rates``.
        """
        result: dict[str, Any] = {"servers": {}}
        half: float | None = None
        for backend, gw in gateways.items():
            self.gateway = gw
            await gw.start()
            try:
                self.log(f"gateway on {backend}: recording the load turn's frames")
                result.setdefault("frames", await self.record_turn())
                self.log(f"gateway on {backend}: fan-out")
                fanout = await self.fanout(gw, half_rate=half, rates=rates)
                self.log(f"gateway on {backend}: a turn of tool rounds")
                catalog = await self.catalog_turn(gw)
            finally:
                await gw.stop()
            result["servers"][backend] = {"fanout": fanout, "catalog": catalog}
            half = fanout["half_load"]["rate"]
        return result

    async def several_nodes(
        self,
        make: Callable[[int, str], NodesServer],
        count: int,
        shapes: Sequence[str],
        one_node: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """The fan-out of one node, then of ``count`` nodes in each shape, on one Redis each.

        Every configuration (:mod:`bench.nodes`) is fresh (its own redis-server
        and nodes) and swept over the same steps, ``node_rates`` (finer than
        ``rates``: the most a node sustains is the figure here), to its own
        maximum, and each at one node's half load (as the peers are at the
        gateway's), so that latency and unit costs compare at the same load.
        ``one_node``: the fan-out of one node
        on Redis already measured with those steps (``--backend both``), taken
        as the first configuration instead of measuring another. The load
        turn's frames are recorded on the first configuration's node 0 when no
        earlier phase has. A configuration that fails (a client refused, a node
        that does not start) has its ``error`` in the result instead of its
        fan-out, and the next one runs.
        """
        result: dict[str, Any] = {"count": count, "configurations": {}}
        plan = [*([] if one_node else [(1, "local")]), *((count, shape) for shape in shapes)]
        half: float | None = one_node["half_load"]["rate"] if one_node else None
        if one_node is not None:
            sessions = one_node["sessions"]
            result["configurations"]["1 node"] = {"nodes": 1, "fanout": one_node, "placement": {
                "shape": "local", "sessions_owned": [sessions], "sessions_served": [sessions],
            }}  # fmt: skip
        for nodes, shape in plan:
            name = "1 node" if nodes == 1 else f"{nodes} nodes, {shape}"
            server = make(nodes, shape)
            await server.start()
            outcome: dict[str, Any] = {}
            try:
                if not self.frames_file.exists():
                    self.gateway = server.first
                    self.log(f"{name}: recording the load turn's frames")
                    result["frames"] = await self.record_turn()
                self.log(f"{name}: fan-out")
                outcome["fanout"] = await self.fanout(
                    server, half_rate=half, rates=self.p.node_rates
                )
                half = half or outcome["fanout"]["half_load"]["rate"]
            except Exception as exc:  # said in the result; the other configurations go on
                outcome["error"] = f"{type(exc).__name__}: {exc}"[:1000]
                self.log(f"{name}: failed: {outcome['error']}")
                with contextlib.suppress(Exception):
                    await self.pool.close("live")
            finally:
                await server.stop()
            result["configurations"][name] = {
                "nodes": nodes, "placement": server.placement(), **outcome,
            }  # fmt: skip
        return result

    async def catalog_turn(self, gw: GatewayServer) -> dict[str, Any]:
        """One turn of tool rounds to one client: every event stored, the store's worst case.

        The fan-out's load is mostly ``text.delta``, which is live only (PROTOCOL
        section 5): the store writes a few events per turn, whatever the
        client count. Here nearly every event is a catalog event (a hundred
        ``sleep 0`` tools per round, ``replay_events`` events in all), written
        before the one ``preset:full`` client gets it: the gateway's and
        redis-server's CPU per event over the turn, and how long it took.
        """
        (session,) = await gw.open_sessions(1)
        cpu0, store0, busy0 = gw.cpu_seconds(), gw.store_cpu_seconds(), machine_busy_s()
        own0, t0 = time.process_time(), time.monotonic()
        ids, recorder = await self._history(gw, session, self.p.replay_events)
        wall = time.monotonic() - t0
        cpu1, store1 = gw.cpu_seconds(), gw.store_cpu_seconds()
        # The client is this process (the workers hold no connection meanwhile).
        others = machine_busy_s() - busy0 - (time.process_time() - own0)
        others -= sum(b - a for a, b in ((cpu0, cpu1), (store0, store1)) if a and b)
        events = len(recorder.frames)
        recorder.abort()

        def per_event(before: float | None, after: float | None) -> float | None:
            if before is None or after is None or not events:
                return None
            return round((after - before) / events * 1e6, 2)

        self.log(f"  {events} events ({len(ids)} stored) in {wall:.2f} s")
        return {
            "events": events,
            "stored_events": len(ids),
            "s": round(wall, 3),
            "cpu_us_per_event": per_event(cpu0, cpu1),
            "store_cpu_us_per_event": per_event(store0, store1),
            "other_cpu_util": round(max(0.0, others) / wall, 3),
        }

    # --- recording ------------------------------------------------------------------

    async def record_turn(self) -> dict[str, Any]:
        """One load turn on the gateway, its frames kept for the peers to replay."""
        gw = self.gateway
        assert gw.http is not None
        (session,) = await gw.open_sessions(1)
        path = await attach_path(gw.http, session)
        recorder = _Recorder(gw.host, gw.port, path, CHAT)
        await open_ws(recorder)
        await recorder.answered
        content = lorem_script(1000.0, self.p.words)
        await gw.http.request("POST", f"/sessions/{session}/turns", {"content": content})
        recorded = await recorder.turn(timeout_s=60)
        recorder.abort()
        deltas = _write_frames(self.frames_file, recorded)
        self.events_per_delta = len(recorded) / deltas
        return {
            "events_per_turn": len(recorded),
            "deltas_per_turn": deltas,
            "mean_frame_bytes": round(sum(map(len, recorded)) / len(recorded), 1),
        }

    # --- windows ----------------------------------------------------------------------

    async def window(
        self, server: Server, clients: int, rate: float, *, seconds: float | None = None
    ) -> Step:
        """Let the load settle, then measure ``window_s`` (or ``seconds``) of it.

        (The module docstring says what a window is.)
        """
        await asyncio.sleep(self.p.settle_s)
        await self.pool.mark()
        counters = await server.counters()
        meter = Meter(server)
        await asyncio.sleep(self.p.window_s if seconds is None else seconds)
        window = await self.pool.mark()
        step = meter.step(window, "live", clients=clients, rate=rate, offered=self.offered(
            clients, rate))  # fmt: skip
        step.nodes = server.window_figures(counters, await server.counters(), meter.wall_s)
        return step

    def offered(self, clients: int, rate: float) -> float:
        """Events per second the load asks for: every client gets every event of its session."""
        return clients * rate * self.events_per_delta

    # --- fan-out ------------------------------------------------------------------------

    async def fanout(
        self, server: Server, half_rate: float | None, rates: Sequence[float] | None = None
    ) -> dict[str, Any]:
        """Clients added step by step at ``rate``, then the rate stepped up at full size.

        The maximum sustained load is the busiest sustained step of the rate
        sweep, which stops at the first step not sustained. The latency figure
        is taken at half of it: the gateway's own half (``half_rate`` None), or
        the gateway's for a peer, so that every server is compared at the same
        load. Clients connect while the load is paused, so that connecting
        is not measured and does not compete with it; after a step that was not
        sustained the load stops until what it left queued has arrived
        (:meth:`_drain`), so that the half-load window measures its own load.
        """
        p = self.p
        sessions = await server.open_sessions(p.sessions)
        by_clients: list[Step] = []
        connected = 0
        for total in p.client_counts:
            per_session = total // p.sessions
            await self._connect_live(server, sessions, per_session - connected // p.sessions)
            connected = per_session * p.sessions
            await server.load(sessions, p.rate)
            step = await self.window(server, connected, p.rate)
            by_clients.append(step)
            self.log(f"  {connected} clients: {_brief(step)}")
        by_rate = [by_clients[-1]]
        for rate in p.rates if rates is None else rates:
            await server.load(sessions, rate)
            step = await self.window(server, connected, rate)
            by_rate.append(step)
            self.log(f"  {rate:g}/s per session: {_brief(step)}")
            if not step.sustained:
                break
        sustained = [s for s in by_rate if s.sustained]
        best = max(sustained, key=lambda s: s.events_per_s) if sustained else None
        peak = max([*by_clients, *by_rate], key=lambda s: s.events_per_s)
        if by_rate[-1].clients_open < connected:  # overload closed some: start afresh
            await server.unload()
            await self.pool.close("live")
            await self._connect_live(server, sessions, connected // p.sessions)
        elif not by_rate[-1].sustained:  # what it left queued must not land in the next window
            await server.unload()
            await self._drain()
        # With none sustained: half the lightest step, still a load that was measured.
        rate_half = half_rate if half_rate is not None else (best or by_rate[0]).rate / 2
        await server.load(sessions, rate_half)
        half = await self.window(server, connected, rate_half, seconds=p.latency_window_s)
        self.log(f"  half load ({rate_half:g}/s per session): {_brief(half)}")
        await server.unload()
        await self.pool.close("live")
        return {
            "sessions": p.sessions,
            "by_clients": [s.as_dict() for s in by_clients],
            "by_rate": [s.as_dict() for s in by_rate],
            "reference": by_clients[-1].as_dict(),
            "max_sustained": best.as_dict() if best else None,
            "peak": peak.as_dict(),
            "half_load": half.as_dict(),
        }

    async def _drain(self, quiet_s: float = 0.25, limit_s: float = 15.0) -> None:
        """Wait until the live clients get nothing for ``quiet_s`` (at most ``limit_s``).

        An overloaded step can leave a backlog behind it (in the server's
        queues, or between nodes in Redis's buffers), still arriving once the
        load has stopped.
        """
        deadline = time.monotonic() + limit_s
        await self.pool.mark()
        while time.monotonic() < deadline:
            await asyncio.sleep(quiet_s)
            if not (await self.pool.mark()).group("live").events:
                return

    async def _connect_live(self, server: Server, sessions: list[str], per_session: int) -> None:
        await server.unload()
        targets = [server.target(s, CHAT) for s in sessions for _ in range(per_session)]
        await self.pool.open("live", targets)

    # --- slow clients -------------------------------------------------------------------

    async def slow_clients(self, gw: GatewayServer) -> dict[str, Any]:
        """A share of the clients stop reading: they must get 1008, the others must not notice.

        Two windows at the same load and the same connections: a baseline where
        every client reads, then one from the moment the stalled clients stop
        reading until the gateway has closed all of them (docs/protocol.md §3,
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
        baseline = await self.window(gw, len(others), p.slow_rate, seconds=p.latency_window_s)
        warned_before = driver.slow_client_warnings
        meter = Meter(gw)
        await self.pool.call("pause", group="stalled")
        deadline = time.monotonic() + p.stall_timeout_s
        while driver.slow_client_warnings - warned_before < len(stalled):
            if time.monotonic() > deadline:
                break
            await asyncio.sleep(0.01)
        overflow_s = time.monotonic() - meter.t0
        warnings = driver.slow_client_warnings - warned_before
        await self.pool.call("resume", group="stalled")
        closed = await self.pool.call("wait_closed", group="stalled", timeout_s=15.0)
        during = meter.step(
            await self.pool.mark(), "live", clients=len(others), rate=p.slow_rate,
            offered=self.offered(len(others), p.slow_rate),
        )  # fmt: skip
        await gw.unload()
        await self.pool.close("live")
        await self.pool.close("stalled")
        codes: dict[int, int] = {}
        for reply in closed:
            for code, n in reply["codes"].items():
                codes[code] = codes.get(code, 0) + n
        ratio = None
        if baseline.p99_ms and during.p99_ms is not None:
            ratio = round(during.p99_ms / baseline.p99_ms, 2)
        return {
            "clients": len(others) + len(stalled),
            "stalled": len(stalled),
            "stalled_close_codes": {str(k): v for k, v in sorted(codes.items())},
            "stalled_got_1008": codes.get(1008, 0) == len(stalled),
            "overflow_s": round(overflow_s, 2),
            "overflow_warnings": warnings,
            "others_p99_ms_baseline": baseline.p99_ms,
            "others_p99_ms_stalled": during.p99_ms,
            "others_p99_ratio": ratio,
            "baseline": baseline.as_dict(),
            "stalled_window": during.as_dict(),
        }

    # --- replay ---------------------------------------------------------------------------

    async def replays(self, gw: GatewayServer) -> dict[str, Any]:
        """10,000 events replayed to one client, then N clients reconnecting at once.

        The session's history is one turn of tool rounds (a hundred ``sleep 0``
        tools per round), which makes mostly catalog events, the replayable kind
        (docs/protocol.md §5). ``since`` is chosen so that exactly
        ``replay_events`` (then ``storm_events``) events follow it.
        """
        p = self.p
        assert gw.http is not None
        (session,) = await gw.open_sessions(1)
        # The recorder stays open until the end: its close would add an event.
        ids, recorder = await self._history(gw, session, p.replay_events + 50)
        one = await self._replay_group(gw, "replay", session, ids[-p.replay_events - 1], 1)
        storm = await self._replay_group(
            gw, "storm", session, ids[-p.storm_events - 1], p.storm_clients
        )
        await self.pool.close("replay")
        await self.pool.close("storm")
        recorder.abort()
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
                # Until the last client's handshake was done and its subscribe sent.
                "connecting_s": round((storm["subscribed_ms"] - storm["started_ms"]) / 1000, 3),
                "events_per_s": round(storm["received"] / storm_s, 1) if storm_s > 0 else None,
                "slowest_client_ms": round(storm["longest_ms"], 1),
                "server_cpu_util": storm["server_cpu_util"],
                "client_cpu_util": storm["client_cpu_util"],
                "other_cpu_util": storm["other_cpu_util"],
            },
        }

    async def _history(
        self, gw: GatewayServer, session: str, events: int
    ) -> tuple[list[str], _Recorder]:
        """Run one long tool turn; return the ids of its replayable events, in order.

        Also returns the connection that recorded them, still open.
        """
        assert gw.http is not None
        full = b'{"type":"subscribe","filter":"preset:full","since":null,"snapshot":false}'
        recorder = _Recorder(gw.host, gw.port, await attach_path(gw.http, session), full)
        await open_ws(recorder)
        await recorder.answered
        tools = 100
        rounds = -(-events // (3 + 2 * tools))
        tool = {"tool_use": {"name": "sleep", "input": {"seconds": 0}}}
        script = {"rounds": [[tool] * tools for _ in range(rounds)] + [[{"text": "done"}]]}
        await gw.http.request(
            "POST", f"/sessions/{session}/turns", {"content": json.dumps({"script": script})}
        )
        recorded = await recorder.turn(timeout_s=120)
        replayable = _replayable_types()
        heads = [msgspec.json.decode(f, type=_EventFrame).event for f in recorded]
        return [h.id for h in heads if h.type in replayable], recorder

    async def _replay_group(
        self, gw: GatewayServer, group: str, session: str, since: str, clients: int
    ) -> dict[str, Any]:
        """``clients`` connect at once with ``since`` (attach tokens fetched beforehand)."""
        targets = [gw.target(session, replay_subscribe(since), mode="count")] * clients
        await self.pool.prepare(group, targets)
        await self.pool.mark()
        meter = Meter(gw)
        await self.pool.connect(group, all_at_once=True)
        replies = await self.pool.call("wait_replayed", group=group, timeout_s=60.0)
        cpu = meter.step(await self.pool.mark(), group, clients=clients, rate=0, offered=0)
        busy = [r for r in replies if r["connections"]]
        return {
            "started_ms": min(r["started_ms"] for r in busy),
            "done_ms": max(r["done_ms"] for r in busy),
            "subscribed_ms": max(r["subscribed_ms"] for r in busy),
            "longest_ms": max(r["longest_ms"] for r in replies),
            "complete": sum(r["complete"] for r in replies),
            "expected": sum(r["expected"] for r in replies),
            "received": sum(r["received"] for r in replies),
            "server_cpu_util": cpu.server_cpu_util,
            "client_cpu_util": cpu.client_cpu_util,
            "other_cpu_util": cpu.other_cpu_util,
        }

    # --- idle connections -----------------------------------------------------------------

    async def idle(self, server: Server) -> dict[str, Any]:
        """Server RSS per idle, subscribed connection, at each of ``idle_counts``."""
        p = self.p
        sessions = await server.open_sessions(p.idle_sessions)
        await asyncio.sleep(p.idle_settle_s)
        base = server.rss_bytes()
        points = []
        connected = 0
        for total in p.idle_counts:
            targets = [
                server.target(sessions[i % len(sessions)], CHAT) for i in range(connected, total)
            ]
            connected += await self.pool.open("idle", targets)
            await asyncio.sleep(p.idle_settle_s)
            rss = server.rss_bytes()
            per = None if rss is None or base is None else round((rss - base) / connected)
            points.append({"connections": connected, "rss_bytes": rss, "bytes_per_connection": per})
            self.log(f"  {connected} idle: {per} bytes each")
        await self.pool.close("idle")
        return {"base_rss_bytes": base, "points": points}

    # --- time to first token ---------------------------------------------------------------

    async def ttft(self) -> dict[str, Any]:
        """Time to first token added by the gateway, measured by :mod:`bench.ttft`.

        That module times the same fake Messages API
        stream three ways: the Anthropic SDK alone, the gateway's provider and
        translator in process, and a real gateway over HTTP and WebSocket. It
        runs under Trio in a process of its own; the figure here is the
        gateway's median minus the SDK's.
        """
        self.log("gateway: time to first token")
        code = (
            "import json, trio; from bench.ttft import measure; "
            f"print(json.dumps(trio.run(measure, {self.p.ttft_runs}, {self.p.ttft_warmup})))"
        )
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", code,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, err = await proc.communicate()
        if proc.returncode != 0:
            return {"error": err.decode(errors="replace")[-1000:]}
        samples: dict[str, list[float]] = json.loads(out.splitlines()[-1])
        paths = {name: _ms_summary(values) for name, values in samples.items()}
        sdk = paths["sdk"]["median_ms"]
        return {
            "runs": self.p.ttft_runs,
            "paths": paths,
            "added_ms": round(paths["gateway"]["median_ms"] - sdk, 3),
            "provider_added_ms": round(paths["provider"]["median_ms"] - sdk, 3),
        }


def _ms_summary(seconds: list[float]) -> dict[str, float]:
    ordered = sorted(seconds)
    return {
        "median_ms": round(statistics.median(ordered) * 1000, 3),
        "p90_ms": round(ordered[int(0.9 * (len(ordered) - 1))] * 1000, 3),
        "min_ms": round(ordered[0] * 1000, 3),
    }


def _write_frames(path: Path, frames: list[bytes]) -> int:
    """The recorded frames as :mod:`bench.peers` reads them; returns how many are deltas."""
    rows = [{"data": f.decode(), "delta": b'"type":"text.delta"' in f} for f in frames]
    path.write_text(json.dumps(rows))
    return sum(1 for row in rows if row["delta"])


def _replayable_types() -> set[str]:
    """Catalog types plus ``message.complete`` (docs/protocol.md §3, replay)."""
    from gateway.protocol.events import EVENT_TYPES

    return {t for t, spec in EVENT_TYPES.items() if spec.catalog} | {"message.complete"}


def _brief(step: Step) -> str:
    cpu = "-" if step.cpu_us_per_event is None else f"{step.cpu_us_per_event:.1f} us/event"
    if step.store_cpu_us_per_event is not None:
        cpu += f" + redis-server {step.store_cpu_us_per_event:.1f}"
    flags = "" if step.sustained else " (not sustained)"
    flags += " (client-limited)" if step.client_limited else ""
    flags += f" (noisy: others used {step.other_cpu_util} cores)" if step.noisy else ""
    store = "" if step.store_cpu_util is None else f"redis-server {step.store_cpu_util}, "
    return (
        f"{step.events_per_s:,.0f} events/s of {step.offered_events_per_s:,.0f}, {cpu}, "
        f"p99 {step.p99_ms} ms, server {step.server_cpu_util}, {store}"
        f"client {step.client_cpu_util}{flags}"
    )

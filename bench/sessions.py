"""``python -m bench --profile sessions``: what an idle session costs the daemon's memory.

Two real ``gateway serve`` daemons (:class:`bench.servers.GatewayServer`, the
embedded defaults plus ``[sessions] idle_unload_s``, the scripted model), one
after the other in the same run:

- **unload**: ``idle_unload_s`` short (1 s): an idle session leaves memory
  (docs/protocol.md §13);
- **peer**: ``idle_unload_s`` far longer than the run: every session stays
  loaded. The peer is what the figures are read against.

On each: a few warm-up sessions, then the baseline (RSS, and the gauge
``gateway_sessions_live`` of ``/metrics``); ``sessions`` sessions created
over ``concurrency`` keep-alive connections, each with one short turn
(``POST /sessions``, ``POST .../turns``); the wait for every turn to end
(``gateway_turns_in_flight`` = 0); on **unload**, the wait for the live
gauge to fall back to the baseline (at most ``unload_wait_s``: if it never
does, the report says "not unloaded" and every "unloaded" figure is of
loaded sessions); then RSS again. ``(RSS after - RSS baseline) / sessions``
is the memory per idle session.

Then the attaches, timed one at a time on sessions not touched since their
turn (unloaded ones on **unload**, loaded ones on the peer): ``GET
/sessions/{id}`` for an attach token, the WebSocket handshake, ``subscribe``
and either the ``snapshot`` frame (``snapshot: true``) or the whole replay
(``since``: a cursor taken before the sessions were created, so the replay is
each session's whole history), docs/protocol.md §2 and §3.

Then the churn: ``churn_rounds`` rounds of ``churn_sessions`` sessions
created, given a turn and left to unload, RSS after each round; the slope of
RSS against the round (least squares) should be flat with unloading.

The report (:mod:`bench.sessions_report`) is ``<out>/<stamp>-<profile>.json``
and ``.md``.
"""

from __future__ import annotations

import asyncio
import random
import re
import statistics
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import msgspec

from bench.profiles import SessionsProfile, config_toml
from bench.servers import GatewayServer
from bench.tables import Log, announce, run_profile, stem
from bench.wire import HttpClient, WsClient, open_ws

KINDS = ("unload", "peer")
PATHS = ("snapshot", "since")
ATTACH_TIMEOUT_S = 30.0
TURN = {"content": "hi"}  # the scripted model answers "You said: hi", a word at a time


def gateway_config(profile: SessionsProfile, kind: str) -> dict[str, dict[str, Any]]:
    """The daemon's config: the profile's keys plus ``idle_unload_s`` of ``kind``."""
    idle = profile.idle_unload_s if kind == "unload" else profile.peer_idle_unload_s
    sections = {k: dict(v) for k, v in profile.gateway_config.items()}
    sections.setdefault("sessions", {})["idle_unload_s"] = idle
    return sections


class Gauges:
    """The figures this profile reads in ``GET /metrics`` (docs/operating.md, the families)."""

    NAMES = ("gateway_sessions_live", "gateway_turns_in_flight")
    OPTIONAL = ("gateway_sessions_unloaded_total",)  # a daemon that unloads counts them

    def __init__(self, http: HttpClient) -> None:
        self.http = http

    async def read(self) -> dict[str, float]:
        text = (await self.http.request_bytes("GET", "/metrics")).decode()
        found: dict[str, float] = {}
        for name in (*self.NAMES, *self.OPTIONAL):
            match = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
            if match is not None:
                found[name] = float(match.group(1))
            elif name in self.NAMES:
                raise RuntimeError(f"/metrics has no {name}")
        return found

    async def live(self) -> int:
        return int((await self.read())["gateway_sessions_live"])

    async def wait(
        self, name: str, at_most: float, timeout_s: float, stall_s: float | None = None
    ) -> tuple[bool, float, float]:
        """Poll until ``name`` <= ``at_most``: (reached, its last value, seconds waited).

        Gives up after ``timeout_s``, or once ``name`` has not gone below its
        lowest value for ``stall_s`` (nothing is happening: no need to wait on).
        """
        started = last_progress = time.monotonic()
        lowest = float("inf")
        while True:
            value = (await self.read())[name]
            now = time.monotonic()
            if value < lowest:
                lowest, last_progress = value, now
            stalled = stall_s is not None and now - last_progress >= stall_s
            if value <= at_most or now - started >= timeout_s or stalled:
                return value <= at_most, value, round(now - started, 2)
            await asyncio.sleep(0.2)


async def create_sessions(
    host: str, port: int, count: int, concurrency: int
) -> tuple[list[str], float]:
    """``count`` sessions, each with one turn submitted, over ``concurrency`` connections.

    Returns:
        The session ids, in creation order, and the seconds it took.
    """
    ids: list[str] = []
    left = iter(range(count))
    started = time.perf_counter()

    async def one_connection() -> None:
        http = HttpClient(host, port)
        try:
            for _ in left:  # the connections share one iterator: each takes the next
                created = await http.request("POST", "/sessions", {})
                session_id = str(created["session_id"])
                await http.request("POST", f"/sessions/{session_id}/turns", TURN)
                ids.append(session_id)
        finally:
            await http.aclose()

    await asyncio.gather(*(one_connection() for _ in range(max(1, min(concurrency, count)))))
    return ids, time.perf_counter() - started


class AttachClient(WsClient):
    """A client that attaches, and is done at the ``snapshot`` or at the replay's last event."""

    def __init__(self, host: str, port: int, path: str, since: str | None) -> None:
        snapshot = since is None
        subscribe = {"type": "subscribe", "filter": "preset:full", "since": since,
                     "snapshot": snapshot}  # fmt: skip
        super().__init__(host, port, path, msgspec.json.encode(subscribe))
        self.snapshot = snapshot
        self.done: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self.expected = 0
        self.events = 0

    def on_answer(self, payload: bytes, now: float) -> None:
        super().on_answer(payload, now)
        if self.answered.exception() is not None:
            self._finish(error=f"refused: {payload[:200]!r}")
            return
        self.expected = int(msgspec.json.decode(payload)["replay_event_count"])
        if not self.snapshot and self.expected == 0:
            self._finish()

    def on_text(self, payload: bytes, now: float) -> None:
        kind = msgspec.json.decode(payload)["type"]
        if self.snapshot and kind == "snapshot":
            self._finish()
        elif not self.snapshot and kind == "event":
            self.events += 1
            if self.events >= self.expected:
                self._finish()

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self._finish(error=f"closed before the end (close code {self.close_code})")

    def _finish(self, error: str = "") -> None:
        if self.done.done():
            return
        if error:
            self.done.set_exception(ConnectionError(error))
        else:
            self.done.set_result(self.events)


async def attach_once(http: HttpClient, session_id: str, since: str | None) -> dict[str, float]:
    """One attach, timed: the token (``GET``), then handshake to snapshot or replay's end (ms)."""
    started = time.perf_counter()
    answer = await http.request("GET", f"/sessions/{session_id}")
    url = urlsplit(str(answer["ws_url"]))
    assert url.hostname is not None and url.port is not None
    got_token = time.perf_counter()
    client = AttachClient(url.hostname, url.port, f"{url.path}?{url.query}", since)
    await open_ws(client, timeout_s=ATTACH_TIMEOUT_S)
    try:
        events = await asyncio.wait_for(client.done, ATTACH_TIMEOUT_S)
    finally:
        client.abort()
    ended = time.perf_counter()
    return {"total_ms": (ended - started) * 1000, "token_ms": (got_token - started) * 1000,
            "stream_ms": (ended - got_token) * 1000, "events": events}  # fmt: skip


async def cursor_now(server: GatewayServer, session_id: str) -> str:
    """The node's last issued event id: a snapshot's ``snapshot_at_event_id`` (§3)."""
    assert server.http is not None
    answer = await server.http.request("GET", f"/sessions/{session_id}")
    url = urlsplit(str(answer["ws_url"]))
    assert url.hostname is not None and url.port is not None
    seen: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()

    class Snapshot(WsClient):
        def on_text(self, payload: bytes, now: float) -> None:
            if not seen.done() and payload.startswith(b'{"type":"snapshot"'):
                seen.set_result(payload)

    subscribe = {"type": "subscribe", "filter": "preset:full", "snapshot": True}
    client = Snapshot(url.hostname, url.port, f"{url.path}?{url.query}",
                      msgspec.json.encode(subscribe))  # fmt: skip
    await open_ws(client)
    try:
        payload = await asyncio.wait_for(seen, ATTACH_TIMEOUT_S)
    finally:
        client.abort()
    return str(msgspec.json.decode(payload)["snapshot_at_event_id"])


def quantiles(values: list[float]) -> dict[str, float | None]:
    """p50 and p99 (ms, 2 decimals) of ``values``, the nearest rank; None when empty."""
    if not values:
        return {"p50": None, "p99": None, "n": 0}
    ordered = sorted(values)

    def rank(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))], 2)

    return {"p50": rank(0.5), "p99": rank(0.99), "n": len(ordered)}


class DaemonRun:
    """One daemon of the run (``kind``: ``unload`` or ``peer``), measured (module docstring)."""

    def __init__(self, profile: SessionsProfile, kind: str, workdir: Path, log: Log) -> None:
        self.profile = profile
        self.kind = kind
        self.log = log
        text = config_toml(gateway_config(profile, kind), str(workdir / "gateway.db"))
        self.server = GatewayServer(workdir, text)
        self.unloads = kind == "unload"

    async def start(self) -> None:
        await self.server.start()
        assert self.server.http is not None
        self.gauges = Gauges(self.server.http)

    async def stop(self) -> None:
        await self.server.stop()

    def rss(self) -> int:
        rss = self.server.rss_bytes()
        assert rss is not None
        return rss

    async def _batch(self, count: int) -> tuple[list[str], dict[str, Any]]:
        """``count`` sessions with a turn each; every turn ended; on ``unload``, unloaded."""
        p = self.profile
        live_before = await self.gauges.live()
        ids, seconds = await create_sessions(
            self.server.host, self.server.port, count, p.concurrency
        )
        ended, in_flight, turns_s = await self.gauges.wait(
            "gateway_turns_in_flight", 0, p.turns_wait_s
        )
        if not ended:
            raise RuntimeError(f"{in_flight:g} turns still in flight after {p.turns_wait_s} s")
        figures: dict[str, Any] = {
            "created": len(ids),
            "create_s": round(seconds, 2),
            "sessions_per_s": round(len(ids) / seconds, 1) if seconds > 0 else None,
            "turns_wait_s": turns_s,
            "live_before": live_before,
            "live_loaded": await self.gauges.live(),
        }
        if self.unloads:
            unloaded, _, waited = await self.gauges.wait(
                "gateway_sessions_live", live_before, p.unload_wait_s, p.unload_stall_s
            )
            figures |= {"unloaded": unloaded, "unload_wait_s": waited}
        figures["unloaded_total"] = (await self.gauges.read()).get(
            "gateway_sessions_unloaded_total"
        )
        await asyncio.sleep(p.settle_s)
        figures |= {"live_after": await self.gauges.live(), "rss_after": self.rss()}
        return ids, figures

    async def measure(self) -> dict[str, Any]:
        p = self.profile
        result: dict[str, Any] = {"kind": self.kind,
                                  "idle_unload_s": gateway_config(p, self.kind)["sessions"]
                                  ["idle_unload_s"]}  # fmt: skip
        warm, _ = await create_sessions(
            self.server.host, self.server.port, max(1, p.warmup_sessions), p.concurrency
        )
        await self.gauges.wait("gateway_turns_in_flight", 0, p.turns_wait_s)
        cursor = await cursor_now(self.server, warm[0])  # before any measured session
        await asyncio.sleep(p.settle_s)
        result["rss_0"] = self.rss()
        self.live_0 = await self.gauges.live()
        self.log(f"{self.kind}: RSS {result['rss_0'] / 2**20:.1f} MiB; {p.sessions} sessions")
        ids, idle = await self._batch(p.sessions)
        idle["rss_per_session_bytes"] = round((idle["rss_after"] - result["rss_0"]) / len(ids), 1)
        result["idle"] = idle
        self.log(f"{self.kind}: {idle}")
        sample = random.Random(p.seed).sample(ids, min(len(ids), 2 * p.attach_samples))
        result["attach"] = await self._attaches(sample, cursor)
        result["churn"] = await self._churn()
        return result

    async def _attaches(self, sample: list[str], cursor: str) -> dict[str, Any]:
        """Attach to each sampled session once: half with a snapshot, half with ``since``."""
        http = HttpClient(self.server.host, self.server.port)
        live = await self.gauges.live()
        samples: dict[str, list[dict[str, float]]] = {path: [] for path in PATHS}
        try:
            for index, session_id in enumerate(sample):
                path = PATHS[index % 2]
                since = cursor if path == "since" else None
                samples[path].append(await attach_once(http, session_id, since))
        finally:
            await http.aclose()
        attach: dict[str, Any] = {"live_before": live}
        for path, runs in samples.items():
            attach[path] = {part: quantiles([r[part] for r in runs])
                            for part in ("total_ms", "token_ms", "stream_ms")}  # fmt: skip
            attach[path]["events"] = quantiles([r["events"] for r in runs])
        self.log(f"{self.kind}: attach {attach}")
        return attach

    async def _churn(self) -> dict[str, Any]:
        p = self.profile
        if self.unloads:  # the sessions the attaches loaded again leave first
            await self.gauges.wait(
                "gateway_sessions_live", self.live_0, p.unload_wait_s, p.unload_stall_s
            )
        await asyncio.sleep(p.settle_s)
        rss_start = self.rss()  # round 0: the fit's first point
        rounds: list[dict[str, Any]] = []
        for index in range(p.churn_rounds):
            _, figures = await self._batch(p.churn_sessions)
            rounds.append({"round": index + 1, **figures})
            self.log(f"{self.kind}: churn round {index + 1}: RSS {figures['rss_after']}")
        slope = None
        if rounds:
            xs = [0.0, *(float(r["round"]) for r in rounds)]
            ys = [float(rss_start), *(float(r["rss_after"]) for r in rounds)]
            slope = statistics.linear_regression(xs, ys).slope
        return {
            "rss_start": rss_start,
            "rounds": rounds,
            "sessions_per_round": p.churn_sessions,
            "rss_slope_bytes_per_round": None if slope is None else round(slope, 1),
            "rss_slope_bytes_per_session": None
            if slope is None
            else round(slope / p.churn_sessions, 1),
        }


async def run_sessions(profile: SessionsProfile, workdir: Path, log: Log) -> dict[str, Any]:
    """Both daemons, measured one after the other; what each measured, by kind.

    Both start (and stop) at once, which only saves time: an idle daemon
    takes no CPU while the other is measured, and each one's RSS is its own.
    """
    runs = [DaemonRun(profile, kind, workdir / kind, log) for kind in KINDS]
    started = await asyncio.gather(*(r.start() for r in runs), return_exceptions=True)
    try:
        for outcome in started:
            if isinstance(outcome, BaseException):
                raise outcome
        daemons = {r.kind: await r.measure() for r in runs}
    finally:
        await asyncio.gather(*(r.stop() for r in runs))
    return {"profile": profile.name, "sizes": asdict(profile), "daemons": daemons}


def main(profile: SessionsProfile, out: Path, command: str) -> int:
    """Run ``profile``, write ``<out>/<stamp>-<profile>.json`` and ``.md``, print the table."""
    from bench.sessions_report import write  # (the report's module imports this one's names)

    result = run_profile(
        "bench-sessions-", command, lambda tmp, log: asyncio.run(run_sessions(profile, tmp, log))
    )
    announce(result, *write(result, stem(out, profile.name)))
    return 0

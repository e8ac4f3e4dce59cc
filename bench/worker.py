"""A client worker process: many WebSocket connections, counted and timed.

The parent (:class:`bench.pool.WorkerPool`) starts several of these with the
``spawn`` method, so that the clients run in processes of their own, apart
from the server under test, and talks to each over a pipe, one command at a
time. The same workers serve every server of a run (the gateway and its
peers): the issue asks for "the same client processes".

Connections belong to named groups ("live", "stalled", "storm", ...). A group
is opened with :meth:`Worker.op_prepare` (resolve each target's request path,
fetching a gateway attach token where needed, docs/protocol.md §2) and
:meth:`Worker.op_connect` (connect, subscribe, wait for every
``subscribe_ack``). A connection in ``live`` mode decodes each event's ``ts``
and records its latency; one in ``count`` mode only counts frames after the
ack (a replay: decoding would measure the client, not the server).
"""

from __future__ import annotations

import asyncio
import resource
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any
from urllib.parse import urlsplit

import msgspec

from bench.stats import Histogram
from bench.wire import HttpClient, WsClient, now_ms, open_ws


@dataclass(frozen=True)
class Target:
    """One connection to open.

    ``session`` is a gateway session id when ``attach`` is true (an attach
    token is fetched for it), else a peer's channel name.
    """

    host: str
    port: int
    session: str
    subscribe: bytes
    attach: bool = True
    mode: str = "live"  # "live": decode and time every event; "count": count frames only
    rcvbuf: int = 0  # > 0: a small receive window (a client that will stall)

    def path(self, token: str | None) -> str:
        base = f"/sessions/{self.session}/stream"
        return f"{base}?attach={token}" if token else base


class _Event(msgspec.Struct):
    ts: int = 0


class _Frame(msgspec.Struct):
    """What a client needs of a server frame (docs/protocol.md §3): nothing else is decoded."""

    type: str
    event: _Event | None = None
    replay_event_count: int = 0
    nonce: str = ""


_decode_frame = msgspec.json.Decoder(_Frame).decode


@dataclass
class GroupStats:
    """Counters of one group since the last mark."""

    events: int = 0
    bytes: int = 0
    latency: Histogram = field(default_factory=Histogram)


class LoadConn(WsClient):
    """One measured client connection (module docstring)."""

    def __init__(self, target: Target, path: str, stats: GroupStats) -> None:
        super().__init__(target.host, target.port, path, target.subscribe)
        self.stats = stats
        self.live = target.mode == "live"
        self.expected = 0  # replay_event_count of the ack
        self.received = 0
        self.subscribed_at = 0.0
        self.done_at = 0.0  # when ``received`` reached ``expected`` (ms)
        self.replayed = asyncio.get_running_loop().create_future()

    def on_open(self) -> None:
        self.subscribed_at = now_ms()
        super().on_open()

    def on_answer(self, payload: bytes, now: float) -> None:
        frame = _decode_frame(payload)
        if frame.type == "subscribe_ack":
            self.expected = frame.replay_event_count
            if self.expected == 0:
                self._replayed(now)
        super().on_answer(payload, now)

    def on_text(self, payload: bytes, now: float) -> None:
        stats = self.stats
        if not self.live:
            stats.events += 1
            stats.bytes += len(payload)
            self.received += 1
            if self.received == self.expected:
                self._replayed(now)
            return
        frame = _decode_frame(payload)
        event = frame.event
        if event is not None:
            stats.events += 1
            stats.bytes += len(payload)
            stats.latency.add(now - event.ts)
        elif frame.type == "ping":
            self.send_text(b'{"type":"pong","nonce":"%s"}' % frame.nonce.encode())

    def _replayed(self, now: float) -> None:
        self.done_at = now
        self.replayed.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        if not self.replayed.done():
            self.replayed.set_result(None)  # never complete: done_at stays 0


class Worker:
    """Runs the commands of the parent, one at a time, on one asyncio loop."""

    def __init__(self, pipe: Connection) -> None:
        self.pipe = pipe
        self.groups: dict[str, list[LoadConn]] = {}
        self.stats: dict[str, GroupStats] = {}
        self.prepared: dict[str, list[tuple[Target, str]]] = {}
        self.started: dict[str, float] = {}  # group -> when its connect began (ms)
        self._cpu = time.process_time()
        self._http: dict[tuple[str, int], list[HttpClient]] = {}

    async def serve(self) -> None:
        loop = asyncio.get_running_loop()
        commands: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

        def take() -> None:
            try:
                commands.put_nowait(self.pipe.recv())
            except EOFError:  # the parent is gone (killed): leave, never spin on the dead pipe
                loop.remove_reader(self.pipe.fileno())
                commands.put_nowait({"op": "exit", "orphaned": True})

        loop.add_reader(self.pipe.fileno(), take)
        while True:
            command = await commands.get()
            op = command.pop("op")
            if op == "exit":
                break
            try:
                reply = await getattr(self, f"op_{op}")(**command)
            except Exception as exc:
                reply = {"error": f"{op}: {type(exc).__name__}: {exc}"}
            self.pipe.send(reply)
        for conns in self.groups.values():
            for conn in conns:
                conn.abort()
        if not command.get("orphaned"):
            self.pipe.send({})

    # --- commands ----------------------------------------------------------------

    async def op_prepare(self, group: str, targets: list[Target]) -> dict[str, Any]:
        """Resolve request paths (attach tokens for the gateway); connect nothing yet."""
        lanes = 8
        resolved: list[tuple[Target, str] | None] = [None] * len(targets)

        async def lane(k: int) -> None:
            for i in range(k, len(targets), lanes):
                t = targets[i]
                token = None
                if t.attach:
                    answer = await self._client(t.host, t.port, k).request(
                        "GET", f"/sessions/{t.session}"
                    )
                    token = urlsplit(answer["ws_url"]).query.removeprefix("attach=")
                resolved[i] = (t, t.path(token))

        await asyncio.gather(*(lane(k) for k in range(lanes)))
        self.prepared.setdefault(group, []).extend(r for r in resolved if r is not None)
        return {"prepared": len(targets)}

    async def op_connect(
        self, group: str, concurrency: int = 256, timeout_s: float = 60.0
    ) -> dict[str, Any]:
        """Open every prepared connection of ``group`` and wait for each ``subscribe_ack``."""
        todo = self.prepared.pop(group, [])
        stats = self.stats.setdefault(group, GroupStats())
        conns = self.groups.setdefault(group, [])
        self.started[group] = now_ms()
        gate = asyncio.Semaphore(concurrency)
        errors: list[str] = []

        async def one(target: Target, path: str) -> None:
            async with gate:
                conn = LoadConn(target, path, stats)
                try:
                    await open_ws(conn, rcvbuf=target.rcvbuf, timeout_s=timeout_s)
                    conns.append(conn)
                    await asyncio.wait_for(asyncio.shield(conn.answered), timeout_s)
                except Exception as exc:
                    errors.append(f"{type(exc).__name__}: {exc}")

        await asyncio.gather(*(one(t, p) for t, p in todo))
        return {"connected": len(todo) - len(errors), "errors": errors[:5], "failed": len(errors)}

    async def op_mark(self) -> dict[str, Any]:
        """Counters since the last mark, and this process's CPU seconds meanwhile."""
        cpu = time.process_time()
        groups = {}
        for name, stats in self.stats.items():
            groups[name] = {
                "events": stats.events,
                "bytes": stats.bytes,
                "connections": sum(1 for c in self.groups.get(name, ()) if c.open),
                "latency": stats.latency.sparse(),
            }
            self.stats[name] = fresh = GroupStats()
            for conn in self.groups.get(name, ()):
                conn.stats = fresh
        reply = {"cpu_s": cpu - self._cpu, "groups": groups}
        self._cpu = cpu
        return reply

    async def op_pause(self, group: str) -> dict[str, Any]:
        for conn in self.groups.get(group, ()):
            if conn.transport is not None:
                conn.transport.pause_reading()
        return {}

    async def op_resume(self, group: str) -> dict[str, Any]:
        for conn in self.groups.get(group, ()):
            if conn.transport is not None and not conn.transport.is_closing():
                conn.transport.resume_reading()
        return {}

    async def op_wait_closed(self, group: str, timeout_s: float) -> dict[str, Any]:
        """Wait until every connection of ``group`` is closed; report the close codes."""
        conns = self.groups.get(group, [])
        if conns:
            await asyncio.wait([c.closed for c in conns], timeout=timeout_s)
        codes: dict[int, int] = {}
        for conn in conns:
            if conn.closed.done():
                codes[conn.closed.result()] = codes.get(conn.closed.result(), 0) + 1
        return {"codes": codes, "open": sum(1 for c in conns if not c.closed.done())}

    async def op_wait_replayed(self, group: str, timeout_s: float) -> dict[str, Any]:
        """Wait until each connection of ``group`` got all ``replay_event_count`` events."""
        conns = self.groups.get(group, [])
        if conns:
            await asyncio.wait([c.replayed for c in conns], timeout=timeout_s)
        done = [c for c in conns if c.done_at]
        return {
            "connections": len(conns),
            "started_ms": self.started.get(group, 0.0),
            "done_ms": max((c.done_at for c in done), default=0.0),
            "subscribed_ms": max((c.subscribed_at for c in conns), default=0.0),
            "longest_ms": max((c.done_at - c.subscribed_at for c in done), default=0.0),
            "complete": len(done),
            "incomplete": len(conns) - len(done),
            "expected": sum(c.expected for c in conns),
            "received": sum(c.received for c in conns),
        }

    async def op_close(self, group: str) -> dict[str, Any]:
        """Drop every connection of ``group`` (RST: quick, and no close handshake to time)."""
        conns = self.groups.pop(group, [])
        self.stats.pop(group, None)
        self.prepared.pop(group, None)
        for conn in conns:
            conn.abort()
        if conns:
            await asyncio.wait([c.closed for c in conns], timeout=10)
        return {"closed": len(conns)}

    def _client(self, host: str, port: int, lane: int) -> HttpClient:
        clients = self._http.setdefault((host, port), [])
        while len(clients) <= lane:
            clients.append(HttpClient(host, port))
        return clients[lane]


def raise_fd_limit() -> None:
    """Soft ``RLIMIT_NOFILE`` up to the hard limit: 10,000 connections need the descriptors."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def worker_main(pipe: Connection) -> None:
    """Entry point of a spawned worker process."""
    raise_fd_limit()
    asyncio.run(Worker(pipe).serve())

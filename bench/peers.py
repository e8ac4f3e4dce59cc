"""The peer servers the gateway is measured against (the issue's "Peers").

Each runs in its own process (``python -m bench.peers KIND --frames FILE``),
prints ``peer listening on PORT`` when it accepts connections, and takes
commands as JSON lines on stdin::

    {"op": "load", "sessions": S, "rate": R}   # channels "peer-0".."peer-<S-1>", R deltas/s each
    {"op": "stop"}                             # no more events

The frames are the gateway's own: ``--frames`` is a JSON file of event frames
recorded from one gateway turn of the load script (see
:func:`bench.scenarios.record_turn`). A :class:`Producer` per channel plays that
turn in a loop with the gateway's timing (each ``text.delta`` one tick of
``1/R`` s after the previous one, the turn's other events right before the
next delta, as the gateway emits them), rewriting only ``ts`` to the time of
sending, so that end-to-end latency is measured the same way.

- ``ws_queue``: an asyncio ``websockets`` server, one ``asyncio.Queue`` and one
  sending task (the handler) per client: the textbook fan-out.
- ``ws_broadcast``: the same server, fanning out with ``websockets.broadcast()``.

  Both keep the library's defaults (keepalive pings every 20 s, as the
  gateway has its heartbeat) except compression, which the bench's clients
  do not ask for anyway.
- ``raw``: the ceiling: a single-threaded epoll loop that does the WebSocket
  handshake and then writes each pre-built frame to each socket with one
  ``send``, buffering only what the kernel refuses. No queue bound, no
  parsing, no per-client framing: what no gateway logic costs.

A client's first message is taken as its ``subscribe`` and answered with
``{"type":"subscribe_ack","replay_event_count":0}``, so the same client code
drives every server. Nothing else the client sends is interpreted.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import heapq
import json
import os
import selectors
import socket
import sys
import time
from collections.abc import Callable
from typing import Any

from bench.wire import accept_token, server_frame
from bench.worker import raise_fd_limit

ACK = b'{"type":"subscribe_ack","replay_event_count":0}'
KINDS = ("ws_queue", "ws_broadcast", "raw")


class Turn:
    """A recorded turn's frames, split around ``ts`` so a fresh one costs one join."""

    def __init__(self, frames: list[dict[str, Any]]) -> None:
        self.parts: list[tuple[bytes, bytes, bool]] = []
        for frame in frames:
            data = frame["data"].encode()
            start = data.index(b'"ts":') + 5
            end = data.index(b",", start)
            self.parts.append((data[:start], data[end:], frame["delta"]))

    def steps(self) -> list[list[tuple[bytes, bytes]]]:
        """The turn as ticks: each tick is the frames up to and including the next delta."""
        ticks: list[list[tuple[bytes, bytes]]] = [[]]
        for head, tail, delta in self.parts:
            ticks[-1].append((head, tail))
            if delta:
                ticks.append([])
        if not ticks[-1]:
            ticks.pop()
        return ticks


def next_due(due: float, interval: float, now: float) -> float:
    """The next tick's time: on schedule, unless more than an interval behind it."""
    due += interval
    return due if due > now - interval else now


def stamp(head: bytes, tail: bytes) -> bytes:
    """The frame's JSON with ``ts`` = now, in whole ms as the gateway writes it."""
    return b"%s%d%s" % (head, time.time_ns() // 1_000_000, tail)


class Producer:
    """Plays the turn on one channel, one tick every ``1/rate`` s.

    Ticks keep to a fixed schedule while the server keeps up; one that is
    late by more than a whole interval moves the schedule to now instead of
    bursting to catch up, so an overloaded server slows down, as the
    gateway's scripted model (a sleep per delta) does.
    """

    def __init__(self, ticks: list[list[tuple[bytes, bytes]]], emit: Callable[[bytes], None]):
        self.ticks = ticks
        self.emit = emit
        self.position = 0
        self._handle: asyncio.TimerHandle | None = None

    def tick(self) -> None:
        for head, tail in self.ticks[self.position]:
            self.emit(stamp(head, tail))
        self.position = (self.position + 1) % len(self.ticks)

    # On an asyncio loop (the websockets peers; the raw ceiling keeps its own timers).

    def start(self, loop: asyncio.AbstractEventLoop, interval: float, offset: float) -> None:
        due = loop.time() + offset

        def fire() -> None:
            nonlocal due
            self.tick()
            due = next_due(due, interval, loop.time())
            self._handle = loop.call_at(due, fire)

        self._handle = loop.call_at(due, fire)

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()


# --- websockets peers -----------------------------------------------------------


async def run_websockets(kind: str, turn: Turn, port: int) -> None:
    from websockets.asyncio.server import ServerConnection, broadcast, serve
    from websockets.exceptions import ConnectionClosed

    channels: dict[str, set[Any]] = {}
    queues: dict[ServerConnection, asyncio.Queue[bytes | None]] = {}

    class Connection(ServerConnection):
        """Wakes its sending task when the connection is lost (no second task per client)."""

        def connection_lost(self, exc: Exception | None) -> None:
            super().connection_lost(exc)
            queue = queues.get(self)
            if queue is not None:
                queue.put_nowait(None)

    async def handler(ws: ServerConnection) -> None:
        assert ws.request is not None
        channel = channels.setdefault(ws.request.path.split("/")[2], set())
        try:
            await ws.recv()  # the subscribe frame
            await ws.send(ACK, text=True)
            if kind == "ws_broadcast":
                channel.add(ws)
                await ws.wait_closed()
                return
            queue = queues[ws] = asyncio.Queue()
            channel.add(queue)
            while (frame := await queue.get()) is not None:
                await ws.send(frame, text=True)
        except ConnectionClosed:
            pass
        finally:
            channel.discard(ws)
            if ws in queues:
                channel.discard(queues.pop(ws))

    def emitter(name: str) -> Callable[[bytes], None]:
        members = channels.setdefault(name, set())
        if kind == "ws_broadcast":
            return lambda frame: broadcast(members, frame, text=True)

        def to_queues(frame: bytes) -> None:
            for queue in members:
                queue.put_nowait(frame)

        return to_queues

    loop = asyncio.get_running_loop()
    producers: list[Producer] = []

    def start(sessions: int, rate: float) -> None:
        stop()
        interval = 1.0 / rate
        for i in range(sessions):
            producer = Producer(turn.steps(), emitter(f"peer-{i}"))
            # Spread the channels over one interval, as independent sessions would be.
            producer.start(loop, interval, offset=interval * i / sessions)
            producers.append(producer)

    def stop() -> None:
        for producer in producers:
            producer.stop()
        producers.clear()

    async with serve(
        handler, "127.0.0.1", port, create_connection=Connection, compression=None
    ) as server:
        bound = next(iter(server.sockets)).getsockname()[1]
        print(f"peer listening on {bound}", flush=True)
        await _read_commands(start, stop)


async def _read_commands(start: Callable[[int, float], None], stop: Callable[[], None]) -> None:
    reader = asyncio.StreamReader()
    loop = asyncio.get_running_loop()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while line := await reader.readline():
        command = json.loads(line)
        if command["op"] == "load":
            start(int(command["sessions"]), float(command["rate"]))
        elif command["op"] == "stop":
            stop()


# --- raw-socket ceiling ------------------------------------------------------------


class RawConn:
    __slots__ = ("channel", "inbox", "name", "open", "pending", "sock")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.inbox = b""
        self.pending = bytearray()
        self.open = False
        self.name = ""  # the channel named in the request path
        self.channel: list[RawConn] | None = None


class RawCeiling:
    """The raw-socket ceiling (module docstring): one thread, one epoll, no framing per client."""

    def __init__(self, turn: Turn, port: int) -> None:
        self.turn = turn
        self.sel = selectors.DefaultSelector()
        self.listener = socket.create_server(("127.0.0.1", port), backlog=4096)
        self.listener.setblocking(False)
        self.port = self.listener.getsockname()[1]
        self.channels: dict[str, list[RawConn]] = {}
        self.timers: list[tuple[float, int, Producer]] = []
        self.interval = 0.0
        self.sel.register(self.listener, selectors.EVENT_READ, "accept")
        self.sel.register(sys.stdin.fileno(), selectors.EVENT_READ, "stdin")
        self._stdin = b""

    def run(self) -> None:
        print(f"peer listening on {self.port}", flush=True)
        while True:
            timeout = max(0.0, self.timers[0][0] - time.monotonic()) if self.timers else None
            for key, mask in self.sel.select(timeout):
                if key.data == "accept":
                    self._accept()
                elif key.data == "stdin":
                    data = os.read(sys.stdin.fileno(), 65536)
                    if not data:
                        return
                    *lines, self._stdin = (self._stdin + data).split(b"\n")
                    for line in lines:
                        self._command(line)
                elif mask & selectors.EVENT_WRITE:
                    self._flush(key.data)
                else:
                    self._read(key.data)
            now = time.monotonic()
            while self.timers and self.timers[0][0] <= now:
                due, slot, producer = heapq.heappop(self.timers)
                producer.tick()
                due = next_due(due, self.interval, time.monotonic())
                heapq.heappush(self.timers, (due, slot, producer))

    def _command(self, line: bytes) -> None:
        command = json.loads(line)
        self.timers.clear()
        if command["op"] == "load":
            sessions, rate = int(command["sessions"]), float(command["rate"])
            self.interval = 1.0 / rate
            now = time.monotonic()
            for i in range(sessions):
                name = f"peer-{i}"
                members = self.channels.setdefault(name, [])
                producer = Producer(self.turn.steps(), self._emitter(members))
                at = now + self.interval * i / sessions
                heapq.heappush(self.timers, (at, i, producer))

    def _emitter(self, members: list[RawConn]) -> Callable[[bytes], None]:
        def emit(payload: bytes) -> None:
            frame = server_frame(payload)
            for conn in members:
                self._send(conn, frame)

        return emit

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except BlockingIOError:
                return
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.sel.register(sock, selectors.EVENT_READ, RawConn(sock))

    def _read(self, conn: RawConn) -> None:
        try:
            data = conn.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._drop(conn)
            return
        if conn.open:  # client frames: only a close matters (opcode 8)
            if data[0] & 0x0F == 0x8:
                self._drop(conn)
            elif conn.channel is None:
                conn.channel = self.channels.setdefault(conn.name, [])
                self._send(conn, server_frame(ACK))
                conn.channel.append(conn)
            return
        conn.inbox += data
        end = conn.inbox.find(b"\r\n\r\n")
        if end < 0:
            return
        head = conn.inbox[:end].decode("latin-1").split("\r\n")
        key = next(
            line.split(":", 1)[1].strip()
            for line in head
            if line.lower().startswith("sec-websocket-key:")
        )
        conn.name = head[0].split(" ")[1].split("/")[2]
        conn.inbox = b""
        conn.open = True
        self._send(
            conn,
            b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            b"Sec-WebSocket-Accept: " + accept_token(key.encode()) + b"\r\n\r\n",
        )

    def _send(self, conn: RawConn, data: bytes) -> None:
        if conn.pending:
            conn.pending += data
            return
        try:
            sent = conn.sock.send(data)
        except BlockingIOError:
            sent = 0
        except OSError:
            self._drop(conn)
            return
        if sent < len(data):
            conn.pending += data[sent:]
            self.sel.modify(conn.sock, selectors.EVENT_READ | selectors.EVENT_WRITE, conn)

    def _flush(self, conn: RawConn) -> None:
        try:
            sent = conn.sock.send(conn.pending)
        except BlockingIOError:
            return
        except OSError:
            self._drop(conn)
            return
        del conn.pending[:sent]
        if not conn.pending:
            self.sel.modify(conn.sock, selectors.EVENT_READ, conn)

    def _drop(self, conn: RawConn) -> None:
        if conn.channel is not None and conn in conn.channel:
            conn.channel.remove(conn)
        with contextlib.suppress(KeyError, ValueError):
            self.sel.unregister(conn.sock)
        conn.sock.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.peers")
    parser.add_argument("kind", choices=KINDS)
    parser.add_argument("--frames", required=True, help="JSON file of recorded event frames")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    raise_fd_limit()
    with open(args.frames) as file:
        turn = Turn(json.load(file))
    if args.kind == "raw":
        RawCeiling(turn, args.port).run()
    else:
        asyncio.run(run_websockets(args.kind, turn, args.port))


if __name__ == "__main__":
    main()

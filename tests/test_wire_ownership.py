"""The socket's bytes belong to the WebSocket: whoever writes, frames never interleave.

A property test (hypothesis) of one connection of a real gateway, through a
socket whose buffers are a few KiB so that the fan-out's direct writes come
up short all the time. Hypothesis draws what happens: batches published to
the session, the client reading a little, WebSocket-level and JSON pings,
bursts that overflow the connection's bound. The raw bytes the client gets
are parsed by wsproto (an independent parser): they must be whole frames,
never a protocol error, each event frame at most once and in id order, every
event when no 1008 came, and the slow-client rule exactly once when one did.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import trio
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from wsproto import WSConnection
from wsproto.connection import ConnectionType
from wsproto.events import (
    AcceptConnection,
    CloseConnection,
    Message,
    Ping,
    Pong,
    Request,
    TextMessage,
)

from gateway.protocol.events import TextDelta
from tests.conftest import make_config, running_gateway

OPS = st.lists(
    st.one_of(
        st.tuples(st.just("publish"), st.integers(1, 40), st.integers(1, 3000)),
        st.tuples(st.just("read"), st.integers(1, 20000)),
        st.tuples(st.just("wsping")),
        st.tuples(st.just("jsonping")),
        st.tuples(st.just("run")),
    ),
    min_size=1,
    max_size=40,
)


class RawClient:
    """A WebSocket client on a raw socket with a small receive buffer, parsed by wsproto."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.ws = WSConnection(ConnectionType.CLIENT)
        self.texts: list[str] = []
        self.partial = ""
        self.pongs = 0
        self.close: CloseConnection | None = None
        self.eof = False

    async def send(self, data: bytes) -> None:
        view = memoryview(data)
        while view and not self.eof:
            try:
                view = view[self.sock.send(view) :]
            except BlockingIOError:
                await trio.lowlevel.wait_writable(self.sock)
            except OSError:
                self.eof = True

    async def read(self, limit: int) -> None:
        """Read what is there now, up to ``limit`` bytes; never wait for more."""
        while limit > 0 and not self.eof:
            try:
                data = self.sock.recv(min(limit, 65536))
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                self.eof = True
                return
            limit -= len(data)
            self.feed(data)

    def feed(self, data: bytes) -> None:
        self.ws.receive_data(data)
        for event in self.ws.events():
            if isinstance(event, TextMessage):  # wsproto hands over partial frames too
                self.partial += event.data
                if event.message_finished:
                    self.texts.append(self.partial)
                    self.partial = ""
            elif isinstance(event, Message):
                raise AssertionError(f"unexpected message {event!r}")
            elif isinstance(event, Pong):
                self.pongs += 1
            elif isinstance(event, CloseConnection):
                # wsproto reports a frame it cannot parse as a close 1002/1007.
                assert event.code not in (1002, 1007), f"corrupt stream: {event}"
                self.close = event


async def connect(port: int, path: str) -> RawClient:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))  # loopback: at once
    sock.setblocking(False)
    client = RawClient(sock)
    await client.send(client.ws.send(Request(host="127.0.0.1", target=path)))
    with trio.fail_after(10):
        while True:
            await trio.lowlevel.wait_readable(sock)
            client.ws.receive_data(sock.recv(65536))  # the 101 fits in one read
            if any(isinstance(e, AcceptConnection) for e in client.ws.events()):
                return client


async def scenario(tmp_path: Path, ops: list[tuple[Any, ...]]) -> None:
    config = make_config(
        tmp_path, **{"server.send_buffer_bytes": 4096, "stream.queue_max_events": 120}
    )
    async with running_gateway(config) as gw:
        sid = await gw.create_session()
        session = gw.node.sessions[sid]
        url = await gw.ws_url(sid)
        client = await connect(gw.gateway.port, url.split(str(gw.gateway.port), 1)[1])
        sub = {"type": "subscribe", "filter": "preset:full", "since": None, "snapshot": False}
        await client.send(client.ws.send(TextMessage(json.dumps(sub))))
        with trio.fail_after(10):
            while not client.texts:
                await trio.lowlevel.wait_readable(client.sock)
                await client.read(65536)
        published: list[int] = []
        pings = 0
        for op in ops:
            if op[0] == "publish":
                _, n, size = op
                out = session.emit([TextDelta("msg_x", 0, "x" * size) for _ in range(n)], "turn_x")
                published += [e.seq for e in out]
            elif op[0] == "read":
                await client.read(op[1])
            elif op[0] == "wsping":
                await client.send(client.ws.send(Ping(b"p")))
                pings += 1
            elif op[0] == "jsonping":
                await client.send(client.ws.send(TextMessage('{"type":"ping","nonce":"n"}')))
            else:
                await trio.testing.wait_all_tasks_blocked(0.001)
        # Then the client reads everything, until the server has nothing left to send.
        with trio.fail_after(20):
            while not client.eof and client.close is None:
                busy = [
                    c
                    for c in gw.node.connections
                    if c.queued or getattr(c.ws, "owes", False) or c._writing
                ]
                with trio.move_on_after(0.05):
                    await trio.lowlevel.wait_readable(client.sock)
                await client.read(1 << 20)
                if not busy and not gw.node.connections:
                    break
                if not busy:
                    await trio.testing.wait_all_tasks_blocked(0.01)
                    await client.read(1 << 20)
                    if not [
                        c for c in gw.node.connections if c.queued or getattr(c.ws, "owes", False)
                    ]:
                        break
        frames = [json.loads(t) for t in client.texts]
        seqs = [int(f["event"]["id"][4:]) for f in frames if f["type"] == "event"]
        mine = [s for s in seqs if s in set(published)]
        assert mine == sorted(set(mine)), "an event twice, or out of order"
        overflowed = client.close is not None and client.close.code == 1008
        if not overflowed:
            assert mine == published, "an event lost without a 1008"
        warnings = [e for e in session.tail if e.type == "bus.handler_warning"]
        assert len(warnings) == (1 if overflowed else 0)
        assert gw.node.metrics.slow_clients._value.get() == (1 if overflowed else 0)
        client.sock.close()


@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(ops=OPS)
def test_frames_never_interleave_whoever_writes(tmp_path: Path, ops: list[tuple[Any, ...]]) -> None:
    where = tmp_path / str(abs(hash(tuple(ops))))
    where.mkdir(exist_ok=True)
    trio.run(scenario, where, ops)


async def test_two_stalled_clients_are_each_reported_once(tmp_path: Path) -> None:
    """The slow-client rule fires once per connection, a nested fan-out included.

    The first overflow's ``bus.handler_warning`` is itself fanned out, and the
    second stalled client overflows on it and again in the outer fan-out: one
    warning, one close and one count each all the same.
    """
    config = make_config(
        tmp_path, **{"server.send_buffer_bytes": 4096, "stream.queue_max_events": 20}
    )
    async with running_gateway(config) as gw:
        sid = await gw.create_session()
        session = gw.node.sessions[sid]
        url = await gw.ws_url(sid)
        path = url.split(str(gw.gateway.port), 1)[1]
        stalled = [await connect(gw.gateway.port, path)]
        stalled.append(
            await connect(gw.gateway.port, (await gw.ws_url(sid)).split(str(gw.gateway.port), 1)[1])
        )
        sub = {"type": "subscribe", "filter": "preset:full", "since": None, "snapshot": False}
        for client in stalled:
            await client.send(client.ws.send(TextMessage(json.dumps(sub))))
        with trio.fail_after(10):
            for client in stalled:  # each reads its ack, then nothing more
                while not client.texts:
                    await trio.lowlevel.wait_readable(client.sock)
                    await client.read(65536)
        with trio.fail_after(10):
            while gw.node.connections:
                session.emit([TextDelta("msg_x", 0, "y" * 2000) for _ in range(10)], "turn_x")
                await trio.sleep(0.001)
        warnings = [
            json.loads(e.data)["payload"] for e in session.tail if e.type == "bus.handler_warning"
        ]
        assert len(warnings) == 2
        assert len({w["subscription_name"] for w in warnings}) == 2
        assert gw.node.metrics.slow_clients._value.get() == 2
        for client in stalled:
            client.sock.close()

"""Heartbeat, subscribe timeout and attach-token TTL on Trio's MockClock (docs/protocol.md §2, §3).

Behaviour 9 of the core issue. Every test here runs on the ``autojump_clock``
fixture, so 30-second ping intervals take no real time, and asserts the
virtual times to the second. Nothing here touches a real socket (autojump and
real I/O do not mix): a :class:`~gateway.doors.websocket.connection.StreamConnection` runs
over :func:`trio.testing.memory_stream_pair`, and the test speaks WebSocket to
it with a bare wsproto client connection (:class:`WsClient`). The node is real:
SQLite store, scripted provider, ``sleep`` tool. The store does its I/O in
worker threads; autojump may move the clock while one runs, but only to the
next pending deadline, which would have fired next anyway.
"""

from __future__ import annotations

import collections
import json
import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from wsproto.connection import Connection, ConnectionType
from wsproto.events import CloseConnection, Ping, TextMessage

from gateway.doors.websocket.connection import StreamConnection
from gateway.errors import Refused
from gateway.http.refusals import STATUS
from gateway.http.timers import coarse
from gateway.http.websocket import WebSocket
from gateway.ids import new_message_id, new_turn_id, now_ms
from gateway.node import Node
from gateway.protocol.shapes import Message, TextBlock
from gateway.providers.scripted import ScriptedProvider
from gateway.session.session import Session
from gateway.store.sqlite.store import SqliteStore
from gateway.tools.builtin import build_registry
from tests.conftest import make_config


@dataclass
class Closed:
    """The server's close frame, as the client saw it."""

    code: int
    reason: dict[str, Any]


class WsClient:
    """A minimal WebSocket client over an in-memory stream: wsproto does the framing.

    ``recv`` returns each text message decoded from JSON, or :class:`Closed`
    once the server sends a close frame (which it answers, completing the
    handshake). WebSocket-level pings are answered as a browser would.
    """

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.ws = Connection(ConnectionType.CLIENT)
        self.inbox: collections.deque[dict[str, Any] | Closed] = collections.deque()
        self._text = ""

    async def send_text(self, text: str) -> None:
        await self.stream.send_all(self.ws.send(TextMessage(text)))

    async def send(self, frame: dict[str, Any]) -> None:
        await self.send_text(json.dumps(frame))

    async def recv(self) -> dict[str, Any] | Closed:
        while not self.inbox:
            data = await self.stream.receive_some()
            if not data:
                raise EOFError("the server dropped the stream without a close frame")
            self.ws.receive_data(bytes(data))
            for event in self.ws.events():
                if isinstance(event, TextMessage):
                    self._text += event.data
                    if event.message_finished:
                        self.inbox.append(json.loads(self._text))
                        self._text = ""
                elif isinstance(event, CloseConnection):
                    await self.stream.send_all(self.ws.send(event.response()))
                    self.inbox.append(Closed(event.code, json.loads(event.reason or "{}")))
                elif isinstance(event, Ping):
                    await self.stream.send_all(self.ws.send(event.response()))
        return self.inbox.popleft()

    async def subscribe(self, filter: Any = "preset:full") -> dict[str, Any]:
        await self.send({"type": "subscribe", "filter": filter, "since": None, "snapshot": False})
        ack = await self.recv()
        assert isinstance(ack, dict) and ack["type"] == "subscribe_ack", ack
        return ack


@dataclass
class Rig:
    node: Node
    session: Session
    conn: StreamConnection
    client: WsClient
    ended: trio.Event  # the connection's task has returned
    start: float  # trio.current_time() when the connection started

    def elapsed(self) -> float:
        return trio.current_time() - self.start


@asynccontextmanager
async def rig(tmp_path: Path, *, over_socket: bool = False, **overrides: Any) -> AsyncIterator[Rig]:
    """A node, one session, and one stream connection to it.

    Over an in-memory stream, every frame goes through the connection's
    writer; over a socket pair (``over_socket``), live events are written
    straight from the fan-out (gateway.session.hub), on the hub group's clock.
    """
    config = make_config(
        tmp_path, **{"stream.ping_interval_s": 30, "stream.ping_max_missed": 3, **overrides}
    )
    node = Node(
        config,
        SqliteStore(str(tmp_path / "gateway.db"), inline=True),
        ScriptedProvider(),
        build_registry(["sleep"]),
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(node.run)
        session = await node.create_session()
        if over_socket:
            a, b = trio.socket.socketpair()
            client_stream: trio.abc.Stream = trio.SocketStream(a)
            server_stream: trio.abc.Stream = trio.SocketStream(b)
        else:
            client_stream, server_stream = trio.testing.memory_stream_pair()
        conn = StreamConnection(session, WebSocket(server_stream))
        ended = trio.Event()

        async def run_connection() -> None:
            try:
                await conn.run()
            finally:
                ended.set()

        async with trio.open_nursery() as connections:
            connections.start_soon(run_connection)
            yield Rig(node, session, conn, WsClient(client_stream), ended, trio.current_time())
            connections.cancel_scope.cancel()
        await trio.aclose_forcefully(client_stream)
        await trio.aclose_forcefully(server_stream)  # (serve_connection's job in the gateway)
        node.stop()


def submit(session: Session, text: str | dict[str, Any]) -> str:
    """Submit a turn the way ``POST /sessions/{id}/turns`` does; return its id."""
    if not isinstance(text, str):
        text = json.dumps(text)
    message = Message(
        new_message_id(), session.id, new_turn_id(), "user", [TextBlock(text)], "complete", now_ms()
    )
    return session.submit_turn(message).id


def is_ping(frame: Any) -> bool:
    return isinstance(frame, dict) and frame["type"] == "ping"


# --- server pings -------------------------------------------------------------------


async def test_an_idle_subscriber_is_pinged_and_pongs_keep_it_alive(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with rig(tmp_path) as r:
        await r.client.subscribe()
        subscribed = r.elapsed()
        nonces = []
        # 10 virtual minutes, answering every ping: a ping every 30 s, never a close
        for k in range(1, 21):
            frame = await r.client.recv()
            assert is_ping(frame), frame
            assert round(r.elapsed() - subscribed) == 30 * k
            assert isinstance(frame, dict) and set(frame) == {"type", "nonce"}
            nonces.append(frame["nonce"])
            await r.client.send({"type": "pong", "nonce": frame["nonce"]})
        assert len(set(nonces)) == 20 and all(isinstance(n, str) and n for n in nonces)
        assert not r.ended.is_set() and r.conn.closing is None
        await r.client.send({"type": "ping", "nonce": "still-there"})
        assert await r.client.recv() == {"type": "pong", "nonce": "still-there"}


async def test_unanswered_pings_close_with_1001_heartbeat_timeout(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with rig(tmp_path) as r:
        await r.client.subscribe()
        times = []
        while True:
            frame = await r.client.recv()
            times.append(round(r.elapsed()))
            if not is_ping(frame):
                break
        # three unanswered pings; the third is missed one interval later
        assert times == [30, 60, 90, 120]
        assert isinstance(frame, Closed)
        assert frame.code == 1001
        assert frame.reason["code"] == "heartbeat_timeout"
        with trio.fail_after(10):
            await r.ended.wait()
        assert round(r.elapsed()) == 120


async def test_a_pong_with_a_wrong_nonce_does_not_count(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with rig(tmp_path) as r:
        await r.client.subscribe()
        for _ in range(3):
            frame = await r.client.recv()
            assert is_ping(frame)
            await r.client.send({"type": "pong", "nonce": "not-" + frame["nonce"]})  # type: ignore[index]
        closed = await r.client.recv()
        assert isinstance(closed, Closed) and closed.code == 1001
        assert closed.reason["code"] == "heartbeat_timeout"
        assert round(r.elapsed()) == 120


async def test_a_late_pong_resets_the_missed_count(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """Two missed pings, then a pong to the second: three more intervals before a close."""
    async with rig(tmp_path) as r:
        await r.client.subscribe()
        await r.client.recv()  # ping at 30, left unanswered
        second = await r.client.recv()  # ping at 60
        assert is_ping(second) and round(r.elapsed()) == 60
        await r.client.send({"type": "pong", "nonce": second["nonce"]})  # type: ignore[index]
        times = []
        while is_ping(frame := await r.client.recv()):
            times.append(round(r.elapsed()))
        assert times == [90, 120, 150]
        assert isinstance(frame, Closed) and frame.reason["code"] == "heartbeat_timeout"
        assert round(r.elapsed()) == 180


@pytest.mark.parametrize("over_socket", [False, True], ids=["through-writer", "direct"])
async def test_outbound_events_reset_the_idle_timer(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, over_socket: bool
) -> None:
    # one text.delta every 5 s for 150 s: without the reset, pings at 30/60/90 and a
    # close at 120 would cut the turn short
    script = {"script": {"delay_ms": 5000, "rounds": [[{"lorem": 30}]]}}
    async with rig(tmp_path, over_socket=over_socket) as r:
        await r.client.subscribe("preset:chat")
        submit(r.session, script)
        frames = []
        while True:
            frame = await r.client.recv()
            frames.append(frame)
            if isinstance(frame, dict) and frame.get("event", {}).get("type") == "turn.completed":
                break
        turn_end = r.elapsed()
        assert not any(is_ping(f) for f in frames), [f for f in frames if is_ping(f)]
        deltas = [f for f in frames if f["event"]["type"] == "text.delta"]  # type: ignore[index]
        assert len(deltas) == 30
        assert round(turn_end) == 150
        # idle again: the next ping comes a full interval after the last outbound frame
        frame = await r.client.recv()
        assert is_ping(frame)
        assert round(r.elapsed() - turn_end) == 30


async def test_a_client_ping_is_answered_at_once(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with rig(tmp_path) as r:
        # before subscribing (a ping is a fine first frame) ...
        await r.client.send({"type": "ping", "nonce": "abc"})
        assert await r.client.recv() == {"type": "pong", "nonce": "abc"}
        assert r.elapsed() == 0
        await r.client.subscribe()
        # ... and after, in the middle of an idle interval
        await trio.sleep(20)
        await r.client.send({"type": "ping", "nonce": "xyz-2"})
        assert await r.client.recv() == {"type": "pong", "nonce": "xyz-2"}
        assert round(r.elapsed()) == 20


# --- subscribe timeout -----------------------------------------------------------------


async def test_no_subscribe_closes_1008_at_exactly_subscribe_timeout(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with rig(tmp_path) as r:
        assert r.node.config.stream.subscribe_timeout_s == 10
        closed = await r.client.recv()
        assert isinstance(closed, Closed)
        assert closed.code == 1008
        assert closed.reason["code"] == "subscribe_timeout"
        assert r.elapsed() == pytest.approx(10, abs=1e-6)
        with trio.fail_after(10):
            await r.ended.wait()


async def test_a_ping_does_not_extend_the_subscribe_deadline(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """Decision: the deadline counts from the connection's start; pings don't move it."""
    async with rig(tmp_path) as r:
        await trio.sleep(6)
        await r.client.send({"type": "ping", "nonce": "p"})
        assert await r.client.recv() == {"type": "pong", "nonce": "p"}
        closed = await r.client.recv()
        assert isinstance(closed, Closed) and closed.code == 1008
        assert closed.reason["code"] == "subscribe_timeout"
        assert r.elapsed() == pytest.approx(10, abs=1e-6)


async def test_an_invalid_subscribe_does_not_stop_the_subscribe_timer(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with rig(tmp_path) as r:
        await r.client.send({"type": "subscribe", "filter": "preset:nope"})
        error = await r.client.recv()
        assert isinstance(error, dict) and error["type"] == "subscribe_error"
        assert error["code"] == "invalid_filter"
        closed = await r.client.recv()
        assert isinstance(closed, Closed) and closed.reason["code"] == "subscribe_timeout"
        assert r.elapsed() == pytest.approx(10, abs=1e-6)


async def test_a_subscribe_just_in_time_keeps_the_connection(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with rig(tmp_path) as r:
        await trio.sleep(9.9)
        await r.client.subscribe()
        # the next frame is the heartbeat ping, 30 s after the ack: no close at 10 s
        # (on the node's clock of pings: at the next whole second, gateway.http.timers)
        frame = await r.client.recv()
        assert is_ping(frame)
        assert round(r.elapsed(), 1) == 40.0


# --- attach tokens --------------------------------------------------------------------


async def test_an_attach_token_expires_after_its_ttl(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with rig(tmp_path) as r:
        tokens = r.node.tokens
        sid = r.session.id
        assert r.node.config.stream.attach_token_ttl_s == 60

        fresh = tokens.issue(sid)
        await trio.sleep(59.9)
        tokens.redeem(fresh, sid)  # just in time
        with pytest.raises(Refused) as used:
            tokens.redeem(fresh, sid)
        assert (STATUS[used.value.code], used.value.code) == (403, "attach_token_invalid")

        stale = tokens.issue(sid)
        await trio.sleep(60)
        with pytest.raises(Refused) as expired:
            tokens.redeem(stale, sid)
        assert (STATUS[expired.value.code], expired.value.code) == (403, "attach_token_expired")

        other = tokens.issue("sess_someone_else")
        with pytest.raises(Refused) as wrong:
            tokens.redeem(other, sid)
        assert (STATUS[wrong.value.code], wrong.value.code) == (403, "attach_token_invalid")
        with pytest.raises(Refused) as missing:
            tokens.redeem(None, sid)
        assert (STATUS[missing.value.code], missing.value.code) == (403, "attach_token_required")


async def test_the_attach_token_ttl_is_configurable(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with rig(tmp_path, **{"stream.attach_token_ttl_s": 5}) as r:
        token = r.node.tokens.issue(r.session.id)
        await trio.sleep(5)
        with pytest.raises(Refused) as expired:
            r.node.tokens.redeem(token, r.session.id)
        assert expired.value.code == "attach_token_expired"


async def test_idle_connections_ping_on_one_clock_so_the_node_wakes_once_a_grain(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """gateway.http.timers: nine connections whose last frames went out 0.1 s apart
    are pinged in at most two steps (a grain, 1 s, each), not in nine."""
    async with rig(tmp_path) as r, trio.open_nursery() as nursery:
        await r.client.subscribe()
        clients = [r.client]
        for _ in range(8):
            await trio.sleep(0.1)
            client_stream, server_stream = trio.testing.memory_stream_pair()
            nursery.start_soon(StreamConnection(r.session, WebSocket(server_stream)).run)
            client = WsClient(client_stream)
            await client.subscribe()
            clients.append(client)
        acked = r.start + 0.8  # the last subscribe_ack
        pinged: list[float] = []
        for client in clients:
            assert is_ping(await client.recv())
            pinged.append(trio.current_time())
        # Nine deadlines within 0.8 s fall in at most two grains: two wake-ups, not nine,
        # each on a whole second, none more than a grain late.
        assert len(set(pinged)) <= 2
        assert all(t == math.ceil(t) for t in pinged)
        assert r.start + 30 <= min(pinged) and max(pinged) <= acked + 31
        nursery.cancel_scope.cancel()


def test_a_deadline_is_rounded_up_to_a_tenth_of_the_period_at_most_a_second() -> None:
    assert coarse(30.2, 30) == 31.0
    assert coarse(31.0, 30) == 31.0
    assert coarse(0.123, 0.5) == pytest.approx(0.15)  # a short period: a short grain
    assert coarse(math.inf, 30) == math.inf
    assert coarse(5.5, 0) == 5.5

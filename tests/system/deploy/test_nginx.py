"""The gateway behind a real nginx running deploy/nginx/gateway.conf (docs/operating.md).

Every client here talks to nginx only, from 127.0.0.2 (nginx itself reaches
the gateway from 127.0.0.1, the one trusted proxy), with httpx and
trio-websocket, and runs what docs/protocol.md sections 2 and 3 promise through the
proxy: a full turn, a ``since`` resume, a snapshot attach, a slow client
closed with 1008, and a graceful shutdown whose 1001 reaches the client. The
gateway must see the client's own address (from ``X-Forwarded-For``, not a
spoofed one) and answer ``ws_url``\\ s that point at the proxy (``public_url``).

nginx is Debian's, installed by the test if missing (tests/nginx_support.py);
the test skips, saying why, only where it cannot be installed.
"""

from __future__ import annotations

import json
import signal
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import trio
from trio_websocket import ConnectionClosed

from gateway.protocol.events import CATALOG_TYPES
from gateway.protocol.frames import EventFrame, Snapshot, SubscribeAck
from gateway.protocol.shapes import TextBlock
from tests.conftest import TOOL_SCRIPT, Client, free_port, types
from tests.nginx_support import (
    GatewayProcess,
    Nginx,
    PortTaken,
    ensure_nginx,
    gateway_process,
    open_ws_from,
    running_nginx,
)

# slow: nginx
pytestmark = pytest.mark.slow

CLIENT_ADDRESS = "127.0.0.2"  # the clients' own address, as nginx sees them
SPOOFED = "198.51.100.66"  # what a client claims in its own X-Forwarded-For


@dataclass
class Proxied:
    """A gateway, nginx in front of it, and an HTTP client of nginx from CLIENT_ADDRESS."""

    gateway: GatewayProcess
    nginx: Nginx
    http: httpx.AsyncClient

    async def create_session(self) -> str:
        r = await self.http.post("/sessions", json={})
        assert r.status_code == 201, r.text
        return str(r.json()["session_id"])

    async def ws_url(self, session_id: str) -> str:
        r = await self.http.get(f"/sessions/{session_id}")
        assert r.status_code == 200, r.text
        url = str(r.json()["ws_url"])
        # public_url is nginx: ws_url is its ws:// form, never the gateway's own port
        assert url.startswith(f"ws://127.0.0.1:{self.nginx.port}/sessions/{session_id}/stream?")
        return url

    async def submit(self, session_id: str, content: object) -> str:
        text = content if isinstance(content, str) else json.dumps(content)
        r = await self.http.post(f"/sessions/{session_id}/turns", json={"content": text})
        assert r.status_code == 202, r.text
        return str(r.json()["turn_id"])

    @asynccontextmanager
    async def client(self, session_id: str, **kw: object) -> AsyncIterator[Client]:
        """A WebSocket client through nginx that also claims a spoofed address."""
        spoof = [(b"X-Forwarded-For", SPOOFED.encode())]
        url = await self.ws_url(session_id)
        async with open_ws_from(url, CLIENT_ADDRESS, extra_headers=spoof, **kw) as ws:
            yield Client(ws, session_id)


@asynccontextmanager
async def proxied(tmp_path: Path, *, small_buffers: bool = False) -> AsyncIterator[Proxied]:
    """``gateway serve`` behind nginx, and an HTTP client of nginx.

    ``small_buffers``: every buffer between the gateway and a client is small
    (the gateway's queue and send buffer, nginx's socket buffers and its
    stream buffer), so that a client that stops reading overflows the
    gateway's queue after a bounded amount of data, whatever the kernel's
    autotuning would otherwise grow to.
    """
    ensure_nginx()  # first: a skip must come before anything starts
    small = small_buffers
    for attempt in range(3):  # free_port() is free when asked, not necessarily later
        async with AsyncExitStack() as stack:
            nginx_port = free_port()
            config = f"""\
[server]
host = "127.0.0.1"
port = 0
public_url = "http://127.0.0.1:{nginx_port}"
trusted_proxies = ["127.0.0.1"]
send_buffer_bytes = {4096 if small else 0}
[stream]
queue_max_events = {20 if small else 1000}
[log]
format = "json"
"""
            where = tmp_path / f"try{attempt}"
            gateway = await stack.enter_async_context(gateway_process(where / "gateway", config))
            try:
                nginx = await stack.enter_async_context(
                    running_nginx(
                        where / "nginx",
                        gateway.port,
                        nginx_port,
                        listen_options="sndbuf=4096 rcvbuf=4096" if small else "",
                        stream_extra="proxy_buffer_size 4k;" if small else "",
                    )
                )
            except PortTaken:
                continue  # the stack stops this gateway; try another port
            http = await stack.enter_async_context(
                httpx.AsyncClient(
                    base_url=nginx.base,
                    transport=httpx.AsyncHTTPTransport(local_address=CLIENT_ADDRESS),
                    headers={"X-Forwarded-For": SPOOFED},
                )
            )
            yield Proxied(gateway, nginx, http)
            return
    raise AssertionError("three ports in a row were taken before nginx could listen")


def assert_saw_the_real_client(gateway: GatewayProcess) -> None:
    """The gateway logged the client's own address: not nginx's, not the spoofed one.

    Its log is JSON lines ([log] format = "json"); the lines about a client
    (``client_attached``, ``client_subscribed``, ...) carry a ``client``
    field. Only X-Forwarded-For could have told the gateway CLIENT_ADDRESS
    (nginx connects to it from 127.0.0.1), and it must have believed nginx's
    entry, not the one the client made up.
    """
    text = gateway.log_text()
    lines = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
    clients = [line["client"] for line in lines if "client" in line]
    assert clients, text
    assert all(CLIENT_ADDRESS in client and "127.0.0.1" not in client for client in clients)
    assert SPOOFED not in text, text


async def test_a_turn_a_resume_and_a_snapshot_through_nginx(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with proxied(tmp_path) as gw:
            assert (await gw.http.get("/healthz")).json() == {"status": "ok"}
            sid = await gw.create_session()
            # the stream's location without an upgrade: nginx passes it on, the gateway
            # refuses it with its own JSON error (docs/protocol.md §2), before any upgrade
            r = await gw.http.get(f"/sessions/{sid}/stream")
            assert r.status_code in (403, 426) and "code" in r.json()["error"]

            # a full turn, live (docs/protocol.md §7)
            async with gw.client(sid) as live:
                ack = await live.subscribe()
                assert isinstance(ack, SubscribeAck)
                turn_id = await gw.submit(sid, TOOL_SCRIPT)
                turn = await live.until_turn_ends()
            assert types(turn)[:3] == ["turn.started", "route.decided", "llm.call_started"]
            assert turn[-1].type == "turn.completed" and turn[-1].turn_id == turn_id
            assert "tool.completed" in types(turn)
            assert live.reducer.state()["messages"][-1]["content"] == [
                {"type": "text", "text": "All done."}
            ]

            # a `since` resume from the turn's first event: the rest, replayed
            cursor = turn[0].id
            async with gw.client(sid) as resumed:
                ack = await resumed.subscribe(since=cursor)
                assert isinstance(ack, SubscribeAck) and ack.replay_event_count > 0
                replay = [(await resumed.recv()).event for _ in range(ack.replay_event_count)]
            expected = [
                e.id
                for e in live.events
                if e.id > cursor and (e.type in CATALOG_TYPES or e.type == "message.complete")
            ]
            seen = [e for e in replay if e.id <= live.events[-1].id]
            assert [e.id for e in seen] == expected
            assert seen[-1].type == "turn.completed"
            # and what came after the live client left: its own unsubscription
            assert types(replay[len(seen) :]) == ["bus.subscriber_unregistered"]

            # a snapshot attach, then live: the next turn arrives after it
            async with gw.client(sid) as late:
                ack = await late.subscribe(snapshot=True)
                snap = await late.recv()
                assert isinstance(snap, Snapshot)
                # the cut is past everything stored so far (the resumed client's
                # unsubscription included)
                assert snap.snapshot_at_event_id is not None
                assert snap.snapshot_at_event_id > replay[-1].id
                assert snap.messages[0].role == "user" and snap.messages[0].turn_id == turn_id
                assert snap.messages[-1].content == [TextBlock("All done.")]
                await gw.submit(sid, "hello nginx")
                events = await late.until_turn_ends()
                assert all(e.id > snap.snapshot_at_event_id for e in events)
                assert late.reducer.state()["messages"][-1]["content"] == [
                    {"type": "text", "text": "You said: hello nginx"}
                ]
    assert_saw_the_real_client(gw.gateway)


# Fast and long (some 4 MB of frames): only a stalled client falls behind,
# and by far more than every buffer between the gateway and it (nginx's, and
# four sockets', made small by proxied(small_buffers=True): some 15 kB get
# through before the close).
FLOOD = {"script": {"rounds": [[{"lorem": 20000}]]}}


async def test_a_client_that_stops_reading_behind_nginx_is_closed_1008(tmp_path: Path) -> None:
    """docs/protocol.md §3 "Backpressure", through the proxy.

    nginx does not buffer the stream (``proxy_buffering off``), so a client
    that stops reading fills the sockets and nginx's one buffer, then the
    gateway's bounded queue: the gateway warns and closes it with 1008, and
    the close reaches the client through nginx once it reads again.
    """
    with trio.fail_after(30):
        async with proxied(tmp_path, small_buffers=True) as gw:
            sid = await gw.create_session()
            warning_only = {"event_types": ["bus.handler_warning"]}
            async with (
                gw.client(sid) as watcher,
                gw.client(sid, message_queue_size=1, receive_buffer=4096) as slow_ws,
            ):
                slow = slow_ws.ws
                await slow.send_message(json.dumps({"type": "subscribe", "filter": "preset:full"}))
                await watcher.subscribe(filter=warning_only)
                await gw.submit(sid, FLOOD)
                # the slow client reads nothing from here on
                warning = (await watcher.until(lambda e: e.type == "bus.handler_warning"))[-1]
                assert warning.payload.reason == "client_too_slow"
                # now it reads: what was in flight, then the close
                received = 0
                with pytest.raises(ConnectionClosed) as closed:
                    while True:
                        received += len(await slow.get_message())
            assert closed.value.reason.code == 1008
            assert json.loads(closed.value.reason.reason) == {
                "code": "client_too_slow",
                "message": "Outbound queue overflowed; reconnect with replay.",
            }
            assert received < 1_000_000  # cut off, not served the whole turn
    assert_saw_the_real_client(gw.gateway)


async def test_sigterm_reaches_the_client_behind_nginx_as_1001(tmp_path: Path) -> None:
    """docs/reference.md "Command line": the turn is cancelled, the socket closed 1001, exit 0."""
    script = {"script": {"rounds": [[{"tool_use": {"name": "sleep", "input": {"seconds": 60}}}]]}}
    with trio.fail_after(30):
        async with proxied(tmp_path) as gw:
            sid = await gw.create_session()
            async with gw.client(sid) as client:
                await client.subscribe()
                await gw.submit(sid, script)
                await client.until(lambda e: e.type == "tool.called")
                gw.gateway.proc.send_signal(signal.SIGTERM)
                events = await client.until_turn_ends()
                assert types(events)[-2:] == ["tool.failed", "turn.cancelled"]
                assert events[-1].payload.reason == "shutdown"
                with pytest.raises(ConnectionClosed) as closed:
                    while True:
                        frame = await client.recv()
                        assert not isinstance(frame, EventFrame) or frame.event.turn_id is None
            assert closed.value.reason.code == 1001
            assert json.loads(closed.value.reason.reason)["code"] == "shutdown"
            assert await gw.gateway.proc.wait() == 0
            # nginx is still up, and now says the upstream is gone
            assert (await gw.http.get("/healthz")).status_code == 502
    assert_saw_the_real_client(gw.gateway)

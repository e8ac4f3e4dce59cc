"""The native stream over server-sent events, ``GET /sessions/{id}/events`` (docs/doors/sse.md).

The same frames as the WebSocket (docs/protocol.md §3), one ``data:`` line
each, event frames with ``id:``; compared with a WebSocket client connected
from the start: same ids, same order, same reducer state, no gap and no
duplicate where a replay (``since`` or ``Last-Event-ID``) meets the live
stream. The same token, ownership, filter and slow-client rules.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from gateway.client import GatewayClient, Notice, Reducer, decode_server_frame
from gateway.client.sse import abandon
from gateway.doors.sse import events as events_module
from gateway.errors import ClientError
from gateway.protocol.events import Event
from gateway.protocol.frames import EventFrame, Snapshot, SubscribeAck, SubscribeError
from gateway.session.hub import FrameBatch
from tests.conftest import TOOL_SCRIPT, Harness, make_config, running_gateway, types

SLOW_SCRIPT = {"script": {"delay_ms": 5, "rounds": [[{"lorem": 80}]]}}


PING = "ping"
"""What :meth:`SseReader.recv` answers for a ``: ping`` comment."""


class SseReader:
    """Reads one SSE answer: frames decoded with the reference codec, into a reducer."""

    def __init__(
        self, response: httpx.Response, session_id: str, reducer: Reducer | None = None
    ) -> None:
        self.chunks = response.aiter_bytes()
        self.buffer = b""
        self.reducer = reducer or Reducer(session_id)
        self.events: list[Event] = []
        self.pings = 0
        self.closed: dict[str, Any] | None = None  # the last frame, {"type": "close"}

    async def recv(self) -> Any:
        """The next frame (a close frame as a dict), :data:`PING`, or None at the end."""
        while True:
            block, sep, rest = self.buffer.partition(b"\n\n")
            if not sep:
                chunk = await anext(self.chunks, b"")
                if not chunk:
                    return None
                self.buffer += chunk
                continue
            self.buffer = rest
            fields = [line.partition(b": ") for line in block.split(b"\n")]
            if all(line.startswith(b":") for line in block.split(b"\n")):
                self.pings += 1
                return PING
            data = b"\n".join(v for k, _, v in fields if k == b"data")
            ids = [v.decode() for k, _, v in fields if k == b"id"]
            raw = json.loads(data)
            if raw["type"] == "close":
                assert not ids
                self.closed = raw
                return raw
            frame = decode_server_frame(data)
            if isinstance(frame, EventFrame):
                assert ids == [frame.event.id]
                self.events.append(frame.event)
            else:
                assert not ids
            self.reducer.apply(frame)
            return frame

    async def until(self, type_: str) -> list[Event]:
        start = len(self.events)
        while True:
            frame = await self.recv()
            assert frame is not None, "the stream ended"
            if isinstance(frame, EventFrame) and frame.event.type == type_:
                return self.events[start:]

    async def rest(self) -> list[Any]:
        out = []
        while (frame := await self.recv()) is not None:
            if frame is not PING:
                out.append(frame)
        return out


async def token(gw: Harness, sid: str) -> str:
    r = await gw.http.get(f"/sessions/{sid}")
    assert r.status_code == 200, r.text
    return str(r.json()["attach_token"])


@asynccontextmanager
async def sse(
    gw: Harness,
    sid: str,
    headers: dict[str, str] | None = None,
    reducer: Reducer | None = None,
    **query: str,
) -> AsyncIterator[SseReader]:
    params = {"attach": await token(gw, sid), **query}
    url = f"/sessions/{sid}/events"
    async with gw.http.stream("GET", url, params=params, headers=headers, timeout=None) as r:
        assert r.status_code == 200, await r.aread()
        assert r.headers["content-type"] == "text/event-stream"
        assert r.headers["cache-control"] == "no-cache"
        reader = SseReader(r, sid, reducer)
        try:
            yield reader
        finally:
            with trio.CancelScope(shield=True):
                await abandon(r, reader.chunks)


@asynccontextmanager
async def gateway(tmp_path: Path, **overrides: Any) -> AsyncIterator[Harness]:
    with trio.fail_after(30):
        async with running_gateway(make_config(tmp_path, **overrides)) as h:
            yield h


# --- the same stream as the WebSocket -----------------------------------------------


async def test_live_then_snapshot_the_same_frames_as_a_websocket(tmp_path: Path) -> None:
    async with gateway(tmp_path) as gw:
        sid = await gw.create_session()
        async with gw.client(sid) as ws, sse(gw, sid, filter="preset:full") as live:
            await ws.subscribe()
            ack = await live.recv()
            assert isinstance(ack, SubscribeAck)
            assert (ack.since, ack.snapshot, ack.replay_event_count) == (None, False, 0)
            await gw.submit(sid, TOOL_SCRIPT)
            seen = await live.until("turn.completed")
            await ws.until_turn_ends()
            async with sse(gw, sid, snapshot="true") as late:
                ack = await late.recv()
                snap = await late.recv()
        assert isinstance(ack, SubscribeAck) and ack.snapshot is True
        assert isinstance(snap, Snapshot)
    ws_events = [e for e in ws.events if e.id >= seen[0].id]
    assert [e.id for e in seen] == [e.id for e in ws_events[: len(seen)]]
    assert seen == ws_events[: len(seen)]
    assert live.reducer.state()["messages"] == ws.reducer.state()["messages"]
    assert snap.snapshot_at_event_id == seen[-1].id
    assert late.reducer.state()["messages"] == ws.reducer.state()["messages"]


@pytest.mark.parametrize("how", ["since", "last-event-id"])
async def test_resume_mid_stream_no_gap_no_duplicate(tmp_path: Path, how: str) -> None:
    """A reader drops mid-turn and comes back with its last id: the seam, as for ``since``."""
    async with gateway(tmp_path) as gw:
        sid = await gw.create_session()
        async with gw.client(sid) as ws:
            await ws.subscribe()
            with trio.fail_after(15):
                async with sse(gw, sid, filter="preset:full") as first:
                    assert isinstance(await first.recv(), SubscribeAck)
                    await gw.submit(sid, SLOW_SCRIPT)
                    while sum(e.type == "text.delta" for e in first.events) < 3:
                        assert await first.recv() is not None
                last = first.events[-1].id
                # The client keeps its state across the drop, as a resuming client does.
                kept = first.reducer
                if how == "since":
                    resumed = sse(gw, sid, None, kept, filter="preset:full", since=last)
                else:
                    resumed = sse(gw, sid, {"Last-Event-ID": last}, kept, filter="preset:full")
                async with resumed as second:
                    ack = await second.recv()
                    assert isinstance(ack, SubscribeAck) and ack.since == last
                    later = await second.until("turn.completed")
                await ws.until_turn_ends()
    ids = [e.id for e in later]
    assert ids == sorted(set(ids)) and ids[0] > last
    # The streaming message rebuilt (message.snapshot) if it moved on while away;
    # from there on, exactly what the WebSocket saw.
    snaps = [e.id for e in later if e.type == "message.snapshot"]
    start = snaps[0] if snaps else last
    after = [e.id for e in later if e.id > start]
    assert after == [e.id for e in ws.events if start < e.id <= ids[-1]]
    assert second.reducer.state()["messages"] == ws.reducer.state()["messages"]
    assert second.reducer.duplicates_ignored == 0


async def test_filters_a_preset_a_filter_object_and_a_bad_one(tmp_path: Path) -> None:
    async with gateway(tmp_path) as gw:
        sid = await gw.create_session()
        only = json.dumps({"event_types": ["turn.started", "turn.completed"]})
        async with sse(gw, sid, filter=only) as turns, sse(gw, sid) as chat:
            assert isinstance(await turns.recv(), SubscribeAck)
            assert isinstance(await chat.recv(), SubscribeAck)
            await gw.submit(sid, "hello")
            with trio.fail_after(10):
                assert types(await turns.until("turn.completed")) == [
                    "turn.started",
                    "turn.completed",
                ]
                chat_types = types(await chat.until("turn.completed"))
        assert "text.delta" in chat_types and "llm.call_started" not in chat_types
        # An unknown preset: the subscribe_error frame, then the end of the body.
        async with sse(gw, sid, filter="preset:nope") as bad:
            with trio.fail_after(5):
                frames = await bad.rest()
        assert len(frames) == 1 and isinstance(frames[0], SubscribeError)
        assert frames[0].code == "invalid_filter"
        # Not JSON, or a bad snapshot: 400 before the stream, the token not used up.
        attach = await token(gw, sid)
        url = f"/sessions/{sid}/events"
        r = await gw.http.get(url, params={"attach": attach, "filter": "{nope"})
        assert (r.status_code, r.json()["error"]["code"]) == (400, "invalid_query")
        r = await gw.http.get(url, params={"attach": attach, "snapshot": "yes"})
        assert (r.status_code, r.json()["error"]["code"]) == (400, "invalid_query")
        # An expired cursor: the subscribe_error, as on the WebSocket.
        async with sse(gw, sid, since="nonsense") as expired:
            with trio.fail_after(5):
                [error] = await expired.rest()
        assert isinstance(error, SubscribeError) and error.code == "cursor_expired"


async def test_the_token_is_single_use_and_another_keys_session_is_404(tmp_path: Path) -> None:
    async with gateway(tmp_path, **{"auth.api_keys": ["key-a", "key-b"]}) as gw:
        a = httpx.AsyncClient(base_url=gw.base, headers={"Authorization": "Bearer key-a"})
        b = httpx.AsyncClient(base_url=gw.base, headers={"Authorization": "Bearer key-b"})
        async with a, b, httpx.AsyncClient(base_url=gw.base) as anonymous:
            sid = (await a.post("/sessions", json={})).json()["session_id"]
            attach = (await a.get(f"/sessions/{sid}")).json()["attach_token"]
            url = f"/sessions/{sid}/events"
            r = await b.get(url, params={"attach": attach})
            assert (r.status_code, r.json()["error"]["code"]) == (404, "session_not_found")
            r = await anonymous.get(url)
            assert (r.status_code, r.json()["error"]["code"]) == (403, "attach_token_required")
            # The token alone is the credential (an EventSource sends no header) ...
            async with anonymous.stream("GET", url, params={"attach": attach}) as r:
                assert r.status_code == 200
            # ... once.
            r = await anonymous.get(url, params={"attach": attach})
            assert (r.status_code, r.json()["error"]["code"]) == (403, "attach_token_invalid")


async def test_counted_against_max_connections_per_key(tmp_path: Path) -> None:
    overrides = {"limits.max_connections_per_key": 1, "stream.ping_interval_s": 0.05}
    async with gateway(tmp_path, **overrides) as gw:
        sid = await gw.create_session()
        async with sse(gw, sid):
            attach = await token(gw, sid)
            r = await gw.http.get(f"/sessions/{sid}/events", params={"attach": attach})
            assert (r.status_code, r.json()["error"]["code"]) == (503, "over_capacity")
        for _ in range(500):  # the gone reader is noticed at the next ping
            if not gw.node.limits.streams:
                break
            await trio.sleep(0.01)
        async with sse(gw, sid) as again:
            assert isinstance(await again.recv(), SubscribeAck)


# --- closes and the heartbeat ---------------------------------------------------------


async def test_ping_while_idle(tmp_path: Path) -> None:
    async with gateway(tmp_path, **{"stream.ping_interval_s": 0.05}) as gw:
        sid = await gw.create_session()
        async with sse(gw, sid) as idle:
            assert isinstance(await idle.recv(), SubscribeAck)
            with trio.fail_after(5):
                while idle.pings < 2:
                    await idle.recv()


async def test_deleting_the_session_ends_the_stream_with_a_close_frame(tmp_path: Path) -> None:
    async with gateway(tmp_path) as gw:
        sid = await gw.create_session()
        async with sse(gw, sid) as reader:
            assert isinstance(await reader.recv(), SubscribeAck)
            r = await gw.http.delete(f"/sessions/{sid}")
            assert r.status_code == 204
            with trio.fail_after(5):
                await reader.rest()
        assert reader.closed == {
            "type": "close",
            "code": "session_deleted",
            "ws_code": 1000,
            "message": "The session was deleted.",
            "reconnect": False,
        }
        assert not gw.node.connections


async def test_a_reader_that_stops_reading_is_a_slow_client(tmp_path: Path) -> None:
    paced = {"script": {"delay_ms": 1, "rounds": [[{"lorem": 4000}]]}}
    overrides = {"stream.queue_max_events": 20, "server.send_buffer_bytes": 4096}
    async with gateway(tmp_path, **overrides) as gw:
        sid = await gw.create_session()
        port = int(gw.base.rsplit(":", 1)[1])
        attach = await token(gw, sid)
        async with gw.client(sid) as watcher:
            await watcher.subscribe()
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            async with stream:
                await stream.send_all(
                    f"GET /sessions/{sid}/events?attach={attach}&filter=preset:full HTTP/1.1\r\n"
                    "Host: 127.0.0.1\r\n\r\n".encode()
                )
                seen = b""
                while b"subscribe_ack" not in seen:
                    seen += await stream.receive_some(65536)
                await gw.submit(sid, paced)
                # ... and reads nothing more
                with trio.fail_after(20):
                    found = await watcher.until(lambda e: e.type == "bus.handler_warning")
                warning = found[-1].payload
                assert warning.reason == "client_too_slow"
                assert warning.subscription_name.startswith("sse-")
                assert "SSE stream queue exceeded queue_max_events=20" in warning.detail
                # Reading again: what was written, the close frame, the end of the body.
                with trio.fail_after(10):
                    while not seen.endswith(b"0\r\n\r\n"):
                        chunk = await stream.receive_some(65536)
                        assert chunk, seen[-200:]
                        seen += chunk
        assert b'"type":"close","code":"client_too_slow","ws_code":1008' in seen
        assert gw.node.metrics.slow_clients._value.get() == 1


# --- the client library falls back to SSE ----------------------------------------------


class NoUpgradeProxy:
    """A relay in front of the gateway that lets plain HTTP through and no WebSocket.

    ``strip``: the upgrade's headers are dropped on the way, so the gateway
    answers 426 ``upgrade_required``; ``refuse``: the proxy answers 502 itself,
    with a page of its own, as a proxy configured without WebSockets does.
    """

    PAGE = b"<h1>502 Bad Gateway</h1>"

    def __init__(self, target_port: int, mode: str) -> None:
        self.target_port = target_port
        self.mode = mode
        self.upgrades = 0

    async def serve(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        task_status.started(listeners[0].socket.getsockname()[1])
        await trio.serve_listeners(self._relay, listeners)

    async def _relay(self, downstream: trio.SocketStream) -> None:
        async with downstream:
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = await downstream.receive_some(65536)
                if not chunk:
                    return
                head += chunk
            if b"\r\nupgrade:" in head.lower():
                self.upgrades += 1
                if self.mode == "refuse":
                    await downstream.send_all(
                        b"HTTP/1.1 502 Bad Gateway\r\nContent-Type: text/html\r\n"
                        b"Content-Length: %d\r\nConnection: close\r\n\r\n%s"
                        % (len(self.PAGE), self.PAGE)
                    )
                    return
                lines = head.split(b"\r\n")
                dropped = (b"upgrade:", b"connection:")
                head = b"\r\n".join(x for x in lines if not x.lower().startswith(dropped))
            async with await trio.open_tcp_stream("127.0.0.1", self.target_port) as up:
                await up.send_all(head)

                async def pump(src: trio.SocketStream, dst: trio.SocketStream) -> None:
                    with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                        async for data in src:
                            await dst.send_all(data)
                    nursery.cancel_scope.cancel()

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(pump, downstream, up)
                    nursery.start_soon(pump, up, downstream)


@pytest.mark.parametrize("mode", ["strip", "refuse"])
async def test_the_client_falls_back_to_sse_when_the_upgrade_is_refused(
    tmp_path: Path, mode: str
) -> None:
    async with gateway(tmp_path) as gw:
        sid = await gw.create_session()
        proxy = NoUpgradeProxy(int(gw.base.rsplit(":", 1)[1]), mode)
        notices: list[Notice] = []
        got: list[Event] = []
        async with trio.open_nursery() as nursery:
            port = await nursery.start(proxy.serve)
            async with gw.client(sid) as ws:
                await ws.subscribe()
                async with (
                    GatewayClient(f"http://127.0.0.1:{port}") as client,
                    client.subscribe(sid) as stream,
                ):
                    with trio.fail_after(15):
                        async for item in stream:
                            if isinstance(item, Notice):
                                notices.append(item)
                            elif isinstance(item.frame, SubscribeAck):
                                await gw.submit(sid, TOOL_SCRIPT)
                            elif isinstance(item.frame, EventFrame):
                                got.append(item.frame.event)
                                if item.frame.event.type == "turn.completed":
                                    break
                        await ws.until_turn_ends()
                        # A close over SSE is the WebSocket's: the deletion ends it for good.
                        assert (await gw.http.delete(f"/sessions/{sid}")).status_code == 204
                        with pytest.raises(ClientError) as deleted:
                            async for _ in stream:
                                pass
            nursery.cancel_scope.cancel()
    assert stream.transport == "sse" and proxy.upgrades == 1
    assert "using server-sent events" in notices[0].message
    assert deleted.value.code == "session_deleted"
    ids = [e.id for e in got]
    assert ids == [e.id for e in ws.events if ids[0] <= e.id <= ids[-1]]


# --- the direct path (docs/performance.md "Doors") ------------------------------------------


async def test_an_idle_stream_is_written_from_the_fan_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reading client is written straight from the fan-out, through its socket, and
    gets the same stream as a WebSocket."""
    direct: list[int] = []
    chunked = events_module._live_chunked

    def counted(batch: FrameBatch) -> bytes:
        direct.append(batch.n)
        return chunked(batch)

    monkeypatch.setattr(events_module, "_live_chunked", counted)
    async with gateway(tmp_path) as gw:
        sid = await gw.create_session()
        async with gw.client(sid) as ws, sse(gw, sid, filter="preset:full") as live:
            await ws.subscribe()
            assert isinstance(await live.recv(), SubscribeAck)
            await gw.submit(sid, TOOL_SCRIPT)
            await live.until("turn.completed")
            await ws.until_turn_ends()
    assert direct  # batches written straight from the fan-out, each encoded once
    assert live.reducer.state()["messages"] == ws.reducer.state()["messages"]

"""The AI SDK's WebSocket door, ``GET /ai-sdk/ws``, driven by an independent client
(docs/doors/aisdk.md).

trio-websocket speaks ``WebSocketChatTransport``'s frames to a real gateway
on 127.0.0.1 port 0: ``send``, ``resume`` (``lastSequence``), ``abort``; the
chunks are read by :class:`tests.aisdk_support.UiMessage`.
"""

from __future__ import annotations

import json
import socket
import uuid
from pathlib import Path
from typing import Any

import pytest
import trio
from trio_websocket import (
    ConnectionClosed,
    WebSocketConnection,
    open_websocket_url,
    wrap_client_stream,
)

from tests.aisdk_support import UiMessage, gateway, user, ws_url
from tests.integration.doors.rest.test_http_api import rejected
from tests.scripts import LONG_NAP, TEXT


def send(chat: str, *messages: dict[str, Any], rid: str | None = None) -> dict[str, Any]:
    return {"type": "send", "requestId": rid or f"r-{uuid.uuid4()}", "id": chat,
            "trigger": "submit-message", "messageId": None, "messages": list(messages),
            "headers": {}, "body": {}, "metadata": None}  # fmt: skip


def resume(chat: str, rid: str, last: int | None = None) -> dict[str, Any]:
    frame = {"type": "resume", "requestId": rid, "id": chat, "headers": {}, "body": {}}
    return frame if last is None else {**frame, "lastSequence": last}


class Responses:
    """The frames of one socket, sorted by request, each applied to its message."""

    def __init__(self, ws: WebSocketConnection) -> None:
        self.ws = ws
        self.messages: dict[str, UiMessage] = {}
        self.frames: dict[str, list[dict[str, Any]]] = {}
        self.partial: set[str] = set()  # resumed after a lastSequence: chunks not applied

    async def request(self, frame: dict[str, Any]) -> str:
        await self.ws.send_message(json.dumps(frame))
        return str(frame["requestId"])

    async def until(self, rid: str, done: Any) -> UiMessage:
        m = self.messages.setdefault(rid, UiMessage())
        while not done(m, self.frames.get(rid, [])):
            frame = json.loads(await self.ws.get_message())
            got = frame["requestId"]
            self.frames.setdefault(got, []).append(frame)
            target = self.messages.setdefault(got, UiMessage())
            if frame["type"] == "chunk":
                seqs = [f["sequence"] for f in self.frames[got] if f["type"] == "chunk"]
                assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), seqs
                if got not in self.partial:
                    target.apply(frame["chunk"])
            elif frame["type"] == "end":
                target.done = True
        return m


def ended(m: UiMessage, frames: list[dict[str, Any]]) -> bool:
    return bool(frames) and frames[-1]["type"] in ("end", "error", "no-active")


def running(m: UiMessage, frames: list[dict[str, Any]]) -> bool:
    return any(p.get("state") == "input-available" for p in m.parts)


async def test_send_streams_a_turn_and_resume_replays_it_after_last_sequence(
    tmp_path: Path,
) -> None:
    async with gateway(tmp_path) as h, open_websocket_url(ws_url(h)) as ws:
        r = Responses(ws)
        chat_id = f"chat-{uuid.uuid4()}"
        rid = await r.request(send(chat_id, user(TEXT)))
        m = await r.until(rid, ended)
        assert r.frames[rid][0] == {"type": "start", "requestId": rid}
        assert m.done and m.text == "Hello there, friend." and m.finish_reason == "stop"
        # No turn in flight: no-active.
        idle = await r.request(resume(chat_id, "idle-1"))
        await r.until(idle, ended)
        assert r.frames[idle] == [{"type": "no-active", "requestId": idle}]
        # A turn in flight: resumed whole, then from after lastSequence.
        nap = await r.request(send(chat_id, user(LONG_NAP)))
        await r.until(nap, running)
        whole = await r.request(resume(chat_id, "whole"))
        full = await r.until(whole, running)
        assert full.parts == r.messages[nap].parts
        r.partial.add("part")
        part = await r.request(resume(chat_id, "part", last=2))
        await r.until(part, lambda m, f: len([x for x in f if x["type"] == "chunk"]) >= 2)
        first = next(x for x in r.frames[part] if x["type"] == "chunk")
        assert first["sequence"] == 3
        # abort: the turn is cancelled; the aborted request's stream ends there.
        await ws.send_message(json.dumps({"type": "abort", "requestId": nap}))
        done = await r.until(whole, ended)
        assert "abort" in [c["type"] for c in done.chunks] and done.finish_reason == "other"
        state = (await h.http.get(f"/sessions/{chat_id}")).json()
        assert state.get("current_turn_id") is None


async def test_closing_the_socket_never_cancels_the_turn(tmp_path: Path) -> None:
    async with gateway(tmp_path) as h:
        chat_id = f"chat-{uuid.uuid4()}"
        slow = {"script": {"rounds": [[{"tool_use": {"name": "sleep", "input": {"seconds": 0.3}}}],
                                      [{"text": "Rested."}]]}}  # fmt: skip
        async with open_websocket_url(ws_url(h)) as ws:
            r = Responses(ws)
            rid = await r.request(send(chat_id, user(slow)))
            await r.until(rid, running)
        async with open_websocket_url(ws_url(h)) as ws:
            r = Responses(ws)
            rid = await r.request(resume(chat_id, "again"))
            m = await r.until(rid, ended)
            assert m.text == "Rested." and m.finish_reason == "stop"


async def test_keys_frames_and_ownership(tmp_path: Path) -> None:
    async with gateway(tmp_path, **{"auth.api_keys": ["key-a", "key-b"]}) as h:
        chat_id = f"chat-{uuid.uuid4()}"
        assert await rejected(ws_url(h)) == (401, "unauthorized")
        assert await rejected(ws_url(h, "?key=nope")) == (403, "forbidden")
        async with open_websocket_url(ws_url(h, "?key=key-a")) as ws:
            r2 = Responses(ws)
            rid = await r2.request(send(chat_id, user(TEXT)))
            assert (await r2.until(rid, ended)).text == "Hello there, friend."
            bad = await r2.request(send("bad id!", user(TEXT)))
            await r2.until(bad, ended)
            assert r2.frames[bad][-1]["errorText"].startswith("invalid_chat_id: ")
            await ws.send_message(json.dumps({"type": "sing", "requestId": "x"}))
            await r2.until("x", ended)
            assert r2.frames["x"][-1]["type"] == "error"
        # A proxy's Basic credential is not the gateway's: the key in the query still counts.
        basic = [("Authorization", "Basic dXNlcjpwYXNz")]
        async with open_websocket_url(ws_url(h, "?key=key-a"), extra_headers=basic) as ws:
            r4 = Responses(ws)
            rid = await r4.request(send(chat_id, user(TEXT)))
            assert (await r4.until(rid, ended)).text == "Hello there, friend."
        async with open_websocket_url(ws_url(h, "?key=key-b")) as ws:
            r3 = Responses(ws)
            rid = await r3.request(send(chat_id, user(TEXT)))
            await r3.until(rid, ended)
            assert r3.frames[rid][-1]["errorText"].startswith("session_not_found: ")
        # A frame that is no JSON request object closes the socket (1003).
        port = int(h.base.rsplit(":", 1)[1])
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        try:
            async with trio.open_nursery() as nursery:
                ws = await wrap_client_stream(
                    nursery, stream, f"127.0.0.1:{port}", "/ai-sdk/ws?key=key-b"
                )
                await ws.send_message("not json")
                with pytest.raises(ConnectionClosed) as closed:
                    await ws.get_message()
                assert closed.value.reason.code == 1003
                nursery.cancel_scope.cancel()
        finally:
            await stream.aclose()


async def test_a_resume_at_every_chunk_boundary_gives_exactly_the_rest(tmp_path: Path) -> None:
    """A turn paused on a long tool: ``resume`` after each ``lastSequence`` k is chunks k+1..."""
    async with gateway(tmp_path) as h, open_websocket_url(ws_url(h)) as ws:
        r = Responses(ws)
        chat_id = f"chat-{uuid.uuid4()}"
        nap = await r.request(send(chat_id, user(LONG_NAP)))
        await r.until(nap, running)
        whole = await r.request(resume(chat_id, "whole"))
        await r.until(whole, running)
        reference = [f["chunk"] for f in r.frames[whole] if f["type"] == "chunk"]
        assert len(reference) >= 6
        for k in range(-1, len(reference) - 1):
            rid = f"at-{k}"
            r.partial.add(rid)
            await r.request(resume(chat_id, rid, last=None if k < 0 else k))
            want = len(reference) - (k + 1)
            await r.until(
                rid, lambda m, f, n=want: len([x for x in f if x["type"] == "chunk"]) >= n
            )
            got = [f for f in r.frames[rid] if f["type"] == "chunk"]
            assert [f["sequence"] for f in got] == list(range(k + 1, len(reference)))
            assert [f["chunk"] for f in got] == reference[k + 1 :]
        await ws.send_message(json.dumps({"type": "abort", "requestId": nap}))


async def test_a_socket_that_stops_reading_is_closed_1008(tmp_path: Path) -> None:
    paced = {"script": {"delay_ms": 1, "rounds": [[{"lorem": 4000}]]}}
    overrides = {"stream.queue_max_events": 20, "server.send_buffer_bytes": 4096}
    async with gateway(tmp_path, **overrides) as h:
        chat_id = await h.create_session()
        async with h.client(chat_id) as watcher:
            await watcher.subscribe()
            port = int(h.base.rsplit(":", 1)[1])
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            # A small window: the kernel must not take the whole reply for us.
            stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            try:
                async with trio.open_nursery() as nursery:
                    ws = await wrap_client_stream(
                        nursery, stream, f"127.0.0.1:{port}", "/ai-sdk/ws"
                    )
                    await ws.send_message(json.dumps(send(chat_id, user(paced))))
                    found = await watcher.until(lambda e: e.type == "bus.handler_warning")
                    assert found[-1].payload.subscription_name.startswith("aisdk-")
                    with pytest.raises(ConnectionClosed) as closed:
                        while True:
                            await ws.get_message()
                    assert closed.value.reason.code == 1008
                    assert json.loads(closed.value.reason.reason)["code"] == "client_too_slow"
                    nursery.cancel_scope.cancel()
            finally:
                await stream.aclose()
            assert h.node.sessions[chat_id].turn is not None  # the turn goes on
            stop = await h.http.post(f"/ai-sdk/chat/{chat_id}/stop", json={})
            assert stop.status_code == 202


async def test_each_door_counts_its_open_streams(tmp_path: Path) -> None:
    """``gateway_streams_open{door}``: the AI SDK's two doors among the others."""
    async with gateway(tmp_path) as h:

        def open_by_door() -> dict[str, float]:
            return {d: h.node.metrics.streams_by_door()[d] for d in ("ai_sdk", "ai_sdk_ws")}

        assert open_by_door() == {"ai_sdk": 0, "ai_sdk_ws": 0}
        async with open_websocket_url(ws_url(h)) as ws:
            assert open_by_door() == {"ai_sdk": 0, "ai_sdk_ws": 1}
            r = Responses(ws)
            rid = await r.request(send(f"chat-{uuid.uuid4()}", user(TEXT)))
            await r.until(rid, ended)
        with trio.fail_after(5):
            while open_by_door()["ai_sdk_ws"]:  # the server's side of the close comes after
                await h.node.changed()
        metrics = (await h.http.get("/metrics")).text
        assert 'gateway_streams_open{door="ai_sdk_ws"} 0.0' in metrics
        assert 'gateway_streams_open{door="websocket"} 0.0' in metrics

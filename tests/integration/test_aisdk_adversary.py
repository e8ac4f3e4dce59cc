"""The AI SDK's doors against hostile and unlucky clients (docs/protocol.md §14, §15).

A client sends what no transport would (deep JSON, mistyped fields, forged
metadata), races itself and other keys, asks for a HEAD of a stream, and
opens more than the key's limits allow; a page of another origin knocks.
Each test says what must hold; those marked ``xfail`` are defects of the
doors as built, each naming where it comes from.
"""

from __future__ import annotations

import contextlib
import json
import logging
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing, asynccontextmanager
from pathlib import Path
from typing import Any, cast

import httpx
import pytest
import trio
from trio_websocket import ConnectionClosed, WebSocketConnection, open_websocket_url

from tests.aisdk_support import UiMessage, read, read_until, request, user
from tests.conftest import TOOL_SCRIPT, Harness, make_config, running_gateway

TEXT = {"script": {"rounds": [[{"text": "Hello there, friend."}]]}}
LONG_NAP = {
    "script": {
        "rounds": [
            [{"text": "Napping."}, {"tool_use": {"name": "sleep", "input": {"seconds": 60}}}],
            [{"text": "Awake."}],
        ]
    }
}
APPROVAL = {"tools.require_approval": ["sleep"]}
KEYS = {"auth.api_keys": ["key-a", "key-b"]}
A = {"Authorization": "Bearer key-a"}
B = {"Authorization": "Bearer key-b"}


@asynccontextmanager
async def gateway(tmp_path: Path, **overrides: Any) -> AsyncIterator[Harness]:
    with trio.fail_after(30):
        async with running_gateway(make_config(tmp_path, **overrides)) as h:
            yield h


def ws_url(h: Harness, query: str = "") -> str:
    return h.base.replace("http://", "ws://") + "/ai-sdk/ws" + query


def chat_id() -> str:
    return f"chat-{uuid.uuid4()}"


def subscribers(h: Harness, chat: str) -> int:
    """The chat's subscribers on this node (every response, every client)."""
    return len(h.node.sessions[chat].hub.subscribers())


def running(m: UiMessage) -> bool:
    return any(p.get("state") == "input-available" for p in m.parts)


def failures(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


async def server_errors(h: Harness) -> list[str]:
    """``gateway_http_requests`` samples with a 5xx status other than a 503."""
    text = (await h.http.get("/metrics")).text
    return [
        line
        for line in text.splitlines()
        if line.startswith("gateway_http_requests_total") and 'status="5' in line
        and 'status="503"' not in line
    ]  # fmt: skip


async def frames_of(ws: WebSocketConnection, rid: str, last: tuple[str, ...]) -> list[Any]:
    """The frames of request ``rid`` up to one whose type is in ``last``."""
    got: list[Any] = []
    while not got or got[-1]["type"] not in last:
        frame = json.loads(await ws.get_message())
        if frame["requestId"] == rid:
            got.append(frame)
    return got


def send(chat: str, *messages: dict[str, Any], rid: str) -> str:
    return json.dumps({"type": "send", "requestId": rid, "id": chat, "messages": list(messages),
                       "trigger": "submit-message", "headers": {}, "body": {}})  # fmt: skip


def resume(chat: str, rid: str) -> str:
    return json.dumps({"type": "resume", "requestId": rid, "id": chat, "headers": {}, "body": {}})


# --- defects -------------------------------------------------------------------------


@pytest.mark.xfail(
    strict=True,
    reason="HEAD of GET /ai-sdk/chat/{id}/stream: the HTTP server sends the SSE body to a HEAD "
    "(h11 LocalProtocolError, logged 'HTTP connection ... failed'), and Responses._response's "
    "run() leaves its subscriber on the hub when a send fails before pump() starts",
)
async def test_a_head_of_the_resume_leaves_nothing_behind(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with gateway(tmp_path) as h:
        chat = chat_id()
        m = UiMessage()
        async with (
            h.http.stream("POST", "/ai-sdk/chat", json=request(chat, user(LONG_NAP))) as r,
            aclosing(cast(AsyncGenerator[str, None], r.aiter_lines())) as lines,
        ):
            await read_until(lines, m, lambda: running(m))
            for _ in range(3):
                with contextlib.suppress(httpx.HTTPError):  # (on main the connection is cut)
                    await h.http.head(f"/ai-sdk/chat/{chat}/stream")
            stop = await h.http.post(f"/ai-sdk/chat/{chat}/stop", json={})
            assert stop.status_code == 202
            await read_until(lines, m, lambda: False)
        await trio.sleep(0.5)  # (each response leaves once its stream has ended)
        assert subscribers(h, chat) == 0  # on main: the three HEADs' responses stay subscribed
        assert failures(caplog) == []


@pytest.mark.xfail(
    strict=True,
    reason="ChatSocket._read decodes a frame catching DecodeError and ValidationError only: "
    "msgspec's RecursionError on deep JSON escapes, the handler fails (ERROR "
    "'WebSocket handler failed', close 1011 internal_error) instead of 1003",
)
async def test_a_deeply_nested_frame_is_a_1003_not_an_internal_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with gateway(tmp_path) as h, open_websocket_url(ws_url(h)) as ws:
        deep = "[" * 20000 + "]" * 20000  # 40 kB: under max_client_frame_bytes
        await ws.send_message('{"type":"send","requestId":"a","id":"c","messages":' + deep + "}")
        with pytest.raises(ConnectionClosed) as closed:
            await ws.get_message()
        assert closed.value.reason.code == 1003, closed.value.reason
        assert failures(caplog) == []


@pytest.mark.xfail(
    strict=True,
    reason="one /ai-sdk/ws socket counts as one stream (limits.open_stream in ws.chat_socket) "
    "but ChatSocket._dispatch opens any number of responses on it, each a subscriber with "
    "its own queue: max_connections(_per_key) bound nothing there",
)
async def test_one_socket_cannot_hold_more_responses_than_the_keys_limit(tmp_path: Path) -> None:
    async with (
        gateway(tmp_path, **{"limits.max_connections_per_key": 2}) as h,
        open_websocket_url(ws_url(h)) as ws,
    ):
        chat = chat_id()
        await ws.send_message(send(chat, user(LONG_NAP), rid="first"))
        while "tool-input-available" not in await ws.get_message():
            pass
        refused = 0
        for i in range(20):
            await ws.send_message(resume(chat, f"r{i}"))
            frames = await frames_of(ws, f"r{i}", ("start", "error"))
            refused += frames[-1]["type"] == "error"
        # The key may hold 2 streams: 20 more responses on the one socket is over it.
        assert subscribers(h, chat) <= 2, subscribers(h, chat)
        assert refused >= 19
        await h.http.post(f"/ai-sdk/chat/{chat}/stop", json={})


@pytest.mark.xfail(
    strict=True,
    reason="ChatSocket._read decodes the whole frame as one Struct: a send/resume that names "
    "its requestId but has a mistyped field (id: 5, messages: {}, lastSequence: 'x') closes "
    "the socket 1003, ending every other request on it, where ws.py's docstring says a "
    "frame that names a request is answered with an error frame",
)
async def test_a_mistyped_request_is_its_own_error_not_the_sockets_end(tmp_path: Path) -> None:
    async with gateway(tmp_path) as h, open_websocket_url(ws_url(h)) as ws:
        chat = chat_id()
        await ws.send_message(send(chat, user(LONG_NAP), rid="first"))
        while "tool-input-available" not in await ws.get_message():
            pass
        for i, bad in enumerate(({"id": 5}, {"messages": {}}, {"lastSequence": "x"})):
            frame = {"type": "send", "requestId": f"bad{i}", "id": chat, "messages": [], **bad}
            await ws.send_message(json.dumps(frame))
            frames = await frames_of(ws, f"bad{i}", ("error",))
            assert frames[-1]["errorText"].startswith("invalid_body"), frames
        await h.http.post(f"/ai-sdk/chat/{chat}/stop", json={})
        first = await frames_of(ws, "first", ("end",))
        assert any(f.get("chunk", {}).get("type") == "abort" for f in first)


async def _pending_approval(h: Harness, chat: str) -> UiMessage:
    async with h.http.stream("POST", "/ai-sdk/chat", json=request(chat, user(TOOL_SCRIPT))) as r:
        m = await read(r)
    assert m.finish_reason == "tool-calls"
    return m


def _approved(m: UiMessage, **gateway_meta: Any) -> dict[str, Any]:
    sent = json.loads(json.dumps(m.as_sent()))
    [tool] = [p for p in sent["parts"] if p["type"] == "dynamic-tool"]
    tool["state"] = "approval-responded"
    tool["approval"]["approved"] = True
    sent["metadata"]["gateway"].update(gateway_meta)
    return sent


@pytest.mark.xfail(
    strict=True,
    reason="Responses._answer takes metadata.gateway.turnId on trust: naming another chat's "
    "turn decides this chat's approvals anyway, then answers start(messageId of the foreign "
    "turn), error 'can no longer be replayed', finish: the client's message is renamed and "
    "the continuation it asked for is never streamed",
)
async def test_a_continuation_naming_another_chats_turn_is_refused_or_ignored(
    tmp_path: Path,
) -> None:
    async with gateway(tmp_path, **APPROVAL) as h:
        other, chat = chat_id(), chat_id()
        foreign = (await _pending_approval(h, other)).metadata["gateway"]["turnId"]
        m = await _pending_approval(h, chat)
        own = m.metadata["gateway"]["turnId"]
        body = request(chat, user(TOOL_SCRIPT), _approved(m, turnId=foreign))
        async with h.http.stream("POST", "/ai-sdk/chat", json=body) as r:
            if r.status_code != 200:  # refused: then nothing was decided
                state = (await h.http.get(f"/sessions/{chat}")).json()
                assert state["pending_permissions"], state
                return
            got = await read(r)
        assert got.id == f"msg_{own}" and got.errors == [], got.chunks
        assert got.finish_reason == "stop"


@pytest.mark.xfail(
    strict=True,
    reason="Responses._answer uses metadata.gateway.lastEventId as ChatMapper.after unchecked: "
    "one past the newest event id hides every chunk, finish included (the response is "
    "start then [DONE]), and pause() can never end it while a later approval waits",
)
async def test_a_continuation_with_a_cursor_from_the_future_still_finishes(
    tmp_path: Path,
) -> None:
    async with gateway(tmp_path, **APPROVAL) as h:
        chat = chat_id()
        m = await _pending_approval(h, chat)
        future = "evt_" + "9" * 20
        body = request(chat, user(TOOL_SCRIPT), _approved(m, lastEventId=future))
        async with h.http.stream("POST", "/ai-sdk/chat", json=body) as r:
            if r.status_code != 200:  # refused (422): as good
                assert r.status_code == 422
                return
            got = await read(r)
        assert got.finish_reason == "stop", [c["type"] for c in got.chunks]

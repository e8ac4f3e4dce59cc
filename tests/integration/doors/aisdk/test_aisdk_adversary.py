"""The AI SDK's doors against hostile, unlucky clients (docs/doors/aisdk.md, docs/protocol.md §15).

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
from trio_websocket import (
    ConnectionClosed,
    WebSocketConnection,
    open_websocket_url,
    wrap_client_stream,
)

from tests.aisdk_support import UiMessage, gateway, read, read_until, request, user, ws_url
from tests.conftest import TOOL_SCRIPT, Harness
from tests.integration.doors.rest.test_http_api import rejected

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
async def closing_ws(h: Harness, query: str = "") -> AsyncIterator[WebSocketConnection]:
    """A socket the server may close: its TCP stream closed here, whatever happens.

    (trio-websocket leaves the stream of a connection the server closed unclosed:
    a ResourceWarning in some later test.)
    """
    port = int(h.base.rsplit(":", 1)[1])
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    try:
        async with trio.open_nursery() as nursery:
            host, resource = f"127.0.0.1:{port}", "/ai-sdk/ws" + query
            ws = await wrap_client_stream(nursery, stream, host, resource)
            try:
                yield ws
            finally:
                nursery.cancel_scope.cancel()
    finally:
        await stream.aclose()


def chat_id() -> str:
    return f"chat-{uuid.uuid4()}"


def subscribers(h: Harness, chat: str) -> int:
    """The chat's subscribers on this node (every response, every client)."""
    return len(h.node.sessions[chat].hub.subscribers())


async def live(h: Harness, chat: str) -> tuple[str | None, list[str]]:
    """The chat's turn in flight and its pending permission ids, as the node has them."""
    state = await h.node.live_summary(h.node.sessions[chat])
    return state.current_turn_id, [p.perm_id for p in state.pending_permissions]


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


async def test_a_deeply_nested_frame_is_a_1003_not_an_internal_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with gateway(tmp_path) as h, closing_ws(h) as ws:
        deep = "[" * 20000 + "]" * 20000  # 40 kB: under max_client_frame_bytes
        await ws.send_message('{"type":"send","requestId":"a","id":"c","messages":' + deep + "}")
        with pytest.raises(ConnectionClosed) as closed:
            await ws.get_message()
        reason = closed.value.reason
        assert reason is not None and reason.code == 1003, reason
        assert failures(caplog) == []


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


async def test_a_mistyped_request_is_its_own_error_not_the_sockets_end(tmp_path: Path) -> None:
    async with gateway(tmp_path) as h, closing_ws(h) as ws:
        chat = chat_id()
        await ws.send_message(send(chat, user(LONG_NAP), rid="first"))
        while "tool-input-available" not in await ws.get_message():
            pass
        mistyped: list[dict[str, Any]] = [{"id": 5}, {"messages": {}}, {"lastSequence": "x"}]
        for i, bad in enumerate(mistyped):
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
    sent: dict[str, Any] = json.loads(json.dumps(m.as_sent()))
    [tool] = [p for p in sent["parts"] if p["type"] == "dynamic-tool"]
    tool["state"] = "approval-responded"
    tool["approval"]["approved"] = True
    sent["metadata"]["gateway"].update(gateway_meta)
    return sent


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
                assert (await live(h, chat))[1], "refused, yet the approval was decided"
                return
            got = await read(r, m)  # the message useChat continues
        assert got.id == f"msg_{own}" and got.errors == [], got.chunks
        assert got.finish_reason == "stop"


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


async def test_a_repeated_request_is_answered_even_at_the_turn_limit(tmp_path: Path) -> None:
    async with gateway(tmp_path, **{"limits.turns_per_minute_per_key": 1}) as h:
        chat = chat_id()
        question = user(TEXT)
        async with h.http.stream("POST", "/ai-sdk/chat", json=request(chat, question)) as r:
            first = await read(r)
        async with h.http.stream("POST", "/ai-sdk/chat", json=request(chat, question)) as r:
            assert r.status_code == 200, (await r.aread()).decode()
            again = await read(r)
        assert again.id == first.id and again.text == first.text


# --- what holds (pins) -----------------------------------------------------------------


async def test_the_same_request_twice_at_once_runs_one_turn(tmp_path: Path) -> None:
    """A retry racing its original: one turn, each answer that turn (or 409), never two."""
    async with gateway(tmp_path) as h:
        for _ in range(4):
            chat, question = chat_id(), user(TEXT)
            answers: list[tuple[int, UiMessage | None]] = []

            async def post(
                chat: str = chat,
                question: dict[str, Any] = question,
                answers: list[tuple[int, UiMessage | None]] = answers,
            ) -> None:
                async with h.http.stream("POST", "/ai-sdk/chat", json=request(chat, question)) as r:
                    if r.status_code != 200:
                        await r.aread()
                        assert r.json()["error"]["code"] == "turn_in_progress", r.text
                        answers.append((r.status_code, None))
                    else:
                        answers.append((200, await read(r)))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(post)
                nursery.start_soon(post)
            messages = (await h.http.get(f"/sessions/{chat}/messages")).json()["messages"]
            assert len({m["turn_id"] for m in messages}) == 1
            assert [m["role"] for m in messages] == ["user", "assistant"]
            for status, m in answers:
                assert status == 409 or (m is not None and m.text == "Hello there, friend.")


async def test_two_keys_racing_to_create_one_chat_one_owns_it(tmp_path: Path) -> None:
    async with gateway(tmp_path, **KEYS) as h:
        for _ in range(4):
            chat = chat_id()
            got: dict[str, int] = {}

            async def post(key: str, chat: str = chat, got: dict[str, int] = got) -> None:
                headers = {"Authorization": f"Bearer {key}"}
                body = request(chat, user(TEXT))
                async with h.http.stream("POST", "/ai-sdk/chat", json=body, headers=headers) as r:
                    await r.aread()
                    got[key] = r.status_code

            async with trio.open_nursery() as nursery:
                nursery.start_soon(post, "key-a")
                nursery.start_soon(post, "key-b")
            assert sorted(got.values()) == [200, 404], got
            [owner] = [k for k, status in got.items() if status == 200]
            for key in ("key-a", "key-b"):
                r = await h.http.get(
                    f"/sessions/{chat}", headers={"Authorization": f"Bearer {key}"}
                )
                assert r.status_code == (200 if key == owner else 404)


async def test_a_page_of_another_origin_is_refused_on_every_door(tmp_path: Path) -> None:
    """docs/protocol.md §15: the Origin check holds on the AI SDK's routes and its upgrade."""
    evil = "http://evil.example"
    async with gateway(tmp_path, **{"auth.allowed_origins": ["http://app.example"]}) as h:
        chat = chat_id()
        headers = {"Origin": evil}
        for method, path, body in (
            ("POST", "/ai-sdk/chat", request(chat, user(TEXT))),
            ("GET", f"/ai-sdk/chat/{chat}/stream", None),
            ("POST", f"/ai-sdk/chat/{chat}/stop", {}),
        ):
            r = await h.http.request(method, path, json=body, headers=headers)
            assert (r.status_code, r.json()["error"]["code"]) == (403, "origin_not_allowed")
        refused = await rejected(ws_url(h), extra_headers=[(b"Origin", evil.encode())])
        assert refused == (403, "origin_not_allowed")
        assert (await h.http.get(f"/sessions/{chat}")).status_code == 404  # nothing made
        # The listed origin is answered, its CORS headers on the stream.
        listed = {"Origin": "http://app.example"}
        body = request(chat, user(TEXT))
        async with h.http.stream("POST", "/ai-sdk/chat", json=body, headers=listed) as r:
            assert r.headers["access-control-allow-origin"] == "http://app.example"
            assert (await read(r)).text == "Hello there, friend."


async def test_the_key_query_parameter_wrong_empty_repeated(tmp_path: Path) -> None:
    async with gateway(tmp_path, **KEYS) as h:
        assert await rejected(ws_url(h, "?key=")) == (401, "unauthorized")
        assert await rejected(ws_url(h, "?key=key-c")) == (403, "forbidden")
        assert await rejected(ws_url(h, "?key=key-a&key=key-b")) == (
            400,
            "duplicate_query_parameter",
        )
        assert await rejected(ws_url(h, "?key=key-a&key=")) == (400, "duplicate_query_parameter")
        wrong = [(b"Authorization", b"Bearer nope")]  # the header, when sent, is the key
        assert await rejected(ws_url(h, "?key=key-a"), extra_headers=wrong) == (403, "forbidden")
        # The query is the WebSocket's alone: the HTTP doors take the header only.
        r = await h.http.post("/ai-sdk/chat?key=key-a", json=request(chat_id(), user(TEXT)))
        assert r.status_code == 401
        r = await h.http.post(
            "/ai-sdk/chat?key=key-a", json=request(chat_id(), user(TEXT)), headers=A
        )
        assert (r.status_code, r.json()["error"]["code"]) == (422, "invalid_query")


async def test_a_keys_stream_limit_counts_both_doors(tmp_path: Path) -> None:
    async with gateway(tmp_path, **KEYS, **{"limits.max_connections_per_key": 1}) as h:
        chat = chat_id()
        async with h.http.stream(
            "POST", "/ai-sdk/chat", json=request(chat, user(TEXT)), headers=A
        ) as r:
            await read(r)
        async with open_websocket_url(ws_url(h, "?key=key-a")):
            r = await h.http.post("/ai-sdk/chat", json=request(chat, user(TEXT)), headers=A)
            assert (r.status_code, r.json()["error"]["code"]) == (503, "over_capacity")
            r = await h.http.get(f"/ai-sdk/chat/{chat}/stream", headers=A)
            assert r.status_code == 503
            assert await rejected(ws_url(h, "?key=key-a")) == (503, "over_capacity")
            # Another key is not held back by it.
            async with h.http.stream(
                "POST", "/ai-sdk/chat", json=request(chat_id(), user(TEXT)), headers=B
            ) as r:
                assert r.status_code == 200
                await read(r)
        with trio.fail_after(5):
            while h.node.metrics.streams_by_door()["ai_sdk_ws"]:
                await h.node.changed()
        assert (await h.http.get(f"/ai-sdk/chat/{chat}/stream", headers=A)).status_code == 204
        assert (await h.http.get(f"/sessions/{chat}", headers=A)).json().get(
            "current_turn_id"
        ) is None


async def test_a_keys_turn_limit_counts_both_doors(tmp_path: Path) -> None:
    async with gateway(tmp_path, **{"limits.turns_per_minute_per_key": 1}) as h:
        chat = chat_id()
        async with h.http.stream("POST", "/ai-sdk/chat", json=request(chat, user(TEXT))) as r:
            await read(r)
        async with open_websocket_url(ws_url(h)) as ws:
            await ws.send_message(send(chat, user(TEXT), rid="over"))
            [error] = await frames_of(ws, "over", ("error", "end"))
            assert error["type"] == "error" and error["errorText"].startswith("rate_limited: ")
            await ws.send_message(resume(chat, "still"))  # the socket goes on
            assert await frames_of(ws, "still", ("no-active",)) == [
                {"type": "no-active", "requestId": "still"}
            ]
        messages = (await h.http.get(f"/sessions/{chat}/messages")).json()["messages"]
        assert len(messages) == 2  # the refused turn left nothing


async def test_aborts_of_nothing_duplicate_ids_and_an_abort_before_the_answer(
    tmp_path: Path,
) -> None:
    async with gateway(tmp_path) as h, open_websocket_url(ws_url(h)) as ws:
        chat = chat_id()
        await ws.send_message(json.dumps({"type": "abort", "requestId": "never-made"}))
        await ws.send_message(send(chat, user(LONG_NAP), rid="a"))
        await ws.send_message(send(chat, user(TEXT), rid="a"))  # in use
        [error] = (await frames_of(ws, "a", ("error",)))[-1:]
        assert error["errorText"] == "invalid_frame: a requestId in use"
        while "tool-input-available" not in await ws.get_message():
            pass  # the first "a" goes on
        assert (await h.http.post(f"/ai-sdk/chat/{chat}/stop", json={})).status_code == 202
        await frames_of(ws, "a", ("end",))
        await ws.send_message(json.dumps({"type": "abort", "requestId": "a"}))  # finished
        # A send and its abort in one breath: the turn is cancelled, nothing streams.
        other = chat_id()
        await ws.send_message(send(other, user(LONG_NAP), rid="b"))
        await ws.send_message(json.dumps({"type": "abort", "requestId": "b"}))
        cancelled = False
        for _ in range(200):  # (no frame tells when "b" is over: its events do)
            session = h.node.sessions.get(other)
            tail = session.tail if session is not None else []
            cancelled = any(e.type == "turn.cancelled" for e in tail)
            if cancelled:
                break
            await trio.sleep(0.05)
        assert cancelled and (await live(h, other))[0] is None
        await ws.send_message(resume(other, "after"))
        frames = await frames_of(ws, "after", ("no-active", "end", "error"))
        assert frames == [{"type": "no-active", "requestId": "after"}]
        for chat_ in (chat, other):
            assert subscribers(h, chat_) == 0
        # The socket still serves, and a finished id may be used again.
        await ws.send_message(send(chat, user(TEXT), rid="a"))
        frames = await frames_of(ws, "a", ("end", "error"))
        assert frames[-1]["type"] == "end"


async def test_another_keys_chat_and_approvals_over_both_doors(tmp_path: Path) -> None:
    async with gateway(tmp_path, **KEYS, **APPROVAL) as h:
        theirs, mine = chat_id(), chat_id()
        body = request(theirs, user(TOOL_SCRIPT))
        async with h.http.stream("POST", "/ai-sdk/chat", json=body, headers=A) as r:
            waiting = await read(r)
        their_turn = waiting.metadata["gateway"]["turnId"]
        [tool] = [p for p in waiting.parts if p["type"] == "dynamic-tool"]
        perm_id = tool["approval"]["id"]
        async with closing_ws(h, "?key=key-b") as ws:
            await ws.send_message(resume(theirs, "peek"))
            [error] = await frames_of(ws, "peek", ("error", "start", "no-active"))
            assert error["errorText"].startswith("session_not_found: ")
            # Key b answers a's approval: on a's chat (404), on its own chat (ignored).
            forged = _approved(waiting)
            frame = {"type": "send", "requestId": "x", "id": theirs, "messages": [forged]}
            await ws.send_message(json.dumps(frame))
            [error] = await frames_of(ws, "x", ("error", "start"))
            assert error["errorText"].startswith("session_not_found: ")
        body = request(mine, user(TOOL_SCRIPT))
        async with h.http.stream("POST", "/ai-sdk/chat", json=body, headers=B) as r:
            my_wait = await read(r)
        forged = _approved(my_wait)
        [my_tool] = [p for p in forged["parts"] if p["type"] == "dynamic-tool"]
        my_tool["approval"]["id"] = perm_id  # a's perm id, on b's own chat
        body = request(mine, user(TOOL_SCRIPT), forged)
        async with h.http.stream("POST", "/ai-sdk/chat", json=body, headers=B) as r:
            with trio.move_on_after(1):  # (b's own approval still waits: nothing to stream)
                await r.aread()
        assert await live(h, theirs) == (their_turn, [perm_id])
        r = await h.http.post(f"/ai-sdk/chat/{theirs}/stop", json={}, headers=B)
        assert r.status_code == 404
        assert (await h.http.get(f"/ai-sdk/chat/{theirs}/stream", headers=B)).status_code == 404


async def test_malformed_bodies_are_4xx_never_5xx(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with gateway(tmp_path) as h:
        chat = chat_id()
        deep = "[" * 5000 + "]" * 5000

        def body(*parts: Any, role: str = "user", mid: Any = "u", **more: Any) -> bytes:
            message = {"id": mid, "role": role, "parts": list(parts), **more}
            return json.dumps({"id": chat, "messages": [message]}).encode()

        text = {"type": "text", "text": "hi"}
        cases: list[tuple[bytes, int]] = [
            (body(text)[:-3] + b', "metadata": ' + deep.encode() + b"}]}", 400),
            (json.dumps({"id": 5, "messages": [user(TEXT)]}).encode(), 422),
            (json.dumps({"id": chat, "messages": {"0": user(TEXT)}}).encode(), 422),
            (body("hi"), 422),
            (body(text, mid=7), 422),
            (body({"type": "text", "text": 5}), 422),
            (body({"type": "text"}), 422),
            (body(), 422),
            (body(1, role="assistant"), 422),
            (json.dumps({"id": chat, "messages": [user(TEXT)], "trigger": 3}).encode(), 422),
            (json.dumps(["not", "an", "object"]).encode(), 422),
            (b"\xff\xfe", 400),
            (json.dumps({"id": "x" * 129, "messages": [user(TEXT)]}).encode(), 422),
        ]
        for sent, status in cases:
            r = await h.http.post(
                "/ai-sdk/chat", content=sent, headers={"Content-Type": "application/json"}
            )
            assert r.status_code == status, (sent[:80], r.text)
        r = await h.http.post("/ai-sdk/chat", content=b"{}", headers={"Content-Type": "text/plain"})
        assert r.status_code == 415
        # A long history (only its last message is read) and a deep assistant metadata.
        history = [user(TEXT) for _ in range(3000)]
        async with h.http.stream("POST", "/ai-sdk/chat", json=request(chat, *history)) as r:
            assert r.status_code == 200
            await read(r)
        odd = {"id": "a", "role": "assistant", "parts": [], "metadata": {"gateway": [[[1]]]}}
        r = await h.http.post("/ai-sdk/chat", json=request(chat, odd))
        assert (r.status_code, r.json()["error"]["code"]) == (409, "turn_not_in_flight")
        for path in (f"/ai-sdk/chat/{'x' * 300}/stream", "/ai-sdk/chat/%00/stream"):
            assert (await h.http.get(path)).status_code in (404, 422)
        assert await server_errors(h) == []
        assert failures(caplog) == []


async def test_nothing_is_left_behind_after_many_requests_on_both_doors(tmp_path: Path) -> None:
    async with gateway(tmp_path) as h:
        chat = chat_id()
        for _ in range(10):
            async with h.http.stream("POST", "/ai-sdk/chat", json=request(chat, user(TEXT))) as r:
                await read(r)
            assert (await h.http.get(f"/ai-sdk/chat/{chat}/stream")).status_code == 204
        async with open_websocket_url(ws_url(h)) as ws:
            for i in range(10):
                await ws.send_message(send(chat, user(TEXT), rid=f"s{i}"))
                await frames_of(ws, f"s{i}", ("end",))
                await ws.send_message(resume(chat, f"q{i}"))
                await frames_of(ws, f"q{i}", ("no-active",))
            # Dropped mid-turn: the response leaves the hub, the turn goes on.
            await ws.send_message(send(chat, user(LONG_NAP), rid="nap"))
            while "tool-input-available" not in await ws.get_message():
                pass
        with trio.fail_after(5):
            while any(h.node.metrics.streams_by_door().values()) or subscribers(h, chat):
                await h.node.changed()
        assert h.node.limits.streams_by_key == {}
        assert (await live(h, chat))[0] is not None  # the dropped socket cancelled nothing
        assert (await h.http.post(f"/ai-sdk/chat/{chat}/stop", json={})).status_code == 202


async def test_a_superseded_resume_does_not_cancel_the_turn(tmp_path: Path) -> None:
    async with gateway(tmp_path) as h:
        chat = chat_id()
        m = UiMessage()
        async with (
            h.http.stream("POST", "/ai-sdk/chat", json=request(chat, user(LONG_NAP))) as r,
            aclosing(cast(AsyncGenerator[str, None], r.aiter_lines())) as lines,
        ):
            await read_until(lines, m, lambda: running(m))
            async with open_websocket_url(ws_url(h)) as ws:
                await ws.send_message(resume(chat, "first"))
                await frames_of(ws, "first", ("start",))
                # useChat's second resumeStream(): the first is aborted, the second sent.
                await ws.send_message(json.dumps({"type": "abort", "requestId": "first"}))
                await ws.send_message(resume(chat, "second"))
                await frames_of(ws, "second", ("start", "no-active"))
                await trio.sleep(0.3)
            assert (await live(h, chat))[0] == m.metadata["gateway"]["turnId"]
            assert (await h.http.post(f"/ai-sdk/chat/{chat}/stop", json={})).status_code == 202
            await read_until(lines, m, lambda: False)  # the stop ends the first answer

"""The HTTP API of docs/protocol.md §2, end to end over real sockets.

Behaviours 2 and 3 of the core issue: every route answers with its documented
status and body, every error is exactly ``{"error": {"code", "message"}}``,
API keys guard every route but ``/healthz``, and the stream handshake is
refused with an HTTP status before any upgrade (403 for a missing, used,
other-session or expired attach token or a refused Origin, 404 for an unknown
session).

Test rules: a real gateway on 127.0.0.1 port 0 with independent clients (httpx,
trio-websocket), on the real clock under ``fail_after``; whatever a test waits
for, it waits for the event that says it happened. The attach-token TTL is
time, so it is tested on :class:`gateway.node.AttachTokens` under
``autojump_clock``.
"""

from __future__ import annotations

import json
import re
import time
import urllib.parse
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
import trio.testing
from trio_websocket import ConnectionRejected, open_websocket_url, wrap_client_stream

from gateway.errors import Refused
from gateway.http.refusals import STATUS
from gateway.node import AttachTokens
from gateway.protocol.frames import SubscribeAck
from tests.conftest import JSON_TYPE, Client, Harness, make_config, running_gateway, types

SLOW_SCRIPT = {"script": {"delay_ms": 10, "rounds": [[{"lorem": 40}]]}}
"""About 0.4 s of streaming: long enough to still be running after its first delta."""


# --- helpers ---


def assert_error(r: httpx.Response, status: int, code: str) -> dict[str, str]:
    """``r`` is an error answer of exactly the shape of docs/protocol.md §2."""
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/json"
    body = r.json()
    assert list(body) == ["error"]
    assert sorted(body["error"]) == ["code", "message"]
    assert body["error"]["code"] == code, body
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    return dict(body["error"])


@asynccontextmanager
async def gateway_with(tmp_path: Path, **overrides: Any) -> AsyncIterator[Harness]:
    """A gateway with config ``overrides`` (dotted keys), capped like the ``gw`` fixture."""
    with trio.fail_after(30):
        async with running_gateway(make_config(tmp_path, **overrides)) as harness:
            yield harness


async def rejected(url: str, **kw: Any) -> tuple[int, str]:
    """Open a WebSocket that the server must refuse; its HTTP status and error code.

    trio-websocket's own ``open_websocket_url`` leaves the socket of a rejected
    handshake unclosed (a ResourceWarning at some later garbage collection,
    an error under ``filterwarnings = error``), so the client here brings its
    own stream, closes it itself, and still gets trio-websocket's
    ``ConnectionRejected``.
    """
    parts = urllib.parse.urlsplit(url)
    assert parts.scheme == "ws" and parts.hostname and parts.port
    resource = f"{parts.path}?{parts.query}" if parts.query else parts.path
    with trio.fail_after(10):
        stream = await trio.open_tcp_stream(parts.hostname, parts.port)
        try:
            with pytest.RaisesGroup(ConnectionRejected) as info:
                async with trio.open_nursery() as nursery:
                    await wrap_client_stream(nursery, stream, parts.netloc, resource, **kw)
        finally:
            await stream.aclose()
    refusal = info.value.exceptions[0]
    assert isinstance(refusal, ConnectionRejected)
    body = json.loads(refusal.body or b"{}")
    return refusal.status_code, body["error"]["code"]


async def accepted(url: str, session_id: str, **kw: Any) -> None:
    """Open a WebSocket that the server must accept, and subscribe over it."""
    with trio.fail_after(10):
        async with open_websocket_url(url, **kw) as ws:
            ack = await Client(ws, session_id).subscribe()
            assert isinstance(ack, SubscribeAck)


async def run_turn(gw: Harness, client: Client, content: Any) -> str:
    """Submit a turn and wait until ``client`` sees it end; its turn id."""
    turn_id = await gw.submit(client.reducer.session_id, content)
    with trio.fail_after(10):
        events = await client.until_turn_ends()
    assert events[-1].type == "turn.completed" and events[-1].turn_id == turn_id
    return turn_id


# --- POST /sessions ---


async def test_create_session_answers_201_with_id_model_and_time(gw: Harness) -> None:
    before = time.time_ns() // 1_000_000
    r = await gw.http.post("/sessions", json={})
    after = time.time_ns() // 1_000_000
    assert r.status_code == 201, r.text
    body = r.json()
    assert sorted(body) == ["active_model", "agent", "created_at", "session_id"]
    assert re.fullmatch(r"sess_[0-9a-f]+", body["session_id"])
    assert body["active_model"] == "scripted:echo"
    assert before <= body["created_at"] <= after


async def test_create_session_with_an_empty_body(gw: Harness) -> None:
    for empty in (b"", b"  \r\n"):
        r = await gw.http.post("/sessions", content=empty, headers=JSON_TYPE)
        assert r.status_code == 201, r.text
        assert r.json()["active_model"] == "scripted:echo"


async def test_create_session_with_every_field(gw: Harness, tmp_path: Path) -> None:
    body = {"workspace_path": "proj/api", "model": "scripted:other", "metadata": {"k": [1]}}
    r = await gw.http.post("/sessions", json=body)
    assert r.status_code == 201, r.text
    sid = r.json()["session_id"]
    assert r.json()["active_model"] == "scripted:other"
    listing = (await gw.http.get("/sessions")).json()["sessions"]
    assert [(s["session"]["id"], s["metadata"]) for s in listing] == [(sid, {"k": [1]})]
    assert listing[0]["session"]["workspace_path"] == "proj/api"  # its name, not the host's path
    assert (tmp_path / "workspaces" / "local" / "proj" / "api").is_dir()
    assert listing[0]["created_at"] == r.json()["created_at"]


async def test_create_session_refusals(gw: Harness, tmp_path: Path) -> None:
    a_file = tmp_path / "file.txt"
    a_file.write_text("not a directory")
    for path in (a_file, tmp_path / "missing"):
        r = await gw.http.post("/sessions", json={"workspace_path": str(path)})
        assert_error(r, 422, "invalid_workspace")
    for model in ("anthropic:x", "scripted:", "echo"):
        assert_error(await gw.http.post("/sessions", json={"model": model}), 422, "invalid_model")
    for body in (
        {"workspace": "/tmp"},  # an unknown field
        {"model": 5},
        {"metadata": "x"},
        [],
        "x",
    ):
        assert_error(await gw.http.post("/sessions", json=body), 422, "invalid_body")
    for raw in (b'{"model": ', b"nope", b"{}}"):
        assert_error(
            await gw.http.post("/sessions", content=raw, headers=JSON_TYPE), 400, "invalid_json"
        )
    # nothing of the above made a session
    assert (await gw.http.get("/sessions")).json() == {"sessions": [], "has_more": False}


# --- GET /sessions ---


async def test_list_sessions_pages_newest_first(gw: Harness) -> None:
    created = [await gw.create_session() for _ in range(5)]
    newest_first = created[::-1]

    pages: list[list[str]] = []
    flags: list[bool] = []
    before: str | None = None
    while True:
        params: dict[str, Any] = {"limit": 2}
        if before is not None:
            params["before"] = before
        r = await gw.http.get("/sessions", params=params)
        assert r.status_code == 200, r.text
        body = r.json()
        assert sorted(body) == ["has_more", "sessions"]
        pages.append([s["session"]["id"] for s in body["sessions"]])
        flags.append(body["has_more"])
        if not body["has_more"]:
            break
        before = pages[-1][-1]
    assert pages == [newest_first[0:2], newest_first[2:4], newest_first[4:5]]
    assert flags == [True, True, False]

    whole = (await gw.http.get("/sessions", params={"limit": 5})).json()
    assert [s["session"]["id"] for s in whole["sessions"]] == newest_first
    assert whole["has_more"] is False
    entry = whole["sessions"][0]
    assert sorted(entry) == ["created_at", "metadata", "session"]
    assert entry["session"]["turn_count"] == 0
    assert entry["session"]["current_turn_id"] is None


async def test_list_sessions_limit_is_1_to_200(gw: Harness) -> None:
    for limit, status in [("0", 422), ("201", 422), ("-1", 422), ("abc", 400), ("", 400)]:
        r = await gw.http.get("/sessions", params={"limit": limit})
        assert_error(r, status, "invalid_query")
    # Decimal digits in ASCII, nothing else Python's int() would take (docs/protocol.md §2).
    for limit in ["4_0", "+40", " 40", "40 ", "\u0664\u0660", "0x10", "9" * 400]:
        r = await gw.http.get("/sessions", params={"limit": limit})
        assert_error(r, 400, "invalid_query")
        assert len(r.json()["error"]["message"]) < 120
    for limit in ("1", "200"):
        r = await gw.http.get("/sessions", params={"limit": limit})
        assert r.status_code == 200, r.text


# --- GET /sessions/{id} ---


async def test_get_session_gives_a_fresh_attach_token_and_ws_url(gw: Harness) -> None:
    sid = await gw.create_session()
    r = await gw.http.get(f"/sessions/{sid}")
    assert r.status_code == 200, r.text
    body = r.json()
    assert sorted(body) == [
        "active_model",
        "agent",
        "attach_token",
        "protocol_version",
        "session_id",
        "ws_url",
    ]
    assert body["protocol_version"] == 1
    assert body["session_id"] == sid
    assert body["active_model"] == "scripted:echo"
    host = gw.base.removeprefix("http://")
    assert body["ws_url"] == f"ws://{host}/sessions/{sid}/stream?attach={body['attach_token']}"
    again = (await gw.http.get(f"/sessions/{sid}")).json()
    assert again["attach_token"] != body["attach_token"]
    assert gw.node.tokens.ttl_s == gw.node.config.stream.attach_token_ttl_s == 60


async def test_ws_url_uses_the_request_host(tmp_path: Path) -> None:
    async with gateway_with(
        tmp_path, **{"server.allowed_hosts": ["127.0.0.1", "gw.internal"]}
    ) as gw:
        sid = await gw.create_session()
        r = await gw.http.get(f"/sessions/{sid}", headers={"Host": "gw.internal:9999"})
    body = r.json()
    assert body["ws_url"] == (
        f"ws://gw.internal:9999/sessions/{sid}/stream?attach={body['attach_token']}"
    )


@pytest.mark.parametrize(
    ("public_url", "base"),
    [
        ("https://gw.example.com/", "wss://gw.example.com"),
        ("http://gw.example.com:8080", "ws://gw.example.com:8080"),
    ],
)
async def test_ws_url_uses_the_public_url(tmp_path: Path, public_url: str, base: str) -> None:
    hosts = ["127.0.0.1", "ignored"]  # the request's Host must be answered to be ignored
    async with gateway_with(
        tmp_path, **{"server.public_url": public_url, "server.allowed_hosts": hosts}
    ) as gw:
        sid = await gw.create_session()
        body = (await gw.http.get(f"/sessions/{sid}", headers={"Host": "ignored:1"})).json()
    assert body["ws_url"] == f"{base}/sessions/{sid}/stream?attach={body['attach_token']}"


async def test_get_unknown_session_is_404(gw: Harness) -> None:
    assert_error(await gw.http.get("/sessions/sess_nope"), 404, "session_not_found")


# --- GET /sessions/{id}/messages ---


async def test_messages_oldest_first_and_paged_backwards(gw: Harness) -> None:
    sid = await gw.create_session()
    async with gw.client(sid) as client:
        await client.subscribe()
        turns = [await run_turn(gw, client, text) for text in ("hi", "there")]

    r = await gw.http.get(f"/sessions/{sid}/messages")
    assert r.status_code == 200, r.text
    body = r.json()
    assert sorted(body) == ["has_more", "messages"]
    assert body["has_more"] is False
    messages = body["messages"]
    assert [(m["role"], m["turn_id"], m["status"]) for m in messages] == [
        ("user", turns[0], "complete"),
        ("assistant", turns[0], "complete"),
        ("user", turns[1], "complete"),
        ("assistant", turns[1], "complete"),
    ]
    assert [m["content"] for m in messages] == [
        [{"type": "text", "text": "hi"}],
        [{"type": "text", "text": "You said: hi"}],
        [{"type": "text", "text": "there"}],
        [{"type": "text", "text": "You said: there"}],
    ]
    assert all(m["session_id"] == sid for m in messages)
    assert [m["model"] for m in messages if m["role"] == "assistant"] == ["scripted:echo"] * 2
    ids = [m["id"] for m in messages]
    assert len(set(ids)) == 4

    # limit=1 with before walks back one message at a time
    walked: list[str] = []
    flags: list[bool] = []
    params: dict[str, Any] = {"limit": 1}
    while True:
        page = (await gw.http.get(f"/sessions/{sid}/messages", params=params)).json()
        walked += [m["id"] for m in page["messages"]]
        flags.append(page["has_more"])
        if not page["has_more"]:
            break
        params = {"limit": 1, "before": page["messages"][0]["id"]}
    assert walked == ids[::-1]
    assert flags == [True, True, True, False]

    # a page of two is oldest first within the page
    page = (await gw.http.get(f"/sessions/{sid}/messages", params={"limit": 2})).json()
    assert [m["id"] for m in page["messages"]] == ids[2:]
    assert page["has_more"] is True
    params = {"limit": 2, "before": ids[2]}
    page = (await gw.http.get(f"/sessions/{sid}/messages", params=params)).json()
    assert [m["id"] for m in page["messages"]] == ids[:2]
    assert page["has_more"] is False


async def test_messages_refusals_and_an_empty_page(gw: Harness) -> None:
    sid = await gw.create_session()
    r = await gw.http.get(f"/sessions/{sid}/messages")
    assert r.json() == {"messages": [], "has_more": False}
    r = await gw.http.get(f"/sessions/{sid}/messages", params={"limit": "200"})
    assert r.json() == {"messages": [], "has_more": False}
    for params, status, code in [
        ({"limit": "201"}, 422, "invalid_query"),
        ({"limit": "0"}, 422, "invalid_query"),
        ({"limit": "x"}, 400, "invalid_query"),
        ({"before": "msg_nope"}, 404, "message_not_found"),
    ]:
        r = await gw.http.get(f"/sessions/{sid}/messages", params=params)
        assert_error(r, status, code)
    assert_error(await gw.http.get("/sessions/sess_nope/messages"), 404, "session_not_found")


# --- POST /sessions/{id}/turns ---


async def test_submit_is_202_then_409_while_the_turn_runs_then_202_again(gw: Harness) -> None:
    sid = await gw.create_session()
    async with gw.client(sid) as client:
        await client.subscribe()
        r = await gw.http.post(f"/sessions/{sid}/turns", json={"content": json.dumps(SLOW_SCRIPT)})
        assert r.status_code == 202, r.text
        assert list(r.json()) == ["turn_id"]
        turn_id = r.json()["turn_id"]
        assert re.fullmatch(r"turn_[0-9a-f]+", turn_id)
        with trio.fail_after(10):
            await client.until(lambda e: e.type == "text.delta")

        # the turn is streaming: a second submission is refused
        busy = await gw.http.post(f"/sessions/{sid}/turns", json={"content": "again"})
        assert_error(busy, 409, "turn_in_progress")

        with trio.fail_after(10):
            events = await client.until_turn_ends()
        assert events[-1].type == "turn.completed" and events[-1].turn_id == turn_id
        # the refused submission started nothing
        assert {e.turn_id for e in client.events} == {turn_id}

        nxt = await gw.http.post(f"/sessions/{sid}/turns", json={"content": "again"})
        assert nxt.status_code == 202, nxt.text
        with trio.fail_after(10):
            events = await client.until_turn_ends()
        assert events[-1].turn_id == nxt.json()["turn_id"] != turn_id
        assert events[0].type == "turn.started"


async def test_content_as_text_blocks_is_accepted(gw: Harness) -> None:
    sid = await gw.create_session()
    blocks = [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}]
    async with gw.client(sid) as client:
        await client.subscribe()
        r = await gw.http.post(f"/sessions/{sid}/turns", json={"content": blocks})
        assert r.status_code == 202, r.text
        with trio.fail_after(10):
            events = await client.until_turn_ends()
    assert events[0].type == "turn.started"
    assert events[-1].type == "turn.completed"
    assert events[-1].turn_id == r.json()["turn_id"]
    messages = (await gw.http.get(f"/sessions/{sid}/messages")).json()["messages"]
    assert messages[0]["role"] == "user"
    assert messages[0]["content"] == blocks


async def test_turn_refusals(gw: Harness) -> None:
    sid = await gw.create_session()
    for content in (
        "",
        [],
        [{"type": "text", "text": ""}],
        [{"type": "tool_result", "tool_use_id": "tu_1", "content": "x", "is_error": False}],
        [{"type": "text", "text": "ok"}, {"type": "thinking", "thinking": "t", "signature": "s"}],
        [{"type": "image", "source": "x"}],
        42,
    ):
        r = await gw.http.post(f"/sessions/{sid}/turns", json={"content": content})
        assert_error(r, 422, "invalid_body")
    for raw, status, code in [
        (b"", 400, "invalid_json"),
        (b"{not json", 400, "invalid_json"),
        (b"{}", 422, "invalid_body"),
        (b'{"content": "x", "extra": 1}', 422, "invalid_body"),
    ]:
        r = await gw.http.post(f"/sessions/{sid}/turns", content=raw, headers=JSON_TYPE)
        assert_error(r, status, code)
    r = await gw.http.post("/sessions/sess_nope/turns", json={"content": "hi"})
    assert_error(r, 404, "session_not_found")
    # none of the above started a turn: the next valid submission is accepted
    assert (await gw.http.get(f"/sessions/{sid}/messages")).json()["messages"] == []
    r = await gw.http.post(f"/sessions/{sid}/turns", json={"content": "fine"})
    assert r.status_code == 202, r.text


async def test_body_over_max_body_bytes_is_413(tmp_path: Path) -> None:
    # A turn may carry one inline file more (docs/protocol.md §2 "Files"): none here.
    limits = {"server.max_body_bytes": 1024, "files.max_bytes": 1}
    async with gateway_with(tmp_path, **limits) as gw:
        sid = await gw.create_session()
        fits = json.dumps({"content": "x" * 1000}).encode()
        assert len(fits) <= 1024
        r = await gw.http.post(f"/sessions/{sid}/turns", content=fits, headers=JSON_TYPE)
        assert r.status_code == 202, r.text
        big = json.dumps({"content": "x" * 1024}).encode()
        r = await gw.http.post(f"/sessions/{sid}/turns", content=big, headers=JSON_TYPE)
        assert_error(r, 413, "body_too_large")


# --- POST /sessions/{id}/feedback ---


async def test_feedback_is_202_and_reaches_subscribers(gw: Harness) -> None:
    sid = await gw.create_session()
    async with gw.client(sid) as client, gw.client(sid) as other:
        await client.subscribe()
        await other.subscribe("preset:chat")
        turn_id = await run_turn(gw, client, "rate me")
        messages = (await gw.http.get(f"/sessions/{sid}/messages")).json()["messages"]
        reply = messages[-1]
        assert reply["role"] == "assistant"

        body = {"message_id": reply["id"], "rating": 1, "comment": "nice"}
        r = await gw.http.post(f"/sessions/{sid}/feedback", json=body)
        assert r.status_code == 202, r.text
        with trio.fail_after(10):
            got = await client.until(lambda e: e.type == "feedback.recorded")
            seen = await other.until(lambda e: e.type == "feedback.recorded")
        assert types(got) == ["feedback.recorded"]
        event = got[0]
        assert seen[-1].id == event.id
        assert event.session_id == sid
        assert event.turn_id == turn_id
        assert event.actor == "user"
        assert (event.payload.message_id, event.payload.rating, event.payload.comment) == (
            reply["id"],
            1,
            "nice",
        )

        # without a comment, and on the user's own message
        r = await gw.http.post(
            f"/sessions/{sid}/feedback", json={"message_id": messages[0]["id"], "rating": -1}
        )
        assert r.status_code == 202, r.text
        with trio.fail_after(10):
            got = await client.until(lambda e: e.type == "feedback.recorded")
        p = got[-1].payload
        assert (p.message_id, p.rating, p.comment) == (messages[0]["id"], -1, None)


async def test_feedback_refusals(gw: Harness) -> None:
    sid = await gw.create_session()
    for body, status, code in [
        ({"message_id": "msg_nope", "rating": 1}, 404, "message_not_found"),
        ({"message_id": "msg_nope", "rating": 0}, 422, "invalid_body"),
        ({"message_id": "msg_nope", "rating": 2}, 422, "invalid_body"),
        ({"message_id": "msg_nope", "rating": "1"}, 422, "invalid_body"),
        ({"rating": 1}, 422, "invalid_body"),
        ({"message_id": "msg_nope", "rating": 1, "stars": 5}, 422, "invalid_body"),
    ]:
        r = await gw.http.post(f"/sessions/{sid}/feedback", json=body)
        assert_error(r, status, code)
    assert_error(
        await gw.http.post(f"/sessions/{sid}/feedback", content=b"{", headers=JSON_TYPE),
        400,
        "invalid_json",
    )
    r = await gw.http.post("/sessions/sess_nope/feedback", json={"message_id": "m", "rating": 1})
    assert_error(r, 404, "session_not_found")


# --- routing, health, metrics ---


async def test_unknown_route_is_404_and_wrong_method_is_405(gw: Harness) -> None:
    sid = await gw.create_session()
    paths = ("/nope", "/ui/nope.js", f"/sessions/{sid}/nope", "/sessions/a/b/c/d", "/healthz/x")
    for path in paths:
        assert_error(await gw.http.get(path), 404, "not_found")
    for method, path in [
        ("GET", f"/sessions/{sid}/turns"),
        ("DELETE", "/sessions"),
        ("POST", "/healthz"),
        ("PUT", f"/sessions/{sid}"),
        ("GET", f"/sessions/{sid}/feedback"),
    ]:
        assert_error(await gw.http.request(method, path), 405, "method_not_allowed")


async def test_405_names_the_allowed_methods(gw: Harness) -> None:
    sid = await gw.create_session()
    r = await gw.http.get(f"/sessions/{sid}/turns")
    assert r.status_code == 405
    assert r.headers.get("allow") == "POST"


async def test_405_names_head_wherever_get_is_allowed(gw: Harness) -> None:
    sid = await gw.create_session()
    assert (await gw.http.delete("/sessions")).headers.get("allow") == "GET, POST, HEAD"
    assert (await gw.http.post("/healthz")).headers.get("allow") == "GET, HEAD"
    assert (await gw.http.put(f"/sessions/{sid}")).headers.get("allow") == "GET, DELETE, HEAD"


async def test_head_is_answered_like_get_without_the_body(gw: Harness) -> None:
    """RFC 9110 section 9.3.2; the old transport dropped the connection instead."""
    sid = await gw.create_session()
    for path in (
        "/healthz",
        "/sessions",
        f"/sessions/{sid}",
        f"/sessions/{sid}/messages",
        "/sessions/sess_nope",
        "/nowhere",
    ):
        get = await gw.http.get(path)
        head = await gw.http.head(path)
        assert (head.status_code, head.content) == (get.status_code, b""), path
        assert head.headers["content-type"] == get.headers["content-type"]
        if path != f"/sessions/{sid}":  # (it hands out a fresh attach token each time)
            assert head.headers["content-length"] == str(len(get.content)), path
    # every request above went over one keep-alive connection: none was dropped
    assert (await gw.http.get("/healthz")).json() == {"status": "ok"}


async def test_head_where_get_is_not_allowed_is_405(gw: Harness) -> None:
    sid = await gw.create_session()
    for path in (f"/sessions/{sid}/turns", f"/sessions/{sid}/feedback"):
        r = await gw.http.head(path)
        assert (r.status_code, r.content, r.headers.get("allow")) == (405, b"", "POST")


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize("depth", [2_000, 100_000])
async def test_deeply_nested_json_is_400_invalid_json(gw: Harness, depth: int) -> None:
    """docs/protocol.md §2: no input, however deep, gets a 500 (a RecursionError included).

    ``metadata`` is any JSON object, so only its depth can refuse it; elsewhere a
    typed field refuses the nesting where it starts, as any wrong shape (422).
    """
    sid = await gw.create_session()
    for body in (
        '{"metadata": {"a": ' + nested(depth) + "}}",
        '{"metadata": {"a": ' + '{"b": ' * depth + "1" + "}" * depth + "}}",
    ):
        error = assert_error(
            await gw.http.post("/sessions", content=body, headers=JSON_TYPE), 400, "invalid_json"
        )
        assert error["message"] == "the body is nested too deeply to decode"
    for path, body in [
        ("/sessions", nested(depth)),
        (f"/sessions/{sid}/turns", '{"content": ' + nested(depth) + "}"),
        (f"/sessions/{sid}/feedback", '{"message_id": "m", "x": ' + nested(depth) + "}"),
        (f"/sessions/{sid}/permissions/perm_x", '{"decision": ' + nested(depth) + "}"),
    ]:
        assert_error(await gw.http.post(path, content=body, headers=JSON_TYPE), 422, "invalid_body")
    assert (await gw.http.get("/healthz")).status_code == 200


async def test_healthz(gw: Harness) -> None:
    r = await gw.http.get("/healthz")
    assert r.status_code == 200
    assert r.json() == {"status": "ok"}


async def test_metrics_count_emitted_events(gw: Harness) -> None:
    sid = await gw.create_session()
    async with gw.client(sid) as client:
        await client.subscribe()
        await run_turn(gw, client, "count me")
    r = await gw.http.get("/metrics")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain")
    text = r.text
    assert "# TYPE gateway_events_emitted_total counter" in text
    assert 'gateway_events_emitted_total{type="turn.started"} 1.0' in text
    assert 'gateway_events_emitted_total{type="turn.completed"} 1.0' in text
    assert 'gateway_events_emitted_total{type="text.delta"} 4.0' in text  # "You said: count me"


# --- auth ---


async def test_api_keys_guard_every_route_but_healthz(tmp_path: Path) -> None:
    async with gateway_with(tmp_path, **{"auth.api_keys": ["k1"]}) as gw:
        assert_error(await gw.http.post("/sessions", json={}), 401, "unauthorized")
        for header in ("Basic k1", "Bearer", "k1"):
            r = await gw.http.post("/sessions", json={}, headers={"Authorization": header})
            assert_error(r, 401, "unauthorized")
        r = await gw.http.post("/sessions", json={}, headers={"Authorization": "Bearer k2"})
        assert_error(r, 403, "forbidden")

        good = {"Authorization": "Bearer k1"}
        r = await gw.http.post("/sessions", json={}, headers=good)
        assert r.status_code == 201, r.text
        sid = r.json()["session_id"]

        for method, path in [
            ("GET", "/sessions"),
            ("GET", f"/sessions/{sid}"),
            ("GET", f"/sessions/{sid}/messages"),
            ("POST", f"/sessions/{sid}/turns"),
            ("POST", f"/sessions/{sid}/feedback"),
            ("GET", "/metrics"),
        ]:
            r = await gw.http.request(method, path, headers=JSON_TYPE if method == "POST" else {})
            assert_error(r, 401, "unauthorized")
        assert (await gw.http.get("/sessions", headers=good)).status_code == 200
        assert (await gw.http.get("/metrics", headers=good)).status_code == 200

        health = await gw.http.get("/healthz")
        assert health.status_code == 200 and health.json() == {"status": "ok"}

        # the stream's credential is the attach token, fetched with the key
        url = (await gw.http.get(f"/sessions/{sid}", headers=good)).json()["ws_url"]
        await accepted(url, sid)


# --- attach tokens and the stream handshake ---


async def test_attach_token_is_single_use(gw: Harness) -> None:
    sid = await gw.create_session()
    url = await gw.ws_url(sid)
    await accepted(url, sid)
    assert await rejected(url) == (403, "attach_token_invalid")
    await accepted(await gw.ws_url(sid), sid)  # a fresh token works


async def test_attach_token_of_another_session_is_403(gw: Harness) -> None:
    a, b = await gw.create_session(), await gw.create_session()
    token_a = (await gw.http.get(f"/sessions/{a}")).json()["attach_token"]
    url_b = (await gw.ws_url(b)).split("?")[0]
    assert await rejected(f"{url_b}?attach={token_a}") == (403, "attach_token_invalid")


async def test_missing_or_unknown_attach_token_is_403(gw: Harness) -> None:
    sid = await gw.create_session()
    bare = (await gw.ws_url(sid)).split("?")[0]
    assert await rejected(bare) == (403, "attach_token_required")
    assert await rejected(f"{bare}?attach=") == (403, "attach_token_required")
    assert await rejected(f"{bare}?attach=nope") == (403, "attach_token_invalid")


async def test_stream_of_unknown_session_is_404(gw: Harness) -> None:
    sid = await gw.create_session()
    token = (await gw.http.get(f"/sessions/{sid}")).json()["attach_token"]
    host = gw.base.removeprefix("http://")
    url = f"ws://{host}/sessions/sess_nope/stream?attach={token}"
    assert await rejected(url) == (404, "session_not_found")


async def test_origin_allow_list(tmp_path: Path) -> None:
    overrides = {"auth.allowed_origins": ["https://ok.example"]}
    async with gateway_with(tmp_path, **overrides) as gw:
        sid = await gw.create_session()
        evil = [(b"Origin", b"https://evil.example")]
        ok = [(b"Origin", b"https://ok.example")]
        assert await rejected(await gw.ws_url(sid), extra_headers=evil) == (
            403,
            "origin_not_allowed",
        )
        await accepted(await gw.ws_url(sid), sid, extra_headers=ok)
        # non-browser clients send no Origin: the attach token alone admits them
        await accepted(await gw.ws_url(sid), sid)


async def test_refused_origin_does_not_use_up_the_token(tmp_path: Path) -> None:
    overrides = {"auth.allowed_origins": ["https://ok.example"]}
    async with gateway_with(tmp_path, **overrides) as gw:
        sid = await gw.create_session()
        url = await gw.ws_url(sid)
        evil = [(b"Origin", b"https://evil.example")]
        assert (await rejected(url, extra_headers=evil))[0] == 403
        await accepted(url, sid, extra_headers=[(b"Origin", b"https://ok.example")])


async def test_attach_token_expires_after_its_ttl(
    autojump_clock: trio.testing.MockClock,
) -> None:
    tokens = AttachTokens(ttl_s=60)
    early = tokens.issue("sess_a")
    late = tokens.issue("sess_a")
    await trio.sleep(59.5)
    tokens.redeem(early, "sess_a")  # within the TTL: fine
    await trio.sleep(0.5)
    with pytest.raises(Refused) as info:
        tokens.redeem(late, "sess_a")  # exactly at the TTL: expired
    assert (STATUS[info.value.code], info.value.code) == (403, "attach_token_expired")

    fresh = tokens.issue("sess_a")
    await trio.sleep(3600)
    with pytest.raises(Refused) as info:
        tokens.redeem(fresh, "sess_a")
    assert (STATUS[info.value.code], info.value.code) == (403, "attach_token_expired")


async def test_attach_tokens_used_or_foreign_or_missing(
    autojump_clock: trio.testing.MockClock,
) -> None:
    tokens = AttachTokens(ttl_s=60)
    token = tokens.issue("sess_a")
    tokens.redeem(token, "sess_a")
    for tok, sid, code in [
        (token, "sess_a", "attach_token_invalid"),
        (tokens.issue("sess_a"), "sess_b", "attach_token_invalid"),
        (None, "sess_a", "attach_token_required"),
        ("", "sess_a", "attach_token_required"),
    ]:
        with pytest.raises(Refused) as info:
            tokens.redeem(tok, sid)
        assert (STATUS[info.value.code], info.value.code) == (403, code)

"""``DELETE /sessions/{id}`` (docs/protocol.md §13), as an adversary would try it.

An idle session, one with a turn in flight (its clients see ``turn.cancelled``
with ``reason: "session_deleted"``, then a 1000 ``session_deleted`` close), one
being replayed, a worker (its parent stays), twice, another key's, and a turn
and an attach racing the delete. After each: nothing in the store, the
session's own workspace gone, and 404 on every route.
"""

from __future__ import annotations

import json
import sqlite3
import urllib.parse
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from trio_websocket import (
    ConnectionClosed,
    ConnectionRejected,
    WebSocketConnection,
    wrap_client_stream,
)

from gateway.client.api import GatewayClient
from gateway.client.stream import open_websocket
from gateway.errors import ApiError, ClientError
from gateway.protocol.events import Event
from gateway.protocol.frames import EventFrame, SubscribeAck
from tests.conftest import Client, Harness, make_config, running_gateway
from tests.scripts import DELEGATE, LONG_TEXT, SLOW_TEXT


def workers_of(tmp_path: Path, sid: str) -> list[str]:
    with sqlite3.connect(tmp_path / "gateway.db") as db:
        sql = "SELECT id FROM sessions WHERE parent_session_id = ?"
        return [w for (w,) in db.execute(sql, (sid,)).fetchall()]


def rows(tmp_path: Path, sid: str) -> dict[str, int]:
    """How many rows of ``sid`` each table of the SQLite store holds."""
    with sqlite3.connect(tmp_path / "gateway.db") as db:
        return {
            "sessions": db.execute("SELECT count(*) FROM sessions WHERE id = ?", (sid,)).fetchone()[
                0
            ],
            "messages": db.execute(
                "SELECT count(*) FROM messages WHERE session_id = ?", (sid,)
            ).fetchone()[0],
            "events": db.execute(
                "SELECT count(*) FROM events WHERE session_id = ?", (sid,)
            ).fetchone()[0],
        }


NOTHING = {"sessions": 0, "messages": 0, "events": 0}


async def assert_gone(gw: Harness, sid: str) -> None:
    """Every route of the session answers 404 ``session_not_found``; no handshake either."""
    for method, path in [
        ("GET", f"/sessions/{sid}"),
        ("GET", f"/sessions/{sid}/messages"),
        ("POST", f"/sessions/{sid}/turns"),
        ("POST", f"/sessions/{sid}/compact"),
        ("DELETE", f"/sessions/{sid}"),
    ]:
        body = {"content": "hi"} if path.endswith("turns") else {} if method == "POST" else None
        r = await gw.http.request(method, path, json=body)
        assert r.status_code == 404, (method, path, r.text)
        assert r.json()["error"]["code"] == "session_not_found"
    r = await gw.http.get("/sessions")
    assert sid not in [s["session"]["id"] for s in r.json()["sessions"]]
    assert sid not in gw.node.sessions


async def read_to_close(ws: WebSocketConnection) -> tuple[list[dict[str, Any]], ConnectionClosed]:
    frames: list[dict[str, Any]] = []
    with trio.fail_after(10):
        while True:
            try:
                frames.append(json.loads(await ws.get_message()))
            except ConnectionClosed as closed:
                return frames, closed


def assert_deleted_close(closed: ConnectionClosed) -> None:
    assert closed.reason.code == 1000
    assert json.loads(closed.reason.reason or "{}") == {
        "code": "session_deleted",
        "message": "The session was deleted.",
    }


async def test_delete_an_idle_session(gw: Harness, tmp_path: Path) -> None:
    sid = await gw.create_session()
    async with gw.client(sid) as c:
        await c.subscribe()
        await gw.submit(sid, "hello")
        with trio.fail_after(10):
            await c.until_turn_ends()
    workspace = tmp_path / "workspaces"
    own = [p for p in workspace.rglob(sid)]
    assert own and all(p.is_dir() for p in own)
    assert rows(tmp_path, sid)["events"] > 0
    r = await gw.http.delete(f"/sessions/{sid}")
    assert r.status_code == 204, r.text
    assert r.content == b"" and "content-length" not in r.headers
    assert rows(tmp_path, sid) == NOTHING
    assert not any(p.exists() for p in own)
    await assert_gone(gw, sid)
    # a second DELETE is 404, and the gateway goes on
    r = await gw.http.delete(f"/sessions/{sid}")
    assert r.status_code == 404
    assert (await gw.http.get("/healthz")).status_code == 200


async def test_a_named_workspace_stays(gw: Harness, tmp_path: Path) -> None:
    sid = await gw.create_session(workspace_path="team/project")
    named = tmp_path / "workspaces"
    before = sorted(str(p) for p in named.rglob("project"))
    assert before
    assert (await gw.http.delete(f"/sessions/{sid}")).status_code == 204
    assert sorted(str(p) for p in named.rglob("project")) == before


async def test_during_a_turn_clients_see_the_cancel_then_the_close(gw: Harness) -> None:
    sid = await gw.create_session()
    async with gw.client(sid) as a:
        await a.subscribe()
        turn_id = await gw.submit(sid, SLOW_TEXT)
        with trio.fail_after(10):
            await a.until(lambda e: e.type == "text.delta")
        r = await gw.http.delete(f"/sessions/{sid}")
        assert r.status_code == 204, r.text
        frames, closed = await read_to_close(a.ws)
    assert_deleted_close(closed)
    events = [f["event"] for f in frames if f["type"] == "event"]
    assert events[-1]["type"] == "turn.cancelled", [e["type"] for e in events]
    assert events[-1]["turn_id"] == turn_id
    assert events[-1]["payload"]["reason"] == "session_deleted"
    await assert_gone(gw, sid)


async def test_during_a_replay(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    async with running_gateway(config) as gw:
        sid = await gw.create_session()
        async with gw.client(sid) as c:
            await c.subscribe()
            for _ in range(3):
                await gw.submit(sid, LONG_TEXT)
                with trio.fail_after(20):
                    await c.until_turn_ends()
            since = c.events[0].id  # a replay of nearly 1,200 events
        url = await gw.ws_url(sid)
        async with open_websocket(url) as ws:
            sub = {
                "type": "subscribe",
                "filter": "preset:full",
                "since": since,
                "snapshot": False,
            }
            await ws.send_message(json.dumps(sub))
            async with trio.open_nursery() as nursery:
                nursery.start_soon(gw.http.delete, f"/sessions/{sid}")
                frames, closed = await read_to_close(ws)
        # the replay came whole or was cut by the close; never a 1011, never a hang
        assert closed.reason.code == 1000, closed.reason
        assert frames and frames[0]["type"] == "subscribe_ack", frames[:1]
        await assert_gone(gw, sid)
        assert rows(tmp_path, sid) == NOTHING


async def test_delete_a_worker_its_parent_stays(gw: Harness, tmp_path: Path) -> None:
    sid = await gw.create_session()
    async with gw.client(sid) as c:
        await c.subscribe()
        await gw.submit(sid, DELEGATE)
        with trio.fail_after(20):
            events = await c.until(lambda e: e.type == "turn.completed" and e.session_id == sid)
    assert "delegate.completed" in [e.type for e in events]
    (worker,) = workers_of(tmp_path, sid)
    assert (await gw.http.delete(f"/sessions/{worker}")).status_code == 204
    await assert_gone(gw, worker)
    assert rows(tmp_path, worker) == NOTHING
    assert rows(tmp_path, sid)["sessions"] == 1
    assert (await gw.http.get(f"/sessions/{sid}")).status_code == 200
    assert gw.node.sessions[sid].workers == []
    await gw.submit(sid, "again")  # the parent takes turns as before


async def test_deleting_a_parent_deletes_its_workers(gw: Harness, tmp_path: Path) -> None:
    sid = await gw.create_session()
    async with gw.client(sid) as c:
        await c.subscribe()
        await gw.submit(sid, DELEGATE)
        with trio.fail_after(20):
            events = await c.until(lambda e: e.type == "turn.completed" and e.session_id == sid)
    assert "delegate.completed" in [e.type for e in events]
    (worker,) = workers_of(tmp_path, sid)
    assert (await gw.http.delete(f"/sessions/{sid}")).status_code == 204
    for gone in (sid, worker):
        await assert_gone(gw, gone)
        assert rows(tmp_path, gone) == NOTHING


async def test_another_keys_session_is_404_and_stays(tmp_path: Path) -> None:
    config = make_config(tmp_path, **{"auth.api_keys": ["key-a", "key-b"]})
    async with (
        running_gateway(config) as gw,
        httpx.AsyncClient(base_url=gw.base, headers={"Authorization": "Bearer key-a"}) as a,
        httpx.AsyncClient(base_url=gw.base, headers={"Authorization": "Bearer key-b"}) as b,
    ):
        sid = (await a.post("/sessions", json={})).json()["session_id"]
        r = await b.delete(f"/sessions/{sid}")
        assert r.status_code == 404 and r.json()["error"]["code"] == "session_not_found"
        assert (await a.get(f"/sessions/{sid}")).status_code == 200
        assert (await gw.http.delete(f"/sessions/{sid}")).status_code == 401
        assert (await a.delete(f"/sessions/{sid}")).status_code == 204
        assert (await a.get(f"/sessions/{sid}")).status_code == 404


async def race(gw: Harness, sid: str) -> dict[str, int]:
    """A turn, a DELETE and an attach of ``sid`` at once; each one's answer."""
    url = await gw.ws_url(sid)
    answers: dict[str, int] = {}

    async def turn() -> None:
        r = await gw.http.post(f"/sessions/{sid}/turns", json={"content": "hi"})
        answers["turn"] = r.status_code

    async def delete() -> None:
        answers["delete"] = (await gw.http.delete(f"/sessions/{sid}")).status_code

    async def attach() -> None:
        # Its own stream, closed here: trio-websocket leaves a refused handshake's open.
        parts = urllib.parse.urlsplit(url)
        assert parts.hostname and parts.port
        stream = await trio.open_tcp_stream(parts.hostname, parts.port)
        try:
            async with trio.open_nursery() as nursery:
                resource = f"{parts.path}?{parts.query}"
                ws = await wrap_client_stream(nursery, stream, parts.netloc, resource)
                await ws.send_message(json.dumps({"type": "subscribe", "filter": "preset:full"}))
                await read_to_close(ws)
                answers["attach"] = 101
        except* ConnectionRejected as refused:
            answers["attach"] = refused.exceptions[0].status_code  # type: ignore[attr-defined]
        finally:
            await stream.aclose()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(turn)
        nursery.start_soon(delete)
        nursery.start_soon(attach)
    return answers


async def test_a_turn_and_an_attach_racing_the_delete(gw: Harness, tmp_path: Path) -> None:
    for _ in range(5):
        sid = await gw.create_session()
        answers = await race(gw, sid)
        assert answers["delete"] == 204, answers
        assert answers["turn"] in (202, 404), answers
        assert answers["attach"] in (101, 404), answers
        await assert_gone(gw, sid)
        assert rows(tmp_path, sid) == NOTHING


async def test_the_client_library_does_not_reconnect(gw: Harness) -> None:
    sid = await gw.create_session()
    async with GatewayClient(gw.base) as client:
        seen: list[Event] = []
        deleted = False
        with pytest.raises(ClientError) as raised:
            with trio.fail_after(15):
                async with client.subscribe(sid) as stream:
                    async for item in stream:
                        frame = getattr(item, "frame", None)
                        if isinstance(frame, SubscribeAck):
                            await gw.submit(sid, SLOW_TEXT)
                        if not isinstance(frame, EventFrame):
                            continue
                        seen.append(frame.event)
                        if frame.event.type == "text.delta" and not deleted:
                            deleted = True
                            await client.delete_session(sid)
        assert raised.value.code == "session_deleted"
        assert seen[-1].type == "turn.cancelled"
        with pytest.raises(ApiError) as again:
            await client.delete_session(sid)
        assert (again.value.status, again.value.code) == (404, "session_not_found")


__all__ = ["Client"]

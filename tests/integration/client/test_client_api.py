"""The client library (``gateway.client``) against a real gateway on 127.0.0.1, port 0.

Every call of :class:`GatewayClient` and :class:`Session`, then what the
stream survives (docs/protocol.md §3): a server-side drop mid-message (1001,
1011, 1008) ends in the state of a client that saw everything live, with
every chunk of text exactly once; a real slow client (1008
``client_too_slow``) comes back with replay; a cursor the server cannot
replay falls back to a snapshot; the server's pings are answered; a server
that stops answering is noticed by the client's own missed pongs, on the
MockClock (a fake server over in-memory streams) and on a real socket through
a proxy that stops forwarding.

Real clock with ``fail_after`` caps where a real gateway runs (its store
commits in a worker thread, which the MockClock would jump over); the
reference for "the same state" is the conftest client, a plain WebSocket and
the reference reducer that stays live throughout.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
import trio
import trio.testing
import trio_websocket

from gateway.client import (
    Backoff,
    Chunk,
    GatewayClient,
    Heartbeat,
    Notice,
    Received,
    Session,
)
from gateway.client import api as client_api
from gateway.doors.rest import door as route_table
from gateway.errors import ApiError, ClientError, SubscribeRejected
from gateway.protocol.frames import Ping, Snapshot, SubscribeAck, SubscribeError
from tests.conftest import TOOL_SCRIPT, Harness, free_port, make_config, running_gateway
from tests.integration.client.test_attach_cli import SilenceableProxy
from tests.paths import ROOT

ROOT = ROOT
FAST = Backoff(base_s=0.05, cap_s=0.2)
LOREM = {"script": {"delay_ms": 2, "rounds": [[{"thinking": "Hm " * 20}, {"lorem": 300}]]}}


def stable(state: dict[str, Any]) -> dict[str, Any]:
    """A reducer state without its cursor (bus events after the turn may differ by client)."""
    return {key: value for key, value in state.items() if key != "last_event_id"}


def joined(chunks: list[Chunk]) -> dict[tuple[str, int], str]:
    """Each block's chunks, joined."""
    texts: dict[tuple[str, int], str] = {}
    for chunk in chunks:
        texts[(chunk.message_id, chunk.index)] = (
            texts.get((chunk.message_id, chunk.index), "") + chunk.text
        )
    return texts


def block_texts(session: Session) -> dict[tuple[str, int], str]:
    """Every text and thinking block of the session's assistant messages."""
    texts = {}
    for message in session.state.messages:
        if message.role != "assistant":
            continue
        for index, block in enumerate(message.content):
            text = getattr(block, "text", None) or getattr(block, "thinking", None)
            if text:
                texts[(message.id, index)] = text
    return texts


async def until_ended(session: Session, turn_id: str, chunks: list[Chunk]) -> list[Any]:
    """Iterate until the turn has ended; the items seen meanwhile, the chunks collected."""
    items = []
    async for update in session:
        items.append(update.item)
        chunks.extend(update.chunks)
        if session.turn_ended(turn_id):
            break
    return items


# --- the calls -----------------------------------------------------------------------------


def test_the_client_answers_decode_what_the_server_encodes() -> None:
    """Section 2's answers are declared once (gateway.protocol.http): the client decodes
    with the very structs the server encodes, so their schemas are the server's."""
    pairs = [
        (client_api.SessionCreated, route_table.SessionCreated),
        (client_api.SessionList, route_table.SessionList),
        (client_api.SessionAttach, route_table.SessionAttach),
        (client_api.MessagePage, route_table.MessagePage),
    ]

    def shape(schema: Any) -> Any:  # without the prose
        if isinstance(schema, dict):
            return {k: shape(v) for k, v in schema.items() if k not in ("title", "description")}
        if isinstance(schema, list):
            return [shape(v) for v in schema]
        return schema

    for ours, theirs in pairs:
        assert ours is theirs, ours
        assert shape(msgspec.json.schema(ours)) == shape(msgspec.json.schema(theirs)), ours


async def test_every_call_of_the_http_api(gw: Harness, tmp_path: Path) -> None:
    with trio.fail_after(20):
        async with GatewayClient(gw.base) as client:
            created = await client.create_session(
                workspace_path="api/test", metadata={"who": "test"}
            )
            other = await client.create_session()
            assert created.active_model == "scripted:echo"
            page = await client.list_sessions(limit=1)
            assert [s.session.id for s in page.sessions] == [other.session_id]
            assert page.has_more
            older = await client.list_sessions(before=other.session_id)
            assert older.sessions[0].session.id == created.session_id
            assert older.sessions[0].metadata == {"who": "test"}
            assert older.sessions[0].session.workspace_path == "api/test"
            attached = await client.attach(created.session_id)
            assert attached.ws_url.startswith("ws://") and attached.attach_token

            sid = created.session_id
            async with client.open_session(sid) as session:
                turn_id = await session.send("hello there")
                chunks: list[Chunk] = []
                await until_ended(session, turn_id, chunks)
                reply = session.state.messages[-1]
                assert "".join(c.text for c in chunks) == reply.content[0].text  # type: ignore[union-attr]
                await session.feedback(reply.id, 1, comment="good")
                async for update in session:
                    if update.event is not None and update.event.type == "feedback.recorded":
                        assert update.event.payload.comment == "good"
                        break
            history = await client.messages(sid)
            assert [m.role for m in history.messages] == ["user", "assistant"]
            assert not history.has_more
            assert len((await client.messages(sid, limit=1)).messages) == 1

            with pytest.raises(ApiError) as refused:
                await client.create_session(model="nope:nothing")
            assert (refused.value.status, refused.value.code) == (422, "invalid_model")
            with pytest.raises(ApiError) as unknown:
                await client.send_turn("sess_00000000000000000000", "hi")
            assert (unknown.value.status, unknown.value.code) == (404, "session_not_found")
            with pytest.raises(ApiError) as finished:
                await client.cancel_turn(sid, turn_id)
            assert (finished.value.status, finished.value.code) == (409, "turn_not_in_flight")
            with pytest.raises(ApiError) as no_perm:
                await client.answer_permission(sid, "perm_x", "allow")
            assert no_perm.value.status == 404
            with pytest.raises(ApiError) as no_message:
                await client.leave_feedback(sid, "msg_x", -1)
            assert (no_message.value.status, no_message.value.code) == (404, "message_not_found")


async def test_a_turn_with_a_tool_an_approval_and_a_cancel(tmp_path: Path) -> None:
    config = make_config(tmp_path, **{"tools.require_approval": ["sleep"]})
    with trio.fail_after(20):
        async with running_gateway(config) as gw, GatewayClient(gw.base) as client:
            sid = (await client.create_session()).session_id
            async with client.open_session(sid) as session:
                turn_id = await session.send(json.dumps(TOOL_SCRIPT))
                async for _ in session:
                    if session.pending_permissions:
                        break
                [pending] = session.pending_permissions.values()
                assert pending.tool_name == "sleep"
                # a client attaching now finds the request in its snapshot
                async with client.open_session(sid) as late:
                    assert list(late.pending_permissions) == [pending.perm_id]
                await session.answer(pending.perm_id, "allow")
                await until_ended(session, turn_id, [])
                [run] = session.tools.values()
                assert (run.tool_name, run.status, run.input) == (
                    "sleep",
                    "completed",
                    {"seconds": 0.01},
                )
                assert run.duration_ms is not None and run.duration_ms >= 10
                assert session.pending_permissions == {}
                assert session.state.turn is not None and session.state.turn.status == "completed"

                slow = {
                    "script": {
                        "rounds": [[{"tool_use": {"name": "sleep", "input": {"seconds": 60}}}]]
                    }
                }
                turn_id = await session.send(json.dumps(slow))
                async for _ in session:
                    if session.pending_permissions:
                        break
                await session.cancel(reason="enough")
                await until_ended(session, turn_id, [])
                assert session.state.turn is not None and session.state.turn.status == "cancelled"
                assert session.pending_permissions == {}
                assert not session.busy
                await session.cancel()  # nothing in flight: nothing to do


async def test_a_busy_session_queues_steers_and_cancels_a_queued_turn(tmp_path: Path) -> None:
    """docs/protocol.md §2 "A busy session": ``submit_turn`` answers the 202 body (queued and
    its position, or steered into the running turn), ``cancel_turn`` takes a queued turn out
    of the queue, and the session lists the queue as it moves (``Session.queued``)."""
    from tests.integration.session.test_busy import Gated

    provider = Gated()
    with trio.fail_after(20):
        async with (
            running_gateway(make_config(tmp_path), provider) as gw,
            GatewayClient(gw.base) as client,
        ):
            sid = (await client.create_session()).session_id
            async with client.open_session(sid) as session:
                first = await session.submit("hold A")
                assert (first.queued, first.steered, first.position) == (False, False, None)
                await provider.holding.wait()
                b = await session.submit("B", if_busy="queue")
                c = await client.submit_turn(sid, "C", if_busy="queue")
                assert (b.queued, b.position, c.queued, c.position) == (True, 1, True, 2)
                steer = await session.submit("also this", if_busy="steer")
                assert (steer.turn_id, steer.steered, steer.queued) == (first.turn_id, True, False)
                with pytest.raises(ApiError) as rejected:
                    await session.submit("no mode")  # the gateway's default: reject
                assert (rejected.value.status, rejected.value.code) == (409, "turn_in_progress")
                async for _ in session:
                    if len(session.queued) == 2:
                        break
                assert [(q["turn_id"], q["position"], q["text"]) for q in session.queued] == [
                    (b.turn_id, 1, "B"),
                    (c.turn_id, 2, "C"),
                ]
                await session.cancel(c.turn_id)
                await until_ended(session, c.turn_id, [])
                assert [q["turn_id"] for q in session.queued] == [b.turn_id]
                assert session.state.running_turn_id == first.turn_id  # still running
                with pytest.raises(ApiError) as gone:
                    await client.cancel_turn(sid, c.turn_id)
                assert (gone.value.status, gone.value.code) == (404, "turn_not_found")
                provider.let_go()
                await until_ended(session, b.turn_id, [])
                # the steer came as A's last call answered: it became a queued turn, next
                async for _ in session:
                    if not session.queued and session.state.running_turn_id is None:
                        break
            history = await client.messages(sid)
    users = [m.content[0].text for m in history.messages if m.role == "user"]  # type: ignore[union-attr]
    assert users == ["hold A", "B", "also this"]


@pytest.mark.slow  # over a second on two cores: the unreachable address's retries
async def test_what_retrying_cannot_fix_raises_one_error(gw: Harness) -> None:
    with trio.fail_after(10):
        async with GatewayClient(gw.base) as client:
            with pytest.raises(ApiError) as unknown:
                async with client.open_session("sess_00000000000000000000"):
                    pass
            assert (unknown.value.status, unknown.value.code) == (404, "session_not_found")
            sid = (await client.create_session()).session_id
            with pytest.raises(SubscribeRejected) as refused:
                async with client.subscribe(sid, filter="preset:nope") as stream:
                    async for _ in stream:
                        pass
            assert refused.value.code == "invalid_filter"
            # an error of the block is itself, not an ExceptionGroup
            with pytest.raises(KeyError):
                async with client.open_session(sid):
                    raise KeyError("mine")
        async with GatewayClient(f"http://127.0.0.1:{free_port()}") as nowhere:
            with pytest.raises(ClientError) as unreachable:
                await nowhere.create_session()
            assert unreachable.value.code == "unreachable"
            with pytest.raises(ClientError) as first:
                async with nowhere.open_session(sid):
                    pass
            assert first.value.code == "unreachable"
            assert str(first.value).startswith("cannot reach http://127.0.0.1:")
    with pytest.raises(ClientError) as bad:
        GatewayClient("http://[::1")
    assert bad.value.code == "invalid_url"


@pytest.mark.parametrize(
    "url", ["127.0.0.1:8421", "localhost:8421", "htp://127.0.0.1:8421", "http://"]
)
def test_a_base_url_that_is_no_http_url_is_invalid_url_at_once(url: str) -> None:
    """A URL without its scheme (or host) is the same usage error as one that does not
    parse: ``invalid_url`` before any request, not ``unreachable`` after one."""
    with pytest.raises(ClientError) as bad:
        GatewayClient(url)
    assert bad.value.code == "invalid_url"
    assert repr(url) in str(bad.value)


# --- what the stream survives -------------------------------------------------------------


@asynccontextmanager
async def reference(gw: Harness, sid: str) -> AsyncIterator[Any]:
    """A plain client that stays live throughout (the conftest one)."""
    async with gw.client(sid) as ref:
        await ref.subscribe(filter="preset:full")
        yield ref


@pytest.mark.slow  # over a second on two cores (measured with --durations)
@pytest.mark.parametrize("close", ["shutdown", "internal_error", "client_too_slow"])
async def test_a_drop_mid_message_resumes_to_the_state_of_a_live_client(
    gw: Harness, close: str
) -> None:
    """1001, 1011 and 1008 mid-message: a fresh token, ``since``, and not one chunk
    lost or shown twice."""
    sid = await gw.create_session()
    with trio.fail_after(20):
        async with reference(gw, sid) as ref, GatewayClient(gw.base) as client:
            before = set(gw.node.connections)
            async with client.open_session(sid, backoff=FAST) as session:
                [mine] = set(gw.node.connections) - before
                turn_id = await session.send(json.dumps(LOREM))
                chunks: list[Chunk] = []
                async for update in session:
                    chunks.extend(update.chunks)
                    if sum(c.kind == "text" for c in chunks) >= 30:
                        break
                mine.request_close(close)
                items = await until_ended(session, turn_id, chunks)
            await ref.until_turn_ends()
    notices = [i.message for i in items if isinstance(i, Notice)]
    code = {"shutdown": 1001, "internal_error": 1011, "client_too_slow": 1008}[close]
    assert len(notices) == 1
    assert notices[0].startswith(f"closed {code} {close}; reconnecting in ")
    acks = [i.frame for i in items if isinstance(i, Received) and isinstance(i.frame, SubscribeAck)]
    assert len(acks) == 1 and acks[0].since is not None and not acks[0].snapshot  # a replay
    assert stable(session.state.state()) == stable(ref.reducer.state())
    assert joined(chunks) == block_texts(session)  # each chunk once, none missing
    assert session.subscription.duplicates_dropped == 0
    assert session.state.duplicates_ignored == 0


@pytest.mark.slow  # over a second on two cores (measured with --durations)
async def test_a_real_slow_client_is_closed_1008_and_comes_back_with_replay(
    tmp_path: Path,
) -> None:
    config = make_config(
        tmp_path, **{"stream.queue_max_events": 20, "server.send_buffer_bytes": 4096}
    )
    script = {"script": {"delay_ms": 1, "rounds": [[{"lorem": 3000}]]}}
    with trio.fail_after(40):
        async with running_gateway(config) as gw, GatewayClient(gw.base) as client:
            sid = await gw.create_session()
            async with (
                reference(gw, sid) as ref,
                client.open_session(sid, backoff=FAST, buffer=1) as session,
            ):
                turn_id = await session.send(json.dumps(script))
                chunks: list[Chunk] = []
                async for update in session:
                    chunks.extend(update.chunks)
                    if chunks:
                        break
                # this client stops reading; the live one sees it closed as too slow
                warning = (await ref.until(lambda e: e.type == "bus.handler_warning"))[-1]
                assert warning.payload.reason == "client_too_slow"
                await ref.until_turn_ends()
                items = await until_ended(session, turn_id, chunks)
    notices = [i.message for i in items if isinstance(i, Notice)]
    assert notices and notices[0].startswith("closed 1008 client_too_slow; reconnecting in ")
    assert stable(session.state.state()) == stable(ref.reducer.state())
    assert joined(chunks) == block_texts(session)


@pytest.mark.slow  # over a second on two cores (measured with --durations)
async def test_a_replay_the_server_refuses_falls_back_to_a_snapshot(tmp_path: Path) -> None:
    """``replay_too_large`` on the resume (``cursor_expired`` takes the same path):
    the state is whole again from a snapshot, and the chunks still join up."""
    config = make_config(tmp_path, **{"stream.replay_max_events": 2})
    with trio.fail_after(20):
        async with running_gateway(config) as gw, GatewayClient(gw.base) as client:
            sid = await gw.create_session()
            async with reference(gw, sid) as ref:
                before = set(gw.node.connections)
                # buffer=0: while the test does not read, the stream does not either, so
                # it resumes only once the turn has ended, and more than 2 events are due
                async with client.open_session(sid, backoff=FAST, buffer=0) as session:
                    [mine] = set(gw.node.connections) - before
                    turn_id = await session.send(json.dumps(LOREM))
                    chunks: list[Chunk] = []
                    async for update in session:
                        chunks.extend(update.chunks)
                        if sum(c.kind == "text" for c in chunks) >= 30:
                            break
                    mine.request_close("internal_error")
                    # the turn ends while this client is away: it learns so from a snapshot
                    await ref.until_turn_ends()
                    items = await until_ended(session, turn_id, chunks)
    frames = [i.frame for i in items if isinstance(i, Received)]
    [refusal] = [f for f in frames if isinstance(f, SubscribeError)]
    assert refusal.code == "replay_too_large"
    assert any(isinstance(f, Snapshot) for f in frames)
    notices = [i.message for i in items if isinstance(i, Notice)]
    assert notices[-1].startswith("replay_too_large (since evt_")
    assert stable(session.state.state())["messages"] == stable(ref.reducer.state())["messages"]
    assert joined(chunks) == block_texts(session)


async def test_cursor_expired_falls_back_to_a_snapshot(gw: Harness) -> None:
    sid = await gw.create_session()
    expired = "evt_99999999999999999999"
    with trio.fail_after(10):
        async with GatewayClient(gw.base) as client, client.subscribe(sid, since=expired) as stream:
            items = [await stream.__anext__() for _ in range(4)]
    assert isinstance(items[0], Received) and isinstance(items[0].frame, SubscribeError)
    assert items[0].frame.code == "cursor_expired"
    assert items[1] == Notice(f"cursor_expired (since {expired}); starting from a snapshot", True)
    assert isinstance(items[2], Received) and isinstance(items[2].frame, SubscribeAck)
    assert items[2].frame.snapshot
    assert isinstance(items[3], Received) and isinstance(items[3].frame, Snapshot)
    assert stream.cursor == items[3].frame.snapshot_at_event_id


async def test_the_servers_pings_are_answered(tmp_path: Path) -> None:
    """The server pings every 0.05 s and closes after 2 unanswered: the stream lives on."""
    config = make_config(tmp_path, **{"stream.ping_interval_s": 0.05, "stream.ping_max_missed": 2})
    with trio.fail_after(10):
        async with running_gateway(config) as gw, GatewayClient(gw.base) as client:
            sid = await gw.create_session()
            async with client.subscribe(sid, heartbeat=Heartbeat(60)) as stream:
                pings = 0
                async for item in stream:
                    assert not isinstance(item, Notice), item
                    if isinstance(item, Received) and isinstance(item.frame, Ping):
                        pings += 1
                        if pings == 8:  # four times what an unanswered client would get
                            break
            assert stream.connections == 1


async def test_a_server_that_stops_answering_is_noticed_by_missed_pongs(gw: Harness) -> None:
    """A real socket through a proxy that stops forwarding: no close, no FIN, no RST."""
    sid = await gw.create_session()
    proxy = SilenceableProxy(int(gw.base.rsplit(":", 1)[1]))
    with trio.fail_after(15):
        async with trio.open_nursery() as nursery:
            port = await nursery.start(proxy.serve)
            async with (
                reference(gw, sid) as ref,
                GatewayClient(f"http://127.0.0.1:{port}") as client,
                client.open_session(sid, backoff=FAST, heartbeat=Heartbeat(0.1, 2)) as session,
            ):
                first = await session.send("one two three")
                await until_ended(session, first, [])
                proxy.silence_websockets()
                second = await gw.submit(sid, "while it is away")
                items = await until_ended(session, second, [])
                await ref.until_turn_ends()
                await ref.until_turn_ends()
            nursery.cancel_scope.cancel()
    notices = [i.message for i in items if isinstance(i, Notice)]
    assert notices[0].startswith("no frame from the gateway in 0.3 s; reconnecting in ")
    assert stable(session.state.state()) == stable(ref.reducer.state())


# --- the heartbeat on the MockClock ------------------------------------------------------------


class FakeGateway:
    """Just enough of a gateway over in-memory streams: ``GET /sessions/{id}`` answers a
    ``ws_url``, and each WebSocket runs the next script: ``"silent"`` acknowledges the
    subscribe, sends one event, then never sends again (it reads and counts pings)."""

    def __init__(self, *scripts: str) -> None:
        self.scripts = list(scripts)
        self.subscribes: list[dict[str, Any]] = []
        self.pings: list[float] = []
        self.opened: list[float] = []

    def http(self, request: httpx.Request) -> httpx.Response:
        body = {
            "session_id": "sess_x",
            "active_model": "m",
            "attach_token": "atk",
            "ws_url": "ws://fake/sessions/sess_x/stream?attach=atk",
        }
        return httpx.Response(200, json=body)

    @asynccontextmanager
    async def connect(self, url: str) -> AsyncIterator[trio_websocket.WebSocketConnection]:
        client_end, server_end = trio.testing.memory_stream_pair()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._serve, server_end, self.scripts.pop(0))
            ws = await trio_websocket.wrap_client_stream(
                nursery,
                client_end,  # type: ignore[arg-type]
                "fake",
                "/sessions/sess_x/stream",
            )
            try:
                yield ws
            finally:
                nursery.cancel_scope.cancel()

    async def _serve(self, stream: trio.abc.Stream, script: str) -> None:
        async with trio.open_nursery() as nursery:
            request = await trio_websocket.wrap_server_stream(nursery, stream)
            ws = await request.accept()
            self.opened.append(trio.current_time())
            subscribe = json.loads(await ws.get_message())
            self.subscribes.append(subscribe)
            n = len(self.subscribes)
            ack = {
                "type": "subscribe_ack",
                "resolved_filter": {
                    "event_types": None,
                    "actors": None,
                    "include_worker_sessions": False,
                },
                "since": subscribe["since"],
                "snapshot": False,
                "replay_event_count": 0,
            }
            await ws.send_message(json.dumps(ack))
            event = {
                "id": f"evt_{n:020d}",
                "type": "x.custom",
                "session_id": "sess_x",
                "turn_id": None,
                "ts": 0,
                "actor": "bus",
                "payload": {},
            }
            await ws.send_message(json.dumps({"type": "event", "event": event}))
            if script == "silent":
                with contextlib.suppress(trio_websocket.ConnectionClosed):  # the client drops it
                    while True:
                        frame = json.loads(await ws.get_message())
                        assert frame["type"] == "ping"
                        self.pings.append(trio.current_time())
            await trio.sleep_forever()


async def test_missed_pongs_on_the_mock_clock(autojump_clock: trio.testing.MockClock) -> None:
    """Pings at 15 and 30 s of silence, the drop at 45 s, then a resume with ``since``."""
    fake = FakeGateway("silent", "live")
    client = GatewayClient(
        "http://fake", transport=httpx.MockTransport(fake.http), connector=fake.connect
    )
    async with (
        client,
        client.subscribe(
            "sess_x", heartbeat=Heartbeat(15.0, max_missed=2), rand=lambda: 0.0
        ) as stream,
    ):
        items = [await stream.__anext__() for _ in range(5)]
    kinds = [type(i.frame).__name__ if isinstance(i, Received) else i.message for i in items]
    assert kinds == [
        "SubscribeAck",
        "EventFrame",
        "no frame from the gateway in 45 s; reconnecting in 0.2 s",
        "SubscribeAck",
        "EventFrame",
    ]
    start = fake.opened[0]
    assert [round(t - start, 3) for t in fake.pings] == [15.0, 30.0]
    assert round(fake.opened[1] - start, 3) == 45.25  # the drop, then the backoff's 0.25 s
    assert fake.subscribes[1]["since"] == "evt_00000000000000000001"
    assert stream.connections == 2


# --- the documented example --------------------------------------------------------------------


def documented_example() -> str:
    """The Python block of docs/clients.md's "The Python client library" section."""
    doc = (ROOT / "docs" / "clients.md").read_text(encoding="utf-8")
    section = doc.split("## The Python client library", 1)[1]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


@pytest.mark.slow  # over a second on two cores (measured with --durations)
async def test_the_documented_example_runs_as_written(gw: Harness, tmp_path: Path) -> None:
    """Only the gateway's address differs: this one is on a port of its own."""
    example = documented_example()
    assert example.count("http://127.0.0.1:8421") == 1
    (tmp_path / "example.py").write_text(example.replace("http://127.0.0.1:8421", gw.base))
    with trio.fail_after(20):
        done = await trio.run_process(
            [sys.executable, str(tmp_path / "example.py")],
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout.decode() == "You said: hello gateway\n" * 2

"""``POST /agui`` over a real socket (docs/doors/agui.md): SSE, each event read by ``ag_ui.core``.

Rules as in tests/conftest.py: a real gateway on 127.0.0.1 port 0, httpx as
the client, the real clock with ``fail_after`` caps, no sleeping to wait for
something. Every SSE event is validated with the ``ag-ui-protocol`` package's
own models (``ag_ui.core.Event``), which no one here wrote.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing, asynccontextmanager
from pathlib import Path
from typing import Any, cast

import pytest
import trio
from ag_ui.core import Event as AguiEvent
from pydantic import TypeAdapter

from gateway.providers.base import ModelRequest
from gateway.providers.raw import RawEvent
from gateway.providers.scripted import ScriptedProvider
from tests.conftest import JSON_TYPE, TOOL_SCRIPT, Harness, make_config, running_gateway
from tests.scripts import LONG_NAP, TEXT

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

_events = TypeAdapter(AguiEvent)

APPROVAL = {"tools.require_approval": ["sleep"]}


def run_input(thread: str, content: Any, **extra: Any) -> dict[str, Any]:
    text = content if isinstance(content, str) else json.dumps(content)
    return {
        "threadId": thread,
        "runId": f"run-{uuid.uuid4()}",
        "messages": [{"id": f"m-{uuid.uuid4()}", "role": "user", "content": text}],
        "tools": [],
        "context": [],
        "state": {},
        "forwardedProps": {},
        **extra,
    }


class Sse:
    """The events of one ``POST /agui`` answer, validated one by one as they arrive."""

    def __init__(self, lines: AsyncIterator[str]) -> None:
        self.events: list[dict[str, Any]] = []
        self.pings = 0
        self._lines = lines

    async def next(self) -> dict[str, Any]:
        async for line in self._lines:
            if line.startswith(":"):
                self.pings += 1
            elif line.startswith("data: "):
                event: dict[str, Any] = json.loads(line[6:])
                _events.validate_python(event)  # the official models parse it
                self.events.append(event)
                return event
        raise EOFError("the stream ended")

    async def until(self, type_: str) -> dict[str, Any]:
        while (event := await self.next())["type"] != type_:
            pass
        return event

    async def rest(self) -> list[dict[str, Any]]:
        """Every event up to the end of the stream."""
        start = len(self.events)
        try:
            while True:
                await self.next()
        except EOFError:
            return self.events[start:]


@asynccontextmanager
async def agui(h: Harness, body: dict[str, Any]) -> AsyncIterator[Sse]:
    async with h.http.stream("POST", "/agui", json=body) as r:
        assert r.status_code == 200, (await r.aread()).decode()
        assert r.headers["content-type"] == "text/event-stream"
        async with aclosing(cast(AsyncGenerator[str, None], r.aiter_lines())) as lines:
            yield Sse(lines)


async def run_all(h: Harness, body: dict[str, Any]) -> list[dict[str, Any]]:
    async with agui(h, body) as sse:
        return await sse.rest()


async def drop_after(h: Harness, body: dict[str, Any], marker: bytes) -> None:
    """POST ``body`` on a raw socket, read until ``marker`` arrives, then drop the connection."""
    async with await read_until(h, body, marker):
        pass


async def read_until(h: Harness, body: dict[str, Any], marker: bytes) -> trio.SocketStream:
    """POST ``body`` on a raw socket and read until ``marker`` arrives; the socket, still open."""
    port = int(h.base.rsplit(":", 1)[1])
    data = json.dumps(body).encode()
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    await stream.send_all(
        b"POST /agui HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(data), data)
    )
    seen = b""
    while marker not in seen:
        chunk = await stream.receive_some(65536)
        assert chunk, seen
        seen += chunk
    assert b"200 OK" in seen.split(b"\r\n", 1)[0]
    return stream


def types(events: list[dict[str, Any]]) -> list[str]:
    return [e["type"] for e in events]


@asynccontextmanager
async def gateway(tmp_path: Path, **overrides: Any) -> AsyncIterator[Harness]:
    with trio.fail_after(30):
        async with running_gateway(make_config(tmp_path, **overrides)) as h:
            yield h


async def test_a_run_streams_text_reasoning_and_a_tool_call_with_its_result(
    tmp_path: Path,
) -> None:
    async with gateway(tmp_path) as h:
        thread = f"thread-{uuid.uuid4()}"
        events = await run_all(h, run_input(thread, TOOL_SCRIPT))
        assert events[0]["type"] == "RUN_STARTED" and events[0]["threadId"] == thread
        assert events[-1]["type"] == "RUN_FINISHED"
        assert events[-1]["outcome"] == {"type": "success"}
        assert "MESSAGES_SNAPSHOT" not in types(events)  # a new thread has no history
        assert types(events).count("STEP_STARTED") == 2 == types(events).count("STEP_FINISHED")
        reasoning = [e["delta"] for e in events if e["type"] == "REASONING_MESSAGE_CONTENT"]
        assert "".join(reasoning) == "Let me check."
        [start] = [e for e in events if e["type"] == "TOOL_CALL_START"]
        assert start["toolCallName"] == "sleep"
        args = [e["delta"] for e in events if e["type"] == "TOOL_CALL_ARGS"]
        assert json.loads("".join(args)) == {"seconds": 0.01}
        [result] = [e for e in events if e["type"] == "TOOL_CALL_RESULT"]
        assert result["toolCallId"] == start["toolCallId"] and result["content"]
        # The thread is a gateway session: its stored messages are what streamed.
        r = await h.http.get(f"/sessions/{thread}/messages")
        last = r.json()["messages"][-1]
        deltas = [
            e["delta"]
            for e in events
            if e["type"] == "TEXT_MESSAGE_CONTENT" and e["messageId"] == last["id"]
        ]
        assert "".join(deltas) == last["content"][0]["text"] == "All done."


async def test_a_run_on_a_thread_with_history_starts_with_its_messages(tmp_path: Path) -> None:
    async with gateway(tmp_path) as h:
        thread = await h.create_session()  # an existing gateway session is a thread too
        first = run_input(thread, TEXT)
        await run_all(h, first)
        second = run_input(thread, TEXT)
        events = await run_all(h, second)
        assert types(events)[:2] == ["RUN_STARTED", "MESSAGES_SNAPSHOT"]
        snapshot = events[1]["messages"]
        # The thread's messages, then the run's own: each user message by the client's id
        # (docs/doors/agui.md "Ids"), which @ag-ui/client merges by.
        assert [m["role"] for m in snapshot] == ["user", "assistant", "user"]
        assert snapshot[1]["content"] == "Hello there, friend."
        assert [snapshot[0]["id"], snapshot[2]["id"]] == [
            first["messages"][0]["id"],
            second["messages"][0]["id"],
        ]


async def test_a_user_message_id_is_the_clients_bounded_or_else_the_gateways(
    tmp_path: Path,
) -> None:
    """docs/doors/agui.md "Ids": a message id over 256 characters is 422 before anything is
    made; a user message sent without an id is named by the gateway's id."""
    async with gateway(tmp_path) as h:
        thread = await h.create_session()
        long = run_input(thread, TEXT)
        long["messages"][0]["id"] = "m" * 257
        r = await h.http.post("/agui", json=long)
        assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_body", r.text
        assert await h.node.messages_of(h.node.sessions[thread]) == []  # nothing made
        unnamed = run_input(thread, TEXT)
        del unnamed["messages"][0]["id"]
        await run_all(h, unnamed)
        events = await run_all(h, run_input(thread, TEXT))
        [stored, *_] = await h.node.messages_of(h.node.sessions[thread])
        assert stored.client_id is None
        assert events[1]["messages"][0]["id"] == stored.id


async def test_a_permission_is_an_interrupt_and_the_next_run_resumes_it(tmp_path: Path) -> None:
    async with gateway(tmp_path, **APPROVAL) as h:
        thread = f"t-{uuid.uuid4()}"
        first = await run_all(h, run_input(thread, TOOL_SCRIPT))
        finished = first[-1]
        assert finished["type"] == "RUN_FINISHED"
        assert finished["outcome"]["type"] == "interrupt"
        [interrupt] = finished["outcome"]["interrupts"]
        [call] = [e for e in first if e["type"] == "TOOL_CALL_START"]
        assert interrupt["toolCallId"] == call["toolCallId"]
        assert interrupt["reason"] == "tool_approval"
        # A new message while the turn waits: 409; a resume that answers nothing: 422.
        r = await h.http.post("/agui", json=run_input(thread, TEXT))
        assert r.status_code == 409 and r.json()["error"]["code"] == "turn_in_progress"
        bad = run_input(thread, TEXT, resume=[{"interruptId": "perm_x", "status": "resolved"}])
        r = await h.http.post("/agui", json=bad)
        assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_resume"
        undecided = [{"interruptId": interrupt["id"], "status": "resolved", "payload": 7}]
        r = await h.http.post("/agui", json=run_input(thread, TEXT, resume=undecided))
        assert r.status_code == 422
        resume = [
            {"interruptId": interrupt["id"], "status": "resolved", "payload": {"decision": "allow"}}
        ]
        second = await run_all(h, run_input(thread, "", resume=resume))
        assert types(second)[:2] == ["RUN_STARTED", "MESSAGES_SNAPSHOT"]
        [result] = [e for e in second if e["type"] == "TOOL_CALL_RESULT"]
        assert result["toolCallId"] == call["toolCallId"]
        assert not result["content"].startswith("permission_denied")
        assert second[-1] == {**second[-1], "type": "RUN_FINISHED", "outcome": {"type": "success"}}


async def test_a_resume_of_interrupts_answered_elsewhere_is_not_an_error(tmp_path: Path) -> None:
    """An AG-UI client keeps its interrupts until a run finishes: a stale resume must finish one.

    Answered on the HTTP route (as another client would) while the tool then
    runs: the resume attaches to the turn and streams the rest; answered and
    the turn over: the run says so at once (snapshot, success).
    """
    slow = {"script": {"rounds": [[{"tool_use": {"name": "sleep", "input": {"seconds": 0.3}}}],
                                  [{"text": "done"}]]}}  # fmt: skip
    async with gateway(tmp_path, **APPROVAL) as h:
        thread = f"t-{uuid.uuid4()}"
        first = await run_all(h, run_input(thread, slow))
        [interrupt] = first[-1]["outcome"]["interrupts"]
        r = await h.http.post(
            f"/sessions/{thread}/permissions/{interrupt['id']}", json={"decision": "allow"}
        )
        assert r.status_code == 202
        stale = [
            {"interruptId": interrupt["id"], "status": "resolved", "payload": {"decision": "deny"}}
        ]
        second = await run_all(h, run_input(thread, "", resume=stale))
        [result] = [e for e in second if e["type"] == "TOOL_CALL_RESULT"]
        assert result["content"] == "slept 0.3 s"  # allowed elsewhere: the stale deny is ignored
        assert second[-1]["type"] == "RUN_FINISHED" and second[-1]["outcome"] == {"type": "success"}
        # the turn is over now: the same stale resume finishes a run at once
        third = await run_all(h, run_input(thread, "", resume=stale))
        assert types(third) == ["RUN_STARTED", "MESSAGES_SNAPSHOT", "RUN_FINISHED"]
        assert third[-1]["outcome"] == {"type": "success"}
        texts = [m.get("content") for m in third[1]["messages"] if m["role"] == "assistant"]
        assert "done" in texts


async def test_a_cancelled_interrupt_denies_the_tool(tmp_path: Path) -> None:
    async with gateway(tmp_path, **APPROVAL) as h:
        thread = f"t-{uuid.uuid4()}"
        first = await run_all(h, run_input(thread, TOOL_SCRIPT))
        [interrupt] = first[-1]["outcome"]["interrupts"]
        resume = [{"interruptId": interrupt["id"], "status": "cancelled"}]
        second = await run_all(h, run_input(thread, "", resume=resume))
        [result] = [e for e in second if e["type"] == "TOOL_CALL_RESULT"]
        assert result["content"].startswith("permission_denied")
        assert second[-1]["type"] == "RUN_FINISHED"


async def test_the_websocket_sees_the_agui_turn_and_either_side_refuses_a_second_turn(
    tmp_path: Path,
) -> None:
    async with gateway(tmp_path) as h:
        thread = await h.create_session()
        async with h.client(thread) as ws:
            await ws.subscribe()
            async with agui(h, run_input(thread, LONG_NAP)) as sse:
                started = await sse.until("TOOL_CALL_START")
                seen = await ws.until(lambda e: e.type == "tool.called")
                turn_id = seen[0].turn_id
                assert seen[0].type == "turn.started"
                assert any(
                    e.type == "tool.use_start" and e.payload.tool_use_id == started["toolCallId"]
                    for e in seen
                )
                # The gateway's own API sees the same turn in flight: 409 for another.
                r = await h.http.post(f"/sessions/{thread}/turns", json={"content": "hi"})
                assert r.status_code == 409 and r.json()["error"]["code"] == "turn_in_progress"
                r = await h.http.post("/agui", json=run_input(thread, TEXT))
                assert r.status_code == 409
                # A cancel from the WebSocket ends the AG-UI run as cancelled.
                await ws.send({"type": "cancel", "turn_id": turn_id})
                rest = await sse.rest()
                assert rest[-1]["type"] == "RUN_FINISHED"
                assert rest[-1]["outcome"] == {"type": "cancelled"}
            await ws.until_turn_ends()
            # And a native turn in flight refuses an AG-UI run.
            await h.submit(thread, LONG_NAP)
            await ws.until(lambda e: e.type == "tool.called")
            r = await h.http.post("/agui", json=run_input(thread, TEXT))
            assert r.status_code == 409 and r.json()["error"]["code"] == "turn_in_progress"
            r = await h.http.post(f"/agui/{thread}/cancel", json={})
            assert r.status_code == 202
            ended = await ws.until_turn_ends()
            assert ended[-1].type == "turn.cancelled"


# Real clock: the absence of a cancel after the stream's connection drops is watched for
# 0.2 s of a live socket's time, which Trio's clock cannot drive; hence slow.
@pytest.mark.slow
async def test_dropping_the_stream_does_not_cancel_the_turn_the_cancel_route_does(
    tmp_path: Path,
) -> None:
    async with gateway(tmp_path) as h:
        thread = await h.create_session()
        async with h.client(thread) as ws:
            await ws.subscribe()
            body = run_input(thread, LONG_NAP)
            await drop_after(h, body, b"TOOL_CALL_END")
            # The HTTP connection is closed; the turn still runs its tool.
            await ws.until(lambda e: e.type == "tool.called")
            await trio.sleep(0.2)  # a window for a (wrong) cancel to show up
            assert h.node.sessions[thread].turn is not None
            r = await h.http.post(f"/agui/{thread}/cancel", json={"runId": "another-run"})
            assert r.status_code == 409 and r.json()["error"]["code"] == "turn_not_in_flight"
            r = await h.http.post(f"/agui/{thread}/cancel", json={"runId": body["runId"]})
            assert r.status_code == 202, r.text
            assert r.json()["status"] == "cancelling"
            ended = await ws.until_turn_ends()
            assert ended[-1].type == "turn.cancelled"
            r = await h.http.post(f"/agui/{thread}/cancel", headers=JSON_TYPE)
            assert r.status_code == 409


async def test_an_idle_stream_gets_ping_comments(tmp_path: Path) -> None:
    async with gateway(tmp_path, **{"stream.ping_interval_s": 0.05}) as h:
        nap = {
            "script": {
                "rounds": [
                    [{"tool_use": {"name": "sleep", "input": {"seconds": 0.4}}}],
                    [{"text": "Done."}],
                ]
            }
        }
        async with agui(h, run_input(f"t-{uuid.uuid4()}", nap)) as sse:
            await sse.rest()
            assert sse.pings >= 2


async def test_refusals_come_before_the_stream_as_json_errors(tmp_path: Path) -> None:
    async with gateway(tmp_path) as h:
        r = await h.http.post("/agui", json={"threadId": "t"})
        assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_body"
        r = await h.http.post("/agui", json=run_input("no spaces please", TEXT))
        assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_thread_id"
        body = run_input("t-1", TEXT)
        body["messages"] = [{"id": "a", "role": "assistant", "content": "hi"}]
        r = await h.http.post("/agui", json=body)
        assert r.status_code == 422
        r = await h.http.post("/agui/unknown-thread/cancel", headers=JSON_TYPE)
        assert r.status_code == 404
        doc = (await h.http.get("/openapi.json")).json()
        assert "text/event-stream" in doc["paths"]["/agui"]["post"]["responses"]["200"]["content"]
        assert "/agui/{session_id}/cancel" in doc["paths"]


async def test_a_new_thread_belongs_to_the_callers_key(tmp_path: Path) -> None:
    async with gateway(tmp_path, **{"auth.api_keys": ["key-a", "key-b"]}) as h:
        thread = f"t-{uuid.uuid4()}"
        a = {"Authorization": "Bearer key-a"}
        b = {"Authorization": "Bearer key-b"}
        async with h.http.stream("POST", "/agui", json=run_input(thread, TEXT), headers=a) as r:
            assert r.status_code == 200
            await r.aread()
        assert (await h.http.get(f"/sessions/{thread}", headers=a)).status_code == 200
        assert (await h.http.get(f"/sessions/{thread}", headers=b)).status_code == 404
        r = await h.http.post("/agui", json=run_input(thread, TEXT), headers=b)
        assert r.status_code == 404 and r.json()["error"]["code"] == "session_not_found"
        assert (await h.http.post("/agui", json=run_input(thread, TEXT))).status_code == 401


class HeldProvider:
    """The scripted model, whose calls wait for ``release`` first (a turn held in flight)."""

    name = "scripted"

    def __init__(self) -> None:
        self.inner = ScriptedProvider()
        self.release = trio.Event()

    async def stream(self, request: ModelRequest) -> AsyncGenerator[RawEvent, None]:
        await self.release.wait()
        async with aclosing(self.inner.stream(request)) as inner:
            async for raw in inner:
                yield raw

    async def aclose(self) -> None:
        await self.inner.aclose()


async def test_two_runs_racing_on_a_new_thread_share_one_session(tmp_path: Path) -> None:
    """Both look the thread up before either creates it; the second's answer comes late.

    What a busy machine did: the second run's store read ran before the
    first run's commit, and its answer came back only once that creation had
    ended, so it created the thread again: a second session under the same
    id, a second turn (``[200, 200]``). The read is held here until the first
    run answered, and the first run's turn is held in flight until both
    answered (so the 409 does not depend on how fast a turn ends).
    """
    provider = HeldProvider()
    with trio.fail_after(30):
        async with running_gateway(make_config(tmp_path), provider) as h:
            thread = f"t-{uuid.uuid4()}"
            statuses: list[int] = []
            answered = trio.Event()
            store = h.node.store
            read = store.get_session
            entered = 0
            both_in = trio.Event()

            async def get_session(session_id: str) -> Any:
                nonlocal entered
                if session_id != thread:
                    return await read(session_id)
                entered += 1
                if entered == 1:  # the first run waits for the second to be looking too
                    await both_in.wait()
                    return await read(session_id)
                if entered == 2:  # the second reads now (nothing created) and hears late
                    both_in.set()
                    found = await read(session_id)
                    await answered.wait()
                    return found
                return await read(session_id)

            store.get_session = get_session  # type: ignore[method-assign]

            async def post() -> None:
                async with h.http.stream("POST", "/agui", json=run_input(thread, TEXT)) as r:
                    statuses.append(r.status_code)
                    answered.set()
                    if len(statuses) == 2:
                        provider.release.set()
                    await r.aread()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(post)
                nursery.start_soon(post)
            assert sorted(statuses) == [200, 409]  # one thread, one turn at a time
            r = await h.http.get("/sessions")
            assert [s["session"]["id"] for s in r.json()["sessions"]] == [thread]


async def test_a_run_that_stops_reading_is_a_slow_client_as_a_websocket_is(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """docs/protocol.md §3's slow-client rule, for an SSE stream (gateway.session.delivery).

    Every client of the session sees the ``bus.handler_warning``; the close is
    counted (``gateway_slow_client_closes_total``) and logged
    (``slow_client_closed``) as a WebSocket's is.
    """
    paced = {"script": {"delay_ms": 1, "rounds": [[{"lorem": 4000}]]}}
    overrides = {"stream.queue_max_events": 20, "server.send_buffer_bytes": 4096}
    async with gateway(tmp_path, **overrides) as h:
        thread = await h.create_session()
        async with h.client(thread) as watcher:
            await watcher.subscribe()
            async with await read_until(h, run_input(thread, paced), b"RUN_STARTED"):
                # ... and reads nothing more
                found = await watcher.until(lambda e: e.type == "bus.handler_warning")
                warning = found[-1].payload
                assert warning.reason == "client_too_slow"
                assert warning.subscription_name.startswith("agui-")
                assert "AG-UI run queue exceeded queue_max_events=20" in warning.detail
        assert h.node.metrics.slow_clients._value.get() == 1
    [record] = [r for r in caplog.records if getattr(r, "event", None) == "slow_client_closed"]
    fields = record.fields  # type: ignore[attr-defined]
    assert fields["client"].startswith(f"{warning.subscription_name} 127.0.0.1:")
    assert fields["session_id"] == thread and "code" not in fields


@pytest.mark.parametrize("if_busy", ["queue", "steer", "interrupt"])
async def test_a_run_posted_while_one_runs_follows_turns_if_busy(
    tmp_path: Path, if_busy: str
) -> None:
    """docs/doors/agui.md: a second run on a busy thread is queued, steered or interrupts."""
    async with gateway(tmp_path, **{"turns.if_busy": if_busy}) as h:
        thread = await h.create_session()
        async with h.client(thread) as ws:
            await ws.subscribe()
            async with agui(h, run_input(thread, LONG_NAP)) as first:
                await first.until("TOOL_CALL_START")
                async with agui(h, run_input(thread, TEXT)) as second:
                    await second.until("RUN_STARTED")
                    if if_busy != "interrupt":  # the nap ends the first turn
                        await h.http.post(f"/agui/{thread}/cancel", json={})
                    then = await second.rest()
                ended = await first.rest()
            with trio.fail_after(10):  # both turns' ends reached the WebSocket too
                while sum(e.type in ("turn.completed", "turn.cancelled") for e in ws.events) < 2:
                    await ws.recv()
    assert ended[-1]["type"] == "RUN_FINISHED"
    assert then[-1]["type"] == "RUN_FINISHED"
    kinds = [e.type for e in ws.events if e.type.startswith("turn.")]
    if if_busy == "queue":
        # The second run streams its own turn, once the first ended.
        assert kinds[:3] == ["turn.started", "turn.queued", "turn.cancelled"]
        assert "Hello there, friend." in "".join(
            e.get("delta", "") for e in then if e["type"] == "TEXT_MESSAGE_CONTENT"
        )
        assert then[-1]["outcome"] == {"type": "success"}
    elif if_busy == "interrupt":
        assert ended[-1]["outcome"] == {"type": "cancelled"}
        assert kinds[:3] == ["turn.started", "turn.cancelled", "turn.started"]
    else:  # steer: the first turn was cancelled before its next call; the steer runs after
        assert kinds[:3] == ["turn.started", "turn.cancelled", "turn.queued"]

"""Re-attaching to an AG-UI run (docs/doors/agui.md "Re-attaching"), over a real socket.

Every SSE event of a run carries an ``id:``; ``GET
/agui/{session_id}/runs/{run_id}/stream`` with ``Last-Event-ID`` sends
``RUN_STARTED``, the start events of what the client saw open, then the rest.
The resumed stream is checked against the uninterrupted one at every event
boundary, and with the rules ``@ag-ui/client`` verifies (:func:`verify`).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncGenerator
from contextlib import aclosing
from pathlib import Path
from typing import Any, cast

import pytest
import trio
from ag_ui.core import Event as AguiEvent
from pydantic import TypeAdapter

from gateway.doors.agui.resume import parse_cursor
from tests.conftest import TOOL_SCRIPT, Harness, make_config, running_gateway
from tests.integration.doors.agui.test_agui_http import (
    APPROVAL,
    LONG_NAP,
    TEXT,
    gateway,
    read_until,
    run_input,
)

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

_events = TypeAdapter(AguiEvent)

Sent = tuple[str | None, dict[str, Any]]  # an SSE event's id, and the AG-UI event


async def sse_events(h: Harness, method: str, url: str, **kw: Any) -> list[Sent]:
    """Every event of the answer, each with its ``id:``."""
    out: list[Sent] = []
    async with h.http.stream(method, url, **kw) as r:
        assert r.status_code == 200, (await r.aread()).decode()
        assert r.headers["content-type"] == "text/event-stream"
        event_id: str | None = None
        lines = cast(AsyncGenerator[str, None], r.aiter_lines())
        async with aclosing(lines):
            async for line in lines:
                if line.startswith("id: "):
                    event_id = line[4:]
                elif line.startswith("data: "):
                    event: dict[str, Any] = json.loads(line[6:])
                    _events.validate_python(event)  # the official models parse it
                    out.append((event_id, event))
                    event_id = None
    return out


async def post_until(h: Harness, body: dict[str, Any], marker: bytes) -> list[Sent]:
    """``POST /agui`` on a raw socket, read until ``marker``, then dropped: the events read."""
    port = int(h.base.rsplit(":", 1)[1])
    data = json.dumps(body).encode()
    seen = b""
    async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
        await stream.send_all(
            b"POST /agui HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(data), data)
        )
        while marker not in seen:
            chunk = await stream.receive_some(65536)
            assert chunk, seen
            seen += chunk
    out: list[Sent] = []
    event_id: str | None = None
    for line in seen.decode().splitlines():  # (chunk sizes are lines of their own)
        if line.startswith("id: "):
            event_id = line[4:]
        elif line.startswith("data: "):
            out.append((event_id, json.loads(line[6:])))
            event_id = None
    return out


def stream_url(thread: str, run_id: str) -> str:
    return f"/agui/{thread}/runs/{run_id}/stream"


def bodies(sent: list[Sent]) -> list[dict[str, Any]]:
    return [e for _, e in sent]


_PAIRS = {
    "STEP_STARTED": ("step", "stepName", True),
    "STEP_FINISHED": ("step", "stepName", False),
    "TEXT_MESSAGE_START": ("text", "messageId", True),
    "TEXT_MESSAGE_END": ("text", "messageId", False),
    "REASONING_START": ("reasoning", "messageId", True),
    "REASONING_END": ("reasoning", "messageId", False),
    "REASONING_MESSAGE_START": ("reasoning_message", "messageId", True),
    "REASONING_MESSAGE_END": ("reasoning_message", "messageId", False),
    "TOOL_CALL_START": ("tool", "toolCallId", True),
    "TOOL_CALL_END": ("tool", "toolCallId", False),
}
_INSIDE = {
    "TEXT_MESSAGE_CONTENT": ("text", "messageId"),
    "REASONING_MESSAGE_CONTENT": ("reasoning_message", "messageId"),
    "TOOL_CALL_ARGS": ("tool", "toolCallId"),
}


def open_starts(seen: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The start events of the steps and blocks ``seen`` opened and did not close, in order."""
    open_: dict[tuple[str, str], dict[str, Any]] = {}
    for e in seen:
        if e["type"] in _PAIRS:
            kind, field, starts = _PAIRS[e["type"]]
            if starts:
                open_[kind, e[field]] = e
            else:
                open_.pop((kind, e[field]), None)
    return list(open_.values())


def verify(events: list[dict[str, Any]]) -> None:
    """The rules ``@ag-ui/client``'s verifier holds a stream to (the ones this gateway meets)."""
    assert events and events[0]["type"] == "RUN_STARTED", events[:1]
    open_: set[tuple[str, str]] = set()
    for i, e in enumerate(events):
        type_ = e["type"]
        assert i == 0 or type_ != "RUN_STARTED", f"a second RUN_STARTED at {i}"
        if type_ in ("RUN_FINISHED", "RUN_ERROR"):
            assert i == len(events) - 1, f"events after the run's end: {events[i:]}"
        if type_ in _PAIRS:
            kind, field, starts = _PAIRS[type_]
            key = (kind, e[field])
            if starts:
                assert key not in open_, f"{type_} of an open {key} at {i}"
                open_.add(key)
            else:
                assert key in open_, f"{type_} of {key}, never started, at {i}"
                open_.discard(key)
        if type_ in _INSIDE:
            kind, field = _INSIDE[type_]
            assert (kind, e[field]) in open_, f"{type_} outside its block at {i}"


def view(events: list[dict[str, Any]]) -> tuple[dict[str, str], set[str]]:
    """What a client holds after ``events``: each block's content, and every other event.

    A block's start begins it again (a message re-sent whole replaces what
    was seen of it); timestamps are left out (a rebuilt block has its
    message's).
    """
    texts: dict[str, str] = {}
    others: set[str] = set()
    for e in events:
        t = e["type"]
        if t in ("TEXT_MESSAGE_START", "REASONING_MESSAGE_START"):
            texts[e["messageId"]] = ""
        elif t == "TOOL_CALL_START":
            texts[e["toolCallId"]] = ""
        elif t in ("TEXT_MESSAGE_CONTENT", "REASONING_MESSAGE_CONTENT"):
            texts[e["messageId"]] += e["delta"]
        elif t == "TOOL_CALL_ARGS":
            texts[e["toolCallId"]] += e["delta"]
        else:
            others.add(json.dumps({k: v for k, v in e.items() if k != "timestamp"}, sort_keys=True))
    return texts, others


async def test_a_run_resumes_at_every_event_boundary(tmp_path: Path) -> None:
    """Cut after k events for every k: ``RUN_STARTED``, the reopened starts, then the rest.

    Streaming-only events are not replayed (docs/protocol.md §3): a message
    completed after the cursor comes whole, so the client's view (``view``)
    of what it saw plus the resumed stream is the run's.
    """
    async with gateway(tmp_path) as h:
        thread = f"t-{uuid.uuid4()}"
        await sse_events(h, "POST", "/agui", json=run_input(thread, TEXT))  # some history
        body = run_input(thread, TOOL_SCRIPT)
        full = await sse_events(h, "POST", "/agui", json=body)
        types = [e["type"] for e in bodies(full)]
        assert types[:2] == ["RUN_STARTED", "MESSAGES_SNAPSHOT"] and types[-1] == "RUN_FINISHED"
        positions = [parse_cursor(i) for i, _ in full if i is not None]
        assert len(positions) == len(full) and None not in positions  # an id on every event
        assert positions == sorted(set(positions))  # strictly increasing: each names one event
        url = stream_url(thread, body["runId"])
        whole = await sse_events(h, "GET", url)  # no Last-Event-ID: the whole run
        verify(bodies(whole))
        assert whole[:2] == full[:2] and whole[-1] == full[-1]  # the opening, the end: exact
        assert view(bodies(whole)) == view(bodies(full))
        for k in range(1, len(full) + 1):
            cursor = full[k - 1][0]
            assert cursor is not None
            got = await sse_events(h, "GET", url, headers={"Last-Event-ID": cursor})
            verify(bodies(got))
            (first_id, started), rest = got[0], got[1:]
            assert started["type"] == "RUN_STARTED" and first_id == cursor
            assert (started["threadId"], started["runId"]) == (thread, body["runId"])
            assert view(bodies(full[:k] + rest)) == view(bodies(full)), k
            assert rest[-1] == full[-1]  # with everything seen, the run's end again
            later = [p for p in map(parse_cursor, (i for i, _ in rest)) if p is not None]
            assert all(p >= positions[k - 1] for p in later)  # nothing from before the cursor


async def test_a_run_still_going_resumes_live_with_its_open_blocks_reopened(
    tmp_path: Path,
) -> None:
    async with gateway(tmp_path) as h:
        thread = f"t-{uuid.uuid4()}"
        body = run_input(thread, LONG_NAP)
        seen = await post_until(h, body, b"TOOL_CALL_END")
        # The connection is closed; the tool runs on. Resume from its LLM call's start.
        [(cursor, step)] = [(i, e) for i, e in seen if e["type"] == "STEP_STARTED"]
        assert cursor is not None
        url = stream_url(thread, body["runId"])
        async with h.http.stream("GET", url, headers={"Last-Event-ID": cursor}) as r:
            assert r.status_code == 200
            got: list[dict[str, Any]] = []
            lines = cast(AsyncGenerator[str, None], r.aiter_lines())
            async with aclosing(lines):
                async for line in lines:
                    if not line.startswith("data: "):
                        continue
                    got.append(json.loads(line[6:]))
                    if got[-1]["type"] == "STEP_FINISHED":  # the replay is over: now cancel
                        cancel = {"runId": body["runId"]}
                        r2 = await h.http.post(f"/agui/{thread}/cancel", json=cancel)
                        assert r2.status_code == 202, r2.text
        verify(got)
        assert got[:2] == [got[0], step]  # RUN_STARTED, then the step it saw open, again
        texts, _ = view(got)
        assert texts == view(bodies(seen))[0]  # the message and its tool call, whole
        assert got[-1]["type"] == "RUN_FINISHED" and got[-1]["outcome"] == {"type": "cancelled"}
        [start] = [e for e in got if e["type"] == "TOOL_CALL_START"]
        [result] = [e for e in got if e["type"] == "TOOL_CALL_RESULT"]
        assert result["toolCallId"] == start["toolCallId"]


async def test_an_interrupted_run_and_its_resume_replay_as_they_streamed(tmp_path: Path) -> None:
    async with gateway(tmp_path, **APPROVAL) as h:
        thread = f"t-{uuid.uuid4()}"
        body = run_input(thread, TOOL_SCRIPT)
        first = await sse_events(h, "POST", "/agui", json=body)
        [interrupt] = first[-1][1]["outcome"]["interrupts"]
        answer = {"decision": "allow"}
        resume = [{"interruptId": interrupt["id"], "status": "resolved", "payload": answer}]
        again = run_input(thread, "", resume=resume)
        second = await sse_events(h, "POST", "/agui", json=again)
        assert second[-1][1]["outcome"] == {"type": "success"}
        # Both runs are over: each is replayed as it streamed, the first up to its interrupt.
        for run, sent in ((body, first), (again, second)):
            replayed = await sse_events(h, "GET", stream_url(thread, run["runId"]))
            verify(bodies(replayed))
            assert replayed[0] == sent[0] and replayed[-1] == sent[-1]
            assert view(bodies(replayed)) == view(bodies(sent))


async def test_unknown_runs_other_keys_and_bad_ids_are_refused(tmp_path: Path) -> None:
    async with gateway(tmp_path, **{"auth.api_keys": ["key-a", "key-b"]}) as h:
        a = {"Authorization": "Bearer key-a"}
        b = {"Authorization": "Bearer key-b"}
        thread = f"t-{uuid.uuid4()}"
        body = run_input(thread, TEXT)
        await sse_events(h, "POST", "/agui", json=body, headers=a)
        url = stream_url(thread, body["runId"])
        assert len(await sse_events(h, "GET", url, headers=a)) > 2
        r = await h.http.get(url, headers=b)  # another key's thread does not exist
        assert r.status_code == 404 and r.json()["error"]["code"] == "session_not_found"
        r = await h.http.get(stream_url(thread, "no-such-run"), headers=a)
        assert r.status_code == 404 and r.json()["error"]["code"] == "run_not_found"
        r = await h.http.get(stream_url("no-such-thread", body["runId"]), headers=a)
        assert r.status_code == 404 and r.json()["error"]["code"] == "session_not_found"
        r = await h.http.get(url, headers={**a, "Last-Event-ID": "evt_1:x"})
        assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_last_event_id"
        doc = (await h.http.get("/openapi.json", headers=a)).json()
        op = doc["paths"]["/agui/{session_id}/runs/{run_id}/stream"]["get"]
        assert "text/event-stream" in op["responses"]["200"]["content"]


async def test_a_run_is_found_again_after_a_restart(tmp_path: Path) -> None:
    """The run's turn is found from the store; the replay holds its messages whole."""
    config = make_config(tmp_path)
    thread = f"t-{uuid.uuid4()}"
    body = run_input(thread, TOOL_SCRIPT)
    with trio.fail_after(60):
        async with running_gateway(config) as h:
            await sse_events(h, "POST", "/agui", json=run_input(thread, TEXT))
            full = await sse_events(h, "POST", "/agui", json=body)
        async with running_gateway(config) as h:
            url = stream_url(thread, body["runId"])
            whole = await sse_events(h, "GET", url)
            verify(bodies(whole))
            assert whole[:2] == full[:2]  # the opening: the same, at the same ids
            assert whole[-1] == full[-1]

            def texts(sent: list[Sent], kind: str) -> dict[str, str]:
                out: dict[str, str] = {}
                for _, e in sent:
                    if e["type"] == kind:
                        key = e.get("messageId") or e["toolCallId"]
                        out[key] = out.get(key, "") + e["delta"]
                return out

            for kind in ("TEXT_MESSAGE_CONTENT", "REASONING_MESSAGE_CONTENT"):
                assert texts(whole, kind) == texts(full, kind), kind
            args = texts(full, "TOOL_CALL_ARGS")
            assert {k: json.loads(v) for k, v in texts(whole, "TOOL_CALL_ARGS").items()} == {
                k: json.loads(v) for k, v in args.items()
            }
            cursor = full[-1][0]
            assert cursor is not None
            end = await sse_events(h, "GET", url, headers={"Last-Event-ID": cursor})
            assert [e["type"] for e in bodies(end)] == ["RUN_STARTED", "RUN_FINISHED"]
            for k in range(1, len(full)):
                mid = full[k][0]
                assert mid is not None
                verify(bodies(await sse_events(h, "GET", url, headers={"Last-Event-ID": mid})))


async def test_an_agui_stream_counts_against_the_stream_limits(tmp_path: Path) -> None:
    limits = {"limits.max_connections_per_key": 1, "stream.ping_interval_s": 0.05}
    async with gateway(tmp_path, **limits) as h:
        thread = f"t-{uuid.uuid4()}"
        body = run_input(thread, LONG_NAP)
        url = stream_url(thread, body["runId"])
        async with await read_until(h, body, b"TOOL_CALL_END"):  # the run's stream, open
            r = await h.http.get(url)
            assert r.status_code == 503 and r.json()["error"]["code"] == "over_capacity"
            r = await h.http.post("/agui", json=run_input(f"t-{uuid.uuid4()}", TEXT))
            assert r.status_code == 503 and r.json()["error"]["code"] == "over_capacity"
        r = await h.http.post(f"/agui/{thread}/cancel", json={"runId": body["runId"]})
        assert r.status_code == 202
        with trio.fail_after(10):  # the dropped stream gives its count back (its next ping)
            while h.node.limits.streams:  # noqa: ASYNC110 (a count, no event to wait on)
                await trio.sleep(0.01)
        ended = await sse_events(h, "GET", url)
        assert ended[-1][1]["outcome"] == {"type": "cancelled"}


async def test_a_deleted_sessions_runs_are_not_found_even_under_a_reused_thread_id(
    tmp_path: Path,
) -> None:
    """``DELETE /sessions/{id}`` takes its runs with it: 404, never a stream of another's."""
    async with gateway(tmp_path) as h:
        thread = f"t-{uuid.uuid4()}"
        first, resumed = run_input(thread, TOOL_SCRIPT), run_input(thread, TEXT)
        await sse_events(h, "POST", "/agui", json=first)
        await sse_events(h, "POST", "/agui", json=resumed)
        assert len(await sse_events(h, "GET", stream_url(thread, first["runId"]))) > 2
        assert (await h.http.delete(f"/sessions/{thread}")).status_code == 204
        for run in (first, resumed):
            r = await h.http.get(stream_url(thread, run["runId"]))
            assert r.status_code == 404, r.text
            assert r.json()["error"]["code"] == "session_not_found", r.text  # the thread is gone
        # The thread id made again: a new session, in which the old runs are no runs.
        await sse_events(h, "POST", "/agui", json=run_input(thread, TEXT))
        for run in (first, resumed):
            with trio.fail_after(5):  # it used to answer 200, RUN_STARTED, then nothing
                r = await h.http.get(stream_url(thread, run["runId"]))
            assert r.status_code == 404 and r.json()["error"]["code"] == "run_not_found", r.text

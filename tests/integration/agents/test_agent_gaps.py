"""The agent loop's gaps against docs/protocol.md sections 4, 5 and 6, end to end.

- A delegated worker's permission requests reach every ancestor's stream
  whatever its ``include_worker_sessions``, each ancestor's snapshot lists
  them with the worker's ``session_id``, and an ancestor's route answers them
  (sections 2, 5 and 6).
- A turn's ``cost_usd`` includes its workers' turns, recursively, and so does
  ``cost_so_far_usd`` (section 5).
- A ``tool_result`` keeps a tool's ``structured_content`` (section 6), and the
  providers never send it to a model.
- ``ts`` never goes backwards within a session (section 4), and
  ``protocol_version`` is 1 (sections 3 and 4).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from gateway.protocol.frames import Snapshot, SubscribeAck
from gateway.protocol.shapes import Message, TextBlock, ToolResultBlock, ToolUseBlock
from gateway.providers.anthropic import messages_param
from gateway.providers.base import ModelRequest
from gateway.providers.history import rebuild
from gateway.providers.openai import chat_messages
from gateway.session import recovery
from tests.conftest import TOOL_SCRIPT, Harness, make_config, running_gateway, types

ALL_WORKERS = {"event_types": None, "actors": None, "include_worker_sessions": True}


def script(*rounds: list[dict[str, Any]]) -> dict[str, Any]:
    return {"script": {"rounds": list(rounds)}}


def delegate(task: dict[str, Any] | str) -> dict[str, Any]:
    text = task if isinstance(task, str) else json.dumps(task)
    return {"tool_use": {"name": "delegate", "input": {"task": text}}}


SLEEP = {"tool_use": {"name": "sleep", "input": {"seconds": 0.01}}}


async def snapshot_of(gw: Harness, session_id: str) -> Snapshot:
    async with gw.client(session_id) as client:
        ack = await client.subscribe(snapshot=True)
        assert isinstance(ack, SubscribeAck)
        frame = await client.recv()
        assert isinstance(frame, Snapshot)
        return frame


# --- 1. a worker's permission requests reach every ancestor ----------------------------


async def test_a_grandworkers_request_is_seen_and_answered_from_the_root(tmp_path: Path) -> None:
    """The root's client, default filter, sees the request, and answers it on the root's route."""
    config = make_config(tmp_path, **{"tools.require_approval": ["sleep"]})
    grand = script([SLEEP], [{"text": "slept"}])
    middle = script([delegate(grand)], [{"text": "delegated"}])
    root_script = script([delegate(middle)], [{"text": "all done"}])
    with trio.fail_after(20):
        async with running_gateway(config) as gw:
            root = await gw.create_session()
            async with gw.client(root) as client, gw.client(root) as watcher:
                await client.subscribe("preset:chat")  # include_worker_sessions: false
                await watcher.subscribe(ALL_WORKERS)
                turn_id = await gw.submit(root, root_script)
                asked = (await client.until(lambda e: e.type == "permission.requested"))[-1]
                seen = await watcher.until(lambda e: e.type == "permission.requested")
                starts = [e for e in seen if e.type == "delegate.started"]
                middle_id, grand_id = (e.payload.worker_session_id for e in starts)
                # Tagged with the worker's own session id, not the root's.
                assert asked.session_id == grand_id
                assert asked.payload.tool_name == "sleep"
                perm_id = asked.payload.perm_id
                # The reference reducer lists it as the snapshot does (section 6).
                [mine] = client.reducer.state()["pending_permissions"]
                assert (mine["perm_id"], mine["session_id"]) == (perm_id, grand_id)
                # Every ancestor's snapshot lists it, with the session that asked.
                for ancestor in (root, middle_id):
                    pending = (await snapshot_of(gw, ancestor)).session.pending_permissions
                    assert [(p.perm_id, p.session_id) for p in pending] == [(perm_id, grand_id)]
                pending = (await snapshot_of(gw, grand_id)).session.pending_permissions
                assert [p.perm_id for p in pending] == [perm_id]
                r = await gw.http.post(
                    f"/sessions/{root}/permissions/{perm_id}", json={"decision": "allow"}
                )
                assert r.status_code == 202, r.text
                events = await client.until(
                    lambda e: e.type == "turn.completed" and e.turn_id == turn_id
                )
                watched = await watcher.until(
                    lambda e: e.type == "turn.completed" and e.turn_id == turn_id
                )
            # The root's default stream took the worker's permission events, and
            # nothing else of the workers.
            foreign = [e for e in client.events if e.session_id != root]
            assert types(foreign) == ["permission.requested", "permission.resolved"]
            assert {e.session_id for e in foreign} == {grand_id}
            assert client.reducer.state()["pending_permissions"] == []
            resolved = next(e for e in events if e.type == "permission.resolved")
            assert (resolved.payload.perm_id, resolved.payload.decision) == (perm_id, "allow")
            # The worker's tool ran once allowed.
            ran = [e for e in watched if e.type == "tool.completed" and e.session_id == grand_id]
            assert [e.payload.tool_name for e in ran] == ["sleep"]
            # Answered: a second answer, from any ancestor, is a 409; an unknown one a 404.
            r = await gw.http.post(
                f"/sessions/{middle_id}/permissions/{perm_id}", json={"decision": "deny"}
            )
            assert r.status_code == 409, r.text
            r = await gw.http.post(
                f"/sessions/{root}/permissions/perm_nope", json={"decision": "deny"}
            )
            assert r.status_code == 404, r.text
            assert (await snapshot_of(gw, root)).session.pending_permissions == []
            # A replay of the root's default stream carries them too.
            first = client.events[0].id
            async with gw.client(root) as late:
                ack = await late.subscribe("preset:chat", since=first)
                assert isinstance(ack, SubscribeAck)
                replayed = await late.until(
                    lambda e: e.type == "turn.completed" and e.turn_id == turn_id
                )
            assert [(e.session_id, e.type) for e in replayed if e.session_id != root] == [
                (grand_id, "permission.requested"),
                (grand_id, "permission.resolved"),
            ]


async def test_a_request_is_not_answered_from_a_stranger(
    tmp_path: Path,
) -> None:
    """Only the session that asked or an ancestor answers: another session gets a 404."""
    config = make_config(tmp_path, **{"tools.require_approval": ["sleep"]})
    with trio.fail_after(20):
        async with running_gateway(config) as gw:
            root = await gw.create_session()
            other = await gw.create_session()
            async with gw.client(root) as client:
                await client.subscribe("preset:chat")
                await gw.submit(root, script([SLEEP], [{"text": "ok"}]))
                asked = (await client.until(lambda e: e.type == "permission.requested"))[-1]
                r = await gw.http.post(
                    f"/sessions/{other}/permissions/{asked.payload.perm_id}",
                    json={"decision": "allow"},
                )
                assert r.status_code == 404, r.text
                r = await gw.http.post(
                    f"/sessions/{root}/permissions/{asked.payload.perm_id}",
                    json={"decision": "deny"},
                )
                assert r.status_code == 202, r.text
                await client.until_turn_ends()


async def test_a_cancel_resolves_a_workers_request_in_the_parents_stream(tmp_path: Path) -> None:
    """The root's cancel ends the worker's waiting request: ``cancelled``, seen by the root."""
    config = make_config(tmp_path, **{"tools.require_approval": ["sleep"]})
    worker = script([SLEEP], [{"text": "slept"}])
    with trio.fail_after(20):
        async with running_gateway(config) as gw:
            root = await gw.create_session()
            async with gw.client(root) as client:
                await client.subscribe("preset:chat")
                turn_id = await gw.submit(root, script([delegate(worker)], [{"text": "x"}]))
                asked = (await client.until(lambda e: e.type == "permission.requested"))[-1]
                r = await gw.http.post(f"/sessions/{root}/turns/{turn_id}/cancel", json={})
                assert r.status_code in (200, 202), r.text
                events = await client.until(lambda e: e.type == "turn.cancelled")
            resolved = [e for e in events if e.type == "permission.resolved"]
            assert [(e.session_id, e.payload.perm_id, e.payload.decision) for e in resolved] == [
                (asked.session_id, asked.payload.perm_id, "cancelled")
            ]
            assert (await snapshot_of(gw, root)).session.pending_permissions == []


# --- 2. workers' costs roll up ---------------------------------------------------------------


async def test_a_turn_costs_what_its_workers_spent_recursively(tmp_path: Path) -> None:
    prices = {"scripted:echo": {"input_per_mtok": 1000.0, "output_per_mtok": 3000.0}}
    config = make_config(tmp_path, **{"model.prices": prices})
    grand = "hello from below"
    middle = script([delegate(grand)], [{"text": "middle done"}])
    root_script = script([delegate(middle)], [{"text": "root done"}])
    with trio.fail_after(20):
        async with running_gateway(config) as gw:
            root = await gw.create_session()
            async with gw.client(root) as client:
                await client.subscribe(ALL_WORKERS)
                turn_id = await gw.submit(root, root_script)
                events = await client.until(
                    lambda e: e.type == "turn.completed" and e.turn_id == turn_id
                )
            summary = (await snapshot_of(gw, root)).session
    own: dict[str, float] = {}
    completed: dict[str, Any] = {}
    for e in events:
        if e.type == "llm.call_completed":
            own[e.session_id] = own.get(e.session_id, 0.0) + (e.payload.usage.cost_usd or 0.0)
        if e.type == "turn.completed":
            completed[e.session_id] = e.payload
    starts = [e.payload.worker_session_id for e in events if e.type == "delegate.started"]
    middle_id, grand_id = starts
    assert all(cost > 0 for cost in own.values()) and len(own) == 3
    g, m, r = completed[grand_id], completed[middle_id], completed[root]
    assert (g.cost_usd, g.workers_cost_usd) == pytest.approx((own[grand_id], 0.0))
    assert m.workers_cost_usd == pytest.approx(g.cost_usd)
    assert m.cost_usd == pytest.approx(own[middle_id] + g.cost_usd)
    assert r.workers_cost_usd == pytest.approx(m.cost_usd)
    assert r.cost_usd == pytest.approx(own[root] + own[middle_id] + own[grand_id])
    assert summary.cost_so_far_usd == pytest.approx(r.cost_usd)


# --- 3. structured_content is kept ---------------------------------------------------------


async def test_a_tool_result_keeps_its_structured_content(gw: Harness) -> None:
    sid = await gw.create_session()
    async with gw.client(sid) as client:
        await client.subscribe()
        await gw.submit(sid, script([delegate("hi")], [{"text": "ok"}]))
        with trio.fail_after(10):
            events = await client.until(
                lambda e: e.type == "turn.completed" and e.session_id == sid
            )
    [completed] = [e for e in events if e.type == "tool.completed"]
    structured = completed.payload.structured_result
    assert structured and structured["worker_session_id"]
    r = await gw.http.get(f"/sessions/{sid}/messages")
    results = [b for m in r.json()["messages"] for b in m["content"] if b["type"] == "tool_result"]
    assert [b["structured_content"] for b in results] == [structured]
    snap = await snapshot_of(gw, sid)
    kept = [b for m in snap.messages for b in m.content if isinstance(b, ToolResultBlock)]
    assert [b.structured_content for b in kept] == [structured]
    # The model got the text only on the next call (the turn's second round ran fine).
    assert events[-1].payload.stop_reason == "end_turn"


def test_providers_never_send_structured_content() -> None:
    use = ToolUseBlock("toolu_1", "delegate", {"task": "x"})
    result = ToolResultBlock("toolu_1", "done", False, structured_content={"k": [1]})
    messages = [
        Message("msg_1", "s", "t", "user", [TextBlock("go")], "complete", 1),
        Message("msg_2", "s", "t", "assistant", [use], "complete", 2),
        Message("msg_3", "s", "t", "user", [result], "complete", 3),
    ]
    [_, _, sent] = rebuild(messages)
    assert sent.content == [ToolResultBlock("toolu_1", "done", False)]
    request = ModelRequest(model="m", messages=messages, tools=[], max_tokens=10)
    assert "structured_content" not in json.dumps(messages_param(request))
    assert "structured_content" not in json.dumps(chat_messages(request))


# --- 9 (recovery): a restart resolves a request it interrupted ----------------------------------


def test_recovery_resolves_a_waiting_request_cancelled_before_its_tool_fails() -> None:
    from gateway.protocol.events import (
        LlmCallCompleted,
        LlmCallStarted,
        PermissionRequested,
        PermissionResolved,
        ToolCalled,
    )
    from gateway.protocol.shapes import Usage

    events: list[tuple[str, Any]] = [
        ("llm.call_started", LlmCallStarted("c1", "m")),
        ("llm.call_completed", LlmCallCompleted("c1", "msg_1", "tool_use", Usage())),
        ("tool.called", ToolCalled("tu_a", "sleep", {})),
        ("tool.called", ToolCalled("tu_b", "sleep", {})),
        ("permission.requested", PermissionRequested("perm_a", "tu_a", "sleep", {}, 1)),
        ("permission.requested", PermissionRequested("perm_b", "tu_b", "sleep", {}, 1)),
        ("permission.resolved", PermissionResolved("perm_b", "allow")),
    ]
    closing = recovery.closing(recovery.plan("turn_1", events, []))
    assert [type(p).__name__ for p in closing] == [
        "PermissionResolved",
        "ToolFailed",
        "ToolFailed",
        "TurnCancelled",
    ]
    assert (closing[0].perm_id, closing[0].decision) == ("perm_a", "cancelled")  # type: ignore[attr-defined]
    assert closing[1].tool_use_id == "tu_a"  # type: ignore[attr-defined]


# --- 6. ts never goes backwards ----------------------------------------------------------------


@pytest.fixture
def clock_stepping_back(monkeypatch: pytest.MonkeyPatch) -> Iterator[int]:
    """Every reading of the events' clock is a second earlier than the last."""
    start = 1_900_000_000_000
    readings = iter(range(start, 0, -1000))
    monkeypatch.setattr("gateway.session.session.now_ms", lambda: next(readings))
    yield start


async def test_ts_never_goes_backwards_within_a_session(
    gw: Harness, clock_stepping_back: int
) -> None:
    sid = await gw.create_session()
    async with gw.client(sid) as client:
        await client.subscribe()
        await gw.submit(sid, TOOL_SCRIPT)
        with trio.fail_after(10):
            events = await client.until_turn_ends()
    stamps = [e.ts for e in events]
    assert len(events) > 10
    assert stamps == sorted(stamps)
    assert stamps[-1] == clock_stepping_back  # repeated, never below the first reading


# --- 7. protocol_version ------------------------------------------------------------------


async def test_protocol_version_is_1(gw: Harness) -> None:
    sid = await gw.create_session()
    r = await gw.http.get(f"/sessions/{sid}")
    assert r.json()["protocol_version"] == 1
    async with gw.client(sid) as client:
        await client.send({"type": "subscribe", "filter": "preset:chat", "since": None})
        raw = json.loads(await client.ws.get_message())
    assert raw["type"] == "subscribe_ack" and raw["protocol_version"] == 1

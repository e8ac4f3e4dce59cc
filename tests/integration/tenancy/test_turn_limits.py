"""Limits that hold (docs/protocol.md §15): what one turn can make the gateway do.

docs/reference.md ``[limits]``, 0 = no limit:

- ``max_tool_uses_per_turn`` (64): every ``tool_use`` block of a turn counts,
  across its rounds; those beyond fail ``tool.failed`` (``limit``) without
  running, and the turn goes on to the next model round.
- ``max_workers_per_turn`` (8) and ``max_delegate_depth`` (2): ``delegate``
  beyond them fails ``limit``, and nothing else happens (no session, no
  ``delegate.*`` event).
- Workers count against their owner's ``max_sessions_per_key`` and
  ``turns_per_minute_per_key``; over them ``delegate`` fails ``limit`` (a tool's
  failure, not a 429), while a client's own request still gets its 429.
- ``max_session_mb``: past it, ``POST .../turns`` (and an AG-UI run) is 409
  ``session_too_large``; the session can still be read. Its size is counted in
  memory as it writes, and once from the store when it is loaded.

And the storm an adversarial trial sent: one scripted turn asking for 1,000
``delegate`` tool uses starts 8 workers; every other tool use fails ``limit``,
and each gets exactly one outcome. (The latency of another session during
that storm is measured by ``python -m bench.storm``, not asserted here.)

Test rules: a real gateway on 127.0.0.1 port 0 (tests.conftest), the scripted
model; a turn's end is awaited through the node's ``changed`` (which fires in
the step that ends it), and its catalog events are read from the store.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import msgspec
import trio

from gateway.session.admission import MB
from gateway.session.session import Session
from gateway.tenancy import key_id
from tests.conftest import Harness, make_config, running_gateway
from tests.integration.doors.agui.test_agui_http import run_input
from tests.integration.doors.rest.test_http_api import assert_error
from tests.integration.tenancy.test_tenants import tenants


def delegate(task: Any) -> dict[str, Any]:
    """A ``delegate`` tool use; a dict task is a script for the worker."""
    text = task if isinstance(task, str) else json.dumps({"script": task})
    return {"tool_use": {"name": "delegate", "input": {"task": text}}}


def sleep0() -> dict[str, Any]:
    return {"tool_use": {"name": "sleep", "input": {"seconds": 0}}}


DONE = [{"text": "done"}]


@asynccontextmanager
async def gateway(tmp_path: Path, **overrides: Any) -> AsyncIterator[Harness]:
    with trio.fail_after(60):
        async with running_gateway(make_config(tmp_path, **overrides)) as gw:
            yield gw


async def run_turn(gw: Harness, sid: str, script: dict[str, Any]) -> list[dict[str, Any]]:
    """Submit a scripted turn, wait for the end of it and of its workers' turns; the
    catalog events of the session and its workers, in id order, as JSON objects."""
    await gw.submit(sid, {"script": script})
    node = gw.node
    root = node.sessions[sid]
    while any(s.turn is not None for s in root.scope(True)):
        await node.changed()
    await node.wait_durable()
    ids = [s.id for s in root.scope(True)]
    return [json.loads(e.data) for e in await node.store.events_after(ids, 0, 100_000)]


def of(events: list[dict[str, Any]], type_: str, sid: str | None = None) -> list[dict[str, Any]]:
    return [
        e["payload"]
        for e in events
        if e["type"] == type_ and (sid is None or e["session_id"] == sid)
    ]


def outcomes(events: list[dict[str, Any]], sid: str) -> dict[str, list[str]]:
    """Each tool use of ``sid``: the outcomes it got (``completed`` or its error class)."""
    seen: dict[str, list[str]] = {p["tool_use_id"]: [] for p in of(events, "tool.called", sid)}
    for p in of(events, "tool.completed", sid):
        seen[p["tool_use_id"]].append("completed")
    for p in of(events, "tool.failed", sid):
        seen[p["tool_use_id"]].append(p["error_class"])
    return seen


def started(events: list[dict[str, Any]]) -> list[str]:
    """The tool use ids that started a worker (``delegate.started``)."""
    return [p["tool_use_id"] for p in of(events, "delegate.started")]


def workers_of(gw: Harness, sid: str) -> list[Session]:
    return [s for s in gw.node.sessions.values() if s.record.parent_session_id == sid]


# --- per turn ------------------------------------------------------------------------------


async def test_the_65th_tool_use_of_a_turn_fails_limit_and_the_turn_goes_on(
    tmp_path: Path,
) -> None:
    async with gateway(tmp_path) as gw:
        sid = await gw.create_session()
        # 40 then 25 tool uses: the count runs across the turn's rounds.
        script = {"rounds": [[sleep0()] * 40, [sleep0()] * 25, [{"text": "answered"}]]}
        events = await run_turn(gw, sid, script)
        called = [p["tool_use_id"] for p in of(events, "tool.called")]
        assert len(called) == 65
        seen = outcomes(events, sid)
        assert [seen[t] for t in called] == [["completed"]] * 64 + [["limit"]]
        [failed] = [p for p in of(events, "tool.failed")]
        assert failed["tool_use_id"] == called[-1]
        assert "max_tool_uses_per_turn (64)" in failed["message"]
        [done] = of(events, "turn.completed")
        assert done["stop_reason"] == "end_turn"  # the model answered after the refusal
        messages = (await gw.http.get(f"/sessions/{sid}/messages")).json()["messages"]
        assert messages[-1]["content"] == [{"type": "text", "text": "answered"}]
        results = [b for m in messages for b in m["content"] if b["type"] == "tool_result"]
        assert [b["is_error"] for b in results].count(True) == 1  # the model sees why
    # 0 = no limit
    (tmp_path / "unlimited").mkdir()
    async with gateway(tmp_path / "unlimited", **{"limits.max_tool_uses_per_turn": 0}) as gw:
        sid = await gw.create_session()
        events = await run_turn(gw, sid, {"rounds": [[sleep0()] * 70, DONE]})
        assert Counter(o for v in outcomes(events, sid).values() for o in v) == {"completed": 70}


async def test_the_9th_delegate_of_a_turn_fails_limit_and_starts_nothing(tmp_path: Path) -> None:
    async with gateway(tmp_path) as gw:
        sid = await gw.create_session()
        events = await run_turn(gw, sid, {"rounds": [[delegate("hi")] * 9, DONE]})
        seen = outcomes(events, sid)
        assert Counter(o for v in seen.values() for o in v) == {"completed": 8, "limit": 1}
        [failed] = of(events, "tool.failed", sid)
        assert "max_workers_per_turn (8)" in failed["message"]
        assert len(of(events, "delegate.started", sid)) == 8
        assert failed["tool_use_id"] not in started(events)
        assert len(workers_of(gw, sid)) == 8
        # The count is per turn: the next turn may start 8 more.
        events = await run_turn(gw, sid, {"rounds": [[delegate("again")], DONE]})
        assert len(workers_of(gw, sid)) == 9


async def test_delegation_goes_at_most_max_delegate_depth_deep(tmp_path: Path) -> None:
    async with gateway(tmp_path) as gw:
        sid = await gw.create_session()
        depth3 = {"rounds": [[delegate("too deep")], DONE]}  # asked of a worker at depth 2
        depth2 = {"rounds": [[delegate(depth3)], DONE]}
        events = await run_turn(gw, sid, {"rounds": [[delegate(depth2)], DONE]})
        [w1] = workers_of(gw, sid)
        [w2] = workers_of(gw, w1.id)
        assert (w1.depth, w2.depth) == (1, 2)
        assert workers_of(gw, w2.id) == []
        assert len(gw.node.sessions) == 3
        [failed] = of(events, "tool.failed")
        assert events[[e["type"] for e in events].index("tool.failed")]["session_id"] == w2.id
        assert failed["error_class"] == "limit"
        assert "max_delegate_depth is 2" in failed["message"]
        assert of(events, "delegate.started", w2.id) == []
        # the worker's turn went on and answered; so did its ancestors'
        assert [p["stop_reason"] for p in of(events, "turn.completed")] == ["end_turn"] * 3


# --- the key's limits ------------------------------------------------------------------------


async def test_a_worker_counts_against_max_sessions_per_key(tmp_path: Path) -> None:
    overrides = {"limits.max_sessions_per_key": 2}
    async with tenants(tmp_path, **overrides) as (a, b):
        sid = await a.create_session()
        # One session plus its worker fill the key's two; the next delegate is refused.
        events = await run_turn(a, sid, {"rounds": [[delegate("one")], [delegate("two")], DONE]})
        assert len(of(events, "delegate.completed", sid)) == 1
        [failed] = of(events, "tool.failed", sid)
        assert failed["error_class"] == "limit"
        assert "max_sessions_per_key is 2" in failed["message"]
        assert failed["tool_use_id"] not in started(events)
        assert len(workers_of(a, sid)) == 1 and len(a.node.sessions) == 2
        assert of(events, "turn.completed")[-1]["stop_reason"] == "end_turn"
        error = assert_error(await a.http.post("/sessions", json={}), 429, "too_many_sessions")
        assert "max_sessions_per_key is 2" in error["message"]
        await b.create_session()  # another key's count is its own
    async with tenants(tmp_path, **overrides) as (a, _b):  # counted from the store: workers too
        assert a.node.limits.sessions_by_key[key_id("key-a")] == 2
        assert_error(await a.http.post("/sessions", json={}), 429, "too_many_sessions")


async def test_a_workers_turn_counts_against_turns_per_minute_per_key(tmp_path: Path) -> None:
    overrides = {"limits.turns_per_minute_per_key": 2}
    async with tenants(tmp_path, **overrides) as (a, b):
        sid = await a.create_session()
        # The turn (1) and its first worker's turn (2) fill the minute: the second
        # delegate of the same batch is refused, whichever of the two comes first.
        events = await run_turn(a, sid, {"rounds": [[delegate("one"), delegate("two")], DONE]})
        assert len(of(events, "delegate.started", sid)) == 1
        [failed] = of(events, "tool.failed", sid)
        assert failed["error_class"] == "limit"
        assert "turns_per_minute_per_key (2)" in failed["message"]
        assert len(workers_of(a, sid)) == 1  # the refused delegate made no session
        r = await a.http.post(f"/sessions/{sid}/turns", json={"content": "more"})
        assert_error(r, 429, "rate_limited")
        await b.submit(await b.create_session(), "mine")  # B's minute is B's own


# --- the session's size ------------------------------------------------------------------------


BIG = {"chunk_chars": 65536, "rounds": [[{"lorem": 200_000}]]}  # about 1.3 MB of text


async def test_a_session_past_max_session_mb_takes_no_more_turns(tmp_path: Path) -> None:
    overrides = {"limits.max_session_mb": 1}
    async with gateway(tmp_path, **overrides) as gw:
        sid = await gw.create_session()
        small = await gw.create_session()
        await run_turn(gw, sid, {"rounds": [[{"text": "small"}]]})
        assert gw.node.sessions[sid].stored_bytes < MB  # far below: it took the turn
        await run_turn(gw, sid, BIG)
        size = gw.node.sessions[sid].stored_bytes
        assert size > MB
        r = await gw.http.post(f"/sessions/{sid}/turns", json={"content": "one more"})
        error = assert_error(r, 409, "session_too_large")
        assert "max_session_mb is 1" in error["message"]
        assert f"{size / MB:.1f} MB" in error["message"]
        r = await gw.http.post("/agui", json=run_input(sid, "one more"))  # the AG-UI door too
        assert_error(r, 409, "session_too_large")
        # it can still be read, and another session is not concerned
        assert (await gw.http.get(f"/sessions/{sid}")).status_code == 200
        r = await gw.http.get(f"/sessions/{sid}/messages")
        assert r.status_code == 200 and len(r.json()["messages"]) == 4
        await gw.submit(small, "hello")
        # the refused turns were refused: no turn.started for them
        assert gw.node.sessions[sid].record.turn_count == 2
    # Loaded from the store after a restart: its size is read once, and still refused.
    async with gateway(tmp_path, **overrides) as gw:
        r = await gw.http.post(f"/sessions/{sid}/turns", json={"content": "after restart"})
        assert_error(r, 409, "session_too_large")
        loaded = gw.node.sessions[sid]
        assert loaded.stored_bytes > MB
        assert loaded.event_bytes > 0
    async with gateway(tmp_path, **{"limits.max_session_mb": 2}) as gw:  # a higher limit
        await gw.submit(sid, "fits again")


async def test_stored_size_counts_a_rewritten_message_once(tmp_path: Path) -> None:
    """A message written many times (streamed, then complete; a results message that
    grows) counts at its latest size, and events at their wire size."""
    async with gateway(tmp_path) as gw:
        sid = await gw.create_session()
        await run_turn(gw, sid, {"rounds": [[sleep0()] * 5, [{"text": "x" * 5000}]]})
        live = gw.node.sessions[sid]
        node = gw.node
        stored_events = await node.store.events_after([sid], 0, 10_000)
        assert live.event_bytes == sum(len(e.data) for e in stored_events)
        assert live.event_bytes == await node.store.event_bytes(sid)
        messages = await node.store.load_messages(sid)
        assert sorted(live.message_bytes) == sorted(m.message.id for m in messages)
        # each message at its latest size, as SQLite stores it (its JSON), once
        assert live.message_bytes == {
            m.message.id: len(msgspec.json.encode(m.message)) for m in messages
        }


# --- the storm -----------------------------------------------------------------------------------


async def test_a_turn_of_1000_delegates_starts_8_workers(tmp_path: Path) -> None:
    """The adversarial trial's turn: 1,000 ``delegate`` tool uses in one round."""
    async with gateway(tmp_path) as gw:
        sid = await gw.create_session()
        with trio.fail_after(60):
            events = await run_turn(gw, sid, {"rounds": [[delegate("go")] * 1000, DONE]})
        seen = outcomes(events, sid)
        assert len(seen) == 1000
        assert all(len(v) == 1 for v in seen.values())  # every tool use: exactly one outcome
        assert Counter(v[0] for v in seen.values()) == {"completed": 8, "limit": 992}
        assert len(of(events, "delegate.started", sid)) == 8
        assert len(workers_of(gw, sid)) == 8
        assert len(gw.node.sessions) == 9
        messages = (await gw.http.get(f"/sessions/{sid}/messages")).json()["messages"]
        results = [b for m in messages for b in m["content"] if b["type"] == "tool_result"]
        assert len(results) == 1000  # the model sees an answer to each
        assert of(events, "turn.completed", sid)[0]["stop_reason"] == "end_turn"


async def test_the_trials_storm_with_two_sessions_per_key_makes_one_worker(tmp_path: Path) -> None:
    """As reported: ``max_sessions_per_key = 2``, one turn of 1,000 ``delegate`` made
    1,000 sessions. Now the session and one worker fill the key's two."""
    async with tenants(tmp_path, **{"limits.max_sessions_per_key": 2}) as (a, _b):
        sid = await a.create_session()
        with trio.fail_after(60):
            events = await run_turn(a, sid, {"rounds": [[delegate("go")] * 1000, DONE]})
        seen = outcomes(events, sid)
        assert all(len(v) == 1 for v in seen.values()) and len(seen) == 1000
        assert Counter(v[0] for v in seen.values()) == {"completed": 1, "limit": 999}
        assert len(a.node.sessions) == 2
        assert len(started(events)) == 1

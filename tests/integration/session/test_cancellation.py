"""Cancellation (docs/protocol.md §8): each case emits exactly its sequence.

Every test attaches two clients to the session, cancels from one of them (a
``cancel`` frame) or over HTTP, and asserts that both receive the identical
event sequence, matched in full against the contract's row.
"""

from __future__ import annotations

import json
import math
import os
import re
import traceback
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from gateway.protocol.events import Event
from gateway.protocol.frames import ErrorFrame
from tests.conftest import JSON_TYPE, Client, Harness, make_config, running_gateway, types
from tests.scripts import SLOW_TEXT


@asynccontextmanager
async def two_clients(
    gw: Harness, sid: str, **subscribe: Any
) -> AsyncIterator[tuple[Client, Client]]:
    async with gw.client(sid) as a, gw.client(sid) as b:
        await a.subscribe(**subscribe)
        await b.subscribe(**subscribe)
        yield a, b


async def both_until_turn_ends(
    a: Client, b: Client, session_id: str | None = None
) -> tuple[list[Event], list[Event]]:
    """Both clients' events up to the end of the turn (of ``session_id``, if given)."""

    def ends(e: Event) -> bool:
        mine = session_id is None or e.session_id == session_id
        return mine and e.type in ("turn.completed", "turn.cancelled")

    await a.until(ends)
    await b.until(ends)
    return a.events, b.events


def seq(events: list[Event], turn_id: str | None = None) -> str:
    return " ".join(e.type for e in events if turn_id is None or e.turn_id == turn_id)


def assert_identical(a: list[Event], b: list[Event]) -> None:
    """Both clients saw the same events, ids and payloads alike."""
    assert [(e.id, e.type) for e in a] == [(e.id, e.type) for e in b]


async def cancel_frame(client: Client, turn_id: str, reason: str = "user") -> None:
    await client.send({"type": "cancel", "turn_id": turn_id, "reason": reason})


async def test_cancel_during_the_llm_stream(gw: Harness) -> None:
    sid = await gw.create_session()
    async with two_clients(gw, sid) as (a, b):
        turn_id = await gw.submit(sid, SLOW_TEXT)
        with trio.fail_after(10):
            await a.until(lambda e: e.type == "text.delta" and e.payload.text.startswith("sit"))
            await cancel_frame(a, turn_id, "changed my mind")
            ea, eb = await both_until_turn_ends(a, b)
    assert_identical(ea, eb)
    assert re.fullmatch(
        r"turn\.started route\.decided llm\.call_started message\.start text\.start"
        r"( text\.delta)+ text\.end message\.complete llm\.call_failed turn\.cancelled",
        seq(ea),
    ), seq(ea)
    complete, failed, cancelled = (e.payload for e in ea[-3:])
    assert complete.stop_reason == "cancelled"
    streamed = "".join(e.payload.text for e in ea if e.type == "text.delta")
    assert complete.final_content[0].text == streamed
    assert failed.error_class == "cancelled" and failed.message_id == complete.message_id
    assert (cancelled.reason, cancelled.phase, cancelled.partial) == (
        "changed my mind",
        "llm",
        True,
    )
    # stored as cancelled, and the turn lock is released at once
    r = await gw.http.get(f"/sessions/{sid}/messages")
    assert r.json()["messages"][-1]["status"] == "cancelled"
    r = await gw.http.post(f"/sessions/{sid}/turns", json={"content": "next"})
    assert r.status_code == 202


async def test_cancel_mid_tool_block_closes_it_with_the_input_that_parses(gw: Harness) -> None:
    script = {
        "script": {
            "delay_ms": 5,
            "rounds": [
                [
                    {"text": "Let me run it."},
                    {"tool_use": {"name": "sleep", "input": {"seconds": 1, "note": "x" * 400}}},
                ]
            ],
        }
    }
    sid = await gw.create_session()
    async with two_clients(gw, sid) as (a, b):
        turn_id = await gw.submit(sid, script)
        with trio.fail_after(10):
            n = 0

            def tenth_input_delta(e: Event) -> bool:
                nonlocal n
                n += e.type == "tool.use_input_delta"
                return n == 10

            await a.until(tenth_input_delta)
            await cancel_frame(a, turn_id)
            ea, eb = await both_until_turn_ends(a, b)
    assert_identical(ea, eb)
    assert re.fullmatch(
        r".* text\.end tool\.use_start( tool\.use_input_delta)+ tool\.use_end"
        r" message\.complete llm\.call_failed turn\.cancelled",
        seq(ea),
    ), seq(ea)
    assert "tool.failed" not in seq(ea) and "tool.called" not in seq(ea)
    end = next(e.payload for e in ea if e.type == "tool.use_end")
    # the note was cut mid-string: what parses, with the string closed where it was cut
    assert end.final_input["seconds"] == 1
    assert 0 < len(end.final_input["note"]) < 400 and set(end.final_input["note"]) == {"x"}
    complete = ea[-3].payload
    assert complete.final_content[1].input == end.final_input


async def test_cancel_during_the_second_llm_call_of_a_tool_loop(gw: Harness) -> None:
    script = {
        "script": {
            "delay_ms": 3,
            "rounds": [
                [{"tool_use": {"name": "sleep", "input": {"seconds": 0.01}}}],
                [{"lorem": 400}],
            ],
        }
    }
    sid = await gw.create_session()
    async with two_clients(gw, sid) as (a, b):
        turn_id = await gw.submit(sid, script)
        with trio.fail_after(10):
            await a.until(lambda e: e.type == "text.delta")
            r = await gw.http.post(
                f"/sessions/{sid}/turns/{turn_id}/cancel", json={"reason": "stop"}
            )
            assert r.status_code == 202
            ea, eb = await both_until_turn_ends(a, b)
    assert_identical(ea, eb)
    assert re.fullmatch(
        r"turn\.started route\.decided llm\.call_started message\.start tool\.use_start"
        r"( tool\.use_input_delta)+ tool\.use_end message\.complete llm\.call_completed"
        r" tool\.called tool\.completed llm\.call_started message\.start text\.start"
        r"( text\.delta)+ text\.end message\.complete llm\.call_failed turn\.cancelled",
        seq(ea),
    ), seq(ea)
    assert ea[-1].payload.phase == "llm" and ea[-1].payload.reason == "stop"


async def test_cancel_while_tools_run(gw: Harness) -> None:
    script = {
        "script": {
            "rounds": [
                [
                    {"tool_use": {"name": "sleep", "input": {"seconds": 30}}},
                    {"tool_use": {"name": "sleep", "input": {"seconds": 40}}},
                ],
                [{"text": "never"}],
            ]
        }
    }
    sid = await gw.create_session()
    async with two_clients(gw, sid) as (a, b):
        turn_id = await gw.submit(sid, script)
        with trio.fail_after(10):
            await a.until(lambda e: e.type == "tool.called")
            await a.until(lambda e: e.type == "tool.called")
            await cancel_frame(b, turn_id)
            ea, eb = await both_until_turn_ends(a, b)
    assert_identical(ea, eb)
    assert seq(ea).endswith(
        "message.complete llm.call_completed tool.called tool.called"
        " tool.failed tool.failed turn.cancelled"
    ), seq(ea)
    assert seq(ea).count("message.complete") == 1 and "llm.call_failed" not in seq(ea)
    assert {e.payload.error_class for e in ea if e.type == "tool.failed"} == {"cancelled"}
    assert ea[-1].payload.phase == "tools"
    r = await gw.http.get(f"/sessions/{sid}/messages")
    results = r.json()["messages"][-1]["content"]
    assert [(x["type"], x["is_error"]) for x in results] == [("tool_result", True)] * 2


async def test_cancel_at_the_seam_while_a_tool_waits_for_permission(tmp_path: Path) -> None:
    config = make_config(tmp_path, **{"tools.require_approval": ["sleep"]})
    script = {"script": {"rounds": [[{"tool_use": {"name": "sleep", "input": {"seconds": 1}}}]]}}
    with trio.fail_after(10):
        async with running_gateway(config) as gw:
            sid = await gw.create_session()
            async with two_clients(gw, sid) as (a, b):
                turn_id = await gw.submit(sid, script)
                asked = (await a.until(lambda e: e.type == "permission.requested"))[-1]
                await cancel_frame(a, turn_id)
                ea, eb = await both_until_turn_ends(a, b)
            # the permission can no longer be granted
            perm_id = asked.payload.perm_id
            r = await gw.http.post(
                f"/sessions/{sid}/permissions/{perm_id}", json={"decision": "allow"}
            )
            assert r.status_code == 409
    assert_identical(ea, eb)
    assert seq(ea).endswith(
        "llm.call_completed tool.called permission.requested permission.resolved tool.failed"
        " turn.cancelled"
    ), seq(ea)
    # The cancel resolved the request (docs/protocol.md §5), right before its tool.failed.
    resolved = ea[-3].payload
    assert (resolved.perm_id, resolved.decision) == (perm_id, "cancelled")
    failed = ea[-2].payload
    assert (failed.error_class, failed.tool_name) == ("cancelled", "sleep")
    assert ea[-1].payload.phase == "seam"


async def test_a_turn_timeout_cancels_with_reason_timeout(tmp_path: Path) -> None:
    config = make_config(tmp_path, **{"turns.timeout_s": 0.3})
    script = {"script": {"rounds": [[{"tool_use": {"name": "sleep", "input": {"seconds": 30}}}]]}}
    with trio.fail_after(10):
        async with running_gateway(config) as gw:
            sid = await gw.create_session()
            async with two_clients(gw, sid) as (a, b):
                await gw.submit(sid, script)
                ea, eb = await both_until_turn_ends(a, b)
    assert_identical(ea, eb)
    assert seq(ea).endswith("tool.called tool.failed turn.cancelled")
    assert (ea[-1].payload.reason, ea[-1].payload.phase) == ("timeout", "tools")


async def test_a_running_delegate_is_cancelled_in_the_worker_first(gw: Harness) -> None:
    task = json.dumps(
        {"script": {"rounds": [[{"tool_use": {"name": "sleep", "input": {"seconds": 30}}}]]}}
    )
    script = {"script": {"rounds": [[{"tool_use": {"name": "delegate", "input": {"task": task}}}]]}}
    sid = await gw.create_session()
    workers = {"filter": {"event_types": None, "actors": None, "include_worker_sessions": True}}
    async with two_clients(gw, sid, **workers) as (a, b):
        turn_id = await gw.submit(sid, script)
        with trio.fail_after(10):
            started = (await a.until(lambda e: e.type == "delegate.started"))[-1]
            worker_id = started.payload.worker_session_id
            await a.until(lambda e: e.session_id == worker_id and e.type == "tool.called")
            await cancel_frame(a, turn_id)
            ea, eb = await both_until_turn_ends(a, b, sid)
    assert_identical(ea, eb)
    worker = [e for e in ea if e.session_id == worker_id]
    parent = [e for e in ea if e.session_id == sid]
    assert seq(worker).endswith("tool.called tool.failed turn.cancelled")
    assert worker[-1].payload.phase == "tools"
    assert seq(parent).endswith(
        "tool.called delegate.started delegate.failed tool.failed turn.cancelled"
    ), seq(parent)
    # order across streams: the worker's cancellation comes before the parent's delegate.failed
    worker_done = next(e.id for e in ea if e.session_id == worker_id and e.type == "turn.cancelled")
    delegate_failed = next(e for e in ea if e.type == "delegate.failed")
    assert worker_done < delegate_failed.id
    assert delegate_failed.payload.failure_mode == "cancelled_by_user"
    # without include_worker_sessions the parent's stream has none of the worker's events
    async with gw.client(sid) as c:
        await c.subscribe(since=ea[0].id)
        replayed = await c.until(lambda e: e.type == "turn.cancelled" and e.session_id == sid)
    assert {e.session_id for e in replayed} == {sid}


async def test_delegate_returns_the_workers_final_text(gw: Harness) -> None:
    script = {
        "script": {
            "rounds": [
                [{"tool_use": {"name": "delegate", "input": {"task": "summarise the notes"}}}],
                [{"text": "thanks"}],
            ]
        }
    }
    sid = await gw.create_session()
    async with gw.client(sid) as a:
        await a.subscribe()
        await gw.submit(sid, script)
        with trio.fail_after(10):
            events = await a.until_turn_ends()
    completed = next(e.payload for e in events if e.type == "delegate.completed")
    assert completed.result == "You said: summarise the notes"
    tool = next(e.payload for e in events if e.type == "tool.completed")
    assert tool.result == "You said: summarise the notes"
    # the worker is a session of its own, attachable directly
    r = await gw.http.get(f"/sessions/{completed.worker_session_id}")
    assert r.status_code == 200
    async with gw.client(completed.worker_session_id) as w:
        await w.subscribe(snapshot=True)
        snap = await w.recv()
        assert snap.session.parent_session_id == sid
        assert [m.role for m in snap.messages] == ["user", "assistant"]


async def test_second_cancel_is_a_no_op_with_a_warning_and_bad_cancels_are_errors(
    gw: Harness,
) -> None:
    sid = await gw.create_session()
    script = {"script": {"rounds": [[{"tool_use": {"name": "sleep", "input": {"seconds": 30}}}]]}}
    async with two_clients(gw, sid) as (a, b):
        turn_id = await gw.submit(sid, script)
        with trio.fail_after(10):
            await a.until(lambda e: e.type == "tool.called")
            await cancel_frame(a, "turn_nope")
            error = await a.recv()
            while not isinstance(error, ErrorFrame):
                error = await a.recv()
            assert error.code == "turn_not_found"
            # Two cancels in one step (the path the frame and the HTTP route
            # take): the second finds the turn cancelling and is a no-op.
            session = gw.node.sessions[sid]
            session.cancel_turn(turn_id, "first", "test-a")
            session.cancel_turn(turn_id, "second", "test-b")
            ea, _ = await both_until_turn_ends(a, b)
            assert seq(ea).count("turn.cancelled") == 1
            # cancels of a finished turn
            r = await gw.http.post(f"/sessions/{sid}/turns/{turn_id}/cancel", headers=JSON_TYPE)
            assert (r.status_code, r.json()["error"]["code"]) == (409, "turn_not_in_flight")
            r = await gw.http.post(f"/sessions/{sid}/turns/turn_nope/cancel", headers=JSON_TYPE)
            assert (r.status_code, r.json()["error"]["code"]) == (404, "turn_not_found")
            await cancel_frame(b, turn_id)
            error = await b.recv()
            assert isinstance(error, ErrorFrame) and error.code == "turn_not_in_flight"
    [warning] = [e for e in ea if e.type == "bus.handler_warning"]
    assert (warning.payload.subscription_name, warning.payload.reason) == (
        "test-b",
        "cancel_ignored",
    )
    assert ea[-1].payload.reason == "first"


async def test_permission_allow_deny_and_timeout(tmp_path: Path) -> None:
    config = make_config(
        tmp_path, **{"tools.require_approval": ["sleep"], "tools.approval_timeout_s": 0.3}
    )
    script = {
        "script": {
            "rounds": [
                [
                    {"tool_use": {"name": "sleep", "input": {"seconds": 0.01}}},
                    {"tool_use": {"name": "sleep", "input": {"seconds": 0.02}}},
                    {"tool_use": {"name": "sleep", "input": {"seconds": 0.03}}},
                ],
                [{"text": "done"}],
            ]
        }
    }
    with trio.fail_after(10):
        async with running_gateway(config) as gw:
            sid = await gw.create_session()
            async with gw.client(sid) as a:
                await a.subscribe()
                await gw.submit(sid, script)
                asks = []
                while len(asks) < 3:
                    asks += [e for e in await a.until(lambda e: e.type == "permission.requested")][
                        -1:
                    ]
                first, second, _third = (e.payload for e in asks)
                r = await gw.http.post(
                    f"/sessions/{sid}/permissions/{first.perm_id}", json={"decision": "allow"}
                )
                assert r.status_code == 202
                r = await gw.http.post(
                    f"/sessions/{sid}/permissions/{second.perm_id}", json={"decision": "deny"}
                )
                assert r.status_code == 202
                r = await gw.http.post(
                    f"/sessions/{sid}/permissions/{second.perm_id}", json={"decision": "allow"}
                )
                assert r.status_code == 409
                r = await gw.http.post(
                    f"/sessions/{sid}/permissions/perm_nope", json={"decision": "allow"}
                )
                assert r.status_code == 404
                events = await a.until_turn_ends()
    resolved = {
        e.payload.perm_id: e.payload.decision for e in a.events if e.type == "permission.resolved"
    }
    assert sorted(resolved.values()) == ["allow", "deny", "timeout"]
    outcomes = {
        e.payload.tool_use_id: (e.type, getattr(e.payload, "error_class", None))
        for e in a.events
        if e.type in ("tool.completed", "tool.failed")
    }
    assert outcomes[first.tool_use_id] == ("tool.completed", None)
    assert outcomes[second.tool_use_id] == ("tool.failed", "permission_denied")
    assert outcomes[_third.tool_use_id] == ("tool.failed", "permission_denied")
    assert events[-1].type == "turn.completed"
    assert "expires_at" in json.dumps(msgspec_builtins(first))


def msgspec_builtins(obj: Any) -> Any:
    import msgspec

    return msgspec.to_builtins(obj)


__all__ = ["types"]


async def test_cancel_kills_a_shell_commands_whole_process_tree(tmp_path: Path) -> None:
    from tests.unit.tools.test_shell_tool import _assert_group_gone, _live_members, _read_pgid

    workspace = tmp_path / "ws"
    workspace.mkdir()
    os.mkfifo(workspace / "ready")
    config = make_config(
        tmp_path,
        **{
            "tools.enabled": ["shell"],
            "tools.kill_grace_s": 0.5,
            "sessions.allowed_workspaces": [str(workspace)],
        },
    )
    command = "sleep 100 & (trap '' TERM; sleep 100) & echo $$ > ready; wait"
    script = {
        "script": {"rounds": [[{"tool_use": {"name": "shell", "input": {"command": command}}}]]}
    }
    with trio.fail_after(10):
        async with running_gateway(config) as gw:
            sid = await gw.create_session(workspace_path=str(workspace))
            async with two_clients(gw, sid) as (a, b):
                turn_id = await gw.submit(sid, script)
                pgid = await _read_pgid(workspace / "ready")
                assert len(_live_members(pgid)) == 3  # the shell and both sleepers
                await cancel_frame(a, turn_id)
                ea, eb = await both_until_turn_ends(a, b)
            await _assert_group_gone(pgid)  # the one ignoring SIGTERM got SIGKILL
    assert_identical(ea, eb)
    assert seq(ea).endswith("tool.called tool.failed turn.cancelled")
    failed = ea[-2].payload
    assert (failed.tool_name, failed.error_class) == ("shell", "cancelled")
    assert failed.duration_ms is not None


# The hard-cancel test's turn streams a word every 10 ms for 120 s: whatever
# waits on that turn shows as a teardown that takes minutes, not milliseconds.
LONG_TURN = {"script": {"delay_ms": 10, "rounds": [[{"lorem": 12_000}]]}}
LONG_TURN_S = 120.0
PROMPT_S = 10.0  # a failure cap only: the teardown takes some milliseconds


def live_tasks() -> list[trio.lowlevel.Task]:
    """Every task of this run: the root task's children, recursively."""
    found: list[trio.lowlevel.Task] = []
    pending = [trio.lowlevel.current_root_task()]
    while pending:
        task = pending.pop()
        for nursery in task.child_nurseries:
            found += nursery.child_tasks
            pending += nursery.child_tasks
    return found


GATEWAY_TASKS = ("session ", "agent-loop ", "translator ", "ws")


def gateway_task_names() -> list[str]:
    return sorted(t.name for t in live_tasks() if t.name.startswith(GATEWAY_TASKS))


async def test_a_hard_cancel_mid_stream_ends_promptly(tmp_path: Path) -> None:
    """A crash around a streaming turn tears everything down at once.

    The crash is the test's own ``RuntimeError`` escaping the gateway's nursery
    while a turn streams. Teardown is cancellation, not a graceful shutdown:
    it must not wait for the turn (about two minutes of script left) nor for
    any grace (set to as long here, so a wait on one shows too), no task of the
    gateway may outlive the nursery, and the one exception that comes out is
    the crash itself: nothing raised while tearing down is added to it.

    No cap is put around the teardown: only a shield could make it wait past
    the cancellation, and no cap cuts through a shield. The turn's own length
    bounds the wait instead, and the elapsed time is asserted afterwards.
    """
    config = make_config(
        tmp_path,
        **{"server.shutdown_grace_s": LONG_TURN_S, "stream.close_grace_s": LONG_TURN_S},
    )
    before = set(live_tasks())
    boom = RuntimeError("boom")
    crashed_at: float | None = None
    with pytest.raises(BaseExceptionGroup) as raised:
        async with running_gateway(config) as gw:
            with trio.fail_after(10):  # the setup's cap; the crash leaves this scope
                sid = await gw.create_session()
                async with gw.client(sid) as a:
                    await a.subscribe()
                    await gw.submit(sid, LONG_TURN)
                    await a.until(lambda e: e.type == "text.delta")
                    await a.until(lambda e: e.type == "text.delta")
                    # the walk below sees the gateway's tasks, so it is no vacuous check
                    running = gateway_task_names()
                    assert any(n.startswith("session ") for n in running), running
                    assert any(n.startswith("agent-loop ") for n in running), running
                    assert any(n.startswith("translator ") for n in running), running
                    crashed_at = trio.current_time()
                    raise boom
    elapsed = trio.current_time() - crashed_at if crashed_at is not None else math.inf

    # the crash, and nothing else: no error of the teardown rides along with it
    group = raised.value
    assert group.exceptions == (boom,), "".join(traceback.format_exception(group))
    # promptly: long before the turn could have finished, or any grace run out
    assert elapsed < PROMPT_S, f"teardown took {elapsed:.1f} s"
    # no task of the gateway outlives its nursery
    assert gateway_task_names() == []
    left = [t.name for t in set(live_tasks()) - before]
    assert left == [], left

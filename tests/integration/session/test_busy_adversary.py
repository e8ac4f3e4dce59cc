"""A busy session, adversarially (docs/protocol.md §2 "A busy session"): slow peers, crashes,
shutdowns, small frames, and what the contract promises at each.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import AsyncGenerator
from contextlib import aclosing
from pathlib import Path
from typing import Any, cast

import msgspec
import pytest
import trio
import trio.testing

from gateway.errors import Refused, StoreError
from gateway.ids import format_event_id, message_id_of
from gateway.protocol.fit import fit_snapshot
from gateway.protocol.frames import SubscribeAck
from gateway.protocol.shapes import Message, QueuedTurnInfo, TextBlock
from tests.aisdk_support import UiMessage, read, read_until, request, user
from tests.aisdk_support import gateway as aisdk_gateway
from tests.conftest import Harness, make_config, running_gateway
from tests.integration.doors.agui.test_agui_http import agui, run_input
from tests.integration.doors.agui.test_agui_http import gateway as agui_gateway
from tests.integration.session.test_busy import Gated, _last_text, post, until_started
from tests.integration.session.test_snapshot_cap import CAP, _snapshot, snapshot_of
from tests.integration.session.test_snapshot_cap import summary as cap_summary
from tests.integration.store.test_restart import crash_copy
from tests.integration.store.test_store_file import (
    NAP,
    TEXT_SCRIPT,
    node_on,
    record,
    refused,
    remove_store,
    user_message,
)
from tests.scripts import LONG_NAP, TEXT

# A shell that ignores SIGTERM: its turn takes [tools] kill_grace_s to close (section 8).
STUBBORN = {
    "script": {
        "rounds": [
            [{"tool_use": {"name": "shell", "input": {"command": "trap '' TERM; sleep 30"}}}]
        ]
    }
}


def slow_cancel_config(path: Path, **overrides: Any) -> Any:
    return make_config(
        path,
        **{
            "tools.enabled": ["shell"],
            "tools.kill_grace_s": 2.5,
            "store.commit_timeout_s": 1.0,
            **overrides,
        },
    )


async def test_an_interrupt_is_never_answered_202_before_its_turn_is_durable(
    tmp_path: Path,
) -> None:
    """The running turn takes longer to close than commit_timeout_s: the interrupting
    turn has not started when the request gives up waiting. A 202 then would be for
    a turn that is nowhere in the store (a kill -9 loses it): it is refused (409
    ``turn_in_progress``), and nothing of it starts later."""
    live = tmp_path / "live"
    live.mkdir()
    async with running_gateway(slow_cancel_config(live), Gated()) as gw:
        sid = await gw.create_session()
        async with gw.client(sid) as client:
            await client.subscribe()
            _, first = await post(gw, sid, json.dumps(STUBBORN))
            with trio.fail_after(10):
                await client.until(lambda e: e.type == "tool.called")
            await trio.sleep(0.5)  # the shell is running its trap
            status, body = await post(gw, sid, "B", if_busy="interrupt")
            crash_copy(str(live / "gateway.db"), str(tmp_path / "gateway.db"))
            with trio.fail_after(10):
                await client.until(lambda e: e.type == "turn.cancelled")
            await trio.sleep(0.3)  # a withdrawn turn would have started by now
    a = first["turn_id"]
    started = [e.turn_id for e in client.events if e.type == "turn.started"]
    if status == 202:  # then it must be durable: the crash copy runs it after a restart
        restarted = running_gateway(make_config(tmp_path), Gated())
        async with restarted as gw2, gw2.client(sid) as again:
            ack = await again.subscribe(since=format_event_id(0))
            assert isinstance(ack, SubscribeAck), ack
            with trio.fail_after(10):
                await again.until(
                    lambda e: e.type == "turn.started" and e.turn_id == body["turn_id"]
                )
    else:
        assert status == 409 and body["error"]["code"] == "turn_in_progress", body
        assert "still closing" in body["error"]["message"]
        assert started == [a]  # the refused turn never starts
    [cancelled] = [e for e in client.events if e.type == "turn.cancelled"]
    assert (cancelled.turn_id, cancelled.payload.reason) == (a, "interrupted")


async def test_queued_turns_wait_through_a_graceful_shutdown_and_run_once_after(
    tmp_path: Path,
) -> None:
    provider = Gated()
    async with running_gateway(make_config(tmp_path), provider) as gw:
        sid = await gw.create_session()
        assert (await post(gw, sid, "hold A"))[0] == 202
        await provider.holding.wait()
        queued = [(await post(gw, sid, t, if_busy="queue"))[1]["turn_id"] for t in ("B", "C")]
    # The shutdown cancelled A; neither queued turn started, nor called the model.
    assert [_last_text(r) for r in provider.requests] == ["hold A"]
    again = Gated()
    async with running_gateway(make_config(tmp_path), again) as gw, gw.client(sid) as client:
        ack = await client.subscribe(since=format_event_id(0))
        assert isinstance(ack, SubscribeAck), ack
        with trio.fail_after(20):
            while sum(e.type == "turn.completed" for e in client.events) < 2:
                await client.recv()
    kinds = [(e.type, e.turn_id) for e in client.events if e.type.startswith("turn.")]
    a = kinds[0][1]
    assert kinds == [
        ("turn.started", a),
        ("turn.queued", queued[0]),
        ("turn.queued", queued[1]),
        ("turn.cancelled", a),
        ("turn.started", queued[0]),
        ("turn.completed", queued[0]),
        ("turn.started", queued[1]),
        ("turn.completed", queued[1]),
    ]
    assert [_last_text(r) for r in again.requests] == ["B", "C"]


async def test_a_steer_survives_a_crash_and_runs_once_as_a_queued_turn(tmp_path: Path) -> None:
    provider = Gated()
    live = tmp_path / "live"
    live.mkdir()
    async with running_gateway(make_config(live), provider) as gw:
        sid = await gw.create_session()
        _, first = await post(gw, sid, "hold A")
        await provider.holding.wait()
        status, body = await post(gw, sid, "steered", if_busy="steer")
        crash_copy(str(live / "gateway.db"), str(tmp_path / "gateway.db"))
        provider.let_go()
    assert (status, body) == (202, {"turn_id": first["turn_id"], "steered": True})
    again = Gated()
    async with running_gateway(make_config(tmp_path), again) as gw, gw.client(sid) as client:
        ack = await client.subscribe(since=format_event_id(0))
        assert isinstance(ack, SubscribeAck), ack
        with trio.fail_after(20):
            await client.until(lambda e: e.type == "turn.completed")
        await trio.sleep(0.2)
        messages = (await gw.http.get(f"/sessions/{sid}/messages")).json()["messages"]
    kinds = [e.type for e in client.events if e.type.startswith("turn.")]
    assert kinds == [
        "turn.started",
        "turn.cancelled",
        "turn.queued",
        "turn.started",
        "turn.completed",
    ]
    [queued] = [e for e in client.events if e.type == "turn.queued"]
    assert queued.payload.user_message.content == [TextBlock("steered")]
    assert [_last_text(r) for r in again.requests] == ["steered"]
    users = [m["content"][0]["text"] for m in messages if m["role"] == "user"]
    assert users == ["hold A", "steered"]


async def test_an_interrupt_waiting_when_shutdown_begins_is_refused_503_at_once(
    tmp_path: Path,
) -> None:
    """The running turn closes during a shutdown: the interrupting turn does not start
    then (nothing starts once shutdown began), and its request is told so at once, not
    left waiting until the connections are dropped."""
    config = slow_cancel_config(tmp_path, **{"store.commit_timeout_s": 10.0})
    answer: dict[str, Any] = {}
    async with running_gateway(config, Gated()) as gw:
        sid = await gw.create_session()
        async with gw.client(sid) as client:
            await client.subscribe()
            await post(gw, sid, json.dumps(STUBBORN))
            with trio.fail_after(10):
                await client.until(lambda e: e.type == "tool.called")
            await trio.sleep(0.5)  # the shell is running its trap

            async def interrupt() -> None:
                answer["at"] = trio.current_time()
                answer["status"], answer["body"] = await post(gw, sid, "B", if_busy="interrupt")
                answer["took"] = trio.current_time() - answer["at"]

            async with trio.open_nursery() as nursery:
                nursery.start_soon(interrupt)
                await trio.sleep(0.3)
                gw.gateway.shutdown()
    assert answer["status"] == 503, answer
    assert answer["body"]["error"]["code"] == "shutting_down"
    assert answer["took"] < 5  # when the running turn closed (kill_grace_s), not at the drop


async def test_a_snapshot_with_large_queued_turns_still_fits_snapshot_max_bytes(
    tmp_path: Path,
) -> None:
    """Each queued turn's user message rides in the snapshot's summary (``queued_turns``):
    a few large ones (each within max_body_bytes) must not push the frame past the cap
    a client's frame limit is set to (docs/protocol.md §15: close 1009 otherwise)."""
    provider = Gated()
    config = make_config(tmp_path, **{"stream.snapshot_max_bytes": CAP})
    async with running_gateway(config, provider) as gw:
        sid = await gw.create_session()
        assert (await post(gw, sid, "hold A"))[0] == 202
        await provider.holding.wait()
        big = [("x" if i else "y") * 40_000 for i in range(2)]
        answers = [await post(gw, sid, text, if_busy="queue") for text in big]
        assert [s for s, _ in answers] == [202, 202]
        data, frame = await snapshot_of(gw, sid)
        provider.let_go()
    assert len(data) <= CAP
    queued = frame.session.queued_turns
    assert not isinstance(queued, msgspec.UnsetType)
    assert [q.turn_id for q in queued] == [a["turn_id"] for _, a in answers]
    assert [q.position for q in queued] == [1, 2]
    # Cut, marked truncated, and whole in turn.queued / GET .../messages once it started.
    cut = [b for q in queued for b in q.user_message.content]
    assert any(isinstance(b, TextBlock) and b.truncated is True for b in cut)


def test_fit_snapshot_cuts_queued_turns_to_fit() -> None:
    queued = [QueuedTurnInfo(f"turn_{i}", i + 1, user_turn(i, 30_000 + i)) for i in range(8)]
    session = msgspec.structs.replace(cap_summary(), queued_turns=queued)
    history = [user_turn(100, 500)]
    data = fit_snapshot(session, history, "evt_9", limit=50, max_bytes=CAP)
    assert len(data) <= CAP
    frame = _snapshot.decode(data)
    assert not isinstance(frame.session.queued_turns, msgspec.UnsetType)
    assert [q.turn_id for q in frame.session.queued_turns] == [q.turn_id for q in queued]
    # Small enough: untouched.
    few = msgspec.structs.replace(
        cap_summary(), queued_turns=[QueuedTurnInfo("t", 1, user_turn(1, 10))]
    )
    assert (
        _snapshot.decode(fit_snapshot(few, history, None, limit=50, max_bytes=CAP)).session == few
    )


def user_turn(n: int, size: int) -> Message:
    return Message(
        f"msg_{n}", "sess_1", f"turn_{n}", "user", [TextBlock("q" * size)], "complete", 1
    )


async def test_an_ai_sdk_send_repeated_while_queued_is_that_turn_not_a_second_one(
    tmp_path: Path,
) -> None:
    """docs/doors/aisdk.md: a repeated request (same chat, same message) is that turn, never
    run twice. With ``[turns] if_busy = "queue"`` the first send of it was queued: its
    message is in no history yet, and a second turn with the same message id was queued."""
    async with aisdk_gateway(tmp_path, **{"turns.if_busy": "queue"}) as h:
        chat_id = f"chat-{uuid.uuid4()}"
        first, second = user(LONG_NAP), user(TEXT)
        async with h.http.stream("POST", "/ai-sdk/chat", json=request(chat_id, first)) as r:
            m = UiMessage()
            lines = cast(AsyncGenerator[str, None], r.aiter_lines())
            async with aclosing(lines):
                await read_until(
                    lines, m, lambda: any(p["type"] == "dynamic-tool" for p in m.parts)
                )
                body = request(chat_id, first, second)
                async with h.http.stream("POST", "/ai-sdk/chat", json=body) as dropped:
                    assert dropped.status_code == 200  # queued; the client loses it
                async with h.http.stream("POST", "/ai-sdk/chat", json=body) as again:
                    assert again.status_code == 200
                    r2 = await h.http.post(f"/ai-sdk/chat/{chat_id}/stop", json={})
                    assert r2.status_code == 202
                    answered = await read(again)
                await read_until(lines, m, lambda: False)
        assert answered.text == "Hello there, friend."
        await trio.sleep(0.3)  # a second queued turn would run now
        messages = (await h.http.get(f"/sessions/{chat_id}/messages")).json()["messages"]
    users = [x for x in messages if x["role"] == "user" and x["content"][0]["type"] == "text"]
    assert len(users) == 2, users
    assert len({x["turn_id"] for x in messages}) == 2
    assert len([x for x in messages if x["role"] == "assistant"]) == 2


async def test_an_agui_run_posted_twice_while_queued_never_shares_a_message_id(
    tmp_path: Path,
) -> None:
    """An AG-UI run's user message id is derived from its run id; a run id sent again gets
    a fresh one when the thread has it (docs/doors/agui.md). A queued run's message is in
    no history yet: the second turn must not take the same message id (it replaced the
    first turn's user message in the conversation)."""
    async with agui_gateway(tmp_path, **{"turns.if_busy": "queue"}) as h:
        thread = await h.create_session()
        async with agui(h, run_input(thread, LONG_NAP)) as first:
            await first.until("TOOL_CALL_START")
            again = run_input(thread, TEXT)
            async with agui(h, again) as one, agui(h, again) as two:
                await one.until("RUN_STARTED")
                await two.until("RUN_STARTED")
                await h.http.post(f"/agui/{thread}/cancel", json={})
                await one.rest()
                await two.rest()
            await first.rest()
        messages = (await h.http.get(f"/sessions/{thread}/messages")).json()["messages"]
    users = [m for m in messages if m["role"] == "user" and m["content"][0]["type"] == "text"]
    assert len({m["id"] for m in users}) == len(users)
    turns = {m["turn_id"] for m in messages}
    assert all(any(u["turn_id"] == t for u in users) for t in turns), "a turn lost its user message"


async def test_a_busy_session_takes_a_message_id_once(tmp_path: Path) -> None:
    """Two requests of a door that derives the message id from the client's (AI SDK, AG-UI)
    race past its look-up: the second turn with the same message id is refused, whatever
    if_busy says (a second turn of it would replace the first's message where it starts)."""
    provider = Gated()
    async with running_gateway(make_config(tmp_path), provider) as gw:
        sid = await gw.create_session()
        _, first = await post(gw, sid, "hold A")
        await provider.holding.wait()
        session = gw.node.sessions[sid]
        outcomes: dict[str, list[str]] = {}
        for mode in ("queue", "steer"):
            text = [TextBlock(mode)]
            message = Message(f"msg_same_{mode}", sid, None, "user", text, "complete", 1)
            for _ in range(2):
                try:
                    await gw.node.submit_turn(session, message, mode, None)  # type: ignore[arg-type]
                    outcomes.setdefault(mode, []).append("taken")
                except Refused as exc:
                    outcomes.setdefault(mode, []).append(exc.code)
        again = Message(
            message_id_of(first["turn_id"]), sid, None, "user", [TextBlock("x")], "complete", 1
        )
        with pytest.raises(Refused) as refused:
            await gw.node.submit_turn(session, again, "queue", None)
        provider.let_go()
    assert outcomes == {
        "queue": ["taken", "turn_in_progress"],
        "steer": ["taken", "turn_in_progress"],
    }
    assert refused.value.code == "turn_in_progress"  # the running turn's own message


async def test_queued_turns_do_not_start_once_the_store_refuses_writes(
    tmp_path: Path,
    autojump_clock: trio.testing.MockClock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The store's file is gone: the running turn is cancelled (store_unavailable), and the
    queued turns wait (docs/protocol.md §15: nothing more is written), not started one
    after the other, each failing at its first commit as a gateway bug."""
    async with node_on(tmp_path) as node:
        session = await node.create_session()
        turn = session.submit_turn(user_message(session, NAP))
        await session.accepted(turn)
        with trio.fail_after(5):
            while turn.phase != "tools":  # noqa: ASYNC110 (a phase, no event to wait on)
                await trio.sleep(0.01)
        for _ in range(2):
            await node.submit_turn(session, user_message(session, TEXT_SCRIPT), "queue", None)
        remove_store(tmp_path / "gateway.db")
        node.store.put_session(record("sess_new"))
        with contextlib.suppress(Refused):
            await node.durable_or_503()
        with trio.fail_after(1):
            await turn.done.wait()
        await trio.sleep(1)
        assert session.turn is None
        assert len(session.record.queued_turns) == 2
        # And the session answers as the store does, not 409 (docs/protocol.md §15).
        for mode in ("reject", "queue"):
            message = user_message(session, TEXT_SCRIPT)
            code, _ = await refused(node.submit_turn(session, message, mode, None))  # type: ignore[arg-type]
            assert code == "store_unavailable", mode
    assert not [r for r in caplog.records if getattr(r, "event", None) == "session_failed"]


async def test_turns_per_minute_counts_accepted_queued_turns_and_refunds_refused_ones(
    tmp_path: Path,
) -> None:
    """docs/protocol.md §2: a queued turn counts at its 202, a refused one (409 queue_full)
    does not (given back), and a cancelled queued turn stays counted; the rate is
    checked first (section 15)."""
    provider = Gated()
    overrides = {"limits.turns_per_minute_per_key": 3, "turns.max_queued": 1}
    async with running_gateway(make_config(tmp_path, **overrides), provider) as gw:
        sid = await gw.create_session()
        assert (await post(gw, sid, "hold A"))[0] == 202  # 1
        await provider.holding.wait()
        status, q1 = await post(gw, sid, "Q1", if_busy="queue")  # 2
        full = [await post(gw, sid, f"F{i}", if_busy="queue") for i in range(3)]  # refunded
        cancel = await gw.http.post(f"/sessions/{sid}/turns/{q1['turn_id']}/cancel", json={})
        q2 = await post(gw, sid, "Q2", if_busy="queue")  # 3
        over = await post(gw, sid, "Q3", if_busy="queue")  # the rate is used up: 429 first
        provider.let_go()
    assert status == 202 and cancel.status_code == 202
    assert [(s, b["error"]["code"]) for s, b in full] == [(409, "queue_full")] * 3
    assert q2[0] == 202, q2
    assert (over[0], over[1]["error"]["code"]) == (429, "rate_limited")


async def test_another_key_cannot_cancel_read_or_steer_a_sessions_queued_turns(
    tmp_path: Path,
) -> None:
    provider = Gated()
    config = make_config(tmp_path, **{"auth.api_keys": ["key-a", "key-b"]})
    a = {"Authorization": "Bearer key-a"}
    b = {"Authorization": "Bearer key-b"}
    async with running_gateway(config, provider) as gw:
        sid = (await gw.http.post("/sessions", json={}, headers=a)).json()["session_id"]
        own = (await gw.http.post("/sessions", json={}, headers=b)).json()["session_id"]
        turns = f"/sessions/{sid}/turns"
        r = await gw.http.post(turns, json={"content": "hold A"}, headers=a)
        assert r.status_code == 202
        await provider.holding.wait()
        r = await gw.http.post(turns, json={"content": "secret", "if_busy": "queue"}, headers=a)
        queued = r.json()["turn_id"]
        refused = [
            await gw.http.post(f"{turns}/{queued}/cancel", json={}, headers=b),
            await gw.http.post(f"/sessions/{own}/turns/{queued}/cancel", json={}, headers=b),
            await gw.http.post(turns, json={"content": "x", "if_busy": "steer"}, headers=b),
            await gw.http.post(turns, json={"content": "x", "if_busy": "interrupt"}, headers=b),
            await gw.http.get(f"/sessions/{sid}", headers=b),
        ]
        listed = (await gw.http.get("/sessions", headers=b)).text
        mine = (await gw.http.get("/sessions", headers=a)).json()["sessions"]
        provider.let_go()
    assert [r.status_code for r in refused] == [404] * 5, [r.text for r in refused]
    assert "secret" not in listed and queued not in listed
    [listing] = [s for s in mine if s["session"]["id"] == sid]
    assert [q["turn_id"] for q in listing["session"]["queued_turns"]] == [queued]


async def test_a_queued_turn_never_starts_once_a_delete_began(tmp_path: Path) -> None:
    """The running turn ends while DELETE still reads the store (its workers): the queued
    turn must not start then (docs/protocol.md §2: deleting drops them)."""
    provider = Gated()
    async with running_gateway(make_config(tmp_path), provider) as gw:
        sid = await gw.create_session()
        async with gw.client(sid) as client:
            await client.subscribe()
            assert (await post(gw, sid, "hold A"))[0] == 202
            await provider.holding.wait()
            assert (await post(gw, sid, "B", if_busy="queue"))[0] == 202
            store = gw.node.store
            reading, gate = trio.Event(), trio.Event()
            slow_read = store.worker_ids

            async def worker_ids(session_id: str) -> list[str]:
                reading.set()
                await gate.wait()  # a slow store
                return await slow_read(session_id)

            store.worker_ids = worker_ids  # type: ignore[method-assign]
            async with trio.open_nursery() as nursery:

                async def delete() -> None:
                    r = await gw.http.delete(f"/sessions/{sid}")
                    assert r.status_code == 204, r.text

                nursery.start_soon(delete)
                await reading.wait()
                provider.let_go()  # A ends while the delete waits for the store
                await client.until_turn_ends()
                gate.set()
    assert [_last_text(r) for r in provider.requests] == ["hold A"]


async def test_a_delete_the_store_refuses_leaves_the_queue_to_go_on(tmp_path: Path) -> None:
    """The same DELETE fails (503 store_unavailable: a retry deletes it): the session is
    not deleted, and its queued turn runs after all."""
    provider = Gated()
    async with running_gateway(make_config(tmp_path), provider) as gw:
        sid = await gw.create_session()
        async with gw.client(sid) as client:
            await client.subscribe()
            assert (await post(gw, sid, "hold A"))[0] == 202
            await provider.holding.wait()
            assert (await post(gw, sid, "B", if_busy="queue"))[0] == 202
            store = gw.node.store
            reading, gate = trio.Event(), trio.Event()
            read = store.worker_ids

            async def worker_ids(session_id: str) -> list[str]:
                reading.set()
                await gate.wait()  # A has ended meanwhile: B waits for the delete
                raise StoreError("the store did not answer")

            store.worker_ids = worker_ids  # type: ignore[method-assign]
            answer: list[int] = []
            async with trio.open_nursery() as nursery:

                async def delete() -> None:
                    answer.append((await gw.http.delete(f"/sessions/{sid}")).status_code)

                nursery.start_soon(delete)
                await reading.wait()
                provider.let_go()
                await client.until_turn_ends()
                gate.set()
            store.worker_ids = read  # type: ignore[method-assign]
            await until_started(client, 1)  # B's (A's end was read above)
    assert answer == [503]
    assert [_last_text(r) for r in provider.requests] == ["hold A", "B"]


async def test_an_idle_session_takes_a_message_id_once_too(gw: Harness) -> None:
    """Two AI SDK requests of one message race past the door's look-up before the chat
    existed; the first turn has ended when the second arrives: it is not a second turn
    (test_aisdk_adversary.py's test_the_same_request_twice_at_once_runs_one_turn saw two)."""
    sid = await gw.create_session()
    session = gw.node.sessions[sid]
    message = Message("msg_once", sid, None, "user", [TextBlock("hi")], "complete", 1)
    async with gw.client(sid) as client:
        await client.subscribe()
        await gw.node.submit_turn(session, message, "reject", None)
        await client.until_turn_ends()
        with pytest.raises(Refused) as refused:
            await gw.node.submit_turn(session, message, "reject", None)
    assert refused.value.code == "turn_in_progress"
    assert [m.id for m in session.messages if m.role == "user"] == ["msg_once"]

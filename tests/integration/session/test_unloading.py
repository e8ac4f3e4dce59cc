"""Unloading idle sessions, over real sockets (docs/protocol.md §13).

A session unused for ``[sessions] idle_unload_s`` leaves memory, and the next
request, attach or turn loads it from the store: no client can tell (ids,
snapshot, replay and live are what they would have been). Never while a
turn, a client, a pending approval or a request holds it. Unloading racing
an attach, a turn, a DELETE and an approval: each lands on the session
loaded afresh.
The timer itself runs on Trio's ``MockClock``.
"""

# ruff: noqa: ASYNC110 (the node's state is polled: it has no event for each of these)

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.lowlevel

from gateway.node import unloading
from gateway.protocol.events import CATALOG_TYPES, Event
from gateway.protocol.frames import EventFrame, Snapshot, SubscribeAck
from tests.conftest import TOOL_SCRIPT, Harness, make_config, running_gateway, types

WORKER_TASK = json.dumps({"script": {"rounds": [[{"text": "worked"}]]}})
DELEGATE = {
    "script": {
        "rounds": [
            [{"tool_use": {"name": "delegate", "input": {"task": WORKER_TASK}}}],
            [{"text": "delegated"}],
        ]
    }
}
WAIT_FOR_APPROVAL = {
    "script": {"rounds": [[{"tool_use": {"name": "sleep", "input": {"seconds": 0.01}}}]]}
}
FAR = 10.0**9  # a "now" far past any idle_unload_s


async def turn(gw: Harness, sid: str, script: Any = "hello") -> list[Event]:
    """Run a turn with a client attached; its events, once it ended and is durable."""
    async with gw.client(sid) as c:
        await c.subscribe()
        await gw.submit(sid, script)
        with trio.fail_after(20):
            events = await c.until(
                lambda e: e.type in ("turn.completed", "turn.cancelled") and e.session_id == sid
            )
    await gw.node.wait_durable()
    return events


async def replay(gw: Harness, sid: str, since: str) -> list[Event]:
    async with gw.client(sid) as c:
        ack = await c.subscribe(since=since)
        assert isinstance(ack, SubscribeAck), ack
        out = []
        for _ in range(ack.replay_event_count):
            frame = await c.recv()
            assert isinstance(frame, EventFrame)
            out.append(frame.event)
    return out


async def snapshot(gw: Harness, sid: str) -> Snapshot:
    async with gw.client(sid) as c:
        await c.subscribe(snapshot=True)
        snap = await c.recv()
    assert isinstance(snap, Snapshot)
    return snap


async def settled(gw: Harness) -> None:
    """Every client's goodbye (``bus.subscriber_unregistered``) is in, and durable."""
    with trio.fail_after(10):
        while any(len(s.hub) or s.pins for s in gw.node.sessions.values()):
            await trio.sleep(0.01)
    await gw.node.wait_durable()


async def unload(gw: Harness, sid: str) -> None:
    """What the unloader does to an idle family (its timer is tested on its own)."""
    await settled(gw)
    root = gw.node.sessions[sid]
    assert root in unloading.idle_families(gw.node, FAR, 1.0)
    await unloading.unload(gw.node, [root])
    assert sid not in gw.node.sessions


def metric(text: str, name: str) -> float:
    line = next(x for x in text.splitlines() if x.startswith(name + " "))
    return float(line.split()[1])


async def test_no_client_can_tell(gw: Harness) -> None:
    sid = await gw.create_session()
    first = (await turn(gw, sid, TOOL_SCRIPT))[0].id
    await settled(gw)
    before = await replay(gw, sid, first)
    snap_before = await snapshot(gw, sid)

    await unload(gw, sid)

    after = await replay(gw, sid, first)
    snap_after = await snapshot(gw, sid)
    # The same events, byte for byte; since then only the clients' goodbyes.
    assert [e.id for e in after[: len(before)]] == [e.id for e in before]
    assert after[: len(before)] == before
    assert set(types(after[len(before) :])) == {"bus.subscriber_unregistered"}
    assert snap_after.session == snap_before.session
    assert snap_after.messages == snap_before.messages
    # Its next turn goes on from there: ids above every earlier one, the conversation whole.
    later = await turn(gw, sid, "again")
    assert min(e.id for e in later) > max(e.id for e in after)
    messages = (await gw.http.get(f"/sessions/{sid}/messages")).json()["messages"]
    assert len(messages) == len(snap_before.messages) + 2


async def test_a_family_leaves_and_comes_back_together(gw: Harness) -> None:
    sid = await gw.create_session()
    events = await turn(gw, sid, DELEGATE)
    assert "delegate.completed" in types(events)
    (worker,) = [w.id for w in gw.node.sessions[sid].workers]
    await settled(gw)
    # A worker alone is never a family: only its root is looked at.
    assert gw.node.sessions[worker] not in unloading.idle_families(gw.node, FAR, 1.0)
    await unload(gw, sid)
    assert worker not in gw.node.sessions
    # Asking for the worker loads its parent with it, and the parent its workers.
    assert (await gw.http.get(f"/sessions/{worker}")).status_code == 200
    parent = gw.node.sessions[sid]
    assert [w.id for w in parent.workers] == [worker]
    assert gw.node.sessions[worker].parent is parent


async def test_busy_sessions_stay(tmp_path: Path) -> None:
    """A turn, a pending approval, a client, a request held open: none is unloaded."""
    config = make_config(tmp_path, **{"tools.require_approval": ["sleep"]})
    with trio.fail_after(30):
        async with running_gateway(config) as gw:
            node = gw.node
            waiting = await gw.create_session()
            watched = await gw.create_session()
            idle = await gw.create_session()
            async with gw.client(watched) as c, gw.client(waiting) as w:
                await c.subscribe()
                await w.subscribe()
                await gw.submit(waiting, WAIT_FOR_APPROVAL)
                asked = (await w.until(lambda e: e.type == "permission.requested"))[-1]
                await settled_except(gw, {watched, waiting})
                idle_now = unloading.idle_families(node, FAR, 1.0)
                assert [s.id for s in idle_now] == [idle]
                # The turn waits for its approval: still there, and it is answered.
                r = await gw.http.post(
                    f"/sessions/{waiting}/permissions/{asked.payload.perm_id}",
                    json={"decision": "allow"},
                )
                assert r.status_code == 202, r.text
                await w.until_turn_ends()
            await settled(gw)
            # Used just now: not idle for another idle_unload_s.
            now = trio.current_time()
            assert unloading.idle_families(node, now, 60.0) == []
            assert len(unloading.idle_families(node, now + 60.0, 60.0)) == 3


async def settled_except(gw: Harness, busy: set[str]) -> None:
    with trio.fail_after(10):
        while any((len(s.hub) or s.pins) and s.id not in busy for s in gw.node.sessions.values()):
            await trio.sleep(0.01)
    await gw.node.wait_durable()


async def test_an_open_stream_holds_its_session(gw: Harness) -> None:
    """A WebSocket not yet subscribed holds the session (its request is not over)."""
    sid = await gw.create_session()
    url = await gw.ws_url(sid)
    await settled(gw)
    from trio_websocket import open_websocket_url

    async with open_websocket_url(url):
        with trio.fail_after(5):
            while not gw.node.connections:
                await trio.sleep(0.01)
        assert unloading.idle_families(gw.node, FAR, 1.0) == []
    await settled(gw)
    assert [s.id for s in unloading.idle_families(gw.node, FAR, 1.0)] == [sid]


@pytest.mark.parametrize("what", ["attach", "turn", "delete"])
async def test_a_request_racing_the_unload(gw: Harness, what: str) -> None:
    """It waits for the unload to end, then finds the session loaded afresh (or deletes it)."""
    sid = await gw.create_session()
    await turn(gw, sid)
    await settled(gw)
    root = gw.node.sessions[sid]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(unloading.unload, gw.node, [root])
        while sid in gw.node.sessions:  # the unload began: the session is unknown to requests
            await trio.lowlevel.checkpoint()
        if what == "attach":
            async with gw.client(sid) as c:
                await c.subscribe()
                await gw.submit(sid, "after")
                with trio.fail_after(10):
                    events = await c.until_turn_ends()
            assert types(events)[-1] == "turn.completed"
        elif what == "turn":
            await gw.submit(sid, "after")
        else:
            assert (await gw.http.delete(f"/sessions/{sid}")).status_code == 204
    if what == "delete":
        assert (await gw.http.get(f"/sessions/{sid}")).status_code == 404
        assert sid not in gw.node.sessions
    else:
        reloaded = gw.node.sessions[sid]
        assert reloaded is not root
        with trio.fail_after(10):
            while reloaded.turn is not None:
                await trio.sleep(0.01)
        assert reloaded.record.turn_count == 2


async def test_the_tail_is_bounded_by_bytes(tmp_path: Path) -> None:
    config = make_config(tmp_path, **{"stream.tail_max_bytes": 4096})
    with trio.fail_after(30):
        async with running_gateway(config) as gw:
            sid = await gw.create_session()
            events = await turn(gw, sid, {"script": {"rounds": [[{"lorem": 300}]]}})
            session = gw.node.sessions[sid]
            assert 0 < session.tail.bytes <= 4096
            assert session.tail.bytes == sum(len(e.data) + len(e.frame) for e in session.tail)
            assert session.tail.floor > int(events[0].id.split("_")[-1], 16) or session.tail
            # A replay from the start still gets every catalog event: the rest from the store.
            again = await replay(gw, sid, events[0].id)
            expected = [e.id for e in events[1:] if e.type in CATALOG_TYPES]
            replayed = [e for e in again if e.type in CATALOG_TYPES]
            assert [e.id for e in replayed[: len(expected)]] == expected
            assert {e.type for e in replayed[len(expected) :]} <= {"bus.subscriber_unregistered"}


@pytest.fixture
def patient_clock() -> trio.testing.MockClock:
    """Jumps only once everything waited a fifth of a real second: a loopback request,
    a store commit in its thread, do not make it jump (their own timeouts would fire)."""
    return trio.testing.MockClock(autojump_threshold=0.2)


async def test_the_unloader_on_the_clock(
    tmp_path: Path, patient_clock: trio.testing.MockClock
) -> None:
    """Unused for idle_unload_s: gone; counted; the next request loads it again."""
    config = make_config(tmp_path, **{"sessions.idle_unload_s": 60})
    async with running_gateway(config) as gw:
        sid = await gw.create_session()
        await turn(gw, sid)
        await settled(gw)
        await trio.sleep(40)
        assert sid in gw.node.sessions  # used less than a minute ago
        await trio.sleep(60)
        assert sid not in gw.node.sessions
        text = (await gw.http.get("/metrics")).text
        assert metric(text, "gateway_sessions_unloaded_total") == 1
        assert metric(text, "gateway_sessions_live") == 0
        assert (await gw.http.get(f"/sessions/{sid}")).status_code == 200
        assert sid in gw.node.sessions


async def test_a_pending_approval_holds_the_session_past_idle_unload_s(
    tmp_path: Path, patient_clock: trio.testing.MockClock
) -> None:
    """The unloader's timer passes idle_unload_s many times over while an approval waits
    with no client attached: the session stays; the approval lands, the turn ends, and
    only then does the session leave memory, with the whole exchange in the store."""
    config = make_config(
        tmp_path,
        **{
            "sessions.idle_unload_s": 20,
            "tools.require_approval": ["sleep"],
            "tools.approval_timeout_s": 3600,
        },
    )
    async with running_gateway(config) as gw:
        sid = await gw.create_session()
        async with gw.client(sid) as c:
            await c.subscribe()
            await gw.submit(sid, WAIT_FOR_APPROVAL)
            seen = await c.until(lambda e: e.type == "permission.requested")
            asked = seen[-1]
        await trio.sleep(70)  # 3.5 idle_unload_s, the client gone: only the approval holds it
        root = gw.node.sessions[sid]
        assert root.permissions.pending()
        r = await gw.http.post(
            f"/sessions/{sid}/permissions/{asked.payload.perm_id}", json={"decision": "allow"}
        )
        assert r.status_code == 202, r.text
        with trio.fail_after(60):
            while root.turn is not None:
                await trio.sleep(0.05)
        assert gw.node.sessions.get(sid) is root  # never unloaded while it waited
        await trio.sleep(30)
        assert sid not in gw.node.sessions
        history = types(await replay(gw, sid, seen[0].id))
    assert "permission.resolved" in history, history
    assert history[-1] == "turn.completed", history


async def test_an_approval_racing_the_unload(tmp_path: Path) -> None:
    """A decision posted while the unload runs waits for it, then meets the session
    loaded afresh: an answer of the permission route, never a 5xx or a hang."""
    config = make_config(tmp_path, **{"tools.require_approval": ["sleep"]})
    with trio.fail_after(30):
        async with running_gateway(config) as gw:
            sid = await gw.create_session()
            async with gw.client(sid) as c:
                await c.subscribe()
                await gw.submit(sid, WAIT_FOR_APPROVAL)
                asked = (await c.until(lambda e: e.type == "permission.requested"))[-1]
                url = f"/sessions/{sid}/permissions/{asked.payload.perm_id}"
                assert (await gw.http.post(url, json={"decision": "allow"})).status_code == 202
                await c.until_turn_ends()
            await settled(gw)
            root = gw.node.sessions[sid]
            answers: list[int] = []

            async def decide() -> None:
                answers.append((await gw.http.post(url, json={"decision": "deny"})).status_code)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(unloading.unload, gw.node, [root])
                while sid in gw.node.sessions:  # the unload began
                    await trio.lowlevel.checkpoint()
                nursery.start_soon(decide)
            # A loaded session answers 409 permission_resolved; so does one loaded afresh,
            # which holds only what is pending: the id names one of its tool uses (§13).
            assert answers == [409], answers
            bogus = url.rsplit("/", 1)[0] + "/perm_" + "0" * 20
            never = await gw.http.post(bogus, json={"decision": "deny"})
            assert (never.status_code, never.json()["error"]["code"]) == (
                404,
                "permission_not_found",
            )
            reloaded = gw.node.sessions[sid]
            assert reloaded is not root and not reloaded.permissions.pending()
            assert reloaded.record.turn_count == 1

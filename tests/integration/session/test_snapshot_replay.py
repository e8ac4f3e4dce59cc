"""Snapshots and ``since`` replay over real sockets (docs/protocol.md sections 3 and 6).

Behaviours 5 and 6 of the core issue: a ``snapshot`` frame describes the
session (idle or mid-stream) up to ``snapshot_at_event_id``, and a ``since``
cursor replays exactly what the client missed, catalog events from memory or
the store plus the streaming layer rebuilt (``message.complete`` with its
original id, ``message.snapshot`` for a message still streaming), then goes
live with no gap and no duplicate. Bad cursors and oversized replays are
``subscribe_error`` frames on a connection that stays open.

Every comparison is against what a client connected from the start saw: same
ids, same order, same reducer state.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from gateway.ids import format_event_id, parse_event_id
from gateway.protocol.events import CATALOG_TYPES, Event
from gateway.protocol.frames import EventFrame, Snapshot, SubscribeAck, SubscribeError
from gateway.protocol.shapes import SessionSummary, TextBlock
from tests.conftest import (
    TOOL_SCRIPT,
    Client,
    Harness,
    make_config,
    running_gateway,
    to_builtins,
    types,
)

# About 1 s of text.delta events, one word each: long enough for a second
# client to join mid-stream, short enough for the suite's budget.
SLOW_SCRIPT = {"script": {"delay_ms": 5, "rounds": [[{"lorem": 160}]]}}


async def recv_events(client: Client, n: int) -> list[Event]:
    """The next ``n`` frames, each of which must be an event frame, in id order."""
    out: list[Event] = []
    for _ in range(n):
        frame = await client.recv()
        assert isinstance(frame, EventFrame), frame
        out.append(frame.event)
    ids = [e.id for e in out]
    assert ids == sorted(set(ids))
    return out


async def until_deltas(client: Client, n: int) -> list[Event]:
    """Receive until ``n`` text.delta events have arrived."""
    seen = 0

    def done(e: Event) -> bool:
        nonlocal seen
        seen += e.type == "text.delta"
        return seen == n

    return await client.until(done)


async def mark(gw: Harness, sid: str, live: Client) -> str:
    """A genuine event id of this session from before its first turn.

    A throwaway client subscribes and leaves, which the session records as
    ``bus.subscriber_unregistered``; ``live`` (subscribed already) sees it.
    """
    async with gw.client(sid) as throwaway:
        await throwaway.subscribe()
    events = await live.until(lambda e: e.type == "bus.subscriber_unregistered")
    return events[-1].id


def replayable(events: list[Event], after: str) -> list[Event]:
    """What a ``since`` replay restores of a finished stream: catalog events, message.complete."""
    return [
        e
        for e in events
        if e.id > after and (e.type in CATALOG_TYPES or e.type == "message.complete")
    ]


def assert_same_events(got: list[Event], expected: list[Event]) -> None:
    """Same events; a rebuilt message.complete may differ from the live one only in ``ts``."""
    assert [e.id for e in got] == [e.id for e in expected]
    for g, x in zip(got, expected, strict=True):
        g_b, x_b = to_builtins(g), to_builtins(x)
        if g.type == "message.complete":
            g_b.pop("ts")
            x_b.pop("ts")
        assert g_b == x_b


def text_of(events: list[Event]) -> str:
    return "".join(e.payload.text for e in events if e.type == "text.delta")


# --- snapshot: true ---------------------------------------------------------------


async def test_snapshot_of_an_idle_session_with_history(gw: Harness, tmp_path: Path) -> None:
    r = await gw.http.post("/sessions", json={"workspace_path": "history"})
    assert r.status_code == 201
    sid, model = r.json()["session_id"], r.json()["active_model"]
    texts = ["one", "two words", "three little words"]
    async with gw.client(sid) as live:
        await live.subscribe()
        turn_ids = []
        for text in texts:
            turn_ids.append(await gw.submit(sid, text))
            with trio.fail_after(10):
                await live.until_turn_ends()
        async with gw.client(sid) as late:
            with trio.fail_after(10):
                ack = await late.subscribe(snapshot=True)
                snap = await late.recv()
            # With snapshot: true, since is ignored (even one that would be refused).
            async with gw.client(sid) as ignoring:
                with trio.fail_after(10):
                    ack2 = await ignoring.subscribe(since="garbage", snapshot=True)
                    snap2 = await ignoring.recv()

    assert isinstance(ack, SubscribeAck)
    assert (ack.since, ack.snapshot, ack.replay_event_count) == (None, True, 0)
    assert isinstance(snap, Snapshot)
    assert isinstance(ack2, SubscribeAck) and ack2.snapshot is True
    assert snap2 == snap
    route = next(e for e in live.events if e.type == "route.decided")
    cost = sum(e.payload.cost_usd for e in live.events if e.type == "turn.completed")
    assert snap.session == SessionSummary(
        id=sid,
        workspace_path="history",  # its name, not the host's path
        active_model=model,
        routing_policy_version=route.payload.policy_version,
        cost_so_far_usd=cost,
        turn_count=3,
        current_turn_id=None,
        current_turn_status=None,
        parent_session_id=None,
        agent="default",
        tools=gw.gateway.node.tool_infos("default"),
    )
    # The cut is the last event of the last turn, as the live client saw it.
    assert live.events[-1].type == "turn.completed"
    assert snap.snapshot_at_event_id == live.events[-1].id

    msgs = snap.messages
    assert [m.role for m in msgs] == ["user", "assistant"] * 3
    assert [m.status for m in msgs] == ["complete"] * 6
    assert [m.turn_id for m in msgs] == [t for t in turn_ids for _ in range(2)]
    assert [m.content for m in msgs] == [
        block for text in texts for block in ([TextBlock(text)], [TextBlock(f"You said: {text}")])
    ]
    assert all(m.session_id == sid for m in msgs)
    completes = [e.payload for e in live.events if e.type == "message.complete"]
    assert [m.id for m in msgs[1::2]] == [c.message_id for c in completes]
    # The same messages as the history route, and as the live client built them.
    history = await gw.http.get(f"/sessions/{sid}/messages")
    assert to_builtins(msgs) == history.json()["messages"]
    assert late.reducer.state()["messages"] == live.reducer.state()["messages"]
    assert late.reducer.state()["turn"] is None


async def test_snapshot_keeps_only_the_most_recent_snapshot_messages(tmp_path: Path) -> None:
    config = make_config(tmp_path, **{"stream.snapshot_messages": 2})
    async with running_gateway(config) as gw:
        with trio.fail_after(10):
            sid = await gw.create_session()
            async with gw.client(sid) as live:
                await live.subscribe()
                for text in ("first", "second", "third"):
                    last_turn = await gw.submit(sid, text)
                    await live.until_turn_ends()
            async with gw.client(sid) as late:
                await late.subscribe(snapshot=True)
                snap = await late.recv()
            history = (await gw.http.get(f"/sessions/{sid}/messages")).json()["messages"]

    assert isinstance(snap, Snapshot)
    assert snap.session.turn_count == 3
    assert len(history) == 6
    assert to_builtins(snap.messages) == history[-2:]
    assert [(m.role, m.turn_id) for m in snap.messages] == [
        ("user", last_turn),
        ("assistant", last_turn),
    ]
    assert snap.messages[1].content == [TextBlock("You said: third")]


@pytest.mark.slow  # over a second on two cores (measured with --durations)
async def test_snapshot_mid_stream_then_live_deltas_finish_the_message(gw: Harness) -> None:
    sid = await gw.create_session()
    async with gw.client(sid) as first:
        await first.subscribe()
        turn_id = await gw.submit(sid, SLOW_SCRIPT)
        with trio.fail_after(10):
            seen = await until_deltas(first, 3)
            async with gw.client(sid) as second:
                ack = await second.subscribe(snapshot=True)
                snap = await second.recv()
                later = await second.until_turn_ends()
                await first.until_turn_ends()

                assert isinstance(ack, SubscribeAck) and ack.snapshot is True
                assert isinstance(snap, Snapshot)
                cut = snap.snapshot_at_event_id
                assert cut is not None
                assert snap.session.current_turn_id == turn_id
                assert snap.session.current_turn_status == "in_flight"
                assert snap.session.turn_count == 1
                user, streaming = snap.messages
                assert (user.role, user.status) == ("user", "complete")
                assert (streaming.role, streaming.status) == ("assistant", "in_progress")
                assert streaming.turn_id == turn_id
                start = next(e for e in first.events if e.type == "message.start")
                assert streaming.id == start.payload.message_id
                assert len(streaming.content) == 1 and isinstance(streaming.content[0], TextBlock)
                partial = streaming.content[0].text
                # The partial text is exactly what was streamed up to the cut,
                # which includes the deltas the first client had already seen.
                assert partial == text_of([e for e in first.events if e.id <= cut])
                assert partial.startswith(text_of(seen)) and text_of(seen)

                # After the snapshot: exactly the live events after the cut.
                assert all(e.id > cut for e in later)
                assert [e.id for e in later] == [e.id for e in first.events if e.id > cut]
                complete = next(e for e in later if e.type == "message.complete").payload
                assert complete.stop_reason == "end_turn"
                assert complete.final_content == [TextBlock(partial + text_of(later))]
                assert later[-1].type == "turn.completed"
                assert second.reducer.state() == first.reducer.state()
                assert second.reducer.duplicates_ignored == 0


# --- since: replay ------------------------------------------------------------------


async def test_since_replays_catalog_events_and_rebuilt_message_completes(gw: Harness) -> None:
    sid = await gw.create_session()
    async with gw.client(sid) as live:
        await live.subscribe()
        await gw.submit(sid, TOOL_SCRIPT)
        with trio.fail_after(10):
            turn = await live.until_turn_ends()
        cursor = turn[0].id
        assert turn[0].type == "turn.started"
        async with gw.client(sid) as resumed:
            with trio.fail_after(10):
                ack = await resumed.subscribe(since=cursor)
                assert isinstance(ack, SubscribeAck)
                assert (ack.since, ack.snapshot) == (cursor, False)
                replay = await recv_events(resumed, ack.replay_event_count)

                expected = replayable(live.events, cursor)
                assert ack.replay_event_count == len(expected) == 10
                assert types(replay) == [
                    "route.decided",
                    "llm.call_started",
                    "message.complete",
                    "llm.call_completed",
                    "tool.called",
                    "tool.completed",
                    "llm.call_started",
                    "message.complete",
                    "llm.call_completed",
                    "turn.completed",
                ]
                # Same ids as live (the rebuilt message.complete too), same payloads.
                assert_same_events(replay, expected)
                for i, e in enumerate(replay):
                    if e.type == "message.complete":
                        after = replay[i + 1]
                        assert after.type == "llm.call_completed"
                        assert after.payload.message_id == e.payload.message_id

                # Then live, with no gap and no duplicate.
                await gw.submit(sid, "and now live")
                live_part = await resumed.until_turn_ends()
                await live.until_turn_ends()
    assert [e.id for e in live_part] == [e.id for e in live.events if e.id > replay[-1].id]
    assert types(live_part)[0] == "turn.started"
    assert text_of(live_part) == "You said: and now live"


@pytest.mark.slow  # over a second on two cores (measured with --durations)
async def test_since_while_a_message_streams_restores_it_with_message_snapshot(
    gw: Harness,
) -> None:
    sid = await gw.create_session()
    async with gw.client(sid) as first:
        await first.subscribe()
        with trio.fail_after(10):
            cursor = await mark(gw, sid, first)
            await gw.submit(sid, SLOW_SCRIPT)
            await until_deltas(first, 3)
            async with gw.client(sid) as resumed:
                ack = await resumed.subscribe(since=cursor)
                assert isinstance(ack, SubscribeAck)
                replay = await recv_events(resumed, ack.replay_event_count)
                later = await resumed.until_turn_ends()
                await first.until_turn_ends()

    assert types(replay) == [
        "turn.started",
        "route.decided",
        "llm.call_started",
        "message.snapshot",
    ]
    assert_same_events(replay[:3], replayable(first.events, cursor)[:3])
    snap = replay[-1]
    message = snap.payload.message
    # An id of its own (ids are never reused, docs/protocol.md §1), above every delta folded in.
    assert snap.id not in {e.id for e in first.events}
    folded = [e.id for e in first.events if e.type == "text.delta" and e.id < later[0].id]
    assert snap.id > max(folded)
    start = next(e for e in first.events if e.type == "message.start")
    assert (message.id, message.role, message.status) == (
        start.payload.message_id,
        "assistant",
        "in_progress",
    )
    # The partial message is exactly what streamed up to the message.snapshot's id.
    assert message.content == [TextBlock(text_of([e for e in first.events if e.id <= snap.id]))]
    # Live deltas continue after it: none at or below its id, none missing.
    assert later[0].type == "text.delta"
    assert all(e.id > snap.id for e in later)
    assert [e.id for e in later] == [e.id for e in first.events if e.id > snap.id]
    complete = next(e for e in later if e.type == "message.complete").payload
    assert complete.final_content == [TextBlock(message.content[0].text + text_of(later))]
    assert resumed.reducer.state() == first.reducer.state()
    assert resumed.reducer.duplicates_ignored == 0


async def test_replay_respects_the_filter(gw: Harness) -> None:
    sid = await gw.create_session()
    async with gw.client(sid) as live:
        await live.subscribe()
        with trio.fail_after(10):
            cursor = await mark(gw, sid, live)
            for text in ("one", "two"):
                await gw.submit(sid, text)
                await live.until_turn_ends()
            only_completed = {
                "event_types": ["turn.completed"],
                "actors": None,
                "include_worker_sessions": False,
            }
            async with gw.client(sid) as turns_only:
                ack = await turns_only.subscribe(only_completed, since=cursor)
                assert isinstance(ack, SubscribeAck)
                assert ack.replay_event_count == 2
                replay = await recv_events(turns_only, 2)
                assert_same_events(replay, [e for e in live.events if e.type == "turn.completed"])

                # The rebuilt streaming layer is filtered too.
                async with gw.client(sid) as completes_only:
                    ack2 = await completes_only.subscribe(
                        {"event_types": ["message.complete"]}, since=cursor
                    )
                    assert isinstance(ack2, SubscribeAck) and ack2.replay_event_count == 2
                    replay2 = await recv_events(completes_only, 2)
                    assert_same_events(
                        replay2, [e for e in live.events if e.type == "message.complete"]
                    )

                # And live: the next frame is the third turn's turn.completed.
                await gw.submit(sid, "three")
                third = await live.until_turn_ends()
                frame = await turns_only.recv()
                assert isinstance(frame, EventFrame)
                assert to_builtins(frame.event) == to_builtins(third[-1])


# --- subscribe_error --------------------------------------------------------------------


async def test_bad_cursors_are_cursor_expired_and_the_connection_stays_open(gw: Harness) -> None:
    sid = await gw.create_session()
    async with gw.client(sid) as live:
        await live.subscribe()
        await gw.submit(sid, "hello")
        with trio.fail_after(10):
            turn = await live.until_turn_ends()
        started, last = turn[0].id, turn[-1].id
        async with gw.client(sid) as client:
            with trio.fail_after(10):
                next_id = format_event_id(gw.node.sequencer.last + 1)
                for cursor in ("evt_99999999999999999999", next_id, "garbage", "evt_12", ""):
                    error = await client.subscribe(since=cursor)
                    assert isinstance(error, SubscribeError), (cursor, error)
                    assert error.code == "cursor_expired", cursor

                # Older than the retention window: what the retention task records.
                seq = parse_event_id(started)
                assert seq is not None
                gw.node.retention_floor = seq + 1
                error = await client.subscribe(since=started)
                assert isinstance(error, SubscribeError) and error.code == "cursor_expired"

                # Still open: a good cursor (at the floor's side) now works.
                ack = await client.subscribe(since=last)
                assert isinstance(ack, SubscribeAck)
                assert (ack.since, ack.replay_event_count) == (last, 0)

                # At the highest purged id itself nothing was lost: it replays.
                gw.node.retention_floor = seq
                async with gw.client(sid) as at_floor:
                    ack = await at_floor.subscribe(since=started)
                    assert isinstance(ack, SubscribeAck)
                    assert ack.replay_event_count > 0  # the turn after its first event


async def test_replay_too_large_is_refused_before_anything_is_sent(tmp_path: Path) -> None:
    # A delta about every millisecond, so that some queue behind the seam while
    # the replay is counted (with replay_max_events = 5 it reads the store, which
    # awaits); the refusal must drop them.
    script = {
        "script": {
            "delay_ms": 0.5,
            "rounds": [
                [
                    {"text": "Running it now."},
                    {"tool_use": {"name": "sleep", "input": {"seconds": 0}}},
                ],
                [{"lorem": 800}],
            ],
        }
    }
    config = make_config(tmp_path, **{"stream.replay_max_events": 5})
    async with running_gateway(config) as gw:
        with trio.fail_after(10):
            sid = await gw.create_session()
            async with gw.client(sid) as live:
                await live.subscribe()
                cursor = await mark(gw, sid, live)
                await gw.submit(sid, script)
                await live.until(lambda e: e.type == "tool.completed")
                await until_deltas(live, 2)
                # 9 to replay: turn.started .. tool.completed, llm.call_started, message.snapshot
                async with gw.client(sid) as client:
                    error = await client.subscribe(since=cursor)
                    assert isinstance(error, SubscribeError)
                    assert error.code == "replay_too_large"
                    # Live events kept flowing meanwhile; none of them reached
                    # this client: the next frame is the corrected subscribe's ack.
                    await until_deltas(live, 5)
                    ack = await client.subscribe(snapshot=True)
                    assert isinstance(ack, SubscribeAck) and ack.snapshot is True
                    snap = await client.recv()
                    assert isinstance(snap, Snapshot)
                    assert snap.messages[-1].status == "in_progress"
                    assert client.events == []


async def test_replay_max_events_is_the_largest_replay_allowed(tmp_path: Path) -> None:
    config = make_config(tmp_path, **{"stream.replay_max_events": 5})
    async with running_gateway(config) as gw:
        with trio.fail_after(10):
            sid = await gw.create_session()
            async with gw.client(sid) as live:
                await live.subscribe()
                cursor = await mark(gw, sid, live)
                await gw.submit(sid, "twenty-ish events for a plain echo turn of many words")
                turn = await live.until_turn_ends()
                assert len(turn) >= 20
                # After turn.started: route.decided, llm.call_started,
                # message.complete, llm.call_completed, turn.completed = 5.
                async with gw.client(sid) as exact:
                    ack = await exact.subscribe(since=turn[0].id)
                    assert isinstance(ack, SubscribeAck) and ack.replay_event_count == 5
                    assert_same_events(
                        await recv_events(exact, 5), replayable(live.events, turn[0].id)
                    )
                # One more (turn.started itself) is too many.
                async with gw.client(sid) as over:
                    error = await over.subscribe(since=cursor)
                    assert isinstance(error, SubscribeError)
                    assert error.code == "replay_too_large"


# --- across a restart -----------------------------------------------------------------


@pytest.mark.slow  # over a second on two cores (measured with --durations)
async def test_replay_after_a_restart_comes_from_the_store(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    async with running_gateway(config) as gw:
        with trio.fail_after(10):
            sid = await gw.create_session()
            async with gw.client(sid) as live:
                await live.subscribe()
                await gw.submit(sid, TOOL_SCRIPT)
                turn = await live.until_turn_ends()
        before = gw.node
    high_water = format_event_id(before.sequencer.last)
    cursor = turn[0].id
    assert turn[0].type == "turn.started"

    # Same store, new node: the session's events are only in the store now. A
    # turn streams (a delta about every millisecond) while the resumed client's
    # replay reads the store, so live deltas queue behind the seam meanwhile.
    async with running_gateway(config) as gw:
        assert gw.node is not before
        with trio.fail_after(10):
            async with gw.client(sid) as first:
                await first.subscribe()
                # The high-water mark survived: the first id issued is above every old one.
                await gw.submit(sid, "after the restart")
                quick = await first.until_turn_ends()
                assert quick[0].type == "turn.started" and quick[0].id > high_water
                await gw.submit(sid, {"script": {"delay_ms": 0.5, "rounds": [[{"lorem": 600}]]}})
                await until_deltas(first, 3)
                async with gw.client(sid) as resumed:
                    ack = await resumed.subscribe(since=cursor)
                    assert isinstance(ack, SubscribeAck)
                    replay = await recv_events(resumed, ack.replay_event_count)
                    later = await resumed.until_turn_ends()
                    await first.until_turn_ends()

    # Before the restart: the turn's catalog events and rebuilt message.complete
    # events with their original ids, then the live client's departure.
    old = [e for e in replay if e.id <= high_water]
    expected = replayable(live.events, cursor)
    assert len(expected) == 10 and types(expected).count("message.complete") == 2
    assert_same_events(old[:-1], expected)
    gone = old[-1]
    assert gone.type == "bus.subscriber_unregistered"
    assert gone.payload.reason == "client_closed"
    assert gone.id > turn[-1].id

    # After it: the quick turn, then the streaming one restored by message.snapshot.
    new = replay[len(old) :]
    snap = new[-1]
    assert types(new[-4:]) == [
        "turn.started",
        "route.decided",
        "llm.call_started",
        "message.snapshot",
    ]
    assert_same_events(new[:-1], replayable(first.events, high_water)[: len(new) - 1])
    assert types(new[:-4]) == types(replayable(quick, high_water))
    assert snap.payload.message.content == [
        TextBlock(
            text_of([e for e in first.events if e.turn_id == snap.turn_id and e.id <= snap.id])
        )
    ]
    # The seam: exactly the live events after the message.snapshot, once each.
    assert [e.id for e in later] == [e.id for e in first.events if e.id > snap.id]
    complete = next(e for e in later if e.type == "message.complete").payload
    assert complete.final_content == [
        TextBlock(snap.payload.message.content[0].text + text_of(later))
    ]


async def test_a_parents_replay_after_a_restart_has_its_workers_events(tmp_path: Path) -> None:
    """Workers are loaded with their parent, so its replay carries their events (section 5)."""
    config = make_config(tmp_path)
    delegate = {
        "script": {
            "rounds": [
                [{"tool_use": {"name": "delegate", "input": {"task": "say hi"}}}],
                [{"text": "delegated"}],
            ]
        }
    }
    workers_filter = {"event_types": None, "actors": None, "include_worker_sessions": True}
    async with running_gateway(config) as gw:
        with trio.fail_after(10):
            sid = await gw.create_session()
            async with gw.client(sid) as live:
                await live.subscribe(filter=workers_filter)
                await gw.submit(sid, delegate)
                await live.until(lambda e: e.type == "turn.completed" and e.session_id == sid)
    worker_events = [e for e in live.events if e.session_id != sid]
    assert worker_events and any(e.type == "turn.completed" for e in worker_events)
    cursor = live.events[0].id
    async with running_gateway(config) as gw:
        with trio.fail_after(10):
            async with gw.client(sid) as resumed:
                ack = await resumed.subscribe(filter=workers_filter, since=cursor)
                assert isinstance(ack, SubscribeAck)
                replay = await recv_events(resumed, ack.replay_event_count)
    replayed = {e.id for e in replay}
    missing = [e for e in replayable(worker_events, cursor) if e.id not in replayed]
    assert not missing, types(missing)

"""The seam between snapshot/replay and live (docs/protocol.md §3), tested hard.

Behaviours 7 and 8 of the core issue: many clients attach (with a snapshot or
a ``since`` cursor) while a session streams thousands of deltas, and each one
receives every event exactly once, in id order; and a client that disconnects
at any point and resumes with ``since`` ends in the same reduced state as a
client that never left.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.client import Reducer
from gateway.protocol.events import CATALOG_TYPES, Event
from gateway.protocol.frames import EventFrame, Snapshot, SubscribeAck
from tests.conftest import Client, Harness, make_config, open_ws, running_gateway

LOREM_TURN = {"script": {"rounds": [[{"thinking": "plan"}, {"lorem": 1500}], [{"lorem": 1500}]]}}
LOREM_TOOL_TURN = {
    "script": {
        "rounds": [
            [{"lorem": 1200}, {"tool_use": {"name": "sleep", "input": {"seconds": 0.001}}}],
            [{"lorem": 1200}],
        ]
    }
}


async def _late_client(
    gw: Harness,
    sid: str,
    reference: Client,
    at: int,
    mode: str,
    results: list[tuple[str, Any, list[Event], Reducer]],
) -> None:
    """Attach now (the reference has seen ``at`` events); collect to the turn's end."""
    async with gw.client(sid) as client:
        if mode == "snapshot":
            ack = await client.subscribe(snapshot=True)
            snap = await client.recv()
            assert isinstance(snap, Snapshot)
            start: Any = snap
            if snap.session.current_turn_id is None:  # attached after the turn ended
                results.append((mode, start, client.events, client.reducer))
                return
        else:
            cursor = reference.events[max(0, at - 200)].id
            ack = await client.subscribe(since=cursor)
            start = (cursor, ack)
        assert isinstance(ack, SubscribeAck)
        await client.until(lambda e: e.type == "turn.completed")
        results.append((mode, start, client.events, client.reducer))


def _turn_over(events: list[Event]) -> bool:
    return bool(events) and events[-1].type == "turn.completed"


@pytest.mark.slow  # over a second on two cores (measured with --durations)
async def test_many_clients_attach_mid_stream_and_get_each_event_exactly_once(
    tmp_path: Path,
) -> None:
    config = make_config(tmp_path, **{"stream.queue_max_events": 100_000})
    with trio.fail_after(60):
        async with running_gateway(config) as gw:
            sid = await gw.create_session()
            for script in (LOREM_TURN, LOREM_TOOL_TURN):
                async with gw.client(sid) as reference:
                    await reference.subscribe(snapshot=True)
                    await reference.recv()  # the snapshot: the history of earlier turns
                    await gw.submit(sid, script)
                    results: list[tuple[str, Any, list[Event], Reducer]] = []
                    thresholds = list(range(50, 3000, 180))
                    async with trio.open_nursery() as nursery:
                        for i, at in enumerate(thresholds):
                            while len(reference.events) < at and not _turn_over(reference.events):
                                await reference.recv()
                            mode = "snapshot" if i % 2 else "since"
                            at = min(at, len(reference.events))
                            nursery.start_soon(_late_client, gw, sid, reference, at, mode, results)
                        if not _turn_over(reference.events):
                            await reference.until(lambda e: e.type == "turn.completed")
                    _check_exactly_once(reference, results)


def _check_exactly_once(
    reference: Client, results: list[tuple[str, Any, list[Event], Reducer]]
) -> None:
    ref = reference.events
    # nothing lost upstream of the fan-out either: each message's deltas add up
    for complete in (e for e in ref if e.type == "message.complete"):
        mid = complete.payload.message_id
        streamed = "".join(
            e.payload.text for e in ref if e.type == "text.delta" and e.payload.message_id == mid
        )
        final = "".join(b.text for b in complete.payload.final_content if hasattr(b, "text"))
        assert streamed == final
    ref_ids = [e.id for e in ref]
    assert len(results) == len(range(50, 3000, 180))
    for mode, start, events, reducer in results:
        ids = [e.id for e in events]
        assert ids == sorted(set(ids)), f"{mode}: duplicate or out of order"
        if mode == "snapshot":
            cut = start.snapshot_at_event_id or ""
            live = ids
        else:
            cursor, ack = start
            replayed = events[: ack.replay_event_count]
            live = ids[ack.replay_event_count :]
            cut = replayed[-1].id if replayed else cursor
            # the replay's catalog events are exactly the reference's, after the cursor
            assert [e.id for e in replayed if e.type in CATALOG_TYPES] == [
                e.id for e in ref if cursor < e.id <= cut and e.type in CATALOG_TYPES
            ]
        # live: every reference event after the cut, none missing, none twice
        assert live == [i for i in ref_ids if i > cut], f"{mode}: gap or duplicate at the seam"
        if mode == "snapshot":  # a since-client that began mid-session lacks the earlier history
            mine, theirs = reducer.state(), reference.reducer.state()
            if start.session.current_turn_id is None:
                # a snapshot after the end has no turn, and a cursor past the
                # reference's last event (other clients' unsubscribe events)
                for key in ("turn", "last_event_id"):
                    mine.pop(key), theirs.pop(key)
            assert mine == theirs
        assert reducer.duplicates_ignored == 0


@pytest.mark.slow  # over a second on two cores (measured with --durations)
@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(leave_after=st.integers(1, 90), away_for=st.integers(0, 60))
async def test_resume_with_since_ends_in_the_state_of_a_client_that_never_left(
    tmp_path_factory: pytest.TempPathFactory, leave_after: int, away_for: int
) -> None:
    script = {
        "script": {
            "delay_ms": 1,
            "rounds": [
                [
                    {"thinking": "Let me look at this carefully."},
                    {"text": "Running the tool now, then summing up."},
                    {"tool_use": {"name": "sleep", "input": {"seconds": 0.005}}},
                ],
                [{"thinking": "Done."}, {"text": "All done: the tool slept as asked."}],
            ],
        }
    }
    config = make_config(tmp_path_factory.mktemp("resume"))
    with trio.fail_after(20):
        async with running_gateway(config) as gw:
            sid = await gw.create_session()
            async with gw.client(sid) as reference:
                await reference.subscribe()
                resumer = Reducer(sid)
                url = await gw.ws_url(sid)
                async with open_ws(url) as ws:
                    first = Client(ws, sid)
                    first.reducer = resumer
                    await first.subscribe()
                    await gw.submit(sid, script)
                    while len(first.events) < leave_after and not _turn_over(first.events):
                        await first.recv()
                cursor = resumer.last_event_id
                target = len(first.events) + away_for
                while len(reference.events) < target and not _turn_over(reference.events):
                    await reference.recv()
                async with gw.client(sid) as second:
                    second.reducer = resumer
                    ack = await second.subscribe(since=cursor)
                    assert isinstance(ack, SubscribeAck)
                    if not _turn_over(first.events):
                        await second.until(lambda e: e.type == "turn.completed")
                if not _turn_over(reference.events):
                    await reference.until(lambda e: e.type == "turn.completed")
    assert resumer.state() == reference.reducer.state()
    assert resumer.duplicates_ignored == 0


def _frames(events: list[Any]) -> list[EventFrame]:
    return [f for f in events if isinstance(f, EventFrame)]

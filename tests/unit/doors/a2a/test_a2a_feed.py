"""A task's events after a cursor, sans-IO, against the recorded traces (docs/doors/a2a.md).

Each trace's turn is fed live once, whole (:class:`~gateway.doors.a2a.feed.TaskFeed`,
no cursor: the text as its deltas came); then, for the cursor of every event
that made, fed again as a resubscription's replay holds it (the catalog events
only: a message as its ``message.complete``, streaming-only events are never
replayed). What the client had up to the cursor and what the resubscription
sends must be the whole task: no character lost or repeated, every status
after the cursor once.
"""

from __future__ import annotations

from typing import Any

import pytest

from gateway.doors.a2a.feed import Cursor, Out, TaskFeed, parse_cursor
from gateway.protocol.events import CATALOG_TYPES
from gateway.protocol.frames import EventFrame
from tests.unit.doors.agui.test_agui_mapping import frames

TRACES = [
    "plain_text",
    "thinking_then_text",
    "parallel_tools",
    "cancel_llm",
    "cancel_tools",
    "cancel_seam",
    "provider_error",
    "tool_files",
    "unknown_events",
    "claude_code_tool",
]


def events_of(name: str) -> list[Any]:
    return [f.event for f in frames(name) if isinstance(f, EventFrame)]


def run(events: list[Any], cursor: Cursor | None = None) -> list[Out]:
    feed = TaskFeed("sess_1.turn_1", "sess_1", "turn_1", 0, cursor)
    out = feed.open() if cursor is None else []
    for event in events:
        out += feed.receive(event)
    return out + feed.pause()


def text(outs: list[Out]) -> str:
    return "".join(
        p.text or ""
        for _, e in outs
        if e.artifact_update is not None and e.artifact_update.artifact.artifact_id == "reply"
        for p in e.artifact_update.artifact.parts
    )


def statuses(outs: list[Out]) -> list[str]:
    return [e.status_update.status.state for _, e in outs if e.status_update is not None]


def test_cursors_read_back() -> None:
    at = Cursor(42, 17)
    assert str(at) == "evt_00000000000000000042.17"
    assert parse_cursor(str(at)) == at
    evt = "evt_00000000000000000042"
    for bad in ("", "evt_1.2", evt, f"{evt}.x", f"{evt}.-1", "42.17", f"{evt}.1.2"):
        assert parse_cursor(bad) is None, bad


@pytest.mark.parametrize("name", TRACES)
def test_a_task_resumes_at_every_cursor(name: str) -> None:
    events = events_of(name)
    whole = run(events)
    assert whole[0][1].task is not None  # the opening
    assert statuses(whole)[-1] in (
        "TASK_STATE_COMPLETED",
        "TASK_STATE_FAILED",
        "TASK_STATE_CANCELED",
    )
    replay = [e for e in events if e.type in CATALOG_TYPES or e.type == "message.complete"]
    for i, (cursor, _) in enumerate(whole):
        rest = run(replay, cursor)
        assert rest[0][1].task is not None, (name, i)  # the task as it stood at the cursor
        assert text(whole[: i + 1]) + text(rest) == text(whole), (name, i)
        assert statuses(rest) == statuses(whole[i + 1 :]), (name, i)
        assert all(c.seq > cursor.seq for c, _ in rest[1:]), (name, i)  # nothing again


def test_an_open_approval_ends_the_stream_unless_it_is_being_answered() -> None:
    events = events_of("cancel_seam")
    asked = [e for e in events if e.type == "permission.requested"]
    assert asked
    events = events[: events.index(asked[-1]) + 1]  # the turn waits
    feed = TaskFeed("sess_1.turn_1", "sess_1", "turn_1", 0)
    for event in events:
        feed.receive(event)
    feed.pause()
    assert feed.state == "TASK_STATE_INPUT_REQUIRED" and feed.finished
    answering = TaskFeed(
        "sess_1.turn_1", "sess_1", "turn_1", 0, answered=frozenset(e.payload.perm_id for e in asked)
    )
    for event in events:
        answering.receive(event)
    answering.pause()
    assert not answering.finished  # its answer's events are on their way


def test_another_turns_events_make_nothing() -> None:
    feed = TaskFeed("sess_1.turn_9", "sess_1", "turn_9", 0)
    assert [out for e in events_of("plain_text") for out in feed.receive(e)] == []

"""A busy session in the reference reducer and its views (docs/protocol.md §2 "A busy
session", §10 "The reference reducers").

Events built by hand, as in test_reducer.py: queued turns listed after the
conversation (``queued``), next first, with positions the view counts; a
queued turn cancelled without ending the turn in flight; a snapshot's
``queued_turns``; a steer taken by the running turn, in place and marked
``steered``, the simple view's reply moving below it only when it answered a
round. The recorded traces ``queue`` and ``steer`` (tests/streaming-conformance/)
hold both reducers to the same on a real gateway.
"""

from __future__ import annotations

from typing import Any

from gateway.client import Reducer
from gateway.client.views import full_view, simple_view
from gateway.protocol.events import (
    ContextCompacted,
    MessageStart,
    TurnCancelled,
    TurnCompleted,
    TurnQueued,
    TurnStarted,
    TurnSteered,
)
from gateway.protocol.frames import Snapshot
from gateway.protocol.shapes import QueuedTurnInfo, SessionSummary, TextBlock
from tests.unit.client.test_reducer import (
    SID,
    USAGE,
    Emitter,
    complete,
    feed,
    live,
    text_block,
    user_message,
)


def queued_of(view: Any) -> list[tuple[str, int, str]]:
    return [(q["turn_id"], q["position"], q["text"]) for q in view.get("queued", [])]


def three_queued() -> tuple[Emitter, Reducer]:
    emit = Emitter()
    emit(TurnStarted("turn_a", user_message("turn_a", "A")))
    for n, name in enumerate(("b", "c", "d"), start=1):
        emit(TurnQueued(f"turn_{name}", n, user_message(f"turn_{name}", name.upper())))
    return emit, live(emit.events)


def test_queued_turns_are_listed_after_the_conversation_next_first() -> None:
    _, reducer = three_queued()
    for view in (full_view(reducer), simple_view(reducer)):
        assert queued_of(view) == [("turn_b", 1, "B"), ("turn_c", 2, "C"), ("turn_d", 3, "D")]
    assert full_view(reducer)["queued"][0]["message_id"] == "msg_u_turn_b"
    # not part of the conversation before they start
    assert [m["id"] for m in full_view(reducer)["messages"]] == ["msg_u_turn_a"]
    assert [e["text"] for e in simple_view(reducer)["thread"]] == ["A"]
    assert [q["turn_id"] for q in reducer.state()["queued"]] == ["turn_b", "turn_c", "turn_d"]


def test_a_cancelled_queued_turn_leaves_and_the_running_one_stays_in_flight() -> None:
    emit, reducer = three_queued()
    feed(reducer, emit(TurnCancelled("turn_c", "user", "queued", False)))
    assert reducer.running_turn_id == "turn_a"
    assert queued_of(simple_view(reducer)) == [("turn_b", 1, "B"), ("turn_d", 2, "D")]
    feed(reducer, emit(TurnCompleted("turn_a", "end_turn", USAGE, 0.0, 0.0)))
    feed(reducer, emit(TurnStarted("turn_b", user_message("turn_b", "B"))))
    view = full_view(reducer)
    assert queued_of(view) == [("turn_d", 1, "D")]  # it moved up
    assert [m["id"] for m in view["messages"]] == ["msg_u_turn_a", "msg_u_turn_b"]
    feed(reducer, emit(TurnCompleted("turn_b", "end_turn", USAGE, 0.0, 0.0)))
    feed(reducer, emit(TurnStarted("turn_d", user_message("turn_d", "D"))))
    assert "queued" not in full_view(reducer) and "queued" not in simple_view(reducer)


def test_a_snapshot_brings_the_queue_and_replaces_it() -> None:
    _, reducer = three_queued()
    summary = SessionSummary(
        SID, "/w", "scripted:echo", "static-1", 0.0, 1, "turn_a", "in_flight", None
    )
    summary.queued_turns = [QueuedTurnInfo("turn_d", 1, user_message("turn_d", "D"))]
    snapshot = Snapshot(summary, [user_message("turn_a", "A")], "evt_00000000000000000009")
    reducer.apply(snapshot)
    assert queued_of(full_view(reducer)) == [("turn_d", 1, "D")]
    fresh = Reducer(SID)
    fresh.apply(snapshot)
    assert full_view(fresh) == full_view(reducer)
    summary.queued_turns = []
    reducer.apply(Snapshot(summary, [user_message("turn_a", "A")], "evt_00000000000000000010"))
    assert "queued" not in simple_view(reducer)


def steered(turn_id: str, text: str) -> Any:
    message = user_message(turn_id, text)
    message.id = f"msg_steer_{text}"
    return TurnSteered(turn_id, message)


def round_(message_id: str, text: str) -> list[Any]:
    return [
        MessageStart(message_id, "assistant", "m"),
        *text_block(message_id, 0, text),
        complete(message_id, "end_turn", TextBlock(text)),
    ]


def entries(reducer: Reducer) -> list[tuple[str, str, bool]]:
    return [(e["role"], e["text"], e.get("steered", False)) for e in simple_view(reducer)["thread"]]


def test_a_steer_stands_in_its_turn_and_the_next_rounds_reply_goes_below_it() -> None:
    emit = Emitter()
    reducer = live(
        emit(TurnStarted("turn_a", user_message("turn_a", "A")), *round_("msg_r1", "Looking."))
    )
    feed(reducer, emit(steered("turn_a", "also"), steered("turn_a", "and")))
    # until the next round starts, the earlier round's text stays where it was
    assert entries(reducer) == [
        ("user", "A", False),
        ("assistant", "Looking.", False),
        ("user", "also", True),
        ("user", "and", True),
    ]
    feed(reducer, emit(MessageStart("msg_r2", "assistant", "m")))
    assert entries(reducer) == [
        ("user", "A", False),
        ("user", "also", True),
        ("user", "and", True),
        ("assistant", "", False),
    ]
    feed(reducer, emit(*round_("msg_r2", "Done.")[1:]))
    full = full_view(reducer)
    assert [(m["id"], m.get("steered", False)) for m in full["messages"]] == [
        ("msg_u_turn_a", False),
        ("msg_r1", False),
        ("msg_steer_also", True),
        ("msg_steer_and", True),
        ("msg_r2", False),
    ]
    assert all(m["turn_id"] == "turn_a" for m in full["messages"])
    assert entries(reducer)[-1] == ("assistant", "Done.", False)


def test_a_steer_before_the_first_round_moves_no_reply() -> None:
    """Taken before the turn's first call: the reply comes after it anyway, and a
    compaction in the middle of the turn does not make it move later."""
    emit = Emitter()
    reducer = live(
        emit(
            TurnStarted("turn_a", user_message("turn_a", "A")),
            steered("turn_a", "early"),
            *round_("msg_r1", "One."),
            ContextCompacted("auto", "summary", 10, 2, "msg_ctx", "msg_r1"),
            *round_("msg_r2", "Two."),
        )
    )
    assert [(role, text) for role, text, _ in entries(reducer)] == [
        ("user", "A"),
        ("user", "early"),
        ("assistant", "Two."),
        ("context", ""),
    ]

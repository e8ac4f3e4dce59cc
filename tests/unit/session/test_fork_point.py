"""Where a session may be forked, and what the fork starts with (gateway.session.fork_point).

Sans-IO: lists of messages in, a :class:`ForkPoint` or a refusal out
(docs/protocol.md §2, "Forks").
"""

from __future__ import annotations

from typing import Any

import pytest

from gateway.errors import Refused
from gateway.protocol.http import ForkOrigin
from gateway.protocol.shapes import (
    CompactionBlock,
    Message,
    Role,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from gateway.session.fork_point import (
    ForkPoint,
    fork_messages,
    fork_metadata,
    fork_point,
    is_prompt,
    origin_of,
    turns_in,
)


def message(
    id_: str, role: Role, turn: str | None, *blocks: Any, status: Any = "complete"
) -> Message:
    return Message(id_, "sess_1", turn, role, list(blocks) or [TextBlock(id_)], status, 0)


# Two turns: a plain one, then one with a tool round; a compaction between them.
U1 = message("u1", "user", "t1")
A1 = message("a1", "assistant", "t1")
C1 = message("c1", "context", None, CompactionBlock("summary", ["u1", "a1"]))
U2 = message("u2", "user", "t2")
A2 = message("a2", "assistant", "t2", ToolUseBlock("toolu_1", "sleep", {}))
R2 = message("r2", "user", "t2", ToolResultBlock("toolu_1", "slept"))
F2 = message("f2", "assistant", "t2")
HISTORY = [U1, A1, C1, U2, A2, R2, F2]


def ids(point: ForkPoint) -> list[str]:
    return [m.id for m in point.history]


def test_a_message_that_ends_a_turn_is_kept_with_everything_before_it() -> None:
    assert ids(fork_point(HISTORY, "a1", "sess_1")) == ["u1", "a1"]
    assert ids(fork_point(HISTORY, "f2", "sess_1")) == [m.id for m in HISTORY]
    assert fork_point(HISTORY, "f2", "sess_1").draft is None


def test_a_message_of_no_turn_is_a_fork_point() -> None:
    point = fork_point(HISTORY, "c1", "sess_1")
    assert ids(point) == ["u1", "a1", "c1"] and point.draft is None


def test_a_user_message_is_the_draft_and_not_in_the_history() -> None:
    point = fork_point(HISTORY, "u2", "sess_1")
    assert ids(point) == ["u1", "a1", "c1"]
    assert point.draft == [TextBlock("u2")] and point.at_message_id == "u2"
    first = fork_point(HISTORY, "u1", "sess_1")
    assert first.history == [] and first.draft == [TextBlock("u1")]


def test_a_turn_with_no_reply_ends_at_its_user_message_which_is_a_draft() -> None:
    failed = [U1, A1, message("u3", "user", "t3")]
    point = fork_point(failed, None, "sess_1")
    assert ids(point) == ["u1", "a1"] and point.draft == [TextBlock("u3")]


def test_a_cancelled_turn_ends_at_its_last_message_whatever_it_is() -> None:
    cancelled = [U2, A2, R2]  # cancelled in the tools phase: its results are its last message
    assert ids(fork_point(cancelled, "r2", "sess_1")) == ["u2", "a2", "r2"]
    asked = [U2, A2]  # the turn ended (a restart) before its tools ran
    assert ids(fork_point(asked, "a2", "sess_1")) == ["u2", "a2"]


@pytest.mark.parametrize("mid_turn", ["a2", "r2"])
def test_a_message_in_the_middle_of_a_turn_is_refused_naming_the_points(mid_turn: str) -> None:
    with pytest.raises(Refused) as refused:
        fork_point(HISTORY, mid_turn, "sess_1")
    assert refused.value.code == "not_a_fork_point"
    assert "'f2'" in refused.value.message and "'u2'" in refused.value.message
    assert "turn t2" in refused.value.message


def test_a_compaction_inside_a_turn_is_in_the_middle_of_it() -> None:
    inside = [U2, A2, R2, message("c2", "context", "t2", CompactionBlock("s", ["u2"])), F2]
    with pytest.raises(Refused, match="in the middle of turn t2"):
        fork_point(inside, "c2", "sess_1")


def test_an_unknown_message_is_not_found() -> None:
    with pytest.raises(Refused) as refused:
        fork_point(HISTORY, "msg_other", "sess_1")
    assert refused.value.code == "message_not_found"
    assert "'msg_other'" in refused.value.message and "sess_1" in refused.value.message


def test_no_message_named_is_the_last_and_an_empty_session_forks_empty() -> None:
    assert fork_point(HISTORY, None, "sess_1").at_message_id == "f2"
    assert fork_point([], None, "sess_1") == ForkPoint(None, [])
    with pytest.raises(Refused, match="no message"):
        fork_point([], "u1", "sess_1")


def test_the_copies_keep_their_ids_and_turns_and_are_the_forks() -> None:
    copies = fork_messages(HISTORY, "sess_2")
    assert [(m.id, m.turn_id) for m in copies] == [(m.id, m.turn_id) for m in HISTORY]
    assert {m.session_id for m in copies} == {"sess_2"}
    assert HISTORY[0].session_id == "sess_1"  # the source's are untouched
    assert turns_in(HISTORY) == 2 and turns_in([]) == 0


def test_prompts_are_user_messages_without_tool_results() -> None:
    assert is_prompt(U1) and not is_prompt(R2) and not is_prompt(A1) and not is_prompt(C1)


def test_the_metadata_says_where_a_fork_comes_from_and_its_draft() -> None:
    point = fork_point(HISTORY, "u2", "sess_1")
    source = {"title": "plans", "forked_from": {"session_id": "old"}, "draft": "old"}
    metadata = fork_metadata(source, "sess_1", point)
    assert metadata == {
        "title": "plans",
        "forked_from": {"session_id": "sess_1", "at_message_id": "u2"},
        "draft": [{"type": "text", "text": "u2"}],
    }
    assert origin_of(metadata) == (ForkOrigin("sess_1", "u2"), [TextBlock("u2")])
    kept = fork_metadata(source, "sess_1", fork_point(HISTORY, "a1", "sess_1"))
    assert "draft" not in kept and origin_of(kept) == (ForkOrigin("sess_1", "a1"), None)


def test_metadata_not_in_the_shape_a_fork_writes_says_nothing() -> None:
    assert origin_of({}) == (None, None)
    assert origin_of({"forked_from": "sess_1"}) == (None, None)  # a client's own key
    assert origin_of({"draft": [{"type": "text", "text": "x"}]}) == (None, None)
    bad_draft = {"forked_from": {"session_id": "s", "at_message_id": None}, "draft": 3}
    assert origin_of(bad_draft) == (None, None)

"""What a rewind hides, checks and changes (gateway.session.rewind), without a gateway.

The pure part: given the stored messages (in the stored order) and the
record's rewinds, which messages are rewound (docs/protocol.md §2 "Edit and
regenerate"); then the check at submit and the step at the turn's start on a
stand-in session.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import msgspec
import pytest

from gateway.errors import Refused
from gateway.protocol.events import HistoryRewound, Payload, StreamEvent
from gateway.protocol.shapes import (
    CompactionBlock,
    ContentBlock,
    Message,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from gateway.session import history, rewind
from gateway.session.hub import Emitted
from gateway.session.turn import Turn
from gateway.store.base import Rewind, SessionRecord, StoredMessage


def msg(id_: str, turn: str, role: str = "user", *blocks: ContentBlock) -> Message:
    content = list(blocks) or [TextBlock(id_)]
    return Message(id_, "sess_1", turn, role, content, "complete", 0)  # type: ignore[arg-type]


def conversation(*turns: str) -> list[Message]:
    """For each turn ``t``: its user message ``u_t`` and its answer ``a_t``."""
    return [m for t in turns for m in (msg(f"u_{t}", t), msg(f"a_{t}", t, "assistant"))]


def test_nothing_is_hidden_without_a_rewind() -> None:
    messages = conversation("1", "2")
    assert rewind.hidden(messages, []) == set()
    assert rewind.split(messages, []) == (messages, [])


def test_a_rewind_hides_from_its_message_to_the_turn_that_rewound() -> None:
    messages = conversation("1", "2", "3", "4")
    assert rewind.hidden(messages, [Rewind("u_2", "4")]) == {"u_2", "a_2", "u_3", "a_3"}
    visible, gone = rewind.split(messages, [Rewind("u_2", "4")])
    assert [m.id for m in visible] == ["u_1", "a_1", "u_4", "a_4"]
    assert [m.id for m in gone] == ["u_2", "a_2", "u_3", "a_3"]


def test_regenerate_hides_the_last_turn_only() -> None:
    messages = conversation("1", "2", "3")
    assert rewind.hidden(messages, [Rewind("u_2", "3")]) == {"u_2", "a_2"}


def test_rewinds_nest() -> None:
    # 1 2 3, then 4 rewinds to 2; then 5 rewinds to 1 (hiding 1 and 4, and 2, 3 stay hidden)
    messages = conversation("1", "2", "3", "4", "5")
    first = Rewind("u_2", "4")
    assert rewind.hidden(messages, [first, Rewind("u_4", "5")]) == {
        "u_2", "a_2", "u_3", "a_3", "u_4", "a_4"
    }  # fmt: skip
    everything = rewind.hidden(messages, [first, Rewind("u_1", "5")])
    assert everything == {m.id for m in messages} - {"u_5", "a_5"}


def test_a_rewind_whose_turn_is_not_stored_hides_to_the_end() -> None:
    messages = conversation("1", "2", "3")
    assert rewind.hidden(messages, [Rewind("u_2", "9")]) == {"u_2", "a_2", "u_3", "a_3"}


def test_a_rewind_of_an_unknown_message_hides_nothing() -> None:
    messages = conversation("1", "2")
    assert rewind.hidden(messages, [Rewind("u_9", "2")]) == set()


def test_a_summary_stored_after_the_message_leaves_with_it() -> None:
    # A manual compaction after turn 2 replaces turn 1; turn 3 then rewinds to turn 2.
    summary = msg("ctx", "", "context", CompactionBlock("sum", ["u_1", "a_1"]))
    messages = [*conversation("1", "2"), summary, *conversation("3")]
    assert rewind.hidden(messages, [Rewind("u_2", "3")]) == {"u_2", "a_2", "ctx"}
    # ... rewound to a turn after it, the summary stays
    messages = [*conversation("1", "2"), summary, *conversation("3", "4")]
    assert rewind.hidden(messages, [Rewind("u_3", "4")]) == {"u_3", "a_3"}


def test_a_tool_round_is_hidden_whole() -> None:
    use = ToolUseBlock("toolu_1", "sleep", {})
    messages = [
        *conversation("1"),
        msg("u_2", "2"),
        msg("a_2", "2", "assistant", use),
        msg("r_2", "2", "user", ToolResultBlock("toolu_1", "ok", False)),
        msg("b_2", "2", "assistant"),
        *conversation("3"),
    ]
    assert rewind.hidden(messages, [Rewind("u_2", "3")]) == {"u_2", "a_2", "r_2", "b_2"}


def test_a_loaded_history_is_split_and_counts_every_message() -> None:
    messages = conversation("1", "2", "3")
    stored = [StoredMessage(m, None) for m in messages]
    loaded = history.read(stored, [Rewind("u_2", "3")])
    assert [m.id for m in loaded.messages] == ["u_1", "a_1", "u_3", "a_3"]
    assert [m.id for m in loaded.rewound] == ["u_2", "a_2"]
    assert set(loaded.message_bytes) == {m.id for m in messages}  # max_session_mb counts them
    assert history.read(stored).rewound == []


# --- the check and the step, on a stand-in session ------------------------------------------


class Stand:
    """What :mod:`gateway.session.rewind` uses of a session."""

    def __init__(self, messages: list[Message]) -> None:
        self.id = "sess_1"
        self.record = SessionRecord("sess_1", 0, "w", "scripted:echo", {}, None, "static-1")
        self.messages = messages
        self.rewound: list[Message] = []
        self.emitted: list[tuple[Any, str | None]] = []

    def emit(self, payloads: Iterable[Payload | StreamEvent], turn_id: str | None) -> list[Emitted]:
        self.emitted += [(p, turn_id) for p in payloads]
        return []


def refused(stand: Stand, message_id: str) -> str:
    with pytest.raises(Refused) as caught:
        rewind.check(stand, message_id)
    return caught.value.code


def test_the_check_refuses_what_is_no_user_message_of_the_conversation() -> None:
    results = msg("r_1", "1", "user", ToolResultBlock("toolu_1", "ok", False))
    summary = msg("ctx", "1", "context", CompactionBlock("sum", []))
    stand = Stand([*conversation("1"), results, summary, *conversation("2")])
    stand.rewound = conversation("0")
    rewind.check(stand, None)
    rewind.check(stand, "u_2")
    rewind.check(stand, "u_1")
    assert refused(stand, "a_1") == "not_a_user_message"
    assert refused(stand, "r_1") == "not_a_user_message"
    assert refused(stand, "ctx") == "not_a_user_message"
    assert refused(stand, "u_0") == "message_rewound"
    assert refused(stand, "a_0") == "message_rewound"
    assert refused(stand, "msg_elsewhere") == "message_not_found"
    # a turn whose own user message was rewound (a door naming it after its client's id)
    with pytest.raises(Refused) as caught:
        rewind.check(stand, None, "u_0")
    assert caught.value.code == "message_rewound"
    rewind.check(stand, None, "u_3")


def test_the_step_moves_the_messages_records_the_rewind_and_emits() -> None:
    stand = Stand(conversation("1", "2", "3"))
    stored_rewinds = stand.record.rewinds
    turn = Turn("4", msg("u_4", "4"), rewind_to="u_2")
    rewind.apply(stand, turn)
    assert [m.id for m in stand.messages] == ["u_1", "a_1"]
    assert [m.id for m in stand.rewound] == ["u_2", "a_2", "u_3", "a_3"]
    assert stand.record.rewinds == [Rewind("u_2", "4")]
    assert stored_rewinds == []  # a new list: the one it had is left as it was
    assert stand.emitted == [(HistoryRewound("u_2", "4"), "4")]
    # the same, read back from the store's order and the record
    stored = [*conversation("1", "2", "3"), msg("u_4", "4")]
    assert [m.id for m in rewind.split(stored, stand.record.rewinds)[0]] == ["u_1", "a_1", "u_4"]


def test_the_step_does_nothing_without_a_rewind_and_skips_a_stale_one() -> None:
    stand = Stand(conversation("1", "2"))
    rewind.apply(stand, Turn("3", msg("u_3", "3")))
    assert (len(stand.messages), stand.emitted, stand.record.rewinds) == (4, [], [])
    stale = Turn("3", msg("u_3", "3"), rewind_to="a_1")  # no user message: logged, skipped
    rewind.apply(stand, stale)
    assert (len(stand.messages), stand.emitted, stale.rewind_to) == (4, [], None)


def test_the_listed_message_says_rewound_only_when_it_is() -> None:
    from gateway.protocol.http import ListedMessage

    m = msg("u_1", "1")
    plain = msgspec.to_builtins(ListedMessage(**msgspec.structs.asdict(m)))
    assert plain == msgspec.to_builtins(m)
    flagged = msgspec.to_builtins(ListedMessage(**msgspec.structs.asdict(m), rewound=True))
    assert flagged == {**msgspec.to_builtins(m), "rewound": True}

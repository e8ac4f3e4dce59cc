"""Rule 4 of :mod:`gateway.providers.history`: tool uses and results are paired
within an assistant message and the next one, and the ids sent are unique.

Sessions stored before the OpenAI-compatible provider gave tool uses ids of
its own hold the servers' ids, and some servers repeat theirs (``call_0`` in
every response, or on every call of one). Each use must still pair with its
own result, under an id used once in the request. Sans-IO, synchronous.
"""

from __future__ import annotations

from gateway.protocol.shapes import (
    ContentBlock,
    Message,
    MessageStatus,
    Role,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from gateway.providers.history import HistoryMessage, rebuild


def message(role: Role, *content: ContentBlock, status: MessageStatus = "complete") -> Message:
    return Message("msg_x", "sess_1", "turn_1", role, list(content), status, 0)


def use(id_: str, path: str) -> ToolUseBlock:
    return ToolUseBlock(id_, "read_file", {"path": path})


def result(id_: str, content: str) -> ToolResultBlock:
    return ToolResultBlock(id_, content)


def pairs(history: list[HistoryMessage]) -> list[tuple[str, str, str]]:
    """(id sent, the path asked, the result answered) for every tool use, in order."""
    uses = [b for m in history for b in m.content if isinstance(b, ToolUseBlock)]
    results = {
        b.tool_use_id: b.content
        for m in history
        for b in m.content
        if isinstance(b, ToolResultBlock)
    }
    return [(u.id, u.input["path"], results[u.id]) for u in uses]


def test_an_id_repeated_across_calls_pairs_with_its_own_result_under_a_new_name() -> None:
    history = rebuild(
        [
            message("user", TextBlock("read a, then b")),
            message("assistant", use("call_0", "a")),
            message("user", result("call_0", "alpha")),
            message("assistant", use("call_0", "b")),
            message("user", result("call_0", "beta")),
        ]
    )
    assert pairs(history) == [("call_0", "a", "alpha"), ("call_0_2", "b", "beta")]
    assert [m.role for m in history] == ["user", "assistant", "user", "assistant", "user"]


def test_an_id_repeated_within_one_message_pairs_in_order() -> None:
    history = rebuild(
        [
            message("user", TextBlock("read a and b")),
            message("assistant", use("call_0", "a"), use("call_0", "b")),
            message("user", result("call_0", "alpha"), result("call_0", "beta")),
        ]
    )
    assert pairs(history) == [("call_0", "a", "alpha"), ("call_0_2", "b", "beta")]


def test_the_new_names_avoid_ids_already_taken_and_are_the_same_on_every_call() -> None:
    stored = [
        message("user", TextBlock("go")),
        message("assistant", use("x", "1"), use("x_2", "2"), use("x", "3")),
        message("user", result("x", "one"), result("x_2", "two"), result("x", "three")),
    ]
    assert pairs(rebuild(stored)) == [("x", "1", "one"), ("x_2", "2", "two"), ("x_3", "3", "three")]
    assert rebuild(stored) == rebuild(stored)


def test_a_result_pairs_only_with_the_message_just_before() -> None:
    """The second call_0 was cancelled: it never ran, its old namesake's result is not its."""
    history = rebuild(
        [
            message("user", TextBlock("go")),
            message("assistant", use("call_0", "a")),
            message("user", result("call_0", "alpha")),
            message("assistant", use("call_0", "b"), status="cancelled"),
            message("user", TextBlock("never mind")),
        ]
    )
    assert pairs(history) == [("call_0", "a", "alpha")]
    # the cancelled message, left with nothing to say, is dropped (rule 5)
    assert history[1:] == [
        HistoryMessage("assistant", [use("call_0", "a")]),
        HistoryMessage("user", [result("call_0", "alpha"), TextBlock("never mind")]),
    ]


def test_results_come_first_in_the_order_of_their_uses_and_unique_ids_pass_unchanged() -> None:
    history = rebuild(
        [
            message("user", TextBlock("go")),
            message("assistant", TextBlock("Reading."), use("tu_1", "a"), use("tu_2", "b")),
            message(
                "user", TextBlock("also this"), result("tu_2", "beta"), result("tu_1", "alpha")
            ),
        ]
    )
    assert history[2] == HistoryMessage(
        "user", [result("tu_1", "alpha"), result("tu_2", "beta"), TextBlock("also this")]
    )
    assert pairs(history) == [("tu_1", "a", "alpha"), ("tu_2", "b", "beta")]

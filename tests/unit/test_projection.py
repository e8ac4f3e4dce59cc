"""The shared projection of a turn's events (gateway.protocol.projection), with a toy door.

The toy door's emitters write one line per message, so each rule of the walk
(the turn filter, the blocks, the steps, the closing) shows as text; the two
real doors (AG-UI, the AI SDK) run every recorded trace through it in
tests/unit/doors/agui and tests/unit/doors/aisdk.
"""

from __future__ import annotations

from typing import Any

import pytest

from gateway.protocol.events import (
    Envelope,
    LlmCallCompleted,
    LlmCallFailed,
    LlmCallStarted,
    MessageComplete,
    Payload,
    PermissionRequested,
    TextDelta,
    TextEnd,
    TextStart,
    ThinkingDelta,
    ThinkingEnd,
    ThinkingStart,
    ToolUseEnd,
    ToolUseInputDelta,
    ToolUseStart,
)
from gateway.protocol.projection import Block, Emitters, Handler, Projection, indexed_id
from gateway.protocol.shapes import ContentBlock, TextBlock, Usage


class _Lines:
    """Every kind of block, as ``start``/``delta``/``end`` lines naming it."""

    def name(self, b: Block) -> str:
        return b.tool_use_id or indexed_id(b)

    def start(self, b: Block, ts: int) -> list[str]:
        return [f"start {b.kind} {b.id}"]

    def delta(self, b: Block, text: str, ts: int) -> list[str]:
        return [f"delta {b.id} {text}"]

    def end(self, b: Block, ts: int | None) -> list[str]:
        how = "ended" if b.ended else "cut"
        extra = "".join(b.data) if b.kind in ("redacted", "tool") else b.signature
        return [f"{how} {b.id} {extra or ''}".rstrip()]


class _Steps:
    def start(self, call_id: str, ts: int) -> list[str]:
        return [f"step {call_id}"]

    def end(self, call_id: str, ts: int | None) -> list[str]:
        return [f"step-end {call_id}"]


def _asked(p: PermissionRequested, e: Envelope[Any]) -> list[str]:
    return [f"asked {p.perm_id} by {e.session_id}"]


def _projection() -> Projection[str]:
    lines = _Lines()
    events: dict[type[Payload], Handler[str]] = {PermissionRequested: _asked}
    blocks = {"text": lines, "thinking": lines, "redacted": lines, "tool": lines}
    return Projection("sess_1", "turn_1", Emitters(blocks, _Steps(), events))  # type: ignore[arg-type]


def _ev(payload: Payload, turn: str | None = "turn_1", session: str = "sess_1") -> Envelope[Any]:
    return Envelope("evt_1", "x", session, turn, 1, "llm", payload)


def _complete(message_id: str, blocks: list[ContentBlock]) -> MessageComplete:
    return MessageComplete(message_id, "end_turn", blocks, Usage())


def _run(p: Projection[str], *payloads: Payload) -> list[str]:
    return [line for payload in payloads for line in p.receive(_ev(payload))]


def test_blocks_open_stream_and_close() -> None:
    p = _projection()
    assert _run(
        p,
        TextStart("m", 0), TextDelta("m", 0, "Hi"), TextDelta("m", 0, ""), TextEnd("m", 0),
        ThinkingStart("m", 1, False), ThinkingDelta("m", 1, "hmm", None),
        ThinkingEnd("m", 1, "sig"),
        ThinkingStart("m", 2, True), ThinkingDelta("m", 2, "op", None),
        ThinkingDelta("m", 2, "aque", None), ThinkingEnd("m", 2, None),
        ToolUseStart("m", 3, "tu_1", "bash"), ToolUseInputDelta("m", 3, "tu_1", '{"a":'),
        ToolUseInputDelta("m", 3, "tu_1", "1}"), ToolUseEnd("m", 3, "tu_1", "bash", {"a": 1}),
        ToolUseStart("m", 4, "tu_2", "ls"), ToolUseEnd("m", 4, "tu_2", "ls", {"b": 2}),
    ) == [
        "start text m:0", "delta m:0 Hi", "ended m:0",
        "start thinking m:1", "delta m:1 hmm", "ended m:1 sig",
        "start redacted m:2", "ended m:2 opaque",  # opaque data: kept, never streamed
        "start tool tu_1", 'delta tu_1 {"a":', "delta tu_1 1}", 'ended tu_1 {"a":1}',
        "start tool tu_2", 'delta tu_2 {"b":2}', 'ended tu_2 {"b":2}',  # the input in one piece
    ]  # fmt: skip
    assert p.started("m", 4) and not p.started("m", 5)


def test_a_cut_closes_the_open_blocks_of_its_message_then_the_end_closes_the_rest() -> None:
    p = _projection()
    out = _run(
        p,
        LlmCallStarted("call_1", "m1"),
        TextStart("a", 0), TextDelta("a", 0, "x"), TextStart("b", 0),
        ToolUseStart("a", 1, "tu_1", "bash"), ToolUseInputDelta("a", 1, "tu_1", "{"),
        _complete("a", []),
    )  # fmt: skip
    assert out[-2:] == ["cut a:0", "cut tu_1 {"]  # message b's block is still open
    assert p.end(None) == ["cut b:0", "step-end call_1"]
    assert p.finished and _run(p, TextStart("c", 0)) == []


def test_steps_end_once_and_the_last_failure_is_kept() -> None:
    p = _projection()
    failed = LlmCallFailed("call_2", "overloaded", "busy")
    assert _run(
        p,
        LlmCallStarted("call_1", "m1"), LlmCallCompleted("call_1", "a", "end_turn", Usage()),
        LlmCallCompleted("call_1", "a", "end_turn", Usage()), LlmCallStarted("call_2", "m1"),
        failed,
    ) == ["step call_1", "step-end call_1", "step call_2", "step-end call_2"]  # fmt: skip
    assert p.failure == failed


def test_the_turn_filter_lets_a_workers_request_through() -> None:
    p = _projection()
    asked = PermissionRequested("perm_1", "tu_1", "bash", {}, 0)
    assert p.receive(_ev(TextStart("m", 0), turn="turn_2")) == []
    assert p.receive(_ev(asked, turn="turn_2")) == []  # this session's, of another turn
    assert p.receive(_ev(asked, turn="turn_w", session="sess_w")) == ["asked perm_1 by sess_w"]


def test_a_whole_message_rebuilds_only_the_blocks_not_started() -> None:
    p = _projection()
    _run(p, TextStart("m", 0), TextDelta("m", 0, "a"))
    whole = _complete("m", [TextBlock("ab"), TextBlock("cd")])
    assert p.rebuilt(_ev(whole)) == ["start text m:1", "delta m:1 cd", "ended m:1"]


def test_a_door_does_not_take_over_the_block_events() -> None:
    lines = _Lines()
    blocks = {"text": lines, "thinking": lines, "redacted": lines, "tool": lines}
    events: dict[type[Payload], Handler[str]] = {TextStart: lambda p, e: ["mine"]}
    with pytest.raises(AssertionError):
        Projection("sess_1", "turn_1", Emitters(blocks, _Steps(), events))  # type: ignore[arg-type]

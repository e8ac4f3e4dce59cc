"""gateway.translate: raw provider events in, canonical stream events out.

Rules of these tests, after h11's: synchronous, one raw event at a time, and
each step asserts the exact canonical events that come out (docs/protocol.md sections
5, 7 and 8), never just their count.
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from gateway.errors import ProviderError
from gateway.protocol.events import (
    MessageComplete,
    MessageStart,
    StreamEvent,
    TextDelta,
    TextEnd,
    TextStart,
    ThinkingDelta,
    ThinkingEnd,
    ThinkingStart,
    ToolUseEnd,
    ToolUseInputDelta,
    ToolUseStart,
    stream_event,
)
from gateway.protocol.shapes import (
    ContentBlock,
    Message,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    ToolUseBlock,
    Usage,
)
from gateway.providers.raw import (
    RawContentBlock,
    RawContentBlockDelta,
    RawContentBlockStart,
    RawContentBlockStop,
    RawDelta,
    RawError,
    RawErrorBody,
    RawEvent,
    RawInputJsonDelta,
    RawMessage,
    RawMessageDelta,
    RawMessageDeltaBody,
    RawMessageStart,
    RawMessageStop,
    RawPing,
    RawRedactedThinkingBlock,
    RawSignatureDelta,
    RawTextBlock,
    RawTextDelta,
    RawThinkingBlock,
    RawThinkingDelta,
    RawToolUseBlock,
    RawUsage,
)
from gateway.translate import Translator

M = "msg_01"  # the provider's message id
ev = stream_event


def translator(**kwargs: Any) -> Translator:
    return Translator(
        session_id="sess_1", turn_id="turn_1", model="anthropic:claude", created_at=1000, **kwargs
    )


def message_start(model: str = "claude-x", input_tokens: int = 10) -> RawMessageStart:
    return RawMessageStart(RawMessage(M, model, usage=RawUsage(input_tokens, 1)))


def opens(index: int, block: RawContentBlock) -> RawContentBlockStart:
    return RawContentBlockStart(index, block)


def delta(index: int, d: RawDelta) -> RawContentBlockDelta:
    return RawContentBlockDelta(index, d)


def stops(index: int) -> RawContentBlockStop:
    return RawContentBlockStop(index)


def message_delta(stop_reason: str | None, output_tokens: int | None = None) -> RawMessageDelta:
    return RawMessageDelta(RawMessageDeltaBody(stop_reason), RawUsage(output_tokens=output_tokens))


def feed_all(tr: Translator, raws: list[RawEvent]) -> list[StreamEvent]:
    events: list[StreamEvent] = []
    for raw in raws:
        events += tr.feed(raw)
    return events


def test_text_only() -> None:
    tr = translator()
    assert (tr.started, tr.finished, tr.message_id, tr.message) == (False, False, None, None)

    assert tr.feed(message_start()) == [ev(MessageStart(M, "assistant", "claude-x"))]
    assert (tr.started, tr.message_id) == (True, M)
    assert tr.feed(RawPing()) == []
    assert tr.feed(opens(0, RawTextBlock())) == [ev(TextStart(M, 0))]
    assert tr.feed(delta(0, RawTextDelta("Hel"))) == [ev(TextDelta(M, 0, "Hel"))]
    assert tr.feed(delta(0, RawTextDelta("lo."))) == [ev(TextDelta(M, 0, "lo."))]
    assert tr.feed(stops(0)) == [ev(TextEnd(M, 0))]
    assert tr.feed(message_delta("end_turn", 7)) == []
    assert tr.stop_reason == "end_turn"
    assert not tr.finished

    usage = Usage(input_tokens=10, output_tokens=7)
    assert tr.feed(RawMessageStop()) == [
        ev(MessageComplete(M, "end_turn", [TextBlock("Hello.")], usage))
    ]
    assert tr.finished
    assert tr.error is None
    assert tr.usage == usage
    assert tr.message == Message(
        id=M,
        session_id="sess_1",
        turn_id="turn_1",
        role="assistant",
        content=[TextBlock("Hello.")],
        status="complete",
        created_at=1000,
        model="claude-x",
        usage=usage,
    )


def test_thinking_with_signature_then_text() -> None:
    tr = translator()
    tr.feed(message_start())
    assert tr.feed(opens(0, RawThinkingBlock("", ""))) == [ev(ThinkingStart(M, 0, redacted=False))]
    assert tr.feed(delta(0, RawThinkingDelta("Let me "))) == [
        ev(ThinkingDelta(M, 0, "Let me ", None))
    ]
    assert tr.feed(delta(0, RawThinkingDelta("think."))) == [
        ev(ThinkingDelta(M, 0, "think.", None))
    ]
    assert tr.feed(delta(0, RawSignatureDelta("sig=="))) == [ev(ThinkingDelta(M, 0, "", "sig=="))]
    assert tr.feed(stops(0)) == [ev(ThinkingEnd(M, 0, "sig=="))]
    assert tr.feed(opens(1, RawTextBlock())) == [ev(TextStart(M, 1))]
    assert tr.feed(delta(1, RawTextDelta("Done."))) == [ev(TextDelta(M, 1, "Done."))]
    assert tr.feed(stops(1)) == [ev(TextEnd(M, 1))]
    assert tr.feed(message_delta("end_turn", 20)) == []
    content: list[ContentBlock] = [ThinkingBlock("Let me think.", "sig=="), TextBlock("Done.")]
    assert tr.feed(RawMessageStop()) == [
        ev(MessageComplete(M, "end_turn", content, Usage(input_tokens=10, output_tokens=20)))
    ]
    assert tr.message is not None
    assert tr.message.content == content


def test_text_then_two_tool_uses_with_fragmented_input() -> None:
    tr = translator()
    tr.feed(message_start())
    feed_all(tr, [opens(0, RawTextBlock()), delta(0, RawTextDelta("Checking.")), stops(0)])

    assert tr.feed(opens(1, RawToolUseBlock("toolu_a", "read_file"))) == [
        ev(ToolUseStart(M, 1, "toolu_a", "read_file"))
    ]
    for fragment in ['{"pa', 'th": "a', '.txt"}']:
        assert tr.feed(delta(1, RawInputJsonDelta(fragment))) == [
            ev(ToolUseInputDelta(M, 1, "toolu_a", fragment))
        ]
    assert tr.feed(stops(1)) == [ev(ToolUseEnd(M, 1, "toolu_a", "read_file", {"path": "a.txt"}))]

    assert tr.feed(opens(2, RawToolUseBlock("toolu_b", "sleep"))) == [
        ev(ToolUseStart(M, 2, "toolu_b", "sleep"))
    ]
    assert tr.feed(delta(2, RawInputJsonDelta(""))) == [ev(ToolUseInputDelta(M, 2, "toolu_b", ""))]
    assert tr.feed(delta(2, RawInputJsonDelta('{"seconds": 3'))) == [
        ev(ToolUseInputDelta(M, 2, "toolu_b", '{"seconds": 3'))
    ]
    assert tr.feed(delta(2, RawInputJsonDelta("0}"))) == [
        ev(ToolUseInputDelta(M, 2, "toolu_b", "0}"))
    ]
    assert tr.feed(stops(2)) == [ev(ToolUseEnd(M, 2, "toolu_b", "sleep", {"seconds": 30}))]

    tr.feed(message_delta("tool_use", 40))
    assert tr.feed(RawMessageStop()) == [
        ev(
            MessageComplete(
                M,
                "tool_use",
                [
                    TextBlock("Checking."),
                    ToolUseBlock("toolu_a", "read_file", {"path": "a.txt"}),
                    ToolUseBlock("toolu_b", "sleep", {"seconds": 30}),
                ],
                Usage(input_tokens=10, output_tokens=40),
            )
        )
    ]
    assert tr.stop_reason == "tool_use"


@pytest.mark.parametrize(
    ("json_text", "final_input"),
    [
        ("", {}),  # a tool without arguments may send no fragment at all
        ("[1, 2]", {}),  # not an object
        ('{"a": 1, "b": "cu', {"a": 1, "b": "cu"}),  # cut: best effort
    ],
)
def test_tool_input_that_is_not_one_whole_object(
    json_text: str, final_input: dict[str, Any]
) -> None:
    tr = translator()
    feed_all(tr, [message_start(), opens(0, RawToolUseBlock("toolu_a", "t"))])
    if json_text:
        tr.feed(delta(0, RawInputJsonDelta(json_text)))
    assert tr.feed(stops(0)) == [ev(ToolUseEnd(M, 0, "toolu_a", "t", final_input))]


def test_redacted_thinking() -> None:
    tr = translator()
    tr.feed(message_start())
    assert tr.feed(opens(0, RawRedactedThinkingBlock("EnCrYpTeD"))) == [
        ev(ThinkingStart(M, 0, redacted=True)),
        ev(ThinkingDelta(M, 0, "EnCrYpTeD", None)),  # the opaque data, as the block's one delta
    ]
    assert tr.feed(stops(0)) == [ev(ThinkingEnd(M, 0, None))]
    tr.feed(message_delta("end_turn", 5))
    assert tr.feed(RawMessageStop()) == [
        ev(
            MessageComplete(
                M,
                "end_turn",
                [RedactedThinkingBlock("EnCrYpTeD")],
                Usage(input_tokens=10, output_tokens=5),
            )
        )
    ]


def test_blocks_that_open_with_content_get_a_delta_of_it() -> None:
    tr = translator()
    tr.feed(message_start())
    assert tr.feed(opens(0, RawTextBlock("Hi"))) == [
        ev(TextStart(M, 0)),
        ev(TextDelta(M, 0, "Hi")),
    ]
    assert tr.feed(opens(1, RawThinkingBlock("hmm", "s1"))) == [
        ev(ThinkingStart(M, 1, redacted=False)),
        ev(ThinkingDelta(M, 1, "hmm", None)),
        ev(ThinkingDelta(M, 1, "", "s1")),
    ]
    assert tr.feed(opens(2, RawToolUseBlock("toolu_a", "sleep", {"seconds": 1}))) == [
        ev(ToolUseStart(M, 2, "toolu_a", "sleep")),
        ev(ToolUseInputDelta(M, 2, "toolu_a", '{"seconds":1}')),
    ]
    assert feed_all(tr, [stops(0), stops(1), stops(2)]) == [
        ev(TextEnd(M, 0)),
        ev(ThinkingEnd(M, 1, "s1")),
        ev(ToolUseEnd(M, 2, "toolu_a", "sleep", {"seconds": 1})),
    ]


def test_error_event_mid_block_closes_everything_open() -> None:
    tr = translator()
    feed_all(
        tr,
        [
            message_start(),
            opens(0, RawTextBlock()),
            delta(0, RawTextDelta("Part")),
            stops(0),
            opens(1, RawThinkingBlock()),
            delta(1, RawThinkingDelta("hm")),
            opens(2, RawToolUseBlock("toolu_a", "sleep")),
            delta(2, RawInputJsonDelta('{"seconds": 5, "x": "ab')),
        ],
    )
    error = RawError(RawErrorBody("overloaded_error", "Overloaded"))
    assert tr.feed(error) == [
        ev(ThinkingEnd(M, 1, None)),
        ev(ToolUseEnd(M, 2, "toolu_a", "sleep", {"seconds": 5, "x": "ab"})),
        ev(
            MessageComplete(
                M,
                "error",
                [
                    TextBlock("Part"),
                    ThinkingBlock("hm", None),
                    ToolUseBlock("toolu_a", "sleep", {"seconds": 5, "x": "ab"}),
                ],
                Usage(input_tokens=10, output_tokens=1),
            )
        ),
    ]
    assert tr.finished
    assert tr.stop_reason == "error"
    assert tr.error is not None
    assert (tr.error.error_class, tr.error.message) == ("overloaded", "Overloaded")
    assert tr.message is not None
    assert tr.message.status == "error"
    assert tr.fail("network", "late") == []
    assert tr.cancel() == []
    assert tr.error.error_class == "overloaded"


@pytest.mark.parametrize(
    ("error_type", "error_class"),
    [
        ("rate_limit_error", "rate_limited"),
        ("invalid_request_error", "invalid_request"),
        ("api_error", "api_error"),
        ("some_future_error", "api_error"),
    ],
)
def test_error_types_map_to_error_classes(error_type: str, error_class: str) -> None:
    tr = translator()
    tr.feed(message_start())
    [complete] = tr.feed(RawError(RawErrorBody(error_type, "boom")))
    assert complete.type == "message.complete"
    assert tr.error is not None
    assert tr.error.error_class == error_class


def test_error_event_before_message_start_has_no_message() -> None:
    tr = translator()
    assert tr.feed(RawError(RawErrorBody("overloaded_error", "Overloaded"))) == []
    assert tr.finished
    assert tr.message is None
    assert tr.error is not None
    assert tr.error.error_class == "overloaded"


def test_fail_closes_open_blocks_with_stop_reason_error() -> None:
    tr = translator()
    feed_all(tr, [message_start(), opens(0, RawTextBlock()), delta(0, RawTextDelta("Par"))])
    assert tr.fail("network", "connection reset") == [
        ev(TextEnd(M, 0)),
        ev(
            MessageComplete(M, "error", [TextBlock("Par")], Usage(input_tokens=10, output_tokens=1))
        ),
    ]
    assert tr.error is not None
    assert (tr.error.error_class, tr.error.message) == ("network", "connection reset")
    assert tr.message is not None
    assert tr.message.status == "error"


def test_cancel_mid_tool_block_gives_best_effort_input() -> None:
    tr = translator()
    feed_all(
        tr,
        [
            message_start(),
            opens(0, RawTextBlock()),
            delta(0, RawTextDelta("Running")),
            opens(1, RawToolUseBlock("toolu_a", "shell")),
            delta(1, RawInputJsonDelta('{"command": "sleep 1", "timeo')),
        ],
    )
    assert tr.cancel() == [
        ev(TextEnd(M, 0)),
        ev(ToolUseEnd(M, 1, "toolu_a", "shell", {"command": "sleep 1"})),
        ev(
            MessageComplete(
                M,
                "cancelled",
                [TextBlock("Running"), ToolUseBlock("toolu_a", "shell", {"command": "sleep 1"})],
                Usage(input_tokens=10, output_tokens=1),
            )
        ),
    ]
    assert tr.finished
    assert tr.stop_reason == "cancelled"
    assert tr.error is None
    assert tr.message is not None
    assert tr.message.status == "cancelled"
    assert tr.cancel() == []
    assert tr.fail("api_error", "late") == []
    assert tr.error is None


def test_cancel_and_fail_before_message_start_emit_nothing() -> None:
    tr = translator()
    assert tr.cancel() == []
    assert (tr.finished, tr.message) == (True, None)
    with pytest.raises(ProviderError, match="message_start received after the message ended"):
        tr.feed(message_start())

    tr = translator()
    assert tr.fail("network", "refused") == []
    assert (tr.finished, tr.message) == (True, None)
    assert tr.error is not None
    assert tr.error.error_class == "network"


def test_message_stop_closes_blocks_left_open() -> None:
    tr = translator()
    feed_all(tr, [message_start(), opens(0, RawTextBlock()), delta(0, RawTextDelta("x"))])
    assert tr.feed(RawMessageStop()) == [
        ev(TextEnd(M, 0)),
        ev(MessageComplete(M, "end_turn", [TextBlock("x")], Usage(10, 1))),
    ]


@pytest.mark.parametrize(
    ("raw_reason", "stop_reason"),
    [
        ("end_turn", "end_turn"),
        ("max_tokens", "max_tokens"),
        ("stop_sequence", "stop_sequence"),
        ("tool_use", "tool_use"),
        ("pause_turn", "end_turn"),
        ("refusal", "end_turn"),
        (None, "end_turn"),
    ],
)
def test_stop_reasons(raw_reason: str | None, stop_reason: str) -> None:
    tr = translator()
    [*_, complete] = feed_all(tr, [message_start(), message_delta(raw_reason), RawMessageStop()])
    assert isinstance(complete.payload, MessageComplete)
    assert complete.payload.stop_reason == stop_reason
    assert tr.stop_reason == stop_reason


def test_usage_last_wins_and_is_priced() -> None:
    def pricing(usage: Usage) -> float:
        assert usage.cost_usd is None
        return usage.input_tokens * 0.001 + usage.output_tokens * 0.01

    tr = translator(pricing=pricing)
    start = RawMessageStart(RawMessage(M, "", usage=RawUsage(100, 1, cache_read_input_tokens=50)))
    assert tr.feed(start) == [ev(MessageStart(M, "assistant", "anthropic:claude"))]
    tr.feed(RawMessageDelta(RawMessageDeltaBody("end_turn"), RawUsage(output_tokens=5)))
    tr.feed(
        RawMessageDelta(
            RawMessageDeltaBody(None), RawUsage(output_tokens=9, cache_creation_input_tokens=7)
        )
    )
    usage = Usage(100, 9, cache_read_input_tokens=50, cache_creation_input_tokens=7, cost_usd=0.19)
    assert tr.usage == usage
    assert tr.feed(RawMessageStop()) == [ev(MessageComplete(M, "end_turn", [], usage))]
    assert tr.stop_reason == "end_turn"  # the None of the second message_delta changes nothing
    assert tr.message is not None
    assert (tr.message.model, tr.message.usage) == ("anthropic:claude", usage)


def test_snapshot_mid_stream() -> None:
    tr = translator()
    with pytest.raises(RuntimeError, match="before message_start"):
        tr.snapshot()
    feed_all(
        tr,
        [
            message_start(),
            opens(0, RawThinkingBlock()),
            delta(0, RawThinkingDelta("a")),
            delta(0, RawThinkingDelta("b")),
            delta(0, RawSignatureDelta("s")),
            opens(1, RawTextBlock()),
            delta(1, RawTextDelta("Hel")),
            delta(1, RawTextDelta("lo")),
            opens(2, RawToolUseBlock("toolu_a", "read_file")),
            delta(2, RawInputJsonDelta('{"path": "REA')),
        ],
    )
    expected = Message(
        id=M,
        session_id="sess_1",
        turn_id="turn_1",
        role="assistant",
        content=[
            ThinkingBlock("ab", "s"),
            TextBlock("Hello"),
            ToolUseBlock("toolu_a", "read_file", {"path": "REA"}),
        ],
        status="in_progress",
        created_at=1000,
        model="claude-x",
        usage=Usage(10, 1),
        open_block_index=2,
    )
    assert tr.snapshot() == expected
    assert tr.snapshot() == expected  # reading does not disturb the buffers
    tr.feed(delta(1, RawTextDelta("!")))
    assert tr.snapshot().content[1] == TextBlock("Hello!")
    tr.cancel()
    assert tr.snapshot() is tr.message


def _illegal_cases() -> list[tuple[list[RawEvent], RawEvent, str]]:
    started: list[RawEvent] = [message_start()]
    text_open: list[RawEvent] = [*started, opens(0, RawTextBlock())]
    ended: list[RawEvent] = [*started, RawMessageStop()]
    return [
        ([], opens(0, RawTextBlock()), "content_block_start received before message_start"),
        ([], delta(0, RawTextDelta("x")), "content_block_delta received before message_start"),
        ([], stops(0), "content_block_stop received before message_start"),
        ([], message_delta("end_turn"), "message_delta received before message_start"),
        ([], RawMessageStop(), "message_stop received before message_start"),
        (started, message_start(), "message_start received while the message is streaming"),
        (ended, RawPing(), "ping received after the message ended"),
        (
            ended,
            delta(0, RawTextDelta("x")),
            "content_block_delta received after the message ended",
        ),
        (ended, RawMessageStop(), "message_stop received after the message ended"),
        (ended, RawError(RawErrorBody("api_error", "x")), "error received after the message ended"),
        (
            started,
            delta(0, RawTextDelta("x")),
            "content_block_delta for content block 0, which was never opened",
        ),
        (started, stops(3), "content_block_stop for content block 3, which was never opened"),
        (
            text_open,
            opens(0, RawTextBlock()),
            "content_block_start for content block 0, which is already open",
        ),
        (
            [*text_open, stops(0)],
            delta(0, RawTextDelta("x")),
            "content_block_delta for content block 0, which is already closed",
        ),
        (
            [*text_open, stops(0)],
            stops(0),
            "content_block_stop for content block 0, which is already closed",
        ),
        (
            [*text_open, stops(0)],
            opens(0, RawTextBlock()),
            "content_block_start for content block 0, which is already closed",
        ),
        (
            text_open,
            delta(0, RawInputJsonDelta("{")),
            "input_json_delta does not fit content block 0, a text block",
        ),
        (
            text_open,
            delta(0, RawThinkingDelta("x")),
            "thinking_delta does not fit content block 0, a text block",
        ),
        (
            [*started, opens(1, RawThinkingBlock())],
            delta(1, RawTextDelta("x")),
            "text_delta does not fit content block 1, a thinking block",
        ),
        (
            [*started, opens(0, RawRedactedThinkingBlock("d"))],
            delta(0, RawThinkingDelta("x")),
            "thinking_delta does not fit content block 0, a redacted_thinking block",
        ),
        (
            [*started, opens(0, RawToolUseBlock("toolu_a", "t"))],
            delta(0, RawSignatureDelta("s")),
            "signature_delta does not fit content block 0, a tool_use block",
        ),
    ]


@pytest.mark.parametrize(("before", "bad", "problem"), _illegal_cases())
def test_illegal_moves_raise_naming_the_problem(
    before: list[RawEvent], bad: RawEvent, problem: str
) -> None:
    tr = translator()
    feed_all(tr, before)
    with pytest.raises(ProviderError) as raised:
        tr.feed(bad)
    assert raised.value.error_class == "api_error"
    assert raised.value.message == f"illegal provider stream: {problem}"


def test_an_illegal_move_changes_nothing_so_the_call_can_still_fail() -> None:
    tr = translator()
    feed_all(tr, [message_start(), opens(0, RawTextBlock()), delta(0, RawTextDelta("ok"))])
    with pytest.raises(ProviderError):
        tr.feed(delta(0, RawInputJsonDelta("{")))
    with pytest.raises(ProviderError):
        tr.feed(opens(0, RawTextBlock("again")))
    assert tr.fail("api_error", "bad stream") == [
        ev(TextEnd(M, 0)),
        ev(MessageComplete(M, "error", [TextBlock("ok")], Usage(10, 1))),
    ]


def test_a_snapshot_says_which_block_is_still_streaming() -> None:
    """docs/protocol.md §6: ``open_block_index`` of an in_progress message; absent elsewhere."""
    tr = translator()
    tr.feed(message_start())
    assert tr.snapshot().open_block_index is None  # no block yet
    tr.feed(opens(0, RawThinkingBlock()))
    tr.feed(delta(0, RawThinkingDelta("a")))
    assert tr.snapshot().open_block_index == 0
    tr.feed(stops(0))
    assert tr.snapshot().open_block_index is None  # between blocks: every block has ended
    tr.feed(opens(1, RawTextBlock()))
    assert tr.snapshot().open_block_index == 1
    encoded = msgspec.json.decode(msgspec.json.encode(tr.snapshot()))
    assert encoded["open_block_index"] == 1
    tr.feed(stops(1))
    between = msgspec.json.decode(msgspec.json.encode(tr.snapshot()))
    assert between["open_block_index"] is None  # present, null
    tr.feed(message_delta("end_turn", 3))
    tr.feed(RawMessageStop())
    done = msgspec.json.decode(msgspec.json.encode(tr.snapshot()))
    assert done["status"] == "complete" and "open_block_index" not in done


def test_a_message_past_its_most_blocks_is_an_illegal_stream() -> None:
    """docs/protocol.md §15: a streaming message always fits a snapshot (translate.max_blocks)."""
    from gateway.translate import max_blocks

    assert (max_blocks(65_536), max_blocks(8_388_608)) == (128, 16_384)
    tr = translator(max_blocks=2)
    feed_all(tr, [message_start(), opens(0, RawTextBlock("")), stops(0)])
    feed_all(tr, [opens(1, RawThinkingBlock("")), stops(1)])
    with pytest.raises(ProviderError) as caught:
        tr.feed(opens(2, RawTextBlock("")))
    assert caught.value.error_class == "api_error"
    assert "more than 2 content blocks" in str(caught.value)
    ended = tr.fail("api_error", str(caught.value))  # as the call settles it
    assert ended[-1].type == "message.complete"
    assert len(ended[-1].payload.final_content) == 2  # type: ignore[union-attr]


def test_block_indices_are_renumbered_in_order_of_start() -> None:
    """docs/protocol.md §5: from 0, in order of start, whatever the provider numbered."""
    tr = translator()
    tr.feed(message_start())
    assert tr.feed(opens(1, RawTextBlock())) == [ev(TextStart(M, 0))]
    assert tr.feed(delta(1, RawTextDelta("Hi"))) == [ev(TextDelta(M, 0, "Hi"))]
    assert tr.feed(stops(1)) == [ev(TextEnd(M, 0))]
    # The provider skips 2 and 3 (server tool blocks it did not send), then opens 7 before 4.
    assert tr.feed(opens(7, RawToolUseBlock("toolu_a", "sleep"))) == [
        ev(ToolUseStart(M, 1, "toolu_a", "sleep"))
    ]
    assert tr.feed(opens(4, RawThinkingBlock())) == [ev(ThinkingStart(M, 2, redacted=False))]
    assert tr.feed(delta(7, RawInputJsonDelta('{"seconds": 1}'))) == [
        ev(ToolUseInputDelta(M, 1, "toolu_a", '{"seconds": 1}'))
    ]
    assert tr.feed(delta(4, RawThinkingDelta("hm"))) == [ev(ThinkingDelta(M, 2, "hm", None))]
    snapshot = tr.snapshot()
    assert snapshot.content == [
        TextBlock("Hi"),
        ToolUseBlock("toolu_a", "sleep", {"seconds": 1}),
        ThinkingBlock("hm", None),
    ]
    assert snapshot.open_block_index == 2
    assert tr.feed(stops(7)) == [ev(ToolUseEnd(M, 1, "toolu_a", "sleep", {"seconds": 1}))]
    with pytest.raises(ProviderError):
        tr.feed(delta(2, RawThinkingDelta("x")))  # a canonical index is not the provider's
    # Ends in start order too, each under its new index.
    tr.feed(message_delta("end_turn", 5))
    events = tr.feed(RawMessageStop())
    assert events[0] == ev(ThinkingEnd(M, 2, None))
    assert isinstance(events[1].payload, MessageComplete)
    assert events[1].payload.final_content == snapshot.content

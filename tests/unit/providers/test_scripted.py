"""gateway.providers.scripted through the translator (docs/reference.md "The scripted model").

Rules of these tests: every stream goes through the real :class:`Translator`,
as in the gateway; each asserts the exact sequence of canonical event types,
that the deltas of every block add up to ``message.complete``'s
``final_content``, and the exact stop reason, usage and message status.
Pacing is checked on trio's ``autojump_clock``, never in real time.
"""

from __future__ import annotations

import json
import math
import tracemalloc
from typing import Any

import msgspec
import pytest
import trio
import trio.testing

from gateway.errors import ProviderError
from gateway.partial_json import best_effort
from gateway.protocol.events import (
    MessageComplete,
    StreamEvent,
    TextDelta,
    ThinkingDelta,
    ThinkingEnd,
    ThinkingStart,
    ToolUseInputDelta,
    ToolUseStart,
)
from gateway.protocol.shapes import (
    ContentBlock,
    Message,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
    Usage,
)
from gateway.providers.base import ModelRequest
from gateway.providers.raw import (
    RawContentBlockDelta,
    RawError,
    RawEvent,
    RawMessageStart,
    RawTextDelta,
)
from gateway.providers.scripted import ScriptedProvider
from gateway.translate import Translator

LOREM_CYCLE = "lorem ipsum dolor sit amet consectetur adipiscing elit sed "
LOREM_MAX_WORDS = 1_000_000  # docs/protocol.md, the scripted model: a script's bound


def user(content: str | list[ContentBlock]) -> Message:
    blocks: list[ContentBlock] = [TextBlock(content)] if isinstance(content, str) else content
    return Message("msg_u", "sess_1", "turn_1", "user", blocks, "complete", 0)


def assistant(*blocks: ContentBlock) -> Message:
    return Message("msg_a", "sess_1", "turn_1", "assistant", list(blocks), "complete", 0)


def text_of(message: Message) -> str:
    [block] = message.content
    assert isinstance(block, TextBlock)
    return block.text


def script(**fields: Any) -> Message:
    return user(json.dumps({"script": fields}))


def request(*messages: Message, model: str = "scripted:test") -> ModelRequest:
    return ModelRequest(model=model, messages=list(messages), tools=[], max_tokens=100)


async def raw_events(*messages: Message) -> list[RawEvent]:
    return [raw async for raw in ScriptedProvider().stream(request(*messages))]


async def translate(*messages: Message) -> tuple[list[StreamEvent], Translator]:
    """Stream one call through the translator, as the session does."""
    tr = Translator(session_id="sess_1", turn_id="turn_1", model="scripted:x", created_at=0)
    events: list[StreamEvent] = []
    try:
        async for raw in ScriptedProvider().stream(request(*messages)):
            events += tr.feed(raw)
    except ProviderError as error:
        events += tr.fail(error.error_class, error.message)
    return events, tr


def types(events: list[StreamEvent]) -> list[str]:
    return [event.type for event in events]


def final(events: list[StreamEvent]) -> MessageComplete:
    assert events[-1].type == "message.complete"
    payload = events[-1].payload
    assert isinstance(payload, MessageComplete)
    return payload


def assert_deltas_add_up(events: list[StreamEvent]) -> None:
    """What a client rebuilds from the deltas is exactly ``final_content``."""
    rebuilt: dict[int, dict[str, str]] = {}
    for event in events:
        p = event.payload
        if isinstance(p, TextDelta):
            rebuilt.setdefault(p.content_block_index, {"text": ""})["text"] += p.text
        elif isinstance(p, ThinkingDelta):
            so_far = rebuilt.setdefault(p.content_block_index, {"thinking": "", "signature": ""})
            so_far["thinking"] += p.text
            so_far["signature"] += p.signature or ""
        elif isinstance(p, ToolUseInputDelta):
            rebuilt.setdefault(p.content_block_index, {"json": ""})["json"] += p.partial_json
    for index, block in enumerate(final(events).final_content):
        match block:
            case TextBlock():
                assert rebuilt.get(index, {"text": ""}) == {"text": block.text}
            case ThinkingBlock():
                assert rebuilt.get(index, {"thinking": "", "signature": ""}) == {
                    "thinking": block.thinking,
                    "signature": block.signature or "",
                }
            case ToolUseBlock():
                assert best_effort(rebuilt.get(index, {"json": ""})["json"]) == block.input
            case RedactedThinkingBlock():
                assert rebuilt[index] == {"thinking": block.data, "signature": ""}


def tool_use_with_id(events: list[StreamEvent], input: dict[str, Any]) -> ToolUseBlock:
    """The scripted tool block of ``events`` (its id is random), with that input."""
    [start] = [e.payload for e in events if isinstance(e.payload, ToolUseStart)]
    return ToolUseBlock(start.tool_use_id, start.tool_name, input)


def deltas(events: list[StreamEvent]) -> list[str]:
    return [e.payload.text for e in events if isinstance(e.payload, TextDelta | ThinkingDelta)]


async def test_plain_text_is_echoed_a_word_at_a_time() -> None:
    events, tr = await translate(user("hello  big world"))
    assert types(events) == [
        "message.start",
        "text.start",
        *["text.delta"] * 5,
        "text.end",
        "message.complete",
    ]
    assert deltas(events) == ["You ", "said: ", "hello  ", "big ", "world"]
    assert_deltas_add_up(events)
    text = "You said: hello  big world"
    usage = Usage(input_tokens=math.ceil(16 / 4), output_tokens=math.ceil(len(text) / 4))
    assert final(events) == MessageComplete(
        tr.message_id or "", "end_turn", [TextBlock(text)], usage
    )
    assert tr.message is not None
    assert (tr.message.status, tr.message.model, tr.message.usage) == (
        "complete",
        "scripted:test",
        Usage(4, 7),
    )


async def test_raw_stream_is_shaped_like_the_messages_api() -> None:
    raws = await raw_events(user("hi"))
    assert [msgspec.structs.asdict(raw)["index"] for raw in raws[1:-2]] == [0] * 5
    assert [raw.__struct_config__.tag for raw in raws] == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert isinstance(raws[0], RawMessageStart)
    assert raws[0].message.id.startswith("msg_")
    other = await raw_events(user("hi"))
    assert isinstance(other[0], RawMessageStart)
    assert other[0].message.id != raws[0].message.id


async def test_script_text_thinking_and_redacted_thinking() -> None:
    events, tr = await translate(
        script(
            rounds=[
                [
                    {"thinking": "Let me check."},
                    {"redacted_thinking": "ZGF0YQ=="},
                    {"text": "Done, ok."},
                ]
            ]
        )
    )
    assert types(events) == [
        "message.start",
        "thinking.start",
        "thinking.delta",
        "thinking.delta",
        "thinking.delta",
        "thinking.delta",  # the signature
        "thinking.end",
        "thinking.start",
        "thinking.delta",  # redacted: the opaque data
        "thinking.end",
        "text.start",
        "text.delta",
        "text.delta",
        "text.end",
        "message.complete",
    ]
    assert_deltas_add_up(events)
    [thinking, redacted, text] = final(events).final_content
    assert isinstance(thinking, ThinkingBlock)
    assert thinking.thinking == "Let me check."
    assert thinking.signature is not None
    assert thinking.signature.startswith("sig_")
    assert events[6].payload == ThinkingEnd(tr.message_id or "", 0, thinking.signature)
    starts = [e.payload for e in events if isinstance(e.payload, ThinkingStart)]
    assert [start.redacted for start in starts] == [False, True]
    assert redacted == RedactedThinkingBlock("ZGF0YQ==")
    assert text == TextBlock("Done, ok.")
    assert final(events).stop_reason == "end_turn"
    assert final(events).usage.output_tokens == math.ceil(len("Let me check.Done, ok.") / 4)

    again, _ = await translate(script(rounds=[[{"thinking": "Let me check."}]]))
    assert final(again).final_content[0] == thinking  # the signature is deterministic


async def test_tool_use_round_then_the_next_round() -> None:
    turn = script(
        rounds=[
            [
                {"text": "Running."},
                {"tool_use": {"name": "sleep", "input": {"seconds": 30, "why": "a test"}}},
            ],
            [{"text": "All done."}],
        ]
    )
    events, _ = await translate(turn)
    input_json = '{"seconds":30,"why":"a test"}'
    assert types(events) == [
        "message.start",
        "text.start",
        "text.delta",
        "text.end",
        "tool.use_start",
        *["tool.use_input_delta"] * math.ceil(len(input_json) / 8),
        "tool.use_end",
        "message.complete",
    ]
    fragments = [e.payload.partial_json for e in events if isinstance(e.payload, ToolUseInputDelta)]
    assert fragments == ['{"second', 's":30,"w', 'hy":"a t', 'est"}']
    assert_deltas_add_up(events)
    complete = final(events)
    assert complete.stop_reason == "tool_use"
    [_, tool_use] = complete.final_content
    assert isinstance(tool_use, ToolUseBlock)
    assert tool_use.id.startswith("toolu_")
    assert (tool_use.name, tool_use.input) == ("sleep", {"seconds": 30, "why": "a test"})
    assert complete.usage.output_tokens == math.ceil((len("Running.") + len(input_json)) / 4)

    # The agent appends the answer and the tool results: the next call plays round 1.
    answer = assistant(*complete.final_content)
    results = user([ToolResultBlock(tool_use.id, "slept 30 s")])
    events, _ = await translate(turn, answer, results)
    assert final(events).final_content == [TextBlock("All done.")]
    assert final(events).stop_reason == "end_turn"
    chars = len(text_of(turn)) + len("Running.") + len(input_json) + len("slept 30 s")
    assert final(events).usage.input_tokens == math.ceil(chars / 4)

    # Past the last round: an empty message.
    events, _ = await translate(turn, answer, results, assistant(TextBlock("All done.")), results)
    assert types(events) == ["message.start", "message.complete"]
    assert (final(events).final_content, final(events).stop_reason) == ([], "end_turn")
    assert final(events).usage.output_tokens == 0


async def test_lorem_and_chunk_chars() -> None:
    events, _ = await translate(script(rounds=[[{"lorem": 12}]]))
    words = "lorem ipsum dolor sit amet consectetur adipiscing elit sed lorem ipsum dolor"
    assert final(events).final_content == [TextBlock(words)]
    assert deltas(events) == [word + " " for word in words.split()[:-1]] + ["dolor"]
    assert_deltas_add_up(events)

    events, _ = await translate(
        script(
            chunk_chars=4, rounds=[[{"text": "abcdefghij"}, {"thinking": "xyz12"}, {"lorem": 2}]]
        )
    )
    assert deltas(events) == ["abcd", "efgh", "ij", "xyz1", "2", "", "lore", "m ip", "sum"]
    assert_deltas_add_up(events)


@pytest.mark.parametrize(
    ("error_class", "error_type"),
    [
        ("overloaded", "overloaded_error"),
        ("rate_limited", "rate_limit_error"),
        ("api_error", "api_error"),
        ("invalid_request", "invalid_request_error"),
    ],
)
async def test_fail_in_stream(error_class: str, error_type: str) -> None:
    turn = script(
        rounds=[[{"text": "one two three four"}, {"text": "never"}]],
        fail={"round": 0, "after_deltas": 3, "error_class": error_class},
    )
    raws = await raw_events(turn)
    assert isinstance(raws[-1], RawError)
    assert raws[-1].error.type == error_type
    assert sum(isinstance(raw, RawContentBlockDelta) for raw in raws) == 3

    events, tr = await translate(turn)
    assert types(events) == [
        "message.start",
        "text.start",
        "text.delta",
        "text.delta",
        "text.delta",
        "text.end",
        "message.complete",
    ]
    assert_deltas_add_up(events)
    complete = final(events)
    assert (complete.stop_reason, complete.final_content) == (
        "error",
        [TextBlock("one two three ")],
    )
    assert complete.usage == Usage(input_tokens=math.ceil(len(text_of(turn)) / 4))
    assert tr.error is not None
    assert (tr.error.error_class, tr.error.message) == (
        error_class,
        f"scripted {error_class} after 3 deltas",
    )
    assert tr.message is not None
    assert tr.message.status == "error"


@pytest.mark.parametrize("error_class", ["network", "timeout"])
async def test_fail_by_breaking_the_connection(error_class: str) -> None:
    turn = script(
        rounds=[[{"tool_use": {"name": "sleep", "input": {"seconds": 1}}}]],
        fail={"round": 0, "after_deltas": 1, "error_class": error_class},
    )
    with pytest.raises(ProviderError) as raised:
        await raw_events(turn)
    assert (raised.value.error_class, raised.value.message) == (
        error_class,
        f"scripted {error_class} after 1 deltas",
    )

    events, tr = await translate(turn)
    assert types(events) == [
        "message.start",
        "tool.use_start",
        "tool.use_input_delta",
        "tool.use_end",
        "message.complete",
    ]
    assert final(events).final_content == [tool_use_with_id(events, {})]
    assert final(events).stop_reason == "error"
    assert tr.error is not None
    assert tr.error.error_class == error_class


async def test_fail_after_more_deltas_than_the_round_has_fails_at_its_end() -> None:
    turn = script(
        rounds=[[{"text": "a b"}], [{"text": "c"}]],
        fail={"round": 1, "after_deltas": 99, "error_class": "overloaded"},
    )
    events, _ = await translate(turn)
    assert final(events).stop_reason == "end_turn"  # round 0 does not fail

    events, _ = await translate(turn, assistant(TextBlock("a b")))
    assert types(events) == [
        "message.start",
        "text.start",
        "text.delta",
        "text.end",
        "message.complete",
    ]
    assert (final(events).stop_reason, final(events).final_content) == ("error", [TextBlock("c")])


async def test_fail_with_zero_deltas_fails_at_the_first_delta() -> None:
    turn = script(rounds=[[{"text": "a b"}]], fail={"error_class": "overloaded"})
    events, _ = await translate(turn)
    assert types(events) == ["message.start", "text.start", "text.end", "message.complete"]
    assert final(events).final_content == [TextBlock("")]


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({}, "Object missing required field `rounds` - at `$.script`"),
        (
            {"rounds": [[{"txt": "x"}]]},
            "Object contains unknown field `txt` - at `$.script.rounds[0][0]`",
        ),
        (
            {"rounds": [[{"text": 5}]]},
            "Expected `str | null`, got `int` - at `$.script.rounds[0][0].text`",
        ),
        (
            {"rounds": [[{"text": "a", "lorem": 3}]]},
            "a block has exactly one of text, thinking, redacted_thinking, tool_use, lorem, system,"
            " tools, files;"
            " got text, lorem - at `$.script.rounds[0][0]`",
        ),
        (
            {"rounds": [[{}]]},
            "a block has exactly one of text, thinking, redacted_thinking, tool_use, lorem, system,"
            " tools, files;"
            " got none - at `$.script.rounds[0][0]`",
        ),
        ({"rounds": [[{"lorem": -1}]]}, "Expected `int` >= 0 - at `$.script.rounds[0][0].lorem`"),
        (
            {"rounds": [[{"lorem": 30_000_000}]]},
            "Expected `int` <= 1000000 - at `$.script.rounds[0][0].lorem`",
        ),
        (
            {"rounds": [[{"lorem": 600_000}], [{"text": "x"}, {"lorem": 400_001}]]},
            "the lorem blocks ask for 1000001 words in all; a script may ask for at most"
            " 1000000 - at `$.script`",
        ),
        (
            {"rounds": [[{"tool_use": {"input": {}}}]]},
            "Object missing required field `name` - at `$.script.rounds[0][0].tool_use`",
        ),
        ({"rounds": [], "delay_ms": -1}, "Expected `float` >= 0.0 - at `$.script.delay_ms`"),
        (
            {"rounds": [[]], "fail": {"error_class": "boom"}},
            "Invalid enum value 'boom' - at `$.script.fail.error_class`",
        ),
        (
            {"rounds": [[]], "fail": {"round": 1, "error_class": "network"}},
            "fail.round 1 is past the last round (1 rounds) - at `$.script`",
        ),
    ],
)
async def test_a_bad_script_is_refused_before_any_event(
    fields: dict[str, Any], problem: str
) -> None:
    stream = ScriptedProvider().stream(request(script(**fields)))
    with pytest.raises(ProviderError) as raised:
        await stream.__anext__()
    assert raised.value.error_class == "invalid_request"
    assert raised.value.message == f"invalid script: {problem}"


async def test_a_script_nested_too_deeply_is_refused() -> None:
    deep = '{"script": {"rounds": ' + "[" * 100_000 + "]" * 100_000 + "}}"
    with pytest.raises(ProviderError) as raised:
        await raw_events(user(deep))
    assert raised.value.error_class == "invalid_request"
    assert raised.value.message == "invalid script: nested too deeply"


@pytest.mark.parametrize("chunk_chars", [0, 8, 100_000_000])
async def test_lorem_is_generated_as_it_streams(chunk_chars: int) -> None:
    """The largest lorem allowed: its first delta costs a piece, not the whole text."""
    words = LOREM_MAX_WORDS
    turn = script(chunk_chars=chunk_chars, rounds=[[{"lorem": words}]])
    stream = ScriptedProvider().stream(request(turn))
    tracemalloc.start()
    try:
        event = await stream.__anext__()
        while not isinstance(event, RawContentBlockDelta):
            event = await stream.__anext__()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        await stream.aclose()
    assert isinstance(event.delta, RawTextDelta)
    if chunk_chars == 0:
        assert event.delta.text == "lorem "
        assert peak < 100_000  # the old join of a million words took ~15 MB
    elif chunk_chars == 8:
        assert event.delta.text == "lorem ip"
        assert peak < 100_000
    else:  # one piece is the whole text: built at once, in one C-level copy
        assert len(event.delta.text) == 6_555_554
        assert event.delta.text.startswith("lorem ipsum") and event.delta.text.endswith("sed lorem")
        assert peak < 3 * len(event.delta.text)


@pytest.mark.parametrize("words", [0, 1, 2, 8, 9, 10, 17, 18, 19, 100])
@pytest.mark.parametrize("chunk_chars", [0, 1, 3, 7, 59, 60, 61, 1000])
async def test_lorem_in_pieces_is_the_text_cut_into_chunk_chars(
    words: int, chunk_chars: int
) -> None:
    events, _ = await translate(script(chunk_chars=chunk_chars, rounds=[[{"lorem": words}]]))
    text = " ".join((LOREM_CYCLE * (words // 9 + 1)).split()[:words])
    pieces = deltas(events)
    if chunk_chars:
        assert pieces == [text[at : at + chunk_chars] for at in range(0, len(text), chunk_chars)]
    else:
        assert pieces == [word + " " for word in text.split()[:-1]] + text.split()[-1:]
    assert final(events).final_content == ([TextBlock(text)] if words else [TextBlock("")])
    assert_deltas_add_up(events)


async def test_unknown_keys_beside_script_are_refused() -> None:
    with pytest.raises(ProviderError, match="unknown field `scrpit`"):
        await raw_events(user('{"script": {"rounds": []}, "scrpit": 1}'))


@pytest.mark.parametrize("text", ['{"not_a_script": 1}', "{broken json", "[1, 2]"])
async def test_json_that_is_not_a_script_is_echoed(text: str) -> None:
    events, _ = await translate(user(text))
    assert final(events).final_content == [TextBlock(f"You said: {text}")]


async def test_the_turns_user_message_is_the_last_one_with_more_than_tool_results() -> None:
    first = user("first")
    second = user([TextBlock("second"), TextBlock("part")])
    results = user([ToolResultBlock("toolu_x", "out")])
    events, _ = await translate(first, assistant(TextBlock("x")), second, results)
    assert final(events).final_content == [TextBlock("You said: second\npart")]

    with pytest.raises(ProviderError, match="no user message"):
        await raw_events(assistant(TextBlock("x")), results)


async def test_the_request_model_is_named_else_the_default() -> None:
    [start, *_] = [
        raw
        async for raw in ScriptedProvider("scripted:default").stream(request(user("x"), model=""))
    ]
    assert isinstance(start, RawMessageStart)
    assert start.message.model == "scripted:default"
    assert ScriptedProvider().name == "scripted"


async def test_delay_ms_paces_every_delta(autojump_clock: trio.testing.MockClock) -> None:
    turn = script(
        delay_ms=250, rounds=[[{"text": "a b c"}, {"redacted_thinking": "d"}, {"thinking": "e"}]]
    )
    stamps: list[tuple[str, float]] = []
    async for raw in ScriptedProvider().stream(request(turn)):
        stamps.append((str(raw.__struct_config__.tag), trio.current_time()))
    start = stamps[0][1]
    offsets = [(tag, round(t - start, 3)) for tag, t in stamps]
    assert offsets == [
        ("message_start", 0.0),
        ("content_block_start", 0.0),
        ("content_block_delta", 0.25),
        ("content_block_delta", 0.5),
        ("content_block_delta", 0.75),
        ("content_block_stop", 0.75),
        ("content_block_start", 0.75),
        ("content_block_stop", 0.75),
        ("content_block_start", 0.75),
        ("content_block_delta", 1.0),  # thinking
        ("content_block_delta", 1.25),  # its signature
        ("content_block_stop", 1.25),
        ("message_delta", 1.25),
        ("message_stop", 1.25),
    ]


async def test_without_delay_every_delta_is_still_a_checkpoint() -> None:
    stream = ScriptedProvider().stream(request(user("a b")))
    assert isinstance(await stream.__anext__(), RawMessageStart)
    await stream.__anext__()  # content_block_start
    with trio.testing.assert_checkpoints():
        raw = await stream.__anext__()
    assert raw == RawContentBlockDelta(0, RawTextDelta("You "))
    await stream.aclose()


async def test_a_slow_stream_is_cancellable(autojump_clock: trio.testing.MockClock) -> None:
    turn = script(delay_ms=1000, rounds=[[{"lorem": 100}]])
    seen: list[RawEvent] = []
    with trio.move_on_after(2.5):
        async for raw in ScriptedProvider().stream(request(turn)):
            seen.append(raw)
    assert sum(isinstance(raw, RawContentBlockDelta) for raw in seen) == 2

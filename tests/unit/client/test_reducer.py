"""The client codec and the reference state model (docs/protocol.md sections 3-8).

Synchronous, sans-IO: events are built by hand as the server would number
them, fed to a :class:`Reducer` one by one, and the state is asserted exactly.
The resume sweep at the end replays one session from every cursor at every
moment, as docs/protocol.md §3 describes replay, and checks that the resumed
client ends where the live one does.
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from gateway.client import Reducer, decode_server_frame
from gateway.client.views import full_view, simple_view
from gateway.errors import FrameRejected
from gateway.ids import format_event_id
from gateway.protocol.events import (
    EVENT_TYPES,
    PAYLOAD_TYPE,
    STREAMING_TYPES,
    DelegateCompleted,
    DelegateStarted,
    Event,
    LlmCallCompleted,
    LlmCallFailed,
    LlmCallStarted,
    MessageComplete,
    MessageSnapshot,
    MessageStart,
    Payload,
    PermissionRequested,
    PermissionResolved,
    RouteDecided,
    TextDelta,
    TextEnd,
    TextStart,
    ThinkingDelta,
    ThinkingEnd,
    ThinkingStart,
    ToolCalled,
    ToolCompleted,
    ToolFailed,
    ToolUseEnd,
    ToolUseInputDelta,
    ToolUseStart,
    TurnCancelled,
    TurnCompleted,
    TurnStarted,
)
from gateway.protocol.filters import Filter
from gateway.protocol.frames import (
    ErrorFrame,
    EventFrame,
    Ping,
    Pong,
    ServerFrame,
    Snapshot,
    SubscribeAck,
    SubscribeError,
    encode,
)
from gateway.protocol.shapes import (
    ContentBlock,
    Message,
    PendingPermission,
    RedactedThinkingBlock,
    SessionSummary,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
    Usage,
)

SID = "sess_test"
MODEL = "claude-test"
USAGE = Usage(input_tokens=10, output_tokens=5)
USAGE_STATE = {"input_tokens": 10, "output_tokens": 5}


class Emitter:
    """Stamps payloads into events the way the server would: increasing ids, the turn id."""

    def __init__(self, step: int = 1, after: int = 0, turn_id: str | None = None) -> None:
        self.events: list[Event] = []
        self.step = step
        self.after = after
        self.turn_id = turn_id

    def __call__(self, *payloads: Payload, session_id: str = SID) -> list[Event]:
        emitted = []
        for payload in payloads:
            if isinstance(payload, TurnStarted):
                self.turn_id = payload.turn_id
            type_ = PAYLOAD_TYPE[type(payload)]
            seq = self.after + (len(self.events) + 1) * self.step
            event = Event(
                id=format_event_id(seq),
                type=type_,
                session_id=session_id,
                turn_id=self.turn_id,
                ts=1_000 + seq,
                actor=EVENT_TYPES[type_].actor,
                payload=payload,
            )
            self.events.append(event)
            emitted.append(event)
        return emitted


def user_message(turn_id: str, text: str) -> Message:
    return Message(
        id=f"msg_u_{turn_id}",
        session_id=SID,
        turn_id=turn_id,
        role="user",
        content=[TextBlock(text)],
        status="complete",
        created_at=500,
    )


def user_state(turn_id: str, text: str) -> dict[str, Any]:
    return {
        "id": f"msg_u_{turn_id}",
        "session_id": SID,
        "turn_id": turn_id,
        "role": "user",
        "content": [{"type": "text", "text": text}],
        "status": "complete",
    }


def assistant_state(
    message_id: str, turn_id: str, content: list[dict[str, Any]], status: str = "complete"
) -> dict[str, Any]:
    return {
        "id": message_id,
        "session_id": SID,
        "turn_id": turn_id,
        "role": "assistant",
        "content": content,
        "status": status,
        "usage": USAGE_STATE,
    }


def text_block(message_id: str, index: int, *chunks: str) -> list[Payload]:
    return [
        TextStart(message_id, index),
        *(TextDelta(message_id, index, chunk) for chunk in chunks),
        TextEnd(message_id, index),
    ]


def thinking_block(message_id: str, index: int, *chunks: str, signature: str) -> list[Payload]:
    return [
        ThinkingStart(message_id, index, redacted=False),
        *(ThinkingDelta(message_id, index, chunk, None) for chunk in chunks),
        ThinkingEnd(message_id, index, signature),
    ]


def tool_block(
    message_id: str, index: int, tool_use_id: str, *fragments: str, final: dict[str, Any]
) -> list[Payload]:
    return [
        ToolUseStart(message_id, index, tool_use_id, "bash"),
        *(ToolUseInputDelta(message_id, index, tool_use_id, fragment) for fragment in fragments),
        ToolUseEnd(message_id, index, tool_use_id, "bash", final),
    ]


def complete(message_id: str, stop_reason: Any, *content: ContentBlock) -> MessageComplete:
    return MessageComplete(message_id, stop_reason, list(content), USAGE)


def feed(reducer: Reducer, events: list[Event]) -> Reducer:
    for event in events:
        reducer.apply(EventFrame(event))
    return reducer


def live(events: list[Event]) -> Reducer:
    return feed(Reducer(SID), events)


# --- turns -------------------------------------------------------------------


def test_text_turn() -> None:
    emit = Emitter()
    emit(
        TurnStarted("turn_1", user_message("turn_1", "Hi")),
        RouteDecided(MODEL, "default", "v1"),
        LlmCallStarted("call_1", MODEL),
        MessageStart("msg_a", "assistant", MODEL),
        TextStart("msg_a", 0),
        TextDelta("msg_a", 0, "Hel"),
        TextDelta("msg_a", 0, "lo"),
    )
    reducer = live(emit.events)
    assert reducer.state() == {
        "messages": [user_state("turn_1", "Hi")],
        "streaming": {
            "message_id": "msg_a",
            "model": MODEL,
            "blocks": [{"index": 0, "closed": False, "type": "text", "text": "Hello"}],
        },
        "tool_results": {},
        "turn": {"turn_id": "turn_1", "status": "in_flight", "stop_reason": None},
        "pending_permissions": [],
        "compacting": None,
        "last_event_id": format_event_id(7),
    }

    feed(
        reducer,
        emit(
            TextEnd("msg_a", 0),
            complete("msg_a", "end_turn", TextBlock("Hello")),
            LlmCallCompleted("call_1", "msg_a", "end_turn", USAGE),
            TurnCompleted("turn_1", "end_turn", USAGE, 0.01),
        ),
    )
    assert reducer.state() == {
        "messages": [
            user_state("turn_1", "Hi"),
            assistant_state("msg_a", "turn_1", [{"type": "text", "text": "Hello"}]),
        ],
        "streaming": None,
        "tool_results": {},
        "turn": {"turn_id": "turn_1", "status": "completed", "stop_reason": "end_turn"},
        "pending_permissions": [],
        "compacting": None,
        "last_event_id": format_event_id(11),
    }
    # The finished message keeps what state() leaves out: the model seen on
    # message.start and the ts of message.complete.
    assert reducer.messages[1] == Message(
        id="msg_a",
        session_id=SID,
        turn_id="turn_1",
        role="assistant",
        content=[TextBlock("Hello")],
        status="complete",
        created_at=1_009,
        model=MODEL,
        usage=USAGE,
    )
    assert reducer.duplicates_ignored == 0


def test_thinking_then_text() -> None:
    emit = Emitter()
    emit(
        TurnStarted("turn_1", user_message("turn_1", "Why?")),
        MessageStart("msg_a", "assistant", MODEL),
        ThinkingStart("msg_a", 0, redacted=False),
        ThinkingDelta("msg_a", 0, "Let me", None),
        ThinkingDelta("msg_a", 0, " think.", "sig_partial"),
    )
    reducer = live(emit.events)
    assert reducer.state()["streaming"]["blocks"] == [
        {
            "index": 0,
            "closed": False,
            "type": "thinking",
            "thinking": "Let me think.",
            "signature": "sig_partial",
        }
    ]

    feed(reducer, emit(ThinkingEnd("msg_a", 0, "sig_final"), *text_block("msg_a", 1, "Because.")))
    assert reducer.state()["streaming"]["blocks"] == [
        {
            "index": 0,
            "closed": True,
            "type": "thinking",
            "thinking": "Let me think.",
            "signature": "sig_final",
        },
        {"index": 1, "closed": True, "type": "text", "text": "Because."},
    ]

    final: list[ContentBlock] = [ThinkingBlock("Let me think.", "sig_final"), TextBlock("Because.")]
    feed(reducer, emit(complete("msg_a", "end_turn", *final)))
    assert reducer.state()["messages"][1] == assistant_state(
        "msg_a",
        "turn_1",
        [
            {"type": "thinking", "thinking": "Let me think.", "signature": "sig_final"},
            {"type": "text", "text": "Because."},
        ],
    )
    assert reducer.streaming is None


def test_redacted_thinking_block_carries_its_data() -> None:
    emit = Emitter()
    emit(
        TurnStarted("turn_1", user_message("turn_1", "Hi")),
        MessageStart("msg_a", "assistant", MODEL),
        ThinkingStart("msg_a", 0, redacted=True),
        ThinkingDelta("msg_a", 0, "opaque-data", None),
        ThinkingEnd("msg_a", 0, None),
    )
    reducer = live(emit.events)
    assert reducer.state()["streaming"]["blocks"] == [
        {"index": 0, "closed": True, "type": "redacted_thinking", "data": "opaque-data"}
    ]
    feed(reducer, emit(complete("msg_a", "end_turn", RedactedThinkingBlock("opaque-data"))))
    assert reducer.messages[1].content == [RedactedThinkingBlock("opaque-data")]


def tool_turn(emit: Emitter) -> None:
    """Two LLM calls: text + a bash call, its result, then the answer."""
    emit(
        TurnStarted("turn_1", user_message("turn_1", "List files")),
        RouteDecided(MODEL, "default", "v1"),
        LlmCallStarted("call_1", MODEL),
        MessageStart("msg_a", "assistant", MODEL),
        *text_block("msg_a", 0, "Running ", "it."),
        *tool_block(
            "msg_a", 1, "toolu_1", '{"comm', 'and": "ls -', 'la"}', final={"command": "ls -la"}
        ),
        complete(
            "msg_a",
            "tool_use",
            TextBlock("Running it."),
            ToolUseBlock("toolu_1", "bash", {"command": "ls -la"}),
        ),
        LlmCallCompleted("call_1", "msg_a", "tool_use", USAGE),
        ToolCalled("toolu_1", "bash", {"command": "ls -la"}),
        ToolCompleted("toolu_1", "bash", "a.txt\nb.txt", duration_ms=12),
        LlmCallStarted("call_2", MODEL),
        MessageStart("msg_b", "assistant", MODEL),
        *text_block("msg_b", 0, "Two ", "files."),
        complete("msg_b", "end_turn", TextBlock("Two files.")),
        LlmCallCompleted("call_2", "msg_b", "end_turn", USAGE),
        TurnCompleted("turn_1", "end_turn", USAGE + USAGE, 0.02),
    )


def test_tool_round_then_second_call() -> None:
    emit = Emitter()
    tool_turn(emit)
    tool_delta_2 = next(
        i
        for i, e in enumerate(emit.events)
        if e.payload == ToolUseInputDelta("msg_a", 1, "toolu_1", 'and": "ls -')
    )
    reducer = live(emit.events[: tool_delta_2 + 1])
    assert reducer.state()["streaming"]["blocks"] == [
        {"index": 0, "closed": True, "type": "text", "text": "Running it."},
        # the input so far, parsed best effort: the cut string is closed
        {
            "index": 1,
            "closed": False,
            "type": "tool_use",
            "id": "toolu_1",
            "name": "bash",
            "input": {"command": "ls -"},
        },
    ]
    assert reducer.streaming is not None
    assert reducer.streaming.blocks[1].partial_json == '{"command": "ls -'

    feed(reducer, emit.events[tool_delta_2 + 1 :])
    assert reducer.state() == {
        "messages": [
            user_state("turn_1", "List files"),
            assistant_state(
                "msg_a",
                "turn_1",
                [
                    {"type": "text", "text": "Running it."},
                    {
                        "type": "tool_use",
                        "id": "toolu_1",
                        "name": "bash",
                        "input": {"command": "ls -la"},
                    },
                ],
            ),
            assistant_state("msg_b", "turn_1", [{"type": "text", "text": "Two files."}]),
        ],
        "streaming": None,
        "tool_results": {
            "toolu_1": {
                "tool_use_id": "toolu_1",
                "status": "completed",
                "content": "a.txt\nb.txt",
                "error_class": None,
            }
        },
        "turn": {"turn_id": "turn_1", "status": "completed", "stop_reason": "end_turn"},
        "pending_permissions": [],
        "compacting": None,
        "last_event_id": emit.events[-1].id,
    }
    # seed 002: the outcome pairs with the tool_use block of the same id
    assert reducer.tool_use("toolu_1") == ToolUseBlock("toolu_1", "bash", {"command": "ls -la"})


def test_tool_failed_is_recorded_with_its_error_class() -> None:
    emit = Emitter()
    emit(
        TurnStarted("turn_1", user_message("turn_1", "Go")),
        MessageStart("msg_a", "assistant", MODEL),
        *tool_block("msg_a", 0, "toolu_1", "{}", final={}),
        complete("msg_a", "tool_use", ToolUseBlock("toolu_1", "bash", {})),
        ToolFailed("toolu_1", "bash", "timeout", "took longer than 30 s"),
    )
    assert live(emit.events).state()["tool_results"] == {
        "toolu_1": {
            "tool_use_id": "toolu_1",
            "status": "failed",
            "content": "took longer than 30 s",
            "error_class": "timeout",
        }
    }


def cancelled_turn(emit: Emitter) -> None:
    """docs/protocol.md §8, cancel during an LLM stream: the open tool block ends first."""
    emit(
        TurnStarted("turn_2", user_message("turn_2", "Write it")),
        LlmCallStarted("call_3", MODEL),
        MessageStart("msg_c", "assistant", MODEL),
        *text_block("msg_c", 0, "Writing."),
        ToolUseStart("msg_c", 1, "toolu_2", "bash"),
        ToolUseInputDelta("msg_c", 1, "toolu_2", '{"command": "ec'),
        ToolUseEnd("msg_c", 1, "toolu_2", "bash", {"command": "ec"}),
        complete(
            "msg_c",
            "cancelled",
            TextBlock("Writing."),
            ToolUseBlock("toolu_2", "bash", {"command": "ec"}),
        ),
        LlmCallFailed("call_3", "cancelled", "cancelled by user", message_id="msg_c"),
        TurnCancelled("turn_2", "user", "llm", partial=True),
    )


def test_cancelled_message() -> None:
    emit = Emitter()
    cancelled_turn(emit)
    state = live(emit.events).state()
    assert state["messages"] == [
        user_state("turn_2", "Write it"),
        assistant_state(
            "msg_c",
            "turn_2",
            [
                {"type": "text", "text": "Writing."},
                {"type": "tool_use", "id": "toolu_2", "name": "bash", "input": {"command": "ec"}},
            ],
            status="cancelled",
        ),
    ]
    assert state["streaming"] is None
    assert state["tool_results"] == {}
    assert state["turn"] == {"turn_id": "turn_2", "status": "cancelled", "stop_reason": None}


def test_error_message() -> None:
    """docs/protocol.md §7: a provider error ends the message with its partial content."""
    emit = Emitter()
    emit(
        TurnStarted("turn_1", user_message("turn_1", "Hi")),
        LlmCallStarted("call_1", MODEL),
        MessageStart("msg_a", "assistant", MODEL),
        *text_block("msg_a", 0, "Half"),
        complete("msg_a", "error", TextBlock("Half")),
        LlmCallFailed("call_1", "overloaded", "overloaded", message_id="msg_a"),
        TurnCompleted("turn_1", "error", USAGE, 0.0),
    )
    state = live(emit.events).state()
    assert state["messages"][1] == assistant_state(
        "msg_a", "turn_1", [{"type": "text", "text": "Half"}], status="error"
    )
    assert state["streaming"] is None
    assert state["turn"] == {"turn_id": "turn_1", "status": "completed", "stop_reason": "error"}


def test_message_complete_replaces_a_message_of_the_same_id() -> None:
    emit = Emitter()
    emit(
        TurnStarted("turn_1", user_message("turn_1", "Hi")),
        complete("msg_a", "end_turn", TextBlock("first")),
        complete("msg_a", "end_turn", TextBlock("second")),
        complete("msg_b", "end_turn", TextBlock("third")),
    )
    reducer = live(emit.events)
    assert [(m.id, m.content) for m in reducer.messages] == [
        ("msg_u_turn_1", [TextBlock("Hi")]),
        ("msg_a", [TextBlock("second")]),
        ("msg_b", [TextBlock("third")]),
    ]
    # no message.start before them (a replay): the model is unknown
    assert reducer.messages[1].model is None


# --- snapshots -----------------------------------------------------------------


def session_summary(turn_id: str | None) -> SessionSummary:
    return SessionSummary(
        id=SID,
        workspace_path="/w",
        active_model=MODEL,
        routing_policy_version="v1",
        cost_so_far_usd=0.5,
        turn_count=2,
        current_turn_id=turn_id,
        current_turn_status="in_flight" if turn_id else None,
        parent_session_id=None,
    )


def test_snapshot_with_in_progress_message_then_deltas() -> None:
    history = [
        user_message("turn_1", "List files"),
        Message(
            id="msg_a",
            session_id=SID,
            turn_id="turn_1",
            role="assistant",
            content=[ToolUseBlock("toolu_1", "bash", {"command": "ls"})],
            status="complete",
            created_at=600,
            model=MODEL,
            usage=USAGE,
        ),
        Message(
            id="msg_r",
            session_id=SID,
            turn_id="turn_1",
            role="user",
            content=[ToolResultBlock("toolu_1", "permission denied", is_error=True)],
            status="complete",
            created_at=700,
        ),
        Message(
            id="msg_b",
            session_id=SID,
            turn_id="turn_1",
            role="assistant",
            content=[
                ThinkingBlock("Hmm.", "sig"),
                TextBlock("I can"),
                ToolUseBlock("toolu_2", "bash", {"command": "ls -"}),
            ],
            status="in_progress",
            created_at=800,
            model=MODEL,
        ),
    ]
    reducer = Reducer(SID)
    reducer.apply(Snapshot(session_summary("turn_1"), history, format_event_id(40)))
    assert reducer.messages == history[:2]  # tool results live in tool_results
    assert reducer.state()["streaming"] == {
        "message_id": "msg_b",
        "model": MODEL,
        "blocks": [
            # every restored block before the last has ended; the last is open
            {
                "index": 0,
                "closed": True,
                "type": "thinking",
                "thinking": "Hmm.",
                "signature": "sig",
            },
            {"index": 1, "closed": True, "type": "text", "text": "I can"},
            {
                "index": 2,
                "closed": False,
                "type": "tool_use",
                "id": "toolu_2",
                "name": "bash",
                "input": {"command": "ls -"},
            },
        ],
    }
    assert reducer.state()["tool_results"] == {
        "toolu_1": {
            "tool_use_id": "toolu_1",
            "status": "failed",
            "content": "permission denied",
            "error_class": None,
        }
    }
    assert reducer.turn is not None
    assert reducer.state()["turn"] == {
        "turn_id": "turn_1",
        "status": "in_flight",
        "stop_reason": None,
    }
    assert reducer.last_event_id == format_event_id(40)

    emit = Emitter(after=40, turn_id="turn_1")
    # The raw input text is unknown after a snapshot: the input waits for tool.use_end.
    feed(reducer, emit(ToolUseInputDelta("msg_b", 2, "toolu_2", 'la"}')))
    assert reducer.streaming is not None
    assert reducer.streaming.blocks[2].input == {"command": "ls -"}
    feed(
        reducer,
        emit(
            ToolUseEnd("msg_b", 2, "toolu_2", "bash", {"command": "ls -la"}),
            *text_block("msg_b", 3, " list."),
        ),
    )
    assert reducer.state()["streaming"]["blocks"][2:] == [
        {
            "index": 2,
            "closed": True,
            "type": "tool_use",
            "id": "toolu_2",
            "name": "bash",
            "input": {"command": "ls -la"},
        },
        {"index": 3, "closed": True, "type": "text", "text": " list."},
    ]
    final: list[ContentBlock] = [
        ThinkingBlock("Hmm.", "sig"),
        TextBlock("I can"),
        ToolUseBlock("toolu_2", "bash", {"command": "ls -la"}),
        TextBlock(" list."),
    ]
    feed(reducer, emit(complete("msg_b", "tool_use", *final)))
    assert reducer.streaming is None
    assert reducer.messages[-1].content == final
    assert reducer.last_event_id == format_event_id(46)


def test_snapshot_of_an_idle_session_replaces_everything() -> None:
    emit = Emitter()
    tool_turn(emit)
    reducer = live(emit.events[:10])
    reducer.apply(Snapshot(session_summary(None), [user_message("turn_9", "Old")], None))
    assert reducer.state() == {
        "messages": [user_state("turn_9", "Old")],
        "streaming": None,
        "tool_results": {},
        "turn": None,
        "pending_permissions": [],
        "compacting": None,
        "last_event_id": None,
    }


def test_a_later_start_closes_a_restored_last_block() -> None:
    """The restored last block had ended before the snapshot: the next start proves it."""
    partial = Message(
        id="msg_a",
        session_id=SID,
        turn_id="turn_1",
        role="assistant",
        content=[TextBlock("Done.")],
        status="in_progress",
        created_at=0,
        model=MODEL,
    )
    emit = Emitter()
    emit(TurnStarted("turn_1", user_message("turn_1", "Hi")), MessageSnapshot(partial))
    reducer = live(emit.events)
    assert reducer.streaming is not None
    assert reducer.streaming.blocks[0].closed is False
    feed(reducer, emit(TextStart("msg_a", 1)))
    assert reducer.streaming.blocks[0].closed is True
    with pytest.raises(ValueError, match=r"text\.delta for block 0 of message msg_a: .*ended"):
        feed(reducer, emit(TextDelta("msg_a", 0, "more")))


def test_message_snapshot_replaces_the_streaming_message() -> None:
    emit = Emitter()
    emit(
        TurnStarted("turn_1", user_message("turn_1", "Hi")),
        MessageStart("msg_a", "assistant", MODEL),
        *text_block("msg_a", 0, "Hel"),
        TextStart("msg_a", 1),
    )
    reducer = live(emit.events)
    partial = Message(
        id="msg_a",
        session_id=SID,
        turn_id="turn_1",
        role="assistant",
        content=[TextBlock("Hello"), TextBlock("Wor")],
        status="in_progress",
        created_at=0,
        model=MODEL,
    )
    feed(reducer, emit(MessageSnapshot(partial), TextDelta("msg_a", 1, "ld"), TextEnd("msg_a", 1)))
    assert reducer.state()["streaming"] == {
        "message_id": "msg_a",
        "model": MODEL,
        "blocks": [
            {"index": 0, "closed": True, "type": "text", "text": "Hello"},
            {"index": 1, "closed": True, "type": "text", "text": "World"},
        ],
    }


# --- the cursor --------------------------------------------------------------


def test_duplicates_are_ignored_and_counted() -> None:
    emit = Emitter()
    emit(
        TurnStarted("turn_1", user_message("turn_1", "Hi")),
        MessageStart("msg_a", "assistant", MODEL),
        *text_block("msg_a", 0, "Hello"),
    )
    reducer = live(emit.events)
    before = reducer.state()
    feed(reducer, emit.events[2:4])  # text.start and text.delta again
    feed(reducer, emit.events[:1])
    assert reducer.state() == before
    assert reducer.duplicates_ignored == 3


def test_unknown_types_and_other_sessions_only_move_the_cursor() -> None:
    emit = Emitter()
    emit(TurnStarted("turn_1", user_message("turn_1", "Hi")))
    emit(MessageStart("msg_w", "assistant", MODEL), session_id="sess_worker")
    emit.events.append(
        Event(format_event_id(3), "future.thing", SID, "turn_1", 0, "session", {"x": 1})
    )
    reducer = live(emit.events)
    assert reducer.state() == {
        "messages": [user_state("turn_1", "Hi")],
        "streaming": None,
        "tool_results": {},
        "turn": {"turn_id": "turn_1", "status": "in_flight", "stop_reason": None},
        "pending_permissions": [],
        "compacting": None,
        "last_event_id": format_event_id(3),
    }


# --- illegal moves -------------------------------------------------------------


def started() -> tuple[Emitter, Reducer]:
    emit = Emitter()
    emit(
        TurnStarted("turn_1", user_message("turn_1", "Hi")),
        MessageStart("msg_a", "assistant", MODEL),
        TextStart("msg_a", 0),
        ToolUseStart("msg_a", 1, "toolu_1", "bash"),
    )
    return emit, live(emit.events)


@pytest.mark.parametrize(
    ("payload", "problem"),
    [
        (TextDelta("msg_a", 5, "x"), r"text\.delta for block 5 of message msg_a: .*never started"),
        (TextDelta("msg_z", 0, "x"), r"text\.delta for message msg_z, but msg_a is streaming"),
        (TextEnd("msg_a", 1), r"text\.end for block 1 .*: the block is a tool_use block"),
        (TextStart("msg_a", 0), r"block 0 of message msg_a started twice"),
        (
            ToolUseInputDelta("msg_a", 1, "toolu_9", "{"),
            r"tool\.use_input_delta for tool use toolu_9, but block 1 is tool use toolu_1",
        ),
        (MessageStart("msg_b", "assistant", MODEL), r"message\.start for msg_b while msg_a"),
        (complete("msg_b", "end_turn"), r"message\.complete for msg_b while msg_a"),
        (
            TurnCompleted("turn_0", "end_turn", USAGE, 0.0),
            r"turn turn_0 completed while turn_1 is in flight",
        ),
        (TurnStarted("turn_2", user_message("turn_2", "?")), r"while turn_1 is in flight"),
    ],
)
def test_illegal_moves_raise_and_change_nothing(payload: Payload, problem: str) -> None:
    emit, reducer = started()
    before = reducer.state()
    with pytest.raises(ValueError, match=problem):
        feed(reducer, emit(payload))
    assert reducer.state() == before


def test_delta_with_nothing_streaming_raises() -> None:
    emit = Emitter()
    emit(TurnStarted("turn_1", user_message("turn_1", "Hi")), TextDelta("msg_a", 0, "x"))
    with pytest.raises(ValueError, match=r"text\.delta for message msg_a, but none is streaming"):
        live(emit.events)


def test_end_after_end_raises() -> None:
    emit, reducer = started()
    feed(reducer, emit(TextEnd("msg_a", 0)))
    with pytest.raises(ValueError, match=r"text\.end for block 0 .*already ended"):
        feed(reducer, emit(TextEnd("msg_a", 0)))


def test_snapshot_of_another_session_raises() -> None:
    with pytest.raises(ValueError, match="snapshot of session sess_test in the stream of sess_x"):
        Reducer("sess_x").apply(Snapshot(session_summary(None), [], None))


# --- live and resumed clients converge (docs/protocol.md §3) -------------------


def whole_session() -> list[Event]:
    """A tool turn, then a turn cancelled mid-stream, numbered with gaps.

    The gaps leave room for the ``message.snapshot`` a resume sends, which
    takes an id of its own, between the events it reflects and the next live one.
    """
    emit = Emitter(step=10)
    emit(
        TurnStarted("turn_0", user_message("turn_0", "Think first")),
        MessageStart("msg_t", "assistant", MODEL),
        *thinking_block("msg_t", 0, "Let ", "me ", "see.", signature="sig"),
        *text_block("msg_t", 1, "Seen."),
        complete("msg_t", "end_turn", ThinkingBlock("Let me see.", "sig"), TextBlock("Seen.")),
        LlmCallCompleted("call_0", "msg_t", "end_turn", USAGE),
        TurnCompleted("turn_0", "end_turn", USAGE, 0.01),
    )
    tool_turn(emit)
    cancelled_turn(emit)
    return emit.events


def replay(events: list[Event], cursor: int, now: int) -> list[Event]:
    """What a client resuming after ``events[cursor - 1]`` gets when ``events[:now]`` exist.

    docs/protocol.md §3: the catalog events after the cursor, each
    ``message.complete`` in its place, then one ``message.snapshot`` for a
    message still streaming, carrying its partial state as the server holds it.
    """
    replayed = [
        event
        for event in events[cursor:now]
        if event.type not in STREAMING_TYPES or event.type == "message.complete"
    ]
    server = live(events[:now]).streaming
    if server is not None:
        opened = server.open_block()
        partial = Message(
            id=server.message_id,
            session_id=SID,
            turn_id=events[now - 1].turn_id,
            role="assistant",
            content=[block.as_content_block() for block in server.blocks.values()],
            status="in_progress",
            created_at=0,
            model=server.model,
            open_block_index=None if opened is None else opened[0],
        )
        last = events[now - 1]
        snapshot_id = format_event_id(int(last.id.removeprefix("evt_")) + 5)
        replayed.append(
            Event(
                snapshot_id,
                "message.snapshot",
                SID,
                last.turn_id,
                0,
                "llm",
                MessageSnapshot(partial),
            )
        )
    return replayed


SESSION = whole_session()


@pytest.mark.parametrize("cursor", range(len(SESSION)))
def test_resumed_client_converges_with_live_one(cursor: int) -> None:
    for now in range(cursor, len(SESSION) + 1):
        resumed = live(SESSION[:cursor])
        feed(resumed, replay(SESSION, cursor, now))
        at_resume = live(SESSION[:now]).state()
        state = resumed.state()
        del state["last_event_id"], at_resume["last_event_id"]
        # open_block_index says which restored block is open: no window
        # where an ended block looks open (docs/protocol.md §6).
        assert state == at_resume, f"resumed after {cursor} at {now}"

        feed(resumed, SESSION[now:])
        assert resumed.state() == live(SESSION).state(), f"resumed after {cursor} at {now}"
        assert resumed.duplicates_ignored == 0


# --- what a snapshot says besides its messages (docs/protocol.md §6) -------------------


def in_progress(*content: ContentBlock, open_block_index: Any = msgspec.UNSET) -> Message:
    return Message(
        id="msg_b",
        session_id=SID,
        turn_id="turn_1",
        role="assistant",
        content=list(content),
        status="in_progress",
        created_at=0,
        model=MODEL,
        open_block_index=open_block_index,
    )


def restored(message: Message, pending: list[PendingPermission] | None = None) -> Reducer:
    summary = session_summary("turn_1")
    summary.pending_permissions = pending or []
    history = [user_message("turn_1", "Go"), message]
    reducer = Reducer(SID)
    reducer.apply(Snapshot(summary, history, format_event_id(40)))
    return reducer


def test_open_block_index_names_the_one_block_still_streaming() -> None:
    """Not the last: the server says which; every other block has ended."""
    reducer = restored(
        in_progress(TextBlock("a"), TextBlock("b"), TextBlock("c"), open_block_index=1)
    )
    assert reducer.streaming is not None
    assert [b.closed for b in reducer.streaming.blocks.values()] == [True, False, True]
    emit = Emitter(after=40, turn_id="turn_1")
    feed(reducer, emit(TextDelta("msg_b", 1, "+"), TextEnd("msg_b", 1)))
    assert reducer.streaming.blocks[1].text == "b+"
    with pytest.raises(ValueError, match="block 2 of message msg_b: the block has already ended"):
        feed(reducer, emit(TextDelta("msg_b", 2, "x")))


def test_open_block_index_null_means_every_restored_block_has_ended() -> None:
    reducer = restored(
        in_progress(ThinkingBlock("hm", "sig"), TextBlock("t"), open_block_index=None)
    )
    assert reducer.streaming is not None
    assert all(b.closed for b in reducer.streaming.blocks.values())
    assert full_view(reducer)["messages"][-1]["blocks"] == [
        {"type": "thinking", "text": "hm", "open": False},
        {"type": "text", "text": "t", "open": False},
    ]
    emit = Emitter(after=40, turn_id="turn_1")
    with pytest.raises(ValueError, match="already ended"):
        feed(reducer, emit(TextDelta("msg_b", 1, "x")))
    feed(reducer, emit(*text_block("msg_b", 2, "more")))  # the next block, live


def test_pending_permissions_come_from_the_snapshot_and_the_events() -> None:
    waiting = PendingPermission("perm_1", SID, "tool", "toolu_1", "bash", {"command": "ls"}, 9_000)
    done = Message(
        "msg_a", SID, "turn_1", "assistant",
        [ToolUseBlock("toolu_1", "bash", {"command": "ls"}),
         ToolUseBlock("toolu_2", "bash", {"command": "pwd"})],
        "complete", 0, usage=USAGE,
    )  # fmt: skip
    reducer = restored(done, [waiting])
    assert reducer.state()["pending_permissions"] == [
        {
            "perm_id": "perm_1",
            "session_id": SID,
            "kind": "tool",
            "tool_use_id": "toolu_1",
            "tool_name": "bash",
            "input": {"command": "ls"},
            "expires_at": 9_000,
        }
    ]
    [first, second] = full_view(reducer)["messages"][-1]["blocks"]
    assert (first["status"], first["perm_id"]) == ("awaiting_approval", "perm_1")  # type: ignore[typeddict-item]
    assert (second["status"], second["perm_id"]) == ("running", None)  # type: ignore[typeddict-item]
    assert simple_view(reducer)["status"] == {
        "kind": "tool",
        "state": "awaiting_approval",
        "tool_use_id": "toolu_1",
        "tool_name": "bash",
    }
    emit = Emitter(after=40, turn_id="turn_1")
    feed(reducer, emit(PermissionRequested("perm_2", "toolu_2", "bash", {"command": "pwd"}, 9_001)))
    assert list(reducer.permissions) == ["perm_1", "perm_2"]
    feed(reducer, emit(PermissionResolved("perm_2", "allow")))
    assert list(reducer.permissions) == ["perm_1"]
    # a cancel leaves the request unresolved: the tool's end removes it (docs/protocol.md §8)
    feed(reducer, emit(ToolFailed("toolu_1", "bash", "cancelled", "cancelled")))
    assert reducer.permissions == {}
    feed(reducer, emit(PermissionRequested("perm_3", "toolu_2", "bash", {}, 1)))
    feed(reducer, emit(TurnCancelled("turn_1", "user", "seam", partial=True)))
    assert reducer.permissions == {}  # a turn's requests end with it
    assert full_view(reducer)["permissions"] == []


# --- the views (docs/protocol.md §10) ------------------------------------------------


def replies(reducer: Reducer) -> list[tuple[str, str]]:
    return [
        (e["text"], e["status"]) for e in simple_view(reducer)["thread"] if e["role"] == "assistant"
    ]


def test_simple_view_appends_within_a_round_and_replaces_across_rounds() -> None:
    emit = Emitter()
    tool_turn(emit)
    by_payload = [e.payload for e in emit.events]

    def at(payload: Payload) -> Reducer:
        return live(emit.events[: by_payload.index(payload) + 1])

    assert replies(at(TextDelta("msg_a", 0, "Running "))) == [("Running ", "in_progress")]
    mid_tool = at(ToolUseInputDelta("msg_a", 1, "toolu_1", '{"comm'))
    assert replies(mid_tool) == [("Running it.", "in_progress")]
    assert simple_view(mid_tool)["status"] == {
        "kind": "tool", "state": "preparing", "tool_use_id": "toolu_1", "tool_name": "bash",
    }  # fmt: skip
    called = at(ToolCalled("toolu_1", "bash", {"command": "ls -la"}))
    assert simple_view(called)["status"] == {
        "kind": "tool", "state": "running", "tool_use_id": "toolu_1", "tool_name": "bash",
    }  # fmt: skip
    done = at(ToolCompleted("toolu_1", "bash", "a.txt\nb.txt", duration_ms=12))
    assert simple_view(done)["status"] is None
    assert replies(done) == [("Running it.", "in_progress")]
    # the next round starts: the earlier round's text is replaced
    assert replies(at(MessageStart("msg_b", "assistant", MODEL))) == [("", "in_progress")]
    assert replies(at(TextDelta("msg_b", 0, "Two "))) == [("Two ", "in_progress")]
    end = live(emit.events)
    assert simple_view(end) == {
        "thread": [
            {"role": "user", "turn_id": "turn_1", "message_id": "msg_u_turn_1",
             "text": "List files", "status": "complete"},
            {"role": "assistant", "turn_id": "turn_1", "message_id": "msg_b",
             "text": "Two files.", "status": "complete"},
        ],
        "status": None,
        "permissions": [],
    }  # fmt: skip
    # the full view keeps every round, the tool paired with its result (seed 002)
    tool = full_view(end)["messages"][1]["blocks"][1]
    assert tool == {
        "type": "tool_use", "id": "toolu_1", "name": "bash", "input": {"command": "ls -la"},
        "open": False, "status": "completed", "result": "a.txt\nb.txt", "perm_id": None,
    }  # fmt: skip


def test_the_status_line_is_the_latest_thinking_chunk_only() -> None:
    emit = Emitter()
    emit(
        TurnStarted("turn_1", user_message("turn_1", "Hi")),
        MessageStart("msg_a", "assistant", MODEL),
        ThinkingStart("msg_a", 0, redacted=False),
    )
    reducer = live(emit.events)
    assert simple_view(reducer)["status"] == {"kind": "thinking", "text": ""}
    for chunk in ("Let ", "me ", "see."):
        feed(reducer, emit(ThinkingDelta("msg_a", 0, chunk, None)))
        assert simple_view(reducer)["status"] == {"kind": "thinking", "text": chunk}
    feed(reducer, emit(ThinkingDelta("msg_a", 0, "", "sig")))  # a signature is no chunk
    assert simple_view(reducer)["status"] == {"kind": "thinking", "text": "see."}
    feed(reducer, emit(ThinkingEnd("msg_a", 0, "sig")))
    assert simple_view(reducer)["status"] is None
    assert replies(reducer) == [("", "in_progress")]  # thinking is never content


def test_a_cancelled_turn_keeps_its_text_marked_cancelled() -> None:
    emit = Emitter()
    cancelled_turn(emit)
    reducer = live(emit.events)
    assert replies(reducer) == [("Writing.", "cancelled")]
    tool = full_view(reducer)["messages"][1]["blocks"][1]
    assert (tool["status"], tool["result"]) == ("not_run", None)  # type: ignore[typeddict-item]


def finished_turn(*assistant: Message, results: list[ToolResultBlock] | None = None) -> Reducer:
    """A client attaching by snapshot after the turn: it never saw how the turn ended."""
    history = [user_message("turn_1", "Go"), *assistant]
    if results:
        history.append(Message("msg_r", SID, "turn_1", "user", list(results), "complete", 0))
    reducer = Reducer(SID)
    reducer.apply(Snapshot(session_summary(None), history, format_event_id(40)))
    return reducer


def assistant(*content: ContentBlock, status: Any = "complete") -> Message:
    return Message("msg_a", SID, "turn_1", "assistant", list(content), status, 0, usage=USAGE)


@pytest.mark.parametrize(
    ("reducer", "status"),
    [
        (finished_turn(assistant(TextBlock("ok"))), "complete"),
        (finished_turn(assistant(TextBlock("cut"), status="cancelled")), "cancelled"),
        (finished_turn(assistant(TextBlock("half"), status="error")), "error"),
        # tools asked for and cancelled (seam or tools phase): their results say so
        (
            finished_turn(
                assistant(TextBlock("t"), ToolUseBlock("toolu_1", "bash", {})),
                results=[ToolResultBlock("toolu_1", "cancelled", is_error=True)],
            ),
            "cancelled",
        ),
        # tools ran, and no later round came: its call failed before a message started
        (
            finished_turn(
                assistant(TextBlock("t"), ToolUseBlock("toolu_1", "bash", {})),
                results=[ToolResultBlock("toolu_1", "fine")],
            ),
            "error",
        ),
        # no tool ran (max_tokens cut the round): the turn ended there
        (finished_turn(assistant(TextBlock("t"), ToolUseBlock("toolu_1", "bash", {}))), "complete"),
    ],
)
def test_how_a_turn_ended_is_inferred_from_a_snapshot(reducer: Reducer, status: str) -> None:
    [(_, shown)] = replies(reducer)
    assert shown == status


def test_how_a_turn_ended_as_seen_live_wins_over_the_inference() -> None:
    emit = Emitter()
    emit(
        TurnStarted("turn_1", user_message("turn_1", "Go")),
        complete("msg_a", "max_tokens", TextBlock("t"), ToolUseBlock("toolu_1", "bash", {})),
        TurnCompleted("turn_1", "error", USAGE, 0.0),  # say, a gateway bug ended it
    )
    assert replies(live(emit.events)) == [("t", "error")]


def test_worker_events_go_to_a_reducer_of_their_own_that_joins_anywhere() -> None:
    emit = Emitter()
    tool_turn_start = [
        TurnStarted("turn_1", user_message("turn_1", "Delegate")),
        complete("msg_a", "tool_use", ToolUseBlock("toolu_1", "delegate", {"task": "t"})),
        ToolCalled("toolu_1", "delegate", {"task": "t"}),
        DelegateStarted("toolu_1", "sess_w", "t"),
    ]
    emit(*tool_turn_start)
    # the worker's stream joined mid-message: what it cannot place is skipped
    emit(
        TextDelta("msg_w", 0, "lost"),
        TextEnd("msg_w", 0),
        complete("msg_w", "end_turn", TextBlock("Worker text")),
        TurnCompleted("turn_w", "end_turn", USAGE, 0.0),
        session_id="sess_w",
    )
    emit(DelegateCompleted("toolu_1", "sess_w", "Worker text"))
    reducer = live(emit.events)
    worker = reducer.workers["sess_w"]
    assert worker.skipped == 2
    assert "workers" not in full_view(reducer)
    assert full_view(reducer, workers=True)["workers"] == [
        {
            "session_id": "sess_w",
            "tool_use_id": "toolu_1",
            "task": "t",
            "running_turn_id": None,
            "messages": [
                {"id": "msg_w", "role": "assistant", "turn_id": "turn_1", "status": "complete",
                 "blocks": [{"type": "text", "text": "Worker text", "open": False}]},
            ],
        }
    ]  # fmt: skip
    # the parent's own state is untouched by them
    assert [m.id for m in reducer.messages] == ["msg_u_turn_1", "msg_a"]
    assert reducer.last_event_id == emit.events[-1].id


# --- codec -------------------------------------------------------------------


def sample_frames() -> list[ServerFrame]:
    emit = Emitter()
    tool_turn(emit)
    cancelled_turn(emit)
    emit(ThinkingStart("msg_x", 0, redacted=True), ThinkingDelta("msg_x", 0, "d", None))
    emit(MessageSnapshot(user_message("turn_3", "partial")))
    return [
        SubscribeAck(Filter(event_types=["text.delta"]), None, snapshot=True, replay_event_count=0),
        SubscribeError("cursor_expired", "too old"),
        Snapshot(session_summary("turn_1"), [user_message("turn_1", "Hi")], format_event_id(3)),
        Ping("n1"),
        Pong("n1"),
        ErrorFrame("invalid_frame", "bad"),
        *(EventFrame(event) for event in emit.events),
    ]


@pytest.mark.parametrize("frame", sample_frames(), ids=lambda f: type(f).__name__)
@pytest.mark.parametrize("as_text", [False, True])
def test_codec_round_trip(frame: ServerFrame, as_text: bool) -> None:
    data = encode(frame)
    decoded = decode_server_frame(data.decode() if as_text else data)
    assert decoded == frame
    if isinstance(decoded, EventFrame):
        assert type(decoded.event.payload) is EVENT_TYPES[decoded.event.type].payload


def test_unknown_event_type_keeps_a_dict_payload() -> None:
    event = Event(format_event_id(1), "future.thing", SID, None, 5, "session", {"x": [1, 2]})
    decoded = decode_server_frame(encode(EventFrame(event)))
    assert decoded == EventFrame(event)
    assert isinstance(decoded, EventFrame)
    assert decoded.event.payload == {"x": [1, 2]}


def event_json(type_: str, payload: Any) -> bytes:
    envelope = {
        "id": format_event_id(1),
        "type": type_,
        "session_id": SID,
        "turn_id": None,
        "ts": 1,
        "actor": "llm",
        "payload": payload,
    }
    return msgspec.json.encode({"type": "event", "event": envelope})


@pytest.mark.parametrize(
    ("data", "code", "problem"),
    [
        (b"{not json", "invalid_frame", "not valid JSON"),
        (b"[1, 2]", "invalid_frame", "JSON object with a string 'type'"),
        (b'{"type": "teleport"}', "unknown_frame_type", "unknown frame type 'teleport'"),
        (b'{"type": "ping"}', "invalid_frame", r"invalid 'ping' frame: .*nonce"),
        (
            event_json("text.delta", {"message_id": "m", "content_block_index": "zero"}),
            "invalid_frame",
            r"invalid payload for event 'text\.delta' .*content_block_index",
        ),
        (event_json("future.thing", [1]), "invalid_frame", "invalid payload for event 'future"),
    ],
)
def test_malformed_frames_are_rejected(data: bytes, code: str, problem: str) -> None:
    with pytest.raises(FrameRejected, match=problem) as caught:
        decode_server_frame(data)
    assert caught.value.code == code

"""The AG-UI mapping, sans-IO, table by table against the recorded traces (docs/doors/agui.md).

Each table is what :class:`~gateway.doors.agui.mapping.RunMapper` makes of one trace of
tests/streaming-conformance/traces (recorded from a real gateway), one line per
AG-UI event: its type and its ids, delta, content or outcome. No socket: the
mapper is fed the decoded events one by one, and :meth:`RunMapper.pause` is
called where the IO layer would call it (after ``permission.requested``, the
queue being empty). Every event made is also validated by the
``ag-ui-protocol`` package's own models, and every Struct of
gateway.doors.agui.shapes is checked against them field by field.
"""

from __future__ import annotations

import logging
from typing import Any

import msgspec
import pytest
import trio
from ag_ui import core
from pydantic import BaseModel, TypeAdapter

from gateway.client import decode_server_frame
from gateway.config import StreamConfig
from gateway.doors.agui import shapes as ag
from gateway.doors.agui.mapping import RunMapper, agui_messages
from gateway.doors.agui.sse import RunSubscriber, sse
from gateway.doors.oneway import read_events
from gateway.ids import parse_event_id
from gateway.metrics import Metrics
from gateway.protocol.events import (
    Event,
    MessageComplete,
    MessageStart,
    TextDelta,
    TextStart,
    ThinkingDelta,
    ThinkingStart,
    ToolCompleted,
    ToolUseInputDelta,
    ToolUseStart,
    TurnCancelled,
)
from gateway.protocol.frames import EventFrame, Snapshot, encode
from gateway.protocol.shapes import (
    AudioBlock,
    DocumentBlock,
    ImageBlock,
    Message,
    TextBlock,
    ToolResultBlock,
    Usage,
)
from gateway.session.hub import Emitted, FrameBatch
from tests.paths import TESTS
from tests.session_fakes import FakeSession

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

TRACES = TESTS / "streaming-conformance" / "traces"
_official = TypeAdapter(core.Event)


def frames(name: str) -> list[Any]:
    return [
        decode_server_frame(line) for line in (TRACES / f"{name}.jsonl").read_text().splitlines()
    ]


def brief(event: ag.AguiEvent) -> str:
    """One line per event: its type, then its ids, delta, content, message, code, outcome."""
    d = msgspec.to_builtins(event)
    keys = ("messageId", "stepName", "toolCallId", "toolCallName", "delta", "content",
            "encryptedValue", "message", "code")  # fmt: skip
    parts = [d["type"], *(str(d[k]) for k in keys if k in d)]
    if "outcome" in d:
        parts.append(d["outcome"]["type"])
    return " ".join(parts)


def official(event: ag.AguiEvent) -> BaseModel:
    """The event as ``ag_ui.core`` parses it (raises if it does not)."""
    parsed: BaseModel = _official.validate_json(ag.encode(event))
    return parsed


def mapped(name: str, mapper: RunMapper | None = None) -> list[str]:
    """The trace's events through a mapper of turn_1, pausing after each permission request."""
    m = mapper or RunMapper("sess_1", "run_1", "turn_1")
    out: list[ag.AguiEvent] = []
    for frame in frames(name):
        if isinstance(frame, EventFrame):
            out += m.receive(frame.event)
            if frame.event.type == "permission.requested":
                out += m.pause()
    for event in out:
        official(event)
    return [brief(e) for e in out]


THINKING_THEN_TEXT = [
    "STEP_STARTED call_1",
    "REASONING_START msg_2:0",
    "REASONING_MESSAGE_START msg_2:0",
    "REASONING_MESSAGE_CONTENT msg_2:0 The ",
    "REASONING_MESSAGE_CONTENT msg_2:0 user ",
    "REASONING_MESSAGE_CONTENT msg_2:0 greets ",
    "REASONING_MESSAGE_CONTENT msg_2:0 me. ",
    "REASONING_MESSAGE_CONTENT msg_2:0 I ",
    "REASONING_MESSAGE_CONTENT msg_2:0 should ",
    "REASONING_MESSAGE_CONTENT msg_2:0 greet ",
    "REASONING_MESSAGE_CONTENT msg_2:0 back.",
    "REASONING_MESSAGE_END msg_2:0",
    "REASONING_ENCRYPTED_VALUE sig_dc8bbffe11f43fb6dbda8933b371f50b",
    "REASONING_END msg_2:0",
    "REASONING_START msg_2:1",
    "REASONING_ENCRYPTED_VALUE opaque-data",
    "REASONING_END msg_2:1",
    "TEXT_MESSAGE_START msg_2",
    "TEXT_MESSAGE_CONTENT msg_2 Hello! ",
    "TEXT_MESSAGE_CONTENT msg_2 Nice ",
    "TEXT_MESSAGE_CONTENT msg_2 to ",
    "TEXT_MESSAGE_CONTENT msg_2 meet ",
    "TEXT_MESSAGE_CONTENT msg_2 you.",
    "TEXT_MESSAGE_END msg_2",
    "STEP_FINISHED call_1",
    "RUN_FINISHED success",
]

PARALLEL_TOOLS = [
    "STEP_STARTED call_1",
    "REASONING_START msg_2:0",
    "REASONING_MESSAGE_START msg_2:0",
    "REASONING_MESSAGE_CONTENT msg_2:0 Two ",
    "REASONING_MESSAGE_CONTENT msg_2:0 naps ",
    "REASONING_MESSAGE_CONTENT msg_2:0 at ",
    "REASONING_MESSAGE_CONTENT msg_2:0 once.",
    "REASONING_MESSAGE_END msg_2:0",
    "REASONING_ENCRYPTED_VALUE sig_b04f5178e973aaf264a67698a45192d6",
    "REASONING_END msg_2:0",
    "TEXT_MESSAGE_START msg_2",
    "TEXT_MESSAGE_CONTENT msg_2 Sleeping ",
    "TEXT_MESSAGE_CONTENT msg_2 twice.",
    "TEXT_MESSAGE_END msg_2",
    "TOOL_CALL_START toolu_1 sleep",
    'TOOL_CALL_ARGS toolu_1 {"second',
    'TOOL_CALL_ARGS toolu_1 s":0.01}',
    "TOOL_CALL_END toolu_1",
    "TOOL_CALL_START toolu_2 sleep",
    'TOOL_CALL_ARGS toolu_2 {"second',
    'TOOL_CALL_ARGS toolu_2 s":0.25}',
    "TOOL_CALL_END toolu_2",
    "STEP_FINISHED call_1",
    "TOOL_CALL_RESULT toolu_1:result toolu_1 slept 0.01 s",
    "TOOL_CALL_RESULT toolu_2:result toolu_2 slept 0.25 s",
    "STEP_STARTED call_2",
    "TEXT_MESSAGE_START msg_3",
    "TEXT_MESSAGE_CONTENT msg_3 Both ",
    "TEXT_MESSAGE_CONTENT msg_3 naps ",
    "TEXT_MESSAGE_CONTENT msg_3 are ",
    "TEXT_MESSAGE_CONTENT msg_3 over.",
    "TEXT_MESSAGE_END msg_3",
    "STEP_FINISHED call_2",
    "RUN_FINISHED success",
]

CANCEL_LLM = [
    "STEP_STARTED call_1",
    "TEXT_MESSAGE_START msg_2",
    "TEXT_MESSAGE_CONTENT msg_2 Let ",
    "TEXT_MESSAGE_CONTENT msg_2 me ",
    "TEXT_MESSAGE_CONTENT msg_2 run ",
    "TEXT_MESSAGE_CONTENT msg_2 it.",
    "TEXT_MESSAGE_END msg_2",
    "TOOL_CALL_START toolu_1 sleep",
    'TOOL_CALL_ARGS toolu_1 {"second',
    'TOOL_CALL_ARGS toolu_1 s":0.01,',
    "TOOL_CALL_END toolu_1",
    "STEP_FINISHED call_1",
    "RUN_FINISHED cancelled",
]

CANCEL_TOOLS = [
    "STEP_STARTED call_1",
    "TEXT_MESSAGE_START msg_2",
    "TEXT_MESSAGE_CONTENT msg_2 A ",
    "TEXT_MESSAGE_CONTENT msg_2 long ",
    "TEXT_MESSAGE_CONTENT msg_2 nap.",
    "TEXT_MESSAGE_END msg_2",
    "TOOL_CALL_START toolu_1 sleep",
    'TOOL_CALL_ARGS toolu_1 {"second',
    'TOOL_CALL_ARGS toolu_1 s":60}',
    "TOOL_CALL_END toolu_1",
    "STEP_FINISHED call_1",
    "TOOL_CALL_RESULT toolu_1:result toolu_1 cancelled: cancelled",
    "RUN_FINISHED cancelled",
]

CANCEL_SEAM = [
    "STEP_STARTED call_1",
    "TEXT_MESSAGE_START msg_2",
    "TEXT_MESSAGE_CONTENT msg_2 Sleeping.",
    "TEXT_MESSAGE_END msg_2",
    "TOOL_CALL_START toolu_1 sleep",
    'TOOL_CALL_ARGS toolu_1 {"second',
    'TOOL_CALL_ARGS toolu_1 s":0.01}',
    "TOOL_CALL_END toolu_1",
    "STEP_FINISHED call_1",
    "RUN_FINISHED interrupt",
]

PROVIDER_ERROR = [
    "STEP_STARTED call_1",
    "REASONING_START msg_2:0",
    "REASONING_MESSAGE_START msg_2:0",
    "REASONING_MESSAGE_CONTENT msg_2:0 Hmm.",
    "REASONING_MESSAGE_END msg_2:0",
    "REASONING_ENCRYPTED_VALUE sig_7f2302c86d005fed4397eef4134c2c03",
    "REASONING_END msg_2:0",
    "TEXT_MESSAGE_START msg_2",
    "TEXT_MESSAGE_CONTENT msg_2 This ",
    "TEXT_MESSAGE_CONTENT msg_2 reply ",
    "TEXT_MESSAGE_CONTENT msg_2 will ",
    "TEXT_MESSAGE_END msg_2",
    "STEP_FINISHED call_1",
    "RUN_ERROR scripted overloaded after 5 deltas overloaded",
]

SNAPSHOT_MID_APPROVAL = [
    "TOOL_CALL_RESULT toolu_1:result toolu_1 slept 0.01 s",
    "TEXT_MESSAGE_START msg_3",
    "TEXT_MESSAGE_CONTENT msg_3 Rested.",
    "TEXT_MESSAGE_END msg_3",
    "RUN_FINISHED success",
]


@pytest.mark.parametrize(
    ("trace", "table"),
    [
        ("thinking_then_text", THINKING_THEN_TEXT),  # thinking, redacted thinking, text
        ("parallel_tools", PARALLEL_TOOLS),  # two tools, two LLM calls
        ("cancel_llm", CANCEL_LLM),  # docs/protocol.md §8, each phase
        ("cancel_tools", CANCEL_TOOLS),
        ("provider_error", PROVIDER_ERROR),  # section 7: RUN_ERROR with the error class
        ("cancel_seam", CANCEL_SEAM),  # a permission: the run ends with an interrupt
        ("snapshot_mid_approval", SNAPSHOT_MID_APPROVAL),  # the approval's resumption
    ],
)
def test_each_trace_maps_to_its_table(trace: str, table: list[str]) -> None:
    assert mapped(trace) == table


def test_an_interrupt_carries_the_approval_and_ends_the_run() -> None:
    m = RunMapper("sess_1", "run_1", "turn_1")
    mapped("cancel_seam", m)
    assert m.finished and m.interrupts == [
        next(
            f.event.payload.perm_id
            for f in frames("cancel_seam")
            if isinstance(f, EventFrame) and f.event.type == "permission.requested"
        )
    ]
    # Nothing after the interrupt belongs to this run (the turn's cancel included).
    assert mapped("cancel_seam")[-1] == "RUN_FINISHED interrupt"
    # The outcome as the official models read it.
    requested = next(
        f.event for f in frames("cancel_seam") if isinstance(f, EventFrame)
        and f.event.type == "permission.requested"
    )  # fmt: skip
    fresh = RunMapper("sess_1", "run_1", "turn_1")
    fresh.receive(requested)
    [finished] = fresh.pause()
    model = official(finished)
    assert isinstance(model, core.RunFinishedEvent)
    outcome = model.outcome
    assert isinstance(outcome, core.RunFinishedInterruptOutcome)
    [interrupt] = outcome.interrupts
    assert interrupt.tool_call_id == requested.payload.tool_use_id
    assert interrupt.response_schema is not None and interrupt.expires_at is not None
    assert fresh.pause() == []  # once


def test_a_workers_request_interrupts_its_parents_run() -> None:
    """docs/protocol.md §5: a worker's request reaches the parent's stream, to be answered there."""
    requested = next(
        f.event for f in frames("cancel_seam") if isinstance(f, EventFrame)
        and f.event.type == "permission.requested"
    )  # fmt: skip
    worker = msgspec.structs.replace(requested, session_id="sess_w", turn_id="turn_w")
    m = RunMapper(requested.session_id, "run_1", "turn_parent")
    assert m.receive(worker) == []
    [finished] = m.pause()
    assert isinstance(finished, ag.RunFinished)
    assert isinstance(finished.outcome, ag.InterruptOutcome)
    assert m.interrupts == [requested.payload.perm_id]
    # Another session's other events, or a foreign turn of its own, map to nothing.
    other = msgspec.structs.replace(worker, session_id=requested.session_id)
    fresh = RunMapper(requested.session_id, "run_2", "turn_parent")
    fresh.receive(other)
    assert fresh.pause() == []


def test_the_resumed_run_starts_with_the_threads_messages() -> None:
    """snapshot_mid_approval: a resume run opens with the history a snapshot holds."""
    snap = next(f for f in frames("snapshot_mid_approval") if isinstance(f, Snapshot))
    m = RunMapper("sess_1", "run_2", "turn_1")
    started, snapshot = m.start(snap.messages, 0)
    assert isinstance(started, ag.RunStarted) and isinstance(snapshot, ag.MessagesSnapshot)
    model = official(snapshot)
    assert isinstance(model, core.MessagesSnapshotEvent)
    roles = [msg.__struct_config__.tag for msg in snapshot.messages]
    assert roles[0] == "user" and "assistant" in roles
    [call] = [c for msg in snapshot.messages if isinstance(msg, ag.AssistantMessage)
              for c in msg.tool_calls or []]  # fmt: skip
    assert call.id == "toolu_1" and msgspec.json.decode(call.function.arguments) == {
        "seconds": 0.01
    }
    assert m.start([], 0) == [ag.RunStarted(thread_id="sess_1", run_id="run_2", timestamp=0)]


def _event(payload: Any, type_: str, turn: str = "turn_1") -> Event:
    return Event("evt_1", type_, "sess_1", turn, 5, "llm", payload)


def test_a_cancel_closes_what_it_left_open_and_other_turns_map_to_nothing() -> None:
    m = RunMapper("t", "r", "turn_1")
    out = m.receive(_event(MessageStart("msg_1", "assistant", "m"), "message.start"))
    out += m.receive(_event(ThinkingStart("msg_1", 0, False), "thinking.start"))
    out += m.receive(_event(ThinkingDelta("msg_1", 0, "hm", None), "thinking.delta"))
    out += m.receive(_event(TextStart("msg_1", 1), "text.start"))
    out += m.receive(_event(TextDelta("msg_1", 1, ""), "text.delta"))  # empty: nothing
    out += m.receive(_event(TextDelta("msg_1", 1, "Hi"), "text.delta", turn="turn_0"))
    out += m.receive(_event(ToolUseStart("msg_1", 2, "tu_1", "sleep"), "tool.use_start"))
    out += m.receive(_event(ToolUseInputDelta("msg_1", 2, "tu_1", ""), "tool.use_input_delta"))
    done = MessageComplete("msg_1", "cancelled", [TextBlock("")], Usage())
    out += m.receive(_event(done, "message.complete"))
    out += m.receive(_event(TurnCancelled("turn_1", "user", "llm", True), "turn.cancelled"))
    assert [brief(e) for e in out] == [
        "REASONING_START msg_1:0",
        "REASONING_MESSAGE_START msg_1:0",
        "REASONING_MESSAGE_CONTENT msg_1:0 hm",
        "TEXT_MESSAGE_START msg_1",
        "TOOL_CALL_START tu_1 sleep",
        "REASONING_MESSAGE_END msg_1:0",
        "REASONING_END msg_1:0",
        "TEXT_MESSAGE_END msg_1",
        "TOOL_CALL_END tu_1",
        "RUN_FINISHED cancelled",
    ]
    assert m.finished and m.receive(_event(TextStart("msg_1", 3), "text.start")) == []


def test_a_second_text_block_is_a_message_of_its_own_live_and_in_a_snapshot() -> None:
    m = RunMapper("t", "r", "turn_1")
    ids = []
    for index in (0, 2):
        [start] = m.receive(_event(TextStart("msg_1", index), "text.start"))
        assert isinstance(start, ag.TextMessageStart)
        ids.append(start.message_id)
    assert ids == ["msg_1", "msg_1:2"]


def test_every_shape_is_what_the_official_models_declare() -> None:
    """Each Struct's wire names are fields of the ``ag_ui.core`` model of the same name."""
    pairs: dict[type, type[BaseModel]] = {
        ag.RunStarted: core.RunStartedEvent, ag.RunFinished: core.RunFinishedEvent,
        ag.RunError: core.RunErrorEvent, ag.StepStarted: core.StepStartedEvent,
        ag.StepFinished: core.StepFinishedEvent, ag.TextMessageStart: core.TextMessageStartEvent,
        ag.TextMessageContent: core.TextMessageContentEvent,
        ag.TextMessageEnd: core.TextMessageEndEvent, ag.ReasoningStart: core.ReasoningStartEvent,
        ag.ReasoningMessageStart: core.ReasoningMessageStartEvent,
        ag.ReasoningMessageContent: core.ReasoningMessageContentEvent,
        ag.ReasoningMessageEnd: core.ReasoningMessageEndEvent,
        ag.ReasoningEnd: core.ReasoningEndEvent,
        ag.ReasoningEncryptedValue: core.ReasoningEncryptedValueEvent,
        ag.ToolCallStart: core.ToolCallStartEvent, ag.ToolCallArgs: core.ToolCallArgsEvent,
        ag.ToolCallEnd: core.ToolCallEndEvent, ag.ToolCallResult: core.ToolCallResultEvent,
        ag.MessagesSnapshot: core.MessagesSnapshotEvent, ag.Interrupt: core.Interrupt,
        ag.UserMessage: core.UserMessage, ag.AssistantMessage: core.AssistantMessage,
        ag.ToolMessage: core.ToolMessage, ag.ReasoningMessage: core.ReasoningMessage,
        ag.ToolCall: core.ToolCall, ag.FunctionCall: core.FunctionCall,
        ag.RunAgentInput: core.RunAgentInput, ag.ResumeEntry: core.ResumeEntry,
        ag.InputTool: core.Tool, ag.InputContext: core.Context, ag.Custom: core.CustomEvent,
        ag.TextPart: core.TextPart, ag.ImagePart: core.ImagePart,
        ag.DocumentPart: core.DocumentPart, ag.AudioPart: core.AudioPart,
        ag.UrlSource: core.UrlSource,
    }  # fmt: skip
    assert set(ag.AguiEvent.__args__) <= set(pairs)
    for ours, theirs in pairs.items():
        declared = {f.alias or n for n, f in theirs.model_fields.items()}
        info = msgspec.inspect.type_info(ours)
        assert isinstance(info, msgspec.inspect.StructType)
        names = {f.encode_name for f in info.fields}
        assert names <= declared, (ours.__name__, names - declared)
        tag = info.tag
        if isinstance(tag, str) and tag.isupper():  # an event: the same type
            assert theirs.model_fields["type"].default == tag


def test_the_official_input_decodes_and_the_outcomes_parse() -> None:
    given = core.RunAgentInput(
        thread_id="t",
        run_id="r",
        messages=[core.UserMessage(id="u", content="hi")],
        tools=[core.Tool(name="x", description="d", parameters={"type": "object"})],
        context=[core.Context(description="d", value="v")],
        state={},
        forwarded_props={},
        resume=[core.ResumeEntry(interrupt_id="perm_1", status="resolved", payload={"a": 1})],
    )
    body = msgspec.json.decode(given.model_dump_json(by_alias=True), type=ag.RunAgentInput)
    assert (body.thread_id, body.run_id, body.messages[0].content) == ("t", "r", "hi")
    assert body.resume == [
        ag.ResumeEntry(interrupt_id="perm_1", status="resolved", payload={"a": 1})
    ]
    for outcome in (ag.SuccessOutcome(), ag.CancelledOutcome()):
        official(ag.RunFinished(thread_id="t", run_id="r", outcome=outcome))


def test_stored_messages_become_agui_messages() -> None:
    snap = next(f for f in frames("snapshot_mid_approval") if isinstance(f, Snapshot))
    for message in agui_messages(snap.messages):
        TypeAdapter(core.Message).validate_json(msgspec.json.encode(message))


def test_sse_framing() -> None:
    events: list[ag.AguiEvent] = [ag.StepStarted(step_name="a"), ag.StepFinished(step_name="a")]
    assert sse(events) == (
        b'data: {"type":"STEP_STARTED","stepName":"a"}\n\n'
        b'data: {"type":"STEP_FINISHED","stepName":"a"}\n\n'
    )


def _emitted(seq: int) -> Emitted:
    return Emitted(seq, "text.delta", "llm", "sess_1", None, 0, b"{}", b"frame")


async def test_a_slow_run_is_cut_without_blocking_the_session(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The slow-client rule of a WebSocket (gateway.session.delivery): counted and logged too."""
    session, metrics = FakeSession(), Metrics()
    config = StreamConfig(queue_max_events=2)
    sub = RunSubscriber(session, config, metrics, "10.0.0.1:5000")  # type: ignore[arg-type]
    batch = FrameBatch([_emitted(1), _emitted(2)])
    assert sub.deliver(batch, 0.0)
    assert not sub.deliver(batch, 0.0)  # over the bound: the hub reports it, never waits
    with caplog.at_level(logging.WARNING, "gateway.stream"):
        sub.overflowed()
        sub.overflowed()  # once
    detail = "AG-UI run queue exceeded queue_max_events=2; closing the stream"
    assert session.warnings == [(sub.name, "client_too_slow", detail)]
    assert set(session.hub.gone) == {sub} and sub.too_slow and not sub.subscribed
    assert metrics.slow_clients._value.get() == 1
    [record] = [r for r in caplog.records if getattr(r, "event", None) == "slow_client_closed"]
    assert record.fields == {  # type: ignore[attr-defined]
        "session_id": "sess_1", "client": f"{sub.name} 10.0.0.1:5000", "queued": 2,
    }  # fmt: skip
    assert sub.deliver(FrameBatch([_emitted(3)]), 0.0)  # nothing more is kept (nor reported)
    sub.overflowed()
    assert len(session.warnings) == 1
    with pytest.raises(trio.EndOfChannel):  # what was queued is dropped, as a WebSocket's is
        await sub.rx.receive()
    assert sub.queued == 0


def seq(event: Event) -> int:
    return parse_event_id(event.id) or 0


def test_a_run_reads_the_events_as_emitted_not_their_frames() -> None:
    """What a run maps is each event's JSON as the session emitted it, past the seam's cut.

    The same AG-UI events as the client codec's reading of the recorded
    frames; an event type the node does not know maps to nothing either way.
    """
    for trace in ("plain_text", "thinking_then_text", "parallel_tools", "unknown_events"):
        events = [f.event for f in frames(trace) if isinstance(f, EventFrame)]
        seqs = [parse_event_id(e.id) or 0 for e in events]
        batch = FrameBatch(
            [
                Emitted(seq, e.type, e.actor, e.session_id, e.turn_id, e.ts, encode(e), b"")
                for seq, e in zip(seqs, events, strict=True)
            ]
        )
        sub = RunSubscriber(FakeSession(), StreamConfig(), Metrics())  # type: ignore[arg-type]
        sub.cut = batch.events[0].seq  # the first is at the cut: the seam drops it
        read = RunMapper("sess_1", "run_1", "turn_1")
        out = [ag.encode(a) for e in read_events(sub.take(batch)) for a in read.receive(e)]
        codec = RunMapper("sess_1", "run_1", "turn_1")
        assert out and out == [ag.encode(a) for e in events[1:] for a in codec.receive(e)], trace
        assert sub.queued == -batch.n  # taken off the count (delivered around the queue here)


def test_a_cancel_at_the_seam_maps_like_the_others_for_a_run_watching_it() -> None:
    """cancel_seam seen by a run that does not pause at the approval (its stream began after it).

    docs/protocol.md §8's seam sequence: the waiting tool's ``tool.failed``
    (``cancelled``) is its ``TOOL_CALL_RESULT``, ``turn.cancelled`` ends the run
    ``cancelled``, as in the llm and tools cases.
    """
    m = RunMapper("sess_1", "run_2", "turn_1")
    out: list[ag.AguiEvent] = []
    for frame in frames("cancel_seam"):
        if isinstance(frame, EventFrame) and frame.event.type != "permission.requested":
            out += m.receive(frame.event)
    assert [brief(e) for e in out][-3:] == [
        "STEP_FINISHED call_1",
        "TOOL_CALL_RESULT toolu_1:result toolu_1 cancelled: cancelled",
        "RUN_FINISHED cancelled",
    ]
    for event in out:
        official(event)  # each one parses as ag_ui.core's


def test_an_elicitation_is_an_interrupt_with_its_question_and_schema() -> None:
    """docs/protocol.md §11: the server's message, and its schema as the answer's content."""
    trace = frames("elicitation_pending")
    requested = next(
        f.event for f in trace if isinstance(f, EventFrame)
        and f.event.type == "permission.requested" and f.event.session_id == "sess_1"
    )  # fmt: skip
    m = RunMapper("sess_1", "run_1", "turn_1")
    assert m.receive(requested) == []
    [finished] = m.pause()
    model = official(finished)
    assert isinstance(model, core.RunFinishedEvent)
    assert isinstance(model.outcome, core.RunFinishedInterruptOutcome)
    [interrupt] = model.outcome.interrupts
    assert (interrupt.id, interrupt.reason, interrupt.message) == (
        "perm_3", "elicitation", "Who should be assigned?"
    )  # fmt: skip
    schema = interrupt.response_schema
    assert schema is not None
    assert schema["properties"]["content"] == requested.payload.requested_schema
    assert schema["required"] == ["decision"]
    # A tool approval keeps its reason.
    approval = next(
        f.event for f in frames("cancel_seam") if isinstance(f, EventFrame)
        and f.event.type == "permission.requested"
    )  # fmt: skip
    fresh = RunMapper("sess_1", "run_1", "turn_1")
    fresh.receive(approval)
    [done] = fresh.pause()
    assert isinstance(done, ag.RunFinished) and isinstance(done.outcome, ag.InterruptOutcome)
    assert [i.reason for i in done.outcome.interrupts] == ["tool_approval"]


def test_a_compaction_in_the_run_is_a_custom_event_and_no_snapshot_message() -> None:
    """docs/protocol.md §12: CUSTOM events in the run; the context message is left out."""
    trace = frames("compaction_between_turns")
    m = RunMapper("sess_1", "run_1", "turn_2")
    out: list[ag.AguiEvent] = []
    for f in trace:
        if isinstance(f, EventFrame):
            out += m.receive(f.event)
    customs = [e for e in out if isinstance(e, ag.Custom)]
    assert [(e.name, e.value["trigger"]) for e in customs] == [
        ("gateway.context_compacting", "auto"),
        ("gateway.context_compacted", "auto"),
    ]
    assert customs[1].value["post_tokens"] == 2500
    for event in customs:
        assert isinstance(official(event), core.CustomEvent)
    # The compaction between turns (turn_id null) belongs to no run.
    first = RunMapper("sess_1", "run_1", "turn_1")
    assert not [
        e
        for f in trace
        if isinstance(f, EventFrame)
        for e in first.receive(f.event)
        if isinstance(e, ag.Custom)
    ]
    snap = next(f for f in trace if isinstance(f, Snapshot))
    assert [m.role for m in snap.messages] == ["user", "assistant", "context"]
    converted = agui_messages(snap.messages)
    assert [(c.id, type(c).__name__) for c in converted] == [
        ("msg_1", "UserMessage"),
        ("msg_2", "AssistantMessage"),
    ]


def test_a_resume_carries_an_elicitations_content() -> None:
    """An elicitation interrupt is answered ``{"decision", "content"}`` (its responseSchema)."""
    from gateway.doors.agui.routes import _resume_decisions
    from gateway.doors.agui.shapes import ResumeEntry
    from gateway.errors import ApiError

    def entry(perm_id: str, payload: Any) -> ResumeEntry:
        return ResumeEntry(interrupt_id=perm_id, status="resolved", payload=payload)

    entries = [
        entry("perm_1", {"decision": "allow", "content": {"name": "Ada"}}),
        entry("perm_2", {"decision": "deny"}),
        entry("perm_3", {"approved": True}),
    ]
    assert _resume_decisions(entries, {"perm_1", "perm_2", "perm_3"}) == [
        ("perm_1", "allow", {"name": "Ada"}),
        ("perm_2", "deny", None),
        ("perm_3", "allow", None),
    ]
    with pytest.raises(ApiError) as raised:
        _resume_decisions([entry("perm_1", {"decision": "allow", "content": "Ada"})], {"perm_1"})
    assert raised.value.code == "invalid_resume" and "content must be an object" in str(
        raised.value
    )


IMAGE = ImageBlock("file_" + "a" * 32, "image/png", 4035)
PDF = DocumentBlock("file_" + "c" * 32, "application/pdf", 900)
AUDIO = AudioBlock("file_" + "b" * 32, "audio/wav", 120)


def test_a_tools_files_are_media_parts_of_its_result_by_their_url() -> None:
    m = RunMapper("sess_1", "r", "turn_1", "https://gw.example")
    done = ToolCompleted("tu_1", "get-tiny-image", "here it is", 3, files=[IMAGE, AUDIO])
    [result] = m.receive(_event(done, "tool.completed"))
    official(result)  # AG-UI 1.0: a tool result's content may be parts
    assert msgspec.to_builtins(result)["content"] == [
        {"type": "text", "text": "here it is"},
        {"type": "image", "source": {"type": "url", "mimeType": "image/png",
         "value": f"https://gw.example/sessions/sess_1/files/{IMAGE.file_id}"},
         "metadata": {"fileId": IMAGE.file_id, "size": 4035}},
        {"type": "audio", "source": {"type": "url", "mimeType": "audio/wav",
         "value": f"https://gw.example/sessions/sess_1/files/{AUDIO.file_id}"},
         "metadata": {"fileId": AUDIO.file_id, "size": 120}},
    ]  # fmt: skip
    plain = ToolCompleted("tu_2", "sleep", "slept", 3)
    [text] = RunMapper("sess_1", "r", "turn_1").receive(_event(plain, "tool.completed"))
    assert isinstance(text, ag.ToolCallResult) and text.content == "slept"  # as before


def test_a_snapshot_shows_the_files_of_a_message_by_their_url() -> None:
    said = Message("msg_1", "sess_1", "turn_1", "user", [IMAGE, PDF, TextBlock("what is it?")],
                   "complete", 0)  # fmt: skip
    result = ToolResultBlock("tu_1", "an image", files=[IMAGE])
    results = Message("msg_3", "sess_1", "turn_1", "user", [result], "complete", 0)
    plain = Message("msg_4", "sess_1", "turn_2", "user", [TextBlock("thanks")], "complete", 0)
    converted = agui_messages([said, results, plain])
    for message in converted:
        TypeAdapter(core.Message).validate_json(msgspec.json.encode(message))
    user, tool, text = (msgspec.to_builtins(m) for m in converted)
    path = f"/sessions/sess_1/files/{IMAGE.file_id}"
    assert [p["type"] for p in user["content"]] == ["image", "document", "text"]
    assert user["content"][0]["source"] == {"type": "url", "value": path, "mimeType": "image/png"}
    assert user["content"][1]["metadata"] == {"fileId": PDF.file_id, "size": 900}
    assert tool["content"][1]["source"]["value"] == path
    assert text["content"] == "thanks"  # a message of text stays a string
    # The snapshot event as the official models read it.
    official(RunMapper("sess_1", "r", "turn_9").start([said, results], 1)[1])

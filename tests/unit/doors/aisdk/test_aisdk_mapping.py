"""The AI SDK mapping, sans-IO, table by table against the recorded traces (docs/doors/aisdk.md).

Each table is what :class:`~gateway.doors.aisdk.mapping.ChatMapper` makes of one
trace of tests/streaming-conformance/traces (recorded from a real gateway),
one line per UI message chunk: its type and its ids, delta, input, output,
approval or finish reason. No socket: the mapper is fed the decoded events one
by one, and :meth:`ChatMapper.pause` is called where the response's pump would
call it (after ``permission.requested``, nothing else being ready). Every
chunk list of every trace, from each of its subscriptions, is also applied by
:class:`tests.aisdk_support.UiMessage`, which fails where the ``ai`` package's
``processUIMessageStream`` would (tests/system/doors/aisdk/test_aisdk_js.py runs the
package itself on the same chunks).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest

from gateway.client import decode_server_frame
from gateway.doors.aisdk import chunks as ui
from gateway.doors.aisdk.mapping import ChatMapper, ui_message_id, user_message_id
from gateway.ids import parse_event_id
from gateway.protocol.events import Event, ToolCompleted, ToolErrorClass, ToolFailed
from gateway.protocol.frames import EventFrame, SubscribeAck
from gateway.protocol.shapes import AudioBlock, ImageBlock
from tests.aisdk_support import UiMessage
from tests.paths import TESTS

TRACES = TESTS / "streaming-conformance" / "traces"


def frames(name: str) -> list[Any]:
    return [
        decode_server_frame(line) for line in (TRACES / f"{name}.jsonl").read_text().splitlines()
    ]


def events(name: str, subscription: int = 0) -> list[Event]:
    """The trace's events from its ``subscription``-th ``subscribe_ack`` on (0: all of them)."""
    trace = frames(name)
    acks = [i for i, f in enumerate(trace) if isinstance(f, SubscribeAck)]
    return [f.event for f in trace[acks[subscription] :] if isinstance(f, EventFrame)]


def run(
    source: list[Event], mapper: ChatMapper | None = None, *, start: bool = True
) -> list[ui.Chunk]:
    """The events through a mapper of sess_1's turn_1, pausing after each permission request."""
    m = mapper or ChatMapper("sess_1", "turn_1")
    out = m.start() if start else []
    for event in source:
        out += m.receive(event)
        if event.type == "permission.requested":
            out += m.pause()
    return out


def wire(chunk: ui.Chunk) -> dict[str, Any]:
    decoded: dict[str, Any] = json.loads(ui.encode(chunk))
    return decoded


def brief(chunk: ui.Chunk) -> str:
    """One line per chunk: its type, then its ids, delta, input, output, approval, reason."""
    d = wire(chunk)
    keys = ("id", "messageId", "toolCallId", "toolName", "delta", "inputTextDelta", "input",
            "output", "approvalId", "approved", "reason", "errorText", "finishReason")  # fmt: skip
    parts = [d["type"]]
    for k in keys:
        if k in d:
            v = d[k]
            parts.append(v if isinstance(v, str) else json.dumps(v, separators=(",", ":")))
    if d["type"].startswith("data-"):
        parts.append(d["data"].get("state") or d["data"]["phase"])
    for name, value in ((d.get("providerMetadata") or {}).get("gateway") or {}).items():
        parts.append(f"{name}={value}")
    return " ".join(parts)


def read(chunks: list[ui.Chunk], message: UiMessage | None = None) -> UiMessage:
    """The chunks applied as the ``ai`` package applies them (raises where it would)."""
    m = message or UiMessage()
    for chunk in chunks:
        m.apply(wire(chunk))
    return m


def mapped(name: str, mapper: ChatMapper | None = None, subscription: int = 0) -> list[str]:
    return [brief(c) for c in run(events(name, subscription), mapper)]


PLAIN_TEXT = [
    "start msg_turn_1",
    "start-step",
    "text-start msg_2:0",
    "text-delta msg_2:0 You ",
    "text-delta msg_2:0 said: ",
    "text-delta msg_2:0 Hello ",
    "text-delta msg_2:0 there, ",
    "text-delta msg_2:0 gateway",
    "text-end msg_2:0",
    "finish-step",
    "finish stop",
]

THINKING_THEN_TEXT = [
    "start msg_turn_1",
    "start-step",
    "reasoning-start msg_2:0",
    "reasoning-delta msg_2:0 The ",
    "reasoning-delta msg_2:0 user ",
    "reasoning-delta msg_2:0 greets ",
    "reasoning-delta msg_2:0 me. ",
    "reasoning-delta msg_2:0 I ",
    "reasoning-delta msg_2:0 should ",
    "reasoning-delta msg_2:0 greet ",
    "reasoning-delta msg_2:0 back.",
    "reasoning-end msg_2:0 signature=sig_dc8bbffe11f43fb6dbda8933b371f50b",
    "reasoning-start msg_2:1",  # redacted: its data, opaque, on the end
    "reasoning-end msg_2:1 redactedData=opaque-data",
    "text-start msg_2:2",
    "text-delta msg_2:2 Hello! ",
    "text-delta msg_2:2 Nice ",
    "text-delta msg_2:2 to ",
    "text-delta msg_2:2 meet ",
    "text-delta msg_2:2 you.",
    "text-end msg_2:2",
    "finish-step",
    "finish stop",
]

PARALLEL_TOOLS = [
    "start msg_turn_1",
    "start-step",
    "reasoning-start msg_2:0",
    "reasoning-delta msg_2:0 Two ",
    "reasoning-delta msg_2:0 naps ",
    "reasoning-delta msg_2:0 at ",
    "reasoning-delta msg_2:0 once.",
    "reasoning-end msg_2:0 signature=sig_b04f5178e973aaf264a67698a45192d6",
    "text-start msg_2:1",
    "text-delta msg_2:1 Sleeping ",
    "text-delta msg_2:1 twice.",
    "text-end msg_2:1",
    "tool-input-start toolu_1 sleep",
    'tool-input-delta toolu_1 {"second',
    'tool-input-delta toolu_1 s":0.01}',
    'tool-input-available toolu_1 sleep {"seconds":0.01}',
    "tool-input-start toolu_2 sleep",
    'tool-input-delta toolu_2 {"second',
    'tool-input-delta toolu_2 s":0.25}',
    'tool-input-available toolu_2 sleep {"seconds":0.25}',
    "finish-step",
    "tool-output-available toolu_1 slept 0.01 s",
    "tool-output-available toolu_2 slept 0.25 s",
    "start-step",  # the second LLM call: a second step of the same message
    "text-start msg_3:0",
    "text-delta msg_3:0 Both ",
    "text-delta msg_3:0 naps ",
    "text-delta msg_3:0 are ",
    "text-delta msg_3:0 over.",
    "text-end msg_3:0",
    "finish-step",
    "finish stop",
]

CANCEL_LLM = [
    "start msg_turn_1",
    "start-step",
    "text-start msg_2:0",
    "text-delta msg_2:0 Let ",
    "text-delta msg_2:0 me ",
    "text-delta msg_2:0 run ",
    "text-delta msg_2:0 it.",
    "text-end msg_2:0",
    "tool-input-start toolu_1 sleep",
    'tool-input-delta toolu_1 {"second',
    'tool-input-delta toolu_1 s":0.01,',  # cut by the cancel: the input is what parses
    'tool-input-available toolu_1 sleep {"seconds":0.01}',
    "finish-step",
    "tool-output-error toolu_1 cancelled: the turn ended first",  # input, never run
    "abort user",
    "finish other",
]

CANCEL_TOOLS = [
    "start msg_turn_1",
    "start-step",
    "text-start msg_2:0",
    "text-delta msg_2:0 A ",
    "text-delta msg_2:0 long ",
    "text-delta msg_2:0 nap.",
    "text-end msg_2:0",
    "tool-input-start toolu_1 sleep",
    'tool-input-delta toolu_1 {"second',
    'tool-input-delta toolu_1 s":60}',
    'tool-input-available toolu_1 sleep {"seconds":60}',
    "finish-step",
    "tool-output-error toolu_1 cancelled: cancelled",
    "abort user",
    "finish other",
]

CANCEL_SEAM = [  # the approval pauses the response; the cancel comes after it
    "start msg_turn_1",
    "start-step",
    "text-start msg_2:0",
    "text-delta msg_2:0 Sleeping.",
    "text-end msg_2:0",
    "tool-input-start toolu_1 sleep",
    'tool-input-delta toolu_1 {"second',
    'tool-input-delta toolu_1 s":0.01}',
    'tool-input-available toolu_1 sleep {"seconds":0.01}',
    "finish-step",
    'tool-approval-request toolu_1 perm_1 Allow sleep with {"seconds":0.01}?',
    "finish tool-calls",
]

PROVIDER_ERROR = [
    "start msg_turn_1",
    "start-step",
    "reasoning-start msg_2:0",
    "reasoning-delta msg_2:0 Hmm.",
    "reasoning-end msg_2:0 signature=sig_7f2302c86d005fed4397eef4134c2c03",
    "text-start msg_2:1",
    "text-delta msg_2:1 This ",
    "text-delta msg_2:1 reply ",
    "text-delta msg_2:1 will ",
    "text-end msg_2:1",
    "finish-step",
    "error overloaded: scripted overloaded after 5 deltas",
    "finish error",
]

SNAPSHOT_MID_APPROVAL = [  # from a snapshot: toolu_1 is no part of what this message shows
    "start msg_turn_1",
    "text-start msg_3:0",
    "text-delta msg_3:0 Rested.",
    "text-end msg_3:0",
    "finish stop",
]

ELICITATION_PENDING = [
    "start msg_turn_1",
    "data-elicitation perm_3 requested",
    "finish tool-calls",
]

DELEGATE_WORKERS = [  # the worker's own turn (sess_2) is no part of this message
    "start msg_turn_1",
    "start-step",
    "text-start msg_2:0",
    "text-delta msg_2:0 Asking ",
    "text-delta msg_2:0 a ",
    "text-delta msg_2:0 worker.",
    "text-end msg_2:0",
    "tool-input-start toolu_1 delegate",
    'tool-input-delta toolu_1 {"task":',
    'tool-input-delta toolu_1 "summari',
    "tool-input-delta toolu_1 se the n",
    'tool-input-delta toolu_1 otes"}',
    'tool-input-available toolu_1 delegate {"task":"summarise the notes"}',
    "finish-step",
    "data-delegate sess_2 running",
    "data-delegate sess_2 completed",
    'tool-output-available toolu_1 {"worker_session_id":"sess_2"}',
    "start-step",
    "text-start msg_5:0",
    "text-delta msg_5:0 The ",
    "text-delta msg_5:0 worker ",
    "text-delta msg_5:0 is ",
    "text-delta msg_5:0 done.",
    "text-end msg_5:0",
    "finish-step",
    "finish stop",
]

CLAUDE_CODE_TOOL = [
    "start msg_turn_1",
    "start-step",
    "text-start msg_01CcBashTouch000001:0",
    "text-delta msg_01CcBashTouch000001:0 Running it.",
    "text-end msg_01CcBashTouch000001:0",
    "tool-input-start toolu_01Bash000001 Bash",
    'tool-input-delta toolu_01Bash000001 {"command"',
    'tool-input-delta toolu_01Bash000001 : "touch made.txt", "description": "run it"}',
    "tool-input-available toolu_01Bash000001 Bash "
    '{"command":"touch made.txt","description":"run it"}',
    "finish-step",
    "tool-approval-request toolu_01Bash000001 perm_1 "
    'Allow Bash with {"command":"touch made.txt","description":"run it"}?',
    "finish tool-calls",
]


@pytest.mark.parametrize(
    ("trace", "table"),
    [
        ("plain_text", PLAIN_TEXT),
        ("thinking_then_text", THINKING_THEN_TEXT),  # thinking, redacted thinking, text
        ("parallel_tools", PARALLEL_TOOLS),  # two tools, two LLM calls: two steps
        ("cancel_llm", CANCEL_LLM),  # docs/protocol.md §8, each phase: abort, then finish
        ("cancel_tools", CANCEL_TOOLS),
        ("cancel_seam", CANCEL_SEAM),  # an approval: the response pauses
        ("provider_error", PROVIDER_ERROR),  # section 7: error with the error class
        ("snapshot_mid_approval", SNAPSHOT_MID_APPROVAL),
        ("elicitation_pending", ELICITATION_PENDING),  # section 11: a data part, a pause
        ("delegate_workers", DELEGATE_WORKERS),  # section 5: a data part per worker
        ("claude_code_tool", CLAUDE_CODE_TOOL),  # the claude-code runtime's approval
    ],
)
def test_each_trace_maps_to_its_table(trace: str, table: list[str]) -> None:
    assert mapped(trace) == table


def test_a_compaction_in_the_turn_is_one_data_part_updated() -> None:
    """docs/protocol.md §12: compacting, then compacted, in the part of the same id."""
    out = run(events("compaction_between_turns"), ChatMapper("sess_1", "turn_2"))
    assert [brief(c) for c in out] == [
        "start msg_turn_2",
        "data-compaction compaction-1 compacting",
        "data-compaction compaction-1 compacted",
        "start-step",
        "text-start msg_6:0",
        "text-delta msg_6:0 You ",
        "text-delta msg_6:0 said: ",
        "text-delta msg_6:0 And ",
        "text-delta msg_6:0 again",
        "text-end msg_6:0",
        "finish-step",
        "finish stop",
    ]
    compacted = read(out).parts[0]
    assert compacted["type"] == "data-compaction" and compacted["data"]["post_tokens"] == 2500
    # The compaction between the turns (turn_id null) belongs to no response.
    first = run(events("compaction_between_turns"))
    assert not [c for c in first if isinstance(c, ui.Data)]


def test_a_replay_rebuilds_a_streaming_messages_blocks_from_its_snapshot() -> None:
    """since_mid_message from its second subscription: the open text block, whole, then live."""
    out = run(events("since_mid_message", 1))
    assert [brief(c) for c in out] == [
        "start msg_turn_1",
        "text-start msg_2:0",
        "text-delta msg_2:0 Seven words make up this reply ",
        "text-delta msg_2:0 here.",
        "text-end msg_2:0",
        "finish stop",
    ]
    assert read(out).text == "Seven words make up this reply here."


def test_a_replay_rebuilds_the_blocks_a_message_complete_holds() -> None:
    """server_restart from its second subscription: the message's blocks, never streamed here."""
    out = run(events("server_restart", 1))
    assert [brief(c) for c in out] == [
        "start msg_turn_1",
        "reasoning-start msg_2:0",
        "reasoning-delta msg_2:0 Careful now.",
        "reasoning-end msg_2:0 signature=sig_76d5f1c9dd779d441d6b688f8447a1fd",
        "text-start msg_2:1",
        "text-delta msg_2:1 This part survives.",
        "text-end msg_2:1",
        "abort server_restart",
        "finish other",
    ]
    # The blocks that streamed are not rebuilt: a whole trace maps them once.
    whole = read(run(events("server_restart")))
    assert whole.text == "This part survives." and len(whole.parts) == 2


def test_a_replayed_tool_call_is_rebuilt_with_its_input() -> None:
    """A message.complete holding a tool call not seen start: its input in one delta."""
    source = [e for e in events("parallel_tools") if not e.type.startswith(("tool.use", "text."))]
    source = [e for e in source if not e.type.startswith("thinking.")]
    out = run(source)
    lines = [brief(c) for c in out]
    assert lines[lines.index("tool-input-start toolu_1 sleep") :][:3] == [
        "tool-input-start toolu_1 sleep",
        'tool-input-delta toolu_1 {"seconds":0.01}',
        'tool-input-available toolu_1 sleep {"seconds":0.01}',
    ]
    m = read(out)
    assert m.text == "Sleeping twice.Both naps are over."
    assert [m.tool(t)["state"] for t in ("toolu_1", "toolu_2")] == ["output-available"] * 2


def _every_subscription() -> list[tuple[str, str, int]]:
    cases = []
    for path in sorted(TRACES.glob("*.jsonl")):
        trace = frames(path.stem)
        subscriptions = sum(isinstance(f, SubscribeAck) for f in trace)
        turns = sorted({f.event.turn_id for f in trace if isinstance(f, EventFrame)
                        and f.event.session_id == "sess_1" and f.event.turn_id})  # fmt: skip
        cases += [(path.stem, t, s) for t in turns for s in range(subscriptions)]
    return cases


@pytest.mark.parametrize(
    ("trace", "turn", "subscription"),
    _every_subscription(),
)
def test_every_trace_reads_as_the_ai_package_reads_it(
    trace: str, turn: str, subscription: int
) -> None:
    """Each response one message: every part started before its deltas and ended once."""
    m = ChatMapper("sess_1", turn)
    out = run(events(trace, subscription), m)
    if not m.finished:  # a trace that stops mid-turn: the response ends as the pump ends it
        out += m.closed()
    message = read(out)
    assert message.id == ui_message_id(turn)
    assert wire(out[0])["type"] == "start" and wire(out[-1])["type"] == "finish"
    assert [wire(c)["type"] for c in out].count("finish") == 1
    assert not message._text and not message._reasoning  # every text and reasoning ended
    assert all(p["state"] == "done" for p in message.parts if p["type"] in ("text", "reasoning"))
    steps = [wire(c)["type"] for c in out]
    assert steps.count("start-step") == steps.count("finish-step")


def test_the_finish_carries_the_position_and_the_start_the_turn() -> None:
    m = ChatMapper("sess_1", "turn_1")
    out = run(events("plain_text"), m)
    assert wire(out[0])["messageMetadata"] == {"gateway": {"sessionId": "sess_1",
                                                           "turnId": "turn_1"}}  # fmt: skip
    meta = wire(out[-1])["messageMetadata"]["gateway"]
    assert meta["lastEventId"] == m.last_event_id == "evt_00000000000000000014"
    assert meta["turnId"] == "turn_1" and meta["usage"]["output_tokens"] >= 0
    assert m.finished and m.receive(events("plain_text")[-1]) == []


def test_a_pause_is_once_and_carries_the_position_of_the_request() -> None:
    m = ChatMapper("sess_1", "turn_1")
    out = run(events("cancel_seam"), m)
    assert m.waiting == ["perm_1"] and m.finished
    meta = wire(out[-1])["messageMetadata"]["gateway"]
    assert meta["lastEventId"] == "evt_00000000000000000015"  # the request
    assert m.pause() == [] and m.closed() == [m._finish("other")]  # closing adds no part


def _position(name: str, event_type: str) -> int:
    found = next(e for e in events(name) if e.type == event_type)
    return parse_event_id(found.id) or 0


def test_a_continuation_streams_only_what_came_after_the_pause() -> None:
    """claude_code_tool answered: the next request continues the message after the request."""
    first = run(events("claude_code_tool"))
    after = _position("claude_code_tool", "permission.requested")
    assert wire(first[-1])["messageMetadata"]["gateway"]["lastEventId"] == f"evt_{after:020d}"
    m = ChatMapper("sess_1", "turn_1", after=after, answering=frozenset({"perm_1"}))
    out = run(events("claude_code_tool"), m)
    assert [brief(c) for c in out] == [
        "start msg_turn_1",  # the same message, continued
        "tool-approval-response perm_1 true",
        "tool-output-available toolu_01Bash000001 "
        '{"stdout":"","stderr":"","interrupted":false,"isImage":false,"noOutputExpected":true}',
        "start-step",
        "text-start msg_01XFDUDYJgAACzvnptvVoYEL:0",
        "text-delta msg_01XFDUDYJgAACzvnptvVoYEL:0 Hello",
        "text-delta msg_01XFDUDYJgAACzvnptvVoYEL:0 , world",
        "text-delta msg_01XFDUDYJgAACzvnptvVoYEL:0 !",
        "text-end msg_01XFDUDYJgAACzvnptvVoYEL:0",
        "finish-step",
        "finish stop",
    ]
    # Read as useChat reads it: the first answer, the approval given, then the continuation.
    message = read(first)
    tool = message.tool("toolu_01Bash000001")
    assert tool["state"] == "approval-requested" and tool["approval"]["id"] == "perm_1"
    tool.update(state="approval-responded", approval={"id": "perm_1", "approved": True})
    read(out, message)
    assert tool["state"] == "output-available" and message.finish_reason == "stop"
    assert message.text == "Running it.Hello, world!"


@pytest.mark.parametrize(
    "trace",
    ["parallel_tools", "thinking_then_text", "delegate_workers", "cancel_llm", "cancel_tools",
     "provider_error", "claude_code_text", "unknown_events"],
)  # fmt: skip
def test_a_continuation_cut_anywhere_tracks_what_the_client_has(trace: str) -> None:
    """At every position: the chunks after it, applied to those before, make the whole message."""
    source = events(trace)
    whole = [brief(c) for c in run(source)]
    for event in source:
        after = parse_event_id(event.id) or 0
        before = ChatMapper("sess_1", "turn_1")
        head = run([e for e in source if (parse_event_id(e.id) or 0) <= after], before)
        tail = run(source, ChatMapper("sess_1", "turn_1", after=after))
        if before.finished:  # the turn's end: nothing after it but the end again
            assert [brief(c) for c in head] == whole
            assert [wire(c)["type"] for c in tail] == ["start", "finish"]
            continue
        assert [brief(c) for c in head + tail[1:]] == whole, event.id
        read(tail[1:], read(head))


def test_no_pause_for_the_approvals_a_request_answers() -> None:
    """``answering``: a request carrying the answer streams on through the approval."""
    out = run(
        events("cancel_seam"), ChatMapper("sess_1", "turn_1", answering=frozenset({"perm_1"}))
    )
    assert [brief(c) for c in out][-7:] == [
        'tool-input-available toolu_1 sleep {"seconds":0.01}',
        "finish-step",
        'tool-approval-request toolu_1 perm_1 Allow sleep with {"seconds":0.01}?',
        "tool-approval-response perm_1 false cancelled",  # the cancel at the seam
        "tool-output-error toolu_1 cancelled: cancelled",
        "abort user",
        "finish other",
    ]
    assert read(out).tool("toolu_1")["state"] == "output-error"
    # Answering another approval does not stop the pause for this one.
    other = run(events("cancel_seam"), ChatMapper("sess_1", "turn_1", answering=frozenset({"x"})))
    assert [brief(c) for c in other] == CANCEL_SEAM


def denied() -> list[Event]:
    """claude_code_tool with its approval denied: the tool fails ``permission_denied``."""
    source = events("claude_code_tool")
    i = next(i for i, e in enumerate(source) if e.type == "permission.resolved")
    resolved = source[i]
    deny = msgspec.structs.replace(
        resolved, payload=msgspec.structs.replace(resolved.payload, decision="deny")
    )
    return [*source[:i], deny, _tool_failed(source[i + 1], "permission_denied")]


def test_a_denied_approval_ends_the_tool_denied() -> None:
    out = run(denied(), ChatMapper("sess_1", "turn_1", answering=frozenset({"perm_1"})))
    assert [brief(c) for c in out][-2:] == [
        "tool-approval-response perm_1 false",
        "tool-output-denied toolu_01Bash000001",
    ]
    assert read(out).tool("toolu_01Bash000001")["state"] == "output-denied"


IMAGE = ImageBlock("file_" + "a" * 32, "image/png", 4035)
AUDIO = AudioBlock("file_" + "b" * 32, "audio/wav", 120)


def with_files() -> list[Event]:
    """parallel_tools with its first tool's result holding an image and audio (an MCP
    tool's, docs/protocol.md §2 "Files")."""
    source = events("parallel_tools")
    i = next(i for i, e in enumerate(source) if e.type == "tool.completed")
    assert isinstance(source[i].payload, ToolCompleted)
    payload = msgspec.structs.replace(source[i].payload, files=[IMAGE, AUDIO])
    return [*source[:i], msgspec.structs.replace(source[i], payload=payload), *source[i + 1 :]]


def test_a_tools_files_are_file_parts_by_their_url() -> None:
    out = run(with_files())
    files = [wire(c) for c in out if wire(c)["type"] == "file"]
    assert files == [
        {"type": "file", "url": f"/sessions/sess_1/files/{f.file_id}", "mediaType": f.media_type,
         "providerMetadata": {"gateway": {"fileId": f.file_id, "size": f.size,
                                          "toolCallId": "toolu_1"}}}
        for f in (IMAGE, AUDIO)
    ]  # fmt: skip
    kinds = [wire(c)["type"] for c in out]
    assert kinds.index("file") == kinds.index("tool-output-available") + 1  # after its output
    assert next(p for p in read(out).parts if p["type"] == "file")["url"] == files[0]["url"]
    # Behind a proxy, [server] public_url is the URL's base; the bytes are never in a chunk.
    public = run(with_files(), ChatMapper("sess_1", "turn_1", file_base="https://gw.example/"))
    urls = [wire(c)["url"] for c in public if wire(c)["type"] == "file"]
    assert urls == [f"https://gw.example/sessions/sess_1/files/{f.file_id}" for f in (IMAGE, AUDIO)]


def _tool_failed(completed: Event, error_class: ToolErrorClass) -> Event:
    p = completed.payload
    payload = ToolFailed(p.tool_use_id, p.tool_name, error_class, "denied")
    return msgspec.structs.replace(completed, type="tool.failed", payload=payload)


def test_a_workers_approval_is_asked_on_the_delegate_call_that_runs_it() -> None:
    """docs/protocol.md §5: a worker's request reaches the parent's response, on its call."""
    source = events("delegate_workers")
    started = next(i for i, e in enumerate(source) if e.type == "delegate.started")
    asked = next(e for e in events("cancel_seam") if e.type == "permission.requested")
    worker = msgspec.structs.replace(asked, session_id="sess_2", turn_id="turn_2")
    m = ChatMapper("sess_1", "turn_1")
    out = run([*source[: started + 1], worker], m)
    assert brief(out[-2]).startswith("tool-approval-request toolu_1 perm_1 Allow sleep")
    assert brief(out[-1]) == "finish tool-calls" and m.waiting == ["perm_1"]
    assert read(out).tool("toolu_1")["state"] == "approval-requested"
    # A second request while the first waits, or one with no delegate call: a data part.
    fresh = ChatMapper("sess_1", "turn_1", answering=frozenset({"perm_1", "perm_9"}))
    again = msgspec.structs.replace(
        worker, payload=msgspec.structs.replace(asked.payload, perm_id="perm_9")
    )
    out = run([*source[: started + 1], worker, again], fresh)
    assert brief(out[-1]) == "data-permission perm_9 requested"
    lone = ChatMapper("sess_1", "turn_1")
    assert [brief(c) for c in run([worker], lone)] == [
        "start msg_turn_1",
        "data-permission perm_1 requested",
        "finish tool-calls",
    ]


def test_a_data_parts_request_is_updated_when_answered() -> None:
    """elicitation_pending answered: the elicitation and the worker's request, resolved.

    A request shown as a data part (an elicitation; a worker's with no
    delegate call) is sent again, same id, with its decision, so the part the
    client shows does not stay ``requested`` after the answer.
    """
    m = ChatMapper("sess_1", "turn_1", answering=frozenset({"perm_3", "perm_4"}))
    out = run(events("elicitation_pending"), m)
    assert [brief(c) for c in out] == [
        "start msg_turn_1",
        "data-elicitation perm_3 requested",
        "data-permission perm_4 requested",
        "data-elicitation perm_3 resolved",
        "data-permission perm_4 resolved",
        "data-delegate sess_2 completed",
        "text-start msg_3:0",
        "text-delta msg_3:0 Ticket ",
        "text-delta msg_3:0 T-42 ",
        "text-delta msg_3:0 filed.",
        "text-end msg_3:0",
        "finish stop",
    ]
    parts = {p["id"]: p["data"] for p in read(out).parts if p["type"].startswith("data-")}
    assert parts["perm_3"]["decision"] == "allow" and parts["perm_3"]["state"] == "resolved"
    assert parts["perm_3"]["requestedSchema"]["required"] == ["assignee"]
    assert parts["perm_4"]["decision"] == "cancelled" and parts["perm_4"]["sessionId"] == "sess_2"
    assert m.waiting == []


def test_other_turns_and_other_sessions_map_to_nothing() -> None:
    m = ChatMapper("sess_1", "turn_9")
    assert run(events("parallel_tools"), m, start=False) == [] and m.last_event_id is None
    worker_text = [e for e in events("delegate_workers") if e.session_id == "sess_2"]
    assert run(worker_text, ChatMapper("sess_1", "turn_1"), start=False) == []


def test_a_closed_response_ends_what_it_left_open() -> None:
    """The pump's end without the turn's: open parts and steps closed, an error said."""
    source = events("since_mid_message")[:7]  # mid text block, no turn end
    m = ChatMapper("sess_1", "turn_1")
    out = run(source, m) + m.closed("turn turn_1 can no longer be replayed")
    assert [brief(c) for c in out][-3:] == [
        "text-end msg_2:0",
        "error turn turn_1 can no longer be replayed",
        "finish error",
    ]
    read(out)


def test_the_wire_names_are_the_packages() -> None:
    """camelCase, unset optionals left out, a data part's type ``data-{name}``."""
    assert wire(ui.ToolInputStart(tool_call_id="t", tool_name="n")) == {
        "type": "tool-input-start", "toolCallId": "t", "toolName": "n",
        "providerExecuted": True, "dynamic": True,
    }  # fmt: skip
    assert wire(ui.Abort()) == {"type": "abort"}
    assert wire(ui.Data(name="x", id="1", data={"a": 1})) == {
        "type": "data-x", "id": "1", "data": {"a": 1}
    }  # fmt: skip
    assert wire(ui.ToolApprovalResponse(approval_id="p", approved=False)) == {
        "type": "tool-approval-response", "approvalId": "p", "approved": False,
    }  # fmt: skip


def test_the_gateways_tools_are_dynamic_and_provider_executed() -> None:
    """Sent, not left to their defaults: absent, the SDK makes a static tool part and
    calls the client's ``onToolCall`` for a tool the gateway runs itself."""
    answered = ChatMapper("sess_1", "turn_1", answering=frozenset({"perm_1"}))
    out = run(events("claude_code_tool"), answered)
    assert {"tool-input-start", "tool-approval-response", "tool-output-available"} <= {
        wire(c)["type"] for c in out
    }
    for chunk in out:
        d = wire(chunk)
        if not d["type"].startswith("tool-"):
            continue
        if d["type"] not in ("tool-input-delta", "tool-approval-request", "start", "finish"):
            assert d["providerExecuted"] is True, d
        if d["type"] in ("tool-input-start", "tool-input-available"):
            assert d["dynamic"] is True, d


def test_ids() -> None:
    assert ui_message_id("turn_1") == "msg_turn_1"
    a, b = user_message_id("sess_1", "u1"), user_message_id("sess_1", "u2")
    assert a != b and a == user_message_id("sess_1", "u1") and a.startswith("msg_")
    assert user_message_id("sess_2", "u1") != a


def dump(path: Path) -> None:
    """Every response of every trace as its chunks' JSON, keyed ``trace/turn/subscription``.

    What tests/system/doors/aisdk/test_aisdk_js.py gives the ``ai`` package to validate and
    assemble.
    """
    out: dict[str, list[dict[str, Any]]] = {}
    for trace, turn, subscription in _every_subscription():
        m = ChatMapper("sess_1", turn)
        chunks = run(events(trace, subscription), m)
        if not m.finished:
            chunks += m.closed()
        out[f"{trace}/{turn}/{subscription}"] = [wire(c) for c in chunks]
    answered = {  # responses that carry the answers: no pause
        "claude_code_tool/answered": (events("claude_code_tool"), {"perm_1"}),
        "claude_code_tool/denied": (denied(), {"perm_1"}),
        "cancel_seam/answered": (events("cancel_seam"), {"perm_1"}),
        "elicitation_pending/answered": (events("elicitation_pending"), {"perm_3", "perm_4"}),
    }
    for key, (source, perms) in answered.items():
        chunks = run(source, ChatMapper("sess_1", "turn_1", answering=frozenset(perms)))
        out[key] = [wire(c) for c in chunks]
    out["tool_files/turn_1/0"] = [wire(c) for c in run(with_files())]
    path.write_text(json.dumps(out))


def test_a_continuation_that_answers_nothing_ends_at_once_where_it_began() -> None:
    """The approval still waits and the request answers none: the same pause, at once.

    (It used to wait, pinging, until the approval expired: nothing came after the
    request's position, and a pause was never made at or below it.)
    """
    source = events("claude_code_tool")
    after = _position("claude_code_tool", "permission.requested")
    upto = [e for e in source if (parse_event_id(e.id) or 0) <= after]
    m = ChatMapper("sess_1", "turn_1", after=after)
    out = m.start()
    for event in upto:  # the replay, then the pump's pause at its end
        out += m.receive(event)
    out += m.pause()
    assert [brief(c) for c in out] == ["start msg_turn_1", "finish tool-calls"]

"""The soak (bench/soak/): its 20-second smoke against a real daemon, and its checks.

The smoke is the ten-minute ``python -m bench --profile soak`` shrunk to 30
seconds of load (``--profile soak-smoke``; bench/README.md, "Soak"): a real
``gateway serve`` subprocess on 127.0.0.1, port 0, under reconnect churn,
slow clients, cancels in each phase, failing tools and clients killed
mid-frame. It must end with the daemon alive, nothing lost, duplicated or
out of order for the stayers, and file descriptors and tasks back at their
baseline.

A check that cannot fail is worth nothing, so the checks themselves are
tested too, synchronously (the audit is sans-IO): a lost delta, a duplicate,
an event out of order, a block that never ended, a replay holding an event the
client never got, a turn that ended otherwise than the contract says, a
leaked descriptor; and a daemon that dies mid-soak is reported, not raised.
"""

from __future__ import annotations

import os
import signal
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import trio

from bench.profiles import SOAK_SMOKE
from bench.soak.audit import StreamAudit, compare_replay
from bench.soak.report import markdown, slope_per_min, verdict
from bench.soak.run import Soak, run_soak
from bench.soak.scripts import judge, scenarios
from gateway.ids import format_event_id
from gateway.protocol.events import (
    BusSubscriberUnregistered,
    Event,
    MessageComplete,
    MessageSnapshot,
    MessageStart,
    TextDelta,
    TextEnd,
    TextStart,
    ToolFailed,
    TurnCancelled,
    TurnCompleted,
)
from gateway.protocol.frames import EventFrame
from gateway.protocol.shapes import Message, TextBlock, Usage

# httpx leaves its request body's async generator unfinished when a request
# is cancelled or its connection dies mid-write (a churning client cancelled
# at the end of a phase, a killed daemon); Trio warns when it is collected.
# That generator is httpx's, not a socket of ours: the soak's own resources
# are checked by the leak figures.
# slow: soak: a daemon for 20 s
pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings(
        "ignore:Async generator 'httpx._content.ByteStream.__aiter__' was garbage collected"
        ":ResourceWarning"
    ),
]

# --- the smoke: a real daemon for 20 seconds -------------------------------------------


async def test_twenty_seconds_of_soak_lose_nothing_and_leak_nothing(tmp_path: Path) -> None:
    logged: list[str] = []
    with trio.fail_after(180):
        result = await run_soak(SOAK_SMOKE, tmp_path, logged.append)
    checks = verdict(result, SOAK_SMOKE)
    assert all(c.passed for c in checks), markdown(result, checks) + "\n".join(logged)

    assert result["daemon"]["alive"] and result["daemon"]["shutdown_code"] == 0
    stayers = result["stayers"]
    assert stayers["events"] > 1000 and stayers["compared"] > 0
    assert stayers["lost"] == stayers["duplicated"] == stayers["out_of_order"] == 0
    for figure, slack in (("fds", SOAK_SMOKE.fd_slack), ("tasks", SOAK_SMOKE.task_slack)):
        assert result["end"][figure] - result["baseline"][figure] <= slack
    assert all(t["run"] and t["as_expected"] == t["run"] for t in result["turns"].values())
    assert result["slow"]["closed_too_slow"] >= 1

    # The thresholds bite: one descriptor or task over the slack fails the run.
    for figure, slack in (("fds", SOAK_SMOKE.fd_slack), ("tasks", SOAK_SMOKE.task_slack)):
        leaked = {
            **result,
            "end": {**result["end"], figure: result["baseline"][figure] + slack + 1},
        }
        failed = {c.name for c in verdict(leaked, SOAK_SMOKE) if not c.passed}
        assert failed == {f"{figure}: end - baseline"}

    # Sessions went in and out of memory, and the visitors' checks bite too.
    visitors = result["visitors"]
    assert visitors["visits"] >= 2 and not visitors["problems"]
    assert result["end"]["sessions_unloaded"] >= visitors["visits"] // 2
    lost = {**result, "visitors": {**visitors, "problems": ["sess_x: visit 2: lost"]}}
    failed = {c.name for c in verdict(lost, SOAK_SMOKE) if not c.passed}
    assert failed == {"visitors: lost, repeated or stuck"}
    stayed = {**result, "end": {**result["end"], "sessions_unloaded": 0}}
    failed = {c.name for c in verdict(stayed, SOAK_SMOKE) if not c.passed}
    assert failed == {"sessions unloaded (in and out of memory)"}


async def test_a_daemon_that_dies_mid_soak_is_reported_not_raised(tmp_path: Path) -> None:
    profile = replace(SOAK_SMOKE, warmup_s=1.0, duration_s=120.0)
    soak = Soak(profile, tmp_path, lambda message: None)
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(soak.run)
            await soak.entered["load"].wait()
            assert soak.daemon is not None and soak.daemon.pid is not None
            os.kill(soak.daemon.pid, signal.SIGKILL)
    result = soak.result()
    assert result["daemon"]["alive"] is False
    assert result["daemon"]["exit_code"] == -signal.SIGKILL
    failed = {c.name for c in verdict(result, profile) if not c.passed}
    assert "daemon stayed alive" in failed
    assert "The daemon's log" in markdown(result, verdict(result, profile))


# --- the checks, synchronously -------------------------------------------------------------

SESSION = "sess_a"
MSG = "msg_a"


def frame(seq: int, payload: Any, type_: str, turn_id: str | None = "turn_a") -> EventFrame:
    return EventFrame(Event(format_event_id(seq), type_, SESSION, turn_id, 0, "llm", payload))


def unregistered(seq: int) -> EventFrame:
    payload = BusSubscriberUnregistered("ws-1", "client_closed")
    return frame(seq, payload, "bus.subscriber_unregistered", None)


def text_message(
    first: int, deltas: list[str], final: str, *, end: bool = True
) -> list[EventFrame]:
    """message.start, one text block of ``deltas``, (text.end), message.complete of ``final``."""
    frames = [
        frame(first, MessageStart(MSG, "assistant", "m"), "message.start"),
        frame(first + 1, TextStart(MSG, 0), "text.start"),
    ]
    for i, text in enumerate(deltas):
        frames.append(frame(first + 2 + i, TextDelta(MSG, 0, text), "text.delta"))
    seq = first + 2 + len(deltas)
    if end:
        frames.append(frame(seq, TextEnd(MSG, 0), "text.end"))
        seq += 1
    complete = MessageComplete(MSG, "end_turn", [TextBlock(final)], Usage())
    frames.append(frame(seq, complete, "message.complete"))
    return frames


def fed(frames: list[EventFrame], **kw: Any) -> StreamAudit:
    audit = StreamAudit(SESSION, **kw)
    for f in frames:
        audit.feed(f)
    return audit


def test_a_whole_stream_passes_the_audit() -> None:
    audit = fed([unregistered(1), *text_message(2, ["a", "b", "c"], "abc")], keep_replayable=True)
    assert (audit.received, audit.duplicated, audit.out_of_order, audit.violations) == (8, 0, 0, 0)
    assert audit.replayable == [format_event_id(1), format_event_id(8)]
    audit.finish()
    assert audit.violations == 0, audit.details


def test_duplicates_and_events_out_of_order_are_counted() -> None:
    audit = fed([unregistered(1), unregistered(3), unregistered(3), unregistered(2)])
    assert (audit.duplicated, audit.out_of_order) == (1, 1)


def test_a_lost_delta_and_a_block_never_ended_are_violations() -> None:
    lost = fed(text_message(1, ["a", "c"], "abc"))
    assert lost.violations == 1 and "differs from final_content" in lost.details[0]
    unended = fed(text_message(1, ["a", "b", "c"], "abc", end=False))
    assert unended.violations == 1 and "never ended" in unended.details[0]


def test_a_message_interrupted_by_a_reconnect_is_checked_again_after_its_snapshot() -> None:
    stream = text_message(1, ["a", "b", "c"], "abc")
    # Gone after the first delta; back with since: the replay ends the message.
    audit = fed(stream[:3])
    audit.resubscribed()
    audit.feed(stream[-1])
    assert audit.violations == 0, audit.details
    # Gone again; the replay restores it with message.snapshot ("ab"), whose
    # later deltas must then add up.
    audit = fed(stream[:3])
    audit.resubscribed()
    partial = Message(MSG, SESSION, "turn_a", "assistant", [TextBlock("ab")], "in_progress", 0)
    audit.feed(frame(20, MessageSnapshot(partial), "message.snapshot"))
    audit.feed(frame(21, TextDelta(MSG, 0, "X"), "text.delta"))
    complete = MessageComplete(MSG, "end_turn", [TextBlock("abc")], Usage())
    audit.feed(frame(22, complete, "message.complete"))
    assert audit.violations == 1 and "differs" in audit.details[0]


def test_a_turn_still_in_flight_at_the_end_is_a_violation() -> None:
    audit = fed(text_message(1, ["a"], "a", end=False)[:3])
    audit.finish()
    assert any("never completed" in d for d in audit.details)


def test_a_replay_holding_what_the_client_never_got_is_a_loss() -> None:
    ids = [format_event_id(i) for i in range(10)]
    ok = compare_replay(ids[1:6], ids[1], ids[2:6])
    assert (ok.lost, ok.unexpected, ok.order_differs) == ([], [], False)
    lost = compare_replay([ids[2], ids[4]], ids[1], ids[2:5])
    assert lost.lost == [ids[3]]
    # Received before the replay was asked for, yet not in it.
    missing = compare_replay(ids[1:6], ids[1], ids[2:4], live_before=ids[5])
    assert missing.unexpected == [ids[4], ids[5]]


@pytest.mark.parametrize(
    ("name", "events", "problem"),
    [
        ("cancel_tools_http", ["turn.completed"], "ended with turn.completed"),
        ("cancel_seam_frame", ["tool.failed:cancelled", "turn.cancelled:llm"], "phase llm"),
        ("unknown_tool", ["tool.failed:unknown_tool", "turn.completed"], "next model round"),
        ("invalid_input", ["llm.call_started", "llm.call_started", "turn.completed"], "failures"),
    ],
)
def test_a_turn_ending_otherwise_than_the_contract_says_is_reported(
    name: str, events: list[str], problem: str
) -> None:
    built: list[Event] = []
    for i, spec in enumerate(events):
        type_, _, arg = spec.partition(":")
        payload: Any = None
        if type_ == "tool.failed":
            payload = ToolFailed("tu_1", "sleep", arg, "")  # type: ignore[arg-type]
        elif type_ == "turn.cancelled":
            payload = TurnCancelled("turn_a", "soak", arg, partial=False)  # type: ignore[arg-type]
        elif type_ == "turn.completed":
            payload = TurnCompleted("turn_a", "end_turn", Usage(), 0.0)
        built.append(Event(format_event_id(i + 1), type_, SESSION, "turn_a", 0, "llm", payload))
    problems = judge(scenarios(10, 1.0)[name], built)
    assert any(problem in p for p in problems), problems


def test_the_slope_is_a_least_squares_fit_per_minute() -> None:
    assert slope_per_min([(0.0, 10.0), (30.0, 11.0), (60.0, 12.0)]) == pytest.approx(2.0)
    assert slope_per_min([(0.0, 5.0), (60.0, 5.0)]) is None  # too few points

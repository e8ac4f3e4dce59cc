"""An MCP call's progress, paced (gateway.mcp.progress; docs/protocol.md §5, §11), under
trio's MockClock; the session's side (``tool.progress``, the snapshot) and the doors'."""

from __future__ import annotations

import itertools

import msgspec
import trio
import trio.testing

from gateway.doors.agui.mapping import TOOL_PROGRESS, RunMapper
from gateway.doors.aisdk import chunks as ui
from gateway.doors.aisdk.mapping import ChatMapper
from gateway.ids import format_event_id
from gateway.mcp.progress import PROGRESS_INTERVAL_S, ProgressPacer
from gateway.protocol.events import STREAMING_TYPES, Event, ToolProgress
from gateway.protocol.filters import PRESETS

Sent = list[tuple[float, float, float | None, str | None]]


def pacer() -> tuple[ProgressPacer, Sent]:
    sent: Sent = []

    def report(progress: float, total: float | None, message: str | None) -> None:
        sent.append((trio.current_time(), progress, total, message))

    return ProgressPacer(report), sent


async def test_a_flood_reaches_the_session_at_most_ten_a_second_the_last_kept(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """10,000 notifications over 2 s (the SDK runs each callback in a task of its own)."""
    paced, sent = pacer()
    async with trio.open_nursery() as nursery:
        for i in range(1, 10_001):
            nursery.start_soon(paced, float(i), 10_000.0, f"step {i}")
            if i % 50 == 0:
                await trio.sleep(0.01)
    paced.end()
    times = [t for t, *_ in sent]
    assert len(sent) <= 2 / PROGRESS_INTERVAL_S + 2, len(sent)
    assert all(b - a >= PROGRESS_INTERVAL_S - 1e-9 for a, b in itertools.pairwise(times))
    assert sent[0][0] == 0 and sent[0][1] <= 50  # the first goes out at once
    assert sent[-1][1:] == (10_000.0, 10_000.0, "step 10000")  # the last is never lost
    values = [p for _, p, *_ in sent]
    assert values == sorted(set(values))  # tasks run out of order: never backwards


async def test_the_value_waiting_goes_out_when_the_call_ends_and_nothing_after(
    autojump_clock: trio.testing.MockClock,
) -> None:
    paced, sent = pacer()
    async with trio.open_nursery() as nursery:
        await paced(1.0, None, None)
        nursery.start_soon(paced, 2.0, None, "two")  # within the interval: it waits
        await trio.sleep(0.01)
        nursery.start_soon(paced, 3.0, None, "three")  # replaces it
        await trio.sleep(0.01)
        assert [p for _, p, *_ in sent] == [1.0]
        paced.end()  # the call's result is next: the waiting value goes first
        assert [(p, m) for _, p, _, m in sent] == [(1.0, None), (3.0, "three")]
    await paced(4.0, None, None)  # a late notification of the finished call
    paced.end()
    assert len(sent) == 2


async def test_a_value_below_the_highest_is_an_old_one_run_late(
    autojump_clock: trio.testing.MockClock,
) -> None:
    paced, sent = pacer()
    await paced(5.0, None, "five")
    await trio.sleep(1)
    await paced(4.0, None, "four")
    await paced(5.0, None, "five again")
    assert [(p, m) for _, p, _, m in sent] == [(5.0, "five"), (5.0, "five again")]


async def test_values_json_cannot_carry_are_dropped_and_messages_cut(
    autojump_clock: trio.testing.MockClock,
) -> None:
    paced, sent = pacer()
    await paced(float("nan"), None, None)
    await paced(float("inf"), None, None)
    assert sent == []
    await paced(1.0, float("nan"), "x" * 5000)
    assert sent[0][1:3] == (1.0, None) and len(sent[0][3] or "") == 1000


async def test_a_slow_server_gets_every_value_through() -> None:
    paced, sent = pacer()
    for i in range(3):
        await paced(float(i), 3.0, None)
        await trio.sleep(PROGRESS_INTERVAL_S * 1.5)
    assert [p for _, p, *_ in sent] == [0.0, 1.0, 2.0]


def test_tool_progress_is_streaming_only_and_in_both_presets() -> None:
    assert "tool.progress" in STREAMING_TYPES
    for preset in ("preset:chat", "preset:full"):
        assert "tool.progress" in (PRESETS[preset].event_types or [])


def _event(payload: ToolProgress, turn_id: str = "turn_1") -> Event:
    return Event(format_event_id(7), "tool.progress", "ses_1", turn_id, 1000, "tool", payload)


def test_agui_maps_it_to_a_custom_event() -> None:
    mapper = RunMapper("ses_1", "run_1", "turn_1")
    mapper.start()
    [out] = mapper.receive(_event(ToolProgress("toolu_1", 3.0, 10.0, "step 3")))
    assert isinstance(out, msgspec.Struct)
    data = msgspec.json.decode(msgspec.json.encode(out))
    assert data["type"] == "CUSTOM" and data["name"] == TOOL_PROGRESS
    assert data["value"] == {
        "tool_use_id": "toolu_1", "progress": 3.0, "total": 10.0, "message": "step 3"
    }  # fmt: skip
    assert mapper.receive(_event(ToolProgress("toolu_1", 4.0, None, None), "turn_2")) == []


def test_aisdk_maps_it_to_a_transient_data_part() -> None:
    mapper = ChatMapper("ses_1", "turn_1")
    mapper.start()
    [out] = mapper.receive(_event(ToolProgress("toolu_1", 3.0, None, None)))
    data = msgspec.json.decode(ui.encode(out))
    assert data == {
        "type": "data-tool-progress",
        "id": "toolu_1",
        "data": {"tool_use_id": "toolu_1", "progress": 3.0, "total": None, "message": None},
        "transient": True,
    }


class _Host:
    """What ``progress_of`` uses of a session: its emit."""

    def __init__(self) -> None:
        self.emitted: list[tuple[object, str | None]] = []

    def emit(self, payloads: list[object], turn_id: str | None) -> list[object]:
        self.emitted += [(p, turn_id) for p in payloads]
        return []


async def test_the_session_emits_a_running_tools_progress_keeps_it_and_drops_it_at_its_end() -> (
    None
):
    from typing import Any, cast

    from gateway.protocol.shapes import Message, ToolUseBlock
    from gateway.session.tool_round import progress_of, record_result
    from gateway.session.turn import Turn, TurnState

    host = _Host()
    turn = Turn("turn_1", Message("msg_u", "ses_1", "turn_1", "user", [], "complete", created_at=0))
    state = TurnState()
    block = ToolUseBlock("toolu_1", "mcp__ha__progress", {})
    state.pending_tools = [block]
    report = progress_of(cast(Any, host), turn, state, "toolu_1")
    report(1.0, 4.0, "one")
    report(2.0, 4.0, None)
    assert [p for p, _ in host.emitted] == [
        ToolProgress("toolu_1", 1.0, 4.0, "one"), ToolProgress("toolu_1", 2.0, 4.0, None)
    ]  # fmt: skip
    assert {t for _, t in host.emitted} == {"turn_1"}
    assert turn.progress["toolu_1"].progress == 2.0  # the snapshot's tool_progress

    class _Results:
        def add_message(self, message: object) -> None: ...

        id = "ses_1"

    record_result(cast(Any, _Results()), turn, state, block, "done", is_error=False)
    assert turn.progress == {}  # dropped as the tool ends
    report(3.0, 4.0, None)  # a late one: nothing
    assert len(host.emitted) == 2

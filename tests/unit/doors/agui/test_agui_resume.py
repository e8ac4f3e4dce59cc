"""Re-attaching to an AG-UI run, sans-IO, against the recorded traces (docs/doors/agui.md).

A trace's turn is mapped once whole (:class:`~gateway.doors.agui.resume.RunFeed`,
no cursor), then again for every cursor, as ``GET
/agui/{session_id}/runs/{run_id}/stream`` maps it: ``RUN_STARTED``, the start
events of what was open at the cursor, then exactly what came after it.
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from gateway.doors.agui import shapes as ag
from gateway.doors.agui.mapping import RunMapper
from gateway.doors.agui.resume import RunFeed, Tagged, event_id, parse_cursor
from gateway.protocol.events import EVENT_TYPES
from gateway.protocol.frames import EventFrame
from tests.integration.doors.agui.test_agui_reattach import open_starts, verify
from tests.unit.doors.agui.test_agui_mapping import frames, official

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

TRACES = ["thinking_then_text", "parallel_tools", "cancel_llm", "provider_error",
          "snapshot_mid_approval", "claude_code_tool"]  # fmt: skip


def events_of(name: str) -> list[Any]:
    return [f.event for f in frames(name) if isinstance(f, EventFrame)]


def feed(events: list[Any], cursor: tuple[int, int] | None = None) -> list[Tagged]:
    run = RunFeed(RunMapper("sess_1", "run_1", "turn_1"), 0, cursor, rebuild=cursor is not None)
    opening = run.opening([ag.RunStarted(thread_id="sess_1", run_id="run_1", timestamp=1)])
    return opening + run.replayed(events, 2)


def plain(tagged: list[Tagged]) -> list[dict[str, Any]]:
    return [msgspec.to_builtins(e) for _, e in tagged]


def test_ids_name_one_event_each_and_read_back() -> None:
    assert event_id((42, 0)) == "evt_00000000000000000042"
    assert event_id((42, 3)) == "evt_00000000000000000042:3"
    assert parse_cursor("evt_00000000000000000042:3") == (42, 3)
    assert parse_cursor(" evt_00000000000000000042 ") == (42, 0)
    for bad in ("", "42", "evt_1", "evt_00000000000000000042:", "evt_00000000000000000042:x"):
        assert parse_cursor(bad) is None, bad


@pytest.mark.parametrize("name", TRACES)
def test_a_run_resumes_at_every_event_boundary(name: str) -> None:
    events = events_of(name)
    full = feed(events)
    positions = [pos for pos, _ in full]
    assert positions == sorted(set(positions))
    whole = plain(full)
    verify(whole)
    for e in full:
        official(e[1])
    for k in range(1, len(full) + 1):
        cursor = full[k - 1][0]
        got = feed(events, cursor)
        assert got[0][0] == cursor and isinstance(got[0][1], ag.RunStarted)
        reopened = open_starts(whole[:k])
        rest = got[1:]
        assert plain(rest[: len(reopened)]) == reopened
        assert rest[len(reopened) :] == (full[k:] or full[-1:]), (name, k)
        verify(plain(got))


def test_a_message_held_only_whole_is_rebuilt_block_by_block() -> None:
    """After a restart the replay holds ``message.complete``, not the deltas."""
    events = events_of("thinking_then_text")
    live = plain(feed(events))
    streaming = {t for t, spec in EVENT_TYPES.items() if not spec.catalog}
    kept = [e for e in events if e.type not in streaming or e.type == "message.complete"]
    assert len(kept) < len(events)
    cursor = (0, 0)  # the client saw RUN_STARTED only
    got = plain(feed(kept, cursor))
    verify(got)

    def text(events: list[dict[str, Any]], kind: str) -> str:
        return "".join(e["delta"] for e in events if e["type"] == kind)

    for kind in ("TEXT_MESSAGE_CONTENT", "REASONING_MESSAGE_CONTENT"):
        assert text(got, kind) == text(live, kind) != ""
    assert [e["type"] for e in got][-1] == "RUN_FINISHED"

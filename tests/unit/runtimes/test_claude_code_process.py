"""When a session's Claude Code CLI owes nothing more (:class:`CliProcess`'s ``took`` and
``settle_previous``) and when a turn ends (``ClaudeCode._follow``), docs/protocol.md §11:
no process, an inbox of the SDK's messages.

Needs the claude-code extra (it builds the SDK's message types).
"""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import pytest
import trio

pytest.importorskip("claude_agent_sdk", reason="needs the claude-code extra")

from claude_agent_sdk import ResultMessage, SystemMessage, TaskStartedMessage

from gateway.protocol.shapes import Usage
from gateway.runtimes.claude_code import runtime as cc
from gateway.runtimes.claude_code.compaction import Compaction
from gateway.runtimes.claude_code.process import DRAIN_TIMEOUT_S, CliProcess


def result(total: float = 0.0, stop: str = "end_turn") -> ResultMessage:
    return ResultMessage(
        "success", 1, 1, False, 1, "cc-session", stop_reason=stop, total_cost_usd=total
    )


def state(name: str) -> SystemMessage:
    return SystemMessage("session_state_changed", {"state": name})


INIT = SystemMessage("init", {})


def cli(
    *queued: Any, reports_state: bool = True, closed: bool = False
) -> tuple[CliProcess, list[Any]]:
    """A process whose inbox holds ``queued`` (then ends, if ``closed``), its query sent;
    and what it stopped."""
    session = SimpleNamespace(
        id="sess_1", record=SimpleNamespace(cost_so_far_usd=0.0), save_record=lambda: None
    )
    process = CliProcess(SimpleNamespace(session=session, node=None), None, None, None)  # type: ignore[arg-type]
    send, process.inbox = trio.open_memory_channel[Any](math.inf)
    for message in queued:
        send.send_nowait(message)
    if closed:
        send.close()
    process.reports_state, process.owed = reports_state, 1
    process.settled, process.answering = False, True
    stopped: list[Any] = []
    process.stop = lambda: stopped.append("stop")  # type: ignore[method-assign]
    return process, stopped


def left(process: CliProcess) -> list[Any]:
    assert process.inbox is not None
    out = []
    while True:
        try:
            out.append(process.inbox.receive_nowait())
        except trio.WouldBlock:
            return out


async def test_a_result_settles_nothing_while_claude_code_runs_a_query_of_its_own() -> None:
    """A background task's notification: a result, then Claude Code's own query."""
    process, _ = cli()
    for message in (state("running"), result(), INIT, result()):
        process.took(message)
        assert not process.done
    process.took(state("idle"))
    assert process.done and process.owed == 0


async def test_an_idle_just_before_a_result_waits_for_that_result() -> None:
    process, _ = cli()
    for message in (state("running"), result(), INIT, state("idle")):
        process.took(message)
        assert not process.done
    process.took(result())
    assert process.done


async def test_without_state_frames_the_last_querys_result_settles_it() -> None:
    process, _ = cli(reports_state=False)
    process.owed = 2  # an interrupted query's and this one's
    process.took(result())
    assert not process.done
    process.took(result())
    assert process.done


async def test_the_next_turn_drops_what_claude_code_says_until_it_is_idle() -> None:
    """The interrupted query's result, the notification's query, and its end: all dropped,
    and a query Claude Code started on its own between turns with them."""
    process, stopped = cli(
        result(0.5), INIT, result(0.75), state("idle"), state("running"), INIT, result(1.0),
        state("idle"),
    )  # fmt: skip
    await process.settle_previous()
    assert process.done and left(process) == [] and stopped == []
    assert process.cost_seen == 1.0  # the dropped queries' cost is not the next turn's
    # The interrupted turn's calls were priced with it; the CLI's own query is the session's.
    assert process.session.record.cost_so_far_usd == pytest.approx(0.25)


async def test_a_settled_cli_keeps_what_comes_after_the_next_query() -> None:
    process, stopped = cli()
    process.settled, process.answering = True, False
    await process.settle_previous()
    assert process.done and stopped == []


async def test_a_cli_that_never_goes_idle_is_stopped_after_the_drain_timeout(
    autojump_clock: trio.testing.MockClock,
) -> None:
    process, stopped = cli(result(), INIT)
    started = trio.current_time()
    await process.settle_previous()
    assert trio.current_time() - started == pytest.approx(DRAIN_TIMEOUT_S)
    assert stopped == ["stop"] and process.done and process.owed == 0


def runtime(process: CliProcess) -> tuple[cc.ClaudeCode, Any]:
    """A runtime that follows ``process``'s inbox (no session, no translator), a turn's state."""
    rt = object.__new__(cc.ClaudeCode)
    rt.feed, rt.process, rt._early_results, rt._turn_cost = None, process, {}, 0.0
    rt.compaction = Compaction(rt)  # type: ignore[arg-type]
    rt.subagents = SimpleNamespace(waiting=False)  # type: ignore[assignment]
    turn_state = SimpleNamespace(usage=SimpleNamespace(cost_usd=0.0), pending_tools=[], call=None)
    return rt, turn_state


async def test_a_turn_ends_with_the_last_result_of_its_queries_whatever_the_idle_order() -> None:
    """The task notification's query: its result, not the first, is the turn's end and
    cost, whether Claude Code says idle just before or just after it."""
    for idle_first in (True, False):
        last = [state("idle"), result(0.75, "max_tokens")]
        process, _ = cli(
            state("running"), result(0.5), INIT, *(last if idle_first else last[::-1]), INIT
        )
        rt, turn_state = runtime(process)
        assert await rt._follow(SimpleNamespace(id="turn_1"), turn_state) == "max_tokens"  # type: ignore[arg-type]
        assert turn_state.usage.cost_usd == 0.75
        assert left(process) == [INIT]  # what comes after the idle is not the turn's


async def test_a_cli_gone_after_the_turns_result_but_before_its_idle_ends_it_as_it_was() -> None:
    process, _ = cli(state("running"), result(0.5), closed=True)
    rt, turn_state = runtime(process)
    assert await rt._follow(SimpleNamespace(id="turn_1"), turn_state) == "end_turn"  # type: ignore[arg-type]


def open_call() -> Any:
    """A call of the turn whose stream started and has not ended (no ``message_stop``)."""
    translator = SimpleNamespace(stop_reason=None)
    return SimpleNamespace(done=trio.Event(), translator=translator, error_class=None)


def failing(rt: cc.ClaudeCode) -> list[tuple[str, str]]:
    """What ``rt`` fails the turn's call with (as ``_failed``: the open call settled and
    ``llm.call_failed``, the turn's stop reason ``error``)."""
    failed: list[tuple[str, str]] = []

    def fail(turn: Any, state: Any, error_class: str, message: str) -> str:
        failed.append((error_class, message))
        state.call.done.set()
        return "error"

    rt._failed = fail  # type: ignore[method-assign,assignment]
    return failed


async def test_a_cli_gone_during_the_turns_next_answer_fails_that_call_not_the_turn_as_it_was() -> (
    None
):
    """The task notification's query had streamed its call's start when the CLI went: that
    call is open, so the turn cannot end at the first result as if it were whole (every
    call ends before its turn does, docs/protocol.md §7): the CLI died mid-turn (§11)."""
    process, _ = cli(state("running"), result(0.5), INIT, closed=True)
    rt, turn_state = runtime(process)
    turn_state.call = open_call()
    with pytest.raises(cc._ProcessGone):
        await rt._follow(SimpleNamespace(id="turn_1"), turn_state)  # type: ignore[arg-type]


async def test_a_turn_never_ends_with_one_of_its_calls_open() -> None:
    """A result and ``idle`` while the main thread's call still streams (Claude Code ended
    its answer without a ``message_stop``): that call fails before the turn ends."""
    process, _ = cli(state("running"), INIT, result(0.5), state("idle"))
    rt, turn_state = runtime(process)
    turn_state.call = open_call()
    failed = failing(rt)
    assert await rt._follow(SimpleNamespace(id="turn_1"), turn_state) == "error"  # type: ignore[arg-type]
    assert [c for c, _ in failed] == ["network"] and turn_state.call.done.is_set()


def ended_call(error_class: str | None, stop_reason: str | None) -> Any:
    """A call whose ``message_stop`` came, its translation as given."""
    message = None if stop_reason is None else SimpleNamespace(id="msg_1", content=[], usage=None)
    translator = SimpleNamespace(usage=Usage(), message=message, stop_reason=stop_reason)
    return SimpleNamespace(
        done=trio.Event(), translator=translator, error_class=error_class, error_message="broke"
    )


def ending_runtime() -> tuple[cc.ClaudeCode, Any, list[Any], list[Any]]:
    """A runtime whose session records what it emits, whose loop records the failed calls."""
    rt, turn_state = runtime(cli()[0])
    emitted: list[Any] = []
    failed: list[Any] = []
    rt.session = SimpleNamespace(  # type: ignore[assignment]
        calls=SimpleNamespace(settle=lambda end: turn_state.call.done.set()),
        emit=lambda payloads, turn_id: emitted.extend(payloads),
        id="sess_1",
        record=SimpleNamespace(active_model="claude-code/m"),
    )
    rt.loop = SimpleNamespace(call_failed=lambda turn, state, call: failed.append(call))  # type: ignore[assignment]
    rt.approvals = SimpleNamespace(end=lambda turn: None)  # type: ignore[assignment]
    rt.node = SimpleNamespace(  # type: ignore[assignment]
        metrics=SimpleNamespace(
            provider_errors=SimpleNamespace(labels=lambda c: SimpleNamespace(inc=lambda: None))
        )
    )
    turn_state.usage, turn_state.call_failed_emitted = Usage(), False
    return rt, turn_state, emitted, failed


@pytest.mark.parametrize(("error_class", "stop_reason"), [("api_error", None), (None, None)])
async def test_a_call_that_ends_broken_fails_at_its_end_and_only_once(
    error_class: str | None, stop_reason: str | None
) -> None:
    """A ``message_stop`` whose call the gateway could not translate (or that gave no stop
    reason) is that call's ``llm.call_failed`` at once, never an ``llm.call_started`` left
    open (docs/protocol.md §7); the result's error then adds no call of its own."""
    rt, turn_state, emitted, failed = ending_runtime()
    turn = SimpleNamespace(id="turn_1")
    call = turn_state.call = ended_call(error_class, stop_reason)
    rt._end_call(turn, turn_state, call)  # type: ignore[arg-type]
    assert failed == [call] and emitted == [] and call.done.is_set()
    assert rt._failed(turn, turn_state, "api_error", "Claude Code: boom") == "error"  # type: ignore[arg-type]
    assert failed == [call] and emitted == []  # no second call, no second failure
    # A result that says all went well: the turn's last call failed, so did the turn.
    assert rt._result(turn, turn_state, result()) == "error"  # type: ignore[arg-type]
    assert failed == [call] and emitted == []


async def test_a_call_broken_as_it_streamed_fails_once_at_the_turns_result() -> None:
    """A call whose translation failed mid-stream (done, its ``message_stop`` never fed):
    the result that says all went well ends the turn with that call's failure."""
    rt, turn_state, emitted, failed = ending_runtime()
    call = turn_state.call = ended_call("api_error", None)
    call.done.set()
    assert rt._result(SimpleNamespace(id="turn_1"), turn_state, result()) == "error"  # type: ignore[arg-type]
    assert failed == [call] and emitted == [] and turn_state.call_failed_emitted


def test_a_background_shell_is_no_sub_agent() -> None:
    def started(task_type: str | None, tool_use_id: str | None = "toolu_1") -> TaskStartedMessage:
        return TaskStartedMessage(
            "task_started", {}, "t1", "a task", "u", "cc", tool_use_id, task_type
        )

    assert cc._sub_agent(started("local_agent")) and cc._sub_agent(started(None))
    assert not cc._sub_agent(started("local_bash"))
    assert not cc._sub_agent(started("local_agent", None))

"""When a session's Claude Code CLI owes nothing more (:class:`CliProcess`'s ``took`` and
``settle_previous``, docs/protocol.md §11): no process, an inbox of the SDK's messages.

Needs the claude-code extra (it builds the SDK's message types).
"""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import pytest
import trio

pytest.importorskip("claude_agent_sdk", reason="needs the claude-code extra")

from claude_agent_sdk import ResultMessage, SystemMessage

from gateway.runtimes.claude_code.process import DRAIN_TIMEOUT_S, CliProcess


def result(total: float = 0.0) -> ResultMessage:
    return ResultMessage("success", 1, 1, False, 1, "cc-session", total_cost_usd=total)


def state(name: str) -> SystemMessage:
    return SystemMessage("session_state_changed", {"state": name})


INIT = SystemMessage("init", {})


def cli(*queued: Any, reports_state: bool = True) -> tuple[CliProcess, list[Any]]:
    """A process whose inbox holds ``queued``, its query sent; and what it stopped."""
    host = SimpleNamespace(s=SimpleNamespace(id="sess_1"), node=None)
    process = CliProcess(host, None, None, None)  # type: ignore[arg-type]
    send, process.inbox = trio.open_memory_channel[Any](math.inf)
    for message in queued:
        send.send_nowait(message)
    process.reports_state, process.owed, process.settled = reports_state, 1, False
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
        assert not process.settled
    process.took(state("idle"))
    assert process.settled and process.owed == 0


async def test_without_state_frames_the_last_querys_result_settles_it() -> None:
    process, _ = cli(reports_state=False)
    process.owed = 2  # an interrupted query's and this one's
    process.took(result())
    assert not process.settled
    process.took(result())
    assert process.settled


async def test_the_next_turn_drops_what_claude_code_says_until_it_is_idle() -> None:
    """The interrupted query's result, the notification's query, and its end: all dropped,
    and a query Claude Code started on its own between turns with them."""
    process, stopped = cli(
        result(0.5), INIT, result(0.75), state("idle"), state("running"), INIT, result(1.0),
        state("idle"),
    )  # fmt: skip
    await process.settle_previous()
    assert process.settled and left(process) == [] and stopped == []
    assert process.cost_seen == 1.0  # the dropped queries' cost is not the next turn's


async def test_a_settled_cli_keeps_what_comes_after_the_next_query() -> None:
    process, stopped = cli()
    process.settled = True
    await process.settle_previous()
    assert process.settled and stopped == []


async def test_a_cli_that_never_goes_idle_is_stopped_after_the_drain_timeout(
    autojump_clock: trio.testing.MockClock,
) -> None:
    process, stopped = cli(result(), INIT)
    started = trio.current_time()
    await process.settle_previous()
    assert trio.current_time() - started == pytest.approx(DRAIN_TIMEOUT_S)
    assert stopped == ["stop"] and process.settled and process.owed == 0

"""When a ``claude-code`` turn hands a steer to its CLI (:class:`Steering`), docs/protocol.md
§11, "A busy session": no process, a session record with steers waiting.

Needs the claude-code extra (the module imports the SDK's types).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import trio
import trio.testing

pytest.importorskip("claude_agent_sdk", reason="needs the claude-code extra")

from gateway.protocol.shapes import Message, TextBlock
from gateway.runtimes.claude_code.steering import Steering
from gateway.session.busy import Pulse
from gateway.session.turn import Turn
from gateway.store.base import QueuedTurn


def message(text: str, turn_id: str = "turn_s") -> Message:
    return Message(f"msg_{text}", "sess_1", turn_id, "user", [TextBlock(text)], "complete", 0)


class Fake:
    """A runtime whose turn ``turn_a`` runs, its CLI recording what it is sent."""

    def __init__(self, reports_state: bool = True) -> None:
        self.turn = Turn("turn_a", message("go", "turn_a"))
        self.turn.enter("llm")
        self.sent: list[str] = []
        self.taken: list[str] = []
        self.current: Any = (self.turn, SimpleNamespace())
        self.feed = None
        self.session = SimpleNamespace(
            record=SimpleNamespace(queued_turns=[]), steered=Pulse(), take_steers=self.take
        )
        self.node = SimpleNamespace(wait_durable=trio.lowlevel.checkpoint)
        self.approvals = SimpleNamespace(announced={})

        async def query(prompt: str, message_id: str | None = None) -> None:
            self.sent.append(prompt)

        self.process = SimpleNamespace(client=object(), reports_state=reports_state, query=query)

    def steer(self, text: str) -> None:
        """As :func:`gateway.session.busy.submit` keeps a steer: in the record, the pulse fired."""
        q = QueuedTurn(f"turn_{text}", message(text), steering=self.turn.id)
        self.session.record.queued_turns.append(q)
        self.session.steered.fire()

    def take(self, turn: Turn) -> list[Message]:
        record = self.session.record
        taken = [q.user_message for q in record.queued_turns if q.steering == turn.id]
        record.queued_turns = [q for q in record.queued_turns if q.steering != turn.id]
        self.taken += [m.id for m in taken]
        return taken


async def test_a_permission_wait_hands_each_steer_over_as_it_comes_until_decided() -> None:
    rt = Fake()
    steering = Steering(rt)  # type: ignore[arg-type]
    decided = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(steering.wait, decided, 60.0)
        await trio.testing.wait_all_tasks_blocked()
        rt.steer("one")
        await trio.testing.wait_all_tasks_blocked()
        assert rt.sent == ["one"]  # at once: the CLI waits for the decision
        rt.steer("two")
        rt.steer("three")
        await trio.testing.wait_all_tasks_blocked()
        assert rt.sent == ["one", "two", "three"]  # in order
        decided.set()
    assert rt.session.record.queued_turns == []


async def test_a_steer_that_comes_as_the_wait_looks_is_not_missed() -> None:
    """Kept between the record's look and the wait: the pulse's event was taken first."""
    rt = Fake()
    steering = Steering(rt)  # type: ignore[arg-type]
    hand_over = steering.hand_over

    async def late(*args: Any) -> None:
        await hand_over(*args)
        if not rt.sent:
            rt.steer("late")  # after the look, before the wait

    steering.hand_over = late  # type: ignore[method-assign]
    decided = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(steering.wait, decided, 60.0)
        await trio.testing.wait_all_tasks_blocked()
        assert rt.sent == ["late"]
        decided.set()


async def test_the_wait_ends_at_its_bound(autojump_clock: trio.testing.MockClock) -> None:
    rt = Fake()
    started = trio.current_time()
    await Steering(rt).wait(trio.Event(), 5.0)  # type: ignore[arg-type]
    assert trio.current_time() - started == pytest.approx(5.0)


@pytest.mark.parametrize(
    "why", ["cancelling", "no_state", "sub_agent", "worker", "no_turn", "another_turn"]
)
async def test_no_steer_is_handed_over_where_the_turn_could_not_take_it(why: str) -> None:
    rt = Fake(reports_state=why != "no_state")
    rt.steer("kept")
    agent_id = "agent_1" if why == "sub_agent" else None
    if why == "cancelling":
        rt.turn.request_cancel("user")
    elif why == "worker":
        rt.feed = object()  # type: ignore[assignment]
    elif why == "no_turn":
        rt.current = None
    elif why == "another_turn":
        rt.session.record.queued_turns[0].steering = "turn_b"
    await Steering(rt).hand_over(agent_id)  # type: ignore[arg-type]
    assert rt.sent == [] and rt.taken == []
    assert len(rt.session.record.queued_turns) == 1  # a queued turn once the turn ends


async def test_a_tool_hook_hands_over_once_the_tools_call_is_out() -> None:
    """``turn.steered`` follows the tool's ``tool.called``: the hook waits for it."""
    rt = Fake()
    rt.steer("s")
    announced = rt.approvals.announced["toolu_1"] = trio.Event()
    steering = Steering(rt)  # type: ignore[arg-type]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(steering.after_tool, {"tool_use_id": "toolu_1"}, "toolu_1", {})
        await trio.testing.wait_all_tasks_blocked()
        assert rt.sent == []
        announced.set()
    assert rt.sent == ["s"]
    rt.steer("t")
    assert await steering.before_tool({"agent_id": "agent_1"}, "toolu_2") is None
    assert rt.sent == ["s"]  # a sub-agent's tool: not the main thread's step

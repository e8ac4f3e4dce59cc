"""kill -9 of a session's owner mid-turn (issue 13, "Tests", second bullet).

RUNNING.md "Command line": when the node running a turn dies, another node
closes that turn (PROTOCOL section 9) and takes the session's next turn. Three
real ``gateway serve`` processes on one redis-server (tests/cluster_support.py,
``lease_s`` = 1 s); the session is created on the first node, which owns it,
with a client on each node. The owner is killed (SIGKILL) in one of three
phases of a turn:

- ``llm``: while the model streams its message;
- ``tools``: while a (slow) tool runs;
- ``seam``: while a tool waits for approval ([tools] require_approval).

Then, for each phase:

- a turn sent to a survivor at once, before the dead owner's lease lapsed,
  is 503 ``session_owner_unreachable`` with ``Retry-After`` (it must not
  run beside the interrupted turn);
- the survivors' clients see the turn closed live with section 8's sequence
  for that phase and ``reason: "server_restart"``, and end in the view a
  fresh snapshot on a survivor gives;
- the dead owner's client, reconnecting to a survivor with ``since`` = the
  last event it got, gets the same closing events (its replay, then live);
- no catalog event a client held is lost: each is in a ``since`` replay of
  the whole session from a survivor (the store), closing events after it;
- the next turn runs on a survivor (202, and its events arrive), with ids
  above every id issued before the kill (PROTOCOL section 1).

Each kill starts a new node at once, for the next test (the module's cluster
stays at three live nodes): it boots while the survivors wait for the dead
owner's lease to lapse.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from gateway.protocol.events import Event
from tests.cluster_support import (
    LEASE_S,
    Cluster,
    Node,
    assert_increasing,
    catalog,
    of_turn,
    peers,
    running_cluster,
    wire,
)
from tests.conftest import types
from tests.redis_support import ensure_redis_server

PHASES: dict[str, tuple[dict[str, Any], str, list[str]]] = {
    # phase: (the turn's script, the event after which the owner dies, the closing sequence)
    "llm": (
        {"script": {"delay_ms": 10, "rounds": [[{"thinking": "Let me see."}, {"lorem": 400}]]}},
        "text.delta",
        ["message.complete", "llm.call_failed", "turn.cancelled"],
    ),
    "tools": (
        {"script": {"rounds": [[{"tool_use": {"name": "sleep", "input": {"seconds": 60}}}]]}},
        "tool.called",
        ["tool.failed", "turn.cancelled"],
    ),
    "seam": (
        {"script": {"rounds": [[{"tool_use": {"name": "read_file", "input": {"path": "x"}}}]]}},
        "permission.requested",
        ["tool.failed", "turn.cancelled"],
    ),
}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with running_cluster(ensure_redis_server(), tmp_path_factory.mktemp("failover"), 3) as c:
        yield c


@pytest.fixture
def nodes(cluster: Cluster) -> list[Node]:
    """Three live nodes (one started if the previous test killed one)."""
    return cluster.ensure(3)


def comparable(state: dict[str, Any]) -> dict[str, Any]:
    """What a client's view and a snapshot's must agree on (tests/test_restart.py)."""
    results = {k: {**v, "error_class": None} for k, v in state["tool_results"].items()}
    return {"messages": state["messages"], "streaming": state["streaming"], "tools": results}


def check_closing(events: list[Event], turn_id: str, phase: str, closing: list[str]) -> None:
    """The turn ends with section 8's sequence for ``phase``, ``reason: "server_restart"``."""
    assert types(events)[-len(closing) :] == closing, types(events)
    end = events[-1].payload
    assert (end.turn_id, end.reason, end.phase) == (turn_id, "server_restart", phase)
    if phase == "llm":
        complete, failed = events[-3].payload, events[-2].payload
        # the message that was streaming (a replay has no message.start: streaming-only)
        for started in (e for e in events if e.type == "message.start"):
            assert complete.message_id == started.payload.message_id
        assert complete.stop_reason == "cancelled" and complete.final_content
        assert failed.error_class == "cancelled"
        assert not any(e.type == "tool.failed" for e in events)
    else:
        called = next(e for e in events if e.type == "tool.called")
        failed = events[-2].payload
        assert failed.tool_use_id == called.payload.tool_use_id
        assert failed.error_class == "cancelled"
        assert not any(e.type == "llm.call_failed" for e in events)


@pytest.mark.parametrize("phase", list(PHASES))
async def test_kill_9_of_the_owner_mid_turn(
    cluster: Cluster, nodes: list[Node], tmp_path: Path, phase: str
) -> None:
    script, point, closing = PHASES[phase]
    (tmp_path / "x").write_text("x")
    owner = nodes[0]
    with trio.fail_after(10 + 4 * LEASE_S):
        async with peers(nodes) as (a, b, c):
            sid = await a.create_session(workspace_path=str(tmp_path))
            async with a.watch(sid) as on_owner, b.watch(sid) as wb, c.watch(sid) as wc:
                turn_id = await a.submit(sid, script)
                for w in (on_owner, wb, wc):
                    await w.until_type(point)
                    if phase == "llm":  # well into the text
                        for _ in range(3):
                            await w.until_type(point)
                owner.kill()
                # at once, its lease not lapsed yet: a turn sent to a survivor waits (503)
                early = await b.post_turn(sid, "too early")
                assert early.status_code == 503, early.text
                assert early.json()["error"]["code"] == "session_owner_unreachable"
                assert "retry-after" in early.headers
                if phase != list(PHASES)[-1]:  # the next test's third node boots meanwhile
                    cluster.boot(1)
                held: dict[str, list[Event]] = {
                    w.node.name: list(w.events) for w in (on_owner, wb, wc)
                }
                killed_at = max(e.id for e in on_owner.events + wb.events + wc.events)

                # the survivors' clients see the turn closed, live
                for w in (wb, wc):
                    turn = await w.turn(turn_id)
                    check_closing(turn, turn_id, phase, closing)
                    assert_increasing(w.events, f"{w.node.name}'s stream")
                assert wire(of_turn(wb.events, turn_id)) == wire(of_turn(wc.events, turn_id))
                await on_owner.until_closed()  # its node died under it

                # the dead owner's client resumes on a survivor
                reducer = on_owner.client.reducer
                last = on_owner.events[-1].id
                async with b.watch(sid, since=last, reducer=reducer) as back:
                    await back.until_turn_ends(turn_id)
                    assert_increasing(on_owner.events + back.events, "before the kill, then after")
                    resumed = on_owner.events + back.events
                    check_closing(of_turn(resumed, turn_id), turn_id, phase, closing)

                # every view is what a fresh snapshot on a survivor shows
                async with c.watch(sid, snapshot=True) as fresh:
                    view = comparable(fresh.client.reducer.state())
                for w in (wb, wc, back):
                    assert comparable(w.client.reducer.state()) == view, w.node.name
                assert view["streaming"] is None

                # no catalog event a client held is lost: all in a replay from a survivor
                replay = await c.replay(sid)
                assert_increasing(replay, "the replay")
                replayed = {e.id for e in replay}
                for name, events in held.items():
                    lost = [(e.type, e.id) for e in catalog(events) if e.id not in replayed]
                    assert not lost, f"{name} held catalog events the store lacks: {lost}"
                check_closing(of_turn(replay, turn_id), turn_id, phase, closing)

                # the next turn runs on a survivor
                next_turn = await c.submit(sid, "hello again")
                done = await wb.turn(next_turn)
                assert done[-1].type == "turn.completed" and done[-1].payload.stop_reason == (
                    "end_turn"
                )
                assert all(e.id > killed_at for e in done)
                assert wb.client.reducer.state()["messages"][-1]["content"] == [
                    {"type": "text", "text": "You said: hello again"}
                ]

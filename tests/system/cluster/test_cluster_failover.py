"""kill -9 of a session's owner mid-turn (docs/scale-out.md).

docs/reference.md "Command line": when the node running a turn dies, another node
closes that turn (docs/protocol.md §9) and takes the session's next turn. Three
real ``gateway serve`` processes on one redis-server (tests/cluster_support.py,
``lease_s`` = 1 s). The first node owns four sessions, each with a client on
every node and a turn stopped in one of these phases:

- ``llm``: while the model streams its message;
- ``tools``: while a (slow) tool runs;
- ``seam``: while a tool waits for approval ([tools] require_approval);
- ``delegate``: while a ``delegate`` tool runs (its worker session streams),
  every client subscribed with ``include_worker_sessions``.

Then that node is killed (SIGKILL), once for them all (:func:`crash`: one
lease time to wait, not four), and each phase is checked by itself:

- a turn sent to a survivor at once, before the dead owner's lease lapsed,
  is 503 ``session_owner_unreachable`` with ``Retry-After`` (it must not
  run beside the interrupted turn);
- the survivors' clients see the turn closed live with section 8's sequence
  for that phase and ``reason: "server_restart"`` (a delegate's worker's
  turn too), and end in the view a fresh snapshot on a survivor gives;
- the dead owner's client, reconnecting to a survivor with ``since`` = the
  last event it got, gets the same closing events (its replay, then live);
- no catalog event a client held is lost: each is in a ``since`` replay of
  the whole session from a survivor (the store), closing events after it;
- the next turn runs on a survivor (202, and its events arrive), with ids
  above every id issued before the kill (docs/protocol.md §1).

And the survivors closed the five turns (a worker's included) once each
(their logs say so) and logged no error, the worker's turn before its
parent's (section 8's order for a delegate), both by the same survivor.
"""

from __future__ import annotations

import json
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
import trio

from gateway.protocol.events import Event
from tests.cluster_support import (
    ENDS,
    LEASE_S,
    Node,
    Watch,
    assert_increasing,
    catalog,
    leaf,
    of_turn,
    peers,
    running_cluster,
    wire,
)
from tests.conftest import types
from tests.redis_support import ensure_redis_server

# slow: redis-server and gateway serve processes, killed
pytestmark = pytest.mark.slow

WORKERS = {"event_types": None, "actors": None, "include_worker_sessions": True}
SLOW_WORKER = json.dumps({"script": {"delay_ms": 10, "rounds": [[{"lorem": 400}]]}})


@dataclass(frozen=True)
class Phase:
    """A turn stopped in one phase of section 8 when its node dies."""

    script: dict[str, Any]
    point: str  # every client has had this event (``times`` of them) when the owner dies
    times: int
    phase: str  # turn.cancelled's
    closing: list[str]  # the session's own last events


PHASES = {
    "llm": Phase(
        {"script": {"delay_ms": 10, "rounds": [[{"thinking": "Let me see."}, {"lorem": 400}]]}},
        "text.delta",
        4,  # well into the text
        "llm",
        ["message.complete", "llm.call_failed", "turn.cancelled"],
    ),
    "tools": Phase(
        {"script": {"rounds": [[{"tool_use": {"name": "sleep", "input": {"seconds": 60}}}]]}},
        "tool.called",
        1,
        "tools",
        ["tool.failed", "turn.cancelled"],
    ),
    "seam": Phase(
        {"script": {"rounds": [[{"tool_use": {"name": "read_file", "input": {"path": "x"}}}]]}},
        "permission.requested",
        1,
        "seam",
        ["tool.failed", "turn.cancelled"],
    ),
    # a delegate running: its worker (another session, on the same node) streams
    "delegate": Phase(
        {
            "script": {
                "rounds": [[{"tool_use": {"name": "delegate", "input": {"task": SLOW_WORKER}}}]]
            }
        },
        "text.delta",  # the worker's
        4,
        "tools",
        ["delegate.failed", "tool.failed", "turn.cancelled"],
    ),
}
TURNS_CLOSED = len(PHASES) + 1  # the delegate's worker's turn too


def comparable(state: dict[str, Any]) -> dict[str, Any]:
    """What a client's view and a snapshot's must agree on
    (tests/integration/store/test_restart.py)."""
    results = {k: {**v, "error_class": None} for k, v in state["tool_results"].items()}
    return {"messages": state["messages"], "streaming": state["streaming"], "tools": results}


def own(events: list[Event], session_id: str) -> list[Event]:
    """The events of one session, out of a stream that carries its workers' too."""
    return [e for e in events if e.session_id == session_id]


def check_closing(events: list[Event], sid: str, turn_id: str, name: str) -> None:
    """The turn ends with section 8's sequence for its phase, ``reason: "server_restart"``.

    ``events``: a stream of the session (its workers' events included); with a
    delegate running, the worker's turn is closed too (as in the ``llm`` phase).
    """
    phase = PHASES[name]
    mine = of_turn(own(events, sid), turn_id)
    assert types(mine)[-len(phase.closing) :] == phase.closing, types(mine)
    end = mine[-1].payload
    assert (end.turn_id, end.reason, end.phase) == (turn_id, "server_restart", phase.phase)
    if phase.phase == "llm":
        check_llm_closing(mine)
        assert not any(e.type == "tool.failed" for e in mine)
        return
    called = next(e for e in mine if e.type == "tool.called")
    failed = mine[-2].payload
    assert failed.tool_use_id == called.payload.tool_use_id
    assert failed.error_class == "cancelled"
    assert not any(e.type == "llm.call_failed" for e in mine)
    if name == "delegate":
        started = next(e for e in mine if e.type == "delegate.started").payload
        gave_up = mine[-3].payload
        assert (gave_up.tool_use_id, gave_up.worker_session_id, gave_up.failure_mode) == (
            called.payload.tool_use_id,
            started.worker_session_id,
            "cancelled_by_user",
        )
        worker = own(events, started.worker_session_id)
        assert types(worker)[-3:] == ["message.complete", "llm.call_failed", "turn.cancelled"]
        check_llm_closing(worker)
        assert (worker[-1].payload.reason, worker[-1].payload.phase) == ("server_restart", "llm")


def check_llm_closing(events: list[Event]) -> None:
    """``message.complete`` (cancelled, the partial content), ``llm.call_failed`` (cancelled)."""
    complete, failed = events[-3].payload, events[-2].payload
    # the message that was streaming (a replay has no message.start: streaming-only)
    for started in (e for e in events if e.type == "message.start"):
        assert complete.message_id == started.payload.message_id
    assert complete.stop_reason == "cancelled" and complete.final_content
    assert failed.error_class == "cancelled"


@dataclass
class Crashed:
    """What one phase's session went through (recorded by :func:`crash`)."""

    sid: str
    turn_id: str
    watches: dict[str, Watch]  # "owner" (on the node killed), "b", "c" (on survivors)
    held: dict[str, list[Event]] = field(default_factory=dict)  # each client's, at the kill
    early: httpx.Response | None = None  # a turn sent to a survivor right after the kill
    back: Watch | None = None  # the owner's client, reconnected to a survivor with since
    closed_after: float = 0.0  # seconds from the kill to the closing on both survivors
    views: dict[str, dict[str, Any]] = field(default_factory=dict)  # then, each client's
    fresh: Watch | None = None  # a snapshot attach on a survivor, once the turn was closed
    replay: list[Event] = field(default_factory=list)  # since the start, from a survivor
    next_turn: httpx.Response | None = None  # the next turn, sent to a survivor


async def crash(nodes: list[Node], workspace: str) -> tuple[dict[str, Crashed], str]:
    """Stop a turn of each phase on the first node, kill it, and record what follows.

    Returns each phase's record, and the highest id any client got before the kill.
    """
    owner = nodes[0]
    with trio.fail_after(10 + 4 * LEASE_S):
        async with peers(nodes) as (a, b, c), AsyncExitStack() as stack:
            crashed: dict[str, Crashed] = {}
            for name, phase in PHASES.items():
                sid = await a.create_session(workspace_path=workspace)
                watches = {}
                for client, peer in (("owner", a), ("b", b), ("c", c)):
                    watches[client] = await stack.enter_async_context(
                        peer.watch(sid, filter=WORKERS)
                    )
                crashed[name] = Crashed(sid, await a.submit(sid, phase.script), watches)
            for name, record in crashed.items():
                phase = PHASES[name]
                for w in record.watches.values():
                    for _ in range(phase.times):
                        await w.until_type(phase.point)

            owner.kill()
            killed = trio.current_time()
            for record in crashed.values():
                record.early = await b.post_turn(record.sid, "too early")
            for record in crashed.values():
                record.held = {name: list(w.events) for name, w in record.watches.items()}
            killed_at = max(
                e.id for r in crashed.values() for w in r.watches.values() for e in w.events
            )

            for record in crashed.values():
                workers = workers_of(record.watches["b"].events, record.turn_id)
                for name in ("b", "c"):
                    await closed(record.watches[name], record.turn_id, workers)
                record.closed_after = trio.current_time() - killed
            for record in crashed.values():
                sid, watches = record.sid, record.watches
                gone = watches["owner"]
                await gone.until_closed()  # its node died under it
                since, reducer = gone.events[-1].id, gone.client.reducer
                async with b.watch(sid, since=since, reducer=reducer, filter=WORKERS) as back:
                    record.back = back
                    await closed(back, record.turn_id, workers_of(gone.events, record.turn_id))
                async with c.watch(sid, snapshot=True, filter=WORKERS) as record.fresh:
                    pass
                clients = {"b": watches["b"], "c": watches["c"], "resumed": record.back}
                record.views = {k: comparable(w.client.reducer.state()) for k, w in clients.items()}
                record.replay = await c.replay(sid, filter=WORKERS)
                record.next_turn = await c.post_turn(sid, "hello again")
                if record.next_turn.status_code == 202:
                    await watches["b"].until_turn_ends(record.next_turn.json()["turn_id"])
            return crashed, killed_at


@dataclass
class Run:
    """The module's one crash: each phase's record, and the nodes."""

    records: dict[str, Crashed]
    killed_at: str  # the highest id any client got before the kill
    survivors: list[Node]


async def closed(watch: Watch, turn_id: str, workers: list[str]) -> None:
    """Once the client has the turn's end, and that of each worker (its delegates').

    Raises:
        AssertionError: not within a few lease times, saying what the client got.
    """
    with trio.move_on_after(4 * LEASE_S):
        await watch.seen(lambda e: e.type in ENDS and e.turn_id == turn_id)
        for worker in workers:

            def ended(e: Event, worker: str = worker) -> bool:
                return e.type in ENDS and e.session_id == worker

            await watch.seen(ended)
        return
    got = [(e.id, e.type, e.session_id) for e in watch.events[-12:]]
    raise AssertionError(f"{watch.node.name}: no end of {turn_id} or its workers; last: {got}")


def workers_of(events: list[Event], turn_id: str) -> list[str]:
    """The worker sessions the turn's delegates started."""
    return [
        e.payload.worker_session_id
        for e in events
        if e.type == "delegate.started" and e.turn_id == turn_id
    ]


@pytest.fixture(scope="module")
def crashed(tmp_path_factory: pytest.TempPathFactory) -> Run:
    """:func:`crash` on a cluster of three, stopped (exit 0 checked) before the checks."""
    workdir = tmp_path_factory.mktemp("failover")
    workspace = workdir / "workspace"
    workspace.mkdir()
    (workspace / "x").write_text("x")
    with running_cluster(ensure_redis_server(), workdir, 3) as cluster:
        nodes = cluster.live
        try:
            records, killed_at = trio.run(crash, nodes, str(workspace))
        except BaseExceptionGroup as group:  # one per open stream: say what went wrong
            raise leaf(group) from None
    return Run(records, killed_at, nodes[1:])


def test_the_survivors_closed_the_dead_nodes_turns_and_logged_no_error(crashed: Run) -> None:
    """Each interrupted turn closed once (``turns_recovered``), and nothing went wrong meanwhile.

    (Up to the module's SIGTERM: coredis may log a connection cancelled by the
    shutdown as an error; the exit status is checked by the harness.)
    """
    recovered = 0
    for node in crashed.survivors:
        for line in node.log_events():
            if line["event"] == "shutdown_started":
                break
            assert line["level"] not in ("error", "critical"), (node.name, line)
            if line["event"] == "turns_recovered":
                recovered += line["turns"]
    assert recovered == TURNS_CLOSED


@pytest.mark.parametrize("phase", list(PHASES))
def test_kill_9_of_the_owner_mid_turn(crashed: Run, phase: str) -> None:
    records, killed_at = crashed.records, crashed.killed_at
    record = records[phase]
    sid, turn_id, watches = record.sid, record.turn_id, record.watches

    # at once, its lease not lapsed yet: a turn sent to a survivor waits (503)
    early = record.early
    assert early is not None and early.status_code == 503, early and early.text
    assert early.json()["error"]["code"] == "session_owner_unreachable"
    assert "retry-after" in early.headers

    # the survivors' clients saw the turn closed, live, the same on both
    for name in ("b", "c"):
        check_closing(watches[name].events, sid, turn_id, phase)
        assert_increasing(watches[name].events, f"{name}'s stream")
    assert wire(of_turn(watches["b"].events, turn_id)) == wire(
        of_turn(watches["c"].events, turn_id)
    )

    # within the failover time (docs/scale-out.md: 1.5 x lease_s; 1 s more for a busy machine)
    assert record.closed_after < 1.5 * LEASE_S + 1.0, record.closed_after

    # the dead owner's client, resumed on a survivor: the same closing events
    gone, back = watches["owner"], record.back
    assert gone.closed is not None and back is not None
    resumed = gone.events + back.events
    assert_increasing(resumed, "before the kill, then after the resume")
    check_closing(resumed, sid, turn_id, phase)

    # every view is what a fresh snapshot on a survivor shows
    assert record.fresh is not None
    view = comparable(record.fresh.client.reducer.state())
    for name, seen in record.views.items():
        assert seen == view, name
    assert view["streaming"] is None and view["messages"], view

    # no catalog event a client held is lost: all in a replay from a survivor
    assert_increasing(record.replay, "the replay")
    replayed = {e.id for e in record.replay}
    for name, events in record.held.items():
        lost = [(e.type, e.id) for e in catalog(events) if e.id not in replayed]
        assert not lost, f"{name} held catalog events the store lacks: {lost}"
    check_closing(record.replay, sid, turn_id, phase)

    # the next turn ran on a survivor, with ids above every id issued before the kill
    next_turn = record.next_turn
    assert next_turn is not None and next_turn.status_code == 202, next_turn and next_turn.text
    done = of_turn(watches["b"].events, next_turn.json()["turn_id"])
    assert done[-1].type == "turn.completed" and done[-1].payload.stop_reason == "end_turn"
    assert all(e.id > killed_at for e in done)
    assert watches["b"].client.reducer.state()["messages"][-1]["content"] == [
        {"type": "text", "text": "You said: hello again"}
    ]


def test_a_running_delegates_worker_is_closed_before_its_parent(crashed: Run) -> None:
    """docs/protocol.md §8 (delegate row): the worker's turn is cancelled first, then the
    parent emits ``delegate.failed``, ``tool.failed`` and ``turn.cancelled``; a restart on
    one node does so (tests/integration/store/test_restart.py, workers before their parents).

    On a survivor, whichever takes the family first (the recovery pass, or a
    request for the parent: ``Failover.take_over``) takes the worker's lease too and
    closes the worker's turn first (a node that loaded the worker with its parent
    once closed the parent at once, before it).
    """
    record = crashed.records["delegate"]
    for name in ("b", "c"):
        events = record.watches[name].events
        parent_gave_up = next(e for e in events if e.type == "delegate.failed")
        worker = parent_gave_up.payload.worker_session_id
        worker_end = next(e for e in own(events, worker) if e.type == "turn.cancelled")
        assert worker_end.id < parent_gave_up.id, name

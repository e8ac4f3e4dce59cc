"""The kill -9 torture test (docs/protocol.md §9) on a real ``gateway serve`` process.

Kill points are spread evenly over every phase: a first and a later LLM call
streaming, tools running, the seam (a tool waiting for approval), a delegate
(its worker streaming), right after a turn ended (sometimes over a second
after) and right after a session was created. Each is reached by waiting
until a live client received a given event (the k-th delta, ``tool.called``,
``permission.requested``, ``delegate.started``...), plus a random few
milliseconds; then the process gets SIGKILL and a new one opens the same
store. A third of the turns run on a session made in an earlier life of the
daemon (loaded back from the store). Checked at every kill, against
everything clients were shown over the whole run (:class:`Ledger`):

- before the restart, in the database file: every session whose ``POST
  /sessions`` was answered 201 is there; every catalog event any client ever
  received is stored, byte for byte; the catalog events a client received of
  a session are a run of that session's stored events with nothing missing
  between them, starting at the turn's ``turn.started``; a message is
  ``in_progress`` only in a session whose turn is open;
- after it: every turn of every session ended exactly once, in
  ``turn.completed`` or ``turn.cancelled``; each turn that was open is
  ``turn.cancelled`` with ``reason: "server_restart"`` and the phase it was in
  (the scenario's, and the one its stored events say), after section 8's
  sequence (each call, tool and delegate it began has ended; no
  ``llm.call_failed`` in ``tools``, no ``tool.failed`` in ``llm``); no message
  is ``in_progress``, no session has a turn in flight; the ids issued after the
  restart are above every id issued before it, and only the interrupted turns
  got events; ``GET /sessions`` lists every session made;
- a client resuming with its last ``since`` reaches the same reduced state
  (messages with their content and status, tool results, no open block, no
  turn in flight) as one subscribing fresh with a snapshot;
- the daemon's log has no error, warning or traceback in any life (a store
  write that fails while the daemon keeps running is logged as an error).

``GATEWAY_TORTURE_KILLS=N`` sets the number of kill points (default 28: four
per phase), ``GATEWAY_TORTURE_SEED`` the random seed. The figures are printed
at the end (``pytest -s``).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from gateway.client.attach import open_websocket as open_ws
from gateway.protocol.events import Event
from gateway.protocol.frames import SubscribeAck
from tests.torture_support import (
    Daemon,
    Ledger,
    RawClient,
    StoredEvent,
    StoreFile,
    interrupted_phase,
    seq_of,
    turns_of,
    unended,
)

# slow: torture: gateway serve processes killed at every point
pytestmark = pytest.mark.slow

KILLS = int(os.environ.get("GATEWAY_TORTURE_KILLS", "28"))
SEED = int(os.environ.get("GATEWAY_TORTURE_SEED", "9"))
EVERYTHING = {"event_types": None, "actors": None, "include_worker_sessions": True}
DELTAS = ("text.delta", "thinking.delta")
SLOW_WORKER = json.dumps({"script": {"delay_ms": 10, "rounds": [[{"lorem": 300}]]}})


def tool(name: str, **args: Any) -> dict[str, Any]:
    return {"tool_use": {"name": name, "input": args}}


@dataclass(frozen=True)
class Phase:
    """How to reach a kill point, and the phase its turn must be closed in."""

    script: dict[str, Any] | None  # None: create a session and kill at once
    kill_after: tuple[str, ...] = ()  # event types that count
    up_to: int = 1  # kill after the k-th of them, k drawn in 1..up_to
    in_worker: bool = False  # count them in the delegate's worker session
    closes_in: str | None = None  # the phase of the turn closed at restart
    linger_s: float = 0.02  # then receive for up to this long before the kill


PHASES: dict[str, Phase] = {
    "llm": Phase(
        {"delay_ms": 3, "rounds": [[{"thinking": "hm " * 10}, {"lorem": 300}]]},
        DELTAS,
        24,
        closes_in="llm",
    ),
    "later-llm": Phase(
        {"delay_ms": 3, "rounds": [[tool("sleep", seconds=0.01)], [{"lorem": 300}]]},
        DELTAS,
        12,
        closes_in="llm",
    ),
    "tools": Phase(
        {"rounds": [[tool("sleep", seconds=60), tool("sleep", seconds=60)]]},
        ("tool.called",),
        2,
        closes_in="tools",
    ),
    "seam": Phase(
        {"rounds": [[tool("read_file", path="x")]]},
        ("permission.requested",),
        closes_in="seam",
    ),
    "delegate": Phase(
        {"rounds": [[tool("delegate", task=SLOW_WORKER)]]},
        ("delegate.started", *DELTAS),
        6,
        in_worker=True,
        closes_in="tools",
    ),
    "turn-ended": Phase(
        {"rounds": [[{"text": "short and done"}]]}, ("turn.completed",), linger_s=0.2
    ),
    "session-created": Phase(None),
}


@dataclass
class Point:
    """One kill point: its session, its client, and what was open when it was reached."""

    phase: str
    sid: str
    client: RawClient | None = None
    workers: set[str] = field(default_factory=set)
    reused: bool = False  # the session was made in an earlier life


@dataclass
class Tally:
    points: Counter[str] = field(default_factory=Counter)
    closed: Counter[str] = field(default_factory=Counter)  # phase of turns closed at restart
    reused: int = 0
    lives: int = 1
    killed_in_recovery: int = 0
    recovered_again: int = 0  # the start after such a kill had turns to close


async def ws_url(http: httpx.AsyncClient, sid: str) -> str:
    r = await http.get(f"/sessions/{sid}")
    assert r.status_code == 200, (sid, r.status_code, r.text)
    return str(r.json()["ws_url"])


async def run_to_kill_point(
    stack: contextlib.AsyncExitStack,
    daemon: Daemon,
    workspace: Path,
    name: str,
    ledger: Ledger,
    reuse: str | None,
    rng: random.Random,
    life: int,
) -> Point:
    """Drive a session into the phase ``name`` and return once the kill is due."""
    phase = PHASES[name]
    async with httpx.AsyncClient(base_url=daemon.base) as http:
        if reuse is None or phase.script is None:
            r = await http.post("/sessions", json={"workspace_path": str(workspace)})
            assert r.status_code == 201, r.text
            sid = str(r.json()["session_id"])
            ledger.created[sid] = life
        else:
            sid = reuse
        point = Point(name, sid, reused=sid == reuse)
        if phase.script is None:
            await trio.sleep(rng.random() * phase.linger_s)
            return point
        ws = await stack.enter_async_context(open_ws(await ws_url(http, sid)))
        point.client = client = RawClient(ws, sid)
        # With a snapshot: a reused session's earlier messages are in the state.
        ack = await client.subscribe(filter=EVERYTHING, snapshot=True)
        assert isinstance(ack, SubscribeAck), ack
        await client.recv()  # the snapshot
        content = json.dumps({"script": phase.script})
        r = await http.post(f"/sessions/{sid}/turns", json={"content": content})
        assert r.status_code == 202, r.text
        k = rng.randint(1, phase.up_to)
        seen = 0

        def due(e: Event) -> bool:
            nonlocal seen
            if e.type == "delegate.started":
                point.workers.add(e.payload.worker_session_id)
            in_worker = e.session_id != sid
            if e.type in phase.kill_after and (
                in_worker == phase.in_worker or e.type == "delegate.started"
            ):
                seen += 1
            return seen >= k

        with trio.fail_after(30):
            await client.until(due)
            linger = phase.linger_s * rng.choice((0, rng.random()))  # half: at once
            if name == "turn-ended" and rng.random() < 0.3:
                linger = 1.2  # the case: a turn that ended over a second before
            with trio.move_on_after(linger):
                while True:
                    await client.recv()
        return point


def check_before_restart(ledger: Ledger, view: StoreFile, point: Point) -> None:
    """The file as the killed process left it (module docstring)."""
    where = f"after the kill in {point.phase} ({point.sid})"
    ledger.check_file(view, where)
    client = point.client
    if client is not None:
        received: dict[str, list[str]] = {}
        for event_id, session_id in client.catalog():
            received.setdefault(session_id, []).append(event_id)
        for session_id, ids in received.items():
            stored = [f"evt_{e.seq:020d}" for e in view.of(session_id)]
            if ids[0] not in stored:
                ledger.check(False, f"{where}: {ids[0]} of {session_id} is not stored")
                continue
            start = stored.index(ids[0])
            fresh = session_id in point.workers or not point.reused
            ledger.check(
                start == 0 or not fresh,
                f"{where}: {session_id} is new, yet {stored[:start][:3]} came before {ids[0]}",
            )
            run = stored[start : start + len(ids)]
            ledger.check(
                run == ids,
                f"{where}: {session_id} received {ids[-3:]}, stored in their place {run[-3:]}",
            )
            first = view.by_seq()[seq_of(ids[0])]
            ledger.check(
                first.type == "turn.started",
                f"{where}: {session_id}'s first event received is {first.type}",
            )
    open_turns = {
        sid for sid in view.sessions if (t := turns_of(view.of(sid))[0]) and t[-1].end is None
    }
    for sid, mid, status in view.messages:
        ledger.check(
            status != "in_progress" or sid in open_turns,
            f"{where}: message {mid} of {sid} is in_progress with no turn open",
        )


async def check_after_restart(
    ledger: Ledger, daemon: Daemon, db: Path, before: StoreFile, point: Point, tally: Tally
) -> None:
    """Recovery, ids and resume (module docstring); ``before`` is the file the kill left."""
    where = f"after the restart from {point.phase} ({point.sid})"
    after = StoreFile.read(db)  # the new daemon has closed the open turns before it listens
    async with httpx.AsyncClient(base_url=daemon.base) as http:
        listed: set[str] = set()
        cursor: dict[str, Any] = {"limit": 200}
        while True:
            r = await http.get("/sessions", params=cursor)
            assert r.status_code == 200, r.text
            page = r.json()
            listed |= {s["session"]["id"] for s in page["sessions"]}
            if not page["has_more"]:
                break
            cursor["before"] = page["sessions"][-1]["session"]["id"]
        missing = sorted(set(ledger.created) - listed)
        ledger.check(not missing, f"{where}: GET /sessions lacks {missing[:3]}")
    high = before.high_water()
    if point.client is not None and point.client.events:
        seen = max(seq_of(e.id) for e in point.client.events)
        ledger.check(seen <= high, f"{where}: id {seen} was issued above the durable ceiling")
    known = {e.seq for e in before.events}
    new = [e for e in after.events if e.seq not in known]
    ledger.check(all(e.seq > high for e in new), f"{where}: an id issued again ({high})")
    interrupted: dict[str, Any] = {}
    for sid in before.sessions:
        turns = turns_of(before.of(sid))[0]
        if turns and turns[-1].end is None:
            interrupted[sid] = turns[-1]
    ledger.check(
        PHASES[point.phase].closes_in is None or point.sid in interrupted,
        f"{where}: the turn of the kill point was not open in the store",
    )
    for e in new:
        ledger.check(
            e.session_id in interrupted or e.type.startswith("bus."),
            f"{where}: {e.type} {e.seq} in {e.session_id}, which had no turn open",
        )
    for sid, record in after.sessions.items():
        ledger.check(record["current_turn_id"] is None, f"{where}: {sid} still has a turn")
        turns, problems = turns_of(after.of(sid))
        for problem in problems:
            ledger.check(False, f"{where}: {sid}: {problem}")
        for turn in turns:
            ledger.check(turn.end is not None, f"{where}: {sid} turn {turn.turn_id} never ended")
            left = unended(turn)
            ledger.check(not left, f"{where}: {sid} turn {turn.turn_id} left {left} open")
        if sid in interrupted:
            check_closed(ledger, where, sid, interrupted[sid], turns, high, point, tally)
    stuck = [(sid, mid) for sid, mid, status in after.messages if status == "in_progress"]
    ledger.check(not stuck, f"{where}: messages still in_progress {stuck[:3]}")
    if point.client is not None:
        await check_resume(ledger, daemon, point, where)


def check_closed(
    ledger: Ledger,
    where: str,
    sid: str,
    open_turn: Any,
    turns: list[Any],
    high: int,
    point: Point,
    tally: Tally,
) -> None:
    """An interrupted turn ends with section 8's sequence for its phase, ``server_restart``."""
    turn = next((t for t in turns if t.turn_id == open_turn.turn_id), None)
    if turn is None or turn.end is None:
        ledger.check(False, f"{where}: {sid}'s open turn {open_turn.turn_id} was not closed")
        return
    end = turn.end
    phase = interrupted_phase(open_turn.events)
    kind = "worker" if sid in point.workers else "turn"
    tally.closed[f"{kind}:{end['payload'].get('phase')}"] += 1
    ledger.check(
        end["type"] == "turn.cancelled" and end["payload"]["reason"] == "server_restart",
        f"{where}: {sid}'s interrupted turn ended with {end['type']} {end['payload']}",
    )
    ledger.check(
        end["payload"].get("phase") == phase,
        f"{where}: {sid} closed in phase {end['payload'].get('phase')}, its events say {phase}",
    )
    expected = PHASES[point.phase].closes_in
    if sid == point.sid and expected is not None:
        ledger.check(phase == expected, f"{where}: the kill point was in {phase}, not {expected}")
    closing = turn.events[len(open_turn.events) :]
    ledger.check(
        all(seq_of(e["id"]) > high for e in closing),
        f"{where}: {sid}'s closing events reuse ids",
    )
    types = [e["type"] for e in closing]
    if phase == "llm":
        ledger.check("tool.failed" not in types, f"{where}: {sid} closed llm with {types}")
        ledger.check("llm.call_failed" in types, f"{where}: {sid} closed llm with {types}")
    else:
        ledger.check("llm.call_failed" not in types, f"{where}: {sid} closed {phase}: {types}")
    for i, e in enumerate(closing):
        if e["type"] == "delegate.failed":
            ledger.check(
                e["payload"]["failure_mode"] == "cancelled_by_user"
                and any(
                    later["type"] == "tool.failed"
                    and later["payload"]["tool_use_id"] == e["payload"]["tool_use_id"]
                    for later in closing[i:]
                ),
                f"{where}: {sid}'s delegate closed with {types}",
            )


def comparable(state: dict[str, Any]) -> dict[str, Any]:
    """What a resumed and a fresh client must agree on (a snapshot's tool results have no class)."""
    results = {k: {**v, "error_class": None} for k, v in state["tool_results"].items()}
    turn = state["turn"]
    return {
        "messages": state["messages"],
        "streaming": state["streaming"],
        "tool_results": results,
        "turn_in_flight": turn is not None and turn["status"] == "in_flight",
    }


async def check_resume(ledger: Ledger, daemon: Daemon, point: Point, where: str) -> None:
    """Resuming with the last ``since`` reaches the state of a fresh snapshot."""
    client = point.client
    assert client is not None
    async with httpx.AsyncClient(base_url=daemon.base) as http:
        r = await http.get(f"/sessions/{point.sid}")
        if r.status_code != 200:  # the symptom: the session is gone after the restart
            ledger.check(False, f"{where}: GET /sessions/{point.sid} is {r.status_code}")
            return
        async with open_ws(await ws_url(http, point.sid)) as ws:
            resumed = RawClient(ws, point.sid)
            resumed.reducer, resumed.events = client.reducer, list(client.events)
            ack = await resumed.subscribe(filter=EVERYTHING, since=client.events[-1].id)
            assert isinstance(ack, SubscribeAck), ack
            for _ in range(ack.replay_event_count):
                await resumed.recv()
        async with open_ws(await ws_url(http, point.sid)) as ws:
            fresh = RawClient(ws, point.sid)
            ack = await fresh.subscribe(filter=EVERYTHING, snapshot=True)
            assert isinstance(ack, SubscribeAck), ack
            await fresh.recv()
    ledger.received(resumed)
    ledger.received(fresh)
    got, want = comparable(resumed.reducer.state()), comparable(fresh.reducer.state())
    ledger.check(got == want, f"{where}: resumed {got} != fresh snapshot {want}")
    ledger.check(got["streaming"] is None, f"{where}: blocks still open after the resume")
    ledger.check(not got["turn_in_flight"], f"{where}: a turn still in flight after the resume")


async def test_kill_9_at_any_instant_loses_nothing_a_client_was_shown(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "x").write_text("x")
    db = tmp_path / "gateway.db"
    config = tmp_path / "gateway.toml"
    config.write_text(
        # flush_interval_ms: the writer gathers what nobody waits for (20 ms, the
        # old default); an event delivered before its commit would be lost.
        f'[store]\npath = "{db}"\nflush_interval_ms = 20\n'
        '[tools]\nenabled = ["sleep", "read_file", "delegate"]\nrequire_approval = ["read_file"]\n'
        f'[sessions]\nallowed_workspaces = ["{workspace}"]\n'
    )
    rng = random.Random(SEED)
    order = list(PHASES)
    phases = [order[i % len(order)] for i in range(KILLS)]
    ledger, tally = Ledger(), Tally()
    idle: list[str] = []  # sessions with no turn in flight, to run a later turn on
    daemon = await Daemon.start(tmp_path, config, tally.lives)
    try:
        for name in phases:
            reuse = rng.choice(idle) if idle and rng.random() < 1 / 3 else None
            async with contextlib.AsyncExitStack() as stack:  # the client's socket
                point = await run_to_kill_point(
                    stack, daemon, workspace, name, ledger, reuse, rng, tally.lives
                )
                await daemon.kill()
            tally.reused += point.reused
            for line in daemon.trouble():
                ledger.check(False, f"life {tally.lives}: {line}")
            if point.client is not None:
                ledger.received(point.client)
            before = StoreFile.read(db)
            check_before_restart(ledger, before, point)
            tally.lives += 1
            if PHASES[name].closes_in is not None and rng.random() < 1 / 3:
                # Killed again while it closes the turns: the next start closes them once.
                seen, trouble = await Daemon.start_and_kill_in_recovery(
                    tmp_path, config, tally.lives
                )
                tally.killed_in_recovery += seen
                for line in trouble:
                    ledger.check(False, f"life {tally.lives}: {line}")
                tally.lives += 1
                daemon = await Daemon.start(tmp_path, config, tally.lives)
                tally.recovered_again += daemon.redid_recovery()
            else:
                daemon = await Daemon.start(tmp_path, config, tally.lives)
            await check_after_restart(ledger, daemon, db, before, point, tally)
            tally.points[name] += 1
            if point.sid not in idle:
                idle.append(point.sid)
    finally:
        await daemon.kill()
        if ledger.violations:  # an exception may be on its way: say what was found before it
            print("\nviolations so far:\n" + "\n".join(ledger.violations[:20]))
    for line in daemon.trouble():
        ledger.check(False, f"life {tally.lives}: {line}")
    ledger.check_file(StoreFile.read(db), "at the end")
    print(
        f"\nkill -9 torture: {sum(tally.points.values())} kill points {dict(tally.points)}"
        f" ({tally.reused} on a session from an earlier life), {tally.lives} daemon lives"
        f" ({tally.killed_in_recovery} killed again while closing the turns,"
        f" {tally.recovered_again} of them before the closing was durable);"
        f" turns closed at restart {dict(sorted(tally.closed.items()))};"
        f" {len(ledger.delivered)} delivered catalog events checked byte for byte after every"
        f" kill, {len(ledger.created)} sessions; violations {len(ledger.violations)}"
    )
    assert not ledger.violations, "\n".join(ledger.violations[:20])
    assert sum(tally.points.values()) == KILLS
    assert {"turn:llm", "turn:tools", "turn:seam", "worker:llm"} <= set(tally.closed)


# --- the checks themselves: each must be able to fail ---------------------------------------


def stored(seq: int, sid: str, type_: str, turn: str | None, **payload: Any) -> StoredEvent:
    event = {"id": f"evt_{seq:020d}", "type": type_, "turn_id": turn, "payload": payload}
    return StoredEvent(seq, sid, type_, json.dumps(event).encode())


def test_the_phase_of_an_open_turn_is_read_from_its_stored_events() -> None:
    def phase(*events: tuple[str, dict[str, Any]]) -> str:
        return interrupted_phase([{"type": t, "payload": p} for t, p in events])

    started = ("llm.call_started", {"call_id": "c1"})
    completed = ("llm.call_completed", {"call_id": "c1"})
    called = ("tool.called", {"tool_use_id": "t1"})
    asked = ("permission.requested", {"perm_id": "p1", "tool_use_id": "t1"})
    assert phase(started) == "llm"
    assert phase(started, completed) == "seam"
    assert phase(started, completed, called) == "tools"
    assert phase(started, completed, called, asked) == "seam"
    resolved = ("permission.resolved", {"perm_id": "p1"})
    assert phase(started, completed, called, asked, resolved) == "tools"
    assert phase(started, completed, called, ("tool.completed", {"tool_use_id": "t1"})) == "seam"


def test_turns_that_overlap_or_never_end_are_found() -> None:
    events = [
        stored(1, "s", "turn.started", "a"),
        stored(2, "s", "llm.call_started", "a", call_id="c1"),
        stored(3, "s", "turn.completed", "a"),
        stored(4, "s", "tool.failed", "a", tool_use_id="t1"),
        stored(5, "s", "turn.started", "b"),
        stored(6, "s", "tool.called", "b", tool_use_id="t2"),
        stored(7, "s", "turn.started", "c"),
    ]
    turns, problems = turns_of(events)
    assert [t.turn_id for t in turns] == ["a", "b", "c"]
    assert [t.end is None for t in turns] == [False, True, True]
    assert len(problems) == 2  # tool.failed after a's end; c started while b was open
    assert unended(turns[0]) == ["llm call c1"] and unended(turns[1]) == ["tool t2"]


def test_the_ledger_finds_a_lost_session_a_lost_event_and_changed_bytes() -> None:
    view = StoreFile(
        sessions={"s1": {}},
        events=[stored(1, "s1", "turn.started", "a"), stored(2, "s1", "turn.completed", "a")],
    )
    ledger = Ledger(created={"s1": 1, "s2": 1})
    ledger.delivered = {
        "evt_00000000000000000001": view.events[0].data,
        "evt_00000000000000000002": view.events[1].data + b" ",
        "evt_00000000000000000003": b"{}",
    }
    ledger.check_file(view, "here")
    ledger.check_file(view, "again")  # the same facts are not counted twice
    assert len(ledger.violations) == 3, ledger.violations
    assert "session s2" in ledger.violations[0]
    assert "evt_00000000000000000002 stored is not what was sent" in ledger.violations[1]
    assert "delivered evt_00000000000000000003 is not in the store" in ledger.violations[2]

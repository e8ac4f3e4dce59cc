"""The streaming conformance suite (tests/streaming-conformance/, docs/protocol.md sections 3-10).

Recorded traces (the server frames one client received, across its
reconnects) drive both reducers: the Python one here, the JS one
(gateway/ui/reducer.js) under node's own test runner, run from here. Both must
reach the expected views after every frame.

Then the property of section 10: a client that attaches with a snapshot, or
resumes with ``since``, ends in the view of one that saw every event live.
For every recorded trace, at every cut point, a second client is built the
way the server would build it there (the snapshot of the state at the cut; or
the replay of what it missed, with ``message.snapshot`` for a message still
streaming) and then fed the rest of the trace: its views must equal the live
client's at every later frame, but for the two windows the views document (a
restored block's thinking chunk and a restored tool block's input, both
unknowable from a snapshot until the block moves on, and a compaction under
way, which a snapshot does not carry: docs/protocol.md §12), and exactly at the end.
The same is checked against a real gateway: a resume with ``since`` from every
event of a tool turn, and a snapshot attach before every delta of a held
stream.

Finally, the stored traces are what the current gateway sends (re-recorded:
a protocol change fails here until ``record.py --write`` stores it, as a
reviewed diff), but for the traces written by hand (``record.HAND_WRITTEN``:
paths the gateway cannot produce yet), which only drive the reducers.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import msgspec
import pytest
import trio

from gateway.client.reducer import Reducer, StreamingMessage
from gateway.client.views import full_view, simple_view
from gateway.protocol.events import CATALOG_TYPES, STREAMING_TYPES
from gateway.protocol.shapes import Message, ToolResultBlock, ToolUseBlock
from tests.conftest import make_config, running_gateway
from tests.debian import debian_binary
from tests.paths import ROOT, TESTS
from tests.provider_support import ignore_unfinalized_generators

SUITE = TESTS / "streaming-conformance"


def _load_record() -> ModuleType:
    spec = importlib.util.spec_from_file_location("conformance_record", SUITE / "record.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


record = _load_record()
NAMES = sorted(p.name.removesuffix(".jsonl") for p in (SUITE / "traces").glob("*.jsonl"))
Frame = dict[str, Any]


# --- the traces drive the Python reducer ---------------------------------------------


def test_every_scenario_has_its_trace_and_nothing_else() -> None:
    assert set(NAMES) == set(record.SCENARIOS)
    expected = {p.name.removesuffix(".expected.json") for p in (SUITE / "traces").glob("*.json")}
    assert expected == set(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_the_python_reducer_reaches_the_expected_views(name: str) -> None:
    frames = record.load_trace(name)
    stored = record.load_expected(name)
    assert {k: stored[k] for k in ("description", "workers")} == record.meta_of(name)
    computed = record.expected_views(frames, stored["workers"])
    assert computed["final"] == stored["final"]
    assert computed["steps"] == stored["steps"], "run record.py: the steps are stale"


def test_the_stored_partial_json_cases_are_the_python_parsers() -> None:
    stored = json.loads((SUITE / "partial_json.json").read_text())
    assert stored == json.loads(record.dump_partial_json_cases())


def _node() -> str:
    """A node >= 18, installed with apt-get if missing; else the test skips, saying why."""
    found = debian_binary("nodejs", "node", "nodejs")
    version = subprocess.run([found, "--version"], capture_output=True, text=True).stdout
    major = int(re.match(r"v(\d+)", version.strip()).group(1))  # type: ignore[union-attr]
    if major < 18:
        pytest.skip(f"node {version.strip()} is older than 18 (node --test)")
    return found


@pytest.mark.slow  # node runs gateway/ui/reducer.js on the traces
def test_the_js_reducer_reaches_the_expected_views() -> None:
    """node --test tests/streaming-conformance/: gateway/ui/reducer.js on the same files."""
    node = _node()
    root = ROOT
    run = subprocess.run(
        [node, "--test", str(SUITE / "reducer.test.mjs")],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
    assert re.search(r"^# fail 0$", run.stdout, re.M), run.stdout[-2000:]
    assert int(re.search(r"^# pass (\d+)$", run.stdout, re.M).group(1)) >= len(NAMES)  # type: ignore[union-attr]


# --- a late or returning client ends where a live one is (section 10) ----------------


def spaced(frames: list[Frame]) -> list[Frame]:
    """The trace with every event id times 10: room for the ids a replay issues."""
    text = re.sub(r"evt_(\d{20})", lambda m: f"evt_{int(m[1]) * 10:020d}", json.dumps(frames))
    result: list[Frame] = json.loads(text)
    return result


def reduce(session_id: str, frames: list[Frame], reducer: Reducer | None = None) -> Reducer:
    reducer = reducer or Reducer(session_id)
    for frame in frames:
        reducer.apply(record.decode(frame))
    return reducer


def clone(reducer: Reducer) -> Reducer:
    return copy.deepcopy(reducer)


def server_message(streaming: StreamingMessage, session_id: str) -> dict[str, Any]:
    """The ``in_progress`` message the server would send for this streaming message."""
    opened = streaming.open_block()
    ordered = sorted(streaming.blocks)
    message = Message(
        id=streaming.message_id,
        session_id=session_id,
        turn_id=streaming.turn_id,
        role="assistant",
        content=[streaming.blocks[i].as_content_block() for i in ordered],
        status="in_progress",
        created_at=0,
        model=streaming.model,
        open_block_index=None if opened is None else ordered.index(opened[0]),
    )
    result: dict[str, Any] = msgspec.to_builtins(message)
    return result


def server_snapshot(live: Reducer) -> Frame:
    """The ``snapshot`` frame the server would send with the session where ``live`` is.

    Its messages as the server stores them: each assistant message followed by
    a user message of the results of its tools; the streaming one last.
    """
    messages: list[dict[str, Any]] = []
    for message in live.messages:
        messages.append(msgspec.to_builtins(message))
        uses = [b.id for b in message.content if isinstance(b, ToolUseBlock)]
        results = [live.tool_results[i] for i in uses if i in live.tool_results]
        if message.role == "assistant" and results:
            blocks = [
                ToolResultBlock(
                    r.tool_use_id,
                    r.content,
                    r.status == "failed",
                    files=list(r.files) if r.files else msgspec.UNSET,
                )
                for r in results
            ]
            messages.append(
                msgspec.to_builtins(
                    Message(
                        f"msg_results_{message.id}",
                        live.session_id,
                        message.turn_id,
                        "user",
                        list(blocks),
                        "complete",
                        0,
                    )
                )
            )
    if live.streaming is not None:
        messages.append(server_message(live.streaming, live.session_id))
    running = live.running_turn_id
    session: dict[str, Any] = {
        "id": live.session_id,
        "workspace_path": "/workspace",
        "active_model": "scripted:echo",
        "routing_policy_version": "static-1",
        "cost_so_far_usd": 0.0,
        "turn_count": 1,
        "current_turn_id": running,
        "current_turn_status": "in_flight" if running else None,
        "parent_session_id": None,
        "pending_permissions": [msgspec.to_builtins(p) for p in live.permissions.values()],
    }
    if live.queued:  # docs/protocol.md §6: absent when none is queued
        session["queued_turns"] = [
            {"turn_id": turn_id, "position": n, "user_message": msgspec.to_builtins(message)}
            for n, (turn_id, message) in enumerate(live.queued.items(), start=1)
        ]
    return {
        "type": "snapshot",
        "session": session,
        "messages": messages,
        "snapshot_at_event_id": live.last_event_id,
    }


def server_replay(frames: list[Frame], cut: int, now: int, server: Reducer) -> list[Frame]:
    """What a client that left after ``frames[:cut]`` gets back when ``frames[:now]`` were sent.

    docs/protocol.md §3: the catalog events it missed, each ``message.complete``
    in its place, then one ``message.snapshot`` (with an id of its own) for each
    message still streaming that moved meanwhile; ``server`` is the state at ``now``.
    """
    missed = [f for f in frames[cut:now] if f["type"] == "event"]
    replay = [
        f
        for f in missed
        if f["event"]["type"] in CATALOG_TYPES or f["event"]["type"] == "message.complete"
    ]
    last = max((f["event"]["id"] for f in frames[:now] if f["type"] == "event"), default=None)
    if last is None:
        return replay
    seq = int(last[4:])
    for reducer in [server, *server.workers.values()]:
        streaming = reducer.streaming
        if streaming is None:
            continue
        moved = any(
            f["event"]["type"] in STREAMING_TYPES and _message_of(f) == streaming.message_id
            for f in missed
        )
        if not moved:
            continue
        seq += 1
        event = {
            "id": f"evt_{seq:020d}",
            "type": "message.snapshot",
            "session_id": reducer.session_id,
            "turn_id": streaming.turn_id,
            "ts": 0,
            "actor": "llm",
            "payload": {"message": server_message(streaming, reducer.session_id)},
        }
        replay.append({"type": "event", "event": event})
    return replay


def _event_ids(frames: list[Frame]) -> list[str]:
    return [f["event"]["id"] for f in frames if f["type"] == "event"]


def _message_of(frame: Frame) -> Any:
    payload = frame["event"]["payload"]
    return payload["message"]["id"] if "message" in payload else payload.get("message_id")


def masked(views: dict[str, Any]) -> dict[str, Any]:
    """The views less the windows a restore cannot close (module docstring)."""
    views = copy.deepcopy(views)
    for message in views["full"]["messages"]:
        for block in message["blocks"]:
            if block["type"] == "tool_use" and block["open"]:
                block["input"] = "(streaming)"
    status = views["simple"]["status"]
    if status is not None and status["kind"] == "thinking":
        status["text"] = "(a chunk)"
    if status is not None and status["kind"] == "compacting":
        # A snapshot cannot say a compaction is under way; between its events a
        # turn has no other status line (no block is open, no tool waits).
        views["simple"]["status"] = None
    return views


def views(reducer: Reducer, workers: bool = False) -> dict[str, Any]:
    return {"full": full_view(reducer, workers=workers), "simple": simple_view(reducer)}


def cuts(frames: list[Frame]) -> Iterator[int]:
    """Every point after an event or a snapshot: where a client may leave or attach."""
    for n, frame in enumerate(frames, start=1):
        if frame["type"] in ("event", "snapshot"):
            yield n


def follow(live: Reducer, other: Reducer, frames: list[Frame], workers: bool, where: str) -> None:
    """Feed both the rest of the trace; ``other`` must show what ``live`` shows all along."""
    for n, frame in enumerate(frames):
        decoded = record.decode(frame)
        live.apply(decoded)
        other.apply(decoded)
        assert masked(views(other, workers)) == masked(views(live, workers)), f"{where}, +{n + 1}"
    assert views(other, workers) == views(live, workers), f"{where}, at the end"
    assert other.duplicates_ignored == live.duplicates_ignored


@pytest.mark.parametrize("name", NAMES)
def test_a_snapshot_at_any_cut_shows_what_a_live_client_shows(name: str) -> None:
    frames = spaced(record.load_trace(name))
    sid = record.session_of(frames)
    for cut in cuts(frames):
        live = reduce(sid, frames[:cut])
        late = Reducer(sid)
        late.apply(record.decode(server_snapshot(live)))
        where = f"{name}: snapshot after frame {cut}"
        assert masked(views(late)) == masked(views(live)), where
        # The parent's snapshot shows no worker: workers are compared after a resume only.
        follow(live, late, frames[cut:], False, where)


@pytest.mark.slow  # over a second on two cores (measured with --durations)
@pytest.mark.parametrize("name", NAMES)
def test_a_resume_with_since_at_any_cut_shows_what_a_live_client_shows(name: str) -> None:
    frames = spaced(record.load_trace(name))
    sid = record.session_of(frames)
    workers = record.SCENARIOS[name].workers
    points = list(cuts(frames))
    for cut in points:
        # It comes back before the trace's own next snapshot: what that brings
        # (a compaction's summary, hand-written traces) no replay carries.
        later = [n for n in points if n > cut and frames[n - 1]["type"] == "snapshot"]
        until = min(later, default=len(frames) + 1)
        for now in sorted({cut, cut + 2, len(frames)} & {*points, cut}):
            if now >= until:
                continue
            server = reduce(sid, frames[:now])
            resumed = reduce(sid, frames[:cut])
            for frame in server_replay(frames, cut, now, server):
                resumed.apply(record.decode(frame))
            where = f"{name}: left after frame {cut}, back after {now}"
            assert masked(views(resumed, workers)) == masked(views(server, workers)), where
            follow(server, resumed, frames[now:], workers, where)


def test_the_cut_tests_would_catch_a_view_that_depends_on_what_was_seen() -> None:
    """The property tests are not vacuous: a view that keeps a chunk history fails them."""
    frames = spaced(record.load_trace("thinking_then_text"))
    sid = record.session_of(frames)
    thinking = next(
        n
        for n, f in enumerate(frames, 1)
        if f["type"] == "event" and f["event"]["type"] == "thinking.delta"
    )
    live = reduce(sid, frames[:thinking])
    late = Reducer(sid)
    late.apply(record.decode(server_snapshot(live)))
    # A live client's thinking status is the latest chunk; the late one's is empty until
    # the next chunk: different, and masked as a documented window...
    assert views(late)["simple"]["status"] != views(live)["simple"]["status"]
    assert masked(views(late)) == masked(views(live))
    # ...but a reply that kept an earlier round's text would not be masked.
    tampered = views(late)
    tampered["simple"]["thread"][-1]["text"] += " (an earlier round)"
    assert masked(tampered) != masked(views(live))


# --- the same against a real gateway ----------------------------------------------------

TOOL_TURN = record.script(
    [{"thinking": "Let me check."}, {"text": "Running it now."}, record.sleep(0.01)],
    [{"thinking": "Done."}, {"text": "All done."}],
)


async def test_a_real_resume_from_every_event_ends_in_the_live_view(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with running_gateway(make_config(tmp_path)) as gw:
            sid = await gw.create_session()
            live = record.Recorder(gw, sid)
            async with live.connect(record.CHAT):
                await gw.submit(sid, TOOL_TURN)
                await live.until_turn_ends()
            expected = views(reduce(sid, live.frames))
            for cut in cuts(live.frames):
                resumed = record.Recorder(gw, sid)
                resumed.frames = live.frames[:cut]
                async with resumed.connect(record.CHAT, since=resumed.last_event_id) as conn:
                    ack = conn.frames[cut]
                    for _ in range(ack["replay_event_count"]):
                        await conn.recv()
                assert views(reduce(sid, resumed.frames)) == expected, f"resumed after {cut}"


async def test_a_real_snapshot_before_every_delta_shows_the_live_view(tmp_path: Path) -> None:
    """The gateway held before each delta of a turn in turn; a client attaches with a snapshot."""
    gate = record.Gate()
    with trio.fail_after(60):
        async with running_gateway(make_config(tmp_path), gate) as gw:
            # a first run counts the turn's deltas
            await record.one_turn(gw, TOOL_TURN)
            count = gate.deltas
            assert count > 10
            sid = await gw.create_session()
            live = record.Recorder(gw, sid)
            async with live.connect(record.FULL):
                holds = [gate.before(count + n) for n in range(1, count + 1)]
                await gw.submit(sid, TOOL_TURN)
                for hold in holds:
                    await hold.reached.wait()
                    late = record.Recorder(gw, sid)
                    async with late.connect(record.CHAT, snapshot=True):
                        snapshot = await late.recv()
                    cut = snapshot["snapshot_at_event_id"]
                    while max(_event_ids(live.frames), default="") < cut:
                        await live.recv()  # the live client where the snapshot is
                    at = views(reduce(sid, late.frames))
                    assert masked(at) == masked(views(reduce(sid, live.frames))), f"at {hold.at}"
                    hold.go.set()
                await live.until_turn_ends()
            assert views(reduce(sid, live.frames))["simple"]["thread"][-1]["text"] == "All done."


async def test_a_real_snapshot_or_resume_mid_queue_ends_in_the_live_view(tmp_path: Path) -> None:
    """docs/protocol.md §2 "A busy session": a client that attaches with a snapshot while turns
    are queued (and one was cancelled) sees the queue the live client sees, and so does one
    that resumes with ``since`` from any event of the session; all end in the same views."""
    gate = record.Gate()
    with trio.fail_after(60):
        async with running_gateway(make_config(tmp_path), gate) as gw:
            sid = await gw.create_session()
            hold = gate.before(3)
            live = record.Recorder(gw, sid)
            async with live.connect(record.CHAT):
                await gw.submit(sid, "Wait for me here")
                await hold.reached.wait()
                queued = [
                    (await record.post_turn(gw, sid, text, "queue"))["turn_id"]
                    for text in ("B", "C", "D")
                ]
                r = await gw.http.post(f"/sessions/{sid}/turns/{queued[1]}/cancel", json={})
                assert r.status_code == 202, r.text
                await live.until_turn_ends()
                late = record.Recorder(gw, sid)
                async with late.connect(record.CHAT, snapshot=True):
                    await late.recv()
                at = views(reduce(sid, late.frames))
                assert [q["turn_id"] for q in at["simple"]["queued"]] == [queued[0], queued[2]]
                assert masked(at) == masked(views(reduce(sid, live.frames)))
                hold.go.set()
                await live.until_event("turn.completed", count=3)
            expected = views(reduce(sid, live.frames))
            assert "queued" not in expected["full"]
            for cut in cuts(live.frames):
                resumed = record.Recorder(gw, sid)
                resumed.frames = live.frames[:cut]
                async with resumed.connect(record.CHAT, since=resumed.last_event_id) as conn:
                    for _ in range(conn.frames[cut]["replay_event_count"]):
                        await conn.recv()
                assert views(reduce(sid, resumed.frames)) == expected, f"resumed after {cut}"


# --- the stored traces are what the gateway sends now -----------------------------------


RECORDED = [n for n in NAMES if record.SCENARIOS[n].deterministic and n not in record.HAND_WRITTEN]
CLAUDE_CODE = [n for n in RECORDED if record.SCENARIOS[n].runtime == "claude-code"]
_NEEDS_THE_EXTRA = [
    pytest.mark.skipif(
        not record.claude_code_available(),
        reason="a Claude Code trace: re-recording it needs the claude-code extra"
        " (pip install 'gateway[claude-code]'); both reducers still run on it",
    ),
    *ignore_unfinalized_generators("anthropic", "httpx2", "httpcore2", "httpx", "httpcore"),
]


def _recorded(name: str) -> Any:
    return pytest.param(name, marks=_NEEDS_THE_EXTRA if name in CLAUDE_CODE else ())


def test_the_hand_written_traces_are_not_recorded() -> None:
    assert {"compaction_between_turns", "elicitation_pending"} <= record.HAND_WRITTEN
    assert set(NAMES) >= record.HAND_WRITTEN
    assert all(record.SCENARIOS[n].hand_written for n in record.HAND_WRITTEN)


def test_the_claude_code_traces_are_recorded_from_the_runtime() -> None:
    """Both Claude Code scenarios are recorded (not hand-written), and only they need the extra."""
    assert set(CLAUDE_CODE) == {"claude_code_text", "claude_code_tool"}
    assert all(record.available(n) for n in NAMES if n not in CLAUDE_CODE)
    tool = [
        f["event"]["type"] for f in record.load_trace("claude_code_tool") if f["type"] == "event"
    ]
    i = tool.index("tool.called")
    assert tool[i : i + 4] == [
        "tool.called", "permission.requested", "permission.resolved", "tool.completed"
    ]  # fmt: skip
    text = record.load_expected("claude_code_text")["final"]["full"]["messages"]
    assert [b["type"] for b in text[-1]["blocks"]] == ["thinking", "text"]


@pytest.mark.slow  # over a second on two cores (measured with --durations)
@pytest.mark.parametrize("name", [_recorded(n) for n in RECORDED])
async def test_the_stored_trace_is_what_the_gateway_sends_now(name: str, tmp_path: Path) -> None:
    frames = await record.record(name, tmp_path)
    stored = record.load_trace(name)
    assert frames == stored, (
        f"the gateway now sends another {name} trace: review "
        f"`.venv/bin/python tests/streaming-conformance/record.py {name}`, then --write"
    )


async def test_a_timing_dependent_trace_still_ends_in_its_views(tmp_path: Path) -> None:
    frames = await record.record("slow_client_resume", tmp_path)
    assert any(f["type"] == "event" and f["event"]["type"] == "bus.handler_warning" for f in frames)
    assert [f["since"] is not None for f in frames if f["type"] == "subscribe_ack"] == [False, True]
    expected = record.load_expected("slow_client_resume")
    assert record.expected_views(frames, False)["final"] == expected["final"]


async def test_a_rolled_up_turn_still_ends_in_its_views(tmp_path: Path) -> None:
    """docs/protocol.md §3 "Delta rollup": whatever the timing, fewer deltas, the same views."""
    frames = await record.record("rolled_up_turn", tmp_path)
    deltas = [f for f in frames if f["type"] == "event" and f["event"]["type"].endswith("delta")]
    assert 4 <= len(deltas) < 12  # one per block on a quiet machine; the script has 4 blocks
    expected = record.load_expected("rolled_up_turn")
    assert record.expected_views(frames, False)["final"] == expected["final"]


def test_text_of_the_final_round_only() -> None:
    """Seed 004: the thread keeps only the final round's text (checked on the recorded turn)."""
    final = record.load_expected("parallel_tools")["final"]
    [user, reply] = final["simple"]["thread"]
    assert (user["role"], reply["role"], reply["status"]) == ("user", "assistant", "complete")
    assert reply["text"] == "Both naps are over."
    assert final["simple"]["status"] is None
    tools = [b for m in final["full"]["messages"] for b in m["blocks"] if b["type"] == "tool_use"]
    assert [(t["status"], t["result"]) for t in tools] == [
        ("completed", "slept 0.01 s"),
        ("completed", "slept 0.25 s"),
    ]


def test_a_fork_is_joined_with_its_snapshot() -> None:
    """docs/protocol.md §2 "Forks": the fork trace starts with its snapshot, the copied history.

    So its first cut point is that snapshot: the snapshot and resume properties above hold from
    there. Before it there is no cut, and the special case the README documents: a replay of the
    fork from before ``session.forked`` (which changes no state) holds none of the copied
    messages, so a client that joins that way shows the fork's own turns only; here its rewind
    to a copied message, which it does not hold, leaves it the edited branch alone.
    """
    frames = record.load_trace("fork")
    assert [f["type"] for f in frames[:2]] == ["subscribe_ack", "snapshot"]
    assert next(cuts(frames)) == 2
    snapshot = frames[1]
    sid = record.session_of(frames)
    events = [f for f in frames if f["type"] == "event"]
    copied = {m["id"] for m in snapshot["messages"]}
    assert len(copied) == 6 and not copied & {_message_of(f) for f in events}
    live = views(reduce(sid, frames))
    forked = {
        "id": snapshot["snapshot_at_event_id"],
        "type": "session.forked",
        "session_id": sid,
        "turn_id": None,
        "ts": 0,
        "actor": "session",
        "payload": {
            "from_session_id": "sess_source",
            "at_message_id": snapshot["messages"][-1]["id"],
        },
    }
    without = views(reduce(sid, [{"type": "event", "event": forked}, *events]))
    thread = [(e["role"], e["text"]) for e in live["simple"]["thread"]]
    assert thread[:2] == [
        ("user", "The first question"),
        ("assistant", "You said: The first question"),
    ]
    assert without["simple"]["thread"] == live["simple"]["thread"][2:]

"""A busy ``claude-code`` session: queue, interrupt and steer (docs/protocol.md §2 "A busy
session", §11 "A busy session").

Offline as :mod:`tests.system.claude_code.test_claude_code`: the real Claude Code
CLI behind a real gateway, the fake Anthropic API recording every model call.
What the gateway wrote to the CLI's stdin is recorded too (:func:`stdin`): a
steer reaches the CLI once, in the turn that announced it, or never (it became
a queued turn, whose prompt is then written once). Claude Code shows a user
message that reaches it while a tool runs inside that tool's result ("The user
sent a new message while you were working"), which is what the next model call
is asserted to hold.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import trio

from bench.fake_api import FakeServer, Replay, transcript
from bench.fake_api.server import Cut
from gateway.protocol.events import Event
from tests.claude_code_support import CLAUDE_CODE_MARKS, decide, gateway, only_model_calls
from tests.claude_code_support import server as server
from tests.conftest import Client, Harness, running_gateway, types

pytestmark = CLAUDE_CODE_MARKS

FOLDED = "The user sent a new message while you were working"
"""How Claude Code 2.1.332 shows the model a message that came while a tool ran."""


def slow_bash(seconds: int) -> Replay:
    """A Bash use that touches ``started.txt``, then sleeps."""
    body = transcript("claude-code/bash_touch_sleep.sse")
    return Replay(body.replace(b"sleep 30", f"sleep {seconds}".encode()))


TEXT = Replay(transcript("anthropic/text.sse"))


def stdin(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Every user message the gateway writes to a CLI's stdin, in order (a live list)."""
    from gateway.runtimes.transport import ToolProcessTransport  # the SDK: not at collection

    written: list[dict[str, Any]] = []
    write = ToolProcessTransport.write

    async def recording(self: Any, data: str) -> None:
        for line in data.splitlines():
            frame = json.loads(line)
            if frame.get("type") == "user":
                written.append(frame)
        await write(self, data)

    monkeypatch.setattr(ToolProcessTransport, "write", recording)
    return written


def said(frame: dict[str, Any]) -> str:
    content = frame["message"]["content"]
    return content if isinstance(content, str) else json.dumps(content)


async def post(gw: Harness, sid: str, content: str, **body: Any) -> tuple[int, Any]:
    r = await gw.http.post(f"/sessions/{sid}/turns", json={"content": content, **body})
    return r.status_code, r.json()


async def ended(client: Client, count: int) -> list[Event]:
    """Receive until ``count`` turns have ended (cancelled queued ones included)."""
    out: list[Event] = []
    with trio.fail_after(60):
        for _ in range(count):
            out += await client.until_turn_ends()
    return out


async def tool_started(gw: Harness, sid: str) -> None:
    """Until the running Bash has touched ``started.txt`` (it sleeps now)."""
    workspace = gw.node.workspaces.host_path(gw.node.sessions[sid].record.workspace_path)
    with trio.fail_after(20):
        while not os.path.exists(os.path.join(workspace, "started.txt")):  # noqa: ASYNC240, ASYNC110
            await trio.sleep(0.05)


def last_user(request: Any) -> str:
    """What the last user message of a model call says (its text and tool results)."""
    return json.dumps(request.body["messages"][-1]["content"])


def turn_kinds(events: list[Event]) -> list[tuple[str, str | None]]:
    return [(e.type, e.turn_id) for e in events if e.type.startswith("turn.")]


def pid_of(gw: Harness, sid: str) -> int:
    runtime: Any = gw.node.sessions[sid].agent.runtime  # type: ignore[union-attr]
    return int(runtime.transport.pid)


@pytest.mark.parametrize("when", ["during_the_call", "while_the_tool_runs"])
async def test_a_steer_reaches_claude_code_at_its_next_tool_step_in_the_same_turn(
    tmp_path: Path, server: FakeServer, monkeypatch: pytest.MonkeyPatch, when: str
) -> None:
    """Taken at the turn's next tool step: as the tool is about to run (its ``PreToolUse``
    hook) when the steer came during the model call that asked for it, when the tool has
    run (``PostToolUse``) when it came while the tool ran. Either way ``turn.steered``
    comes between the tool's call and its result, and the next model call of the same
    turn shows it, with that result."""
    bash = slow_bash(3)
    server.enqueue(Replay(bash.body, delay_s=1.0) if when == "during_the_call" else bash, TEXT)
    written = stdin(monkeypatch)
    config, providers = await gateway(tmp_path, server, monkeypatch, require_approval="[]")
    async with running_gateway(config, providers) as gw:
        sid = await gw.create_session()
        async with gw.client(sid) as client:
            await client.subscribe()
            _, first = await post(gw, sid, "run the slow thing")
            if when == "during_the_call":
                with trio.fail_after(20):
                    while not server.requests:  # noqa: ASYNC110 (the CLI's call is in)
                        await trio.sleep(0.02)
                steer = await post(gw, sid, "STEER: use the blue one", if_busy="steer")
                await tool_started(gw, sid)
                before_the_tool = [said(f) for f in written]
            else:
                await tool_started(gw, sid)
                before_the_tool = [said(f) for f in written]
                steer = await post(gw, sid, "STEER: use the blue one", if_busy="steer")
            pid = pid_of(gw, sid)
            events = await ended(client, 1)
            stdin_at_end = list(written)
            assert pid_of(gw, sid) == pid  # one CLI, one conversation
        listed = (await gw.http.get(f"/sessions/{sid}/messages")).json()["messages"]
    await providers.aclose()
    a = first["turn_id"]
    assert steer == (202, {"turn_id": a, "steered": True})
    order = types(client.events)
    assert "turn.queued" not in order and order.count("turn.completed") == 1
    [steered] = [e for e in events if e.type == "turn.steered"]
    assert steered.turn_id == a
    assert steered.payload.user_message.content[0].text == "STEER: use the blue one"
    calls = [i for i, t in enumerate(order) if t == "llm.call_started"]
    assert len(calls) == 2
    assert order.index("tool.called") < order.index("turn.steered") < order.index("tool.completed")
    assert order.index("turn.steered") < calls[1]  # before the call that answers it
    # What the CLI got, during the first turn: the prompt, then the steer, one session;
    # the steer before the tool ran (PreToolUse), or after (PostToolUse).
    assert [said(f) for f in stdin_at_end] == ["run the slow thing", "STEER: use the blue one"]
    assert len({f["session_id"] for f in stdin_at_end}) == 1
    assert len(before_the_tool) == (2 if when == "during_the_call" else 1)
    # The model: not in the first call; in the second, with the tool's result.
    first_call, second_call = server.requests
    assert "blue one" not in json.dumps(first_call.body["messages"])
    assert FOLDED in last_user(second_call) and "STEER: use the blue one" in last_user(second_call)
    # Stored as the gateway learnt them: the steer before the round's tool results.
    assert [(m["role"], m["content"][0]["type"]) for m in listed] == [
        ("user", "text"),
        ("assistant", "text"),
        ("user", "text"),
        ("user", "tool_result"),
        ("assistant", "text"),
    ]
    assert listed[2]["content"][0]["text"] == "STEER: use the blue one"
    assert {m["turn_id"] for m in listed} == {a}
    done = events[-1].payload
    assert done.stop_reason == "end_turn"
    # One result for both queries: the turn's cost is the CLI's total for its two calls.
    assert done.cost_usd == pytest.approx((100 * 3 + 30 * 15 + 25 * 3 + 15 * 15) / 1e6)
    only_model_calls(server)


async def test_a_steer_while_claude_code_waits_for_a_permission_is_handed_over_at_once(
    tmp_path: Path, server: FakeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The CLI waits for the decision: the steer wakes the wait and goes to it before the
    decision, which then comes with the tool's result to the model."""
    server.enqueue(Replay(transcript("claude-code/bash_touch.sse")), TEXT)
    written = stdin(monkeypatch)
    config, providers = await gateway(tmp_path, server, monkeypatch)
    async with running_gateway(config, providers) as gw:
        sid = await gw.create_session()
        async with gw.client(sid) as client:
            await client.subscribe()
            _, first = await post(gw, sid, "make the file")
            asked = (await client.until(lambda e: e.type == "permission.requested"))[-1]
            steer = await post(gw, sid, "STEER: call it blue.txt", if_busy="steer")
            with trio.fail_after(10):  # no decision yet: the steer alone moves the turn
                await client.until(lambda e: e.type == "turn.steered")
            assert [said(f) for f in written][-1] == "STEER: call it blue.txt"
            await decide(gw, sid, asked.payload.perm_id, "allow")
            events = await ended(client, 1)
    await providers.aclose()
    assert steer == (202, {"turn_id": first["turn_id"], "steered": True})
    order = types(client.events)
    assert (
        order.index("permission.requested")
        < order.index("turn.steered")
        < order.index("permission.resolved")
        < order.index("tool.completed")
    )
    assert events[-1].type == "turn.completed" and "turn.queued" not in order
    assert FOLDED in last_user(server.requests[1]) and "blue.txt" in last_user(server.requests[1])
    only_model_calls(server)


@pytest.mark.parametrize("when", ["during_the_last_call", "after_the_last_message"])
async def test_a_steer_the_cli_turn_can_no_longer_take_is_one_queued_turn(
    tmp_path: Path, server: FakeServer, monkeypatch: pytest.MonkeyPatch, when: str
) -> None:
    """No tool step is left: the steer is never written to the running CLI turn; it becomes
    one queued turn, whose prompt reaches the CLI once. ``after_the_last_message``: the
    CLI has sent the call's end, and the turn's result is held until the steer is in."""
    server.enqueue(Replay(transcript("anthropic/text.sse"), delay_s=1.0), TEXT)
    written = stdin(monkeypatch)
    gate = trio.Event()
    if when == "after_the_last_message":
        from gateway.runtimes.claude_code import runtime as cc

        message = cc.ClaudeCode._message

        async def held(self: Any, turn: Any, state: Any, msg: Any) -> Any:
            if type(msg).__name__ == "ResultMessage":
                await gate.wait()
            return await message(self, turn, state, msg)

        monkeypatch.setattr(cc.ClaudeCode, "_message", held)
    else:
        gate.set()
    config, providers = await gateway(tmp_path, server, monkeypatch)
    async with running_gateway(config, providers) as gw:
        sid = await gw.create_session()
        async with gw.client(sid) as client:
            await client.subscribe()
            _, first = await post(gw, sid, "a plain question")
            if when == "after_the_last_message":
                await client.until(lambda e: e.type == "llm.call_completed")
            else:
                with trio.fail_after(20):
                    while not server.requests:  # noqa: ASYNC110 (the CLI's call is in)
                        await trio.sleep(0.02)
            steer = await post(gw, sid, "LATE words", if_busy="steer")
            gate.set()
            await ended(client, 2)
    await providers.aclose()
    a = first["turn_id"]
    assert steer == (202, {"turn_id": a, "steered": True})
    kinds = turn_kinds(client.events)
    late = kinds[2][1]
    assert kinds == [
        ("turn.started", a),
        ("turn.completed", a),
        ("turn.queued", late),
        ("turn.started", late),
        ("turn.completed", late),
    ]
    assert [said(f) for f in written] == ["a plain question", "LATE words"]  # once
    assert "LATE" not in json.dumps(server.requests[0].body["messages"])
    assert json.dumps(server.requests[1].body["messages"]).count("LATE words") == 1
    only_model_calls(server)


async def test_a_steer_while_the_turn_is_cancelling_is_queued_at_once(
    tmp_path: Path, server: FakeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cancel's ``interrupt()`` is held: the turn is cancelling when the steer comes."""
    server.enqueue(Replay(transcript("claude-code/bash_touch.sse")), TEXT)
    written = stdin(monkeypatch)
    from gateway.runtimes.claude_code.process import CliProcess

    gate, cancelling = trio.Event(), trio.Event()
    interrupt = CliProcess.interrupt

    async def held(self: Any) -> None:
        cancelling.set()
        with trio.CancelScope(shield=True):  # as the interrupt itself is: the turn's cancelled
            await gate.wait()
        await interrupt(self)

    monkeypatch.setattr(CliProcess, "interrupt", held)
    config, providers = await gateway(tmp_path, server, monkeypatch)
    async with running_gateway(config, providers) as gw:
        sid = await gw.create_session()
        async with gw.client(sid) as client:
            await client.subscribe()
            _, first = await post(gw, sid, "make the file")
            await client.until(lambda e: e.type == "permission.requested")
            a = first["turn_id"]
            r = await gw.http.post(f"/sessions/{sid}/turns/{a}/cancel", json={})
            assert r.status_code == 202, r.text
            with trio.fail_after(10):
                await cancelling.wait()
            steer = await post(gw, sid, "after the cancel", if_busy="steer")
            gate.set()
            events = await ended(client, 2)
    await providers.aclose()
    status, body = steer
    assert status == 202 and body == {"turn_id": body["turn_id"], "queued": True, "position": 1}
    assert turn_kinds(client.events) == [
        ("turn.started", a),
        ("turn.queued", body["turn_id"]),
        ("turn.cancelled", a),
        ("turn.started", body["turn_id"]),
        ("turn.completed", body["turn_id"]),
    ]
    assert "turn.steered" not in types(events)
    assert [said(f) for f in written] == ["make the file", "after the cancel"]
    assert "after the cancel" in last_user(server.requests[-1])
    only_model_calls(server)


async def test_three_queued_claude_code_turns_run_in_order_and_a_cancelled_one_never_starts(
    tmp_path: Path, server: FakeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    server.enqueue(Replay(transcript("claude-code/bash_touch.sse")), TEXT, TEXT, TEXT)
    written = stdin(monkeypatch)
    config, providers = await gateway(tmp_path, server, monkeypatch)
    async with running_gateway(config, providers) as gw:
        sid = await gw.create_session()
        async with gw.client(sid) as client:
            await client.subscribe()
            _, first = await post(gw, sid, "make the file")
            asked = (await client.until(lambda e: e.type == "permission.requested"))[-1]
            answers = [await post(gw, sid, t, if_busy="queue") for t in ("Bee", "Cee", "Dee")]
            b, c, d = (body["turn_id"] for _, body in answers)
            r = await gw.http.post(f"/sessions/{sid}/turns/{c}/cancel", json={})
            assert r.status_code == 202, r.text
            await decide(gw, sid, asked.payload.perm_id, "allow")
            events = await ended(client, 4)
    await providers.aclose()
    assert [(s, body["position"]) for s, body in answers] == [(202, 1), (202, 2), (202, 3)]
    a = first["turn_id"]
    ends = [k for k in turn_kinds(client.events) if k[0] != "turn.queued"]
    assert ends == [
        ("turn.started", a),
        ("turn.cancelled", c),
        ("turn.completed", a),
        ("turn.started", b),
        ("turn.completed", b),
        ("turn.started", d),
        ("turn.completed", d),
    ]
    [cancelled] = [e for e in events if e.type == "turn.cancelled"]
    assert cancelled.payload.phase == "queued"
    assert [said(f) for f in written] == ["make the file", "Bee", "Dee"]  # Cee never
    assert len(server.requests) == 4  # A's two calls, B's, D's
    assert "Bee" in last_user(server.requests[2]) and "Dee" in last_user(server.requests[3])
    assert "Cee" not in json.dumps([r.body["messages"] for r in server.requests])
    only_model_calls(server)


@pytest.mark.parametrize("phase", ["llm", "tools"])
async def test_interrupt_ends_the_running_cli_turn_with_its_sequence_then_starts(
    tmp_path: Path, server: FakeServer, monkeypatch: pytest.MonkeyPatch, phase: str
) -> None:
    """The running turn is cancelled (``interrupted``, the section 8 sequence of its phase),
    the CLI interrupted, not restarted; the interrupting turn runs on it, then the queue."""
    if phase == "llm":
        body = transcript("anthropic/thinking_text.sse")
        server.enqueue(Replay(body, cut=Cut(body.index(b"signature_delta"), "stall")))
    else:
        server.enqueue(slow_bash(30))
    server.enqueue(TEXT, TEXT)
    written = stdin(monkeypatch)
    config, providers = await gateway(tmp_path, server, monkeypatch)
    async with running_gateway(config, providers) as gw:
        sid = await gw.create_session()
        async with gw.client(sid) as client:
            await client.subscribe()
            _, first = await post(gw, sid, "go")
            if phase == "llm":
                await client.until(lambda e: e.type == "thinking.delta")
            else:  # allowed: it runs (an unasked one would be the seam's, section 11)
                asked = (await client.until(lambda e: e.type == "permission.requested"))[-1]
                await decide(gw, sid, asked.payload.perm_id, "allow")
                await tool_started(gw, sid)
            pid = pid_of(gw, sid)
            _, queued = await post(gw, sid, "queued words", if_busy="queue")
            status, body = await post(gw, sid, "interrupting words", if_busy="interrupt")
            events = await ended(client, 3)
            assert pid_of(gw, sid) == pid  # the interrupted CLI goes on
    await providers.aclose()
    assert status == 202 and body == {"turn_id": body["turn_id"]}
    a, b, q = first["turn_id"], body["turn_id"], queued["turn_id"]
    assert turn_kinds(client.events) == [
        ("turn.started", a),
        ("turn.queued", q),
        ("turn.cancelled", a),
        ("turn.started", b),
        ("turn.completed", b),
        ("turn.started", q),
        ("turn.completed", q),
    ]
    [cancelled] = [e for e in events if e.type == "turn.cancelled"]
    assert (cancelled.payload.reason, cancelled.payload.phase) == ("interrupted", phase)
    before = [t for t in types(events)[: types(events).index("turn.cancelled")] if "delta" not in t]
    if phase == "llm":
        assert before[-3:] == ["thinking.end", "message.complete", "llm.call_failed"]
    else:
        assert before[-1] == "tool.failed"
        failed = next(e for e in events if e.type == "tool.failed").payload
        assert failed.error_class == "cancelled"
    assert [e.payload.stop_reason for e in events if e.type == "turn.completed"] == [
        "end_turn",
        "end_turn",
    ]
    assert [said(f) for f in written] == ["go", "interrupting words", "queued words"]
    assert "interrupting words" in last_user(server.requests[1])
    assert "queued words" in last_user(server.requests[2])
    only_model_calls(server)


async def test_a_steer_claude_code_answers_as_a_query_of_its_own_ends_the_turn_once(
    tmp_path: Path, server: FakeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``max_rounds = 1``: the query stops at its limit after the tool (``error_max_turns``),
    and Claude Code answers the steer it was given as one more query before it is idle.
    Two results, one ``turn.completed``: the last result's stop reason, both queries' cost."""
    server.enqueue(slow_bash(2), TEXT)
    written = stdin(monkeypatch)
    config, providers = await gateway(
        tmp_path, server, monkeypatch, require_approval="[]", max_rounds="1"
    )
    async with running_gateway(config, providers) as gw:
        sid = await gw.create_session()
        async with gw.client(sid) as client:
            await client.subscribe()
            _, first = await post(gw, sid, "run the slow thing")
            await tool_started(gw, sid)
            steer = await post(gw, sid, "STEER: and then stop", if_busy="steer")
            events = await ended(client, 1)
            again = await gw.http.post(f"/sessions/{sid}/turns", json={"content": "next"})
            assert again.status_code == 202  # the session is idle: nothing left queued
            await ended(client, 1)
    await providers.aclose()
    assert steer == (202, {"turn_id": first["turn_id"], "steered": True})
    order = [t for t in types(events) if "delta" not in t]
    assert order.count("turn.completed") == 1 and "turn.queued" not in order
    assert order.count("llm.call_started") == order.count("llm.call_completed") == 2
    assert (
        order.index("turn.steered") < [i for i, t in enumerate(order) if t == "llm.call_started"][1]
    )
    done = events[-1].payload
    assert done.stop_reason == "end_turn"
    assert done.cost_usd == pytest.approx((100 * 3 + 30 * 15 + 25 * 3 + 15 * 15) / 1e6)
    assert [said(f) for f in written] == ["run the slow thing", "STEER: and then stop", "next"]
    assert "STEER: and then stop" in last_user(server.requests[1])
    assert len(server.requests) == 3
    only_model_calls(server)


async def test_a_steer_handed_over_then_cancelled_leaves_the_cli_to_the_next_turn(
    tmp_path: Path, server: FakeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The steer went to the CLI while it waited for a permission; the turn is cancelled
    then. Claude Code answers the steer after the interrupt, before it is idle: the next
    turn drops that answer (as the interrupted query's) and gets its own."""
    server.enqueue(Replay(transcript("claude-code/bash_touch.sse")), TEXT, TEXT)
    written = stdin(monkeypatch)
    config, providers = await gateway(tmp_path, server, monkeypatch)
    async with running_gateway(config, providers) as gw:
        sid = await gw.create_session()
        async with gw.client(sid) as client:
            await client.subscribe()
            _, first = await post(gw, sid, "make the file")
            await client.until(lambda e: e.type == "permission.requested")
            await post(gw, sid, "STEER: never mind", if_busy="steer")
            await client.until(lambda e: e.type == "turn.steered")
            a = first["turn_id"]
            r = await gw.http.post(f"/sessions/{sid}/turns/{a}/cancel", json={})
            assert r.status_code == 202, r.text
            cancelled = await ended(client, 1)
            pid = pid_of(gw, sid)
            _, second = await post(gw, sid, "a new question")
            following = await ended(client, 1)
            assert pid_of(gw, sid) == pid
    await providers.aclose()
    assert cancelled[-1].type == "turn.cancelled" and cancelled[-1].payload.phase == "seam"
    assert "turn.queued" not in types(client.events)
    assert turn_kinds(following) == [
        ("turn.started", second["turn_id"]),
        ("turn.completed", second["turn_id"]),
    ]
    assert [said(f) for f in written] == ["make the file", "STEER: never mind", "a new question"]
    # The CLI answered the steer (a call no client saw), then the new question.
    assert "STEER: never mind" in last_user(server.requests[1])
    assert "a new question" in last_user(server.requests[2])
    only_model_calls(server)

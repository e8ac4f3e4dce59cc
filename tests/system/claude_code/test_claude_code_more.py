"""``runtime = "claude-code"``, continued: processes, failures, MCP servers, sub-agents, compaction.

Offline as :mod:`tests.system.claude_code.test_claude_code`: the real CLI, the fake Anthropic
API, every request it made a model call.
"""

from __future__ import annotations

import functools
import json
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import h11
import pytest
import trio

from bench.fake_api import FakeServer, Replay, transcript
from bench.fake_api.server import Cut, Json, Recorded, Reply
from tests.claude_code_support import (
    CLAUDE_CODE_MARKS,
    alive,
    decide,
    gateway,
    only_model_calls,
    run_turn,
)
from tests.claude_code_support import server as server
from tests.conftest import Harness, running_gateway, types
from tests.mcp_support import EVERYTHING

pytestmark = CLAUDE_CODE_MARKS


async def at_once(gw: Harness, turns: dict[str, str]) -> dict[str, list[Any]]:
    """A turn of each session (its content), side by side: their CLIs start at once."""
    done: dict[str, list[Any]] = {}

    async def one(sid: str, content: str) -> None:
        done[sid] = await run_turn(gw, sid, content)

    async with trio.open_nursery() as nursery:
        for sid, content in turns.items():
            nursery.start_soon(one, sid, content)
    return done


def runtime_of(gw: Harness, sid: str) -> Any:
    runtime = gw.node.sessions[sid].agent.runtime  # type: ignore[union-attr]
    assert runtime is not None
    return runtime


async def test_max_processes_an_idle_process_makes_room_a_busy_one_is_a_503_after_a_bounded_wait(
    tmp_path: Path, server: FakeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``max_processes = 1``: B's turn stops A's idle CLI; A's turn while B's runs waits, then 503.

    Once B is idle again, A's turn stops B's CLI and A's new CLI resumes A's conversation.
    """
    server.enqueue(
        Replay(transcript("anthropic/text.sse")),  # A's first turn
        Replay(transcript("claude-code/bash_touch.sse")),  # B's, which asks to run Bash
        Replay(transcript("anthropic/text.sse")),  # B's, once allowed
        Replay(transcript("anthropic/text.sse")),  # A's second turn
    )
    config, providers = await gateway(tmp_path, server, monkeypatch, max_processes="1")
    async with running_gateway(config, providers) as gw:
        slots_ = gw.node.process_slots
        a, b = await gw.create_session(), await gw.create_session()
        await run_turn(gw, a, "first words APPLE")
        a_pid = runtime_of(gw, a).transport.pid
        assert slots_.held("default") == 1
        async with gw.client(b) as client:
            await client.subscribe()
            await gw.submit(b, "make the file")  # A is idle: stopped to make room
            assert not alive(a_pid) and runtime_of(gw, a).client is None
            asked = (await client.until(lambda e: e.type == "permission.requested"))[-1]
            # B's turn is in flight: no idle process; A's turn waits, then is refused.
            slots_.wait_s = 0.5  # [tools] process_slot_wait_s
            started = trio.current_time()
            r = await gw.http.post(f"/sessions/{a}/turns", json={"content": "second words"})
            waited = trio.current_time() - started
            assert r.status_code == 503, r.text
            assert r.json()["error"]["code"] == "over_capacity"
            assert r.headers["Retry-After"] == "1"
            assert 0.5 <= waited < 2.0, waited
            assert gw.node.sessions[a].turn is None and not slots_.holds("default", a)
            slots_.wait_s = 10.0  # stopping B (A's turn below) may take longer
            await decide(gw, b, asked.payload.perm_id, "allow")
            b_events = await client.until_turn_ends()
        b_pid = runtime_of(gw, b).transport.pid
        resumed = await run_turn(gw, a, "second words BANANA")  # B is idle: stopped
        assert not alive(b_pid) and slots_.held("default") == 1
        assert slots_.holds("default", a)
    await providers.aclose()
    assert b_events[-1].payload.stop_reason == "end_turn"
    assert resumed[-1].payload.stop_reason == "end_turn"
    last = str(server.requests[-1].body["messages"])
    assert "APPLE" in last and "BANANA" in last  # A's new CLI resumed A's transcript
    assert "make the file" not in last
    assert len(server.requests) == 4  # the refused turn never reached the model
    only_model_calls(server)


async def test_a_cli_killed_mid_turn_closes_the_turn_and_the_next_turn_resumes(
    tmp_path: Path, server: FakeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """kill -9 of the CLI's group while the model streams (``llm``) or a permission waits
    (``seam``): the turn ends ``llm.call_failed`` ``network`` then ``turn.completed``
    ``error``; the next turn's new CLI resumes the conversation."""
    body = transcript("anthropic/thinking_text.sse")
    server.enqueue(
        Replay(transcript("anthropic/text.sse")),  # A's first turn, answered
        Replay(transcript("anthropic/text.sse")),  # B's
        Replay(body, cut=Cut(body.index(b"signature_delta"), "stall")),  # A: killed streaming
        Replay(transcript("claude-code/bash_touch.sse")),  # B: killed while it asks
        Replay(transcript("anthropic/text.sse")),  # A's next turn
        Replay(transcript("anthropic/text.sse")),  # B's
    )
    config, providers = await gateway(tmp_path, server, monkeypatch)
    crashed: dict[str, list[Any]] = {}
    pids: dict[str, int] = {}
    async with running_gateway(config, providers) as gw:
        a, b = await gw.create_session(), await gw.create_session()
        await at_once(gw, {a: "zero words CHERRY", b: "zero words DATE"})
        for sid, words, ready in (
            (a, "first words APPLE", "thinking.delta"),
            (b, "first words BANANA", "permission.requested"),
        ):
            async with gw.client(sid) as client:
                await client.subscribe()
                await gw.submit(sid, words)
                await client.until(functools.partial(is_type, ready))
                pids[sid] = pid = runtime_of(gw, sid).transport.pid
                os.killpg(pid, signal.SIGKILL)
                with trio.fail_after(5):
                    await client.until_turn_ends()
                crashed[sid] = client.events
            assert gw.node.sessions[sid].permissions.pending() == []
        after = await at_once(gw, {a: "second words", b: "second words"})
        for sid in (a, b):
            assert runtime_of(gw, sid).transport.pid != pids[sid]
    await providers.aclose()
    for sid in (a, b):
        events = crashed[sid]
        failed = next(e for e in events if e.type == "llm.call_failed").payload
        assert failed.error_class == "network"
        assert events[-1].type == "turn.completed" and events[-1].payload.stop_reason == "error"
        assert after[sid][-1].payload.stop_reason == "end_turn"
    tail = [t for t in types(crashed[a]) if t not in ("thinking.delta", "text.delta")]
    assert tail[-4:] == ["thinking.end", "message.complete", "llm.call_failed", "turn.completed"]
    tail_b = types(crashed[b])
    assert tail_b.index("tool.called") < tail_b.index("permission.resolved")
    resolved = next(e for e in crashed[b] if e.type == "permission.resolved").payload
    assert resolved.decision == "cancelled"
    assert next(e for e in crashed[b] if e.type == "tool.failed").payload.error_class == "error"
    # What was answered before the crash is in the resumed transcript; the cut turn's
    # prompt only if the killed CLI had written it (Claude Code's timing, not asserted).
    resumed = [str(r.body["messages"]) for r in server.requests[4:]]
    assert len(resumed) == 2 and all("second words" in said for said in resumed)
    # One is A's, the other B's (the two turns ran at once: in either order).
    assert sorted(("CHERRY" in said, "DATE" in said) for said in resumed) == [
        (False, True),
        (True, False),
    ]
    only_model_calls(server)


async def test_api_errors_are_their_llm_call_failed_classes(
    tmp_path: Path, server: FakeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 400, a 529 and a 429 of the API, as the CLI reports them (``[model] max_retries = 0``
    is its ``CLAUDE_CODE_MAX_RETRIES``): ``invalid_request``, ``overloaded``, ``rate_limited``.

    The CLI sends a refused call (400) twice more on its own, the first time
    with fewer ``anthropic-beta`` headers, whatever ``max_retries`` says (with
    thinking off, its third has them back)."""
    cases = {
        "invalid_request": Json(400, error("invalid_request_error", "messages.0: bad role")),
        "overloaded": Json(529, error("overloaded_error", "Overloaded")),
        "rate_limited": Json(429, error("rate_limit_error", "slow down")),
    }
    # The CLI tries a 400 twice more, each time with fewer beta headers: three refusals.
    bad = cases["invalid_request"]
    server.enqueue(bad, bad, *cases.values(), Replay(transcript("anthropic/text.sse")))
    config, providers = await gateway(tmp_path, server, monkeypatch)
    async with running_gateway(config, providers) as gw:
        sid = await gw.create_session()
        outcomes = [await run_turn(gw, sid, f"try {name}") for name in cases]
        last = await run_turn(gw, sid, "and now?")
    await providers.aclose()
    for name, events in zip(cases, outcomes, strict=True):
        assert types(events)[-3:] == ["llm.call_started", "llm.call_failed", "turn.completed"]
        assert events[-2].payload.error_class == name, events[-2].payload
        assert events[-1].payload.stop_reason == "error"
    assert last[-1].payload.stop_reason == "end_turn"
    assert len(server.requests) == 6  # none retried but the 400 (docstring)
    betas = [len(r.headers["anthropic-beta"].split(",")) for r in server.requests[:3]]
    assert betas[0] > betas[1]
    only_model_calls(server)


def error(kind: str, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": kind, "message": message}}


def is_type(name: str, e: Any) -> bool:
    return bool(e.type == name)


MCP_TABLES = f"""
[mcp_servers.everything]
command = {json.dumps(EVERYTHING)}
env = {{ MCP_TEST_ENV = "from-config" }}

[mcp_servers.elsewhere]
url = "http://127.0.0.1:9/mcp"
headers = {{ authorization = "Bearer t" }}
"""


async def test_an_mcp_tool_through_the_cli(
    tmp_path: Path, server: FakeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The model calls ``mcp__everything__echo``: Claude Code runs it on the configured
    server, without asking (not in ``require_approval``); the events are the native ones.

    The server is slow to start: the first query still offers its tools."""
    server.enqueue(
        Replay(transcript("claude-code/mcp_echo.sse")), Replay(transcript("anthropic/text.sse"))
    )
    # The server starts a second late, as a loaded machine's may: the CLI's first
    # query waits for it (MCP_CONNECTION_NONBLOCKING=0), so the model is offered its tools.
    late = ["/bin/sh", "-c", 'sleep 1 && exec "$@"', "sh", *EVERYTHING]
    tables = MCP_TABLES.partition("[mcp_servers.elsewhere]")[0]
    tables = tables.replace(json.dumps(EVERYTHING), json.dumps(late))
    tools = '["Bash", "mcp__everything__*"]'
    config, providers = await gateway(tmp_path, server, monkeypatch, tables, tools=tools)
    async with running_gateway(config, providers) as gw:
        sid = await gw.create_session()
        events = await run_turn(gw, sid, "echo something")
    await providers.aclose()
    assert [t for t in types(events) if t.startswith(("tool.c", "tool.f", "permission."))] == [
        "tool.called",
        "tool.completed",
    ]
    done = next(e for e in events if e.type == "tool.completed").payload
    assert done.tool_name == "mcp__everything__echo" and done.result == "hello through MCP"
    assert events[-1].payload.stop_reason == "end_turn"
    offered = [t["name"] for t in server.requests[0].body.get("tools", [])]
    assert "mcp__everything__echo" in offered, offered
    only_model_calls(server)


async def test_a_sub_agent_is_a_worker_session_whose_approval_reaches_the_parent(
    tmp_path: Path, server: FakeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The model calls ``Agent``; the sub-agent runs Bash (approved through the parent's
    permissions route), then answers; the main thread then answers.

    The parent's stream: ``tool.called`` (Agent), ``delegate.started``,
    ``delegate.completed``, ``tool.completed``. The worker's (a session with
    ``parent_session_id``): a whole turn, its messages, its Bash call and permission.
    """
    server.enqueue(
        Replay(transcript("claude-code/agent_call.sse")),  # main: Agent(...)
        Replay(transcript("claude-code/bash_touch.sse")),  # the sub-agent: Bash
        Replay(transcript("anthropic/text.sse")),  # the sub-agent's answer
        Replay(transcript("anthropic/text.sse")),  # main's answer
    )
    config, providers = await gateway(tmp_path, server, monkeypatch, tools='["Bash", "Agent"]')
    async with running_gateway(config, providers) as gw:
        sid = await gw.create_session()
        async with gw.client(sid) as client:
            await client.subscribe(WITH_WORKERS)
            await gw.submit(sid, "delegate it")
            asked = (await client.until(functools.partial(is_type, "permission.requested")))[-1]
            worker_id = asked.session_id
            pending = gw.node.sessions[sid].pending_permissions()  # the parent's view
            await decide(gw, sid, asked.payload.perm_id, "allow")  # from the parent
            await client.until(functools.partial(ends, sid))
            events = client.events
        worker = gw.node.sessions[worker_id].record
        workspace = gw.node.workspaces.host_path(gw.node.sessions[sid].record.workspace_path)
        made = os.path.exists(os.path.join(workspace, "made.txt"))  # noqa: ASYNC240
        # A turn sent to the sub-agent's session would start an unrelated conversation.
        straight = await gw.http.post(f"/sessions/{worker_id}/turns", json={"content": "hi"})
        with_file = await gw.http.post(f"/sessions/{worker_id}/turns", json={"content": [
            {"type": "document", "source": {"type": "base64", "media_type": "text/plain",
                                            "data": "aGk="}}]})  # fmt: skip
        kept = await gw.node.files.records(worker_id)  # a refused turn keeps no file
        forked = await gw.http.post(f"/sessions/{worker_id}/fork", json={})  # nor is it forked
    await providers.aclose()
    assert straight.status_code == 409, straight.text
    assert straight.json()["error"]["code"] == "subagent_session"
    assert f"send turns to {sid}" in straight.json()["error"]["message"]
    assert (with_file.status_code, kept) == (409, {}), with_file.text
    assert forked.status_code == 409 and forked.json()["error"]["code"] == "worker_session"
    assert f"fork {sid}" in forked.json()["error"]["message"]
    assert worker_id != sid and worker.parent_session_id == sid
    assert [p.session_id for p in pending] == [worker_id]
    mine = [e.type for e in events if e.session_id == sid]
    theirs = [e.type for e in events if e.session_id == worker_id]
    tools = [t for t in mine if t.startswith(("tool.c", "delegate."))]
    assert tools == ["tool.called", "delegate.started", "delegate.completed", "tool.completed"], (
        str(mine)
    )
    assert mine[-1] == "turn.completed"
    started = next(e for e in events if e.type == "delegate.started").payload
    assert started.worker_session_id == worker_id
    assert started.task == "Create the file made.txt with touch."
    completed = next(e for e in events if e.type == "delegate.completed").payload
    assert completed.result == "Hello, world!"
    assert theirs[:3] == ["turn.started", "route.decided", "llm.call_started"]
    assert [t for t in theirs if t.startswith(("tool.c", "permission.", "turn.c"))] == [
        "tool.called",
        "permission.requested",
        "permission.resolved",
        "tool.completed",
        "turn.completed",
    ]
    # Its Bash call, then its report (the Agent tool's result, unframed) as its last message.
    assert theirs.count("message.complete") == 2 and "tool.use_input_delta" in theirs
    worker_done = [e for e in events if e.session_id == worker_id][-1].payload
    assert worker_done.stop_reason == "end_turn"
    assert made
    only_model_calls(server)


AGENT_TOOL_USE_ID = "toolu_01Agent0000001"  # claude-code/agent_call*.sse's Agent call
WITH_WORKERS = {"event_types": None, "actors": None, "include_worker_sessions": True}


def ends(session_id: str, e: Any) -> bool:
    return bool(e.type in ("turn.completed", "turn.cancelled") and e.session_id == session_id)


async def test_post_compact_is_claude_codes_own_shown_as_the_native_loops(
    tmp_path: Path, server: FakeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``POST /sessions/{id}/compact`` sends Claude Code's ``/compact``: ``context.compacting``
    comes when it starts (its summary call still under way), ``context.compacted`` at its
    boundary, naming the stored ``context`` message whose ``compaction`` block holds Claude
    Code's summary and replaces every earlier message, as the native loop's does."""
    text = [
        Replay(transcript("anthropic/text.sse").replace(b"XFDUDYJgAACzvnptvVoYEL", b"Text%d" % n))
        for n in range(3)
    ]  # each answer a message of its own id
    summary = Replay(transcript("claude-code/compact_summary.sse"), delay_s=1.0)
    server.enqueue(text[0], text[1], summary, text[2])
    config, providers = await gateway(tmp_path, server, monkeypatch)
    async with running_gateway(config, providers) as gw:
        sid = await gw.create_session()
        await run_turn(gw, sid, "first words APPLE")
        await run_turn(gw, sid, "more words")  # one turn alone: 409 nothing_to_compact
        before = [
            m["id"] for m in (await gw.http.get(f"/sessions/{sid}/messages")).json()["messages"]
        ]
        async with gw.client(sid) as client:
            await client.subscribe()
            r = await gw.http.post(f"/sessions/{sid}/compact", json={})
            assert r.status_code == 202, r.text
            with trio.fail_after(20):
                await client.until(functools.partial(is_type, "context.compacting"))
                started = trio.current_time()
                await client.until(functools.partial(is_type, "context.compacted"))
                took = trio.current_time() - started
            events = client.events
        after = await run_turn(gw, sid, "second words")
        stored = (await gw.http.get(f"/sessions/{sid}/messages")).json()["messages"]
        cost = gw.node.sessions[sid].record.cost_so_far_usd
        again = await gw.http.post(f"/sessions/{sid}/compact", json={})
    await providers.aclose()
    compacting, compacted = (e for e in events if e.type.startswith("context."))
    assert took >= 0.8  # compacting came as it started, not with its end
    assert (compacting.type, compacting.turn_id, compacted.turn_id) == (
        "context.compacting",
        None,
        None,
    )
    assert compacting.payload.trigger == compacted.payload.trigger == "manual"
    assert compacting.payload.pre_tokens > 0  # the gateway's estimate, as the native loop's
    assert compacted.payload.method == "summary"
    assert compacted.payload.pre_tokens > 0 and compacted.payload.post_tokens > 0  # Claude Code's
    assert compacted.payload.first_kept_message_id is None  # its summary stands for all
    [context] = [m for m in stored if m["role"] == "context"]
    assert compacted.payload.summary_message_id == context["id"]
    assert context["turn_id"] is None and context["status"] == "complete"
    [block] = context["content"]
    assert block == {
        "type": "compaction",
        "summary": "The user said words; the code word was MANGO.",
        "replaces": before,
    }
    assert [m["id"] for m in stored].index(context["id"]) == len(before)  # after them
    assert len(before) == 4 and len(stored) == 7  # nothing lost for the clients
    assert again.status_code == 409, again.text  # only the latest turn since: nothing_to_compact
    assert after[-1].payload.stop_reason == "end_turn"
    summary_call = str(server.requests[2].body["messages"])
    assert "APPLE" in summary_call  # the summary call saw the conversation
    last = str(server.requests[3].body["messages"])
    assert "MANGO" in last and "second words" in last  # the summary, then the turn
    assert "APPLE" not in last  # compacted away
    assert cost == pytest.approx(4 * (25 * 3 + 15 * 15) / 1e6)  # the summary call's included
    only_model_calls(server)


async def test_cancelling_the_parent_cancels_the_sub_agents_worker_first(
    tmp_path: Path, server: FakeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cancel while the sub-agent's Bash waits for approval: the worker's turn is cancelled
    in its stream (its request resolved ``cancelled``), then the parent's
    ``delegate.failed`` (``cancelled_by_user``), ``tool.failed`` and ``turn.cancelled``."""
    server.enqueue(
        Replay(transcript("claude-code/agent_call.sse")),
        Replay(transcript("claude-code/bash_touch.sse")),
        # The next turn's; and a spare: the interrupted sub-agent may make one more call
        # after the cancel (Claude Code's timing), which would take the next turn's reply.
        Replay(transcript("anthropic/text.sse")),
        Replay(transcript("anthropic/text.sse")),
    )
    config, providers = await gateway(tmp_path, server, monkeypatch, tools='["Bash", "Agent"]')
    async with running_gateway(config, providers) as gw:
        sid = await gw.create_session()
        async with gw.client(sid) as client:
            await client.subscribe(WITH_WORKERS)
            turn_id = await gw.submit(sid, "delegate it")
            asked = (await client.until(functools.partial(is_type, "permission.requested")))[-1]
            worker_id = asked.session_id
            started = trio.current_time()
            r = await gw.http.post(f"/sessions/{sid}/turns/{turn_id}/cancel", json={})
            assert r.status_code in (200, 202), r.text
            await client.until(functools.partial(ends, sid))
            took = trio.current_time() - started
            events = client.events
        assert gw.node.sessions[sid].pending_permissions() == []
        next_turn = await run_turn(gw, sid, "still there?")
    await providers.aclose()
    assert took < 2.0, took
    mine = [e.type for e in events if e.session_id == sid]
    theirs = [e.type for e in events if e.session_id == worker_id]
    assert theirs[-3:] == ["permission.resolved", "tool.failed", "turn.cancelled"]
    assert mine[-3:] == ["delegate.failed", "tool.failed", "turn.cancelled"]
    failed = next(e for e in events if e.type == "delegate.failed").payload
    assert failed.failure_mode == "cancelled_by_user" and failed.worker_session_id == worker_id
    order = [(e.session_id, e.type) for e in events]
    assert order.index((worker_id, "turn.cancelled")) < order.index((sid, "delegate.failed"))
    assert next_turn[-1].payload.stop_reason == "end_turn"
    # The next turn's call is its own conversation's, whichever reply it took.
    assert any("still there?" in str(r.body["messages"]) for r in server.requests)
    only_model_calls(server)


class HeldServer(FakeServer):
    """The fake API, holding back its answer to each request ``held`` picks until
    :attr:`release` is set (the others are answered at once, in turn); a request
    ``routed`` has an answer for takes that one, not the next in turn."""

    def __init__(
        self,
        held: Callable[[Recorded], bool],
        routed: Callable[[Recorded], Reply | None] = lambda r: None,
    ) -> None:
        super().__init__()
        self.held = held
        self.routed = routed
        self.release = trio.Event()

    def _next_reply(self) -> Reply:
        return self.routed(self.requests[-1]) or super()._next_reply()

    async def _answer(self, conn: h11.Connection, stream: trio.SocketStream, reply: Reply) -> bool:
        # The request is the last recorded: it was recorded with no checkpoint since.
        if self.held(self.requests[-1]):
            await self.release.wait()
        return await super()._answer(conn, stream, reply)


GCD = "The GCD of 1071 and 462 is **21**."  # anthropic/thinking_text.sse's answer


def said(events: list[Any]) -> str:
    """The text of the last message a turn's events completed."""
    complete = [e for e in events if e.type == "message.complete"][-1].payload
    return "".join(getattr(b, "text", "") for b in complete.final_content)


@pytest.mark.parametrize("task_first", [True, False], ids=["task-ends-first", "answer-first"])
async def test_a_background_sub_agent_is_a_worker_and_the_turn_ends_when_claude_code_is_idle(
    tmp_path: Path, nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch, task_first: bool
) -> None:
    """Claude Code runs an ``Agent`` in the background unless told otherwise: its tool
    returns at once (``tool.completed``), the worker goes on, and ``delegate.completed``
    comes when its task does, with the sub-agent's last message.

    The task's notification wakes Claude Code's main thread for one more answer
    after the query's result: that answer is the turn's last call, and the turn
    ends once Claude Code says it is idle. So the session's next turn gets its own
    answer, not that one. Either order of the task's end and the main thread's
    answer (``task_first``: the fake API holds the main thread's answer until the
    worker's ``delegate.completed`` is out).
    """
    # The next turn's call takes its own answer, however many the CLI took before it.
    gcd = Replay(transcript("anthropic/thinking_text.sse"))
    server = HeldServer(
        lambda r: task_first and AGENT_TOOL_USE_ID in str(r.body["messages"]),
        lambda r: gcd if "and now?" in str(r.body["messages"]) else None,
    )
    if not task_first:
        server.release.set()
    await nursery.start(server.serve)
    text = Replay(transcript("anthropic/text.sse"))
    # The main thread's call, the sub-agent's, the main thread's answer to the tool's
    # result, its answer to the task's notification (when that is a query of its own).
    server.enqueue(Replay(transcript("claude-code/agent_call_background.sse")), text, text, text)
    config, providers = await gateway(tmp_path, server, monkeypatch, tools='["Bash", "Agent"]')
    async with running_gateway(config, providers) as gw:
        sid = await gw.create_session()
        async with gw.client(sid) as client:
            await client.subscribe(WITH_WORKERS)
            await gw.submit(sid, "delegate it")
            with trio.fail_after(30):
                await client.until(functools.partial(is_type, "delegate.completed"))
            server.release.set()
            with trio.fail_after(30):
                await client.until(functools.partial(ends, sid))
            events = client.events
        pid = runtime_of(gw, sid).transport.pid
        next_turn = await run_turn(gw, sid, "and now?")
        assert runtime_of(gw, sid).transport.pid == pid  # the CLI was idle: kept
    await providers.aclose()
    started = next(e for e in events if e.type == "delegate.started").payload
    worker_id = started.worker_session_id
    mine = [e.type for e in events if e.session_id == sid]
    theirs = [e.type for e in events if e.session_id == worker_id]
    calls = [t for t in mine if t.startswith(("tool.c", "delegate."))]
    assert calls[:2] == ["tool.called", "delegate.started"]
    if task_first:  # the worker's answer is held: its tool's result is read first
        assert calls[2:] == ["tool.completed", "delegate.completed"]
    else:  # the CLI's own race: a quick worker may end before its tool's result is read
        assert sorted(calls[2:]) == ["delegate.completed", "tool.completed"]
    completed = next(e for e in events if e.type == "delegate.completed").payload
    assert completed.result == "Hello, world!"
    assert theirs[0] == "turn.started" and theirs[-1] == "turn.completed"
    assert theirs.count("message.complete") == 1
    # The Agent call, the answer to its result, the answer to the task's notification:
    # a query of its own after the first's result; or, when the task ended before its
    # tool's result was sent (the CLI's own race, answer-first only), in the same call
    # as that result (one query, two calls). Every call of the turn ends before it does.
    answers = mine.count("llm.call_started")
    assert answers == mine.count("llm.call_completed") in ((3,) if task_first else (2, 3)), mine
    notified = [r for r in server.requests if "<task-notification>" in str(r.body["messages"])]
    assert "and now?" not in str(notified[0].body["messages"])  # answered within the turn
    assert mine.index("delegate.completed") < len(mine) - 1 - mine[::-1].index("llm.call_started")
    assert events[-1].type == "turn.completed" and events[-1].payload.stop_reason == "end_turn"
    assert said(next_turn) == GCD and types(next_turn).count("llm.call_started") == 1
    assert next_turn[-1].payload.stop_reason == "end_turn"
    only_model_calls(server)


async def test_a_cancel_stops_a_background_sub_agent_and_the_next_turn_is_its_own(
    tmp_path: Path, nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A turn cancelled while its background sub-agent still runs (the fake API holds
    the sub-agent's call): the worker's turn is cancelled first (``delegate.failed``
    ``cancelled_by_user``), Claude Code's interrupt stops its task too, and the
    session's next turn runs on the same CLI and gets its own answer."""

    def sub_agents(r: Recorded) -> bool:  # the sub-agent's call (its prompt, not the parent's)
        messages = str(r.body["messages"])
        return "made.txt" in messages and AGENT_TOOL_USE_ID not in messages

    # The next turn's call takes its own answer; Claude Code may answer the stopped
    # task's notification first (it does, as a query of its own).
    gcd = Replay(transcript("anthropic/thinking_text.sse"))
    server = HeldServer(sub_agents, lambda r: gcd if "and now?" in str(r.body) else None)
    await nursery.start(server.serve)
    text = Replay(transcript("anthropic/text.sse"))
    server.enqueue(Replay(transcript("claude-code/agent_call_background.sse")), text, text, text)
    config, providers = await gateway(tmp_path, server, monkeypatch, tools='["Bash", "Agent"]')
    async with running_gateway(config, providers) as gw:
        sid = await gw.create_session()
        async with gw.client(sid) as client:
            await client.subscribe(WITH_WORKERS)
            turn_id = await gw.submit(sid, "delegate it")

            def answered(e: Any) -> bool:  # the main thread's answer to the tool's result
                mine = [x.type for x in client.events if x.session_id == sid]
                return "delegate.started" in mine and mine.count("llm.call_completed") == 2

            with trio.fail_after(30):
                await client.until(answered)
            pid = runtime_of(gw, sid).transport.pid
            r = await gw.http.post(f"/sessions/{sid}/turns/{turn_id}/cancel", json={})
            assert r.status_code in (200, 202), r.text
            with trio.fail_after(30):
                await client.until(functools.partial(ends, sid))
            events = client.events
        next_turn = await run_turn(gw, sid, "and now?")
        assert runtime_of(gw, sid).transport.pid == pid  # the CLI went idle: kept
        server.release.set()
    await providers.aclose()
    worker_id = next(e for e in events if e.type == "delegate.started").payload.worker_session_id
    order = [(e.session_id, e.type) for e in events]
    assert order[-1] == (sid, "turn.cancelled")
    failed = next(e for e in events if e.type == "delegate.failed").payload
    assert failed.failure_mode == "cancelled_by_user" and failed.worker_session_id == worker_id
    assert order.index((worker_id, "turn.cancelled")) < order.index((sid, "delegate.failed"))
    assert said(next_turn) == GCD and types(next_turn).count("llm.call_started") == 1
    only_model_calls(server)


async def test_a_background_shell_is_its_tools_own_and_what_it_wakes_is_the_sessions(
    tmp_path: Path, nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ``Bash`` run in the background is no sub-agent (no ``delegate.*``, no worker).
    When it ends, Claude Code answers its notification in a query of its own, between
    turns: the next turn drops it (its own answer is its own) and its cost is the
    session's, so the session's cost is the CLI's running total."""
    gcd = Replay(transcript("anthropic/thinking_text.sse"))
    server = HeldServer(lambda r: False, lambda r: gcd if "and now?" in str(r.body) else None)
    await nursery.start(server.serve)
    text = Replay(transcript("anthropic/text.sse"))
    server.enqueue(Replay(transcript("claude-code/bash_background.sse")), text, text)
    config, providers = await gateway(
        tmp_path, server, monkeypatch, tools='["Bash"]', require_approval="[]"
    )
    async with running_gateway(config, providers) as gw:
        sid = await gw.create_session()
        first = await run_turn(gw, sid, "run it in the background")
        with trio.fail_after(30):  # the shell ends; Claude Code answers its notification
            while len(server.requests) < 3:  # noqa: ASYNC110 (the fake API has no event)
                await trio.sleep(0.05)
        next_turn = await run_turn(gw, sid, "and now?")
        session = gw.node.sessions[sid]
        cost, cli_total = session.record.cost_so_far_usd, runtime_of(gw, sid).process.cost_seen
        assert session.workers == []
    await providers.aclose()
    assert not [t for t in types(first) if t.startswith("delegate.")]
    assert first[-1].type == "turn.completed" and "tool.completed" in types(first)
    assert said(next_turn) == GCD and types(next_turn).count("llm.call_started") == 1
    assert cli_total > 0 and cost == pytest.approx(cli_total)
    only_model_calls(server)


async def test_claude_codes_own_compaction_in_a_turn_is_the_turns_and_its_failure_closes_it(
    tmp_path: Path, server: FakeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A call that reported a context past ``context_max_tokens``: Claude Code starts an
    ``auto`` compaction before the next turn's call, the turn's events; with one exchange
    only it has too little to summarise and says it failed: ``context.compacted`` closes it
    (``post_tokens`` = ``pre_tokens``, no message), and the turn answers all the same."""
    big = transcript("anthropic/text.sse").replace(b'"input_tokens":25', b'"input_tokens":190000')
    assert big != transcript("anthropic/text.sse")
    answer = transcript("anthropic/text.sse").replace(b"XFDUDYJgAACzvnptvVoYEL", b"Text1")
    server.enqueue(Replay(big), Replay(answer))
    config, providers = await gateway(tmp_path, server, monkeypatch, context_max_tokens="100000")
    async with running_gateway(config, providers) as gw:
        sid = await gw.create_session()
        await run_turn(gw, sid, "first words APPLE")
        events = await run_turn(gw, sid, "second words")
        stored = (await gw.http.get(f"/sessions/{sid}/messages")).json()["messages"]
    await providers.aclose()
    # The turn's id (an event of no turn, the last one's aftermath, may come first).
    turn_id = next(e.turn_id for e in events if e.type == "turn.started")
    compacting, compacted = (e for e in events if e.type.startswith("context."))
    assert compacting.turn_id == compacted.turn_id == turn_id
    assert compacting.payload.trigger == compacted.payload.trigger == "auto"
    assert compacting.payload.pre_tokens > 100000  # the estimate: the reported input
    assert compacted.payload.post_tokens == compacted.payload.pre_tokens
    assert compacted.payload.summary_message_id is None
    assert [m["role"] for m in stored] == ["user", "assistant", "user", "assistant"]
    assert types(events).index("context.compacted") < types(events).index("message.start")
    assert events[-1].payload.stop_reason == "end_turn"
    assert len(server.requests) == 2
    only_model_calls(server)

"""A ``claude-code`` agent's keys, as the real CLI honours them (issue 32; protocol §11, §15).

- An agent without ``tools`` has Claude Code's own default set: ``GET /agents``
  lists it (``source: "claude-code"``, which ask), and ``Bash`` asks, as its
  ``permission_mode`` says: denied it does not run, allowed it does.
- A tool's structured result (Edit's ``structuredPatch``) is kept as the
  native loop keeps an MCP tool's.
- The turn's ``[limits]`` are counted in the ``PreToolUse`` hook: the tool
  uses and sub-agents past them fail ``limit`` and no refused sub-agent runs;
  a sub-agent's turn counts against the key's ``turns_per_minute_per_key``
  like a client's.

The real CLI against the fake API (tests/claude_code_support.py).
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path
from typing import Any

import pytest
import trio

from bench.fake_api import FakeServer, Replay, transcript
from tests.claude_code_support import (
    CLAUDE_CODE_MARKS,
    decide,
    gateway,
    only_model_calls,
    run_turn,
)
from tests.claude_code_support import server as server
from tests.conftest import Harness, running_gateway, types

pytestmark = CLAUDE_CODE_MARKS

WITH_WORKERS = {"event_types": None, "actors": None, "include_worker_sessions": True}


def is_type(name: str, e: Any) -> bool:
    return bool(e.type == name)


def ends(session_id: str, e: Any) -> bool:
    return bool(e.type in ("turn.completed", "turn.cancelled") and e.session_id == session_id)


async def bash_turn(gw: Harness, sid: str, decision: str) -> list[Any]:
    async with gw.client(sid) as client:
        await client.subscribe()
        await gw.submit(sid, f"make the file ({decision})")
        asked = (await client.until(functools.partial(is_type, "permission.requested")))[-1]
        assert asked.payload.tool_name == "Bash"
        await decide(gw, sid, asked.payload.perm_id, decision)
        return await client.until_turn_ends()


async def test_an_agent_without_tools_has_claude_codes_and_bash_asks(
    tmp_path: Path, server: FakeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    bash, text = (
        Replay(transcript("claude-code/bash_touch.sse")),
        Replay(transcript("anthropic/text.sse")),
    )
    server.enqueue(bash, text, bash, text)
    config, providers = await gateway(tmp_path, server, monkeypatch, tools="", require_approval="")
    async with running_gateway(config, providers) as gw:
        listed = (await gw.http.get("/agents")).json()["agents"]
        sid = await gw.create_session()
        [listing] = (await gw.http.get("/sessions")).json()["sessions"]
        workspace = gw.node.workspaces.host_path(gw.node.sessions[sid].record.workspace_path)
        denied = await bash_turn(gw, sid, "deny")
        made_when_denied = os.path.exists(os.path.join(workspace, "made.txt"))  # noqa: ASYNC240
        allowed = await bash_turn(gw, sid, "allow")
        made = os.path.exists(os.path.join(workspace, "made.txt"))  # noqa: ASYNC240
    await providers.aclose()
    [agent] = listed
    tools = {t["name"]: t for t in agent["tools"]}
    assert agent["runtime"] == "claude-code" and {"Bash", "Edit", "Read", "Task"} <= set(tools)
    assert not {"sleep", "read_file", "delegate"} & set(tools)
    assert {t["source"] for t in tools.values()} == {"claude-code"}
    assert tools["Bash"]["requires_approval"] and not tools["Read"]["requires_approval"]
    assert listing["session"]["tools"] == agent["tools"]
    assert not made_when_denied and made
    failed = next(e for e in denied if e.type == "tool.failed").payload
    assert failed.error_class == "permission_denied"
    assert "tool.completed" in types(allowed) and allowed[-1].payload.stop_reason == "end_turn"
    only_model_calls(server)


async def test_tool_uses_and_sub_agents_past_the_limits_fail_limit_and_never_run(
    tmp_path: Path, server: FakeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One message asks for two sub-agents and a Bash; one worker and two tool uses are
    allowed: the second ``Agent`` fails ``limit`` (no worker, no sub-agent's call), the
    ``Bash`` too (its file is never made). The sub-agent's turn is the key's second:
    the next turn is 429."""
    text = Replay(transcript("anthropic/text.sse"))
    server.enqueue(Replay(transcript("claude-code/over_limits.sse")), text, text)
    limits = "[limits]\nmax_tool_uses_per_turn = 2\nmax_workers_per_turn = 1\n"
    limits += "turns_per_minute_per_key = 2\n"
    config, providers = await gateway(
        tmp_path, server, monkeypatch, limits, tools='["Bash", "Agent"]', require_approval="[]"
    )
    async with running_gateway(config, providers) as gw:
        sid = await gw.create_session()
        async with gw.client(sid) as client:
            await client.subscribe(WITH_WORKERS)
            await gw.submit(sid, "three things")
            await client.until(functools.partial(ends, sid))
            events = client.events
        workspace = gw.node.workspaces.host_path(gw.node.sessions[sid].record.workspace_path)
        made = os.path.exists(os.path.join(workspace, "third.txt"))  # noqa: ASYNC240
        stored = (await gw.http.get(f"/sessions/{sid}/messages")).json()["messages"]
        third = await gw.http.post(f"/sessions/{sid}/turns", json={"content": "again"})
    await providers.aclose()
    mine = [e for e in events if e.session_id == sid]
    failed = {e.payload.tool_use_id: e.payload for e in mine if e.type == "tool.failed"}
    assert set(failed) == {"toolu_01Agent0000002", "toolu_01Bash000009"}, str(types(mine))
    assert {p.error_class for p in failed.values()} == {"limit"}
    assert "max_workers_per_turn (1)" in failed["toolu_01Agent0000002"].message
    assert "max_tool_uses_per_turn (2)" in failed["toolu_01Bash000009"].message
    started = [e.payload for e in mine if e.type == "delegate.started"]
    assert [s.tool_use_id for s in started] == ["toolu_01Agent0000001"]
    assert len({e.session_id for e in events}) == 2  # the parent and one worker
    assert not made
    assert len(server.requests) == 3  # main, the one sub-agent, main's answer
    results = [
        b for m in stored for b in m["content"] if b["type"] == "tool_result" and b["is_error"]
    ]
    assert {b["tool_use_id"] for b in results} == set(failed)
    assert third.status_code == 429, third.text  # the client's turn and the worker's
    only_model_calls(server)


def tool_use_sse(tool_use_id: str, name: str, tool_input: dict[str, Any]) -> bytes:
    """One assistant message calling one tool, as the API streams it."""
    start = {"id": f"msg_{tool_use_id}", "type": "message", "role": "assistant",
             "model": "claude-sonnet-4-6", "content": [], "stop_reason": None,
             "stop_sequence": None, "usage": {"input_tokens": 100, "output_tokens": 1}}  # fmt: skip
    block = {"type": "tool_use", "id": tool_use_id, "name": name, "input": {}}
    delta = {"type": "input_json_delta", "partial_json": json.dumps(tool_input)}
    events = [
        ("message_start", {"type": "message_start", "message": start}),
        ("content_block_start",
         {"type": "content_block_start", "index": 0, "content_block": block}),
        ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta}),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        ("message_delta", {"type": "message_delta", "usage": {"output_tokens": 20},
                           "delta": {"stop_reason": "tool_use", "stop_sequence": None}}),
        ("message_stop", {"type": "message_stop"}),
    ]  # fmt: skip
    return "".join(f"event: {e}\ndata: {json.dumps(d)}\n\n" for e, d in events).encode()


async def test_an_edits_structured_result_is_in_tool_completed_and_the_stored_block(
    tmp_path: Path, server: FakeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Claude Code's ``tool_use_result`` (Edit's ``structuredPatch``) is the event's
    ``structured_result`` and the stored block's ``structured_content``."""
    config, providers = await gateway(
        tmp_path, server, monkeypatch, tools='["Read", "Edit"]', require_approval="[]"
    )
    async with running_gateway(config, providers) as gw:
        sid = await gw.create_session()
        workspace = gw.node.workspaces.host_path(gw.node.sessions[sid].record.workspace_path)
        path = os.path.join(workspace, "notes.txt")
        await trio.Path(path).write_text("one\ntwo\n")
        edit = {"file_path": path, "old_string": "two", "new_string": "TWO"}
        server.enqueue(
            Replay(tool_use_sse("toolu_01Read0000001", "Read", {"file_path": path})),
            Replay(tool_use_sse("toolu_01Edit0000001", "Edit", edit)),
            Replay(transcript("anthropic/text.sse")),
        )
        events = await run_turn(gw, sid, "edit the notes")
        stored = (await gw.http.get(f"/sessions/{sid}/messages")).json()["messages"]
        edited = await trio.Path(path).read_text()
    await providers.aclose()
    assert edited == "one\nTWO\n"
    completed = {e.payload.tool_name: e.payload for e in events if e.type == "tool.completed"}
    structured = completed["Edit"].structured_result
    assert structured["filePath"] == path and structured["structuredPatch"], structured
    [block] = [
        b for m in stored for b in m["content"]
        if b["type"] == "tool_result" and b["tool_use_id"] == "toolu_01Edit0000001"
    ]  # fmt: skip
    assert block["structured_content"] == structured
    only_model_calls(server)


@pytest.mark.parametrize(
    ("limits", "named"),
    [
        ("turns_per_minute_per_key = 1", "turns_per_minute_per_key"),
        ("max_sessions_per_key = 1", "max_sessions_per_key"),
    ],
)
async def test_a_sub_agent_the_keys_limits_refuse_fails_limit_and_never_runs(
    tmp_path: Path, server: FakeServer, monkeypatch: pytest.MonkeyPatch, limits: str, named: str
) -> None:
    """A sub-agent is a worker session and a turn of the key: with the key's one turn (or
    session) taken by the client's, the ``Agent`` tool is denied in the ``PreToolUse`` hook,
    fails ``limit`` naming the limit, and no worker session is made, no sub-agent's call."""
    text = Replay(transcript("anthropic/text.sse"))
    server.enqueue(Replay(transcript("claude-code/agent_call.sse")), text, text)
    config, providers = await gateway(
        tmp_path, server, monkeypatch, f"[limits]\n{limits}\n",
        tools='["Bash", "Agent"]', require_approval="[]",
    )  # fmt: skip
    async with running_gateway(config, providers) as gw:
        sid = await gw.create_session()
        async with gw.client(sid) as client:
            await client.subscribe(WITH_WORKERS)
            await gw.submit(sid, "delegate it")
            await client.until(functools.partial(ends, sid))
            events = client.events
        sessions = sorted(gw.node.sessions)
        stored = [r.id for r in (await gw.node.store.list_sessions(limit=10, before=None))[0]]
    await providers.aclose()
    [failed] = [e.payload for e in events if e.type == "tool.failed"]
    assert (failed.tool_use_id, failed.error_class) == ("toolu_01Agent0000001", "limit")
    assert named in failed.message, failed.message
    assert not [e for e in events if e.type.startswith("delegate.")]
    assert {e.session_id for e in events} == {sid}
    assert sessions == [sid] and stored == [sid]  # no worker session was made
    assert len(server.requests) == 2  # main's Agent call, main's answer: no sub-agent's
    assert events[-1].payload.stop_reason == "end_turn"
    only_model_calls(server)


async def test_a_worker_made_for_a_sub_agent_that_never_starts_is_deleted(
    tmp_path: Path, server: FakeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hook makes the worker before Claude Code runs the ``Agent`` tool: one that then
    starts no sub-agent (an agent type Claude Code does not know) fails, and its worker is
    deleted with the tool's result: its session slot is given back."""
    bad = {"description": "d", "prompt": "p", "subagent_type": "no-such-agent"}
    server.enqueue(
        Replay(tool_use_sse("toolu_01Agent0000009", "Agent", bad)),
        Replay(transcript("anthropic/text.sse")),
    )
    config, providers = await gateway(
        tmp_path, server, monkeypatch, "[limits]\nmax_sessions_per_key = 2\n",
        tools='["Bash", "Agent"]', require_approval="[]",
    )  # fmt: skip
    async with running_gateway(config, providers) as gw:
        sid = await gw.create_session()
        async with gw.client(sid) as client:
            await client.subscribe(WITH_WORKERS)
            await gw.submit(sid, "delegate it")
            with trio.fail_after(30):
                await client.until(functools.partial(ends, sid))
            events = client.events
        stored = [r.id for r in (await gw.node.store.list_sessions(limit=10, before=None))[0]]
        again = await gw.http.post("/sessions", json={})  # the second slot is free again
    await providers.aclose()
    [failed] = [e.payload for e in events if e.type == "tool.failed"]
    assert (failed.tool_use_id, failed.error_class) == ("toolu_01Agent0000009", "error")
    assert not [e for e in events if e.type.startswith("delegate.")]
    assert stored == [sid] and again.status_code == 201, again.text
    assert len(server.requests) == 2


@pytest.mark.parametrize(("budget", "thinks"), [("", False), ("2048", True)])
async def test_thinking_budget_tokens_0_is_thinking_off_as_for_the_native_runtime(
    tmp_path: Path, server: FakeServer, monkeypatch: pytest.MonkeyPatch, budget: str, thinks: bool
) -> None:
    """``thinking_budget_tokens`` 0 (the default) is extended thinking off: Claude Code's
    calls ask for none (by itself it would think, adaptively); above 0 they think (Claude
    Code 2.1.332 asks a model that has adaptive thinking for it, whatever the budget)."""
    server.enqueue(Replay(transcript("anthropic/text.sse")))
    config, providers = await gateway(tmp_path, server, monkeypatch, thinking_budget_tokens=budget)
    async with running_gateway(config, providers) as gw:
        sid = await gw.create_session()
        events = await run_turn(gw, sid, "hello")
    await providers.aclose()
    assert events[-1].type == "turn.completed"
    [call] = server.requests
    kind = (call.body.get("thinking") or {}).get("type", "disabled")
    assert (kind != "disabled") is thinks, call.body.get("thinking")
    only_model_calls(server)

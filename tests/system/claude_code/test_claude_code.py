"""``runtime = "claude-code"`` (docs/protocol.md §11): Claude Code sessions behind the contract.

The real Claude Code CLI (bundled with the ``claude-agent-sdk`` wheel) runs
behind a real gateway and talks to the fake Anthropic API
(``bench/fake_api``), offline: every request it makes is recorded, and its
proxy is the fake server too, so a request meant for anywhere else would be
recorded there as well; each test asserts that the only requests were the
model's ``POST /v1/messages?beta=true``. The events are the native runtime's:
the translator's message and block events, ``llm.call_*``, ``tool.*``,
``permission.*`` through the permissions route, the cancel sequences.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import trio

from bench.fake_api import FakeServer, Replay, transcript
from bench.fake_api.server import Cut
from tests.claude_code_support import (
    CLAUDE_CODE_MARKS,
    PROMPT,
    alive,
    decide,
    gateway,
    only_model_calls,
    run_turn,
)
from tests.claude_code_support import server as server
from tests.conftest import Harness, running_gateway, types

pytestmark = CLAUDE_CODE_MARKS


async def test_a_text_turn_with_thinking_streams_as_the_native_runtime(
    tmp_path: Path, server: FakeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    server.enqueue(
        Replay(transcript("anthropic/thinking_text.sse"), chunk_bytes=300),
        Replay(transcript("anthropic/text.sse")),
    )
    config, providers = await gateway(tmp_path, server, monkeypatch)
    async with running_gateway(config, providers) as gw:
        sid = await gw.create_session()
        events = await run_turn(gw, sid, "What is the GCD of 1071 and 462?")
        runtime: Any = gw.node.sessions[sid].agent.runtime  # type: ignore[union-attr]
        cli = runtime.transport.pid
        raw = await trio.Path(f"/proc/{cli}/environ").read_bytes()  # what the CLI got
        environ = dict(line.decode().partition("=")[::2] for line in raw.split(b"\0") if line)
        door = gw.node.model_proxy.base_url
        again = await run_turn(gw, sid, "And again?")
        snapshot = (await gw.http.get(f"/sessions/{sid}/messages")).json()["messages"]
    await providers.aclose()
    # The CLI is quiet, and gets none of the daemon's environment.
    for switch in (
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC",
        "DISABLE_TELEMETRY",
        "DISABLE_AUTOUPDATER",
    ):
        assert environ[switch] == "1", switch
    assert environ["HOME"].endswith(f".claude-code/{sid}")
    # The model API through the gateway's loopback door, with a session's credential.
    assert environ["ANTHROPIC_BASE_URL"] == door != server.base_url
    assert environ["ANTHROPIC_API_KEY"].startswith("gwcc-")
    assert not {k for k in environ if k.startswith(("GATEWAY_", "PYTEST", "VIRTUAL_ENV"))}
    deltas = ("thinking.delta", "text.delta")
    assert [t for t in types(events) if t not in deltas] == [
        "turn.started", "route.decided", "llm.call_started", "message.start",
        "thinking.start", "thinking.end", "text.start", "text.end", "message.complete",
        "llm.call_completed", "turn.completed",
    ]  # fmt: skip
    assert "thinking.delta" in types(events) and "text.delta" in types(events)
    complete = next(e for e in events if e.type == "message.complete").payload
    assert complete.message_id == "msg_01Bq9w938a90dw8q7mUBWZqE"  # the API's own id
    assert complete.final_content[0].signature.startswith("EqQB")
    done = events[-1].payload
    assert done.stop_reason == "end_turn" and done.usage.output_tokens == 96
    # The CLI's total_cost_usd, per turn (it is the session's running total):
    # Sonnet's $3/$15/$0.30 per million input/output/cache-read tokens.
    assert done.cost_usd == pytest.approx((42 * 3 + 96 * 15 + 1024 * 0.3) / 1e6)
    assert again[-1].payload.stop_reason == "end_turn"
    assert again[-1].payload.cost_usd == pytest.approx((25 * 3 + 15 * 15) / 1e6)
    assert [m["role"] for m in snapshot] == ["user", "assistant", "user", "assistant"]
    only_model_calls(server)
    first, second = (r.body for r in server.requests)
    system = "".join(b["text"] for b in first["system"])
    assert PROMPT in system and "Claude" in system  # appended to Claude Code's own
    assert first["model"] == "claude-sonnet-4-6"
    # One process, one conversation: the second call carries the first turn.
    said = str(second["messages"])
    assert "What is the GCD" in said and "And again?" in said
    # The CLI's state is the gateway's, never the operator's ~/.claude.
    home = tmp_path / "workspaces" / ".claude-code" / sid
    assert (home / ".claude").is_dir()


async def test_a_bash_round_allowed_and_denied_through_the_permissions_route(
    tmp_path: Path, server: FakeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two sessions at once, each with its own CLI (their CLIs start at once): one allows,
    one denies.

    Neither decides before both have asked, so the first two model calls are both
    sessions' first (the Bash call), whichever comes first. Each CLI is a process group
    of its own, stopped with the daemon; each conversation is its own."""
    bash, text = (
        Replay(transcript("claude-code/bash_touch.sse")),
        Replay(transcript("anthropic/text.sse")),
    )
    server.enqueue(bash, bash, text, text)
    config, providers = await gateway(tmp_path, server, monkeypatch)
    outcomes: dict[str, tuple[list[Any], bool]] = {}
    pids: dict[str, int] = {}
    asked_both = trio.Event()
    asking: set[str] = set()

    async def one(gw: Harness, decision: str) -> None:
        sid = await gw.create_session()
        async with gw.client(sid) as client:
            await client.subscribe()
            await gw.submit(sid, f"make the file ({decision})")
            asked = (await client.until(lambda e: e.type == "permission.requested"))[-1]
            assert asked.payload.tool_name == "Bash" and asked.payload.kind == "tool"
            assert asked.payload.input["command"] == "touch made.txt"
            asking.add(decision)
            if len(asking) == 2:
                asked_both.set()
            await asked_both.wait()
            await decide(gw, sid, asked.payload.perm_id, decision)
            await client.until_turn_ends()
            events = client.events
        pids[decision] = pid = gw.node.sessions[sid].agent.runtime.transport.pid  # type: ignore[union-attr]
        assert os.getpgid(pid) == pid  # a process group of its own
        workspace = gw.node.workspaces.host_path(gw.node.sessions[sid].record.workspace_path)
        made = os.path.exists(os.path.join(workspace, "made.txt"))  # noqa: ASYNC240
        outcomes[decision] = (events, made)

    async with running_gateway(config, providers) as gw, trio.open_nursery() as nursery:
        for decision in ("allow", "deny"):
            nursery.start_soon(one, gw, decision)
    await providers.aclose()
    assert len(set(pids.values())) == 2
    for pid in pids.values():  # each in a group of its own, stopped with the daemon
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    (allowed, made), (denied, made_anyway) = outcomes["allow"], outcomes["deny"]
    tool_events = ["tool.called", "permission.requested", "permission.resolved"]
    assert [t for t in types(allowed) if t.startswith(("tool.c", "tool.f", "permission."))] == [
        *tool_events,
        "tool.completed",
    ]
    assert made and not made_anyway
    assert types(allowed).count("llm.call_started") == 2
    assert allowed[-1].payload.stop_reason == "end_turn"
    failed = next(e for e in denied if e.type == "tool.failed").payload
    assert failed.error_class == "permission_denied"
    resolved = next(e for e in denied if e.type == "permission.resolved").payload
    assert resolved.decision == "deny"
    # The model saw its tool's result, and the result said what happened.
    results = [
        b for r in server.requests for m in r.body["messages"] if isinstance(m["content"], list)
        for b in m["content"] if b.get("type") == "tool_result"
    ]  # fmt: skip
    assert results and any(b.get("is_error") for b in results)
    said = [str(r.body["messages"]) for r in server.requests]
    assert ["(allow)" in t for t in said].count(True) == 2  # each conversation its own
    assert ["(deny)" in t for t in said].count(True) == 2
    assert not [t for t in said if "(allow)" in t and "(deny)" in t]
    only_model_calls(server)


async def test_a_cancel_in_each_phase_is_the_section_8_sequence_well_under_a_second(
    tmp_path: Path, server: FakeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One session, one CLI: a turn cancelled in each phase in turn, each followed by a
    turn that completes (the interrupted query was settled, the next turn is its own)."""
    config, providers = await gateway(tmp_path, server, monkeypatch)
    async with running_gateway(config, providers) as gw:
        sid = await gw.create_session()
        for phase in ("llm", "seam", "tools"):
            await cancel_in(gw, server, sid, phase)
    await providers.aclose()
    only_model_calls(server)


async def cancel_in(gw: Harness, server: FakeServer, sid: str, phase: str) -> None:
    """A turn of ``sid`` cancelled in ``phase``: its section 8 sequence; then a next turn."""
    if phase == "llm":
        body = transcript("anthropic/thinking_text.sse")
        server.enqueue(Replay(body, cut=Cut(body.index(b"signature_delta"), "stall")))
    elif phase == "seam":
        server.enqueue(Replay(transcript("claude-code/bash_touch.sse")))
    else:
        server.enqueue(Replay(transcript("claude-code/bash_touch_sleep.sse")))
    server.enqueue(Replay(transcript("anthropic/text.sse")))  # the next turn's
    async with gw.client(sid) as client:
        await client.subscribe()
        turn_id = await gw.submit(sid, "go")
        if phase == "llm":
            await client.until(lambda e: e.type == "thinking.delta")
        else:
            asked = (await client.until(lambda e: e.type == "permission.requested"))[-1]
            if phase == "tools":
                await decide(gw, sid, asked.payload.perm_id, "allow")
                workspace = gw.node.workspaces.host_path(
                    gw.node.sessions[sid].record.workspace_path
                )
                started_file = os.path.join(workspace, "started.txt")
                while not os.path.exists(started_file):  # noqa: ASYNC240, ASYNC110
                    await trio.sleep(0.05)
        started = trio.current_time()
        r = await gw.http.post(f"/sessions/{sid}/turns/{turn_id}/cancel", json={})
        assert r.status_code in (200, 202), r.text
        await client.until_turn_ends()
        took = trio.current_time() - started
        events = client.events
    next_turn = await run_turn(gw, sid, "still there?")
    assert took < 1.0, (phase, took)
    tail = [e for e in types(events) if e not in ("thinking.delta", "text.delta")]
    end = events[-1].payload
    assert events[-1].type == "turn.cancelled" and end.phase == phase
    if phase == "llm":
        assert tail[-4:] == [
            "thinking.end",
            "message.complete",
            "llm.call_failed",
            "turn.cancelled",
        ]
        complete = next(e for e in events if e.type == "message.complete").payload
        assert complete.stop_reason == "cancelled"
        assert "tool.failed" not in tail
    elif phase == "seam":
        assert tail[-3:] == ["permission.resolved", "tool.failed", "turn.cancelled"]
        assert events[-3].payload.decision == "cancelled"
        assert "llm.call_failed" not in tail
    else:
        assert tail[-2:] == ["tool.failed", "turn.cancelled"]
        assert events[-2].payload.error_class == "cancelled"
    # The session goes on: the interrupted query was settled, the next turn is its own.
    assert next_turn[-1].type == "turn.completed"
    assert next_turn[-1].payload.stop_reason == "end_turn"


async def test_an_idle_process_stops_and_the_conversation_resumes_even_after_a_restart(
    tmp_path: Path, server: FakeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``idle_process_s``: the CLI stops; the next turn's CLI resumes its transcript.

    The Claude Code session id is derived from the gateway session's, and the
    transcript is in the gateway's state directory: a restarted daemon finds it.
    """
    server.enqueue(*[Replay(transcript("anthropic/text.sse"))] * 3)
    config, providers = await gateway(tmp_path, server, monkeypatch, idle_process_s="0.3")
    async with running_gateway(config, providers) as gw:
        sid = await gw.create_session()
        await run_turn(gw, sid, "first words APPLE")
        runtime = gw.node.sessions[sid].agent.runtime  # type: ignore[union-attr]
        assert runtime is not None and runtime.transport is not None
        first_pid = runtime.transport.pid
        with trio.fail_after(5):  # stopped and reaped, its group gone
            while runtime.client is not None or alive(first_pid):  # noqa: ASYNC110
                await trio.sleep(0.1)
        resumed = await run_turn(gw, sid, "second words BANANA")
        assert runtime.transport is not None and runtime.transport.pid != first_pid
    _, providers = await gateway(tmp_path, server, monkeypatch, idle_process_s="0.3")
    async with running_gateway(config, providers) as gw:  # the daemon restarted
        restarted = await run_turn(gw, sid, "third words CHERRY")
    await providers.aclose()
    assert resumed[-1].payload.stop_reason == restarted[-1].payload.stop_reason == "end_turn"
    first, second, third = (str(r.body["messages"]) for r in server.requests)
    assert "APPLE" in first and "BANANA" not in first
    assert "APPLE" in second and "BANANA" in second
    assert "APPLE" in third and "BANANA" in third and "CHERRY" in third
    only_model_calls(server)

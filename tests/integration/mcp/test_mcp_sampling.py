"""An MCP server's sampling requests, served by the session's model (docs/protocol.md §11).

A real gateway, the scripted model and tests/mcp_servers/hostile_b.py (a server
that asks for sampling as told: one, a flood, 1M tokens, an image). Sub-cases
share a gateway where that is sound, to keep the server processes few.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio

from gateway.config import Config, load_config
from gateway.mcp.sampling import MAX_SAMPLINGS, USER_REJECTED, Samplings
from gateway.protocol.events import Event
from gateway.tools.registry import ToolContext
from gateway.tools.sampling import SamplingRequest
from tests.conftest import Harness, running_gateway
from tests.integration.mcp.test_mcp_gateway import sections, seq, write_config
from tests.mcp_support import SERVERS

HOSTILE_B = [sys.executable, str(SERVERS / "hostile_b.py")]
PREFIX = "mcp__hb__"
DONE = [{"text": "done"}]


def config_of(tmp_path: Path, **more: dict[str, Any]) -> Config:
    tables = sections(
        tmp_path, servers={"hb": {"command": HOSTILE_B}}, tools=("sleep", f"{PREFIX}*"), **more
    )
    return load_config(str(write_config(tmp_path / "gateway.toml", tables)), {}, {})


def call(tool: str, **input: Any) -> dict[str, Any]:
    return {"tool_use": {"name": PREFIX + tool, "input": input}}


def script(*rounds: list[dict[str, Any]]) -> dict[str, Any]:
    return {"script": {"rounds": list(rounds)}}


def answers_of(events: list[Event]) -> list[Any]:
    [done] = [e.payload for e in events if e.type in ("tool.completed", "tool.failed")]
    assert done.tool_name == f"{PREFIX}sample", done
    return list(json.loads(done.result))


async def answer(gw: Harness, sid: str, perm_id: str, decision: str, status: int = 202) -> None:
    r = await gw.http.post(f"/sessions/{sid}/permissions/{perm_id}", json={"decision": decision})
    assert r.status_code == status, r.text


# --- allowed, asked, denied, capped -------------------------------------------------------


@pytest.mark.slow  # a server process and several turns
async def test_sampling_asked_allowed_and_booked_to_the_turn(tmp_path: Path) -> None:
    config = config_of(tmp_path)
    with trio.fail_after(60):
        async with running_gateway(config) as gw:
            sid = await gw.create_session()
            content = script(
                [call("sample", text="hello there", system="Be brief.", max_tokens=1_000_000)],
                DONE,
            )
            async with gw.client(sid) as client:
                await client.subscribe()
                await gw.submit(sid, content)
                asked = (await client.until(lambda e: e.type == "permission.requested"))[-1]
                p = asked.payload
                assert (p.kind, p.tool_name) == ("sampling", f"{PREFIX}sample")
                assert p.input["system_prompt"] == "Be brief."
                assert p.input["messages"] == [{"role": "user", "text": "hello there"}]
                assert p.input["max_tokens"] == 4096  # the server's 1M, capped at max_tokens
                assert p.input["server"] == "hb"
                [pending] = gw.node.sessions[sid].permissions.pending()
                assert pending.kind == "sampling"
                other = await gw.create_session()  # another session cannot answer it
                r = await gw.http.post(
                    f"/sessions/{other}/permissions/{p.perm_id}", json={"decision": "allow"}
                )
                assert r.status_code == 404, r.text
                await answer(gw, sid, p.perm_id, "allow")
                await client.until_turn_ends()
                events = client.events
            kinds = seq(events)
            at = kinds.index("permission.resolved")
            assert kinds[at : at + 4] == [
                "permission.resolved", "llm.call_started", "llm.call_completed", "tool.completed",
            ], kinds  # fmt: skip
            started, completed = events[at + 1].payload, events[at + 2].payload
            assert started.purpose == completed.purpose == "sampling"
            assert started.call_id == completed.call_id
            turn_calls = [e.payload for e in events if e.type == "llm.call_started"]
            assert [c.purpose for c in turn_calls] == [msgspec.UNSET, "sampling", msgspec.UNSET]
            [result] = answers_of(events)
            assert result["content"] == {"type": "text", "text": "You said: hello there"}
            assert result["role"] == "assistant" and result["model"] == "scripted:echo"
            assert result["stopReason"] == "endTurn"
            # Its tokens are the turn's: the two turn calls' and the sampling's.
            usage = events[-1].payload.usage
            calls = [e.payload.usage for e in events if e.type == "llm.call_completed"]
            assert len(calls) == 3
            assert usage.output_tokens == sum(u.output_tokens for u in calls)
            assert completed.usage.output_tokens > 0
            # The wire form: purpose present on the sampling's events, absent on the turn's.
            raw = msgspec.json.encode(turn_calls[0]).decode()
            assert "purpose" not in raw

            await denied_by_the_user(gw, sid)
            await cancelled_while_asked(gw, sid)
            await cancelled_while_sampling(gw, sid)
            await refused_before_asking(gw, sid)


async def denied_by_the_user(gw: Harness, sid: str) -> None:
    """The user denies: the server gets MCP's "user rejected" error; no model call."""
    async with gw.client(sid) as client:
        await client.subscribe()
        await gw.submit(sid, script([call("sample", text="no")], DONE))
        p = (await client.until(lambda e: e.type == "permission.requested"))[-1].payload
        await answer(gw, sid, p.perm_id, "deny")
        await client.until_turn_ends()
        events = client.events
    [error] = answers_of(events)
    assert error["code"] == USER_REJECTED and "deny" in error["message"]
    assert [e.payload.purpose for e in events if e.type == "llm.call_started"] == [
        msgspec.UNSET, msgspec.UNSET,
    ]  # fmt: skip
    assert events[-1].type == "turn.completed"


async def cancelled_while_asked(gw: Harness, sid: str) -> None:
    """A cancel while the sampling waits for the user: section 8's tools row."""
    async with gw.client(sid) as client:
        await client.subscribe()
        turn_id = await gw.submit(sid, script([call("sample", text="wait")], DONE))
        await client.until(lambda e: e.type == "permission.requested")
        r = await gw.http.post(f"/sessions/{sid}/turns/{turn_id}/cancel", json={})
        assert r.status_code == 202
        events = await client.until_turn_ends()
    assert seq(events) == ["permission.resolved", "tool.failed", "turn.cancelled"], seq(events)
    assert events[0].payload.decision == "cancelled"
    assert events[2].payload.phase == "tools"
    assert gw.node.sessions[sid].permissions.pending() == []


async def cancelled_while_sampling(gw: Harness, sid: str) -> None:
    """A cancel during the sampling's model call: its llm.call_failed, then §8's tools row."""
    slow = {"script": {"delay_ms": 200, "rounds": [[{"text": "a slow answer of many words"}]]}}
    async with gw.client(sid) as client:
        await client.subscribe()
        turn_id = await gw.submit(sid, script([call("sample", text=json.dumps(slow))], DONE))
        p = (await client.until(lambda e: e.type == "permission.requested"))[-1].payload
        await answer(gw, sid, p.perm_id, "allow")
        await client.until(lambda e: e.type == "llm.call_started")
        r = await gw.http.post(f"/sessions/{sid}/turns/{turn_id}/cancel", json={})
        assert r.status_code == 202
        events = await client.until_turn_ends()
    assert seq(events) == ["llm.call_failed", "tool.failed", "turn.cancelled"], seq(events)
    failed = events[0].payload
    assert (failed.error_class, failed.purpose) == ("cancelled", "sampling")
    assert events[1].payload.error_class == "cancelled"
    assert events[2].payload.phase == "tools"


async def refused_before_asking(gw: Harness, sid: str) -> None:
    """An image, and a flood: refused or bounded before anyone is asked."""
    events = await run(gw, sid, script([call("sample", image=True)], DONE))
    [error] = answers_of(events)
    assert "only text content" in error["message"]
    assert "permission.requested" not in seq(events)

    async with gw.client(sid) as client:
        await client.subscribe()
        await gw.submit(sid, script([call("sample", text="flood", n=40)], DONE))
        asked = []
        while len(asked) < MAX_SAMPLINGS:
            asked += [
                e.payload
                for e in await client.until(lambda e: e.type == "permission.requested")
                if e.type == "permission.requested"
            ]
        with trio.move_on_after(0.5):  # no more come
            more = await client.until(lambda e: e.type == "permission.requested")
            raise AssertionError(f"more than {MAX_SAMPLINGS} asked: {seq(more)}")
        assert len(gw.node.sessions[sid].permissions.pending()) == MAX_SAMPLINGS
        for p in asked:
            await answer(gw, sid, p.perm_id, "allow")
        events = await client.until_turn_ends()
    answers = answers_of(events)
    served = [a for a in answers if "content" in a]
    refused = [a for a in answers if "code" in a]
    assert len(served) == MAX_SAMPLINGS and len(refused) == 40 - MAX_SAMPLINGS
    assert all("at once" in a["message"] for a in refused)


async def run(gw: Harness, sid: str, content: Any) -> list[Event]:
    async with gw.client(sid) as client:
        await client.subscribe()
        await gw.submit(sid, content)
        return await client.until_turn_ends()


# --- the agent's mcp_sampling ---------------------------------------------------------------


@pytest.mark.slow  # a server process
async def test_an_agent_that_denies_or_allows_sampling(tmp_path: Path) -> None:
    config = config_of(
        tmp_path,
        **{
            "agents.nope": {"mcp_sampling": "deny"},
            "agents.yes": {"mcp_sampling": "allow", "max_rounds": 2},
        },
    )
    with trio.fail_after(60):
        async with running_gateway(config) as gw:
            sid = await gw.create_session(agent="nope")
            events = await run(gw, sid, script([call("sample", text="hi")], DONE))
            [error] = answers_of(events)
            assert error["code"] == USER_REJECTED and "denies" in error["message"]
            assert "permission.requested" not in seq(events)
            assert all(
                e.payload.purpose is msgspec.UNSET for e in events if e.type.startswith("llm.")
            )

            # allow: no question; a sampling counts as one of the turn's max_rounds (2):
            # the turn's first call and one sampling make 2, the second sampling is refused.
            sid = await gw.create_session(agent="yes")
            events = await run(gw, sid, script([call("sample", text="a", n=2)], DONE))
            assert "permission.requested" not in seq(events)
            served, refused = answers_of(events)
            assert served["content"]["text"] == "You said: a"
            assert "max_rounds" in refused["message"]
            assert events[-1].payload.stop_reason == "end_turn"
            purposes = [e.payload.purpose for e in events if e.type == "llm.call_completed"]
            assert purposes.count("sampling") == 1


# --- the MCP side alone: no call, several sessions, a cancelled turn ------------------------


class _Session:
    """A ToolSession whose sample() records its calls."""

    def __init__(self) -> None:
        self.asked: list[SamplingRequest] = []

    async def sample(self, ctx: ToolContext, request: SamplingRequest) -> Any:
        self.asked.append(request)
        raise AssertionError("not reached")


def _params(**more: Any) -> Any:
    import mcp_types as types

    return types.CreateMessageRequestParams.model_validate(
        {"messages": [{"role": "user", "content": {"type": "text", "text": "x"}}],
         "maxTokens": 10, **more}
    )  # fmt: skip


async def test_no_call_in_flight_or_several_sessions_refuse() -> None:
    import mcp_types as types

    calls: dict[object, ToolContext] = {}
    samplings = Samplings("srv", calls)
    out = await samplings.sample(None, _params())  # type: ignore[arg-type]
    assert isinstance(out, types.ErrorData) and "no tool call" in out.message
    session = _Session()
    calls[object()] = ToolContext("ses_a", "turn_a", "toolu_a", "", session=session)  # type: ignore[arg-type]
    calls[object()] = ToolContext("ses_b", "turn_b", "toolu_b", "", session=session)  # type: ignore[arg-type]
    out = await samplings.sample(None, _params())  # type: ignore[arg-type]
    assert isinstance(out, types.ErrorData) and session.asked == []
    calls.popitem()
    for bad, why in (
        ({"maxTokens": 0}, "max_tokens"),
        ({"systemPrompt": "x" * 1_000_001}, "characters"),
        ({"messages": []}, "at least one"),
    ):
        out = await samplings.sample(None, _params(**bad))  # type: ignore[arg-type]
        assert isinstance(out, types.ErrorData) and why in out.message, (bad, out)
        assert out.code == types.INVALID_PARAMS
    assert session.asked == []


async def test_sampling_for_a_turn_that_is_over_is_refused(tmp_path: Path) -> None:
    """The session side: a tool context whose turn is not the one in flight is refused."""
    from gateway.errors import ToolError
    from tests.conftest import make_config

    with trio.fail_after(30):
        async with running_gateway(make_config(tmp_path)) as gw:
            sid = await gw.create_session()
            session = gw.node.sessions[sid]
            ctx = ToolContext(sid, "turn_gone", "toolu_1", "", tool_name="mcp__x__y")
            request = SamplingRequest("x", (("user", "hi"),), 10)
            with pytest.raises(ToolError) as refused:
                await session.sample(ctx, request)
            assert "turn is over" in refused.value.message
            assert session.permissions.pending() == []


def test_a_restart_reads_a_sampling_call_as_part_of_its_tool() -> None:
    """docs/protocol.md §8: recovery closes the tool (phase tools), not a call of the turn;
    the sampling call it left open ends first, as a live cancel ends it."""
    from gateway.protocol.events import (
        LlmCallCompleted,
        LlmCallStarted,
        PermissionRequested,
        PermissionResolved,
        ToolCalled,
    )
    from gateway.protocol.shapes import Usage
    from gateway.session import recovery

    events: list[tuple[str, Any]] = [
        ("llm.call_started", LlmCallStarted("call_1", "m")),
        ("llm.call_completed", LlmCallCompleted("call_1", "msg_1", "tool_use", Usage())),
        ("tool.called", ToolCalled("toolu_1", "mcp__hb__sample", {})),
        ("permission.requested",
         PermissionRequested("perm_1", "toolu_1", "mcp__hb__sample", {}, 1, "sampling", "?")),
        ("permission.resolved", PermissionResolved("perm_1", "allow")),
        ("llm.call_started", LlmCallStarted("call_2", "m", "sampling")),
    ]  # fmt: skip
    state = recovery.plan("turn_1", events, [])
    assert (state.phase, state.call_id) == ("tools", None)
    assert state.pending_tools == [("toolu_1", "mcp__hb__sample")]
    closing = [type(p).__name__ for p in recovery.closing(state)]
    assert closing == ["LlmCallFailed", "ToolFailed", "TurnCancelled"], closing


async def test_tools_in_a_sampling_request_are_refused() -> None:
    import mcp_types as types

    session = _Session()
    calls = {object(): ToolContext("ses_a", "turn_a", "toolu_a", "", session=session)}  # type: ignore[arg-type]
    tool = {"name": "t", "inputSchema": {"type": "object"}}
    out = await Samplings("srv", calls).sample(None, _params(tools=[tool]))  # type: ignore[arg-type]
    assert isinstance(out, types.ErrorData) and "tools" in out.message
    assert session.asked == []

"""Attacks on agents, MCP tools and compaction, each held by a test (docs/protocol.md §2, §11, §12).

An MCP server is a program the operator trusts to run, not to behave: the
``requestedSchema`` of its questions, its tool list and its notices are
checked so that none of them can stall the daemon's Trio thread, fail a route
with a 500 or grow memory without bound (tests/mcp_servers/hostile.py). The
tenant and input attacks that the code already holds off are kept here too,
so they stay held.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import trio

from gateway.agents import MAX_SYSTEM_FILE_BYTES, Agents, read_system_file
from gateway.config import load_config
from gateway.errors import ConfigError, ToolError
from gateway.mcp.tools import (
    MAX_DESCRIPTION_CHARS,
    MAX_TOOLS,
    adapt_tools,
    elicitation_problem,
)
from gateway.tools.registry import ToolContext, ToolRegistry
from tests.conftest import make_config, running_gateway
from tests.integration.mcp.test_mcp_elicitation import pending
from tests.mcp_support import SERVERS, FakeSession, context, running, server

HOSTILE = [sys.executable, str(SERVERS / "hostile.py")]

REDOS = {"type": "object", "properties": {"a": {"type": "string", "pattern": "^(a+)+$"}}}
"""A backtracking regex: against 25 a's and a "!", seconds of ``re`` holding the GIL."""

HOSTILE_SCHEMAS: list[Any] = [
    REDOS,
    {"type": "object", "patternProperties": {"^(a+)+$": {"type": "string"}}},
    {"type": "object", "properties": {"a": {"$ref": "http://127.0.0.1:9/x.json"}}},
    {"type": "object", "properties": {"a": {"type": "string", "pattern": "("}}},
    {"type": "object", "properties": {"a": {"type": "striiing"}}},
    {"type": "string"},
    ["not", "an", "object"],
    {"type": "object", "description": "x" * 70_000},
]


# --- elicitations: the server's schema ------------------------------------------------


def test_a_schema_outside_mcps_restricted_form_is_refused() -> None:
    for schema in HOSTILE_SCHEMAS:
        assert elicitation_problem("?", schema) is not None, schema
    assert elicitation_problem("x" * 70_000, {"type": "object"}) is not None
    fine = {
        "type": "object",
        "properties": {  # property names are names, not keywords
            "pattern": {"type": "string", "enum": ["$ref", "pattern"], "default": "pattern"},
            "$ref": {"type": "boolean"},
            "n": {"type": "integer", "minimum": 0},
            "tags": {"type": "array", "items": {"$ref": "#/$defs/tag"}},
        },
        "$defs": {"tag": {"type": "string", "enum": ["a", "b"]}},
        "required": ["pattern"],
    }
    assert elicitation_problem("Pick one", fine) is None


async def test_a_hostile_requested_schema_never_reaches_the_user() -> None:
    """The server is told ``invalid params``; the session is never asked; a fine one is."""
    async with running(h=server(command=HOSTILE)) as manager:
        with trio.fail_after(20):
            await manager.wait_ready()
            tools = manager.session_tools(ToolRegistry(), "ses_a")
            session = FakeSession("ses_a", ("allow", {"a": "x"}))
            for schema in HOSTILE_SCHEMAS[:4]:
                out = await tools.execute(
                    "mcp__h__ask", {"schema": schema}, context("ses_a", session)
                )
                [answer] = json.loads(out.content)
                assert answer["code"] == -32602, answer  # invalid params
            assert session.asked == []
            fine = {"type": "object", "properties": {"a": {"type": "string"}}}
            out = await tools.execute("mcp__h__ask", {"schema": fine}, context("ses_a", session))
            assert json.loads(out.content) == [{"action": "accept", "content": {"a": "x"}}]
            assert len(session.asked) == 1


async def ask(session: Any, ctx: ToolContext, schema: Any, answers: list[Any]) -> None:
    answers.append(await session.elicit(ctx, "?", schema))


class SlowSession(FakeSession):
    """Answers each question after a while, counting how many are open at once."""

    def __init__(self, id: str) -> None:
        super().__init__(id, ("allow", {}))
        self.open = self.most = 0

    async def elicit(
        self, ctx: ToolContext, message: str, requested_schema: dict[str, Any]
    ) -> tuple[str, dict[str, Any] | None]:
        self.open += 1
        self.most = max(self.most, self.open)
        try:
            await trio.sleep(0.2)
            return await super().elicit(ctx, message, requested_schema)
        finally:
            self.open -= 1


async def test_a_server_asking_fifty_questions_at_once_gets_four_asked() -> None:
    """Each question is a pending permission in every snapshot: at most MAX_QUESTIONS at once."""
    async with running(h=server(command=HOSTILE)) as manager:
        with trio.fail_after(20):
            await manager.wait_ready()
            tools = manager.session_tools(ToolRegistry(), "ses_a")
            session = SlowSession("ses_a")
            args = {"schema": {"type": "object", "properties": {}}, "n": 50}
            out = await tools.execute("mcp__h__ask", args, context("ses_a", session))
            actions = [a["action"] for a in json.loads(out.content)]
            assert session.most <= 4 and actions.count("accept") == len(session.asked) >= 1
            assert actions.count("cancel") == 50 - len(session.asked)


async def test_an_answer_never_runs_a_servers_regex_nor_fails_with_a_500(tmp_path: Path) -> None:
    """Asked without the MCP adapter's check (Session.elicit directly), the route still holds.

    Before: the regex ran in the Trio thread on the answer (seconds for 26
    characters, minutes for 32); an unresolvable ``$ref`` or an invalid
    pattern was a 500; a nested object in the answer was a 202, and the SDK
    then failed it, the server told an error instead of the user's answer.
    """
    hostile = [
        (REDOS, {"a": "a" * 25 + "!"}),
        ({"type": "object", "properties": {"a": {"$ref": "http://127.0.0.1:9/x"}}}, {"a": 1}),
        ({"type": "object", "properties": {"a": {"type": "string", "pattern": "("}}}, {"a": "x"}),
        ({"type": "object"}, {"a": {"nested": [1, {"x": 2}]}}),
    ]
    with trio.fail_after(30):
        async with running_gateway(make_config(tmp_path)) as gw:
            sid = await gw.create_session()
            session = gw.node.sessions[sid]
            for schema, content in hostile:
                ctx = ToolContext(sid, "turn_x", "toolu_1", "", tool_name="mcp__h__ask")
                answers: list[Any] = []

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(ask, session, ctx, schema, answers)
                    asked = await pending(gw, sid)
                    url = f"/sessions/{sid}/permissions/{asked['perm_id']}"
                    started = time.monotonic()
                    body = {"decision": "allow", "content": content}
                    r = await gw.http.post(url, json=body)
                    assert time.monotonic() - started < 1.0
                    assert r.status_code == 422, (schema, r.text)
                    assert r.json()["error"]["code"] == "invalid_content"
                    r = await gw.http.post(url, json={"decision": "deny"})
                    assert r.status_code == 202
                assert answers == [("deny", None)]
            r = await gw.http.post(url, json={"decision": "allow", "content": {"a": "a"}})
            assert r.status_code == 409


def test_a_tools_backtracking_pattern_never_meets_the_models_input() -> None:
    """Before: 25 a's and a "!" held the Trio thread for seconds (minutes at 32), then failed.

    The rest of the schema is still checked (``invalid_input``)."""
    schema = {
        "type": "object",
        "properties": {"a": {"type": "string", "pattern": "^(a+)+$", "maxLength": 50}},
    }
    [tool] = adapt_tools("s", [{"name": "t", "inputSchema": schema}], None).values()  # type: ignore[arg-type]
    started = time.monotonic()
    assert tool.parse({"a": "a" * 25 + "!"}) == {"a": "a" * 25 + "!"}  # not the regex's to say
    assert time.monotonic() - started < 0.5
    with pytest.raises(ToolError, match="too long"):
        tool.parse({"a": "a" * 51})


async def test_an_agui_resume_passes_an_elicitations_content_on(tmp_path: Path) -> None:
    """Before: the resume's ``content`` was dropped: the server was told "accept", with ``{}``.

    And an ``allow`` with no content is the empty answer, checked like any (422 here)."""
    from tests.integration.doors.agui.test_agui_http import run_all, run_input
    from tests.integration.mcp.test_mcp_gateway import mcp_config

    schema = {"type": "object", "properties": {"who": {"type": "string"}}, "required": ["who"]}
    ask_ = {"tool_use": {"name": "mcp__h__ask", "input": {"schema": schema, "message": "Who?"}}}
    turn = {"script": {"rounds": [[ask_], [{"text": "done"}]]}}
    config = mcp_config(tmp_path, servers={"h": {"command": HOSTILE}}, tools=("mcp__h__*",))
    with trio.fail_after(30):
        async with running_gateway(config) as gw:
            thread = "t-elicit"
            first = await run_all(gw, run_input(thread, turn))
            [interrupt] = first[-1]["outcome"]["interrupts"]
            assert interrupt["reason"] == "elicitation"
            empty = {"decision": "allow"}
            for payload, status in ((empty, 422), ({"decision": "allow", "content": 7}, 422)):
                resume = [
                    {"interruptId": interrupt["id"], "status": "resolved", "payload": payload}
                ]
                r = await gw.http.post("/agui", json=run_input(thread, "", resume=resume))
                assert r.status_code == status, r.text
            answer = {"decision": "allow", "content": {"who": "bob"}}
            resume = [{"interruptId": interrupt["id"], "status": "resolved", "payload": answer}]
            second = await run_all(gw, run_input(thread, "", resume=resume))
            [result] = [e for e in second if e["type"] == "TOOL_CALL_RESULT"]
            assert json.loads(result["content"]) == [
                {"action": "accept", "content": {"who": "bob"}}
            ]


# --- the server's tool list and notices -----------------------------------------------


def test_a_servers_tool_list_weighs_at_most_two_mib() -> None:
    """Before: 512 tools of 256 KiB schemas (or 1 MiB descriptions) went to the model each call."""
    big = {"type": "object", "description": "x" * 200_000}
    listed = [
        {"name": f"t{i}", "description": "d" * 1_000_000, "inputSchema": big} for i in range(20)
    ]
    tools = adapt_tools("s", listed, None)  # type: ignore[arg-type]
    assert 5 <= len(tools) <= 10
    assert all(len(t.description) <= MAX_DESCRIPTION_CHARS + 3 for t in tools.values())


def test_a_tool_name_that_would_shadow_another_servers_is_dropped() -> None:
    """Server ``a``'s ``_x`` and server ``a_``'s ``x`` would both be ``mcp__a___x``."""
    schema = {"type": "object"}
    assert list(adapt_tools("a", [{"name": "_x", "inputSchema": schema}], None)) == []  # type: ignore[arg-type]
    assert list(adapt_tools("a_", [{"name": "x", "inputSchema": schema}], None)) == ["mcp__a___x"]  # type: ignore[arg-type]


@pytest.mark.slow  # over a second on two cores (measured with --durations)
async def test_a_server_listing_twenty_thousand_tools_does_not_hold_the_daemon() -> None:
    """Before: every schema checked in the Trio thread, ~1 ms each (22 s here, 110 s for 100k)."""
    config = server(command=HOSTILE, env={"HOSTILE_TOOLS": "20000"}, startup_timeout_s=15)
    async with running(h=config) as manager:
        gaps: list[float] = []

        async def tick() -> None:
            while True:
                before = time.monotonic()
                await trio.sleep(0.01)
                gaps.append(time.monotonic() - before)

        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(tick)
                await manager.wait_ready()
                nursery.cancel_scope.cancel()
        connection = manager.connection("h")
        assert connection is not None and connection.live
        assert len(connection.tools) == MAX_TOOLS
        assert max(gaps) < 2.0, max(gaps)  # parsing the 1.5 MB line itself is the SDK's


@pytest.mark.slow  # over a second on two cores (measured with --durations)
async def test_a_list_changed_flood_lists_the_tools_once_a_second() -> None:
    """Before: one listing task per notice, all at once (2,000 ``tools/list`` in flight)."""
    async with running(h=server(command=HOSTILE)) as manager:
        with trio.fail_after(20):
            await manager.wait_ready()
            tools = manager.session_tools(ToolRegistry(), "ses_a")
            out = await tools.execute("mcp__h__flood", {"n": 2000}, context())
            assert out.content == "sent"
            await trio.sleep(1.5)
            lists = int((await tools.execute("mcp__h__lists", {}, context())).content)
            assert 2 <= lists <= 4, lists  # the start's, then one or two for the flood


async def test_a_server_chattering_on_stdout_gets_one_warning_not_one_a_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Before: 20,000 stray lines were 20,000 three-line warnings."""
    async with running(h=server(command=HOSTILE)) as manager:
        with trio.fail_after(20):
            await manager.wait_ready()
            tools = manager.session_tools(ToolRegistry(), "ses_a")
            out = await tools.execute("mcp__h__chatter", {"n": 5000}, context())
            assert out.content == "said"
            assert (await tools.execute("mcp__h__lists", {}, context())).content == "1"
    warned = [r for r in caplog.records if "not JSON-RPC" in r.getMessage()]
    assert 1 <= len(warned) <= 2, len(warned)
    assert "debug: step 0" in warned[0].getMessage()


# --- system_file ------------------------------------------------------------------------


async def test_a_system_file_that_is_a_fifo_a_directory_or_huge_is_refused(tmp_path: Path) -> None:
    """Before: a FIFO blocked the open in the Trio thread (SIGHUP: the daemon hung for good),
    ``/dev/zero`` was read until memory ran out, a directory was an unhelpful error."""
    fifo, big, prompt = tmp_path / "fifo", tmp_path / "big", tmp_path / "prompt.md"
    os.mkfifo(fifo)
    os.truncate(big.touch() or big, MAX_SYSTEM_FILE_BYTES + 1)
    for path, says in ((fifo, "not a regular file"), (tmp_path, "directory"),
                       (big, "over"), (Path("/dev/zero"), "not a regular file")):  # fmt: skip
        with trio.fail_after(5):
            with pytest.raises(ConfigError, match=says):
                await trio.to_thread.run_sync(
                    read_system_file, str(path), "model", abandon_on_cancel=True
                )
    prompt.write_text("be kind")
    agents = Agents(make_config(tmp_path, **{"model.system_file": str(prompt)}))
    prompt.unlink()
    os.symlink(fifo, prompt)  # replaced by a FIFO, then SIGHUP
    with trio.fail_after(5):
        await trio.to_thread.run_sync(agents.reload, abandon_on_cancel=True)
    assert agents["default"].system == "be kind"


# --- what already held ------------------------------------------------------------------


async def test_another_tenant_cannot_compact_answer_or_see_a_sessions_questions(
    tmp_path: Path,
) -> None:
    config = make_config(tmp_path, **{"auth.api_keys": ["key-a", "key-b"]})
    with trio.fail_after(30):
        async with running_gateway(config) as gw:
            a = {"Authorization": "Bearer key-a"}
            b = {"Authorization": "Bearer key-b"}
            r = await gw.http.post("/sessions", json={}, headers=a)
            sid_a = r.json()["session_id"]
            r = await gw.http.post("/sessions", json={}, headers=b)
            sid_b = r.json()["session_id"]
            session = gw.node.sessions[sid_a]
            ctx = ToolContext(sid_a, "turn_x", "toolu_1", "", tool_name="mcp__h__ask")
            async with trio.open_nursery() as nursery:
                nursery.start_soon(session.elicit, ctx, "secret?", {"type": "object"})
                asked = await pending(gw, sid_a)
                perm = asked["perm_id"]
                for url in (
                    f"/sessions/{sid_a}/permissions/{perm}",
                    f"/sessions/{sid_b}/permissions/{perm}",
                ):
                    r = await gw.http.post(
                        url, json={"decision": "allow", "content": {}}, headers=b
                    )
                    assert r.status_code == 404, r.text
                r = await gw.http.post(f"/sessions/{sid_a}/compact", json={}, headers=b)
                assert r.status_code == 404
                r = await gw.http.get(f"/sessions/{sid_a}", headers=b)
                assert r.status_code == 404
                r = await gw.http.get("/sessions", headers=b)
                assert sid_a not in r.text
                r = await gw.http.post(
                    f"/sessions/{sid_a}/permissions/{perm}", json={"decision": "deny"}, headers=a
                )
                assert r.status_code == 202


async def test_get_agents_and_a_bad_agent_name_never_show_a_system_prompt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-never-used")  # no call is made
    path = tmp_path / "gateway.toml"
    path.write_text(
        '[model]\nsystem = "SECRET-DEFAULT"\n[agents.ops]\nsystem = "SECRET-OPS"\n'
        '[agents.real]\nsystem = "SECRET-REAL"\nmodel = "anthropic:claude-x"\n'
    )
    flat = {"server.port": 0, "store.path": str(tmp_path / "g.db")}
    config = load_config(str(path), {}, {**flat, "sessions.workspace_root": str(tmp_path / "w")})
    with trio.fail_after(30):
        async with running_gateway(config) as gw:
            r = await gw.http.get("/agents")
            assert r.status_code == 200 and "SECRET" not in r.text
            assert {a["name"] for a in r.json()["agents"]} == {"default", "ops", "real"}
            # The scripted model says its system prompt back: an agent on a real model
            # cannot be switched onto it to read that agent's prompt.
            r = await gw.http.post("/sessions", json={"agent": "real", "model": "scripted:x"})
            assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_model"
            for agent in (5, None, ["ops"], {"name": "ops"}, "x" * 100_000, "opś", "ops\n"):
                r = await gw.http.post("/sessions", json={"agent": agent})
                if agent is None:
                    assert r.status_code == 201
                    continue
                assert r.status_code == 422, (agent, r.status_code)
                assert "SECRET" not in r.text and len(r.text) < 2000
            sid = await gw.create_session(agent="ops")
            r = await gw.http.get(f"/sessions/{sid}")
            assert "SECRET" not in r.text
            r = await gw.http.get("/sessions")
            assert "SECRET" not in r.text
            r = await gw.http.post(f"/sessions/{sid}/compact", json={})
            assert r.status_code == 409 and "SECRET" not in r.text


async def test_compact_racing_a_turn_and_a_page_on_another_origin(tmp_path: Path) -> None:
    """Compactions and turns posted at once: each 202 or 409 ``turn_in_progress``, never a 500,
    never a lost turn; a page on another origin reads no agent and answers no question."""
    with trio.fail_after(30):
        async with running_gateway(make_config(tmp_path)) as gw:
            sid = await gw.create_session()
            statuses: list[tuple[str, int]] = []

            async def post(url: str, body: dict[str, Any]) -> None:
                r = await gw.http.post(url, json=body)
                statuses.append((url.rsplit("/", 1)[1], r.status_code))
                assert r.status_code in (202, 409), r.text

            async with gw.client(sid) as client:
                await client.subscribe()
                for i in range(2):
                    await gw.submit(sid, f"t{i}")
                    await client.until_turn_ends()
                for i in range(3):
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(post, f"/sessions/{sid}/compact", {})
                        nursery.start_soon(post, f"/sessions/{sid}/turns", {"content": f"r{i}"})
                        nursery.start_soon(post, f"/sessions/{sid}/compact", {})
                    await client.until_turn_ends()
            assert statuses.count(("turns", 202)) == 3
            r = await gw.http.get(f"/sessions/{sid}/messages")
            roles = [m["role"] for m in r.json()["messages"]]
            assert roles.count("user") == 5 and roles.count("assistant") == 5
            evil = {"Origin": "http://evil.example"}
            r = await gw.http.get("/agents", headers=evil)
            assert r.status_code == 403
            r = await gw.http.post(
                f"/sessions/{sid}/permissions/perm_x", json={"decision": "allow"}, headers=evil
            )
            assert r.status_code == 403

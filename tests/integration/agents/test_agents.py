"""Agents (docs/protocol.md §11, docs/reference.md "Agents"): what a session runs.

Through a real gateway on the scripted model (whose ``system`` and ``tools``
blocks say back what a call was sent) and on the real providers against the
fake model APIs (which record every request): the system prompt reaches the
model on every call and never a client; each agent's tools, approvals, model,
limits and worker agent are its own; a bad agent config is one line, exit 2.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio

from bench.fake_api import FakeServer, Replay, transcript
from gateway.agents import Agents
from gateway.config import Config, load_config
from gateway.errors import ConfigError
from gateway.protocol.shapes import TextBlock
from gateway.providers.factory import Providers, make_providers
from tests.conftest import REPO, Harness, ready_port, running_gateway, types
from tests.provider_support import ignore_unfinalized_generators
from tests.provider_support import server as server

pytestmark = ignore_unfinalized_generators("anthropic", "httpx2", "httpcore2", "httpx", "httpcore")

SECRET = "You are the support agent. The code word is PERIWINKLE."

AGENTS = f"""
[tools]
enabled = ["sleep", "read_file", "delegate"]

[agents]
default = "support"

[agents.support]
system = "{SECRET}"
tools = ["sleep", "delegate"]
require_approval = ["sle*"]
delegate_agent = "researcher"
max_rounds = 2

[agents.researcher]
system_file = "{{system_file}}"
tools = ["read_file"]
"""


def agents_config(tmp_path: Path, text: str = AGENTS, **overrides: Any) -> Config:
    """A config from ``text`` (a TOML file, as an operator writes it), port 0, in ``tmp_path``."""
    prompt = tmp_path / "researcher.md"
    if not prompt.exists():
        prompt.write_text("You research. First prompt.")
    path = tmp_path / "gateway.toml"
    path.write_text(text.replace("{system_file}", str(prompt)))
    flat = {
        "server.port": 0,
        "store.path": str(tmp_path / "gateway.db"),
        "sessions.workspace_root": str(tmp_path / "workspaces"),
        **overrides,
    }
    return load_config(str(path), {}, flat)


def script(*rounds: list[dict[str, Any]]) -> str:
    return json.dumps({"script": {"rounds": list(rounds)}})


async def turn(gw: Harness, sid: str, content: str) -> list[Any]:
    async with gw.client(sid) as client:
        await client.subscribe()
        await gw.submit(sid, content)
        return await client.until_turn_ends()


def final_text(events: list[Any]) -> str:
    complete = [e for e in events if e.type == "message.complete"][-1]
    return "".join(b.text for b in complete.payload.final_content if isinstance(b, TextBlock))


# --- choosing an agent -----------------------------------------------------------


async def test_get_agents_lists_them_without_their_prompts(tmp_path: Path) -> None:
    async with running_gateway(agents_config(tmp_path)) as gw:
        r = await gw.http.get("/agents")
    assert r.status_code == 200
    assert SECRET not in r.text and "First prompt" not in r.text
    agents = {a["name"]: a for a in r.json()["agents"]}
    assert sorted(agents) == ["default", "researcher", "support"]
    assert [name for name, a in agents.items() if a["default"]] == ["support"]
    support = agents["support"]
    assert (support["runtime"], support["model"]) == ("native", "scripted:echo")
    assert {t["name"]: t["requires_approval"] for t in support["tools"]} == {
        "sleep": True,
        "delegate": False,
    }
    assert {t["source"] for t in support["tools"]} == {"builtin"}
    assert [t["name"] for t in agents["researcher"]["tools"]] == ["read_file"]
    assert "properties" in agents["researcher"]["tools"][0]["input_schema"]


async def test_a_session_runs_the_agent_it_names_else_the_default(tmp_path: Path) -> None:
    async with running_gateway(agents_config(tmp_path)) as gw:
        r = await gw.http.post("/sessions", json={})
        assert r.status_code == 201 and r.json()["agent"] == "support"
        r = await gw.http.post("/sessions", json={"agent": "researcher"})
        assert r.status_code == 201 and r.json()["agent"] == "researcher"
        sid = r.json()["session_id"]
        r = await gw.http.get(f"/sessions/{sid}")
        assert r.json()["agent"] == "researcher"
        async with gw.client(sid) as client:
            await client.subscribe(snapshot=True)
            snap = await client.recv()
        assert snap.session.agent == "researcher"
        assert [t.name for t in snap.session.tools] == ["read_file"]
        listed = (await gw.http.get("/sessions")).json()["sessions"]
        assert {s["session"]["agent"] for s in listed} == {"support", "researcher"}


@pytest.mark.parametrize("name", ["nope", "", "support ", "DEFAULT", "mcp__x"])
async def test_an_unknown_agent_is_422_listing_the_agents(tmp_path: Path, name: str) -> None:
    async with running_gateway(agents_config(tmp_path)) as gw:
        r = await gw.http.post("/sessions", json={"agent": name})
        assert (await gw.http.get("/sessions")).json()["sessions"] == []  # nothing was made
    assert r.status_code == 422
    error = r.json()["error"]
    assert error["code"] == "unknown_agent"
    assert "default, support, researcher" in error["message"]


async def test_an_agent_that_is_not_a_string_is_422(tmp_path: Path) -> None:
    async with running_gateway(agents_config(tmp_path)) as gw:
        r = await gw.http.post("/sessions", json={"agent": ["support"]})
    assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_body"


# --- the system prompt -------------------------------------------------------------


async def test_the_system_prompt_reaches_the_model_on_every_call_never_a_client(
    tmp_path: Path,
) -> None:
    async with running_gateway(agents_config(tmp_path)) as gw:
        sid = await gw.create_session()
        # Two rounds of one turn (a tool between them): the prompt is in both calls.
        delegate = {"tool_use": {"name": "delegate", "input": {"task": "hi"}}}
        said = script([{"system": True}, delegate], [{"system": True}])
        events = await turn(gw, sid, said)
        texts = [e for e in events if e.type == "message.complete"]
        assert [final_text([e]) for e in texts] == [SECRET, SECRET]
        # A plain turn: nothing the gateway itself sends carries the prompt.
        plain = await turn(gw, sid, "hello")
        async with gw.client(sid) as client:
            await client.subscribe(snapshot=True, since=None)
            snap = await client.recv()
        agents = await gw.http.get("/agents")
        session = await gw.http.get(f"/sessions/{sid}")
    assert final_text(plain) == "You said: hello"
    wire = msgspec.json.encode([e for e in plain]).decode() + agents.text + session.text
    wire += msgspec.json.encode(snap.session).decode()
    assert SECRET not in wire


async def test_the_worker_runs_the_delegate_agent_with_its_prompt_and_tools(
    tmp_path: Path,
) -> None:
    async with running_gateway(agents_config(tmp_path, **{"limits.max_delegate_depth": 3})) as gw:
        sid = await gw.create_session()  # support: delegates to researcher
        task = script([{"system": True}, {"tools": True}])
        delegate = {"tool_use": {"name": "delegate", "input": {"task": task}}}
        said = script([delegate], [{"text": "ok"}])
        events = await turn(gw, sid, said)
        [started] = [e for e in events if e.type == "delegate.started"]
        [completed] = [e for e in events if e.type == "delegate.completed"]
        worker = started.payload.worker_session_id
        r = await gw.http.get(f"/sessions/{worker}")
    assert r.json()["agent"] == "researcher"
    assert completed.payload.result == "You research. First prompt.read_file"


async def test_sighup_rereads_the_system_file(tmp_path: Path) -> None:
    """``system_file`` is read again on SIGHUP (gateway.agents.Agents.reload): the next call has it.

    The reload itself is the daemon's SIGHUP handler's one call; a real signal
    to a real daemon is in :func:`test_the_daemon_rereads_system_file_on_sighup`.
    """
    config = agents_config(tmp_path)
    async with running_gateway(config) as gw:
        sid = await gw.create_session(agent="researcher")
        first = await turn(gw, sid, script([{"system": True}]))
        (tmp_path / "researcher.md").write_text("Second prompt.")
        assert final_text(await turn(gw, sid, script([{"system": True}]))) == final_text(first)
        gw.gateway.node.agents.reload()
        second = await turn(gw, sid, script([{"system": True}]))
        os.remove(tmp_path / "researcher.md")  # unreadable now: the prompt it had stays
        gw.gateway.node.agents.reload()
        third = await turn(gw, sid, script([{"system": True}]))
    assert final_text(first) == "You research. First prompt."
    assert final_text(second) == final_text(third) == "Second prompt."


@pytest.mark.slow  # a gateway serve process, signalled
async def test_the_daemon_rereads_system_file_on_sighup(tmp_path: Path) -> None:
    config = tmp_path / "gateway.toml"
    prompt = tmp_path / "prompt.md"
    prompt.write_text("Before.")
    config.write_text(f'[server]\nport = 0\n[model]\nsystem_file = "{prompt}"\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    env["PYTHONPATH"] = str(REPO)
    proc = await trio.lowlevel.open_process(
        [sys.executable, "-m", "gateway", "serve", "--config", str(config)],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        port = await ready_port(proc)
        import httpx

        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:

            async def said() -> str:
                sid = (await http.post("/sessions", json={})).json()["session_id"]
                body = {"content": script([{"system": True}])}
                await http.post(f"/sessions/{sid}/turns", json=body)
                with trio.fail_after(10):
                    while True:
                        page = (await http.get(f"/sessions/{sid}/messages")).json()["messages"]
                        if page[-1]["role"] == "assistant" and page[-1]["status"] == "complete":
                            return str(page[-1]["content"][0]["text"])
                        await trio.sleep(0.05)

            assert await said() == "Before."
            prompt.write_text("After.")
            proc.send_signal(signal.SIGHUP)
            with trio.fail_after(10):
                while True:  # the signal is handled a moment later
                    if await said() == "After.":
                        break
                    await trio.sleep(0.1)
    finally:
        proc.terminate()
        with trio.move_on_after(10):
            await proc.wait()
        if proc.returncode is None:
            proc.kill()
    assert proc.returncode == 0


# --- tools and limits ----------------------------------------------------------------


async def test_an_agent_sees_and_runs_only_its_own_tools(tmp_path: Path) -> None:
    async with running_gateway(agents_config(tmp_path)) as gw:
        sid = await gw.create_session(agent="researcher")
        events = await turn(
            gw, sid,
            script([{"tools": True}, {"tool_use": {"name": "sleep", "input": {"seconds": 0}}}],
                   [{"text": "ok"}]),
        )  # fmt: skip
    assert final_text([e for e in events if e.type == "message.complete"][:1]) == "read_file"
    [failed] = [e for e in events if e.type == "tool.failed"]
    assert failed.payload.error_class == "unknown_tool"
    assert "read_file" in failed.payload.message and "delegate" not in failed.payload.message


async def test_an_agents_approvals_are_its_own(tmp_path: Path) -> None:
    """``support`` requires approval for ``sle*``; ``default`` ([tools]) for nothing."""
    sleep = script([{"tool_use": {"name": "sleep", "input": {"seconds": 0}}}], [{"text": "ok"}])
    async with running_gateway(agents_config(tmp_path)) as gw:
        plain = await gw.create_session(agent="default")
        assert "permission.requested" not in types(await turn(gw, plain, sleep))
        sid = await gw.create_session()
        async with gw.client(sid) as client:
            await client.subscribe()
            await gw.submit(sid, sleep)
            asked = (await client.until(lambda e: e.type == "permission.requested"))[-1]
            assert asked.payload.kind == "tool"
            r = await gw.http.post(
                f"/sessions/{sid}/permissions/{asked.payload.perm_id}", json={"decision": "allow"}
            )
            assert r.status_code == 202
            events = await client.until_turn_ends()
    assert "tool.completed" in types(events)


async def test_max_rounds_ends_a_looping_turn(tmp_path: Path) -> None:
    """``max_rounds = 2``: the second call's tool uses fail unrun, ``stop_reason: max_rounds``."""
    loop = {"tool_use": {"name": "delegate", "input": {"task": "x"}}}
    async with running_gateway(agents_config(tmp_path)) as gw:
        sid = await gw.create_session()
        events = await turn(gw, sid, script([loop], [loop, loop], [{"text": "never"}]))
        # The session is usable: its next turn's history is complete.
        after = await turn(gw, sid, "again")
        messages = (await gw.http.get(f"/sessions/{sid}/messages")).json()["messages"]
    assert types(events).count("llm.call_started") == 2
    assert types(events).count("delegate.started") == 1
    failed = [e.payload for e in events if e.type == "tool.failed"]
    assert [(f.error_class, "max_rounds (2)" in f.message) for f in failed] == [("limit", True)] * 2
    assert events[-1].type == "turn.completed" and events[-1].payload.stop_reason == "max_rounds"
    assert after[-1].payload.stop_reason == "end_turn"
    uses = {b["id"] for m in messages for b in m["content"] if b["type"] == "tool_use"}
    results = {
        b["tool_use_id"] for m in messages for b in m["content"] if b["type"] == "tool_result"
    }
    assert uses == results


async def test_a_model_of_another_provider_than_the_agents_is_422(tmp_path: Path) -> None:
    async with running_gateway(agents_config(tmp_path)) as gw:
        r = await gw.http.post("/sessions", json={"agent": "researcher", "model": "openai:gpt"})
    assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_model"


# --- what reaches a real provider ------------------------------------------------------


@pytest.mark.slow  # over a second on two cores (measured with --durations)
async def test_prompt_temperature_and_thinking_reach_anthropic(
    tmp_path: Path, server: FakeServer
) -> None:
    text = f"""
[model]
provider = "anthropic"
name = "anthropic:claude-sonnet-4-6"
base_url = "{server.base_url}"
max_retries = 0
system = "{SECRET}"
temperature = 0.25

[agents.thinker]
thinking_budget_tokens = 2048
max_tokens = 8192
"""
    server.enqueue(*[Replay(transcript("anthropic/text.sse"))] * 2)
    config = agents_config(tmp_path, text)
    providers = make_providers(config, {"ANTHROPIC_API_KEY": "k"})
    try:
        async with running_gateway(config, providers) as gw:
            for agent in ("default", "thinker"):
                sid = await gw.create_session(agent=agent)
                await turn(gw, sid, "hi")
    finally:
        await providers.aclose()
    plain, thinking = (r.body for r in server.requests)
    assert plain["system"] == thinking["system"] == SECRET
    assert plain["temperature"] == 0.25 and "thinking" not in plain
    assert [t["name"] for t in plain["tools"]] == ["sleep", "read_file", "delegate"]
    assert all(t["input_schema"]["type"] == "object" for t in plain["tools"])
    assert thinking["thinking"] == {"type": "enabled", "budget_tokens": 2048}
    assert "temperature" not in thinking  # the API refuses it with thinking on
    assert thinking["max_tokens"] == 8192


async def test_prompt_temperature_and_effort_reach_an_openai_compatible_server(
    tmp_path: Path, server: FakeServer
) -> None:
    text = f"""
[model]
provider = "openai"
name = "openai:local"
base_url = "{server.base_url}/v1"
max_retries = 0
system = "{SECRET}"
temperature = 1.5
thinking_budget_tokens = 8000
"""
    server.enqueue(Replay(transcript("openai/text.sse")))
    config = agents_config(tmp_path, text)
    providers = make_providers(config, {})
    try:
        async with running_gateway(config, providers) as gw:
            await turn(gw, await gw.create_session(), "hi")
    finally:
        await providers.aclose()
    [body] = [r.body for r in server.requests]
    assert body["messages"][0] == {"role": "system", "content": SECRET}
    assert body["temperature"] == 1.5 and body["reasoning_effort"] == "medium"


# --- config errors: one line, exit 2 ----------------------------------------------------


@pytest.mark.slow  # a gateway serve process per case
@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("[agents.a]\ntools = [\"sleep\", \"rm\"]\n",
         'agents.a.tools[1]: unknown tool "rm"; tools are sleep, read_file, shell, delegate'),
        ("[agents.a]\ntools = [\"mcp__tickets__*\"]\n", 'unknown MCP server "tickets"'),
        ("[agents.a]\ndelegate_agent = \"b\"\n",
         'agents.a.delegate_agent: unknown agent "b"; agents are default, a'),
        ("[agents]\ndefault = \"b\"\n", 'agents.default: unknown agent "b"'),
        ("[agents.a]\nsystem = \"x\"\nsystem_file = \"/y\"\n",
         "agents.a: system and system_file are both set; keep one"),
        ("[model]\nsystem = \"x\"\nsystem_file = \"/y\"\n",
         "model: system and system_file are both set; keep one"),
        ("[agents.a]\nsystem_file = \"/nonexistent/prompt.md\"\n",
         "agents.a.system_file: no such file: /nonexistent/prompt.md"),
        ("[agents.a]\nmodel = \"gpt-4\"\n", 'agents.a.model = "gpt-4" is not one of'),
        ("[agents.a]\nmodel = \"anthropic:claude\"\n",
         'agents.a.model = "anthropic:claude" needs ANTHROPIC_API_KEY'),
        ("[agents.a]\nmax_rounds = 0\n", "agents.a.max_rounds: expected an integer >= 1, got 0"),
        ("[agents.a]\ntemperature = 3\n", "agents.a.temperature: expected a number in 0..2"),
        ("[agents.a__b]\n", 'agents: "a__b" is not a name of letters, digits, - and single _'),
        ("[mcp_servers.t]\ncommand = [\"x\"]\nurl = \"http://h/mcp\"\n",
         "mcp_servers.t: set exactly one of command (stdio) and url (streamable HTTP)"),
        ("[agents.a]\nruntime = \"claude-code\"\n",
         "needs the claude-code extra: pip install 'gateway[claude-code]'"),
    ],
)  # fmt: skip
def test_a_bad_agent_config_is_one_line_and_exit_2(tmp_path: Path, text: str, line: str) -> None:
    path = tmp_path / "gateway.toml"
    path.write_text(text)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GATEWAY_", "ANTHROPIC_"))}
    env["PYTHONPATH"] = str(REPO)
    if "claude-code" in text:
        try:
            import claude_agent_sdk  # noqa: F401

            pytest.skip("the claude-code extra is installed here")
        except ImportError:
            pass
    done = subprocess.run(
        [sys.executable, "-m", "gateway", "serve", "--config", str(path), "--port", "0"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    [printed] = done.stderr.splitlines()
    assert printed.startswith("config error: ") and line in printed, printed


def test_agents_resolve_each_key_from_the_sections(tmp_path: Path) -> None:
    config = agents_config(tmp_path, **{"model.max_tokens": 1000, "turns.timeout_s": 42})
    agents = Agents(config)
    support, researcher, default = agents["support"], agents["researcher"], agents["default"]
    assert agents.default == "support"
    assert (support.max_tokens, support.turn_timeout_s, support.max_rounds) == (1000, 42, 2)
    assert researcher.max_rounds == 25 and researcher.delegate_agent == "researcher"
    assert default.tools == ("sleep", "read_file", "delegate") and default.system == ""
    assert agents["since-removed"] is support  # a stored session's agent that is gone
    assert support.uses_server("x") is False


def test_providers_are_shared_by_agents_that_agree() -> None:
    config = load_config(None, {}, {})
    providers = make_providers(config, {})
    assert isinstance(providers, Providers)
    assert providers.for_agent("default") is providers.for_agent("anything")
    with pytest.raises(ConfigError):
        make_providers(load_config(None, {}, {"model.provider": "anthropic"}), {})


@pytest.mark.parametrize("backend", ["sqlite"])
async def test_a_session_keeps_its_agent_across_a_restart(tmp_path: Path, backend: str) -> None:
    """The store keeps a session's agent (SQLite schema 4): a restarted daemon runs it still."""
    config = agents_config(tmp_path)
    async with running_gateway(config) as gw:
        sid = await gw.create_session(agent="researcher")
    async with running_gateway(config) as gw:
        r = await gw.http.get(f"/sessions/{sid}")
        events = await turn(gw, sid, script([{"system": True}]))
    assert r.json()["agent"] == "researcher"
    assert final_text(events) == "You research. First prompt."

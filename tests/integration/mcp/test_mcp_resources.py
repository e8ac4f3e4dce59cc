"""``mcp_read_resource`` and resource templates (docs/protocol.md §11, gateway.mcp.resources):
a server's resources read through it, never by the gateway, within the result caps.

Against tests/mcp_servers/hostile_a.py (which reads no file: it refuses every URI but its
own ``mem://`` ones, and records what it was asked).
"""

from __future__ import annotations

import builtins
import json
import os
from pathlib import Path
from typing import Any

import pytest
import trio

from gateway.agents import AgentProfile, resolve_agents
from gateway.config import Config
from gateway.errors import ToolError
from gateway.mcp.resources import READ_RESOURCE
from gateway.mcp.tools import MAX_RESULT_BYTES
from gateway.protocol.shapes import ResourceTemplateInfo
from gateway.tools.registry import ToolContext, ToolRegistry
from tests.conftest import running_gateway
from tests.integration.mcp.test_mcp_gateway import mcp_config
from tests.integration.mcp.test_mcp_progress import HOSTILE_A
from tests.integration.mcp.test_mcp_roots import requests
from tests.mcp_support import EVERYTHING, running, server


def ctx() -> ToolContext:
    return ToolContext("ses_a", "turn_1", "toolu_1", "")


async def read(tools: Any, uri: str, server: str = "ha") -> Any:
    return await tools.execute(READ_RESOURCE, {"server": server, "uri": uri}, ctx())


async def test_a_resource_is_read_through_its_server_within_the_caps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    opened: list[str] = []  # what this process opens of /etc/passwd (nothing, ever)
    real_open, real_os_open = builtins.open, os.open

    def spy_open(file: Any, *args: Any, **kwargs: Any) -> Any:
        if "passwd" in str(file):
            opened.append(str(file))
        return real_open(file, *args, **kwargs)

    def spy_os_open(path: Any, *args: Any, **kwargs: Any) -> Any:
        if "passwd" in str(path):
            opened.append(str(path))
        return real_os_open(path, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", spy_open)
    monkeypatch.setattr(os, "open", spy_os_open)
    log = tmp_path / "requests"
    with trio.fail_after(60):
        async with running(
            ha=server(command=HOSTILE_A, env={"HOSTILE_A_LOG": str(log)}),
            ev=server(command=EVERYTHING),
        ) as manager:
            await manager.wait_ready()
            tools = manager.session_tools(ToolRegistry(), "ses_a")
            assert READ_RESOURCE in tools.names()
            [spec] = [s for s in tools.specs() if s.name == READ_RESOURCE]
            # Only the servers with resources (everything.py declares none).
            assert spec.input_schema["properties"]["server"]["enum"] == ["ha"]
            assert tools.source_of(READ_RESOURCE) == "builtin"

            link = await tools.execute("mcp__ha__link", {"uri": "mem://text"}, ctx())
            assert link.content == "see:\n[resource link: mem://text]"
            assert (await read(tools, "mem://text")).content == "hello from mem"
            two = await read(tools, "mem://two")
            assert two.content == "[resource mem://a]\nfirst\n[resource mem://b]\nsecond"
            image = await read(tools, "mem://image")
            assert image.files == [("image/png", b"\x89PNG\r\n\x1a\n")] and image.content == ""
            assert (await read(tools, "mem://textblob")).content == "a text blob: é"
            binary = await read(tools, "mem://bin")
            assert binary.files == [] and "application/octet-stream" in binary.content
            huge = await read(tools, "mem://big?mb=3")
            assert len(huge.content.encode()) < MAX_RESULT_BYTES + 200
            assert huge.content.endswith(f"cut at {MAX_RESULT_BYTES} of its 3145728 bytes]")

            # A hostile link: the URI goes to the server, which refuses; no file is opened here.
            with pytest.raises(ToolError) as err:
                await read(tools, "file:///etc/passwd")
            assert err.value.error_class == "error"
            assert "Resource not found: file:///etc/passwd" in err.value.message
            assert "root:" not in err.value.message
            assert opened == []

            # A server the session does not have (or has, without resources): invalid_input.
            for other in ("ev", "nope", ""):
                with pytest.raises(ToolError) as err:
                    await read(tools, "mem://text", server=other)
                assert err.value.error_class == "invalid_input", other
            for bad in ({"server": "ha"}, {"server": "ha", "uri": ""}, {"server": "ha", "uri": 5}):
                with pytest.raises(ToolError) as err:
                    await tools.execute(READ_RESOURCE, bad, ctx())
                assert err.value.error_class == "invalid_input"

            assert manager.resource_templates() == [
                ResourceTemplateInfo("ha", "mem://{name}", "memory", None, "text/plain")
            ]
    reads = [p["uri"] for p in requests(log, "resources/read")]
    assert "file:///etc/passwd" in reads  # the server was asked, the gateway read nothing
    assert reads.count("mem://text") == 1  # the wrong-server reads never reached it


async def test_the_tool_is_offered_only_to_agents_using_a_server_with_resources() -> None:
    config = Config()
    with trio.fail_after(30):
        async with running(ha=server(command=HOSTILE_A), ev=server(command=EVERYTHING)) as m:
            await m.wait_ready()
            agents = resolve_agents(config)
            base = agents["default"]
            from dataclasses import replace

            uses_ha = replace(base, tools=("mcp__ha__link",))
            uses_ev = replace(base, tools=("mcp__ev__*",))
            names = m.session_tools(ToolRegistry(), "ses_a", uses_ha).names()
            assert names == ["mcp__ha__link", READ_RESOURCE]
            assert READ_RESOURCE not in m.session_tools(ToolRegistry(), "ses_a", uses_ev).names()
            assert m.resource_templates(None, uses_ev.uses_server) == []


@pytest.mark.slow  # a daemon and two server processes
async def test_get_agents_lists_the_resource_templates(tmp_path: Path) -> None:
    servers = {"ha": {"command": HOSTILE_A}, "everything": {"command": EVERYTHING}}
    more = {"agents.plain": {"tools": ["mcp__everything__*"]}}
    config = mcp_config(tmp_path, servers=servers, tools=("mcp__ha__*",), **more)
    with trio.fail_after(60):
        async with running_gateway(config) as gw:
            assert gw.node.mcp is not None
            await gw.node.mcp.wait_ready()
            with trio.fail_after(5):  # listed once it is up, beside its calls
                while not gw.node.mcp.resource_templates():  # noqa: ASYNC110 (no event tells)
                    await trio.sleep(0.01)
            r = await gw.http.get("/agents")
            agents = {a["name"]: a for a in r.json()["agents"]}
            assert agents["default"]["resource_templates"] == [
                {"server": "ha", "uri_template": "mem://{name}", "name": "memory",
                 "mime_type": "text/plain"}
            ]  # fmt: skip
            assert "resource_templates" not in agents["plain"]
            tools = {t["name"]: t for t in agents["default"]["tools"]}
            assert tools[READ_RESOURCE]["source"] == "builtin"
            assert READ_RESOURCE not in {t["name"] for t in agents["plain"]["tools"]}
            assert json.dumps(agents)  # the listing is JSON as a whole


async def test_a_server_dying_or_hanging_in_a_read_fails_the_read_only() -> None:
    with trio.fail_after(60):
        async with running(ha=server(command=HOSTILE_A, tool_timeout_s=1)) as manager:
            await manager.wait_ready()
            tools = manager.session_tools(ToolRegistry(), "ses_a")
            with pytest.raises(ToolError) as err:
                await read(tools, "mem://hang")
            assert err.value.error_class == "timeout"
            with pytest.raises(ToolError) as err:
                await read(tools, "mem://die")
            assert err.value.error_class == "error"
            # Started again on its next use: the next read is answered.
            with trio.fail_after(20):
                while True:
                    try:
                        assert (await read(tools, "mem://text")).content == "hello from mem"
                        break
                    except ToolError:
                        await trio.sleep(0.2)


async def test_a_server_that_never_lists_templates_nor_sets_its_level_still_comes_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from gateway.mcp import resources, server_log

    monkeypatch.setattr(resources, "LIST_TEMPLATES_S", 0.5)
    monkeypatch.setattr(server_log, "ASK_LEVEL_S", 0.5)
    env = {"HOSTILE_A_HANG_START": "1"}
    with trio.fail_after(30):
        async with running(ha=server(command=HOSTILE_A, env=env, startup_timeout_s=10)) as m:
            await m.wait_ready()
            connection = m.connection("ha")
            assert connection is not None and connection.live
            assert connection.resources and m.resource_templates() == []
            tools = m.session_tools(ToolRegistry(), "ses_a")
            assert (await read(tools, "mem://text")).content == "hello from mem"


async def test_a_server_slow_to_list_templates_and_set_its_level_is_not_held_at_its_start() -> None:
    """The two asks were made inside the start, 5 s each: a server answering neither came
    up 10 s late, and never under a ``startup_timeout_s`` below 10 s."""
    env = {"HOSTILE_A_HANG_START": "1"}
    with trio.fail_after(30):
        async with running(ha=server(command=HOSTILE_A, env=env, startup_timeout_s=4)) as m:
            with trio.fail_after(3.5):  # its process and initialize only
                await m.wait_ready()
            connection = m.connection("ha")
            assert connection is not None and connection.live, connection and connection._last_error
            tools = m.session_tools(ToolRegistry(), "ses_a")
            assert (await read(tools, "mem://text")).content == "hello from mem"
            assert m.resource_templates() == []


@pytest.mark.parametrize(
    ("patterns", "asked"),
    [
        ((), False),
        (("mcp__ha__*",), True),  # every tool of the server: its reads too
        (("mcp__*",), True),
        (("*",), True),
        (("mcp__h?__*",), True),
        (("mcp__ha__link",), False),  # one tool of it: not its reads
        (("mcp__other__*",), False),
        ((READ_RESOURCE,), True),  # the tool itself, whatever the server
    ],
)
def test_a_read_is_asked_for_where_the_servers_every_tool_is(
    patterns: tuple[str, ...], asked: bool
) -> None:
    """docs/protocol.md §11 "MCP tools": ``require_approval = ["mcp__ha__*"]`` asks for
    the reads of ha's resources too (an easy trap otherwise: the server's tools asked
    for, its resources read freely)."""
    from dataclasses import replace

    agent: AgentProfile = replace(resolve_agents(Config())["default"], require_approval=patterns)
    read = {"server": "ha", "uri": "mem://text"}
    assert agent.needs_approval(READ_RESOURCE, read) is asked
    bad = agent.needs_approval(READ_RESOURCE, {"server": 7})  # a server that is no name
    assert bad is agent.needs_approval(READ_RESOURCE)  # the patterns alone decide


def test_a_server_name_of_any_size_is_cut_in_the_error() -> None:
    """The model's ``server`` is repeated in the tool's error (``tool.failed``, the next
    call's tool result): a megabyte of it is cut, not stored and sent back whole."""
    from gateway.mcp.resources import ReadResourceTool

    tool = ReadResourceTool({})
    with pytest.raises(ToolError) as caught:
        tool.parse({"server": "x" * 1_000_000, "uri": "mem://text"})
    assert caught.value.error_class == "invalid_input" and len(caught.value.message) < 300

"""MCP's reference server, ``@modelcontextprotocol/server-everything`` from npm: its
``get-tiny-image`` tool's image becomes a file of the session and an image block of
the ``tool_result`` the model is sent (docs/protocol.md §2 "Files", §11 "MCP tools").

The package is installed by the tests with the other JS packages (tests/npm_support.py,
the only thing fetched: from the npm registry); the server runs as a stdio MCP server
of a real daemon (real sockets), the scripted model calls the tool. Skipped, saying
why, where node or npm is missing or the registry cannot be reached.

The scripted model says back the files it was sent (``{"files": true}``: kind, media
type, size, SHA-256 prefix), so the image is seen reaching the model; the conversation
every provider builds from (:func:`gateway.providers.history.rebuild`) is asserted to
keep it inside the tool_result.
"""

from __future__ import annotations

# Polling the captured log for lines no event tells of.
# ruff: noqa: ASYNC110
import hashlib
import io
import json
import logging
import shutil
from pathlib import Path
from typing import Any

import pytest
import trio
from PIL import Image

from gateway.protocol.shapes import ImageBlock, ToolResultBlock
from gateway.providers.history import rebuild
from tests.conftest import Harness, running_gateway
from tests.integration.mcp.test_mcp_gateway import (
    DONE,
    PREFIX,
    call,
    events_id,
    mcp_config,
    run_turn,
    script,
)
from tests.npm_support import npm_prefix as npm_prefix

# slow: node runs the reference server
pytestmark = pytest.mark.slow


@pytest.fixture
def everything(npm_prefix: Path) -> list[str]:
    """The command that runs the reference server on stdio."""
    main = npm_prefix / "node_modules/@modelcontextprotocol/server-everything/dist/index.js"
    assert main.is_file(), f"the package has no {main}"
    return [shutil.which("node") or "node", str(main), "stdio"]


async def test_get_tiny_image_is_a_file_and_an_image_inside_the_tool_result(
    tmp_path: Path, everything: list[str]
) -> None:
    servers = {"everything": {"command": everything, "startup_timeout_s": 30}}
    config = mcp_config(tmp_path, servers=servers, tools=(f"{PREFIX}*",))
    with trio.fail_after(90):
        async with running_gateway(config) as gw:
            sid = await gw.create_session()
            # The model's second round says which files reached it ({"files": true}).
            turn = script([call("get-tiny-image")], [{"files": True}])
            events = await run_turn(gw, sid, turn, 60)
            assert events[-1].type == "turn.completed", [e.type for e in events]
            [done] = [e.payload for e in events if e.type == "tool.completed"]
            assert done.files, done.result
            [image] = done.files
            got = await gw.http.get(f"/sessions/{sid}/files/{image.file_id}")
            listed = (await gw.http.get(f"/sessions/{sid}/messages")).json()["messages"]
            history = rebuild(gw.node.sessions[sid].messages)

    assert done.tool_name == f"{PREFIX}get-tiny-image"
    assert isinstance(image, ImageBlock) and image.media_type == "image/png"
    lines = done.result.splitlines()
    assert lines[0] == "Here's the image you requested:"
    assert f"[image: image/png, {image.size} bytes: {image.file_id}]" in lines
    # The file route gives the PNG back, whole and valid.
    assert got.status_code == 200 and got.headers["content-type"] == "image/png"
    assert len(got.content) == image.size
    with Image.open(io.BytesIO(got.content), formats=["PNG"]) as png:
        png.load()
        assert png.format == "PNG" and png.size[0] > 0
    # The stored tool_result has the image block in its files.
    tool_use_id = events_id(events, f"{PREFIX}get-tiny-image")
    [stored] = [b for m in listed for b in m["content"] if b.get("tool_use_id") == tool_use_id]
    assert stored["type"] == "tool_result" and stored["files"] == [
        {"type": "image", "file_id": image.file_id, "media_type": "image/png", "size": image.size}
    ]
    # The (scripted) model got those bytes, inside the tool_result.
    digest = hashlib.sha256(got.content).hexdigest()[:8]
    assert listed[-1]["role"] == "assistant"
    assert listed[-1]["content"] == [
        {"type": "text", "text": f"[image image/png {image.size} bytes sha256:{digest}]"}
    ]
    # What every provider builds its request from keeps it inside the tool_result.
    [result] = [
        b
        for m in history
        for b in m.content
        if isinstance(b, ToolResultBlock) and b.tool_use_id == tool_use_id
    ]
    assert result.files == [image]


# --- sampling, elicitations (form and URL), tasks (docs/protocol.md §11) ------------------


async def _b_turn_with_permission(
    gw: Any, sid: str, tool: str, args: dict[str, Any], body: dict[str, Any]
) -> tuple[Any, list[Any]]:
    """Run ``tool`` in a turn, answer its permission request with ``body``; its request, events."""
    async with gw.client(sid) as client:
        await client.subscribe()
        await gw.submit(sid, script([call(tool, **args)], [{"text": "done"}]))
        with trio.fail_after(60):
            asked = await client.until(lambda e: e.type == "permission.requested")
            request = asked[-1].payload
            route = f"/sessions/{sid}/permissions/{request.perm_id}"
            r = await gw.http.post(route, json=body)
            assert r.status_code == 202, r.text
            await client.until_turn_ends()
    return request, client.events


async def test_b_sampling_elicitations_and_tasks(tmp_path: Path, everything: list[str]) -> None:
    """Sampling answered by the scripted model after an allow; a form and a URL elicitation
    answered; the task-only tool fails with the server's reason (the mcp SDK has no tasks)."""
    servers = {"everything": {"command": everything, "startup_timeout_s": 30}}
    config = mcp_config(tmp_path, servers=servers, tools=(f"{PREFIX}*",))
    with trio.fail_after(180):
        async with running_gateway(config) as gw:
            sid = await gw.create_session()
            assert gw.node.mcp is not None
            await gw.node.mcp.wait_ready()
            tools = {t["name"] for a in (await gw.http.get("/agents")).json()["agents"]
                     for t in a["tools"]}  # fmt: skip
            for name in ("trigger-sampling-request", "trigger-elicitation-request",
                         "trigger-url-elicitation", "simulate-research-query"):  # fmt: skip
                assert f"{PREFIX}{name}" in tools, sorted(tools)

            # Sampling: asked (kind sampling, the server's prompt shown), allowed, answered.
            request, events = await _b_turn_with_permission(
                gw, sid, "trigger-sampling-request", {"prompt": "hello", "maxTokens": 50},
                {"decision": "allow"},
            )  # fmt: skip
            assert request.kind == "sampling"
            assert request.input["system_prompt"] == "You are a helpful test server."
            text = "Resource trigger-sampling-request context: hello"
            assert request.input["messages"] == [{"role": "user", "text": text}]
            assert request.input["max_tokens"] == 50
            sampled = [e.payload for e in events if e.type == "llm.call_completed"]
            assert [c.purpose for c in sampled].count("sampling") == 1
            [done] = [e.payload for e in events if e.type == "tool.completed"]
            assert f"You said: {text}" in done.result, done.result
            assert '"model": "scripted:echo"' in done.result

            # A form elicitation, answered with content that fits its schema.
            request, events = await _b_turn_with_permission(
                gw, sid, "trigger-elicitation-request", {},
                {"decision": "allow", "content": {"name": "Ada"}},
            )  # fmt: skip
            assert request.kind == "elicitation" and request.requested_schema["required"] == [
                "name"
            ]
            [done] = [e.payload for e in events if e.type == "tool.completed"]
            assert "User provided the requested information" in done.result, done.result
            assert "Ada" in done.result

            # A URL-mode elicitation: the URL shown, the user went (allow).
            url = "https://example.com/authorize?state=1"
            request, events = await _b_turn_with_permission(
                gw, sid, "trigger-url-elicitation", {"url": url, "message": "Authorize"},
                {"decision": "allow"},
            )  # fmt: skip
            assert (request.kind, request.input, request.message) == (
                "elicitation_url", {"url": url}, "Authorize",
            )  # fmt: skip
            [done] = [e.payload for e in events if e.type == "tool.completed"]
            assert "User completed the URL elicitation flow" in done.result, done.result

            # Its error path (-32042, URL elicitation required): the prerequisite URL is
            # asked, accepted, and the call made again, which then asks its own URL.
            async with gw.client(sid) as client:
                await client.subscribe()
                args = {"url": url, "errorPath": True}
                await gw.submit(
                    sid, script([call("trigger-url-elicitation", **args)], [{"text": "done"}])
                )
                with trio.fail_after(60):
                    for expected in ("https://modelcontextprotocol.io", url):
                        asked = await client.until(lambda e: e.type == "permission.requested")
                        request = asked[-1].payload
                        assert request.kind == "elicitation_url"
                        assert request.input == {"url": expected}, request.input
                        route = f"/sessions/{sid}/permissions/{request.perm_id}"
                        r = await gw.http.post(route, json={"decision": "allow"})
                        assert r.status_code == 202, r.text
                    await client.until_turn_ends()
            [done] = [e.payload for e in client.events if e.type == "tool.completed"]
            assert "User completed the URL elicitation flow" in done.result, done.result

            # Tasks: the SDK's client has no tasks/* (docs/protocol.md §11): a tool that runs
            # only as a task fails, with the server's reason, and the turn goes on.
            events = await run_turn(
                gw, sid, script([call("simulate-research-query", topic="x")], [{"text": "ok"}]),
                60,
            )  # fmt: skip
            [failed] = [e.payload for e in events if e.type == "tool.failed"]
            assert failed.error_class == "error", failed
            assert "requires task augmentation" in failed.message, failed.message
            assert events[-1].type == "turn.completed"


# --- progress, logging, roots and resources (docs/protocol.md §11 "MCP tools") -------------


def _session_server(everything: list[str]) -> dict[str, dict[str, object]]:
    """The reference server of one session (``scope = "session"``: its roots are its own)."""
    return {"everything": {"command": everything, "startup_timeout_s": 30, "scope": "session"}}


async def _tools_of(gw: Harness, sid: str, *names: str) -> None:
    """Wait until the session's server lists ``names`` (some it registers once initialized)."""
    assert gw.node.mcp is not None
    with trio.fail_after(30):
        while True:
            listed = {t.name for t in gw.node.mcp.tools(sid)}
            if all(PREFIX + n in listed for n in names):
                return
            await trio.sleep(0.1)


async def test_a_echo_sum_and_structured_content(tmp_path: Path, everything: list[str]) -> None:
    servers = {"everything": {"command": everything, "startup_timeout_s": 30}}
    config = mcp_config(tmp_path, servers=servers, tools=(f"{PREFIX}*",))
    with trio.fail_after(90):
        async with running_gateway(config) as gw:
            sid = await gw.create_session()
            tools = [
                call("echo", message="hi"),
                call("get-sum", a=2, b=3),
                call("get-structured-content", location="New York"),
            ]
            events = await run_turn(gw, sid, script(tools, [{"text": "done"}]), 60)
    assert events[-1].type == "turn.completed", [e.type for e in events]
    done = {
        e.payload.tool_name[len(PREFIX) :]: e.payload for e in events if e.type == "tool.completed"
    }
    assert done["echo"].result == "Echo: hi"
    assert done["get-sum"].result == "The sum of 2 and 3 is 5."
    structured = done["get-structured-content"].structured_result
    assert set(structured) == {"temperature", "conditions", "humidity"}
    assert json.loads(done["get-structured-content"].result) == structured


async def test_a_long_running_operation_streams_progress_to_a_websocket_client(
    tmp_path: Path, everything: list[str]
) -> None:
    servers = {"everything": {"command": everything, "startup_timeout_s": 30}}
    config = mcp_config(tmp_path, servers=servers, tools=(f"{PREFIX}*",))
    long = call("trigger-long-running-operation", duration=1.5, steps=5)
    with trio.fail_after(90):
        async with running_gateway(config) as gw:
            sid = await gw.create_session()
            events = await run_turn(gw, sid, script([long], [{"text": "done"}]), 60)
    assert events[-1].type == "turn.completed", [e.type for e in events]
    progress = [e.payload for e in events if e.type == "tool.progress"]
    called = events_id(events, f"{PREFIX}trigger-long-running-operation")
    # Five steps 0.3 s apart: each its own event (a daemon stalled past 100 ms may coalesce two).
    assert {p.tool_use_id for p in progress} == {called} and {p.total for p in progress} == {5.0}
    values = [p.progress for p in progress]
    assert 3 <= len(values) <= 5 and values == sorted(set(values)) and values[-1] == 5.0
    kinds = [e.type for e in events]
    assert kinds.index("tool.called") < kinds.index("tool.progress")
    assert kinds.index("tool.completed") > len(kinds) - 1 - kinds[::-1].index("tool.progress")


async def test_a_roots_are_the_sessions_workspace_and_its_logs_reach_the_daemons_log(
    tmp_path: Path, everything: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, "gateway.mcp")  # the server is asked for debug and up
    config = mcp_config(tmp_path, servers=_session_server(everything), tools=(f"{PREFIX}*",))
    with trio.fail_after(90):
        async with running_gateway(config) as gw:
            sid = await gw.create_session()
            await run_turn(gw, sid, script([{"text": "start"}]), 60)  # its servers start
            await _tools_of(gw, sid, "get-roots-list")
            turn = script([call("get-roots-list"), call("toggle-simulated-logging")], DONE)
            events = await run_turn(gw, sid, turn, 60)
            workspace = gw.node.workspaces.host_path(gw.node.sessions[sid].record.workspace_path)
            with trio.fail_after(10):  # its roots' line, and a simulated one (sent at once)
                while not (_said(caplog, "root(s) received") and _said(caplog, *SIMULATED)):
                    await trio.sleep(0.1)
    done = {
        e.payload.tool_name[len(PREFIX) :]: e.payload for e in events if e.type == "tool.completed"
    }
    roots = done["get-roots-list"].result
    assert "Current MCP Roots (1 total)" in roots, roots
    assert f"URI: {Path(workspace).as_uri()}" in roots
    lines = [r for r in caplog.records if _event(r) == "mcp_server_log"]
    assert _said(caplog, "root(s) received from client")
    assert all(r.fields["server"] == "everything" for r in lines)  # type: ignore[attr-defined]
    assert "mcp_server_log" not in {e.type for e in events}  # never a client's


async def test_a_resource_link_is_read_with_mcp_read_resource(
    tmp_path: Path, everything: list[str]
) -> None:
    servers = {"everything": {"command": everything, "startup_timeout_s": 30}}
    config = mcp_config(tmp_path, servers=servers, tools=(f"{PREFIX}*",))
    uri = "demo://resource/dynamic/text/2"
    read = {
        "tool_use": {"name": "mcp_read_resource", "input": {"server": "everything", "uri": uri}}
    }
    passwd = {"server": "everything", "uri": "file:///etc/passwd"}
    hostile = {"tool_use": {"name": "mcp_read_resource", "input": passwd}}
    with trio.fail_after(90):
        async with running_gateway(config) as gw:
            sid = await gw.create_session()
            turn = script([call("get-resource-links", count=2)], [read, hostile], DONE)
            events = await run_turn(gw, sid, turn, 60)
            agents = (await gw.http.get("/agents")).json()["agents"]
    assert events[-1].type == "turn.completed", [e.type for e in events]
    [links] = [
        e.payload for e in events if e.type == "tool.completed" and "links" in e.payload.result
    ]
    assert f"[resource link: {uri}]" in links.result
    [got] = [
        e.payload
        for e in events
        if e.type == "tool.completed" and e.payload.tool_name == "mcp_read_resource"
    ]
    assert got.result.startswith("Resource 2: This is a plaintext resource")
    [refused] = [e.payload for e in events if e.type == "tool.failed"]
    assert refused.tool_name == "mcp_read_resource" and refused.error_class == "error"
    assert "root:" not in refused.message
    templates = {t["uri_template"] for t in agents[0]["resource_templates"]}
    assert "demo://resource/dynamic/text/{resourceId}" in templates


SIMULATED = ("-level message", "level-message")
"""What the server's simulated log lines say (its alert's is ``Alert level-message``)."""


def _event(record: logging.LogRecord) -> str | None:
    return getattr(record, "event", None)


def _said(caplog: pytest.LogCaptureFixture, *texts: str) -> bool:
    """Whether a ``mcp_server_log`` line says one of ``texts``."""
    lines = [r for r in caplog.records if _event(r) == "mcp_server_log"]
    return any(text in r.getMessage() for r in lines for text in texts)

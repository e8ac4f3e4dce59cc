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

import hashlib
import io
import shutil
from pathlib import Path

import pytest
import trio
from PIL import Image

from gateway.protocol.shapes import ImageBlock, ToolResultBlock
from gateway.providers.history import rebuild
from tests.conftest import running_gateway
from tests.integration.mcp.test_mcp_gateway import (
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

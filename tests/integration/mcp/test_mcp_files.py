"""An MCP tool's images and audio become files of the session (docs/protocol.md §2 "Files",
§11 "MCP tools"): in ``tool.completed``'s ``files``, in the stored ``tool_result``'s
``files``, on the file route; refused ones a line of the result, never a failed tool.

Against tests/mcp_servers/everything.py (its ``picture`` and ``image`` tools) through a
real daemon and the scripted model; the reference server's own ``get-tiny-image`` is
tests/system/mcp/test_mcp_everything_js.py.
"""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio

from gateway.protocol.events import Event
from tests.conftest import Harness, running_gateway
from tests.files_support import PDF, png
from tests.integration.mcp.test_mcp_gateway import (
    DONE,
    PREFIX,
    call,
    events_id,
    mcp_config,
    run_turn,
    script,
)
from tests.mcp_servers.everything import AUDIO, PICTURE


def completed(events: list[Event], tool: str) -> Any:
    [payload] = [
        e.payload
        for e in events
        if e.type == "tool.completed" and e.payload.tool_name == PREFIX + tool
    ]
    return payload


def file_id(data: bytes) -> str:
    return "file_" + hashlib.sha256(data).hexdigest()[:32]


async def results(gw: Harness, sid: str) -> dict[str, dict[str, Any]]:
    r = await gw.http.get(f"/sessions/{sid}/messages")
    return {
        b["tool_use_id"]: b
        for m in r.json()["messages"]
        for b in m["content"]
        if b["type"] == "tool_result"
    }


@pytest.mark.slow  # an MCP server process (about a second and a half to start)
async def test_an_mcp_tools_image_and_audio_are_files_and_what_is_refused_a_line(
    tmp_path: Path,
) -> None:
    config = mcp_config(tmp_path, files={"max_per_session": 2})
    image, audio = base64.b64decode(PICTURE), base64.b64decode(AUDIO)
    with trio.fail_after(45):
        async with running_gateway(config) as gw:
            sid = await gw.create_session()
            events = await run_turn(gw, sid, script([call("picture"), call("image")], DONE))
            assert events[-1].type == "turn.completed", [e.type for e in events]
            stored = await results(gw, sid)
            got = {
                kind: await gw.http.get(f"/sessions/{sid}/files/{file_id(data)}")
                for kind, data in (("image", image), ("audio", audio))
            }

            # Another session of two files already: the tool's files are past its limit.
            other = await gw.create_session()
            for data, media_type in ((png(3, 3), "image/png"), (PDF, "application/pdf")):
                r = await gw.http.post(
                    f"/sessions/{other}/files", content=data, headers={"Content-Type": media_type}
                )
                assert r.status_code == 201, r.text
            refused = await run_turn(gw, other, script([call("picture")], DONE))
            refused_stored = await results(gw, other)

    picture = completed(events, "picture")
    assert [(type(f).__name__, f.file_id, f.media_type, f.size) for f in picture.files] == [
        ("ImageBlock", file_id(image), "image/png", len(image)),
        ("AudioBlock", file_id(audio), "audio/wav", len(audio)),
    ]
    assert picture.result.splitlines() == [
        "a picture and a sound:",
        "[resource link: file:///more.png]",  # a resource link stays text
        f"[image: image/png, {len(image)} bytes: {file_id(image)}]",
        f"[audio: audio/wav, {len(audio)} bytes: {file_id(audio)}]",
    ]
    # The bytes are on the file route, never in an event.
    assert got["image"].status_code == 200 and got["image"].content == image
    assert got["image"].headers["content-type"] == "image/png"
    assert got["audio"].status_code == 200 and got["audio"].content == audio
    assert got["audio"].headers["content-type"] == "audio/wav"
    wire = msgspec.json.encode(events)
    assert PICTURE[:40].encode() not in wire and b'"files"' in wire
    # The stored tool_result names the same files (the model gets the image inside it).
    kept = stored[events_id(events, PREFIX + "picture")]
    assert kept["files"] == [
        {"type": "image", "file_id": file_id(image), "media_type": "image/png", "size": len(image)},
        {"type": "audio", "file_id": file_id(audio), "media_type": "audio/wav", "size": 12},
    ]
    assert kept["content"] == picture.result and not kept["is_error"]

    # An image that is not one: a line saying why, no files, the tool completed.
    bad = completed(events, "image")
    assert bad.files is msgspec.UNSET
    assert bad.result.startswith(
        "a picture:\n[image: image/png, 8 bytes, not kept: the file is not a valid image/png"
    )
    assert "files" not in stored[events_id(events, PREFIX + "image")]

    # Past the session's limit: lines naming it; the turn goes on.
    assert refused[-1].type == "turn.completed"
    late = completed(refused, "picture")
    assert late.files is msgspec.UNSET
    lines = late.result.splitlines()
    assert lines[2].startswith(f"[image: image/png, {len(image)} bytes, not kept: the session")
    assert lines[3].startswith(f"[audio: audio/wav, {len(audio)} bytes, not kept: the session")
    assert "max_per_session" in lines[2]
    assert "files" not in refused_stored[events_id(refused, PREFIX + "picture")]

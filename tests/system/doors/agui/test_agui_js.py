"""The official AG-UI JS client (``@ag-ui/client``, from npm) runs turns (docs/doors/agui.md).

The test installs ``@ag-ui/client`` into a temporary directory (``npm install
--prefix``, quiet, once per test run: tests/npm_support.py) and runs
tests/agui_js/run.mjs, whose ``HttpAgent`` talks to a running gateway: a run
streams text whose deltas concatenate to the final message, a tool call that
waits for approval ends the run with an interrupt and the next run resumes it,
the call arriving with its args and result; tests/agui_js/files.mjs sends a
picture as an image part and as the legacy binary part, and the thread's
snapshot shows it by its URL (docs/doors/agui.md "Files"). The client verifies every event
itself (``verifyEvents``, and its schemas): any violation rejects ``runAgent``
and the script exits non-zero.

Skipped, saying why, where node or npm is missing or the registry cannot be
reached (.ci/run installs node and npm).
"""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import uuid
from pathlib import Path

import pytest
import trio

from tests.conftest import make_config, running_gateway
from tests.files_support import png, said_back
from tests.npm_support import npm_prefix as npm_prefix
from tests.paths import TESTS

# slow: node runs the AG-UI client's tests
pytestmark = pytest.mark.slow

SCRIPT = TESTS / "agui_js" / "run.mjs"
REATTACH = TESTS / "agui_js" / "reattach.mjs"
FILES = TESTS / "agui_js" / "files.mjs"


@pytest.fixture
def node_modules(npm_prefix: Path) -> Path:
    return npm_prefix / "node_modules"


async def test_the_official_js_client_streams_text_and_a_resumed_tool_call(
    tmp_path: Path, node_modules: Path
) -> None:
    config = make_config(tmp_path, **{"tools.require_approval": ["sleep"]})
    with trio.fail_after(60):
        async with running_gateway(config) as h:
            done = await trio.run_process(
                [shutil.which("node") or "node", str(SCRIPT), str(node_modules), h.base],
                capture_stdout=True,
                capture_stderr=True,
                check=False,
            )
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    out = json.loads(done.stdout)

    text = out["text"]
    assert text["types"][0] == "RUN_STARTED" and text["types"][-1] == "RUN_FINISHED"
    assert "REASONING_MESSAGE_CONTENT" in text["types"]
    assert text["deltas"] == text["final"] == "Hello from the gateway."

    interrupt = out["interrupt"]
    assert interrupt["types"][:2] == ["RUN_STARTED", "MESSAGES_SNAPSHOT"]
    assert interrupt["outcome"]["type"] == "interrupt"
    assert interrupt["pending"] == [i["id"] for i in interrupt["outcome"]["interrupts"]]

    tool = out["tool"]
    assert tool["name"] == "sleep" and tool["args"] == {"seconds": 0.01}
    assert json.loads(tool["streamedArgs"]) == tool["args"]
    assert tool["result"] == "slept 0.01 s"
    assert tool["deltas"] == tool["final"] == "All done."
    assert tool["types"][-1] == "RUN_FINISHED" and tool["pendingAfter"] == 0


async def test_the_official_js_client_verifies_a_run_resumed_at_every_event(
    tmp_path: Path, node_modules: Path
) -> None:
    """tests/agui_js/reattach.mjs: every resumed stream passes ``@ag-ui/client``'s verification."""
    with trio.fail_after(120):
        async with running_gateway(make_config(tmp_path)) as h:
            done = await trio.run_process(
                [shutil.which("node") or "node", str(REATTACH), str(node_modules), h.base],
                capture_stdout=True,
                capture_stderr=True,
                check=False,
            )
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    out = json.loads(done.stdout)
    assert out["types"][0] == "RUN_STARTED" and out["types"][-1] == "RUN_FINISHED"
    assert all(out["ids"]) and len(set(out["ids"])) == len(out["ids"])
    assert {"TOOL_CALL_ARGS", "REASONING_MESSAGE_CONTENT", "TEXT_MESSAGE_CONTENT"} <= set(
        out["types"]
    )
    assert [r["k"] for r in out["resumed"]] == list(range(len(out["types"]) + 1))
    # No Last-Event-ID: the whole run, its messages whole (docs/doors/agui.md).
    whole = out["resumed"][0]["types"]
    assert [t for t in whole if "CONTENT" not in t and t != "TOOL_CALL_ARGS"] == [
        t for t in out["types"] if "CONTENT" not in t and t != "TOOL_CALL_ARGS"
    ]
    for r in out["resumed"]:
        assert r["types"][0] == "RUN_STARTED" and r["types"][-1] == "RUN_FINISHED"


async def test_the_official_js_client_sends_a_picture_and_sees_it_by_url(
    tmp_path: Path, node_modules: Path
) -> None:
    image = png(8, 8)
    thread = f"js-files-{uuid.uuid4()}"
    with trio.fail_after(90):
        async with running_gateway(make_config(tmp_path)) as h:
            b64 = base64.b64encode(image).decode()
            node = shutil.which("node") or "node"
            done = await trio.run_process(
                [node, str(FILES), str(node_modules), h.base, thread, b64],
                capture_stdout=True,
                capture_stderr=True,
                check=False,
            )
            stored = (await h.http.get(f"/sessions/{thread}/messages")).json()["messages"]
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    out = json.loads(done.stdout)
    # The model got the picture's very bytes, both ways (the scripted model says them back).
    got = said_back("image", "image/png", image)
    assert out["modern"] == "You said: What is this?" + got
    assert out["legacy"] == "You said: And this?" + got
    file_id = "file_" + hashlib.sha256(image).hexdigest()[:32]
    block = {"type": "image", "file_id": file_id, "media_type": "image/png", "size": len(image)}
    users = [m["content"] for m in stored if m["role"] == "user"]
    assert users[0] == [{"type": "text", "text": "What is this?"}, block]
    assert users[1] == [block, {"type": "text", "text": "And this?"}]
    shown = [m for m in out["snapshot"] if m["role"] == "user"]
    url = {"type": "url", "value": f"/sessions/{thread}/files/{file_id}", "mimeType": "image/png"}
    assert shown[0]["content"][1]["source"] == url
    assert shown[1]["content"][0]["source"] == url
    assert b64 not in done.stdout.decode().split('"snapshot"')[1]  # the bytes never came back

"""The official A2A JS client (``@a2a-js/sdk`` 1.x, from npm) on the A2A door (docs/doors/a2a.md).

The test installs the package with the other npm packages of the suite
(tests/npm_support.py) and runs tests/a2a_js/run.mjs, whose ``ClientFactory``
reads the card (with the key, through its ``fetchImpl``), picks the JSON-RPC
transport and parses every event into its own types: a task streamed to its
end, a second one dropped mid-reply and resubscribed from its cursor
(``Last-Event-ID`` through ``serviceParameters``) with nothing lost or
repeated, and another key's task not found.

Skipped, saying why, where node or npm is missing or the registry cannot be
reached (.ci/run installs node and npm).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import trio

from tests.conftest import make_config, running_gateway
from tests.npm_support import npm_prefix as npm_prefix
from tests.paths import TESTS
from tests.scripts import SLOW_TEXT, TEXT

# slow: node runs the A2A client
pytestmark = pytest.mark.slow

SCRIPT = TESTS / "a2a_js" / "run.mjs"
SUBMITTED, WORKING, COMPLETED = 1, 2, 3  # TaskState, as the JS client's enum numbers it


async def test_the_official_js_client_streams_and_resubscribes(
    tmp_path: Path, npm_prefix: Path
) -> None:
    config = make_config(tmp_path, **{"auth.api_keys": ["key-a", "key-b"]})
    env = {**os.environ, "WHOLE": json.dumps(TEXT), "DROPPED": json.dumps(SLOW_TEXT)}
    with trio.fail_after(90):
        async with running_gateway(config) as h:
            modules = str(npm_prefix / "node_modules")
            done = await trio.run_process(
                [shutil.which("node") or "node", str(SCRIPT), modules, h.base, "key-a", "key-b"],
                capture_stdout=True,
                capture_stderr=True,
                check=False,
                env=env,
            )
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    out = json.loads(done.stdout)

    whole = out["whole"]
    assert whole["states"] == [f"task:{SUBMITTED}", WORKING, COMPLETED]
    assert whole["text"] == out["got"]["text"] == "Hello there, friend."
    assert out["got"]["state"] == COMPLETED
    assert len(whole["cursors"]) == len(whole["kinds"])  # every event carries its cursor

    first, rest = out["first"], out["rest"]
    assert first["text"] and rest["text"]
    assert first["text"] + rest["text"] == out["dropped"]  # nothing lost, nothing repeated
    assert len(out["dropped"].split()) == 400
    assert rest["states"] == [f"task:{WORKING}", COMPLETED]
    assert out["otherError"] == "JsonRpcTaskNotFoundError"  # the SDK's class for -32001

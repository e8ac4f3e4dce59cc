"""A ``claude-code`` turn's images and documents reach the CLI through the SDK's streaming
input as the Messages API's content blocks, with the files' bytes (docs/protocol.md §2
"Files", §11, the ``claude-code`` runtime).

Offline as :mod:`tests.system.claude_code.test_claude_code`: the real Claude Code CLI
behind a real gateway, the fake Anthropic API recording every model call, and what the
gateway writes to the CLI's stdin recorded too.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest

from bench.fake_api import FakeServer, Replay, transcript
from tests.claude_code_support import CLAUDE_CODE_MARKS, gateway, only_model_calls, run_turn
from tests.claude_code_support import server as server
from tests.conftest import running_gateway, types
from tests.files_support import PDF, png
from tests.integration.files.test_file_routes import upload
from tests.system.claude_code.test_claude_code_busy import stdin

pytestmark = CLAUDE_CODE_MARKS


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


async def test_a_turns_image_and_document_reach_the_cli_and_the_model_as_blocks(
    tmp_path: Path, server: FakeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    server.enqueue(Replay(transcript("anthropic/text.sse")))
    written = stdin(monkeypatch)
    image = png(6, 4)
    config, providers = await gateway(tmp_path, server, monkeypatch, sandbox="false")
    async with running_gateway(config, providers) as gw:
        sid = await gw.create_session()
        pic = await upload(gw, sid, image, "image/png")
        doc = await upload(gw, sid, PDF, "application/pdf")
        content: list[dict[str, Any]] = [
            {"type": "text", "text": "what is in these?"},
            {"type": "image", "file_id": pic["file_id"]},
            {"type": "document", "file_id": doc["file_id"]},
        ]
        async with gw.client(sid) as client:
            await client.subscribe()
            r = await gw.http.post(f"/sessions/{sid}/turns", json={"content": content})
            assert r.status_code == 202, r.text
            events = await client.until_turn_ends()
        # A fork of the session has the files too (its CLI resumes the transcript).
        r = await gw.http.post(f"/sessions/{sid}/fork", json={})
        assert r.status_code == 201, r.text
        fork = r.json()["session_id"]
        forked = await gw.http.get(f"/sessions/{fork}/files/{pic['file_id']}")
    await providers.aclose()
    assert events[-1].type == "turn.completed", [e.type for e in events]
    # The CLI's stdin: one user message, the blocks with the files' bytes.
    [frame] = written
    assert frame["message"]["content"] == [
        {"type": "text", "text": "what is in these?"},
        {
            "type": "image",
            "source": {"type": "base64", "media_type": "image/png", "data": b64(image)},
        },
        {
            "type": "document",
            "source": {"type": "base64", "media_type": "application/pdf", "data": b64(PDF)},
        },
    ]
    # The model got them from the CLI, the same bytes.
    [call] = server.requests
    [user] = [m for m in call.body["messages"] if m["role"] == "user"]
    sent = {b["type"]: b for b in user["content"] if isinstance(b, dict)}
    assert sent["image"]["source"]["data"] == b64(image)
    assert sent["document"]["source"]["data"] == b64(PDF)
    assert forked.status_code == 200 and forked.content == image
    only_model_calls(server)


async def test_a_turn_that_starts_with_a_slash_is_text_for_the_model_not_a_cli_command(
    tmp_path: Path, server: FakeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client's ``/model claude-opus-4-1`` (or ``/cost``, ``/clear``, ``/fast``...) is a
    user message like any other: the model answers it, on the agent's model; Claude Code
    never runs it as its own command (which would switch the operator's model, or end the
    turn with no answer at all)."""
    for _ in range(2):
        server.enqueue(Replay(transcript("anthropic/text.sse")))
    config, providers = await gateway(tmp_path, server, monkeypatch, sandbox="false")
    async with running_gateway(config, providers) as gw:
        sid = await gw.create_session()
        switched = await run_turn(gw, sid, "/model claude-opus-4-1")
        cost = await run_turn(gw, sid, "/cost")
    await providers.aclose()
    for events in (switched, cost):
        assert "llm.call_completed" in types(events), types(events)
        assert events[-1].type == "turn.completed" and events[-1].payload.stop_reason == "end_turn"
    assert {r.body["model"] for r in server.requests} == {"claude-sonnet-4-6"}
    [first, second] = [json.dumps(r.body["messages"]) for r in server.requests]
    assert "/model claude-opus-4-1" in first and "/cost" in second
    assert "local-command" not in first + second  # no command of Claude Code's ran
    only_model_calls(server)

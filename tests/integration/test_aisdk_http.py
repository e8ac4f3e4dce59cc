"""The AI SDK's HTTP doors over a real socket (docs/protocol.md §14).

``POST /ai-sdk/chat`` (``DefaultChatTransport``'s request), its resume
``GET /ai-sdk/chat/{id}/stream`` and ``POST /ai-sdk/chat/{id}/stop``, driven
with httpx on 127.0.0.1 port 0. Each answer is read by
:class:`tests.aisdk_support.UiMessage`, which applies the chunks as the ``ai``
package does and fails on what it would reject.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from tests.aisdk_support import UiMessage, read, request, user
from tests.conftest import TOOL_SCRIPT, Harness, make_config, running_gateway

TEXT = {"script": {"rounds": [[{"text": "Hello there, friend."}]]}}
LONG_NAP = {
    "script": {
        "rounds": [
            [{"text": "Napping."}, {"tool_use": {"name": "sleep", "input": {"seconds": 60}}}],
            [{"text": "Awake."}],
        ]
    }
}
APPROVAL = {"tools.require_approval": ["sleep"]}


async def chat(h: Harness, body: dict[str, Any], message: UiMessage | None = None) -> UiMessage:
    async with h.http.stream("POST", "/ai-sdk/chat", json=body) as r:
        assert r.status_code == 200, (await r.aread()).decode()
        assert r.headers["content-type"] == "text/event-stream"
        assert r.headers["x-vercel-ai-ui-message-stream"] == "v1"
        return await read(r, message)


@asynccontextmanager
async def gateway(tmp_path: Path, **overrides: Any) -> AsyncIterator[Harness]:
    with trio.fail_after(30):
        async with running_gateway(make_config(tmp_path, **overrides)) as h:
            yield h


def types(m: UiMessage) -> list[str]:
    return [c["type"] for c in m.chunks]


async def test_a_turn_streams_reasoning_text_and_a_tool_round_as_one_message(
    tmp_path: Path,
) -> None:
    async with gateway(tmp_path) as h:
        chat_id = f"chat-{uuid.uuid4()}"
        m = await chat(h, request(chat_id, user(TOOL_SCRIPT)))
        assert types(m)[0] == "start" and types(m)[-1] == "finish"
        assert m.finish_reason == "stop"
        assert types(m).count("start-step") == 2 == types(m).count("finish-step")
        [reasoning] = [p for p in m.parts if p["type"] == "reasoning"]
        assert reasoning["text"] == "Let me check." and reasoning["state"] == "done"
        [tool] = [p for p in m.parts if p["type"] == "dynamic-tool"]
        assert tool["toolName"] == "sleep" and tool["input"] == {"seconds": 0.01}
        assert tool["state"] == "output-available" and tool["output"]
        assert m.text == "Running it now.All done."
        turn = m.metadata["gateway"]["turnId"]
        assert m.id == f"msg_{turn}"
        assert m.metadata["gateway"]["usage"]["output_tokens"] >= 0
        # The chat is a gateway session: its stored messages are what streamed.
        r = await h.http.get(f"/sessions/{chat_id}/messages")
        assert r.json()["messages"][-1]["content"][0]["text"] == "All done."

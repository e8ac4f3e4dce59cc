"""The AI SDK's doors on a busy chat, adversarially (docs/doors/aisdk.md, docs/protocol.md §2
"A busy session"): a request aborted while its turn waits in the queue, an approval
answered elsewhere while a continuation decides it.

Rules as in tests/conftest.py: a real gateway on 127.0.0.1 port 0, trio-websocket
speaking ``WebSocketChatTransport``'s frames, ``fail_after`` caps, nothing waited
for by sleeping: the socket's reader takes frames in order, so a request's answer
after an ``abort`` says the abort was handled.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
import trio
from trio_websocket import open_websocket_url

from tests.aisdk_support import gateway, read, request, user, ws_url
from tests.conftest import TOOL_SCRIPT
from tests.integration.doors.aisdk.test_aisdk_ws import Responses, ended, resume, running, send
from tests.scripts import LONG_NAP, TEXT


async def test_an_abort_of_a_queued_send_cancels_its_turn(tmp_path: Path) -> None:
    """``abort`` of a ``send`` cancels the turn it streams: under ``[turns] if_busy =
    "queue"`` that is the send's own turn, still queued behind another. It never starts
    (``turn.cancelled``, ``phase: "queued"``), however the turn ahead of it ends."""
    async with gateway(tmp_path, **{"turns.if_busy": "queue"}) as h:
        chat = f"chat-{uuid.uuid4()}"
        async with open_websocket_url(ws_url(h)) as ws:
            r = Responses(ws)
            nap = await r.request(send(chat, user(LONG_NAP)))
            await r.until(nap, running)
            async with h.client(chat) as native:
                await native.subscribe()
                queued = await r.request(send(chat, user(TEXT)))
                await r.until(queued, lambda m, f: bool(f))  # its start: the turn is queued
                with trio.fail_after(10):
                    while not any(e.type == "turn.queued" for e in native.events):
                        await native.recv()
                [waiting] = [e.turn_id for e in native.events if e.type == "turn.queued"]
                await ws.send_message(json.dumps({"type": "abort", "requestId": queued}))
                synced = await r.request(resume("no-such-chat", "after-the-abort"))
                await r.until(synced, ended)
                stopped = await h.http.post(f"/ai-sdk/chat/{chat}/stop", json={})
                assert stopped.status_code == 202, stopped.text
                await r.until(nap, ended)
                with trio.fail_after(10):
                    ends = ("turn.completed", "turn.cancelled")
                    while not any(e.type in ends and e.turn_id == waiting for e in native.events):
                        await native.recv()
    [end] = [e for e in native.events if e.turn_id == waiting and e.type in ends]
    assert end.type == "turn.cancelled" and end.payload.phase == "queued", end
    assert not any(e.type == "turn.started" and e.turn_id == waiting for e in native.events)


async def test_an_approval_answered_elsewhere_meanwhile_is_ignored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/doors/aisdk.md: approvals no longer pending (answered elsewhere) are ignored.
    So they are when the answer comes between the request's look at what waits and its
    decision (another tab's continuation, the HTTP route): the turn is continued in this
    response as the other answer has it, not refused with a 409."""
    async with gateway(tmp_path, **{"tools.require_approval": ["sleep"]}) as h:
        chat = "chat-1"
        question = user(TOOL_SCRIPT)
        async with h.http.stream("POST", "/ai-sdk/chat", json=request(chat, question)) as r:
            m = await read(r)
        [tool] = [p for p in m.parts if p["type"] == "dynamic-tool"]
        decide = h.node.decide_permission

        async def answered_meanwhile(*args: Any) -> None:
            monkeypatch.setattr(h.node, "decide_permission", decide)
            await decide(args[0], args[1], "allow")  # elsewhere, first
            await decide(*args)

        monkeypatch.setattr(h.node, "decide_permission", answered_meanwhile)
        tool["state"] = "approval-responded"
        tool["approval"]["approved"] = False
        body = request(chat, question, m.as_sent())
        async with h.http.stream("POST", "/ai-sdk/chat", json=body) as r:
            assert r.status_code == 200, (await r.aread()).decode()
            m = await read(r, m)
    assert tool["state"] == "output-available"  # allowed elsewhere: the stale deny is ignored
    assert m.finish_reason == "stop" and m.text == "Running it now.All done."

"""The AI SDK's HTTP doors over a real socket (docs/doors/aisdk.md).

``POST /ai-sdk/chat`` (``DefaultChatTransport``'s request), its resume
``GET /ai-sdk/chat/{id}/stream`` and ``POST /ai-sdk/chat/{id}/stop``, driven
with httpx on 127.0.0.1 port 0. Each answer is read by
:class:`tests.aisdk_support.UiMessage`, which applies the chunks as the ``ai``
package does and fails on what it would reject.
"""

from __future__ import annotations

import json
import socket
import uuid
from collections.abc import AsyncGenerator
from contextlib import aclosing
from pathlib import Path
from typing import Any, cast

import pytest
import trio

from tests.aisdk_support import UiMessage, gateway, read, read_until, request, user
from tests.conftest import TOOL_SCRIPT, Harness
from tests.scripts import LONG_NAP, TEXT

APPROVAL = {"tools.require_approval": ["sleep"]}


async def chat(h: Harness, body: dict[str, Any], message: UiMessage | None = None) -> UiMessage:
    async with h.http.stream("POST", "/ai-sdk/chat", json=body) as r:
        assert r.status_code == 200, (await r.aread()).decode()
        assert r.headers["content-type"] == "text/event-stream"
        assert r.headers["x-vercel-ai-ui-message-stream"] == "v1"
        return await read(r, message)


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


async def test_an_approval_ends_the_response_and_the_next_request_answers_it(
    tmp_path: Path,
) -> None:
    async with gateway(tmp_path, **APPROVAL) as h:
        chat_id = f"chat-{uuid.uuid4()}"
        question = user(TOOL_SCRIPT)
        m = await chat(h, request(chat_id, question))
        assert m.finish_reason == "tool-calls"
        [tool] = [p for p in m.parts if p["type"] == "dynamic-tool"]
        assert tool["state"] == "approval-requested"
        # A new message while the turn waits: 409, naming the way out.
        r = await h.http.post("/ai-sdk/chat", json=request(chat_id, question, user(TEXT)))
        assert r.status_code == 409 and r.json()["error"]["code"] == "turn_in_progress"
        # useChat's addToolApprovalResponse, then its automatic send: the same message.
        tool["state"] = "approval-responded"
        tool["approval"]["approved"] = True
        m = await chat(h, request(chat_id, question, m.as_sent()), message=m)
        assert m.finish_reason == "stop"
        assert tool["state"] == "output-available" and tool["output"]
        assert m.text == "Running it now.All done."
        assert types(m).count("start") == 2  # the same message, continued


async def test_a_denied_approval_is_an_output_denied(tmp_path: Path) -> None:
    async with gateway(tmp_path, **APPROVAL) as h:
        chat_id = f"chat-{uuid.uuid4()}"
        question = user(TOOL_SCRIPT)
        m = await chat(h, request(chat_id, question))
        [tool] = [p for p in m.parts if p["type"] == "dynamic-tool"]
        tool["state"] = "approval-responded"
        tool["approval"]["approved"] = False
        m = await chat(h, request(chat_id, question, m.as_sent()), message=m)
        assert tool["state"] == "output-denied"
        assert m.finish_reason == "stop"


async def test_two_tabs_a_resume_and_a_stop_racing_nothing(tmp_path: Path) -> None:
    """A second tab resumes: the message once, then live with the first; a stop ends both."""
    async with gateway(tmp_path) as h:
        chat_id = f"chat-{uuid.uuid4()}"
        r = await h.http.get(f"/ai-sdk/chat/{chat_id}/stream")
        assert r.status_code == 404  # no such chat
        await chat(h, request(chat_id, user(TEXT)))
        r = await h.http.get(f"/ai-sdk/chat/{chat_id}/stream")
        assert r.status_code == 204  # no turn in flight
        first, again = UiMessage(), UiMessage()
        napping = request(chat_id, user(LONG_NAP))
        async with (
            h.http.stream("POST", "/ai-sdk/chat", json=napping) as r1,
            aclosing(cast(AsyncGenerator[str, None], r1.aiter_lines())) as lines1,
        ):
            await read_until(lines1, first, lambda: running(first))
            async with (
                h.http.stream("GET", f"/ai-sdk/chat/{chat_id}/stream") as r2,
                aclosing(cast(AsyncGenerator[str, None], r2.aiter_lines())) as lines2,
            ):
                assert r2.status_code == 200
                await read_until(lines2, again, lambda: running(again))
                assert again.id == first.id and again.text == "Napping."
                assert again.parts == first.parts  # the same parts, once each (whole in a replay)
                stop = await h.http.post(f"/ai-sdk/chat/{chat_id}/stop", json={})
                assert stop.status_code == 202
                assert stop.json()["turn_id"] == again.metadata["gateway"]["turnId"]
                await read_until(lines2, again, lambda: False)
            await read_until(lines1, first, lambda: False)
        for m in (first, again):
            assert m.done and "abort" in types(m) and m.finish_reason == "other"
            assert m.parts == first.parts
        r = await h.http.post(f"/ai-sdk/chat/{chat_id}/stop", json={})
        assert r.status_code == 409 and r.json()["error"]["code"] == "turn_not_in_flight"


async def test_a_dropped_stream_never_cancels_and_a_repeated_request_runs_once(
    tmp_path: Path,
) -> None:
    async with gateway(tmp_path) as h:
        chat_id = f"chat-{uuid.uuid4()}"
        slow = {"script": {"rounds": [[{"tool_use": {"name": "sleep", "input": {"seconds": 0.5}}}],
                                      [{"text": "Rested."}]]}}  # fmt: skip
        question = user(slow)
        body = json.dumps(request(chat_id, question)).encode()
        port = int(h.base.rsplit(":", 1)[1])
        async with await trio.open_tcp_stream("127.0.0.1", port) as raw:
            await raw.send_all(
                b"POST /ai-sdk/chat HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                % (len(body), body)
            )
            seen = b""
            while b"tool-input-available" not in seen:
                got = await raw.receive_some(65536)
                assert got, seen
                seen += got
        # The client lost its answer and sends the same message again: the same
        # turn, streamed from its start, never run twice.
        m = await chat(h, request(chat_id, question))
        assert m.text == "Rested." and m.finish_reason == "stop"
        r = await h.http.get(f"/sessions/{chat_id}/messages")
        turns = {x["turn_id"] for x in r.json()["messages"]}
        assert len(turns) == 1, turns


async def test_what_a_request_may_not_do(tmp_path: Path) -> None:
    async with gateway(tmp_path, **{"auth.api_keys": ["key-a", "key-b"]}) as h:
        a = {"Authorization": "Bearer key-a"}
        b = {"Authorization": "Bearer key-b"}
        chat_id = f"chat-{uuid.uuid4()}"
        r = await h.http.post("/ai-sdk/chat", json=request(chat_id, user(TEXT)))
        assert r.status_code == 401
        cases = [
            (request("bad id!", user(TEXT)), 422, "invalid_chat_id"),
            (request(chat_id), 422, "invalid_body"),
            # nothing to regenerate in a chat that does not exist (docs/doors/aisdk.md)
            (request(chat_id, user(TEXT), trigger="regenerate-message"), 404, "message_not_found"),
            (
                request(chat_id, {"id": "f", "role": "user", "parts": [{"type": "file"}]}),
                422,
                "invalid_body",
            ),
            (request(chat_id, {"id": "s", "role": "system", "parts": []}), 422, "invalid_body"),
            ({"id": chat_id}, 422, "invalid_body"),
        ]
        for body, status, code in cases:
            r = await h.http.post("/ai-sdk/chat", json=body, headers=a)
            assert (r.status_code, r.json()["error"]["code"]) == (status, code), body
        r = await h.http.get(f"/sessions/{chat_id}", headers=a)
        assert r.status_code == 404  # nothing refused made the chat
        async with h.http.stream(
            "POST", "/ai-sdk/chat", json=request(chat_id, user(TEXT)), headers=a
        ) as r:
            assert r.status_code == 200
            await read(r)
        # Another key's chat is no chat at all, on every door.
        r = await h.http.post("/ai-sdk/chat", json=request(chat_id, user(TEXT)), headers=b)
        assert r.status_code == 404 and r.json()["error"]["code"] == "session_not_found"
        r = await h.http.get(f"/ai-sdk/chat/{chat_id}/stream", headers=b)
        assert r.status_code == 404
        r = await h.http.post(f"/ai-sdk/chat/{chat_id}/stop", json={}, headers=b)
        assert r.status_code == 404


def running(m: UiMessage) -> bool:
    """The message's tool call has its input: the tool runs now."""
    return any(p.get("state") == "input-available" for p in m.parts)


async def test_a_chat_deleted_mid_turn_ends_its_response_saying_so(tmp_path: Path) -> None:
    async with gateway(tmp_path) as h:
        chat_id = f"chat-{uuid.uuid4()}"
        m = UiMessage()
        async with (
            h.http.stream("POST", "/ai-sdk/chat", json=request(chat_id, user(LONG_NAP))) as r,
            aclosing(cast(AsyncGenerator[str, None], r.aiter_lines())) as lines,
        ):
            await read_until(lines, m, lambda: running(m))
            assert (await h.http.delete(f"/sessions/{chat_id}")).status_code == 204
            await read_until(lines, m, lambda: False)
        # The deletion cancels the turn first (docs/protocol.md §13): its cancel
        # sequence ends the response, which is over before the close comes.
        assert m.done and "abort" in types(m) and m.finish_reason == "other", types(m)
        r2 = await h.http.get(f"/ai-sdk/chat/{chat_id}/stream")
        assert r2.status_code == 404


async def test_a_response_that_stops_reading_is_a_slow_client_as_a_websocket_is(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """docs/protocol.md §3's slow-client rule for an AI SDK response; the turn goes on."""
    paced = {"script": {"delay_ms": 1, "rounds": [[{"lorem": 4000}]]}}
    overrides = {"stream.queue_max_events": 20, "server.send_buffer_bytes": 4096}
    async with gateway(tmp_path, **overrides) as h:
        chat_id = await h.create_session()
        async with h.client(chat_id) as watcher:
            await watcher.subscribe()
            body = json.dumps(request(chat_id, user(paced))).encode()
            port = int(h.base.rsplit(":", 1)[1])
            async with await trio.open_tcp_stream("127.0.0.1", port) as raw:
                # A small window: the kernel must not take the whole reply for us.
                raw.socket.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                await raw.send_all(
                    b"POST /ai-sdk/chat HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                    b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                    % (len(body), body)
                )
                # ... and reads nothing
                found = await watcher.until(lambda e: e.type == "bus.handler_warning")
                warning = found[-1].payload
                assert warning.reason == "client_too_slow"
                assert warning.subscription_name.startswith("aisdk-")
                assert "AI SDK response queue exceeded queue_max_events=20" in warning.detail
                assert h.node.sessions[chat_id].turn is not None  # the turn goes on
                stop = await h.http.post(f"/ai-sdk/chat/{chat_id}/stop", json={})
                assert stop.status_code == 202
        assert h.node.metrics.slow_clients._value.get() == 1


async def test_a_stop_racing_the_turns_end_ends_the_response_once(tmp_path: Path) -> None:
    """Stop fired at every moment of a short turn: one end, whichever came first."""
    short = {"script": {"delay_ms": 2, "rounds": [[{"text": "one two three four five six"}]]}}
    async with gateway(tmp_path) as h:
        chat_id = f"chat-{uuid.uuid4()}"
        outcomes = set()
        for wait_chunks in range(0, 12, 2):
            m = UiMessage()
            async with (
                h.http.stream("POST", "/ai-sdk/chat", json=request(chat_id, user(short))) as r,
                aclosing(cast(AsyncGenerator[str, None], r.aiter_lines())) as lines,
            ):
                seen = lambda m=m, n=wait_chunks: len(m.chunks) >= n or m.done  # noqa: E731
                await read_until(lines, m, seen)
                stop = await h.http.post(f"/ai-sdk/chat/{chat_id}/stop", json={})
                assert stop.status_code in (202, 409), stop.text
                if not m.done:
                    await read_until(lines, m, lambda: False)
            kinds = types(m)
            assert m.done and kinds.count("finish") == 1 and kinds[-1] == "finish", kinds
            stopped = "abort" in kinds
            assert m.finish_reason == ("other" if stopped else "stop")
            if stop.status_code == 409:
                assert not stopped  # nothing was in flight: the turn had ended
            outcomes.add(stopped)
        assert True in outcomes  # a stop at the start lands


async def test_a_send_while_a_response_streams_follows_turns_if_busy(tmp_path: Path) -> None:
    """docs/doors/aisdk.md: with ``[turns] if_busy = "queue"`` a second send streams its own
    turn once the first ended; with the default, 409 ``turn_in_progress``."""
    async with gateway(tmp_path, **{"turns.if_busy": "queue"}) as h:
        chat_id = f"chat-{uuid.uuid4()}"
        first = user(LONG_NAP)
        async with h.http.stream("POST", "/ai-sdk/chat", json=request(chat_id, first)) as r:
            m = UiMessage()
            lines = cast(AsyncGenerator[str, None], r.aiter_lines())
            async with aclosing(lines):
                await read_until(
                    lines, m, lambda: any(p["type"] == "dynamic-tool" for p in m.parts)
                )
                async with h.http.stream(
                    "POST", "/ai-sdk/chat", json=request(chat_id, first, user(TEXT))
                ) as second:
                    assert second.status_code == 200
                    r2 = await h.http.post(f"/ai-sdk/chat/{chat_id}/stop", json={})
                    assert r2.status_code == 202
                    queued = await read(second)
                await read_until(lines, m, lambda: False)  # to its end
        assert m.done
        assert queued.text == "Hello there, friend."
        assert queued.metadata["gateway"]["turnId"] != m.metadata["gateway"]["turnId"]
    async with gateway(tmp_path / "again") as h:
        chat_id = f"chat-{uuid.uuid4()}"
        first = user(LONG_NAP)
        async with h.http.stream("POST", "/ai-sdk/chat", json=request(chat_id, first)) as r:
            m = UiMessage()
            lines = cast(AsyncGenerator[str, None], r.aiter_lines())
            async with aclosing(lines):
                await read_until(
                    lines, m, lambda: any(p["type"] == "dynamic-tool" for p in m.parts)
                )
                again = await h.http.post("/ai-sdk/chat", json=request(chat_id, first, user(TEXT)))
                await h.http.post(f"/ai-sdk/chat/{chat_id}/stop", json={})
                await read_until(lines, m, lambda: False)  # to its end
        assert again.status_code == 409 and again.json()["error"]["code"] == "turn_in_progress"

"""The AI SDK's and AG-UI's SSE doors take a delta rollup window per request
(``?coalesce_ms=``, docs/protocol.md §3 "Delta rollup"), as native SSE does: a
rolled-up response carries far fewer text chunks and the same text; a window
that is no integer is refused 400, one out of 0..250 422 (``invalid_query``),
on the request that starts the turn and on the one that re-attaches.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncGenerator
from contextlib import aclosing
from pathlib import Path
from typing import Any, cast

import pytest
import trio

from tests.aisdk_support import UiMessage, read, read_until, request, user
from tests.conftest import Harness, make_config, running_gateway
from tests.integration.doors.agui.test_agui_http import Sse, agui, run_input, types

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

PACED = {"script": {"delay_ms": 4, "rounds": [[{"lorem": 120}]]}}
BAD = (("251", 422), ("-1", 422), ("4.5", 400), ("x", 400))


async def aisdk_chat(h: Harness, window: str | None) -> UiMessage:
    params = {} if window is None else {"coalesce_ms": window}
    body = request(f"chat-{uuid.uuid4()}", user(PACED))
    async with h.http.stream("POST", "/ai-sdk/chat", json=body, params=params) as r:
        assert r.status_code == 200, (await r.aread()).decode()
        return await read(r)


async def agui_run(h: Harness, window: str | None) -> list[dict[str, Any]]:
    params = {} if window is None else {"coalesce_ms": window}
    body = run_input(f"thread-{uuid.uuid4()}", PACED)
    async with h.http.stream("POST", "/agui", json=body, params=params) as r:
        assert r.status_code == 200, (await r.aread()).decode()
        async with aclosing(cast(AsyncGenerator[str, None], r.aiter_lines())) as lines:
            return await Sse(lines).rest()


def agui_text(events: list[dict[str, Any]]) -> str:
    return "".join(e["delta"] for e in events if e["type"] == "TEXT_MESSAGE_CONTENT")


async def test_the_ai_sdk_response_is_rolled_up_as_asked(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with running_gateway(make_config(tmp_path)) as h:
            plain = await aisdk_chat(h, None)  # the server's default: 0
            rolled = await aisdk_chat(h, "40")
    count = [c["type"] for c in plain.chunks].count("text-delta")
    few = [c["type"] for c in rolled.chunks].count("text-delta")
    assert rolled.text == plain.text and len(plain.text.split()) == 120
    assert 0 < few < count / 2, (few, count)
    assert rolled.finish_reason == plain.finish_reason == "stop"


async def test_an_agui_run_is_rolled_up_as_asked(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with running_gateway(make_config(tmp_path)) as h:
            plain = await agui_run(h, None)
            rolled = await agui_run(h, "40")
    assert agui_text(rolled) == agui_text(plain) and len(agui_text(plain).split()) == 120
    count = types(plain).count("TEXT_MESSAGE_CONTENT")
    few = types(rolled).count("TEXT_MESSAGE_CONTENT")
    assert 0 < few < count / 2, (few, count)
    assert types(rolled)[-1] == types(plain)[-1] == "RUN_FINISHED"


async def test_the_server_default_is_the_window_when_none_is_asked(tmp_path: Path) -> None:
    config = make_config(tmp_path, **{"stream.coalesce_ms": 40})
    with trio.fail_after(30):
        async with running_gateway(config) as h:
            default = await aisdk_chat(h, None)
            plain = await aisdk_chat(h, "0")  # asked: no window, whatever the default
    assert default.text == plain.text
    few = [c["type"] for c in default.chunks].count("text-delta")
    assert few < [c["type"] for c in plain.chunks].count("text-delta") / 2


async def test_a_window_that_is_no_integer_or_out_of_range_is_refused(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with running_gateway(make_config(tmp_path)) as h:
            chat_id = f"chat-{uuid.uuid4()}"
            body = request(chat_id, user("hello"))
            thread = f"thread-{uuid.uuid4()}"
            async with agui(h, run_input(thread, "hello")) as sse:
                run_id = (await sse.until("RUN_STARTED"))["runId"]
                await sse.rest()
            for bad, status in BAD:
                q = {"coalesce_ms": bad}
                answers = [
                    await h.http.post("/ai-sdk/chat", json=body, params=q),
                    await h.http.get(f"/ai-sdk/chat/{chat_id}/stream", params=q),
                    await h.http.post("/agui", json=run_input(thread, "hello"), params=q),
                    await h.http.get(f"/agui/{thread}/runs/{run_id}/stream", params=q),
                ]
                for r in answers:
                    assert r.status_code == status, (bad, r.request.url, r.text)
                    assert r.json()["error"]["code"] == "invalid_query"
                    assert "coalesce_ms" in r.json()["error"]["message"]
            # Refused before anything started: the chat has no session, no turn ran.
            assert (await h.http.get(f"/sessions/{chat_id}")).status_code == 404


async def test_a_resume_with_a_window_beside_a_response_without_ends_with_the_same_text(
    tmp_path: Path,
) -> None:
    """Two clients of one chat in two windows (two hub groups, never one mapping between
    them): the sender's response unrolled, a resume mid-turn rolled up, the same message."""
    chat_id = f"chat-{uuid.uuid4()}"
    slow = {"script": {"delay_ms": 5, "rounds": [[{"lorem": 160}]]}}
    plain, rolled = UiMessage(), UiMessage()
    with trio.fail_after(30):
        async with running_gateway(make_config(tmp_path)) as h:
            body = request(chat_id, user(slow))
            async with h.http.stream("POST", "/ai-sdk/chat", json=body) as r:
                assert r.status_code == 200
                lines = cast(AsyncGenerator[str, None], r.aiter_lines())
                async with aclosing(lines):
                    await read_until(lines, plain, lambda: len(plain.text.split()) >= 10)
                    url = f"/ai-sdk/chat/{chat_id}/stream"
                    params = {"coalesce_ms": "40"}
                    async with h.http.stream("GET", url, params=params) as again:
                        assert again.status_code == 200
                        rolled_lines = cast(AsyncGenerator[str, None], again.aiter_lines())
                        async with aclosing(rolled_lines):
                            await read_until(rolled_lines, rolled, lambda: False)
                    await read_until(lines, plain, lambda: False)
    assert plain.done and rolled.done
    assert rolled.text == plain.text and len(plain.text.split()) == 160
    few = [c["type"] for c in rolled.chunks].count("text-delta")
    many = [c["type"] for c in plain.chunks].count("text-delta")
    assert few < many / 2, (few, many)

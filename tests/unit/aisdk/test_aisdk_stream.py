"""A response's pump (gateway.doors.aisdk.stream), without a socket: how its queue's close ends it.

The slow-client rule raises (the transport closes the connection, the client
resumes); any other close (the session deleted, this node's relay lost) ends
the response with an ``error`` chunk that names it, and ``finish``
(docs/protocol.md §14, "The AI SDK").
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
import trio

from gateway.config import StreamConfig
from gateway.doors.agui.sse import SlowClient
from gateway.doors.aisdk import chunks as ui
from gateway.doors.aisdk.mapping import ChatMapper
from gateway.doors.aisdk.stream import ResponseSubscriber, pump
from gateway.metrics import Metrics
from tests.session_fakes import FakeSession


async def _pumped(code: str) -> list[dict[str, Any]]:
    sub = ResponseSubscriber(FakeSession(), StreamConfig(), Metrics())  # type: ignore[arg-type]
    mapper = ChatMapper("sess_1", "turn_1")
    out: list[dict[str, Any]] = []

    async def emit(chunks: list[ui.Chunk]) -> None:
        out.extend(msgspec.json.decode(ui.encode(c)) for c in chunks)

    sub.request_close(code)
    with trio.fail_after(5):
        await pump(sub, mapper, emit)
    assert mapper.finished
    return out


@pytest.mark.parametrize(
    ("code", "text"),
    [
        ("session_deleted", "session_deleted: The session was deleted."),
        ("relay_gap", "relay_gap: This node lost the session's live feed; reconnect with since."),
        ("shutdown", "shutdown: The gateway is shutting down."),
    ],
)
async def test_a_closed_queue_ends_the_response_naming_why(code: str, text: str) -> None:
    out = await _pumped(code)
    assert out == [
        {"type": "error", "errorText": text},
        {"type": "finish", "finishReason": "error",
         "messageMetadata": {"gateway": {"turnId": "turn_1", "lastEventId": None}}},
    ]  # fmt: skip


async def test_a_slow_response_raises_for_its_transport_to_close() -> None:
    with pytest.raises(SlowClient):
        await _pumped("client_too_slow")

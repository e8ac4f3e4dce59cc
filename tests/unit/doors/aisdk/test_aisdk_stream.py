"""A response's stream (gateway.doors.aisdk.stream), without a socket: how its close ends it.

The slow-client rule raises (the transport closes the connection, the client
resumes); any other close (the session deleted, this node's relay lost) ends
the response with an ``error`` chunk that names it, and ``finish``
(docs/doors/aisdk.md).
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
import trio

from gateway.config import StreamConfig
from gateway.doors.aisdk import chunks as ui
from gateway.doors.aisdk.mapping import ChatMapper
from gateway.doors.aisdk.stream import ResponseSubscriber, respond
from gateway.doors.oneway import SlowClient
from gateway.metrics import Metrics
from tests.session_fakes import FakeSession


async def _pumped(code: str) -> list[dict[str, Any]]:
    sub = ResponseSubscriber(FakeSession(), StreamConfig(), Metrics())  # type: ignore[arg-type]
    mapper = ChatMapper("sess_1", "turn_1")
    out: list[dict[str, Any]] = []

    def encode(chunks: list[ui.Chunk]) -> bytes:
        out.extend(msgspec.json.decode(ui.encode(c)) for c in chunks)
        return b"x" if chunks else b""

    sent: list[bytes] = []

    async def send(data: bytes) -> None:
        sent.append(data)

    sub.request_close(code)
    with trio.fail_after(5):
        await respond(sub, mapper, encode, send)
    assert mapper.finished
    assert sent == [b"x", b"x"]  # the start, then the end
    assert not sub.subscribed
    return out[1:]  # after the start


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

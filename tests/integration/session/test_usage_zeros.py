"""Usage counts are always present, zeros included (docs/protocol.md §6).

A reply with no output has ``output_tokens: 0``; the old ``Usage`` left the
field out wherever it was encoded. Here a real gateway runs such a turn and
the raw JSON is read everywhere a Usage reaches a client: the events
(``llm.call_completed``, ``message.complete``, ``turn.completed``), the
snapshot's messages, ``GET /sessions/{id}/messages``, and the reference
reducer's state. The optional fields stay omitted while ``None``.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from gateway.client import Reducer, decode_server_frame
from gateway.protocol.events import LlmCallCompleted, MessageComplete, TurnCompleted
from gateway.protocol.shapes import Message, TextBlock, Usage
from tests.conftest import Harness

ZERO = {"input_tokens": 0, "output_tokens": 0}


@pytest.mark.parametrize(
    ("usage", "encoded"),
    [
        (Usage(), ZERO),
        (Usage(0, 0), ZERO),
        (Usage(12, 0), {"input_tokens": 12, "output_tokens": 0}),
        (Usage(0, 0, cache_read_input_tokens=0), {**ZERO, "cache_read_input_tokens": 0}),
        (Usage(0, 0, cost_usd=0.0), {**ZERO, "cost_usd": 0.0}),
        (Usage(1, 2) + Usage(), {"input_tokens": 1, "output_tokens": 2}),
    ],
)
def test_counts_are_encoded_even_when_zero_and_unset_options_are_not(
    usage: Usage, encoded: dict[str, Any]
) -> None:
    assert json.loads(msgspec.json.encode(usage)) == encoded
    assert msgspec.to_builtins(usage) == encoded


def test_every_payload_and_message_carries_the_zero_counts() -> None:
    payloads = [
        LlmCallCompleted("call_1", "msg_1", "end_turn", Usage()),
        MessageComplete("msg_1", "end_turn", [], Usage()),
        TurnCompleted("turn_1", "end_turn", Usage(), 0.0),
    ]
    for payload in payloads:
        assert json.loads(msgspec.json.encode(payload))["usage"] == ZERO
    message = Message("msg_1", "sess_1", "turn_1", "assistant", [], "complete", 0, usage=Usage())
    assert json.loads(msgspec.json.encode(message))["usage"] == ZERO


def test_a_usage_stored_without_its_zero_counts_still_reads() -> None:
    """Stores written before the rule left zeros out: they decode as zeros, and now encode."""
    old = msgspec.json.decode(b'{"input_tokens": 7}', type=Usage)
    assert old == Usage(7, 0)
    assert json.loads(msgspec.json.encode(old)) == {"input_tokens": 7, "output_tokens": 0}


def test_the_reducer_state_keeps_zero_counts() -> None:
    reducer = Reducer("sess_1")
    frame = {
        "type": "event",
        "event": {
            "id": "evt_00000000000000000001",
            "type": "message.complete",
            "session_id": "sess_1",
            "turn_id": "turn_1",
            "ts": 1,
            "actor": "llm",
            "payload": {
                "message_id": "msg_1",
                "stop_reason": "end_turn",
                "final_content": [{"type": "text", "text": "x"}],
                "usage": ZERO,
            },
        },
    }
    reducer.apply(decode_server_frame(json.dumps(frame)))
    [message] = reducer.state()["messages"]
    assert message["usage"] == ZERO
    assert message["content"] == [msgspec.to_builtins(TextBlock("x"))]


async def test_a_turn_without_output_says_output_tokens_0_everywhere(gw: Harness) -> None:
    sid = await gw.create_session()
    raw: list[dict[str, Any]] = []
    async with gw.client(sid) as client:
        await client.subscribe(filter="preset:full")
        await gw.submit(sid, {"script": {"rounds": [[]]}})  # a reply with nothing in it
        while not raw or raw[-1].get("event", {}).get("type") != "turn.completed":
            raw.append(json.loads(await client.ws.get_message()))
    usages = {
        f["event"]["type"]: f["event"]["payload"]["usage"]
        for f in raw
        if f["type"] == "event" and "usage" in f["event"]["payload"]
    }
    assert set(usages) == {"llm.call_completed", "message.complete", "turn.completed"}
    for usage in usages.values():
        assert usage["output_tokens"] == 0 and usage["input_tokens"] > 0
        assert set(usage) == {"input_tokens", "output_tokens", "cost_usd"}

    async with gw.client(sid) as client:
        await client.subscribe(snapshot=True)
        snapshot = json.loads(await client.ws.get_message())
    assert snapshot["type"] == "snapshot"
    assert snapshot["messages"][-1]["usage"]["output_tokens"] == 0

    r = await gw.http.get(f"/sessions/{sid}/messages")
    assert r.json()["messages"][-1]["usage"]["output_tokens"] == 0

    reducer = Reducer(sid)
    for frame in raw[1:]:
        reducer.apply(decode_server_frame(json.dumps(frame)))
    assert reducer.state()["messages"][-1]["usage"]["output_tokens"] == 0

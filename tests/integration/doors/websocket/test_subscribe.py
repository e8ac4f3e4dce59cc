"""Subscribing to a session stream over a real WebSocket (docs/protocol.md §3).

Behaviour 4 of the core issue: presets expand into ``resolved_filter``; a bad
filter is a ``subscribe_error`` and a bad frame an ``error`` frame, after which
the connection stays open; an oversized client frame closes with 1009; filters
really filter, per client; no ``subscribe`` in time closes with 1008.

To know that a filtered client has received everything of a turn, a test
watches the turn end on a ``preset:full`` client, then sends the filtered
client a ``ping``: the hub enqueues a session's events synchronously when they
are emitted, so the ``pong`` is queued behind every event of the turn, and the
frames before it are exactly what that client was given.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from trio_websocket import ConnectionClosed, open_websocket_url
from wsproto.events import TextMessage

from gateway.client import decode_server_frame
from gateway.protocol.events import EVENT_TYPES, STREAMING_TYPES, Event
from gateway.protocol.filters import PRESETS, Filter
from gateway.protocol.frames import (
    ErrorFrame,
    EventFrame,
    Pong,
    Snapshot,
    SubscribeAck,
    SubscribeError,
)
from tests.conftest import TOOL_SCRIPT, Client, Harness, make_config, running_gateway, types

DEEP = "[" * 20_000 + "]" * 20_000
"""Nested far past what a decoder recurses into, in 40,000 bytes."""

# preset:chat as docs/protocol.md §5 words it, independently of gateway.protocol.filters.
CHAT_TYPES = set(STREAMING_TYPES) | {
    "tool.called",
    "tool.completed",
    "tool.failed",
    "permission.requested",
    "permission.resolved",
    "route.decided",
    "turn.started",
    "turn.queued",
    "turn.steered",
    "turn.completed",
    "turn.cancelled",
    "history.rewound",
    "llm.call_failed",
    "feedback.recorded",
    "session.forked",
    "delegate.started",
    "delegate.completed",
    "delegate.failed",
}


class FilteredClient(Client):
    """A conftest :class:`Client` without the reducer: a filtered stream is not a whole one.

    (The reducer rightly refuses a ``text.delta`` whose ``text.start`` it never saw.)
    """

    async def recv(self) -> Any:
        frame = decode_server_frame(await self.ws.get_message())
        if isinstance(frame, EventFrame):
            self.events.append(frame.event)
        return frame


@asynccontextmanager
async def open_client(gw: Harness, session_id: str) -> AsyncIterator[FilteredClient]:
    async with open_websocket_url(await gw.ws_url(session_id)) as ws:
        try:
            yield FilteredClient(ws, session_id)
        finally:
            # trio-websocket 0.12 does not close its TCP stream when the server closes
            # first and then drops TCP (as RFC 6455 section 7.1.1 has servers do): its
            # reader just stops, and the socket leaks (a ResourceWarning, an error here).
            await ws._stream.aclose()


async def drain_until_pong(client: Client, nonce: str = "barrier") -> list[Any]:
    """Send a ping and return every frame received before its pong (module docstring)."""
    await client.send({"type": "ping", "nonce": nonce})
    frames: list[Any] = []
    while True:
        frame = await client.recv()
        if isinstance(frame, Pong):
            assert frame.nonce == nonce
            return frames
        frames.append(frame)


def events_of(frames: list[Any]) -> list[Event]:
    assert all(isinstance(f, EventFrame) for f in frames), frames
    return [f.event for f in frames]


def assert_ordered_once(events: list[Event]) -> None:
    ids = [e.id for e in events]
    assert ids == sorted(ids)
    assert len(set(ids)) == len(ids)


async def expect_close(client: Client) -> tuple[int, dict[str, Any]]:
    """Receive until the server closes; return the close code and the decoded JSON reason."""
    with pytest.raises(ConnectionClosed) as info:
        while True:
            await client.recv()
    reason = info.value.reason
    assert reason is not None and reason.reason is not None
    return reason.code, json.loads(reason.reason)


# --- presets and the ack --------------------------------------------------------


def test_presets_expand_as_protocol_section_5_says() -> None:
    assert PRESETS["preset:full"] == Filter(event_types=list(EVENT_TYPES))
    assert set(PRESETS["preset:full"].event_types or ()) == set(EVENT_TYPES)
    chat = PRESETS["preset:chat"]
    assert set(chat.event_types or ()) == CHAT_TYPES
    assert chat.actors is None and chat.include_worker_sessions is False


@pytest.mark.parametrize("preset", ["preset:chat", "preset:full"])
async def test_a_preset_subscribe_acks_with_its_expansion(gw: Harness, preset: str) -> None:
    sid = await gw.create_session()
    async with open_client(gw, sid) as client:
        with trio.fail_after(5):
            await client.send(
                {"type": "subscribe", "filter": preset, "since": None, "snapshot": False}
            )
            raw = json.loads(await client.ws.get_message())
    assert raw == {
        "type": "subscribe_ack",
        "resolved_filter": {
            "event_types": PRESETS[preset].event_types,
            "actors": None,
            "include_worker_sessions": False,
        },
        "since": None,
        "snapshot": False,
        "replay_event_count": 0,
        "protocol_version": 1,
    }


async def test_ack_echoes_snapshot_and_since(gw: Harness) -> None:
    sid = await gw.create_session()
    async with gw.client(sid) as first:
        await first.subscribe("preset:full")
        await gw.submit(sid, "hi")
        with trio.fail_after(10):
            events = await first.until_turn_ends()
    last = events[-1].id
    async with open_client(gw, sid) as client:
        with trio.fail_after(5):
            ack = await client.subscribe("preset:chat", since=last)
        assert ack == SubscribeAck(PRESETS["preset:chat"], last, False, 0)
    async with open_client(gw, sid) as client:
        with trio.fail_after(5):
            ack = await client.subscribe("preset:full", snapshot=True)
            snap = await client.recv()
        assert ack == SubscribeAck(PRESETS["preset:full"], None, True, 0)
        assert isinstance(snap, Snapshot)
        assert snap.snapshot_at_event_id is not None and snap.snapshot_at_event_id >= last


# --- subscribe_error: invalid_filter -----------------------------------------------


@pytest.mark.parametrize(
    ("bad_filter", "named"),
    [
        ({"event_types": ["text.delta", "made.up.thing"]}, "made.up.thing"),
        ({"actors": ["llm", "robot"]}, "robot"),
        ("preset:nope", "preset:nope"),
    ],
)
async def test_invalid_filter_then_a_corrected_subscribe_on_the_same_socket(
    gw: Harness, bad_filter: Any, named: str
) -> None:
    sid = await gw.create_session()
    async with open_client(gw, sid) as client:
        with trio.fail_after(10):
            error = await client.subscribe(bad_filter)
            assert isinstance(error, SubscribeError)
            assert error.code == "invalid_filter"
            assert named in error.message
            # not subscribed: a cancel is still refused as subscribe_required
            await client.send({"type": "cancel", "turn_id": "turn_x"})
            refused = await client.recv()
            assert isinstance(refused, ErrorFrame) and refused.code == "subscribe_required"

            ack = await client.subscribe(
                {"event_types": ["turn.started", "text.delta", "turn.completed"]}
            )
            assert isinstance(ack, SubscribeAck)
            await gw.submit(sid, "still here")
            events = await client.until_turn_ends()
    assert types(events) == ["turn.started"] + ["text.delta"] * 4 + ["turn.completed"]
    assert (
        "".join(e.payload.text for e in events if e.type == "text.delta") == "You said: still here"
    )


# --- error frames -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("frame", "code", "named"),
    [
        ("{nope", "invalid_frame", "JSON"),
        ("[1, 2]", "invalid_frame", "object"),
        ('"subscribe"', "invalid_frame", "object"),
        ('{"kind": "ping"}', "invalid_frame", "type"),
        ({"type": "subscribe", "filter": 3}, "invalid_frame", "filter"),
        (
            {"type": "subscribe", "filter": "preset:full", "snapshot": "yes"},
            "invalid_frame",
            "snapshot",
        ),
        (
            {"type": "subscribe", "filter": {"event_type": ["text.delta"]}},
            "invalid_frame",
            "event_type",
        ),
        ({"type": "subscribe", "since": None}, "invalid_frame", "filter"),
        ({"type": "subscribe", "filter": "preset:full", "since": 5}, "invalid_frame", "since"),
        ({"type": "ping"}, "invalid_frame", "nonce"),
        ({"type": "ping", "nonce": 7}, "invalid_frame", "nonce"),
        ({"type": "cancel"}, "invalid_frame", "turn_id"),
        ({"type": "hello"}, "unknown_frame_type", "hello"),
        # docs/protocol.md: unknown fields in a client frame are invalid_frame, ping/pong too
        ({"type": "ping", "nonce": "n", "extra": 1}, "invalid_frame", "`extra`"),
        ({"type": "pong", "nonce": "n", "extra": 1}, "invalid_frame", "`extra`"),
        # too deep to decode (was a 1011 close): under max_client_frame_bytes, and deep
        ('{"type": "subscribe", "filter": ' + DEEP + "}", "invalid_frame", "deep"),
        ('{"type": "ping", "nonce": "n", "x": ' + DEEP + "}", "invalid_frame", "deep"),
        ('{"x": ' + DEEP + ', "type": "ping"}', "invalid_frame", "deep"),
        ('{"type": "cancel", "turn_id": "t", "reason": ' + DEEP + "}", "invalid_frame", "deep"),
    ],
)
async def test_a_bad_frame_gets_an_error_and_the_connection_stays_open(
    gw: Harness, frame: Any, code: str, named: str
) -> None:
    sid = await gw.create_session()
    async with open_client(gw, sid) as client:
        with trio.fail_after(5):
            await client.send(frame)
            error = await client.recv()
            assert isinstance(error, ErrorFrame)
            assert (error.code, named in error.message) == (code, True), error.message
            # again after subscribing: same answer, and the socket still works
            assert isinstance(await client.subscribe("preset:full"), SubscribeAck)
            await client.send(frame)
            again = await client.recv()
            assert isinstance(again, ErrorFrame) and again.code == code
            await client.send({"type": "ping", "nonce": "n-42"})
            assert await client.recv() == Pong("n-42")


async def test_a_binary_frame_is_an_invalid_frame(gw: Harness) -> None:
    sid = await gw.create_session()
    async with open_client(gw, sid) as client:
        with trio.fail_after(5):
            await client.ws.send_message(b'{"type": "ping", "nonce": "b"}')
            error = await client.recv()
            assert isinstance(error, ErrorFrame) and error.code == "invalid_frame"
            assert "binary" in error.message
            await client.send({"type": "ping", "nonce": "after"})
            assert await client.recv() == Pong("after")


async def test_a_second_subscribe_is_already_subscribed(gw: Harness) -> None:
    sid = await gw.create_session()
    async with open_client(gw, sid) as client:
        with trio.fail_after(10):
            assert isinstance(
                await client.subscribe({"event_types": ["turn.completed"]}), SubscribeAck
            )
            error = await client.subscribe("preset:full")
            assert isinstance(error, ErrorFrame)
            assert error.code == "already_subscribed"
            # the first subscription is still the one in force
            await gw.submit(sid, "one")
            events = await client.until_turn_ends()
    assert types(events) == ["turn.completed"]


async def test_cancel_before_subscribe_is_subscribe_required(gw: Harness) -> None:
    sid = await gw.create_session()
    async with open_client(gw, sid) as client:
        with trio.fail_after(5):
            await client.send({"type": "cancel", "turn_id": "turn_nope", "reason": "x"})
            error = await client.recv()
            assert isinstance(error, ErrorFrame)
            assert error.code == "subscribe_required"
            assert isinstance(await client.subscribe("preset:full"), SubscribeAck)


# --- frame size ----------------------------------------------------------------------


PING_OVERHEAD = len(json.dumps({"type": "ping", "nonce": ""}))


def ping_of_size(size: int) -> str:
    text = json.dumps({"type": "ping", "nonce": "x" * (size - PING_OVERHEAD)})
    assert len(text.encode()) == size
    return text


async def test_a_client_frame_over_max_client_frame_bytes_closes_1009(tmp_path: Path) -> None:
    config = make_config(tmp_path, **{"stream.max_client_frame_bytes": 1024})
    with trio.fail_after(10):
        async with running_gateway(config) as gw:
            sid = await gw.create_session()
            async with open_client(gw, sid) as client:
                # exactly at the bound is fine
                await client.send(ping_of_size(1024))
                pong = await client.recv()
                assert pong == Pong("x" * (1024 - PING_OVERHEAD))
                assert isinstance(await client.subscribe("preset:full"), SubscribeAck)
                await client.send(ping_of_size(1025))
                code, reason = await expect_close(client)
    assert code == 1009
    assert reason["code"] == "frame_too_large"
    assert isinstance(reason["message"], str) and reason["message"]


async def test_a_fragmented_message_counts_as_a_whole(tmp_path: Path) -> None:
    """Fragments of one message count together against the bound (no 1009 bypass)."""
    config = make_config(tmp_path, **{"stream.max_client_frame_bytes": 1024})
    with trio.fail_after(10):
        async with running_gateway(config) as gw:
            sid = await gw.create_session()
            async with open_client(gw, sid) as client:
                text = ping_of_size(1600)
                # trio-websocket sends one frame per message: send wsproto fragments by hand.
                # 400 + 400 bytes are under the bound; the last fragment takes the whole over.
                for chunk, last in (
                    (text[:400], False),
                    (text[400:800], False),
                    (text[800:], True),
                ):
                    await client.ws._send(TextMessage(chunk, message_finished=last))
                code, reason = await expect_close(client)
    assert code == 1009
    assert reason["code"] == "frame_too_large"


# --- filters filter --------------------------------------------------------------------


async def test_event_types_filter_gets_only_text_deltas(gw: Harness) -> None:
    sid = await gw.create_session()
    async with gw.client(sid) as full, open_client(gw, sid) as deltas:
        with trio.fail_after(10):
            await full.subscribe("preset:full")
            ack = await deltas.subscribe({"event_types": ["text.delta"]})
            assert ack == SubscribeAck(Filter(["text.delta"], None, False), None, False, 0)
            await gw.submit(sid, "alpha beta gamma")
            reference = await full.until_turn_ends()
            got = events_of(await drain_until_pong(deltas))
    assert types(got) == ["text.delta"] * 5
    assert [e.id for e in got] == [e.id for e in reference if e.type == "text.delta"]
    assert "".join(e.payload.text for e in got) == "You said: alpha beta gamma"


async def test_actors_filter_gets_only_tool_events_of_a_tool_turn(gw: Harness) -> None:
    sid = await gw.create_session()
    async with gw.client(sid) as full, open_client(gw, sid) as tools:
        with trio.fail_after(10):
            await full.subscribe("preset:full")
            assert isinstance(await tools.subscribe({"actors": ["tool"]}), SubscribeAck)
            await gw.submit(sid, TOOL_SCRIPT)
            reference = await full.until_turn_ends()
            got = events_of(await drain_until_pong(tools))
    assert types(got) == ["tool.called", "tool.completed"]
    assert all(e.actor == "tool" for e in got)
    assert [e.id for e in got] == [e.id for e in reference if e.actor == "tool"]
    assert got[1].payload.result == "slept 0.01 s"


async def test_two_clients_with_different_filters_each_get_their_subset(gw: Harness) -> None:
    text_types = ["text.start", "text.delta", "text.end", "turn.completed"]
    b_types = ["tool.use_start", "tool.completed", "llm.call_started", "turn.completed"]
    sid = await gw.create_session()
    async with gw.client(sid) as full, open_client(gw, sid) as a, open_client(gw, sid) as b:
        with trio.fail_after(10):
            await full.subscribe("preset:full")
            await a.subscribe({"event_types": text_types})
            await b.subscribe(
                {
                    "event_types": b_types,
                    "actors": ["tool", "llm"],  # both lists apply: no turn.* (actor session)
                }
            )
            await gw.submit(sid, TOOL_SCRIPT)
            reference = await full.until_turn_ends()
            got_a = events_of(await drain_until_pong(a))
            got_b = events_of(await drain_until_pong(b))
    assert_ordered_once(reference)
    assert [e.id for e in got_a] == [e.id for e in reference if e.type in text_types]
    assert [e.id for e in got_b] == [
        e.id for e in reference if e.type in b_types and e.actor in ("tool", "llm")
    ]
    assert types(got_b) == [
        "llm.call_started",
        "tool.use_start",
        "tool.completed",
        "llm.call_started",
    ]
    assert types(got_a)[-1] == "turn.completed"
    assert types(got_a).count("text.start") == types(got_a).count("text.end") == 2
    for got in (got_a, got_b):
        assert_ordered_once(got)
        assert all(e.session_id == sid for e in got)
    # the same events, byte for byte in content, whichever client got them
    by_id = {e.id: e for e in reference}
    assert all(by_id[e.id] == e for e in got_a + got_b)


async def test_an_empty_event_types_list_gets_nothing(gw: Harness) -> None:
    sid = await gw.create_session()
    async with gw.client(sid) as full, open_client(gw, sid) as none:
        with trio.fail_after(10):
            await full.subscribe("preset:full")
            assert isinstance(await none.subscribe({"event_types": []}), SubscribeAck)
            await gw.submit(sid, "anything")
            await full.until_turn_ends()
            assert await drain_until_pong(none) == []


# --- subscribe timeout over real sockets -------------------------------------------------


async def test_no_subscribe_in_time_closes_1008(tmp_path: Path) -> None:
    config = make_config(tmp_path, **{"stream.subscribe_timeout_s": 0.2})
    with trio.fail_after(5):
        async with running_gateway(config) as gw:
            sid = await gw.create_session()
            async with open_client(gw, sid) as silent:
                code, reason = await expect_close(silent)
            assert (code, reason["code"]) == (1008, "subscribe_timeout")
            async with open_client(gw, sid) as pinger:
                await pinger.send({"type": "ping", "nonce": "p"})
                assert await pinger.recv() == Pong("p")
                code, reason = await expect_close(pinger)
            assert (code, reason["code"]) == (1008, "subscribe_timeout")

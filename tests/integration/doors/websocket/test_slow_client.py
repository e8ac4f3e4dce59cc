"""The slow-client rule (docs/protocol.md §3 "Backpressure"), behaviour 10 of the core issue.

A client that stops reading fills the kernel buffers, then its bounded queue;
the gateway then emits ``bus.handler_warning`` (persisted), and closes that
client with 1008 ``client_too_slow``, while a second client of the same
session receives every event. The server's send buffer is made small so that
"stops reading" reaches the queue after a few hundred events, not megabytes.
"""

from __future__ import annotations

import json
import logging
import socket
import struct
import urllib.parse
from pathlib import Path

import pytest
import trio
from trio_websocket import ConnectionClosed
from wsproto import ConnectionType, WSConnection
from wsproto.connection import Connection
from wsproto.events import AcceptConnection, CloseConnection, Request, TextMessage

from gateway.protocol.events import Event
from tests.conftest import Client, make_config, open_ws, running_gateway, types

SCRIPT = {
    "script": {"delay_ms": 1, "rounds": [[{"lorem": 2000}]]}
}  # paced: only a stalled client falls behind


@pytest.mark.slow  # over a second on two cores (measured with --durations)
async def test_a_client_that_stops_reading_is_closed_1008_and_others_get_everything(
    tmp_path: Path,
) -> None:
    config = make_config(
        tmp_path, **{"stream.queue_max_events": 20, "server.send_buffer_bytes": 4096}
    )
    with trio.fail_after(30):
        async with running_gateway(config) as gw:
            sid = await gw.create_session()
            slow_url = await gw.ws_url(sid)
            async with (
                open_ws(slow_url, message_queue_size=1) as slow,
                gw.client(sid) as fast,
            ):
                await slow.send_message(json.dumps({"type": "subscribe", "filter": "preset:full"}))
                await fast.subscribe()
                turn_id = await gw.submit(sid, SCRIPT)
                # the slow client reads nothing from here on
                warning = (await fast.until(lambda e: e.type == "bus.handler_warning"))[-1]
                assert warning.payload.reason == "client_too_slow"
                assert warning.turn_id is None and warning.actor == "bus"
                events = await fast.until_turn_ends()
                # now the slow client reads: what was in flight, then the close
                with pytest.raises(ConnectionClosed) as closed:
                    while True:
                        await slow.get_message()
                assert closed.value.reason.code == 1008
                assert json.loads(closed.value.reason.reason) == {
                    "code": "client_too_slow",
                    "message": "Outbound queue overflowed; reconnect with replay.",
                }
            _assert_complete_turn(fast.events, turn_id)
            assert events[-1].type == "turn.completed"

            # the warning was persisted: a replay from before the turn carries it
            async with gw.client(sid) as later:
                first_id = fast.events[0].id
                await later.subscribe(
                    filter={"event_types": ["bus.handler_warning"]}, since=first_id
                )
                replayed = await later.recv()
                assert replayed.event.id == warning.id
                assert replayed.event.payload.subscription_name == warning.payload.subscription_name
    assert gw.node.metrics.slow_clients._value.get() == 1


async def _subscribed_raw(url: str) -> trio.SocketStream:
    """A bare WebSocket client (wsproto over TCP), subscribed, that will never read again."""
    parts = urllib.parse.urlsplit(url)
    assert parts.hostname is not None and parts.port is not None
    stream = await trio.open_tcp_stream(parts.hostname, parts.port)
    ws = WSConnection(ConnectionType.CLIENT)
    await stream.send_all(ws.send(Request(host=parts.netloc, target=f"{parts.path}?{parts.query}")))
    subscribe = {"type": "subscribe", "filter": "preset:full", "since": None, "snapshot": False}
    while True:
        ws.receive_data(await stream.receive_some())
        for event in ws.events():
            if isinstance(event, AcceptConnection):
                await stream.send_all(ws.send(TextMessage(json.dumps(subscribe))))
            elif isinstance(event, TextMessage) and '"subscribe_ack"' in event.data:
                return stream


@pytest.mark.slow  # over a second on two cores (measured with --durations)
async def test_clients_that_vanish_mid_stream_cost_the_others_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Connections reset in the middle of a fast stream (no close frame: an RST).

    The fan-out writes to them until a write fails; each is then dropped on
    its own, and the client that stays gets the whole turn.
    """
    with trio.fail_after(30):
        async with running_gateway(make_config(tmp_path)) as gw:
            sid = await gw.create_session()
            async with gw.client(sid) as keeper:
                await keeper.subscribe()
                leavers = [await _subscribed_raw(await gw.ws_url(sid)) for _ in range(10)]
                turn_id = await gw.submit(sid, SCRIPT)
                await keeper.until(lambda e: e.type == "text.delta")
                for leaver in leavers:  # the kernel answers the gateway's next write with RST
                    linger = struct.pack("ii", 1, 0)
                    leaver.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger)
                    leaver.socket.close()
                await keeper.until_turn_ends()
                assert len(gw.node.connections) == 1  # every vanished one was let go
            _assert_complete_turn(keeper.events, turn_id)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def _assert_complete_turn(events: list[Event], turn_id: str) -> None:
    """Everything of the turn, in order, exactly once: the fast client lost nothing."""
    ids = [e.id for e in events]
    assert ids == sorted(set(ids))
    turn = [e for e in events if e.turn_id == turn_id]
    deltas = [e for e in turn if e.type == "text.delta"]
    assert len(deltas) == 2000
    complete = next(e for e in turn if e.type == "message.complete")
    assert "".join(d.payload.text for d in deltas) == complete.payload.final_content[0].text
    assert types(turn)[:3] == ["turn.started", "route.decided", "llm.call_started"]


@pytest.mark.slow  # over a second on two cores (measured with --durations)
async def test_the_slow_client_resumes_with_replay_and_misses_nothing(tmp_path: Path) -> None:
    config = make_config(
        tmp_path, **{"stream.queue_max_events": 20, "server.send_buffer_bytes": 4096}
    )
    with trio.fail_after(30):
        async with running_gateway(config) as gw:
            sid = await gw.create_session()
            async with gw.client(sid) as fast, trio.open_nursery() as nursery:
                await fast.subscribe()
                slow_url = await gw.ws_url(sid)
                warned = trio.Event()

                async def read_fast() -> None:
                    await fast.until(lambda e: e.type == "bus.handler_warning")
                    warned.set()
                    await fast.until_turn_ends()

                async with open_ws(slow_url, message_queue_size=1) as ws:
                    slow = Client(ws, sid)
                    await slow.subscribe()
                    await gw.submit(sid, SCRIPT)
                    nursery.start_soon(read_fast)
                    await warned.wait()
                    with pytest.raises(ConnectionClosed):
                        while True:
                            await slow.recv()
                # reconnect with replay from the last event it got
                async with gw.client(sid) as again:
                    again.reducer = slow.reducer
                    await again.subscribe(since=slow.reducer.last_event_id)
                    await again.until_turn_ends()
            # compare at the end of the turn: both saw every event up to it
            assert again.reducer.state()["messages"] == fast.reducer.state()["messages"]
            assert again.reducer.duplicates_ignored == 0


async def test_control_frames_a_client_does_not_read_have_a_slack_of_64(tmp_path: Path) -> None:
    """docs/protocol.md §3 "Backpressure": control frames have a slack of their own (64).

    A client that sends ``ping`` frames and reads nothing fills the kernel
    buffers with pongs, then its queue: 64 pongs queued past the write in
    progress make it a slow client (1008), however many events are queued
    (none here). Each pong holds a nonce of up to ``max_client_frame_bytes``:
    the events' bound of 1,000 would let such a client park 64 MiB of them.
    """
    pings, nonce = 1000, "n" * 8000  # 8 MB of pongs: past any buffer of the kernel's
    config = make_config(tmp_path, **{"server.send_buffer_bytes": 4096})
    with trio.fail_after(30):
        async with running_gateway(config) as gw:
            sid = await gw.create_session()
            stream = await _subscribed_raw(await gw.ws_url(sid))
            ws = Connection(ConnectionType.CLIENT)  # past the handshake _subscribed_raw made
            frames = b"".join(
                ws.send(TextMessage(json.dumps({"type": "ping", "nonce": f"{i:04d}{nonce}"})))
                for i in range(pings)
            )
            pongs, close, text = 0, None, ""
            async with stream:
                await stream.send_all(frames)  # the gateway reads it all, whatever it writes
                while close is None and pongs < pings:
                    data = await stream.receive_some()
                    assert data, "the stream ended without a close frame"
                    ws.receive_data(data)
                    for got in ws.events():
                        if isinstance(got, TextMessage):  # (wsproto hands a message in parts)
                            text += got.data
                            if got.message_finished:
                                assert json.loads(text)["type"] == "pong"
                                pongs, text = pongs + 1, ""
                        elif isinstance(got, CloseConnection):
                            close = got
    assert close is not None, f"all {pings} pongs were held for a client that read none"
    assert close.code == 1008 and json.loads(close.reason)["code"] == "client_too_slow"
    assert pongs < pings

"""The delta rollup end to end (docs/protocol.md §3 "Delta rollup"): clients with and
without a window see the same final state; a rolled-up client gets fewer deltas, each
with an id it can resume from exactly; a snapshot client joining mid-stream neither
misses nor repeats text; SSE takes the window as ``?coalesce_ms=``."""

from __future__ import annotations

from pathlib import Path

import msgspec
import trio

from gateway.client import Reducer
from gateway.protocol.events import Event
from gateway.protocol.frames import ErrorFrame, EventFrame, Snapshot, SubscribeAck
from tests.conftest import Client, Harness, make_config, running_gateway
from tests.integration.doors.sse.test_sse_stream import sse

PACED = {"script": {"delay_ms": 4, "rounds": [[{"thinking": "plan it"}, {"lorem": 120}]]}}


async def subscribe(client: Client, coalesce_ms: int | None, **more: object) -> object:
    frame: dict[str, object] = {"type": "subscribe", "filter": "preset:full", **more}
    if coalesce_ms is not None:
        frame["coalesce_ms"] = coalesce_ms
    await client.send(frame)
    return await client.recv()


def deltas(events: list[Event]) -> list[Event]:
    return [e for e in events if e.type.endswith("delta")]


def text_upto(events: list[Event]) -> dict[str, str]:
    """Each event id -> the text of every text delta up to it."""
    out, text = {}, ""
    for e in events:
        if e.type == "text.delta":
            text += e.payload.text
        out[e.id] = text
    return out


async def late_snapshot(gw: Harness, sid: str, started: trio.Event, out: list[Reducer]) -> None:
    await started.wait()
    await trio.sleep(0.15)  # mid-stream
    async with gw.client(sid) as late:
        assert isinstance(await subscribe(late, 40, snapshot=True), SubscribeAck)
        assert isinstance(await late.recv(), Snapshot)
        await late.until_turn_ends()
        out.append(late.reducer)


async def test_rolled_up_clients_end_where_the_others_do(tmp_path: Path) -> None:
    config = make_config(tmp_path, **{"stream.coalesce_ms": 40})
    with trio.fail_after(30):
        async with running_gateway(config) as gw:
            sid = await gw.create_session()
            async with (
                gw.client(sid) as plain,
                gw.client(sid) as rolled,
                gw.client(sid) as default,
                sse(gw, sid, filter="preset:full", coalesce_ms="40") as over_sse,
            ):
                assert isinstance(await subscribe(plain, 0), SubscribeAck)
                assert isinstance(await subscribe(rolled, 40), SubscribeAck)
                assert isinstance(await subscribe(default, None), SubscribeAck)  # [stream]'s 40
                assert isinstance(await over_sse.recv(), SubscribeAck)
                late: list[Reducer] = []
                started = trio.Event()
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(late_snapshot, gw, sid, started, late)
                    await gw.submit(sid, PACED)
                    started.set()
                    for client in (plain, rolled, default):
                        await client.until_turn_ends()
                    await over_sse.until("turn.completed")
    state = plain.reducer.state()
    for reducer in (rolled.reducer, default.reducer, over_sse.reducer, *late):
        assert reducer.state() == state
        assert reducer.duplicates_ignored == 0
    # Fewer deltas, the same text at each of their ids: `since` resumes exactly.
    few, many = deltas(rolled.events), deltas(plain.events)
    assert len(few) < len(many) / 2, (len(few), len(many))
    assert [e.id for e in deltas(default.events)] == [e.id for e in few]  # one shared group
    assert [e.id for e in deltas(over_sse.events)] == [e.id for e in few]
    upto_plain, upto_rolled = text_upto(plain.events), text_upto(rolled.events)
    for e in few:
        assert upto_rolled[e.id] == upto_plain[e.id]
    # Every other event arrives as it did, in order.
    others = [e.id for e in plain.events if not e.type.endswith("delta")]
    assert [e.id for e in rolled.events if not e.type.endswith("delta")] == others
    assert [e.id for e in rolled.events] == sorted(e.id for e in rolled.events)


async def test_a_window_out_of_range_is_refused(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with running_gateway(make_config(tmp_path)) as gw:
            sid = await gw.create_session()
            async with gw.client(sid) as client:
                refused = await subscribe(client, 251)
                assert isinstance(refused, ErrorFrame) and refused.code == "invalid_frame"
                assert "coalesce_ms" in refused.message
                assert isinstance(await subscribe(client, 250), SubscribeAck)  # it stays open
            attach = (await gw.http.get(f"/sessions/{sid}")).json()["attach_token"]
            for bad, status in (("251", 422), ("-1", 422), ("4.5", 400), ("x", 400)):
                r = await gw.http.get(
                    f"/sessions/{sid}/events", params={"attach": attach, "coalesce_ms": bad}
                )
                assert (r.status_code, r.json()["error"]["code"]) == (status, "invalid_query")


def test_the_frame_names_the_field() -> None:
    """The schema (gateway.protocol.frames) holds the range; the message names the field."""
    from gateway.errors import FrameRejected
    from gateway.protocol.frames import Subscribe, decode_client_frame

    ok = decode_client_frame(b'{"type":"subscribe","filter":"preset:chat","coalesce_ms":40}')
    assert isinstance(ok, Subscribe) and ok.coalesce_ms == 40
    try:
        decode_client_frame(
            msgspec.json.encode({"type": "subscribe", "filter": "x", "coalesce_ms": -1})
        )
    except FrameRejected as exc:
        assert "coalesce_ms" in str(exc)
    else:
        raise AssertionError("a negative window was taken")


async def test_the_client_library_asks_for_a_window(tmp_path: Path) -> None:
    """``GatewayClient.subscribe(coalesce_ms=)`` sends the field; left out, it sends none
    (an older gateway refuses a field it does not know)."""
    from gateway.client import GatewayClient, Received
    from gateway.client.sse import events_query
    from gateway.client.stream import Subscription

    with trio.fail_after(30):
        async with running_gateway(make_config(tmp_path)) as gw, GatewayClient(gw.base) as client:
            sid = await gw.create_session()
            counts = {}
            for window in (None, 250):
                async with client.subscribe(sid, filter="preset:chat", coalesce_ms=window) as s:
                    n = 0
                    async for item in s:
                        if isinstance(item, Received) and isinstance(item.frame, SubscribeAck):
                            await gw.submit(sid, {"script": {"rounds": [[{"lorem": 40}]]}})
                        if isinstance(item, Received) and isinstance(item.frame, EventFrame):
                            n += item.frame.event.type == "text.delta"
                            if item.frame.event.type == "turn.completed":
                                break
                    counts[window] = n
    assert counts[None] == 40 and counts[250] < 40 / 2
    plain = Subscription(None, "sess_x")  # type: ignore[arg-type]
    assert "coalesce_ms" not in plain._subscribe_frame()
    assert events_query("t", "preset:chat", None, False, 40)["coalesce_ms"] == "40"
    assert "coalesce_ms" not in events_query("t", "preset:chat", None, False)

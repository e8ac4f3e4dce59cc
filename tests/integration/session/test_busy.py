"""A busy session: queue, interrupt and steer, on a running gateway (docs/protocol.md §2
"A busy session").

A provider that records every request and holds the calls whose turn says
``hold`` until the test lets them go: the tests decide exactly where the
running turn is when the next request lands, and check what the clients get
and what reached the model.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

import trio

from gateway.ids import format_event_id
from gateway.protocol.events import Event
from gateway.protocol.frames import SubscribeAck
from gateway.protocol.shapes import TextBlock
from gateway.providers.base import ModelRequest
from gateway.providers.raw import RawEvent
from gateway.providers.scripted import ScriptedProvider
from tests.conftest import Client, Harness, make_config, running_gateway, types
from tests.integration.store.test_restart import crash_copy


class Gated:
    """The scripted model, recording requests; a call whose user text starts ``hold`` waits
    for :attr:`release` (set again for the next one)."""

    name = "scripted"

    def __init__(self) -> None:
        self.inner = ScriptedProvider()
        self.requests: list[ModelRequest] = []
        self.release = trio.Event()
        self.holding = trio.Event()
        self.hold_once = False  # hold the next call, whatever its text

    async def stream(self, request: ModelRequest) -> AsyncGenerator[RawEvent, None]:
        self.requests.append(request)
        if self.hold_once or _last_text(request).startswith("hold"):
            self.hold_once = False
            self.holding.set()
            await self.release.wait()
        async for raw in self.inner.stream(request):
            yield raw

    async def aclose(self) -> None:
        pass

    def let_go(self) -> None:
        self.release.set()
        self.release = trio.Event()
        self.holding = trio.Event()


def _last_text(request: ModelRequest) -> str:
    for message in reversed(request.messages):
        texts = [b.text for b in message.content if isinstance(b, TextBlock)]
        if message.role == "user" and texts:
            return texts[0]
    return ""


def texts(request: ModelRequest) -> list[str]:
    """Every text block of a request, in order."""
    return [b.text for m in request.messages for b in m.content if isinstance(b, TextBlock)]


async def post(gw: Harness, sid: str, content: str, **body: Any) -> tuple[int, Any]:
    r = await gw.http.post(
        f"/sessions/{sid}/turns",
        json={"content": content, **body},
        headers=body.pop("headers", None) if "headers" in body else None,
    )
    return r.status_code, r.json()


async def until_started(client: Client, count: int) -> list[Event]:
    """Receive until ``count`` turns have ended, every event meanwhile."""
    out: list[Event] = []
    ended = 0
    with trio.fail_after(20):
        while ended < count:
            got = await client.until_turn_ends()
            out += got
            ended += 1
    return out


def config(tmp_path: Path, **overrides: Any) -> Any:
    return make_config(tmp_path, **overrides)


async def test_three_queued_turns_run_in_order_and_a_cancelled_one_never_starts(
    tmp_path: Path,
) -> None:
    provider = Gated()
    async with running_gateway(config(tmp_path), provider) as gw:
        sid = await gw.create_session()
        async with gw.client(sid) as client:
            await client.subscribe()
            status, first = await post(gw, sid, "hold A")
            assert (status, first) == (202, {"turn_id": first["turn_id"]})
            await provider.holding.wait()
            answers = [await post(gw, sid, text, if_busy="queue") for text in ("B", "C", "D")]
            assert [(s, a["queued"], a["position"]) for s, a in answers] == [
                (202, True, 1),
                (202, True, 2),
                (202, True, 3),
            ]
            b, c, d = (a["turn_id"] for _, a in answers)
            summary = (await gw.http.get("/sessions")).json()["sessions"][0]["session"]
            assert [q["turn_id"] for q in summary["queued_turns"]] == [b, c, d]
            r = await gw.http.post(f"/sessions/{sid}/turns/{c}/cancel", json={})
            assert r.status_code == 202
            provider.let_go()
            events = await until_started(client, 4)  # A ends, C's cancel, B and D end
            again = await gw.http.post(f"/sessions/{sid}/turns/{c}/cancel", json={})
            listed = (await gw.http.get("/sessions")).json()["sessions"][0]["session"]
    started = [e.payload.turn_id for e in client.events if e.type == "turn.started"]
    assert started == [first["turn_id"], b, d]
    queued = [e for e in client.events if e.type == "turn.queued"]
    assert [(e.turn_id, e.payload.position) for e in queued] == [(b, 1), (c, 2), (d, 3)]
    assert queued[0].payload.user_message.content == [TextBlock("B")]
    [cancelled] = [e for e in events if e.type == "turn.cancelled"]
    assert (cancelled.turn_id, cancelled.payload.phase, cancelled.payload.partial) == (
        c,
        "queued",
        False,
    )
    assert again.status_code == 404 and again.json()["error"]["code"] == "turn_not_found"
    assert "queued_turns" not in listed
    # Each queued turn's call saw the turns before it, never C.
    assert [_last_text(r) for r in provider.requests] == ["hold A", "B", "D"]
    assert "C" not in texts(provider.requests[-1])
    assert texts(provider.requests[-1]) == [
        "hold A",
        "You said: hold A",
        "B",
        "You said: B",
        "D",
    ]


async def test_past_max_queued_is_409_queue_full_and_reject_stays_the_default(
    tmp_path: Path,
) -> None:
    provider = Gated()
    async with running_gateway(config(tmp_path, **{"turns.max_queued": 2}), provider) as gw:
        sid = await gw.create_session()
        assert (await post(gw, sid, "hold A"))[0] == 202
        await provider.holding.wait()
        rejected = await post(gw, sid, "no mode")
        flood = [await post(gw, sid, f"q{i}", if_busy="queue") for i in range(5)]
        bad = await post(gw, sid, "x", if_busy="later")
        provider.let_go()
    assert rejected[0] == 409 and rejected[1]["error"]["code"] == "turn_in_progress"
    assert [s for s, _ in flood] == [202, 202, 409, 409, 409]
    assert flood[2][1]["error"]["code"] == "queue_full"
    assert "max_queued is 2" in flood[2][1]["error"]["message"]
    assert bad[0] == 422


async def test_the_config_default_queues_when_set(tmp_path: Path) -> None:
    provider = Gated()
    async with running_gateway(config(tmp_path, **{"turns.if_busy": "queue"}), provider) as gw:
        sid = await gw.create_session()
        async with gw.client(sid) as client:
            await client.subscribe()
            assert (await post(gw, sid, "hold A"))[0] == 202
            await provider.holding.wait()
            status, body = await post(gw, sid, "B")
            provider.let_go()
            await until_started(client, 2)
    assert status == 202 and body["queued"] is True


async def test_interrupt_cancels_the_running_turn_with_its_sequence_then_starts(
    tmp_path: Path,
) -> None:
    provider = Gated()
    async with running_gateway(config(tmp_path), provider) as gw:
        sid = await gw.create_session()
        async with gw.client(sid) as client:
            await client.subscribe()
            _, first = await post(gw, sid, "hold A")
            await provider.holding.wait()
            await post(gw, sid, "Q", if_busy="queue")
            status, body = await post(gw, sid, "B", if_busy="interrupt")
            events = await until_started(client, 3)
    assert status == 202 and body == {"turn_id": body["turn_id"]}
    a, b = first["turn_id"], body["turn_id"]
    ends = [(e.type, e.turn_id) for e in client.events if e.type.startswith("turn.")]
    q = ends[1][1]
    assert ends == [
        ("turn.started", a),
        ("turn.queued", q),
        ("turn.cancelled", a),
        ("turn.started", b),
        ("turn.completed", b),
        ("turn.started", q),
        ("turn.completed", q),
    ]
    [cancelled] = [e for e in events if e.type == "turn.cancelled"]
    assert (cancelled.payload.reason, cancelled.payload.phase) == ("interrupted", "llm")
    # The section 8 llm sequence: the call is closed before the turn.
    assert "llm.call_failed" in types(events)[: types(events).index("turn.cancelled")]
    assert _last_text(provider.requests[1]) == "B"


async def test_a_steer_reaches_the_next_call_of_the_same_turn(tmp_path: Path) -> None:
    provider = Gated()
    script = {"script": {"rounds": [[{"tool_use": {"name": "sleep", "input": {"seconds": 0}}}]]}}
    async with running_gateway(config(tmp_path), provider) as gw:
        sid = await gw.create_session()
        async with gw.client(sid) as client:
            await client.subscribe()
            provider.hold_once = True
            _, first = await post(gw, sid, json.dumps(script))
            await provider.holding.wait()
            status, body = await post(gw, sid, "also this", if_busy="steer")
            provider.let_go()
            events = await until_started(client, 1)
            listed = (await gw.http.get(f"/sessions/{sid}/messages")).json()["messages"]
    a = first["turn_id"]
    assert (status, body) == (202, {"turn_id": a, "steered": True})
    [steered] = [e for e in events if e.type == "turn.steered"]
    assert steered.turn_id == a and steered.payload.user_message.content == [TextBlock("also this")]
    # Taken after the tool round, before the second call: which sees it last.
    order = types(events)
    assert order.index("tool.completed") < order.index("turn.steered")
    assert order.index("turn.steered") < len(order) - order[::-1].index("llm.call_started")
    assert len(provider.requests) == 2
    second = provider.requests[1]
    assert [m.role for m in second.messages] == ["user", "assistant", "user", "user"]
    assert texts(second)[-1] == "also this"
    assert [m["role"] for m in listed] == ["user", "assistant", "user", "user", "assistant"]
    assert all(m["turn_id"] == a for m in listed)
    assert "turn.queued" not in order


async def test_a_steer_the_turn_no_longer_takes_becomes_a_queued_turn(tmp_path: Path) -> None:
    provider = Gated()
    async with running_gateway(config(tmp_path), provider) as gw:
        sid = await gw.create_session()
        async with gw.client(sid) as client:
            await client.subscribe()
            _, first = await post(gw, sid, "hold plain")  # one call: no next call to take it
            await provider.holding.wait()
            headers = {"Idempotency-Key": "steer-1"}
            r = await gw.http.post(
                f"/sessions/{sid}/turns",
                json={"content": "late", "if_busy": "steer"},
                headers=headers,
            )
            provider.let_go()
            events = await until_started(client, 2)
            retry = await gw.http.post(
                f"/sessions/{sid}/turns",
                json={"content": "late", "if_busy": "steer"},
                headers=headers,
            )
    assert r.status_code == 202 and r.json() == {"turn_id": first["turn_id"], "steered": True}
    assert retry.json() == r.json() and retry.headers.get("idempotent-replayed") == "true"
    kinds = [(e.type, e.turn_id) for e in events if e.type.startswith("turn.")]
    late = kinds[2][1]
    assert late != first["turn_id"]
    assert kinds == [
        ("turn.started", first["turn_id"]),
        ("turn.completed", first["turn_id"]),
        ("turn.queued", late),
        ("turn.started", late),
        ("turn.completed", late),
    ]
    assert _last_text(provider.requests[1]) == "late"


async def test_a_steer_of_an_idle_session_starts_a_turn(gw: Harness) -> None:
    sid = await gw.create_session()
    async with gw.client(sid) as client:
        await client.subscribe()
        status, body = await post(gw, sid, "hi", if_busy="steer")
        await until_started(client, 1)
    assert status == 202 and body == {"turn_id": body["turn_id"]}


async def test_queued_turns_of_a_deleted_session_never_start(tmp_path: Path) -> None:
    provider = Gated()
    async with running_gateway(config(tmp_path), provider) as gw:
        sid = await gw.create_session()
        assert (await post(gw, sid, "hold A"))[0] == 202
        await provider.holding.wait()
        assert (await post(gw, sid, "B", if_busy="queue"))[0] == 202
        assert (await gw.http.delete(f"/sessions/{sid}")).status_code == 204
        provider.let_go()
        await trio.sleep(0.2)
    assert [_last_text(r) for r in provider.requests] == ["hold A"]


async def test_two_queued_turns_run_once_each_after_a_crash(tmp_path: Path) -> None:
    provider = Gated()
    live = tmp_path / "live"
    live.mkdir()
    async with running_gateway(config(live), provider) as gw:
        sid = await gw.create_session()
        assert (await post(gw, sid, "hold A"))[0] == 202
        await provider.holding.wait()
        queued = [(await post(gw, sid, t, if_busy="queue"))[1]["turn_id"] for t in ("B", "C")]
        crash_copy(str(live / "gateway.db"), str(tmp_path / "gateway.db"))
        provider.let_go()
    again = Gated()
    async with running_gateway(config(tmp_path), again) as gw, gw.client(sid) as client:
        ack = await client.subscribe(since=format_event_id(0))
        assert isinstance(ack, SubscribeAck), ack
        with trio.fail_after(20):
            while sum(e.type == "turn.completed" for e in client.events) < 2:
                await client.recv()
        messages = (await gw.http.get(f"/sessions/{sid}/messages")).json()["messages"]
    kinds = [(e.type, e.turn_id) for e in client.events if e.type.startswith("turn.")]
    a = kinds[0][1]
    assert kinds[:3] == [
        ("turn.started", a),
        ("turn.queued", queued[0]),
        ("turn.queued", queued[1]),
    ]
    assert kinds[3][0] == "turn.cancelled" and kinds[3][1] == a  # closed at the restart
    assert kinds[4:] == [
        ("turn.started", queued[0]),
        ("turn.completed", queued[0]),
        ("turn.started", queued[1]),
        ("turn.completed", queued[1]),
    ]
    assert [_last_text(r) for r in again.requests] == ["B", "C"]
    users = [m["content"][0]["text"] for m in messages if m["role"] == "user"]
    assert users == ["hold A", "B", "C"]


async def test_an_idempotent_queue_retry_answers_its_position_and_queues_once(
    tmp_path: Path,
) -> None:
    provider = Gated()
    async with running_gateway(config(tmp_path), provider) as gw:
        sid = await gw.create_session()
        async with gw.client(sid) as client:
            await client.subscribe()
            assert (await post(gw, sid, "hold A"))[0] == 202
            await provider.holding.wait()
            headers = {"Idempotency-Key": "q-1"}
            body = {"content": "B", "if_busy": "queue"}
            first = await gw.http.post(f"/sessions/{sid}/turns", json=body, headers=headers)
            second = await gw.http.post(f"/sessions/{sid}/turns", json=body, headers=headers)
            provider.let_go()
            await until_started(client, 2)
    assert first.status_code == second.status_code == 202
    assert (
        second.json()
        == first.json()
        == {
            "turn_id": first.json()["turn_id"],
            "queued": True,
            "position": 1,
        }
    )
    assert sum(e.type == "turn.queued" for e in client.events) == 1

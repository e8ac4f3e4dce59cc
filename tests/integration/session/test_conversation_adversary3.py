"""Adversary cases of edit and regenerate and a busy session (docs/protocol.md §2), a third
review: each test is a defect's reproduction.

Several are about one moment: the turn before ended and the next queued turn is
taken from the queue (the turn lock's), but the agent loop has not started it
yet. It is queued still (its ``turn.started`` not emitted, the record lists
it), so a cancel, an interrupt, a DELETE or a shutdown landing then must treat
it as a queued turn. The tests make the moment happen where the gateway would
next look (the session's ``next_turn``, or the lane's ``queue_turn`` held).
"""

from __future__ import annotations

import base64
import contextlib
from pathlib import Path

import pytest
import trio
from trio_websocket import ConnectionClosed

from gateway.errors import Refused
from gateway.ids import format_event_id
from gateway.session import busy
from gateway.session.turn import Turn
from tests.conftest import running_gateway
from tests.files_support import png
from tests.integration.session.test_busy import Gated, _last_text
from tests.integration.session.test_rewind import (
    Recording,
    config,
    listing,
    post_turn,
    texts,
    turn,
    user_of,
)
from tests.integration.session.test_rewind_fork_adversary2 import user_message

IMAGE = {
    "type": "image",
    "source": {
        "type": "base64",
        "media_type": "image/png",
        "data": base64.b64encode(png()).decode(),
    },
}

ENDS = ("turn.completed", "turn.cancelled")


async def test_a_user_message_of_an_image_alone_is_rewound_to(tmp_path: Path) -> None:
    """A turn's content may be an image alone (docs/protocol.md §2 ``POST .../turns``): its
    user message is a user's message, which an edit names (``rewind_to``). It was refused
    409 ``not_a_user_message`` (a user message was one with text), while a fork at it
    takes it as the prompt it is (its draft)."""
    provider = Recording()
    async with running_gateway(config(tmp_path, **{"tools.require_approval": []}), provider) as gw:
        sid = await gw.create_session()
        async with gw.client(sid) as client:
            await client.subscribe()
            await turn(gw, client, sid, "Question A")
            pictured = await turn(gw, client, sid, [IMAGE])
            r = await post_turn(gw.http, sid, "Describe it, edited", rewind_to=user_of(pictured))
            assert r.status_code == 202, r.text
            await client.until_turn_ends()
        assert texts(provider.calls[-1]) == [
            "user: Question A",
            "assistant: You said: Question A",
            "user: Describe it, edited",
        ]
        roles = [m["role"] for m in await listing(gw, sid)]
        assert roles == ["user", "assistant", "user", "assistant"]


@pytest.mark.parametrize("if_busy", ["queue", "steer"])
async def test_a_busy_session_refuses_a_message_id_a_rewind_took_out(
    tmp_path: Path, if_busy: str
) -> None:
    """A door names a user message after its client's id (the AI SDK's): a client whose view
    is older than the session's sends one a rewind took out. Idle or interrupting, that is
    409 ``message_rewound`` (gateway.session.rewind.check); queued or steered into a busy
    session it was taken, and where its turn started its message was put again in its old
    place among the rewound ones: in the conversation then, rewound after a restart."""
    provider = Recording()
    async with running_gateway(config(tmp_path, **{"tools.require_approval": []}), provider) as gw:
        sid = await gw.create_session()
        async with gw.client(sid) as client:
            await client.subscribe()
            await turn(gw, client, sid, "Question A")
            b = await turn(gw, client, sid, "Question B")
            await turn(gw, client, sid, "Question B, edited", rewind_to=user_of(b))
            provider.held = True
            r = await post_turn(gw.http, sid, "Question C, running")
            assert r.status_code == 202
            session = gw.node.sessions[sid]
            [old] = [m for m in session.rewound if m.id == user_of(b)]
            again = user_message(sid, "Question B")
            again.id = old.id
            with pytest.raises(Refused) as refused:
                busy.submit(session, again, if_busy)  # type: ignore[arg-type]
            assert refused.value.code == "message_rewound"
            assert session.record.queued_turns == []
            provider.hold.set()


async def test_a_queued_turn_cancelled_as_it_leaves_the_queue_never_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The turn before ends and the next queued one is taken from the queue, to start when
    the agent loop next runs: a cancel landing in between finds it still queued (in the
    record, in ``queued_turns``, no ``turn.started``). It must be cancelled as queued
    (``phase: "queued"``, no ``turn.started`` ever: docs/protocol.md §2 "A busy session");
    it was cancelled as a started turn: ``turn.started``, then ``turn.cancelled`` (``llm``),
    its user message left in the conversation."""
    provider = Gated()
    async with running_gateway(config(tmp_path, **{"tools.require_approval": []}), provider) as gw:
        sid = await gw.create_session()
        session = gw.node.sessions[sid]
        async with gw.client(sid) as client:
            await client.subscribe()
            r = await post_turn(gw.http, sid, "hold A")
            assert r.status_code == 202, r.text
            await provider.holding.wait()
            r = await post_turn(gw.http, sid, "Question B", if_busy="queue")
            assert r.status_code == 202, r.text
            b = r.json()["turn_id"]
            r = await post_turn(gw.http, sid, "Question C", if_busy="queue")
            c = r.json()["turn_id"]
            next_turn = session.next_turn

            def then_cancel() -> None:
                next_turn()
                waiting = session.turn
                if waiting is not None and waiting.id == b and not waiting.started.is_set():
                    assert [q.turn_id for q in session.record.queued_turns] == [b, c]
                    session.cancel_turn(b, "user", "test")  # in the step that took it

            monkeypatch.setattr(session, "next_turn", then_cancel)
            provider.let_go()
            with trio.fail_after(10):
                events = await client.until(lambda e: e.type == "turn.completed" and e.turn_id == c)
        of_b = [(e.type, getattr(e.payload, "phase", None)) for e in events if e.turn_id == b]
        assert of_b == [("turn.queued", None), ("turn.cancelled", "queued")], of_b
        assert [m["content"][0]["text"] for m in await listing(gw, sid) if m["role"] == "user"] == [
            "hold A",
            "Question C",
        ]
        assert "queued_turns" not in (await gw.http.get(f"/sessions/{sid}")).json()


async def test_an_interrupt_as_a_queued_turn_leaves_the_queue_goes_ahead_of_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same moment, an interrupt: the queued turn taken from the queue has not started
    (it is queued until its ``turn.started``), so the interrupting turn starts ahead of it
    and it runs after, in its place (docs/protocol.md §2 "A busy session": ahead of any
    queued turn). It was started, then cancelled (``interrupted``): a queued turn lost."""
    provider = Gated()
    async with running_gateway(config(tmp_path, **{"tools.require_approval": []}), provider) as gw:
        sid = await gw.create_session()
        session = gw.node.sessions[sid]
        async with gw.client(sid) as client:
            await client.subscribe()
            r = await post_turn(gw.http, sid, "hold A")
            assert r.status_code == 202, r.text
            await provider.holding.wait()
            r = await post_turn(gw.http, sid, "Question B", if_busy="queue")
            b = r.json()["turn_id"]
            next_turn = session.next_turn
            interrupting: list[Turn] = []

            def then_interrupt() -> None:
                next_turn()
                waiting = session.turn
                if interrupting or waiting is None:
                    return
                if waiting.id == b and not waiting.started.is_set():  # once
                    taken = busy.submit(session, user_message(sid, "Question I"), "interrupt")
                    assert isinstance(taken, Turn)
                    interrupting.append(taken)

            monkeypatch.setattr(session, "next_turn", then_interrupt)
            provider.let_go()
            with trio.fail_after(10):
                events = await client.until(
                    lambda e: e.type == "turn.completed" and e.turn_id == interrupting[0].id
                )
                if not any(e.turn_id == b and e.type == "turn.cancelled" for e in events):
                    events += await client.until(
                        lambda e: e.type == "turn.completed" and e.turn_id == b
                    )
        [i] = interrupting
        ends = [(e.type, e.turn_id) for e in events if e.type.startswith("turn.")]
        assert ends[-4:] == [
            ("turn.started", i.id),
            ("turn.completed", i.id),
            ("turn.started", b),
            ("turn.completed", b),
        ], ends
        said = [m["content"][0]["text"] for m in await listing(gw, sid) if m["role"] == "user"]
        assert said == ["hold A", "Question I", "Question B"]


async def test_a_queued_turn_about_to_start_never_starts_once_a_delete_began(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The turn before ended and the queued one is taken, not yet started (held here, so
    that the moment lasts), when DELETE begins: the queued turn must never start (docs/
    protocol.md §2: deleting drops them). It started while the delete read the store
    (``turn.started``), to be cancelled ``session_deleted``."""
    provider = Gated()
    async with running_gateway(config(tmp_path, **{"tools.require_approval": []}), provider) as gw:
        sid = await gw.create_session()
        session = gw.node.sessions[sid]
        lane = session.supervisor
        queue_turn = lane.queue_turn
        go = trio.Event()
        store = gw.node.store
        worker_ids = store.worker_ids

        async def reading(session_id: str) -> list[str]:
            go.set()  # the taken turn goes to the agent loop while the delete reads
            return await worker_ids(session_id)

        async with gw.client(sid) as client, trio.open_nursery() as nursery:
            await client.subscribe()
            r = await post_turn(gw.http, sid, "hold A")
            a = r.json()["turn_id"]
            await provider.holding.wait()
            r = await post_turn(gw.http, sid, "Question B", if_busy="queue")
            b = r.json()["turn_id"]

            def held(turn: Turn) -> None:
                async def later() -> None:
                    await go.wait()
                    queue_turn(turn)

                if turn.id == b:
                    nursery.start_soon(later)
                else:
                    queue_turn(turn)

            monkeypatch.setattr(lane, "queue_turn", held)
            provider.let_go()
            with trio.fail_after(10):
                await client.until(lambda e: e.type == "turn.completed" and e.turn_id == a)
            taken = session.turn
            assert taken is not None and taken.id == b and not taken.started.is_set()
            monkeypatch.setattr(store, "worker_ids", reading)
            r = await gw.http.delete(f"/sessions/{sid}")
            assert r.status_code == 204, r.text
            with trio.fail_after(10), contextlib.suppress(ConnectionClosed):
                while True:
                    await client.recv()
        assert [e.type for e in client.events if e.turn_id == b] == ["turn.queued"]
        assert [_last_text(r) for r in provider.requests] == ["hold A"]


async def test_a_queued_turn_about_to_start_waits_through_a_graceful_shutdown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same moment, a graceful shutdown: queued turns wait through it and run once after
    (docs/protocol.md §2 "A busy session", §9). The taken one was started and cancelled
    (``shutdown``): gone from the queue, it never ran."""
    provider = Gated()
    async with running_gateway(config(tmp_path, **{"tools.require_approval": []}), provider) as gw:
        sid = await gw.create_session()
        session = gw.node.sessions[sid]
        lane = session.supervisor
        queue_turn = lane.queue_turn
        node = gw.node
        drain_turns = node.drain_turns
        taken: list[Turn] = []

        def held(turn: Turn) -> None:
            if turn.id == b:
                taken.append(turn)
            else:
                queue_turn(turn)

        async def draining() -> None:
            for turn in taken:  # to the agent loop once the shutdown began, not before
                queue_turn(turn)
            await drain_turns()

        async with gw.client(sid) as client:
            await client.subscribe()
            r = await post_turn(gw.http, sid, "hold A")
            a = r.json()["turn_id"]
            await provider.holding.wait()
            r = await post_turn(gw.http, sid, "Question B", if_busy="queue")
            b = r.json()["turn_id"]
            monkeypatch.setattr(lane, "queue_turn", held)
            monkeypatch.setattr(node, "drain_turns", draining)
            provider.let_go()
            with trio.fail_after(10):
                await client.until(lambda e: e.type == "turn.completed" and e.turn_id == a)
            assert session.turn is not None and session.turn.id == b
    again = Gated()
    async with running_gateway(config(tmp_path), again) as gw, gw.client(sid) as client:
        await client.subscribe(since=format_event_id(0))
        with trio.fail_after(10):
            await client.until(lambda e: e.turn_id == b and e.type in ENDS)
    of_b = [e.type for e in client.events if e.turn_id == b and e.type.startswith("turn.")]
    assert of_b == ["turn.queued", "turn.started", "turn.completed"]
    assert [_last_text(r) for r in again.requests] == ["Question B"]


async def test_a_cancel_then_an_interrupt_as_queued_turns_leave_the_queue(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both in that moment: B, taken, is cancelled (C is taken in its place), then an
    interrupt puts C back. Each leaves a turn the loop skips in its queue, with the
    interrupting turn behind them: all three wait there, none is refused."""
    provider = Gated()
    async with running_gateway(config(tmp_path, **{"tools.require_approval": []}), provider) as gw:
        sid = await gw.create_session()
        session = gw.node.sessions[sid]
        async with gw.client(sid) as client:
            await client.subscribe()
            await post_turn(gw.http, sid, "hold A")
            await provider.holding.wait()
            b, c = [
                (await post_turn(gw.http, sid, text, if_busy="queue")).json()["turn_id"]
                for text in ("Question B", "Question C")
            ]
            next_turn = session.next_turn
            interrupting: list[Turn] = []

            def both() -> None:
                next_turn()
                waiting = session.turn
                if interrupting or waiting is None or waiting.id != b:
                    return
                session.cancel_turn(b, "user", "test")
                taken = busy.submit(session, user_message(sid, "Question I"), "interrupt")
                assert isinstance(taken, Turn)
                interrupting.append(taken)

            monkeypatch.setattr(session, "next_turn", both)
            provider.let_go()
            with trio.fail_after(10):
                await client.until(lambda e: e.type == "turn.completed" and e.turn_id == c)
        [i] = interrupting
        started = [e.turn_id for e in client.events if e.type == "turn.started"]
        assert started[1:] == [i.id, c]

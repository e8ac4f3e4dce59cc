"""Adversary cases of edit and regenerate, forks and a busy session (docs/protocol.md §2),
found in review: each test is a defect's reproduction."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import trio

from gateway.client.views import simple_view
from gateway.errors import Refused
from gateway.ids import message_id_of, new_turn_id, now_ms
from gateway.node import forking
from gateway.protocol.frames import SubscribeAck
from gateway.protocol.shapes import Message, TextBlock
from gateway.session import busy
from tests.conftest import make_config, running_gateway
from tests.integration.doors.rest.test_http_api import assert_error
from tests.integration.session.test_fork import fork as fork_request
from tests.integration.session.test_fork import gateway as fork_gateway
from tests.integration.session.test_fork import turn as fork_turn
from tests.integration.session.test_fork import workspace as fork_workspace
from tests.integration.session.test_rewind import (
    Recording,
    config,
    listing,
    post_turn,
    texts,
    turn,
    user_of,
)
from tests.integration.store.test_restart import crash_copy
from tests.integration.store.test_store_file import remove_store


def user_message(sid: str, text: str) -> Message:
    turn_id = new_turn_id()
    return Message(
        message_id_of(turn_id), sid, turn_id, "user", [TextBlock(text)], "complete", now_ms()
    )


async def test_an_interrupt_whose_target_an_earlier_interrupt_rewound_is_refused(
    tmp_path: Path,
) -> None:
    """Two interrupts with ``rewind_to`` at once: the first rewinds to A (B goes with it), so
    the second's target, B, is rewound by the time it starts. It was started all the same,
    without any rewind (``rewind_skipped``): 202, and the model was sent the first edit's
    branch then the second edit, which asked for A's history then itself."""
    provider = Recording()
    async with running_gateway(config(tmp_path, **{"tools.require_approval": []}), provider) as gw:
        sid = await gw.create_session()
        async with gw.client(sid) as client:
            await client.subscribe()
            a = await turn(gw, client, sid, "Question A")
            b = await turn(gw, client, sid, "Question B")
            provider.held = True
            r = await post_turn(gw.http, sid, "Question C, running")
            assert r.status_code == 202
            session = gw.node.sessions[sid]
            first = busy.submit(session, user_message(sid, "A, edited"), "interrupt", user_of(a))
            second = busy.submit(session, user_message(sid, "B, edited"), "interrupt", user_of(b))
            assert not isinstance(first, busy.ops.TurnTaken)
            assert not isinstance(second, busy.ops.TurnTaken)
            provider.hold.set()
            with trio.fail_after(10):
                await first.started.wait()
                await second.started.wait()  # set as well when it is dropped, unstarted
                if second.refused is None:
                    await client.until(
                        lambda e: e.type == "turn.completed" and e.turn_id == second.id
                    )
        # B was rewound by the first: the second is refused, never started
        assert isinstance(second.refused, Refused), texts(provider.calls[-1])
        assert second.refused.code == "message_rewound"
        said = [m["content"][0]["text"] for m in await listing(gw, sid)]
        assert "B, edited" not in said


# --- forks --------------------------------------------------------------------------------


async def test_a_fork_once_the_store_refuses_every_write_copies_nothing_and_leaves_nothing(
    tmp_path: Path,
) -> None:
    """The store's file is gone (it refuses every write, docs/protocol.md §15): a fork is
    503 ``store_unavailable`` at once. It copied the workspace (up to ``fork_copy_max_mb``)
    and started a live fork the store will never hold, its directory left behind."""
    try:
        async with fork_gateway(tmp_path) as (gw, _model):
            source = await gw.create_session()
            await fork_turn(gw, source, "alpha")
            (fork_workspace(gw, source) / "big.bin").write_bytes(b"x" * (1 << 20))
            own = tmp_path / "workspaces" / "local" / ".own"
            before = set(own.iterdir())
            sessions = set(gw.node.sessions)
            remove_store(Path(gw.node.config.store.path))
            gw.node.store.put_session(gw.node.sessions[source].record)  # finds the file gone
            with trio.fail_after(5):
                while gw.node.store.refusing is None:  # noqa: ASYNC110
                    await trio.sleep(0.01)
            r = await fork_request(gw, source)
            assert_error(r, 503, "store_unavailable")
            assert set(own.iterdir()) == before
            assert set(gw.node.sessions) == sessions
    except BaseExceptionGroup as group:  # its close says what it could not make durable
        lost, rest = group.split(lambda e: "were not made durable" in str(e))
        if rest is not None or lost is None:
            raise


async def test_a_fork_at_a_rewound_message_is_409_message_rewound(tmp_path: Path) -> None:
    """A rewound message is the session's (``GET .../messages/{id}`` answers 200 for it):
    a fork at it was 404 ``message_not_found``, as if unknown; a rewind to it is 409
    ``message_rewound`` (edit the branch you see), and so is a fork."""
    provider = Recording()
    async with running_gateway(config(tmp_path, **{"tools.require_approval": []}), provider) as gw:
        sid = await gw.create_session()
        async with gw.client(sid) as client:
            await client.subscribe()
            await turn(gw, client, sid, "Question A")
            b = await turn(gw, client, sid, "Question B")
            await turn(gw, client, sid, "Question B, edited", rewind_to=user_of(b))
        r = await gw.http.get(f"/sessions/{sid}/messages/{user_of(b)}")
        assert r.status_code == 200
        r = await fork_request(gw, sid, user_of(b))
        assert_error(r, 409, "message_rewound")


@pytest.mark.xfail(strict=True, reason="not fixed: no sweep of a fork's copy a crash left")
async def test_a_crash_mid_fork_leaves_no_workspace_of_a_fork_that_never_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A kill -9 after the fork's workspace was copied and before its record committed:
    the store holds no fork (good), but its copy stays under ``.own`` for ever, found by no
    session, counted by no limit (a retry with the same ``Idempotency-Key`` would replace
    it; one without never does)."""
    copied = trio.Event()
    never = trio.Event()

    async def stuck(*_args: object) -> None:  # the fork is past its copy: the process dies
        copied.set()
        await never.wait()

    monkeypatch.setattr(forking, "_conversation", stuck)
    own = tmp_path / "workspaces" / "local" / ".own"
    crashed = str(tmp_path / "crashed.db")
    async with fork_gateway(tmp_path) as (gw, _model):
        source = await gw.create_session()
        await fork_turn(gw, source, "alpha")
        (fork_workspace(gw, source) / "big.bin").write_bytes(b"x" * (1 << 20))
        before = set(own.iterdir())
        async with trio.open_nursery() as nursery:
            nursery.start_soon(fork_request, gw, source)
            with trio.fail_after(10):
                await copied.wait()
            await gw.node.store.flush()
            crash_copy(gw.node.config.store.path, crashed)
            [left] = set(own.iterdir()) - before  # the copy, no record
            nursery.cancel_scope.cancel()
    monkeypatch.undo()
    for stale in set(own.iterdir()) - before - {left}:  # what the shutdown removed, if any
        shutil.rmtree(stale)
    if not left.exists():  # the orderly shutdown cleaned it: a kill -9 would not have
        shutil.copytree(fork_workspace_path(tmp_path, source), left)
    config = make_config(tmp_path, **{"store.path": crashed, "tools.enabled": ["sleep"]})
    async with running_gateway(config) as gw:
        assert await gw.node.store.get_session(left.name) is None
        with trio.fail_after(10):
            while left.exists():  # noqa: ASYNC110 (a directory, no event to wait on)
                await trio.sleep(0.05)


def fork_workspace_path(tmp_path: Path, sid: str) -> Path:
    """A session's own workspace on the host (the harness's root)."""
    return tmp_path / "workspaces" / "local" / ".own" / sid


async def test_a_replay_across_a_rewind_after_a_crash_ends_on_the_edited_branch(
    tmp_path: Path,
) -> None:
    """docs/protocol.md §2 "Edit and regenerate", Replay, after a kill -9 and a restart."""
    crashed = str(tmp_path / "crashed.db")
    async with running_gateway(config(tmp_path, **{"tools.require_approval": []})) as gw:
        sid = await gw.create_session()
        async with gw.client(sid) as client:
            await client.subscribe()
            a = await turn(gw, client, sid, "Question A")
            b = await turn(gw, client, sid, "Question B")
            await turn(gw, client, sid, "Question C")
            await turn(gw, client, sid, "Question B, edited", rewind_to=user_of(b))
            seen = client.events[: client.events.index(a[-1]) + 1]
            live = simple_view(client.reducer)
        await gw.node.store.flush()
        crash_copy(gw.node.config.store.path, crashed)
    overrides = {"tools.require_approval": [], "store.path": crashed}
    async with running_gateway(config(tmp_path, **overrides)) as gw:
        async with gw.client(sid) as resumed:
            for e in seen:
                resumed.reducer.apply_event(e)
            ack = await resumed.subscribe(since=a[-1].id)
            assert isinstance(ack, SubscribeAck)
            with trio.fail_after(10):
                for _ in range(ack.replay_event_count):
                    await resumed.recv()
        assert "history.rewound" in [e.type for e in resumed.events]
        assert simple_view(resumed.reducer) == live
        assert len(resumed.reducer.messages) == 4


async def test_an_interrupt_whose_message_id_already_waits_to_interrupt_is_refused(
    tmp_path: Path,
) -> None:
    """A session takes a user message id once (docs/protocol.md §2 "Idempotency and
    limits"): a door's id derived from its client's, two ``interrupt`` requests of one
    message at once. The second was taken as well (the interrupting turns waiting in
    memory were not looked at): the first started and was cancelled at once, the second
    started with the same message id, replacing the first's user message."""
    provider = Recording()
    async with running_gateway(config(tmp_path, **{"tools.require_approval": []}), provider) as gw:
        sid = await gw.create_session()
        async with gw.client(sid) as client:
            await client.subscribe()
            await turn(gw, client, sid, "Question A")
            provider.held = True
            r = await post_turn(gw.http, sid, "Question B, running")
            assert r.status_code == 202
            session = gw.node.sessions[sid]
            once = user_message(sid, "Question C")
            busy.submit(session, once, "interrupt")
            with pytest.raises(Refused) as refused:
                busy.submit(session, once, "interrupt")
            assert refused.value.code == "turn_in_progress"
            provider.hold.set()


async def test_a_retried_turn_that_a_rewind_took_out_since_is_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A turn's request answered 503 once its turn had started (not durable in time), retried
    with its ``Idempotency-Key`` after another request rewound that turn's message: the
    retry must find the turn it made (202, that turn), not start it again (it was refused
    409 ``message_rewound``: the look-up read the conversation only)."""
    async with running_gateway(config(tmp_path, **{"tools.require_approval": []})) as gw:
        sid = await gw.create_session()
        node = gw.node
        real = type(node).durable_or_503
        failing = [True]

        async def once(self: object) -> None:
            if failing[0]:
                failing[0] = False
                raise Refused("store_unavailable", "slow", retry_after_s=1)
            await real(node)

        async with gw.client(sid) as client:
            await client.subscribe()
            await turn(gw, client, sid, "Question A")
            monkeypatch.setattr(type(node), "durable_or_503", once)
            key = {"Idempotency-Key": "retry-me"}
            r = await gw.http.post(
                f"/sessions/{sid}/turns", json={"content": "Question B"}, headers=key
            )
            assert r.status_code == 503, r.text
            with trio.fail_after(10):
                b = await client.until_turn_ends()
            await turn(gw, client, sid, "Question B again", rewind_to=user_of(b))
            r = await gw.http.post(
                f"/sessions/{sid}/turns", json={"content": "Question B"}, headers=key
            )
            assert r.status_code == 202, r.text
            assert r.json()["turn_id"] == b[0].turn_id


async def test_a_listing_read_while_a_rewind_commits_flags_what_it_took_out(
    tmp_path: Path,
) -> None:
    """``GET .../messages?include_rewound=true`` where the session runs: its rewinds are
    read after its messages, so a rewind committed while the messages were read flags what
    it took out (they were read before it, and listed unflagged)."""
    provider = Recording()
    async with running_gateway(config(tmp_path, **{"tools.require_approval": []}), provider) as gw:
        sid = await gw.create_session()
        async with gw.client(sid) as client:
            await client.subscribe()
            await turn(gw, client, sid, "Question A")
            b = await turn(gw, client, sid, "Question B")
            store = gw.node.store
            load = store.load_messages
            loaded, go = trio.Event(), trio.Event()

            async def slow_load(session_id: str) -> Any:
                got = await load(session_id)
                loaded.set()
                await go.wait()
                return got

            store.load_messages = slow_load  # type: ignore[method-assign]
            listed: list[dict[str, Any]] = []
            async with trio.open_nursery() as nursery:

                async def read() -> None:
                    listed.extend(await listing(gw, sid, include_rewound="true"))

                nursery.start_soon(read)
                await loaded.wait()
                store.load_messages = load  # type: ignore[method-assign]
                r = await post_turn(gw.http, sid, "Question B, edited", rewind_to=user_of(b))
                assert r.status_code == 202, r.text
                go.set()
            await client.until_turn_ends()
    flagged = {m["id"]: m.get("rewound", False) for m in listed}
    assert flagged[user_of(b)] is True

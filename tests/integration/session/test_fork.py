"""``POST /sessions/{id}/fork`` on a running gateway (docs/protocol.md §2, "Forks").

What reached the model is read from a provider that records every request
(the scripted model underneath), so a fork is judged by what its model is
sent, never by the gateway's internals:

- a fork at a message that ends a turn: its first request holds exactly the
  source's history up to that message, then its own turn; the source's
  messages are unchanged; each session's next request holds only its own
  history; the fork's first event is ``session.forked``;
- at a user message: that message is the fork's draft (the 201, ``GET
  /sessions/{id}``, the metadata) and not in its history; no body forks at
  the last message; an empty session forks empty;
- the fork's snapshot shows the copied history (the reference reducer's view);
- its workspace is a copy (a file in one is not in the other afterwards);
  past ``fork_copy_max_mb``: 409 ``workspace_too_large``, nothing left;
  symlinks (out of the workspace or in it) and FIFOs are not copied;
- adversary cases: another key's session (404 exactly as an unknown id), an
  unknown message, another session's message, a message in the middle of a
  turn, a fork while a turn runs, of a deleted session, of a worker, two
  forks at once, a key at its session limit, an ``Idempotency-Key`` replayed
  and reused; a turn submitted while a fork copies waits for the copy.

Test rules: a real gateway on 127.0.0.1 port 0 with independent clients, on
the real clock under ``fail_after``.
"""

from __future__ import annotations

import os
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
import trio

from gateway.client.views import full_view
from gateway.protocol.frames import Snapshot, SubscribeAck
from gateway.providers.base import ModelRequest
from gateway.providers.raw import RawEvent
from gateway.providers.scripted import ScriptedProvider
from gateway.tools.workspace import Workspaces
from tests.conftest import JSON_TYPE, TOOL_SCRIPT, Harness, make_config, running_gateway
from tests.integration.doors.rest.test_http_api import assert_error
from tests.integration.tenancy.test_tenants import KEYS, UNKNOWN, bearer


class Recording:
    """The scripted model, recording every request."""

    name = "scripted"

    def __init__(self) -> None:
        self.inner = ScriptedProvider()
        self.requests: list[ModelRequest] = []

    async def stream(self, request: ModelRequest) -> AsyncGenerator[RawEvent, None]:
        self.requests.append(request)
        async for raw in self.inner.stream(request):
            yield raw

    async def aclose(self) -> None:
        pass

    def of(self, session_id: str) -> list[ModelRequest]:
        """The requests of one session (its messages carry its id)."""
        return [r for r in self.requests if r.messages[-1].session_id == session_id]


@asynccontextmanager
async def gateway(tmp_path: Path, **overrides: Any) -> AsyncIterator[tuple[Harness, Recording]]:
    model = Recording()
    config = make_config(tmp_path, **{"tools.enabled": ["sleep", "delegate"], **overrides})
    with trio.fail_after(30):
        async with running_gateway(config, model) as gw:
            yield gw, model


async def turn(gw: Harness, sid: str, content: Any) -> str:
    """A turn, to its end; its id."""
    async with gw.client(sid) as client:
        await client.subscribe()
        turn_id = await gw.submit(sid, content)
        with trio.fail_after(10):
            ended = await client.until_turn_ends()
    assert ended[-1].type == "turn.completed", ended[-1]
    return turn_id


async def messages(gw: Harness, sid: str) -> list[dict[str, Any]]:
    r = await gw.http.get(f"/sessions/{sid}/messages", params={"limit": 200})
    assert r.status_code == 200, r.text
    return list(r.json()["messages"])


async def fork(gw: Harness, sid: str, at: str | None = None, **headers: str) -> httpx.Response:
    body = {} if at is None else {"at_message_id": at}
    return await gw.http.post(f"/sessions/{sid}/fork", json=body, headers=headers)


async def forked(gw: Harness, sid: str, at: str | None = None) -> dict[str, Any]:
    r = await fork(gw, sid, at)
    assert r.status_code == 201, r.text
    return dict(r.json())


def sent(request: ModelRequest) -> list[tuple[str, str, Any]]:
    """A request's conversation: each message's id, role and content (as JSON has it)."""
    return [(m.id, m.role, msgspec.to_builtins(m.content)) for m in request.messages]


def stored(rows: list[dict[str, Any]]) -> list[tuple[str, str, Any]]:
    return [(m["id"], m["role"], m["content"]) for m in rows]


def workspace(gw: Harness, sid: str) -> Path:
    return Path(gw.node.workspaces.host_path(gw.node.sessions[sid].record.workspace_path))


# --- the history ------------------------------------------------------------------------


async def test_a_fork_at_a_turn_end_sends_its_model_exactly_the_history_up_to_it(
    tmp_path: Path,
) -> None:
    async with gateway(tmp_path) as (gw, model):
        source = await gw.create_session(metadata={"title": "plans"})
        await turn(gw, source, "alpha")
        await turn(gw, source, "beta")
        before = await messages(gw, source)
        u1, a1, _u2, _a2 = before
        made = await forked(gw, source, a1["id"])
        fork_id = made["session_id"]
        assert made["forked_from"] == {"session_id": source, "at_message_id": a1["id"]}
        assert "draft" not in made and made["agent"] == "default"
        await turn(gw, fork_id, "gamma")
        await turn(gw, source, "delta")
        await turn(gw, fork_id, "epsilon")
        after = await messages(gw, source)
        in_fork = await messages(gw, fork_id)
        attach = (await gw.http.get(f"/sessions/{fork_id}")).json()
        listing = (await gw.http.get("/sessions")).json()["sessions"]
        async with gw.client(fork_id) as client:  # from the very start: the fork's events
            await client.subscribe(since="evt_00000000000000000000")
            first = (await client.until(lambda e: e.type == "turn.completed"))[0]
    # The fork's first request: the source's history up to a1, the same ids, then its turn.
    first_request, second_request = model.of(fork_id)
    copied = sent(first_request)[:2]
    assert copied == stored([u1, a1])
    assert [m.session_id for m in first_request.messages] == [fork_id] * 3
    assert sent(first_request)[2][2] == [{"type": "text", "text": "gamma"}]
    # Each goes on with its own history only.
    texts = [str(sent(r)) for r in model.of(source)]
    assert "gamma" not in texts[-1] and "delta" in texts[-1] and "beta" in texts[-1]
    assert "delta" not in str(sent(second_request)) and "beta" not in str(sent(second_request))
    assert "epsilon" in str(sent(second_request))
    # The source is unchanged but for its own next turn.
    assert after[:4] == before
    assert [m["id"] for m in in_fork[:2]] == [u1["id"], a1["id"]]
    assert all(m["session_id"] == fork_id for m in in_fork)
    # Its first event says where it comes from; its record too.
    assert first.type == "session.forked" and first.turn_id is None
    assert (first.payload.from_session_id, first.payload.at_message_id) == (source, a1["id"])
    assert attach["forked_from"] == made["forked_from"] and "draft" not in attach
    [meta] = [s["metadata"] for s in listing if s["session"]["id"] == fork_id]
    assert meta == {"title": "plans", "forked_from": made["forked_from"]}


async def test_a_fork_at_a_user_message_has_it_as_its_draft(tmp_path: Path) -> None:
    async with gateway(tmp_path) as (gw, model):
        source = await gw.create_session()
        await turn(gw, source, "alpha")
        await turn(gw, source, "beta")
        u1, a1, u2, _ = await messages(gw, source)
        made = await forked(gw, source, u2["id"])
        fork_id = made["session_id"]
        assert made["draft"] == [{"type": "text", "text": "beta"}]
        attach = (await gw.http.get(f"/sessions/{fork_id}")).json()
        assert attach["draft"] == made["draft"]
        assert attach["forked_from"] == {"session_id": source, "at_message_id": u2["id"]}
        assert stored(await messages(gw, fork_id)) == stored([u1, a1])
        await turn(gw, fork_id, "beta, again")
        first = made_at_first = await forked(gw, source, u1["id"])  # the first: nothing before it
        assert await messages(gw, first["session_id"]) == []
        assert made_at_first["draft"] == [{"type": "text", "text": "alpha"}]
    [request] = model.of(fork_id)
    assert sent(request)[:2] == stored([u1, a1]) and len(request.messages) == 3


async def test_no_body_forks_at_the_last_message_and_an_empty_session_forks_empty(
    tmp_path: Path,
) -> None:
    async with gateway(tmp_path) as (gw, _):
        empty = await gw.create_session()
        r = await gw.http.post(f"/sessions/{empty}/fork", headers=JSON_TYPE)  # no body at all
        assert r.status_code == 201, r.text
        assert r.json()["forked_from"] == {"session_id": empty, "at_message_id": None}
        assert await messages(gw, r.json()["session_id"]) == []
        source = await gw.create_session()
        await turn(gw, source, "alpha")
        whole = await messages(gw, source)
        made = await forked(gw, source)
        assert made["forked_from"]["at_message_id"] == whole[-1]["id"]
        assert stored(await messages(gw, made["session_id"])) == stored(whole)
        again = await forked(gw, made["session_id"])  # a fork of a fork: the same history
        assert stored(await messages(gw, again["session_id"])) == stored(whole)


async def test_a_fork_is_stored_whole_and_comes_back_after_a_restart(tmp_path: Path) -> None:
    async with gateway(tmp_path) as (gw, _):
        source = await gw.create_session()
        await turn(gw, source, "alpha")
        await turn(gw, source, "beta")
        u1, a1, u2, _ = await messages(gw, source)
        made = await forked(gw, source, u2["id"])
        fork_id = made["session_id"]
    async with gateway(tmp_path) as (gw, model):  # the daemon restarted
        attach = (await gw.http.get(f"/sessions/{fork_id}")).json()
        assert (attach["forked_from"], attach["draft"]) == (made["forked_from"], made["draft"])
        assert stored(await messages(gw, fork_id)) == stored([u1, a1])
        await turn(gw, fork_id, "gamma")
    [request] = model.of(fork_id)
    assert sent(request)[:2] == stored([u1, a1]) and len(request.messages) == 3


async def test_the_forks_snapshot_shows_the_copied_history(tmp_path: Path) -> None:
    async with gateway(tmp_path) as (gw, _):
        source = await gw.create_session()
        await turn(gw, source, TOOL_SCRIPT)
        whole = await messages(gw, source)
        fork_id = (await forked(gw, source))["session_id"]
        async with gw.client(fork_id) as client:
            ack = await client.subscribe(snapshot=True)
            assert isinstance(ack, SubscribeAck)
            assert isinstance(await client.recv(), Snapshot)
            view = full_view(client.reducer)
    # The tool results message is paired with its tool use, as for the source.
    shown = [m["id"] for m in view["messages"]]
    assert shown == [m["id"] for m in whole if m["content"][0]["type"] != "tool_result"]
    [tool] = [b for m in view["messages"] for b in m["blocks"] if b["type"] == "tool_use"]
    assert tool["status"] == "completed"


# --- the workspace ------------------------------------------------------------------------


async def test_the_workspace_is_copied_and_then_each_is_its_own(tmp_path: Path) -> None:
    async with gateway(tmp_path) as (gw, _):
        source = await gw.create_session()
        here = workspace(gw, source)
        (here / "notes").mkdir()
        (here / "notes" / "plan.txt").write_text("the plan")
        (here / "run.sh").write_text("#!/bin/sh\n")
        (here / "run.sh").chmod(0o750)
        fork_id = (await forked(gw, source))["session_id"]
        there = workspace(gw, fork_id)
        assert there != here and there.name == fork_id
        assert (there / "notes" / "plan.txt").read_text() == "the plan"
        assert (there / "run.sh").stat().st_mode & 0o777 == 0o750
        (here / "later.txt").write_text("source only")
        (there / "notes" / "plan.txt").write_text("the fork's plan")
        assert not (there / "later.txt").exists()
        assert (here / "notes" / "plan.txt").read_text() == "the plan"
        summary = await gw.http.get("/sessions")
        [listed] = [s for s in summary.json()["sessions"] if s["session"]["id"] == fork_id]
        assert listed["session"]["workspace_path"] == f".own/{fork_id}"


async def test_a_named_workspace_is_copied_into_one_of_the_forks_own(tmp_path: Path) -> None:
    async with gateway(tmp_path) as (gw, _):
        source = await gw.create_session(workspace_path="team/project")
        (workspace(gw, source) / "a.txt").write_text("a")
        fork_id = (await forked(gw, source))["session_id"]
        assert (workspace(gw, fork_id) / "a.txt").read_text() == "a"
        (workspace(gw, fork_id) / "b.txt").write_text("b")
        assert not (workspace(gw, source) / "b.txt").exists()
        assert (await gw.http.delete(f"/sessions/{fork_id}")).status_code == 204
        assert (workspace(gw, source) / "a.txt").exists()  # the named one stays


async def test_past_fork_copy_max_mb_nothing_is_copied(tmp_path: Path) -> None:
    async with gateway(tmp_path, **{"sessions.fork_copy_max_mb": 1}) as (gw, _):
        source = await gw.create_session()
        (workspace(gw, source) / "big.bin").write_bytes(b"x" * (2 << 20))
        before = set((tmp_path / "workspaces" / "local" / ".own").iterdir())
        error = assert_error(await fork(gw, source), 409, "workspace_too_large")
        assert "2.0 MiB" in error["message"] and "fork_copy_max_mb (1 MiB)" in error["message"]
        assert set((tmp_path / "workspaces" / "local" / ".own").iterdir()) == before
        listed = (await gw.http.get("/sessions")).json()["sessions"]
        assert [s["session"]["id"] for s in listed] == [source]
        (workspace(gw, source) / "big.bin").write_bytes(b"x" * (1 << 20))  # at the limit
        assert (await fork(gw, source)).status_code == 201


async def test_symlinks_and_fifos_are_not_copied(tmp_path: Path) -> None:
    """A link out of the workspace is never followed: nothing of its target is copied."""
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "key.txt").write_text("the daemon's secret")
    async with gateway(tmp_path) as (gw, _):
        source = await gw.create_session()
        here = workspace(gw, source)
        (here / "kept.txt").write_text("kept")
        (here / "out_file").symlink_to(secret / "key.txt")
        (here / "out_dir").symlink_to(secret)
        (here / "in_link").symlink_to("kept.txt")
        os.mkfifo(here / "pipe")
        fork_id = (await forked(gw, source))["session_id"]
        there = workspace(gw, fork_id)
        names = sorted(p.name for p in there.iterdir())
    assert names == ["kept.txt"]
    copied = [p.read_bytes() for p in there.rglob("*") if p.is_file()]
    assert b"the daemon's secret" not in b"".join(copied)


async def test_a_turn_submitted_while_a_fork_copies_waits_for_the_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    copying, release = trio.Event(), trio.Event()
    original = Workspaces.copy

    async def held(self: Workspaces, **kw: Any) -> str:
        copying.set()
        await release.wait()
        return await original(self, **kw)

    monkeypatch.setattr(Workspaces, "copy", held)
    async with gateway(tmp_path) as (gw, _):
        source = await gw.create_session()
        await turn(gw, source, "alpha")
        answers: dict[str, httpx.Response] = {}

        async def forking() -> None:
            answers["fork"] = await fork(gw, source)

        async def submitting() -> None:
            r = await gw.http.post(f"/sessions/{source}/turns", json={"content": "beta"})
            answers["turn"] = r

        async with trio.open_nursery() as nursery:
            nursery.start_soon(forking)
            await copying.wait()
            nursery.start_soon(submitting)
            await trio.sleep(0.2)  # the turn had time to start, were it not waiting
            assert "turn" not in answers and gw.node.sessions[source].turn is None
            release.set()
        assert answers["fork"].status_code == 201 and answers["turn"].status_code == 202
        fork_id = answers["fork"].json()["session_id"]
        assert len(await messages(gw, fork_id)) == 2  # the turn after the copy is not in it


async def test_a_source_deleted_while_its_workspace_is_copied_makes_no_fork(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    copying, release = trio.Event(), trio.Event()
    original = Workspaces.copy

    async def held(self: Workspaces, **kw: Any) -> str:
        copying.set()
        await release.wait()
        return await original(self, **kw)

    monkeypatch.setattr(Workspaces, "copy", held)
    async with gateway(tmp_path) as (gw, _):
        source = await gw.create_session()
        await turn(gw, source, "alpha")
        (workspace(gw, source) / "f.txt").write_text("f")
        answers: dict[str, httpx.Response] = {}

        async def forking() -> None:
            answers["fork"] = await fork(gw, source)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(forking)
            await copying.wait()
            assert (await gw.http.delete(f"/sessions/{source}")).status_code == 204
            release.set()
        assert_error(answers["fork"], 404, "session_not_found")
        assert (await gw.http.get("/sessions")).json()["sessions"] == []
        assert list((tmp_path / "workspaces" / "local" / ".own").iterdir()) == []


# --- adversary cases ----------------------------------------------------------------------


async def test_forks_that_name_no_fork_point(tmp_path: Path) -> None:
    async with gateway(tmp_path) as (gw, _):
        source = await gw.create_session()
        other = await gw.create_session()
        await turn(gw, source, TOOL_SCRIPT)
        await turn(gw, other, "elsewhere")
        user, asked, results, final = await messages(gw, source)
        assert [b["type"] for b in asked["content"]][-1] == "tool_use"
        for mid_turn in (asked, results):
            error = assert_error(await fork(gw, source, mid_turn["id"]), 409, "not_a_fork_point")
            assert final["id"] in error["message"] and user["id"] in error["message"]
        assert_error(await fork(gw, source, "msg_00000000000000000000"), 404, "message_not_found")
        elsewhere = (await messages(gw, other))[0]["id"]
        assert_error(await fork(gw, source, elsewhere), 404, "message_not_found")
        assert (await fork(gw, source, final["id"])).status_code == 201
        r = await gw.http.post(f"/sessions/{source}/fork", json={"at": final["id"]})
        assert_error(r, 422, "invalid_body")
        listed = (await gw.http.get("/sessions")).json()["sessions"]
    assert len(listed) == 3  # the two sessions and the one fork


async def test_a_fork_while_a_turn_runs_is_409_and_after_it_works(tmp_path: Path) -> None:
    ask = {"script": {"rounds": [[{"tool_use": {"name": "sleep", "input": {"seconds": 0}}}]]}}
    async with gateway(tmp_path, **{"tools.require_approval": ["sleep"]}) as (gw, _):
        source = await gw.create_session()
        async with gw.client(source) as client:
            await client.subscribe()
            await gw.submit(source, ask)
            asked = (await client.until(lambda e: e.type == "permission.requested"))[-1]
            error = assert_error(await fork(gw, source), 409, "turn_in_progress")
            assert asked.turn_id in error["message"]
            r = await gw.http.post(
                f"/sessions/{source}/permissions/{asked.payload.perm_id}",
                json={"decision": "allow"},
            )
            assert r.status_code == 202
            await client.until_turn_ends()
        assert (await fork(gw, source)).status_code == 201


async def test_a_fork_of_a_deleted_session_or_of_a_worker(tmp_path: Path) -> None:
    work = {"script": {"rounds": [[{"tool_use": {"name": "delegate", "input": {"task": "w"}}}]]}}
    async with gateway(tmp_path) as (gw, _):
        gone = await gw.create_session()
        await turn(gw, gone, "alpha")
        assert (await gw.http.delete(f"/sessions/{gone}")).status_code == 204
        assert_error(await fork(gw, gone), 404, "session_not_found")
        parent = await gw.create_session()
        async with gw.client(parent) as client:
            await client.subscribe()
            await gw.submit(parent, work)
            events = await client.until_turn_ends()
        [worker] = [e.payload.worker_session_id for e in events if e.type == "delegate.started"]
        error = assert_error(await fork(gw, worker), 409, "worker_session")
        assert parent in error["message"]


async def test_two_forks_of_one_session_at_once(tmp_path: Path) -> None:
    async with gateway(tmp_path) as (gw, _):
        source = await gw.create_session()
        await turn(gw, source, "alpha")
        (workspace(gw, source) / "f.txt").write_text("f" * 100_000)
        answers: list[httpx.Response] = []

        async def one() -> None:
            answers.append(await fork(gw, source))

        async with trio.open_nursery() as nursery:
            for _ in range(2):
                nursery.start_soon(one)
        ids = [r.json()["session_id"] for r in answers]
        assert [r.status_code for r in answers] == [201, 201] and ids[0] != ids[1]
        whole = stored(await messages(gw, source))
        for fork_id in ids:
            assert stored(await messages(gw, fork_id)) == whole
            assert (workspace(gw, fork_id) / "f.txt").read_text() == "f" * 100_000


async def test_another_keys_session_is_404_as_an_unknown_one(tmp_path: Path) -> None:
    async with gateway(tmp_path, **KEYS) as (gw, _):
        base = gw.base
        async with (
            httpx.AsyncClient(base_url=base, headers=bearer("key-a")) as a,
            httpx.AsyncClient(base_url=base, headers=bearer("key-b")) as b,
        ):
            harness_a = Harness(gw.gateway, a)
            source = await harness_a.create_session()
            await turn(harness_a, source, "alpha")
            mine = (await messages(harness_a, source))[-1]["id"]
            theirs = await b.post(f"/sessions/{source}/fork", json={"at_message_id": mine})
            unknown = await b.post(f"/sessions/{UNKNOWN}/fork", json={"at_message_id": mine})
            assert theirs.status_code == unknown.status_code == 404
            assert theirs.json()["error"] == {
                "code": "session_not_found",
                "message": unknown.json()["error"]["message"].replace(UNKNOWN, source),
            }
            made = await a.post(f"/sessions/{source}/fork", json={})
            assert made.status_code == 201
            fork_id = made.json()["session_id"]
            assert (await b.get(f"/sessions/{fork_id}")).status_code == 404  # a's, as its source
            assert gw.node.sessions[fork_id].record.owner == gw.node.sessions[source].record.owner


async def test_a_key_at_its_session_limit_cannot_fork(tmp_path: Path) -> None:
    async with gateway(tmp_path, **{"limits.max_sessions_per_key": 2}) as (gw, _):
        source = await gw.create_session()
        await turn(gw, source, "alpha")
        (workspace(gw, source) / "f.txt").write_text("f")
        assert (await fork(gw, source)).status_code == 201  # the second session
        own = tmp_path / "workspaces" / "local" / ".own"
        before = set(own.iterdir())
        error = assert_error(await fork(gw, source), 429, "too_many_sessions")
        assert "max_sessions_per_key is 2" in error["message"]
        assert set(own.iterdir()) == before
        listed = (await gw.http.get("/sessions")).json()["sessions"]
        assert len(listed) == 2
        fork_id = next(s["session"]["id"] for s in listed if s["session"]["id"] != source)
        assert (await gw.http.delete(f"/sessions/{fork_id}")).status_code == 204
        assert (await fork(gw, source)).status_code == 201  # its slot came back


async def test_an_idempotency_key_makes_one_fork(tmp_path: Path) -> None:
    async with gateway(tmp_path) as (gw, _):
        source = await gw.create_session()
        await turn(gw, source, "alpha")
        u1 = (await messages(gw, source))[0]["id"]
        first = await fork(gw, source, u1, **{"Idempotency-Key": "fork-1"})
        again = await fork(gw, source, u1, **{"Idempotency-Key": "fork-1"})
        assert first.status_code == again.status_code == 201
        assert again.content == first.content and again.headers["idempotent-replayed"] == "true"
        assert first.json()["draft"] == [{"type": "text", "text": "alpha"}]
        reused = await fork(gw, source, **{"Idempotency-Key": "fork-1"})  # another body
        assert_error(reused, 422, "idempotency_key_reused")
        listed = (await gw.http.get("/sessions")).json()["sessions"]
    assert len(listed) == 2


async def test_a_fork_whose_node_died_holding_its_key_is_found_or_made_under_its_id(
    tmp_path: Path,
) -> None:
    """docs/protocol.md §13: the retry finds what the dead attempt made (its record), and
    answers it as the first attempt would have; else it makes it under the id the key holds."""
    from gateway.doors.rest.idempotency import fingerprint
    from gateway.ids import now_ms
    from gateway.store.idempotency import Claim

    async with gateway(tmp_path) as (gw, _):
        source = await gw.create_session()
        await turn(gw, source, "alpha")
        user = (await messages(gw, source))[0]["id"]
        made = await fork(gw, source, user)
        path, body = f"/sessions/{source}/fork", f'{{"at_message_id": "{user}"}}'.encode()
        claim = Claim(fingerprint("POST", path, body), made.json()["session_id"], "gone", 0)
        await gw.node.store.claim_request("", "died-after", claim, now_ms())
        found = await gw.http.post(
            path, content=body, headers={**JSON_TYPE, "Idempotency-Key": "died-after"}
        )
        assert (found.status_code, found.json()) == (201, made.json())
        assert found.headers["idempotent-replayed"] == "true"
        planned = Claim(claim.fingerprint, "sess_planned0000000000", "gone", 0)
        await gw.node.store.claim_request("", "died-before", planned, now_ms())
        retried = await gw.http.post(
            path, content=body, headers={**JSON_TYPE, "Idempotency-Key": "died-before"}
        )
        assert retried.status_code == 201 and retried.json()["session_id"] == planned.target
        assert retried.json()["draft"] == [{"type": "text", "text": "alpha"}]


async def test_a_claude_code_fork_whose_transcript_is_not_here_is_409(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The source's CLI never ran on this node (its history written here as the store
    would have it): its conversation cannot be resumed, and nothing is made."""
    pytest.importorskip("claude_agent_sdk", reason="needs the claude-code extra")
    from bench.fake_api import FakeServer
    from gateway.protocol.shapes import Message, TextBlock
    from gateway.providers.factory import make_providers
    from gateway.runtimes.claude_code.paths import state_dir
    from tests.claude_code_support import cc_config

    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-fake")
    config = cc_config(tmp_path, FakeServer(), sandbox="false")
    providers = make_providers(config, {"ANTHROPIC_API_KEY": "sk-fake"})
    with trio.fail_after(30):
        async with running_gateway(config, providers) as gw:
            source = await gw.create_session()
            session = gw.node.sessions[source]
            for id_, role in (("msg_u1", "user"), ("msg_01A", "assistant")):
                text = [TextBlock(id_)]
                session.add_message(Message(id_, source, "turn_1", role, text, "complete", 0))
            error = assert_error(await fork(gw, source, "msg_01A"), 409, "transcript_unavailable")
            assert "not on this node's storage" in error["message"]
            own = tmp_path / "workspaces" / "local" / ".own"
            assert [p.name for p in own.iterdir()] == [source]
            made = await forked(gw, source, "msg_u1")  # nothing to resume: a new conversation
            home = Path(state_dir(gw.node.workspaces.root, made["session_id"]))
            assert not (home / ".fork.json").exists()
            assert len((await gw.http.get("/sessions")).json()["sessions"]) == 2
    await providers.aclose()

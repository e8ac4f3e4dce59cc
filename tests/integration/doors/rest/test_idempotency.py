"""``Idempotency-Key`` on ``POST /sessions`` and ``POST .../turns`` (docs/protocol.md §13).

On a live gateway, as an adversary would try it: the same key twice (one
session, the same answer), the same body written another way, another body
(422), another key's owner (independent), two identical requests racing
(one runs), a turn retried after it ended, an error answer (not recorded:
the retry runs), a node that died holding the key (the retry finds what was
made, or makes it under the same id), a restart (the records stay), and
headers that are not keys.
"""

# ruff: noqa: ASYNC110

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from gateway.ids import now_ms
from gateway.store.idempotency import Claim
from tests.conftest import JSON_TYPE, Harness, make_config, running_gateway

KEYS = {"auth.api_keys": ["key-a", "key-b"]}
QUICK = json.dumps({"script": {"rounds": [[{"text": "done"}]]}})
SLOW = json.dumps({"script": {"delay_ms": 5, "rounds": [[{"lorem": 200}]]}})  # a second


def keyed(key: str, bearer: str | None = None) -> dict[str, str]:
    headers = {"Idempotency-Key": key}
    if bearer is not None:
        headers["Authorization"] = f"Bearer {bearer}"
    return headers


def session_count(tmp_path: Path) -> int:
    with sqlite3.connect(tmp_path / "gateway.db") as db:
        return int(db.execute("SELECT count(*) FROM sessions").fetchone()[0])


def user_turns(tmp_path: Path, sid: str) -> list[str]:
    with sqlite3.connect(tmp_path / "gateway.db") as db:
        rows = db.execute("SELECT data FROM messages WHERE session_id = ?", (sid,)).fetchall()
    return [m["turn_id"] for m in map(json.loads, (r for (r,) in rows)) if m["role"] == "user"]


async def post(gw: Harness, path: str, body: Any, headers: dict[str, str]) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return await gw.http.post(path, content=content, headers={**JSON_TYPE, **headers})


async def wait_idle(gw: Harness, sid: str) -> None:
    with trio.fail_after(10):
        while gw.node.sessions[sid].turn is not None:
            await trio.sleep(0.01)


@pytest.fixture
async def gw(tmp_path: Path) -> Any:
    with trio.fail_after(60):
        async with running_gateway(make_config(tmp_path)) as harness:
            yield harness


async def test_the_same_key_twice_makes_one_session_and_answers_the_same(
    gw: Harness, tmp_path: Path
) -> None:
    first = await post(gw, "/sessions", {"metadata": {"a": 1, "b": [1, 2]}}, keyed("k1"))
    assert first.status_code == 201, first.text
    # The same body written another way (key order, spaces) is the same request.
    again = await post(gw, "/sessions", b'{ "metadata" : {"b": [1,2], "a": 1} }', keyed("k1"))
    assert (again.status_code, again.content) == (201, first.content)
    assert again.headers["idempotent-replayed"] == "true"
    assert "idempotent-replayed" not in first.headers
    assert session_count(tmp_path) == 1
    metrics = (await gw.http.get("/metrics")).text
    assert "gateway_idempotent_replays_total 1.0" in metrics


async def test_an_empty_body_and_an_empty_object_are_one_request(
    gw: Harness, tmp_path: Path
) -> None:
    first = await post(gw, "/sessions", b"", keyed("k"))
    again = await post(gw, "/sessions", {}, keyed("k"))
    assert (first.status_code, again.content) == (201, first.content)
    assert session_count(tmp_path) == 1


async def test_the_same_key_with_another_body_or_path_is_422(gw: Harness, tmp_path: Path) -> None:
    assert (await post(gw, "/sessions", {}, keyed("k"))).status_code == 201
    other = await post(gw, "/sessions", {"metadata": {"x": 1}}, keyed("k"))
    assert other.status_code == 422
    assert other.json()["error"]["code"] == "idempotency_key_reused"
    assert "Idempotency-Key" in other.json()["error"]["message"]
    sid = await gw.create_session()
    turn = await post(gw, f"/sessions/{sid}/turns", {}, keyed("k"))  # the body is checked first
    assert turn.json()["error"]["code"] == "invalid_body"
    turn = await post(gw, f"/sessions/{sid}/turns", {"content": QUICK}, keyed("k"))
    assert turn.status_code == 422 and turn.json()["error"]["code"] == "idempotency_key_reused"
    assert session_count(tmp_path) == 2


async def test_a_key_is_each_owners_own(tmp_path: Path) -> None:
    async with running_gateway(make_config(tmp_path, **KEYS)) as gw:
        a = await post(gw, "/sessions", {}, keyed("shared", "key-a"))
        b = await post(gw, "/sessions", {}, keyed("shared", "key-b"))
        assert a.status_code == b.status_code == 201
        assert a.json()["session_id"] != b.json()["session_id"]
        # Another body under the same key: 422 to key-a only; key-b's is independent.
        mine = await post(gw, "/sessions", {"metadata": {"x": 1}}, keyed("k2", "key-a"))
        assert mine.status_code == 201
        other = await post(gw, "/sessions", {"metadata": {"x": 2}}, keyed("k2", "key-b"))
        assert other.status_code == 201
        replay = await post(gw, "/sessions", {}, keyed("shared", "key-b"))
        assert replay.content == b.content
        assert session_count(tmp_path) == 4


async def test_two_identical_requests_racing_make_one_session(gw: Harness, tmp_path: Path) -> None:
    registry = gw.node.registry
    create = registry.create
    release = trio.Event()

    async def slow_create(**how: Any) -> Any:
        await release.wait()
        return await create(**how)

    registry.create = slow_create  # type: ignore[method-assign]
    answers: list[httpx.Response] = []

    async def one() -> None:
        answers.append(await post(gw, "/sessions", {}, keyed("race")))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(one)
        await trio.sleep(0.2)
        nursery.start_soon(one)  # while the first still holds the key
        with trio.fail_after(10):
            while len(answers) < 1:
                await trio.sleep(0.01)
        release.set()
    late = answers[0]
    assert late.status_code == 409, late.text
    assert late.json()["error"]["code"] == "idempotency_key_in_use"
    assert late.headers["retry-after"] == "1"
    first = answers[1]
    assert first.status_code == 201
    retry = await post(gw, "/sessions", {}, keyed("race"))
    assert retry.content == first.content
    assert session_count(tmp_path) == 1


async def test_many_identical_requests_at_once_make_one_session(
    gw: Harness, tmp_path: Path
) -> None:
    answers: list[httpx.Response] = []

    async def one() -> None:
        answers.append(await post(gw, "/sessions", {}, keyed("crowd")))

    async with trio.open_nursery() as nursery:
        for _ in range(8):
            nursery.start_soon(one)
    made = {r.content for r in answers if r.status_code == 201}
    assert len(made) == 1
    assert {r.status_code for r in answers} <= {201, 409}
    assert session_count(tmp_path) == 1


async def test_a_turn_retried_after_it_ended_is_not_run_again(gw: Harness, tmp_path: Path) -> None:
    sid = await gw.create_session()
    path = f"/sessions/{sid}/turns"
    first = await post(gw, path, {"content": QUICK}, keyed("t1"))
    assert first.status_code == 202, first.text
    await wait_idle(gw, sid)
    again = await post(gw, path, {"content": QUICK}, keyed("t1"))
    assert (again.status_code, again.content) == (202, first.content)
    assert user_turns(tmp_path, sid) == [first.json()["turn_id"]]


async def test_an_error_answer_is_not_recorded_and_the_retry_runs(
    gw: Harness, tmp_path: Path
) -> None:
    sid = await gw.create_session()
    path = f"/sessions/{sid}/turns"
    busy = await post(gw, path, {"content": SLOW}, {})
    assert busy.status_code == 202
    refused = await post(gw, path, {"content": QUICK}, keyed("t2"))
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "turn_in_progress"
    await wait_idle(gw, sid)
    retried = await post(gw, path, {"content": QUICK}, keyed("t2"))
    assert retried.status_code == 202 and "idempotent-replayed" not in retried.headers
    unknown = await post(gw, "/sessions", {"agent": "nope"}, keyed("s"))
    assert unknown.status_code == 422
    again = await post(gw, "/sessions", {"agent": "nope"}, keyed("s"))
    assert again.status_code == 422 and "idempotent-replayed" not in again.headers


async def test_a_node_that_died_holding_a_key_is_taken_over(gw: Harness, tmp_path: Path) -> None:
    """The holder died after making its session: the retry finds it; before: makes it."""
    from gateway.doors.rest.idempotency import fingerprint

    made = await post(gw, "/sessions", {}, {})
    sid = made.json()["session_id"]
    store = gw.node.store
    fp = fingerprint("POST", "/sessions", b"{}")
    claimed = await store.claim_request("", "died-after", Claim(fp, sid, "gone", 0), now_ms())
    assert claimed.outcome == "new"
    found = await post(gw, "/sessions", {}, keyed("died-after"))
    assert (found.status_code, found.content) == (201, made.content)
    assert found.headers["idempotent-replayed"] == "true"
    # Died before making it: made now, under the id the key holds.
    claim = Claim(fp, "sess_planned0000000000", "gone", 0)
    await store.claim_request("", "died-before", claim, now_ms())
    retried = await post(gw, "/sessions", {}, keyed("died-before"))
    assert retried.status_code == 201
    assert retried.json()["session_id"] == "sess_planned0000000000"
    # Still held by a live attempt: 409.
    await store.claim_request("", "held", Claim(fp, "sess_x", "alive", 60_000), now_ms())
    held = await post(gw, "/sessions", {}, keyed("held"))
    assert held.status_code == 409
    assert session_count(tmp_path) == 2


async def test_a_turn_whose_node_died_holding_its_key_is_found(gw: Harness, tmp_path: Path) -> None:
    from gateway.doors.rest.idempotency import fingerprint

    sid = await gw.create_session()
    path = f"/sessions/{sid}/turns"
    first = await post(gw, path, {"content": QUICK}, {})
    turn_id = first.json()["turn_id"]
    await wait_idle(gw, sid)
    body = json.dumps({"content": QUICK}).encode()
    claim = Claim(fingerprint("POST", path, body), turn_id, "gone", 0)
    await gw.node.store.claim_request("", "t", claim, now_ms())
    found = await post(gw, path, body, keyed("t"))
    assert (found.status_code, found.json()) == (202, {"turn_id": turn_id})
    assert user_turns(tmp_path, sid) == [turn_id]


async def test_a_restart_keeps_the_records(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    async with running_gateway(config) as gw:
        first = await post(gw, "/sessions", {}, keyed("durable"))
        sid = first.json()["session_id"]
        turn = await post(gw, f"/sessions/{sid}/turns", {"content": QUICK}, keyed("durable-t"))
        await wait_idle(gw, sid)
    async with running_gateway(config) as gw:
        again = await post(gw, "/sessions", {}, keyed("durable"))
        assert (again.status_code, again.content) == (201, first.content)
        path = f"/sessions/{sid}/turns"
        turn_again = await post(gw, path, {"content": QUICK}, keyed("durable-t"))
        assert (turn_again.status_code, turn_again.content) == (202, turn.content)
    assert session_count(tmp_path) == 1
    assert user_turns(tmp_path, sid) == [turn.json()["turn_id"]]


async def test_a_record_older_than_24_hours_is_forgotten(gw: Harness) -> None:
    store = gw.node.store
    day = 24 * 3600 * 1000
    start = now_ms()
    claim = Claim("fp", "sess_a", "h", 1000)
    claimed = await store.claim_request("", "old", claim, start)
    assert claimed.outcome == "new"
    await store.settle_request("", "old", claimed.record.holder, 201, b"{}")
    later = await store.claim_request("", "old", Claim("fp", "sess_b", "h2", 1000), start + day - 1)
    assert later.outcome == "answered"
    fresh = await store.claim_request("", "old", Claim("other", "sess_c", "h3", 1000), start + day)
    assert (fresh.outcome, fresh.record.target) == ("new", "sess_c")


@pytest.mark.parametrize(
    "value",
    [b"", b"x" * 256, "caf\u00e9".encode("latin-1"), b"a\x7fb"],
    ids=["empty", "256-chars", "latin-1", "del"],
)
async def test_a_header_that_is_not_a_key_is_400(gw: Harness, tmp_path: Path, value: bytes) -> None:
    sid = await gw.create_session()
    for path, body in [("/sessions", {}), (f"/sessions/{sid}/turns", {"content": QUICK})]:
        r = await gw.http.post(
            path,
            content=json.dumps(body).encode(),
            headers=[(b"content-type", b"application/json"), (b"idempotency-key", value)],
        )
        assert r.status_code == 400, r.text
        assert r.json()["error"]["code"] == "invalid_idempotency_key"
        assert "Idempotency-Key" in r.json()["error"]["message"]
    assert session_count(tmp_path) == 1  # only the one made to send turns to


async def test_the_longest_key_and_every_printable_character_are_keys(gw: Harness) -> None:
    longest = ("k" * 255).encode()
    printable = bytes(range(0x21, 0x7F))
    for value in (longest, printable, b"a b"):
        r = await gw.http.post(
            "/sessions",
            content=b"{}",
            headers=[(b"content-type", b"application/json"), (b"idempotency-key", value)],
        )
        assert r.status_code == 201, r.text


async def test_the_api_document_lists_the_header_where_it_is_taken(gw: Harness) -> None:
    doc = (await gw.http.get("/openapi.json")).json()
    taking = {
        op["operationId"]
        for item in doc["paths"].values()
        for op in item.values()
        if any(p["name"] == "Idempotency-Key" for p in op.get("parameters", []))
    }
    assert taking == {"create_session", "submit_turn", "fork"}
    create = doc["paths"]["/sessions"]["post"]["responses"]
    assert "idempotency_key_reused" in json.dumps(create["422"])
    assert "idempotency_key_in_use" in json.dumps(create["409"])


async def test_a_restart_frees_a_key_its_process_held(tmp_path: Path) -> None:
    """SQLite is one process's: what the dead process held is not in use by anyone."""
    from gateway.doors.rest.idempotency import fingerprint

    config = make_config(tmp_path)
    fp = fingerprint("POST", "/sessions", b"{}")
    async with running_gateway(config) as gw:
        claim = Claim(fp, "sess_planned1111111111", "h", 60_000)
        await gw.node.store.claim_request("", "interrupted", claim, now_ms())
        assert (await post(gw, "/sessions", {}, keyed("interrupted"))).status_code == 409
    async with running_gateway(config) as gw:
        made = await post(gw, "/sessions", {}, keyed("interrupted"))
        assert made.status_code == 201, made.text
        assert made.json()["session_id"] == "sess_planned1111111111"


@pytest.mark.slow  # over a second on two cores: the store's real commit timeout
async def test_a_503_whose_write_was_pending_is_answered_once_durable(tmp_path: Path) -> None:
    """The store fails: 503, the session still pending; the retry answers it, made once."""
    from gateway.errors import StoreError

    config = make_config(tmp_path, **{"store.commit_timeout_s": 1.0, "store.lease_s": 0.5})
    with trio.fail_after(60):
        async with running_gateway(config) as gw:
            store = gw.node.store
            apply = store._apply  # type: ignore[attr-defined]

            async def failing(batch: Any) -> list[str]:
                raise StoreError("the disk is on fire")

            store._apply = failing  # type: ignore[attr-defined]
            refused = await post(gw, "/sessions", {}, keyed("k"))
            assert refused.status_code == 503, refused.text
            pending = [s for s in gw.node.sessions]
            assert len(pending) == 1
            store._apply = apply  # type: ignore[attr-defined]
            while True:  # 409 while the refused attempt's hold lasts (it could not let go),
                again = await post(gw, "/sessions", {}, keyed("k"))  # 503 while the writer waits
                if again.status_code not in (409, 503):
                    break
                await trio.sleep(0.2)
            assert again.status_code == 201, again.text
            assert again.json()["session_id"] == pending[0]
            assert session_count(tmp_path) == 1


async def test_a_deleted_session_replays_its_creation_and_404s_its_turns(gw: Harness) -> None:
    made = await post(gw, "/sessions", {}, keyed("doomed"))
    sid = made.json()["session_id"]
    path = f"/sessions/{sid}/turns"
    assert (await post(gw, path, {"content": QUICK}, keyed("doomed-t"))).status_code == 202
    await wait_idle(gw, sid)
    assert (await gw.http.delete(f"/sessions/{sid}")).status_code == 204
    replay = await post(gw, "/sessions", {}, keyed("doomed"))  # what it answered
    assert (replay.status_code, replay.content) == (201, made.content)
    assert (await gw.http.get(f"/sessions/{sid}")).status_code == 404
    turn = await post(gw, path, {"content": QUICK}, keyed("doomed-t"))
    assert turn.status_code == 404 and turn.json()["error"]["code"] == "session_not_found"

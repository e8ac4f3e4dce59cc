"""A session its client names is one tenant's, whichever doors race for it (docs/protocol.md §14).

Issue 38's trial, as the adversary ran it: two API keys, tenant A on
``POST /agui`` with ``threadId`` X, tenant B on ``POST /ai-sdk/chat`` with
``id`` X, both bodies held back by one byte and released together
(tests/named_race.py). Before the fix each door kept its own set of names
being created, the registry did not check that the id was free, and the
store's upsert rewrote the owner: 18-30 of 60 pairs both got 200 and the
owner then read the other tenant's messages. Checked here on SQLite and on
Redis (one node; two nodes: tests/system/cluster/test_named_sessions_cluster.py):
200 pairs, each name one tenant's (its 200), the other 404, and what each
key reads of it, live and after the gateway restarted on the same store, is
that tenant's alone. Then a property test over every door that names a
session (AG-UI, the AI SDK's HTTP and its WebSocket): whatever sequence of
doors, keys and names, a name is made once and stays its first maker's.

Also the store's half, on both backends: ``insert_session`` inserts only a
free id (two at once: one does), and no upsert changes an owner.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from trio_websocket import open_websocket_url

from tests.conftest import Harness, make_config, running_gateway
from tests.named_race import DOORS, KEYS, check_one_owner, race
from tests.redis_support import RedisServer, own_redis, redis_server

__all__ = ["own_redis", "redis_server"]  # fixtures

CONFIG = {"auth.api_keys": list(KEYS)}


@asynccontextmanager
async def serving(tmp_path: Path, **overrides: Any) -> AsyncIterator[tuple[Harness, int]]:
    with trio.fail_after(120):
        async with running_gateway(make_config(tmp_path, **(CONFIG | overrides))) as gw:
            yield gw, int(gw.base.rsplit(":", 1)[1])


async def _race_and_check(tmp_path: Path, pairs: int, **backend: Any) -> None:
    async with serving(tmp_path, **backend) as (gw, port):
        results = await race(pairs, ("agui", port), ("aisdk", port))
        won = await check_one_owner(results, [gw.base])
        assert sum(won.values()) == pairs
    async with serving(tmp_path, **backend) as (gw, _):  # restarted: read from the store alone
        await check_one_owner(results, [gw.base])


@pytest.mark.parametrize("pairs", [40, pytest.param(200, marks=pytest.mark.slow)])
async def test_two_doors_racing_for_one_name_on_sqlite(tmp_path: Path, pairs: int) -> None:
    await _race_and_check(tmp_path, pairs)


@pytest.mark.slow  # redis-server
async def test_two_doors_racing_for_one_name_on_redis(
    tmp_path: Path, own_redis: RedisServer
) -> None:
    await _race_and_check(tmp_path, 200, **{"store.backend": "redis", "store.url": own_redis.url})


async def test_one_door_racing_itself_makes_one_session(tmp_path: Path) -> None:
    """The same door twice (two tabs of two tenants), each door in turn."""
    async with serving(tmp_path) as (gw, port):
        for door in DOORS:
            results = await race(50, (door, port), (door, port))
            await check_one_owner(results, [gw.base])


# --- the property: any doors, any keys, any names ----------------------------------

_STATUSES = {"session_not_found": 404, "turn_in_progress": 409}


async def _over_websocket(base: str, key: str, name: str, text: str) -> int:
    """The AI SDK's WebSocket door (``send``): its answer as the HTTP door's status."""
    url = base.replace("http://", "ws://") + f"/ai-sdk/ws?key={key}"
    body = DOORS["aisdk"][1](name, text)
    frame = {"type": "send", "requestId": "r", "headers": {}, "body": {}, "metadata": None}
    async with open_websocket_url(url) as ws:
        await ws.send_message(json.dumps(frame | body))
        first = json.loads(await ws.get_message())
    if first["type"] == "start":
        return 200
    assert first["type"] == "error", first
    return _STATUSES[first["errorText"].split(":", 1)[0]]


_requests = st.lists(
    st.tuples(
        st.sampled_from([*sorted(DOORS), "aisdk-ws"]), st.sampled_from(KEYS), st.sampled_from("xyz")
    ),
    min_size=1,
    max_size=8,
)


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(batches=st.lists(_requests, min_size=1, max_size=3))
def test_a_name_is_made_once_and_stays_its_first_makers(
    tmp_path_factory: pytest.TempPathFactory, batches: list[list[tuple[str, str, str]]]
) -> None:
    """Batches of requests sent at once; after each, every name has one owner for good."""
    trio.run(_property, tmp_path_factory.mktemp("named"), batches)


async def _property(tmp_path: Path, batches: list[list[tuple[str, str, str]]]) -> None:
    owner: dict[str, str] = {}
    async with serving(tmp_path) as (gw, _):
        for batch in batches:
            answers: list[tuple[str, str, int]] = []

            async def send(door: str, key: str, name: str, answers: list[Any] = answers) -> None:
                if door == "aisdk-ws":
                    status = await _over_websocket(gw.base, key, name, f"{key} on {door}")
                    answers.append((key, name, status))
                    return
                path, body = DOORS[door]
                async with gw.http.stream(
                    "POST", path, json=body(name, f"{key} on {door}"),
                    headers={"Authorization": f"Bearer {key}"},
                ) as r:  # fmt: skip
                    answers.append((key, name, r.status_code))

            async with trio.open_nursery() as nursery:
                for door, key, name in batch:
                    nursery.start_soon(send, door, key, name)
            for key, name, status in answers:
                # 409: that key's turn on its own session still runs (one turn at a time)
                assert status in (200, 404, 409), (key, name, status)
                if status in (200, 409):
                    assert owner.setdefault(name, key) == key, f"{name} changed hands"
                elif name not in owner:
                    owner[name] = next(k for k in KEYS if k != key)  # the other made it
            for name, key in owner.items():
                for asker in KEYS:
                    r = await gw.http.get(
                        f"/sessions/{name}", headers={"Authorization": f"Bearer {asker}"}
                    )
                    assert r.status_code == (200 if asker == key else 404), (name, asker)


# --- the store's half ----------------------------------------------------------------


def _record(sid: str, owner: str) -> Any:
    from gateway.store import SessionRecord

    return SessionRecord(id=sid, created_at=1, workspace_path="w", active_model="scripted:echo",
                         metadata={}, parent_session_id=None, routing_policy_version="v1",
                         owner=owner)  # fmt: skip


@asynccontextmanager
async def _stores(tmp_path: Path, redis: RedisServer | None) -> AsyncIterator[list[Any]]:
    """Two nodes' stores on one Redis, or one SQLite store."""
    from gateway.store import SqliteStore
    from gateway.store.redis.store import RedisStore

    stores: list[Any]
    if redis is None:
        stores = [SqliteStore(str(tmp_path / "gateway.db"))]
    else:
        prefix = redis.new_prefix()
        stores = [RedisStore(redis.url, prefix=prefix) for _ in range(2)]
        for i, store in enumerate(stores):
            store.leases(f"n{i}", 10_000)
    async with trio.open_nursery() as nursery:
        for store in stores:
            await store.open()
            await nursery.start(store.run)
        try:
            yield stores
        finally:
            for store in stores:
                await store.aclose()


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("redis", marks=pytest.mark.slow)])
async def test_insert_session_takes_a_free_id_only(
    tmp_path: Path, backend: str, request: pytest.FixtureRequest
) -> None:
    redis = request.getfixturevalue("redis_server") if backend == "redis" else None
    async with _stores(tmp_path, redis) as stores:
        first, last = stores[0], stores[-1]
        assert await first.insert_session(_record("x", "A")) is None
        taken = await last.insert_session(_record("x", "B"))
        assert taken is not None and taken.owner == "A"
        # Many at once, on every store: exactly one inserts.
        found: list[Any] = []

        async def insert(store: Any, owner: str) -> None:
            found.append(await store.insert_session(_record("y", owner)))

        async with trio.open_nursery() as nursery:
            for i in range(20):
                nursery.start_soon(insert, stores[i % len(stores)], f"K{i}")
        assert sum(1 for f in found if f is None) == 1
        (winner,) = {f.owner for f in found if f is not None}
        assert (await first.get_session("y")).owner == winner
        # No upsert changes an owner: another owner's write leaves the record as it was.
        last.put_session(_record("x", "B"))
        await last.flush()
        stored = await first.get_session("x")
        assert stored is not None and stored.owner == "A"
        # Its own owner's upsert lands.
        first.put_session(_updated("x", "A"))
        await first.flush()
        assert (await last.get_session("x")).turn_count == 3


def _updated(sid: str, owner: str) -> Any:
    import msgspec

    return msgspec.structs.replace(_record(sid, owner), turn_count=3)


async def test_a_refused_name_leaves_no_request_waiting(tmp_path: Path) -> None:
    """The loser of a race on one node answers at once (404), not after the winner's turn."""
    async with serving(tmp_path) as (gw, port):
        with trio.fail_after(10):
            results = await race(5, ("agui", port), ("agui", port))
        await check_one_owner(results, [gw.base])


async def test_an_unknown_name_of_another_key_is_made_for_the_asker(tmp_path: Path) -> None:
    """A name nobody has is the asker's; the other key then gets 404, on either door."""
    async with serving(tmp_path) as (gw, _):
        a, b = ({"Authorization": f"Bearer {k}"} for k in KEYS)
        path, body = DOORS["aisdk"]
        async with gw.http.stream("POST", path, json=body("mine", "hi"), headers=a) as r:
            assert r.status_code == 200
        for door, (path, body) in DOORS.items():
            async with gw.http.stream("POST", path, json=body("mine", "hi"), headers=b) as r:
                assert r.status_code == 404, door
                await r.aread()
                assert r.json()["error"]["code"] == "session_not_found"
        assert (await gw.http.get("/sessions/mine", headers=a)).status_code == 200

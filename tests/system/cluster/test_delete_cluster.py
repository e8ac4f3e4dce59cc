"""``DELETE /sessions/{id}`` on two nodes of one Redis (docs/protocol.md §13).

Sent to the node that does not run the session: carried to the owner (the
``DeleteSession`` operation), which cancels the turn; the clients of both
nodes see ``turn.cancelled`` then a 1000 ``session_deleted`` close, and
nothing of the session is left under the prefix, its lease included.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio
from trio_websocket import ConnectionClosed

from tests.redis_support import RedisServer, own_redis
from tests.scripts import DELEGATE, SLOW_TEXT
from tests.system.cluster.test_replica import two_nodes
from tests.system.store.test_redis_store import command

pytestmark = pytest.mark.slow  # redis-server

__all__ = ["own_redis"]  # fixture


def keys_of(server: RedisServer, sid: str) -> list[str]:
    """Every key, and every member of an index, that names ``sid``."""
    found = []
    for raw in command(server.port, "KEYS", "*"):
        key = raw.decode()
        if sid in key:
            found.append(key)
            continue
        kind = command(server.port, "TYPE", key)
        kind = kind.decode() if isinstance(kind, bytes) else str(kind)
        if kind == "zset":
            members = command(server.port, "ZRANGE", key, "0", "-1")
        elif kind == "set":
            members = command(server.port, "SMEMBERS", key)
        else:
            continue
        found += [f"{key} {m!r}" for m in members if sid.encode() in m]
    return found


async def test_a_delete_sent_to_the_replica_deletes_on_the_owner(
    tmp_path: Path, own_redis: RedisServer
) -> None:
    with trio.fail_after(60):
        async with two_nodes(tmp_path, own_redis, **{"tools.enabled": ["delegate"]}) as (a, b):
            sid = await a.create_session()
            assert a.node.runs_here(sid)
            async with a.client(sid) as on_a:
                await on_a.subscribe()
                await a.submit(sid, DELEGATE)  # a worker, deleted with its parent
                await on_a.until(lambda e: e.type == "turn.completed" and e.session_id == sid)
            workers = [w.id for w in a.node.sessions[sid].workers]
            assert len(workers) == 1 and keys_of(own_redis, workers[0])
            assert keys_of(own_redis, sid)
            async with a.client(sid) as on_a, b.client(sid) as on_b:
                await on_a.subscribe()
                await on_b.subscribe()
                turn_id = await b.submit(sid, SLOW_TEXT)
                await on_b.until(lambda e: e.type == "text.delta")
                r = await b.http.delete(f"/sessions/{sid}")
                assert r.status_code == 204, r.text
                for client in (on_a, on_b):
                    with pytest.raises(ConnectionClosed) as closed:
                        while True:
                            await client.recv()
                    assert closed.value.reason.code == 1000
                    assert json.loads(closed.value.reason.reason or "{}")["code"] == (
                        "session_deleted"
                    )
                    last = client.events[-1]
                    assert (last.type, last.turn_id) == ("turn.cancelled", turn_id)
                    assert last.payload.reason == "session_deleted"
            for gone in (sid, *workers):
                assert keys_of(own_redis, gone) == [], gone
            for node in (a, b):
                r = await node.http.get(f"/sessions/{sid}")
                assert r.status_code == 404, r.text
                r = await node.http.delete(f"/sessions/{sid}")
                assert r.status_code == 404, r.text
                assert sid not in node.node.sessions


async def test_a_replicas_clients_close_on_the_owners_notice(
    tmp_path: Path, own_redis: RedisServer
) -> None:
    """DELETE on the owner: the other node's clients get the cancel, then the close."""
    with trio.fail_after(60):
        async with two_nodes(tmp_path, own_redis) as (a, b):
            sid = await a.create_session()
            async with b.client(sid) as on_b:
                await on_b.subscribe()
                turn_id = await a.submit(sid, SLOW_TEXT)
                await on_b.until(lambda e: e.type == "text.delta")
                assert (await a.http.delete(f"/sessions/{sid}")).status_code == 204
                with pytest.raises(ConnectionClosed) as closed:
                    while True:
                        await on_b.recv()
                assert closed.value.reason.code == 1000
                assert json.loads(closed.value.reason.reason or "{}")["code"] == "session_deleted"
                last = on_b.events[-1]
                assert (last.type, last.turn_id) == ("turn.cancelled", turn_id)
            assert sid not in b.node.sessions  # dropped as its clients were closed
            assert (await b.http.get(f"/sessions/{sid}")).status_code == 404
            assert keys_of(own_redis, sid) == []

"""A session's files on two nodes of one Redis (docs/protocol.md §2 "Files").

A key's quota holds across the nodes (a flood split between them lands
exactly what fits), a file posted through one node is served and used in a
turn through the other, and a ``DELETE`` through the node that does not run
the session takes the files with it: no key of them is left and the key's
bytes (``gw:fbytes``) are given back, so uploads fit again.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import trio

from tests.files_support import png
from tests.integration.doors.rest.test_http_api import assert_error
from tests.redis_support import RedisServer, own_redis
from tests.system.cluster.test_delete_cluster import keys_of
from tests.system.cluster.test_replica import two_nodes
from tests.webhook_support import redis_command

pytestmark = pytest.mark.slow  # redis-server

__all__ = ["own_redis"]  # fixture


def text_file(n: int) -> bytes:
    return (b"file %06d " % n) * (300 * 1024 // 12)  # 300 KiB: 3 fit in 1 MiB, not 4


async def upload(http: httpx.AsyncClient, sid: str, data: bytes, kind: str) -> httpx.Response:
    return await http.post(f"/sessions/{sid}/files", content=data, headers={"Content-Type": kind})


async def test_the_quota_holds_across_nodes_and_a_delete_gives_it_back(
    tmp_path: Path, own_redis: RedisServer
) -> None:
    with trio.fail_after(60):
        async with two_nodes(tmp_path, own_redis, **{"limits.max_file_mb_per_key": 1}) as (a, b):
            sid = await a.create_session()
            assert a.node.runs_here(sid)
            answers: list[httpx.Response] = []

            async def one(n: int) -> None:
                http = (a, b)[n % 2].http
                answers.append(await upload(http, sid, text_file(n), "text/plain"))

            async with trio.open_nursery() as nursery:
                for n in range(12):
                    nursery.start_soon(one, n)
            assert sorted(r.status_code for r in answers) == [201] * 3 + [429] * 9
            used = int(redis_command(own_redis.port, "HGET", "gw:fbytes", ""))
            assert used == 3 * len(text_file(0))

            over = await upload(b.http, sid, text_file(50), "text/plain")
            assert_error(over, 429, "quota_exceeded")
            landed = next(r for r in answers if r.status_code == 201).json()["file_id"]
            r = await b.http.get(f"/sessions/{sid}/files/{landed}")
            assert r.status_code == 200 and r.content.startswith(b"file ")
            blocks = [{"type": "text", "text": "read"}, {"type": "document", "file_id": landed}]
            r = await b.http.post(f"/sessions/{sid}/turns", json={"content": blocks})
            assert r.status_code == 202, r.text

            assert (await b.http.delete(f"/sessions/{sid}")).status_code == 204
            assert keys_of(own_redis, sid) == []
            assert int(redis_command(own_redis.port, "HGET", "gw:fbytes", "") or 0) == 0
            other = await b.create_session()
            assert (await upload(a.http, other, text_file(100), "text/plain")).status_code == 201
            assert (await upload(b.http, other, png(), "image/png")).status_code == 201

"""``Idempotency-Key`` on two nodes of one Redis (docs/protocol.md §13).

A key used on node A is replayed on node B (a session and a turn); another
request under it is 422 on B; two identical requests racing on both nodes
make one session. A node that dies holding a key (it can no longer settle
it: its answer is lost) holds it until the hold runs out, on Redis's clock;
the retry on the other node then finds what the dead node made and answers
it, or makes it under the id the key holds.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from tests.conftest import JSON_TYPE, Harness
from tests.redis_support import RedisServer, own_redis
from tests.system.cluster.test_replica import two_nodes
from tests.system.store.test_redis_store import command

pytestmark = pytest.mark.slow  # redis-server

__all__ = ["own_redis"]  # fixture

QUICK = json.dumps({"script": {"rounds": [[{"text": "done"}]]}})
SHORT_HOLD = {"store.commit_timeout_s": 1.0, "store.lease_s": 1.0}  # a hold of 3 s


async def post(node: Harness, path: str, body: Any, key: str) -> httpx.Response:
    headers = {**JSON_TYPE, "Idempotency-Key": key}
    return await node.http.post(path, content=json.dumps(body).encode(), headers=headers)


def stored_sessions(server: RedisServer) -> int:
    return int(command(server.port, "ZCARD", "gw:sessions"))


async def test_a_key_used_on_one_node_is_replayed_on_the_other(
    tmp_path: Path, own_redis: RedisServer
) -> None:
    with trio.fail_after(60):
        async with two_nodes(tmp_path, own_redis) as (a, b):
            first = await post(a, "/sessions", {"metadata": {"n": 1}}, "k")
            assert first.status_code == 201, first.text
            again = await post(b, "/sessions", {"metadata": {"n": 1}}, "k")
            assert (again.status_code, again.content) == (201, first.content)
            assert again.headers["idempotent-replayed"] == "true"
            other = await post(b, "/sessions", {"metadata": {"n": 2}}, "k")
            assert other.json()["error"]["code"] == "idempotency_key_reused"
            sid = first.json()["session_id"]
            path = f"/sessions/{sid}/turns"
            turn = await post(b, path, {"content": QUICK}, "t")  # runs on a, the owner
            assert turn.status_code == 202, turn.text
            with trio.fail_after(10):
                while a.node.sessions[sid].turn is not None:  # noqa: ASYNC110
                    await trio.sleep(0.02)
            replay = await post(a, path, {"content": QUICK}, "t")
            assert (replay.status_code, replay.content) == (202, turn.content)
            messages = (await a.http.get(f"{path[: -len('/turns')]}/messages")).json()
            users = [m for m in messages["messages"] if m["role"] == "user"]
            assert [m["turn_id"] for m in users] == [turn.json()["turn_id"]]
            assert stored_sessions(own_redis) == 1
            # Every record is under the prefix, and expires (24 h).
            keys = [k.decode() for k in command(own_redis.port, "KEYS", "gw:req:*")]
            assert len(keys) == 2
            ttl = int(command(own_redis.port, "PTTL", keys[0]))
            assert 23 * 3600 * 1000 < ttl <= 24 * 3600 * 1000


async def test_identical_requests_racing_on_both_nodes_make_one_session(
    tmp_path: Path, own_redis: RedisServer
) -> None:
    with trio.fail_after(60):
        async with two_nodes(tmp_path, own_redis) as (a, b):
            answers: list[httpx.Response] = []

            async def one(node: Harness) -> None:
                answers.append(await post(node, "/sessions", {}, "race"))

            async with trio.open_nursery() as nursery:
                for node in (a, b, a, b, a, b):
                    nursery.start_soon(one, node)
            made = {r.content for r in answers if r.status_code == 201}
            assert len(made) == 1, [r.text for r in answers]
            assert {r.status_code for r in answers} <= {201, 409}
            assert stored_sessions(own_redis) == 1


def die_before_settling(node: Harness) -> None:
    """The node can no longer record an answer nor let a key go: as if it died there."""

    async def dead(*args: Any) -> None:
        return None

    node.node.store.settle_request = dead  # type: ignore[method-assign]


async def test_a_node_that_died_after_making_the_session_is_found_by_the_retry(
    tmp_path: Path, own_redis: RedisServer
) -> None:
    with trio.fail_after(60):
        async with two_nodes(tmp_path, own_redis, **SHORT_HOLD) as (a, b):
            die_before_settling(a)
            lost = await post(a, "/sessions", {}, "lost")  # made; its answer never recorded
            assert lost.status_code == 201
            held = await post(b, "/sessions", {}, "lost")
            assert held.status_code == 409
            assert held.json()["error"]["code"] == "idempotency_key_in_use"
            await trio.sleep(3.2)  # the hold runs out
            found = await post(b, "/sessions", {}, "lost")
            assert (found.status_code, found.content) == (201, lost.content)
            assert found.headers["idempotent-replayed"] == "true"
            assert stored_sessions(own_redis) == 1


async def test_a_node_that_died_mid_request_lets_the_retry_make_it_under_the_same_id(
    tmp_path: Path, own_redis: RedisServer
) -> None:
    with trio.fail_after(60):
        async with two_nodes(tmp_path, own_redis, **SHORT_HOLD) as (a, b):
            die_before_settling(a)
            stuck = trio.Event()
            planned: list[str] = []

            async def hang(**how: Any) -> Any:
                planned.append(how["session_id"])
                stuck.set()
                await trio.sleep_forever()

            a.node.registry.create = hang  # type: ignore[method-assign]
            async with trio.open_nursery() as nursery:
                nursery.start_soon(post, a, "/sessions", {}, "mid")
                await stuck.wait()
                nursery.cancel_scope.cancel()  # the node is gone: its request never ends
            assert (await post(b, "/sessions", {}, "mid")).status_code == 409
            await trio.sleep(3.2)
            made = await post(b, "/sessions", {}, "mid")
            assert made.status_code == 201, made.text
            assert made.json()["session_id"] == planned[0]
            assert "idempotent-replayed" not in made.headers
            again = await post(a, "/sessions", {}, "mid")
            assert again.content == made.content
            assert stored_sessions(own_redis) == 1


def test_a_key_outlives_the_process_that_answered_it(tmp_path: Path) -> None:
    """Real processes: node A answers, is killed (``kill -9``), and B replays its answers."""
    from tests.cluster_support import running_cluster
    from tests.redis_support import ensure_redis_server

    body = json.dumps({"content": QUICK}).encode()
    with running_cluster(ensure_redis_server(), tmp_path, 2) as cluster:
        a, b = cluster.live
        with httpx.Client(timeout=10) as http:

            def send(node: Any, path: str, content: bytes, key: str) -> httpx.Response:
                headers = {**JSON_TYPE, "Idempotency-Key": key}
                return http.post(f"{node.base}{path}", content=content, headers=headers)

            first = send(a, "/sessions", b"{}", "s")
            assert first.status_code == 201, first.text
            sid = first.json()["session_id"]
            turn = send(a, f"/sessions/{sid}/turns", body, "t")
            assert turn.status_code == 202, turn.text
            a.kill()
            a.wait()
            again = send(b, "/sessions", b"{}", "s")
            assert (again.status_code, again.content) == (201, first.content)
            turn_again = send(b, f"/sessions/{sid}/turns", body, "t")
            assert (turn_again.status_code, turn_again.content) == (202, turn.content)
            assert turn_again.headers["idempotent-replayed"] == "true"

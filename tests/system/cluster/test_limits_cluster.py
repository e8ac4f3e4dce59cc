"""The per-key limits of two nodes on one Redis count for the deployment (docs/protocol.md §15).

Two real ``gateway serve`` processes on one redis-server (tests/cluster_support.py),
one cluster for the module, each test with an API key of its own (the limits
are per key, so the tests do not share counts):

- ``max_sessions_per_key``: creates racing on both nodes get exactly the
  limit between them; a ``DELETE`` on one node gives a slot back to the other;
- ``turns_per_minute_per_key``: turns sent to both nodes get exactly the
  limit, the next is 429 ``rate_limited`` with ``Retry-After`` on either;
- ``max_connections_per_key``: streams open on both nodes count together; a
  clean close gives the slot back at once (to the other node);
- a node killed (``kill -9``) holding a key's streams gives them back within
  ``lease_s`` (last: it leaves one node).
"""

from __future__ import annotations

import json
import time
import urllib.parse
from collections.abc import Iterator

import pytest
import trio
from trio_websocket import ConnectionRejected, wrap_client_stream

from gateway.tenancy import key_id
from tests.cluster_support import CONFIG, Cluster, Peer, peers, running_cluster
from tests.integration.doors.rest.test_http_api import rejected
from tests.redis_support import ensure_redis_server
from tests.system.store.test_redis_store import command

pytestmark = pytest.mark.slow  # redis-server and gateway serve processes

SESSIONS, TURNS, STREAMS = 3, 2, 2
LEASE_S = 2.0  # a dead node's streams are given back within this
KEYS = ("key-sessions", "key-turns", "key-streams", "key-killed")

LIMITS_CONFIG = CONFIG.replace("lease_s = {lease_s}", f"lease_s = {LEASE_S}") + (
    f"[auth]\napi_keys = {json.dumps(list(KEYS))}\n"
    f"[limits]\nmax_sessions_per_key = {SESSIONS}\n"
    f"turns_per_minute_per_key = {TURNS}\nmax_connections_per_key = {STREAMS}\n"
)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    workdir = tmp_path_factory.mktemp("limits")
    with running_cluster(ensure_redis_server(), workdir, 2, LIMITS_CONFIG) as c:
        yield c


def as_key(ps: list[Peer], key: str) -> list[Peer]:
    for p in ps:
        p.http.headers["authorization"] = f"Bearer {key}"
    return ps


async def attach_status(url: str) -> int:
    """Open a stream and close it at once: 101, or the status of the refusal."""
    parts = urllib.parse.urlsplit(url)
    assert parts.hostname and parts.port
    status = 101
    with trio.fail_after(10):
        stream = await trio.open_tcp_stream(parts.hostname, parts.port)
        try:
            async with trio.open_nursery() as nursery:
                ws = await wrap_client_stream(
                    nursery, stream, parts.netloc, f"{parts.path}?{parts.query}"
                )
                await ws.aclose()
        except* ConnectionRejected as refused:
            status = refused.exceptions[0].status_code  # type: ignore[attr-defined]
        finally:
            await stream.aclose()
    return status


async def until_attached(peer: Peer, sid: str, within_s: float) -> float:
    """Attach through ``peer`` until it is accepted; how long that took (real clock)."""
    start = time.monotonic()
    while True:
        status = await attach_status(await peer.ws_url(sid))
        if status == 101:
            return time.monotonic() - start
        assert status == 503, status
        assert time.monotonic() - start < within_s, f"still refused after {within_s} s"
        await trio.sleep(0.05)


async def test_racing_creates_on_both_nodes_get_exactly_the_limit(cluster: Cluster) -> None:
    with trio.fail_after(30):
        async with peers(cluster.ensure(2)) as ps:
            a, b = as_key(ps, KEYS[0])
            answers: list[int] = []
            created: list[str] = []

            async def create(peer: Peer) -> None:
                r = await peer.http.post("/sessions", json={})
                answers.append(r.status_code)
                if r.status_code == 201:
                    created.append(r.json()["session_id"])

            async with trio.open_nursery() as nursery:
                for peer in (a, b) * SESSIONS:
                    nursery.start_soon(create, peer)
            assert sorted(answers) == [201] * SESSIONS + [429] * SESSIONS
            # Each creation's reservation ended once its record was durable.
            assert command(cluster.redis.port, "EXISTS", f"gw:lim:s:{key_id(KEYS[0])}") == 0
            for peer in (a, b):
                r = await peer.http.post("/sessions", json={})
                assert (r.status_code, r.json()["error"]["code"]) == (429, "too_many_sessions")
            r = await b.http.delete(f"/sessions/{created[0]}")
            assert r.status_code == 204, r.text
            await a.create_session()  # the deleted one's slot, on the other node
            r = await b.http.post("/sessions", json={})
            assert r.status_code == 429


async def test_turns_per_minute_count_the_turns_of_both_nodes(cluster: Cluster) -> None:
    with trio.fail_after(30):
        async with peers(cluster.ensure(2)) as ps:
            a, b = as_key(ps, KEYS[1])
            sids = [await a.create_session(), await b.create_session(), await a.create_session()]
            await a.submit(sids[0], "one")
            await b.submit(sids[1], "two")
            for peer in (a, b):
                r = await peer.post_turn(sids[2], "three")
                assert r.status_code == 429, r.text
                assert r.json()["error"]["code"] == "rate_limited"
                retry_after = int(r.headers["retry-after"])
                assert 1 <= retry_after <= 60
                assert f"in {retry_after} s" in r.json()["error"]["message"]


async def test_streams_count_on_both_nodes_and_a_close_gives_one_back(cluster: Cluster) -> None:
    with trio.fail_after(30):
        async with peers(cluster.ensure(2)) as ps:
            a, b = as_key(ps, KEYS[2])
            sid = await a.create_session()
            async with a.watch(sid):
                async with b.watch(sid):
                    for peer in (a, b):
                        assert await rejected(await peer.ws_url(sid)) == (503, "over_capacity")
                # b's stream closed: its slot is back at once, for a.
                assert await until_attached(a, sid, within_s=1.0) < 1.0
            assert await until_attached(b, sid, within_s=1.0) < 1.0


async def test_a_killed_node_gives_its_streams_back_within_lease_s(cluster: Cluster) -> None:
    """Last: it leaves one node alive."""
    with trio.fail_after(30):
        async with peers(cluster.ensure(2)) as ps:
            a, b = as_key(ps, KEYS[3])
            sid = await a.create_session()  # a runs it: b's death leaves it alone
            async with b.watch(sid), b.watch(sid):
                assert await rejected(await a.ws_url(sid)) == (503, "over_capacity")
                b.node.kill()
                # Its count lives until its last refresh (at most lease_s / 3 ago) expires.
                assert await rejected(await a.ws_url(sid)) == (503, "over_capacity")
                waited = await until_attached(a, sid, within_s=LEASE_S + 1.5)
                assert waited <= LEASE_S + 0.5

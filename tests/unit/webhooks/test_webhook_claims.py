"""Which node delivers a webhook lane on Redis (docs/doors/webhooks.md, docs/scale-out.md).

Delivery loops of several "nodes" (each its own store on one redis-server,
one key prefix per test) in one process, their POSTs answered by an
in-process transport: a lane is delivered by one node at a time, a lapsed
claim (a dead node's) is taken over, and a node that lost a claim stops the
lane. Slow: a real redis-server (tests/redis_support.py), real lease times.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import httpx
import pytest
import trio

from gateway.config import WebhookConfig
from gateway.metrics import Metrics
from gateway.store.base import StoredEvent
from gateway.store.redis.store import RedisStore
from gateway.webhooks.delivery import Deliveries
from tests.redis_support import RedisServer, redis_server
from tests.webhook_support import SECRET

__all__ = ["redis_server"]

pytestmark = pytest.mark.slow  # a real redis-server, real lease times

HOOK = WebhookConfig(
    url="http://receiver.test/hooks",
    events=("turn.completed",),
    secret=SECRET,
    timeout_s=30,
    retry_first_s=0.05,
    retry_max_s=0.1,
)

Handler = Callable[[httpx.Request], Awaitable[httpx.Response]]


def event(seq: int, sid: str) -> StoredEvent:
    data = json.dumps({"id": f"evt_{seq}", "session_id": sid}).encode()
    return StoredEvent(seq=seq, session_id=sid, type="turn.completed", ts=1, data=data)


class Posts:
    """What the receiver got: (node, session, seq) in arrival order."""

    def __init__(self) -> None:
        self.got: list[tuple[str, str, int]] = []
        self.changed = trio.Event()

    def handler(self, node: str) -> Handler:
        async def handle(request: httpx.Request) -> httpx.Response:
            body = json.loads(request.content)
            self.got.append((node, body["session_id"], int(body["id"][4:])))
            self.changed.set()
            self.changed = trio.Event()
            return httpx.Response(200)

        return handle

    async def wait(self, count: int) -> None:
        with trio.fail_after(20):
            while len(self.got) < count:
                await self.changed.wait()


@asynccontextmanager
async def node(
    server: RedisServer, prefix: str, name: str, handler: Handler, lease_s: float = 1.0
) -> AsyncIterator[RedisStore]:
    """A store of node ``name`` and its delivery loop, running."""
    store = RedisStore(server.url, prefix=prefix)
    await store.open()
    store.leases(name, 60_000)  # the node its writes are for
    loop = Deliveries(
        store,
        {"crm": HOOK},
        Metrics(),
        node_id=name,
        lease_s=lease_s,
        transport=httpx.MockTransport(handler),
    )
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(loop.run)
            yield store
            nursery.cancel_scope.cancel()
    finally:
        await store.aclose()


async def test_two_nodes_deliver_every_lane_once_in_order(redis_server: RedisServer) -> None:
    prefix = redis_server.new_prefix()
    posts = Posts()
    async with (
        node(redis_server, prefix, "node_a", posts.handler("node_a")) as a,
        node(redis_server, prefix, "node_b", posts.handler("node_b")) as b,
    ):
        seq = 0
        for round_ in range(5):  # the sessions move from one node to the other
            owner = a if round_ % 2 else b
            for sid in ("sess_1", "sess_2", "sess_3", "sess_4"):
                seq += 1
                owner.put_event(event(seq, sid))
            await owner.flush()
        await posts.wait(20)
        with trio.fail_after(10):
            while True:
                if not await a.outbox_depth():
                    break
                await trio.sleep(0.02)
    assert len(posts.got) == 20  # each once: one node at a time per lane
    for sid in ("sess_1", "sess_2", "sess_3", "sess_4"):
        seqs = [s for _, session, s in posts.got if session == sid]
        assert seqs == sorted(seqs) and len(seqs) == 5


async def test_a_lane_a_dead_node_claimed_is_taken_over_once_the_claim_lapses(
    redis_server: RedisServer,
) -> None:
    prefix = redis_server.new_prefix()
    posts = Posts()
    writer = RedisStore(redis_server.url, prefix=prefix)
    await writer.open()
    writer.webhook_routes = {"turn.completed": ("crm",)}
    writer.put_event(event(1, "sess_1"))
    writer.put_event(event(2, "sess_1"))
    await writer.flush()
    # A node that died while delivering the lane: its claim lapses after 600 ms.
    assert await writer.outbox_claim([("crm", "sess_1")], "node_dead", 600) == [("crm", "sess_1")]
    started = trio.current_time()
    async with node(redis_server, prefix, "node_b", posts.handler("node_b"), lease_s=0.4):
        await posts.wait(2)
        took = trio.current_time() - started
    await writer.aclose()
    assert [s for _, _, s in posts.got] == [1, 2]
    assert 0.4 < took < 0.6 + 0.4 / 2 + 1.0  # after the lapse, at a read of the outbox


async def test_a_node_that_lost_its_claim_stops_the_lane(redis_server: RedisServer) -> None:
    prefix = redis_server.new_prefix()
    posting = trio.Event()
    stopped = trio.Event()

    async def hang(request: httpx.Request) -> httpx.Response:
        posting.set()
        try:
            await trio.sleep_forever()
        finally:
            stopped.set()  # the attempt was cancelled: the lane stopped

    async with node(redis_server, prefix, "node_a", hang, lease_s=0.3) as a:
        a.put_event(event(1, "sess_1"))
        await a.flush()
        with trio.fail_after(10):
            await posting.wait()
        claim = f"{prefix}obclaim:crm:{{sess_1}}"
        await a._redis().set(claim, "node_other", px=10_000)  # another node holds it now
        with trio.fail_after(2):  # found at the next renewal, a third of the lease time
            await stopped.wait()
        assert await a.outbox_depth() == 1  # still owed, to be sent by node_other

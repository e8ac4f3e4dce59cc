"""Webhooks (docs/doors/webhooks.md): chosen catalog events POSTed, signed, in order, at least once.

A receiver on loopback (tests.webhook_support) verifies every accepted
delivery's Standard Webhooks signature with the ``standardwebhooks`` package.
Every test runs on both stores: SQLite, and Redis (a redis-server of the
test's own, tests/redis_support.py: slow).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from gateway.config import Config
from gateway.errors import StoreError
from gateway.store import open_store
from gateway.store.base import StoredEvent
from tests.conftest import Harness, running_gateway
from tests.redis_support import RedisServer, own_redis
from tests.webhook_support import Receiver, config_with_webhooks, webhook_toml

__all__ = ["own_redis"]  # the fixture, used through ``backend``

Store = dict[str, Any]  # the [store] keys of a test's backend


@pytest.fixture(params=["sqlite", pytest.param("redis", marks=pytest.mark.slow)])
def backend(request: pytest.FixtureRequest) -> Store:
    if request.param == "sqlite":
        return {}
    server: RedisServer = request.getfixturevalue("own_redis")
    return {"store.backend": "redis", "store.url": server.url}


@asynccontextmanager
async def receiving(
    tmp_path: Path, backend: Store, receiver: Receiver, events: list[str], **keys: Any
) -> AsyncIterator[Harness]:
    """A receiver and a gateway sending it ``events`` as webhook ``crm``."""
    async with trio.open_nursery() as nursery:
        await nursery.start(receiver.serve)
        tables = webhook_toml("crm", receiver.url, events, **keys)
        async with running_gateway(config_with_webhooks(tmp_path, tables, **backend)) as gw:
            yield gw
        nursery.cancel_scope.cancel()


async def turns(gw: Harness, sid: str, count: int) -> None:
    """``count`` echo turns, one after the other."""
    async with gw.client(sid) as client:
        await client.subscribe()
        for i in range(count):
            await gw.submit(sid, f"hello {i}")
            await client.until_turn_ends()


async def outbox_empty(gw: Harness) -> None:
    with trio.fail_after(10):
        while True:
            if not await gw.node.store.outbox_depth():
                return
            await trio.sleep(0.02)


async def depth_once_reachable(gw: Harness) -> int:
    """The outbox's depth, read once the store answers again (its client reconnects)."""
    with trio.fail_after(10):
        while True:
            try:
                return await gw.node.store.outbox_depth()
            except StoreError:
                await trio.sleep(0.05)


def sample(gw: Harness, family: str, **labels: str) -> float:
    value = gw.node.metrics.registry.get_sample_value(family, labels)
    return value or 0.0


async def test_chosen_events_arrive_signed_in_order_as_their_wire_json(
    tmp_path: Path, backend: Store
) -> None:
    receiver = Receiver()
    with trio.fail_after(60):
        async with receiving(tmp_path, backend, receiver, ["turn.started", "turn.completed"]) as gw:
            sid = await gw.create_session()
            await turns(gw, sid, 3)
            got = await receiver.wait_accepted(6)
            await outbox_empty(gw)
            stored = await gw.node.store.events_after([sid], 0, 1000)
            assert sample(gw, "gateway_webhook_deliveries_total", webhook="crm") == 6
            assert sample(gw, "gateway_webhook_failures_total", webhook="crm") == 0
    assert [r.event["type"] for r in got] == ["turn.started", "turn.completed"] * 3
    # the body is the event exactly as the wire's (and the store's) JSON
    wanted = [e.data for e in stored if e.type in ("turn.started", "turn.completed")]
    assert [r.body for r in got] == wanted
    assert all(r.headers["webhook-id"] == r.event["id"] for r in got)
    ids = [r.event["id"] for r in got]
    assert ids == sorted(ids) and len(set(ids)) == 6
    assert all(r.event["session_id"] == sid for r in got)
    assert len(receiver.received) == 6  # nothing else was sent, nothing twice


async def test_a_timeout_and_a_500_are_retried_then_delivered_once_in_order(
    tmp_path: Path, backend: Store
) -> None:
    receiver = Receiver(script=["hang", 500])
    with trio.fail_after(60):
        async with receiving(tmp_path, backend, receiver, ["turn.completed"], timeout_s=0.5) as gw:
            sid = await gw.create_session()
            await turns(gw, sid, 2)
            got = await receiver.wait_accepted(2)
            await outbox_empty(gw)
            assert sample(gw, "gateway_webhook_failures_total", webhook="crm") == 2
            assert sample(gw, "gateway_webhook_deliveries_total", webhook="crm") == 2
    first, second = (r.event["id"] for r in got)
    assert first < second  # the second turn's waited for the first's
    statuses = [(r.event["id"], r.status) for r in receiver.received]
    assert statuses == [(first, "hang"), (first, 500), (first, 200), (second, 200)]
    # each attempt is signed again: the same id, its own timestamp and signature
    assert len({r.headers["webhook-id"] for r in receiver.received[:3]}) == 1


async def test_an_endless_answer_is_accepted_at_once_and_its_connection_closed(
    tmp_path: Path, backend: Store
) -> None:
    """200 and a body that never ends: the delivery is made, the body not read, the socket shut."""
    receiver = Receiver(script=["endless"])
    with trio.fail_after(60):
        async with receiving(tmp_path, backend, receiver, ["turn.completed"], timeout_s=5) as gw:
            sid = await gw.create_session()
            await turns(gw, sid, 2)
            with trio.fail_after(2):  # not timeout_s: the status is the answer
                await receiver.endless_cut.wait()
                await receiver.wait_accepted(1)
                await outbox_empty(gw)
            assert sample(gw, "gateway_webhook_failures_total", webhook="crm") == 0
            assert sample(gw, "gateway_webhook_deliveries_total", webhook="crm") == 2
    assert [r.status for r in receiver.received] == ["endless", 200]
    # What the kernel's socket buffers took before the close, no more: nothing was read.
    assert receiver.endless_sent < 32 * 1024 * 1024


async def test_after_max_attempts_a_delivery_is_dropped_and_logged(
    tmp_path: Path, backend: Store, caplog: pytest.LogCaptureFixture
) -> None:
    receiver = Receiver(script=[500, 503, 500])
    caplog.set_level(logging.INFO, logger="gateway.webhooks")
    with trio.fail_after(60):
        async with receiving(tmp_path, backend, receiver, ["turn.completed"], max_attempts=3) as gw:
            sid = await gw.create_session()
            await turns(gw, sid, 2)
            got = await receiver.wait_accepted(1)
            await outbox_empty(gw)
            assert sample(gw, "gateway_webhook_dropped_total", webhook="crm") == 1
    dropped = [r for r in caplog.records if getattr(r, "event", None) == "webhook_dropped"]
    assert len(dropped) == 1
    fields = dropped[0].fields  # type: ignore[attr-defined]
    assert fields["webhook"] == "crm" and fields["attempts"] == 3
    assert fields["error"] == "HTTP 500" and fields["session_id"] == sid
    # the dropped one was the first turn's; the second turn's came after it
    assert [r.status for r in receiver.received] == [500, 503, 500, 200]
    assert got[0].event["id"] > fields["event_id"]


async def test_a_failing_receiver_holds_up_only_its_own_webhook(
    tmp_path: Path, backend: Store
) -> None:
    down, up = Receiver(script=[500] * 1000), Receiver()
    async with trio.open_nursery() as nursery:
        await nursery.start(down.serve)
        await nursery.start(up.serve)
        tables = webhook_toml("down", down.url, ["turn.completed"])
        tables += webhook_toml("up", up.url, ["turn.completed"])
        config: Config = config_with_webhooks(tmp_path, tables, **backend)
        with trio.fail_after(60):
            async with running_gateway(config) as gw:
                sid = await gw.create_session()
                await turns(gw, sid, 2)
                await up.wait_accepted(2)
                await down.wait_received(1)  # its lane runs beside up's: maybe not tried yet
                assert not down.accepted
                assert await gw.node.store.outbox_depth() >= 1  # down's still owed
        nursery.cancel_scope.cancel()


async def test_deliveries_of_a_webhook_gone_from_the_config_are_dropped_and_logged(
    tmp_path: Path, backend: Store, caplog: pytest.LogCaptureFixture
) -> None:
    """A restart with ``[webhooks.old]`` removed: what was owed to it is dropped, once."""
    store = open_store(config_with_webhooks(tmp_path, "", **backend).store)
    await store.open()
    store.webhook_routes = {"turn.completed": ("old",)}
    store.put_event(
        StoredEvent(seq=7, session_id="sess_x", type="turn.completed", ts=1, data=b"{}")
    )
    await store.aclose()
    caplog.set_level(logging.INFO, logger="gateway.webhooks")
    receiver = Receiver()
    with trio.fail_after(30):
        async with receiving(tmp_path, backend, receiver, ["turn.completed"]) as gw:
            await outbox_empty(gw)
            assert sample(gw, "gateway_webhook_dropped_total", webhook="old") == 1
    dropped = [r for r in caplog.records if getattr(r, "event", None) == "webhook_dropped"]
    assert [r.fields["webhook"] for r in dropped] == ["old"]  # type: ignore[attr-defined]
    assert receiver.received == []


async def test_a_receiver_that_answers_after_a_restart_gets_what_was_owed(
    tmp_path: Path, backend: Store
) -> None:
    """The receiver fails until the gateway stopped; the next gateway on the store delivers."""
    receiver = Receiver(script=[500] * 1000)
    keys = {"max_attempts": 1000}
    with trio.fail_after(60):
        async with receiving(tmp_path, backend, receiver, ["turn.completed"], **keys) as gw:
            sid = await gw.create_session()
            await turns(gw, sid, 2)
            await receiver.wait_received(3)
            assert await gw.node.store.outbox_depth() == 2
        receiver.script.clear()  # the receiver is back, the gateway is not
        receiver.received.clear()
        async with receiving(tmp_path, backend, receiver, ["turn.completed"], **keys) as gw:
            got = await receiver.wait_accepted(2)
            await outbox_empty(gw)
    ids = [r.event["id"] for r in got]
    assert ids == sorted(ids) and len(set(ids)) == 2  # in order, each once
    assert [r.headers["webhook-id"] for r in got] == ids


@pytest.mark.slow
async def test_on_redis_the_outbox_survives_a_crash_of_redis(
    tmp_path: Path, own_redis: RedisServer
) -> None:
    """Redis killed (kill -9) and started again on its AOF while deliveries are owed."""
    receiver = Receiver(script=[500] * 1000)
    backend = {"store.backend": "redis", "store.url": own_redis.url}
    with trio.fail_after(60):
        async with receiving(
            tmp_path, backend, receiver, ["turn.completed"], max_attempts=1000
        ) as gw:
            sid = await gw.create_session()
            await turns(gw, sid, 2)
            await receiver.wait_received(2)
            own_redis.wait_aof_written()
            own_redis.kill()
            own_redis.start()  # same port, same directory: what the AOF kept
            assert await depth_once_reachable(gw) == 2  # both still owed, in Redis
            receiver.script.clear()
            got = await receiver.wait_accepted(2)
            await outbox_empty(gw)
    ids = [r.event["id"] for r in got]
    assert ids == sorted(ids) and len(set(ids)) == 2
    assert all(r.event["session_id"] == sid for r in got)

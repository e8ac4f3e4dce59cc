"""Webhooks in small (docs/doors/webhooks.md): signatures, the config, the outbox in the store.

The outbox tests run on both stores (SQLite, and Redis on the run's
redis-server with a key prefix of each test's own: slow).
"""

from __future__ import annotations

import base64
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from standardwebhooks.exceptions import WebhookVerificationError
from standardwebhooks.webhooks import Webhook

from gateway.config import WebhookConfig, load_config
from gateway.errors import ConfigError
from gateway.metrics import Metrics
from gateway.store.base import Store, StoredEvent
from gateway.store.redis.store import RedisStore
from gateway.store.sqlite.store import SqliteStore
from gateway.webhooks import signing
from gateway.webhooks.delivery import ANSWER_BYTES, MAX_POSTS, Deliveries, read_if_small, routes
from tests.redis_support import RedisServer, redis_server

__all__ = ["redis_server"]  # the fixture, used through ``new_store``

SECRET = "whsec_" + base64.b64encode(b"sixteen byte key, and more").decode()


def test_a_signature_verifies_as_standard_webhooks_says() -> None:
    body = b'{"id":"evt_00000000000000000042","type":"turn.completed"}'
    now = int(time.time())
    headers = signing.headers(signing.secret_key(SECRET), "evt_00000000000000000042", now, body)
    assert headers["webhook-id"] == "evt_00000000000000000042"
    assert headers["webhook-timestamp"] == str(now)
    hook = Webhook(SECRET)
    assert hook.verify(body, headers) == {
        "id": "evt_00000000000000000042",
        "type": "turn.completed",
    }
    with pytest.raises(WebhookVerificationError, match="signature"):
        hook.verify(body + b" ", headers)
    with pytest.raises(WebhookVerificationError, match="signature"):
        Webhook("whsec_" + base64.b64encode(b"another key").decode()).verify(body, headers)


def test_an_unpadded_secret_is_the_same_key_as_the_library_reads() -> None:
    unpadded = "whsec_" + base64.b64encode(b"0123456789a").decode().rstrip("=")
    body, now = b"{}", int(time.time())
    headers = signing.headers(signing.secret_key(unpadded), "evt_1", now, body)
    assert Webhook(unpadded).verify(body, headers) == {}


Write = Callable[[str], str]


@pytest.fixture
def write(tmp_path: Path) -> Write:
    def write(text: str) -> str:
        path = tmp_path / "gateway.toml"
        path.write_text(text)
        return str(path)

    return write


def table(**keys: str) -> str:
    base = {"url": '"https://crm.example.com/hook"', "events": '["turn.completed"]'}
    base["secret"] = f'"{SECRET}"'
    base.update(keys)
    return "[webhooks.crm]\n" + "".join(f"{k} = {v}\n" for k, v in base.items())


def error(path: str) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(path, {}, {})
    return str(info.value).split(": ", 2)[2]


def test_a_webhook_table_loads_with_its_defaults(write: Write) -> None:
    hook = load_config(write(table()), {}, {}).webhooks["crm"]
    assert hook.url == "https://crm.example.com/hook" and hook.events == ("turn.completed",)
    assert (hook.timeout_s, hook.max_attempts) == (10.0, 12)


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        (
            {"url": '"ftp://x"'},
            'webhooks.crm.url: expected an http:// or https:// URL, got "ftp://x"',
        ),
        (
            {"events": '["text.delta"]'},
            'webhooks.crm.events[0]: "text.delta" is not a catalog event type',
        ),
        (
            {"events": '["turn.done"]'},
            'webhooks.crm.events[0]: "turn.done" is not a catalog event type',
        ),
        ({"events": "[]"}, "webhooks.crm.events: name at least one catalog event type"),
        (
            {"secret": '"hunter2"'},
            "webhooks.crm.secret: expected a Standard Webhooks secret: whsec_ and base64, got",
        ),
        (
            {"secret": '"whsec_a"'},
            "webhooks.crm.secret: expected whsec_ and base64, got a bad base64",
        ),
        ({"max_attempts": "0"}, "webhooks.crm.max_attempts: expected an integer >= 1, got 0"),
        ({"colour": '"red"'}, "unknown key webhooks.crm.colour"),
    ],
)
def test_a_bad_webhook_is_one_clear_config_error(
    write: Write, keys: dict[str, str], message: str
) -> None:
    assert error(write(table(**keys))).startswith(message)


def test_a_webhook_without_a_url_names_the_key(write: Write) -> None:
    assert error(write('[webhooks.crm]\nevents = ["turn.completed"]\n')).endswith("missing key url")


def test_webhooks_on_redis_load(write: Write) -> None:
    text = '[store]\nbackend = "redis"\n' + table()
    assert load_config(write(text), {}, {}).webhooks["crm"].events == ("turn.completed",)


def test_routes_say_which_events_go_to_which_webhooks(write: Write) -> None:
    text = table(events='["turn.completed", "turn.started"]')
    text += table(events='["turn.completed"]').replace("webhooks.crm", "webhooks.ops")
    config = load_config(write(text), {}, {})
    assert routes(config.webhooks) == {"turn.completed": ("crm", "ops"), "turn.started": ("crm",)}


def event(seq: int, type_: str, sid: str = "sess_a") -> StoredEvent:
    return StoredEvent(seq=seq, session_id=sid, type=type_, ts=1000, data=b'{"seq":%d}' % seq)


NewStore = Callable[..., Store]


@pytest.fixture(params=["sqlite", pytest.param("redis", marks=pytest.mark.slow)])
def new_store(request: pytest.FixtureRequest, tmp_path: Path) -> NewStore:
    """A new store on this test's data each call (a restart of the same file or prefix)."""
    if request.param == "sqlite":
        return lambda **options: SqliteStore(str(tmp_path / "gateway.db"), inline=True, **options)
    server: RedisServer = request.getfixturevalue("redis_server")
    prefix = server.new_prefix()
    return lambda **options: RedisStore(server.url, prefix=prefix, **options)


async def opened(new_store: NewStore, **options: Any) -> Store:
    store = new_store(**options)
    await store.open()
    return store


async def test_an_event_a_webhook_wants_is_in_the_outbox_of_the_same_commit(
    new_store: NewStore,
) -> None:
    store = await opened(new_store)
    committed: list[int] = []
    store.webhook_routes = {"turn.completed": ("crm", "ops")}
    store.on_outbox = lambda: committed.append(store.committed)
    store.put_event(event(1, "turn.started"))
    store.put_event(event(2, "turn.completed"))
    await store.flush()
    assert committed == [store.committed]
    assert sorted(await store.outbox_lanes()) == [("crm", "sess_a"), ("ops", "sess_a")]
    entries = await store.outbox_lane(("crm", "sess_a"), 0, 10)
    assert [(e.hook, e.seq, e.session_id, e.data) for e in entries] == [
        ("crm", 2, "sess_a", b'{"seq":2}')
    ]
    assert await store.outbox_lane(("crm", "sess_a"), 2, 10) == []
    await store.outbox_delete([*entries, *entries])  # one already gone is no error
    assert await store.outbox_depth() == 1
    await store.delete_sessions(["sess_a"])  # a delivery owed outlives its session
    assert await store.outbox_lanes() == [("ops", "sess_a")]
    await store.aclose()
    again = await opened(new_store)
    assert [e.seq for e in await again.outbox_lane(("ops", "sess_a"), 0, 10)] == [2]
    await again.aclose()


async def test_a_lane_is_read_in_event_order_page_by_page(new_store: NewStore) -> None:
    store = await opened(new_store)
    store.webhook_routes = {"turn.completed": ("crm",)}
    for seq in (5, 3, 9, 4):  # the writer commits them as enqueued; the lane is by seq
        store.put_event(event(seq, "turn.completed"))
    store.put_event(event(7, "turn.completed", sid="sess_b"))
    await store.flush()
    lane = ("crm", "sess_a")
    assert [e.seq for e in await store.outbox_lane(lane, 0, 3)] == [3, 4, 5]
    assert [e.seq for e in await store.outbox_lane(lane, 5, 3)] == [9]
    assert await store.outbox_depth() == 5
    await store.outbox_delete(await store.outbox_lane(lane, 0, 10))
    assert await store.outbox_lanes() == [("crm", "sess_b")]  # an empty lane is no lane
    await store.aclose()


async def test_a_lane_is_claimed_by_one_node_at_a_time(new_store: NewStore) -> None:
    store = await opened(new_store)
    lanes = [("crm", "sess_a"), ("crm", "sess_b")]
    assert await store.outbox_claim(lanes, "node_1", 60_000) == lanes
    assert await store.outbox_claim(lanes, "node_1", 60_000) == lanes  # renewed
    if isinstance(store, SqliteStore):  # one node: every lane is its own
        assert await store.outbox_claim(lanes, "node_2", 60_000) == lanes
    else:
        assert await store.outbox_claim(lanes, "node_2", 60_000) == []
        await store.outbox_release(lanes[:1], "node_2")  # not its claim: nothing happens
        assert await store.outbox_claim(lanes, "node_2", 60_000) == []
        await store.outbox_release(lanes[:1], "node_1")
        assert await store.outbox_claim(lanes, "node_2", 60_000) == lanes[:1]
        assert await store.outbox_claim(lanes[1:], "node_1", 50) == lanes[1:]
        await trio.sleep(0.2)  # node_1 did not renew: its claim lapsed
        assert await store.outbox_claim(lanes[1:], "node_1", 60_000, renew=True) == []
        assert await store.outbox_claim(lanes[1:], "node_2", 60_000) == lanes[1:]
        assert await store.outbox_claim(lanes[1:], "node_2", 60_000, renew=True) == lanes[1:]
    await store.aclose()


@pytest.mark.slow
async def test_on_redis_a_fenced_event_puts_no_delivery(redis_server: RedisServer) -> None:
    """Another node holds the session's lease: neither the event nor its delivery lands."""
    prefix = redis_server.new_prefix()
    other = RedisStore(redis_server.url, prefix=prefix)
    await other.open()
    assert await other.leases("node_other", 60_000).acquire("sess_a") is not None
    store = RedisStore(redis_server.url, prefix=prefix)
    await store.open()
    store.leases("node_mine", 60_000)  # this store writes for node_mine
    store.webhook_routes = {"turn.completed": ("crm",)}
    store.put_event(event(2, "turn.completed"))
    store.put_event(event(3, "turn.completed", sid="sess_b"))  # nobody holds it: lands
    await store.flush()
    assert await store.events_after(["sess_a"], 0, 10) == []
    assert await store.outbox_lanes() == [("crm", "sess_b")]
    await store.aclose()
    await other.aclose()


class HugeBody(httpx.AsyncByteStream):
    """A receiver's answer of 256 MiB, 64 KiB a chunk; counts what was taken of it."""

    def __init__(self) -> None:
        self.taken = 0
        self.closed = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while self.taken < 256 * 1024 * 1024:
            await trio.lowlevel.checkpoint()
            self.taken += 65536
            yield b"x" * 65536

    async def aclose(self) -> None:
        self.closed = True


@pytest.mark.parametrize("status", [200, 500])
@pytest.mark.parametrize("length", [None, str(256 * 1024 * 1024)])
async def test_a_receivers_huge_answer_is_never_read(
    tmp_path: Path, status: int, length: str | None
) -> None:
    """A 256 MiB answer, chunked or of that length: its status counts, its body is not read."""
    bodies: list[HugeBody] = []

    async def receiver(request: httpx.Request) -> httpx.Response:
        bodies.append(HugeBody())
        headers = {} if length is None else {"content-length": length}
        answer = status if len(bodies) == 1 else 200
        return httpx.Response(answer, headers=headers, stream=bodies[-1])

    await deliver_one(tmp_path, receiver)
    assert len(bodies) == 1 + (status != 200)  # a 500 is still a failure, retried; a 200 is not
    for body in bodies:  # none of it read, and the answer closed
        assert body.taken == 0 and body.closed


async def test_a_receivers_small_answer_is_read_to_its_end() -> None:
    """At most ANSWER_BYTES, said by its Content-Length: read, so the connection serves again."""
    for size, read in ((0, True), (ANSWER_BYTES, True), (ANSWER_BYTES + 1, False)):
        body = httpx.ByteStream(b"x" * size)  # not yet read, as from a transport
        answer = httpx.Response(200, headers={"content-length": str(size)}, stream=body)
        assert await read_if_small(answer, ANSWER_BYTES) is read
        assert answer.num_bytes_downloaded == (size if read else 0)
    assert await read_if_small(httpx.Response(204, stream=httpx.ByteStream(b"")), 10)


async def deliver_one(
    tmp_path: Path, receiver: Callable[[httpx.Request], Awaitable[httpx.Response]]
) -> None:
    """One delivery to ``receiver`` (an in-process transport) until it leaves the outbox."""
    store = SqliteStore(str(tmp_path / "gateway.db"), inline=True)
    await store.open()
    hook = WebhookConfig(
        url="http://receiver.test/hooks", events=("turn.completed",), secret=SECRET,
        timeout_s=30, retry_first_s=0.01, retry_max_s=0.01,
    )  # fmt: skip
    loop = Deliveries(
        store, {"crm": hook}, Metrics(), node_id="node_1", lease_s=30,
        transport=httpx.MockTransport(receiver),
    )  # fmt: skip
    store.put_event(event(1, "turn.completed"))
    await store.flush()
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(loop.run)
            while await store.outbox_depth():  # noqa: ASYNC110 (deleted once accepted)
                await trio.sleep(0.01)
            nursery.cancel_scope.cancel()
    await store.aclose()


async def test_a_hanging_receiver_on_many_lanes_never_holds_up_another_webhook(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """One webhook's receiver hangs on more sessions than there are POST slots: another
    webhook is still delivered at once (each has POST slots of its own), not after the
    hanging attempts' ``timeout_s``."""
    posted = trio.Event()

    async def receiver(request: httpx.Request) -> httpx.Response:
        if request.url.host == "slow.test":
            await trio.sleep_forever()  # until the attempt's timeout
        posted.set()
        return httpx.Response(204, stream=httpx.ByteStream(b""))

    store = SqliteStore(str(tmp_path / "gateway.db"), inline=True)
    await store.open()
    hooks = {
        "slow": WebhookConfig(url="http://slow.test/", events=("turn.started",), secret=SECRET),
        "crm": WebhookConfig(url="http://crm.test/", events=("turn.completed",), secret=SECRET),
    }
    loop = Deliveries(
        store, hooks, Metrics(), node_id="node_1", lease_s=30,
        transport=httpx.MockTransport(receiver),
    )  # fmt: skip
    for n in range(MAX_POSTS + 8):  # a lane each, every one hanging
        store.put_event(StoredEvent(n + 1, f"sess_{n}", "turn.started", 1000, b"{}"))
    await store.flush()
    async with trio.open_nursery() as nursery:
        await nursery.start(loop.run)
        await trio.sleep(1)  # the slow lanes have taken their slots (timeout_s: 10)
        store.put_event(StoredEvent(1000, "sess_w", "turn.completed", 1000, b"{}"))
        await store.flush()
        with trio.fail_after(5):
            await posted.wait()
        nursery.cancel_scope.cancel()
    await store.aclose()

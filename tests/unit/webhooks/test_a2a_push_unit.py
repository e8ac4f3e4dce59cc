"""A2A push notifications in the webhook loop (docs/doors/a2a.md "Push notifications"):
which client URLs are taken, and a notification whose URL the operator no longer allows
is dropped at its delivery, never POSTed."""

from __future__ import annotations

from pathlib import Path

import httpx
import msgspec
import trio
from standardwebhooks.webhooks import Webhook

from gateway.config import A2aConfig, WebhookConfig
from gateway.metrics import Metrics
from gateway.store.base import StoredEvent
from gateway.store.sqlite.store import SqliteStore
from gateway.webhooks.a2a_push import PushDelivery, url_problem
from gateway.webhooks.delivery import MAX_POSTS, Deliveries

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
PREFIX = "https://hooks.example.com/a2a/"


def test_only_urls_within_a_prefix_are_taken() -> None:
    assert url_problem(PREFIX + "t/1?x=1", [PREFIX]) is None
    assert url_problem(PREFIX, [PREFIX]) is None
    assert url_problem(PREFIX + "x", []) == "push notifications are not offered"
    for url in (
        "https://hooks.example.com/a2ax",
        "https://hooks.example.com.evil.net/a2a/x",
        "https://user@hooks.example.com/a2a/x",
        "http://hooks.example.com/a2a/x",
        PREFIX + "../admin",
        PREFIX + "x/%2E%2E/admin",
        PREFIX + "x/./y",
        PREFIX + "x\\y",
        PREFIX + "x#y",
        PREFIX + "\u00e9",
        PREFIX + "x\ny",
        PREFIX + "x" * 2048,
    ):
        assert url_problem(url, [PREFIX]) is not None, url


def test_a_prefix_without_a_trailing_slash_takes_its_path_segment_only() -> None:
    """A prefix's path ends at a segment's end: ``https://HOST/a2a`` is ``/a2a`` and what is
    under it, never ``/a2a-admin`` (the URL cannot leave the prefix's path)."""
    prefix = "https://hooks.example.com/a2a"
    for url in (prefix, prefix + "/t/1", prefix + "?t=1"):
        assert url_problem(url, [prefix]) is None, url
    for url in (prefix + "-admin/x", prefix + "x", prefix + ".evil", prefix + "%2Fx"):
        assert url_problem(url, [prefix]) is not None, url


def note(url: str, token: str = "tok") -> bytes:
    body = msgspec.Raw(b'{"statusUpdate":{}}')
    return msgspec.json.encode(PushDelivery(url, token, body))


async def test_a_notification_outside_todays_prefixes_is_dropped_not_posted(
    tmp_path: Path,
) -> None:
    posted: list[httpx.Request] = []

    async def receiver(request: httpx.Request) -> httpx.Response:
        posted.append(request)
        return httpx.Response(204, stream=httpx.ByteStream(b""))

    store = SqliteStore(str(tmp_path / "gateway.db"), inline=True)
    await store.open()
    loop = Deliveries(
        store, {}, Metrics(), node_id="node_1", lease_s=30,
        transport=httpx.MockTransport(receiver),
    )  # fmt: skip
    loop.offer_push(A2aConfig(push_url_prefixes=(PREFIX,), push_secret=SECRET))
    event = StoredEvent(1, "sess_a", "turn.started", 1000, b"{}")
    gone = "https://old.example.com/a2a/x"  # allowed when the config was made, not today
    store.put_event(event, [("a2a.c1", note(PREFIX + "t")), ("a2a.c2", note(gone))])
    await store.flush()
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(loop.run)
            while await store.outbox_depth():  # noqa: ASYNC110 (deleted once done)
                await trio.sleep(0.01)
            nursery.cancel_scope.cancel()
    await store.aclose()
    assert [str(r.url) for r in posted] == [PREFIX + "t"]
    request = posted[0]
    assert request.headers["x-a2a-notification-token"] == "tok"
    assert request.content == b'{"statusUpdate":{}}'
    Webhook(SECRET).verify(request.content, dict(request.headers))


async def test_push_receivers_that_hang_never_hold_up_a_webhook(tmp_path: Path) -> None:
    """More hanging A2A lanes than every POST slot together: the operator's webhook is
    still delivered at once (push notifications have slots of their own)."""
    webhook_posted = trio.Event()

    async def receiver(request: httpx.Request) -> httpx.Response:
        if request.url.host == "hooks.example.com":
            await trio.sleep_forever()  # until the attempt's timeout
        webhook_posted.set()
        return httpx.Response(204, stream=httpx.ByteStream(b""))

    store = SqliteStore(str(tmp_path / "gateway.db"), inline=True)
    await store.open()
    hook = WebhookConfig(url="http://crm.test/hooks", events=("turn.completed",), secret=SECRET)
    loop = Deliveries(
        store, {"crm": hook}, Metrics(), node_id="node_1", lease_s=30,
        transport=httpx.MockTransport(receiver),
    )  # fmt: skip
    loop.offer_push(A2aConfig(push_url_prefixes=(PREFIX,), push_secret=SECRET, push_timeout_s=30))
    for n in range(MAX_POSTS + 8):  # a lane each
        event = StoredEvent(n + 1, f"sess_{n}", "turn.started", 1000, b"{}")
        store.put_event(event, [("a2a.c", note(PREFIX + "slow"))])
    await store.flush()
    async with trio.open_nursery() as nursery:
        await nursery.start(loop.run)
        await trio.sleep(0.2)  # the push lanes have taken their slots
        store.put_event(StoredEvent(1000, "sess_w", "turn.completed", 1000, b"{}"))
        await store.flush()
        with trio.fail_after(5):
            await webhook_posted.wait()
        nursery.cancel_scope.cancel()
    await store.aclose()


async def test_push_notifications_are_counted_under_one_label_whatever_the_config_id(
    tmp_path: Path,
) -> None:
    """A push config's id is the client's (or random): the metrics' ``webhook`` label is
    ``a2a.push`` for every one, never ``a2a.{config id}`` (docs/operating.md: bounded labels)."""

    async def receiver(request: httpx.Request) -> httpx.Response:
        status = 204 if request.url.path.endswith("ok") else 500
        return httpx.Response(status, stream=httpx.ByteStream(b""))

    store = SqliteStore(str(tmp_path / "gateway.db"), inline=True)
    await store.open()
    metrics = Metrics()
    loop = Deliveries(
        store, {}, metrics, node_id="node_1", lease_s=30, transport=httpx.MockTransport(receiver)
    )
    loop.offer_push(A2aConfig(push_url_prefixes=(PREFIX,), push_secret=SECRET, push_max_attempts=1))
    for n, path in enumerate(("ok", "ok", "fails")):
        event = StoredEvent(n + 1, f"sess_{n}", "turn.started", 1000, b"{}")
        store.put_event(event, [(f"a2a.client_id_{n}", note(PREFIX + path))])
    await store.flush()
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(loop.run)
            while await store.outbox_depth():  # noqa: ASYNC110 (deleted once done)
                await trio.sleep(0.01)
            nursery.cancel_scope.cancel()
    await store.aclose()
    counters = (metrics.webhook_deliveries, metrics.webhook_failures, metrics.webhook_dropped)
    labels = {
        (sample.name, sample.labels["webhook"])
        for counter in counters
        for family in counter.collect()
        for sample in family.samples
        if sample.name.endswith("_total")
    }
    assert labels == {
        ("gateway_webhook_deliveries_total", "a2a.push"),
        ("gateway_webhook_failures_total", "a2a.push"),
        ("gateway_webhook_dropped_total", "a2a.push"),
    }

"""A2A push notifications on the webhook outbox (docs/doors/a2a.md "Push notifications").

A real receiver on 127.0.0.1 (tests/webhook_support.py: it verifies each
accepted POST's Standard Webhooks signature), a real gateway on each store
(Redis: slow), httpx as the client. What a task's config sends, in order,
retried, with its token; which URLs are refused; whose configs a key sees;
their bounds and their end. Two nodes: tests/system/cluster/test_a2a_push_cluster.py.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from gateway.config import load_config
from gateway.errors import ConfigError
from tests.conftest import TOOL_SCRIPT, Harness, make_config, running_gateway
from tests.integration.doors.a2a.test_a2a_rpc import (
    KEYS,
    A,
    B,
    call,
    code,
    message,
    reason,
    rpc,
    states,
    stream,
)
from tests.redis_support import RedisServer, own_redis
from tests.scripts import TEXT
from tests.webhook_support import SECRET, Receiver

__all__ = ["own_redis"]  # the fixture, used through ``backend``

CREATE = "CreateTaskPushNotificationConfig"


@asynccontextmanager
async def pushing(
    tmp_path: Path, receiver: Receiver, **overrides: Any
) -> AsyncIterator[tuple[Harness, str]]:
    """A gateway whose operator allows the receiver's ``/hooks/``; that prefix."""
    async with trio.open_nursery() as nursery:
        await nursery.start(receiver.serve)
        prefix = f"http://127.0.0.1:{receiver.port}/hooks/"
        settings = {
            "auth.api_keys": KEYS,
            "tools.require_approval": ["sleep"],
            "a2a.push_url_prefixes": [prefix],
            "a2a.push_secret": SECRET,
            "a2a.push_retry_first_s": 0.05,
            "a2a.push_retry_max_s": 0.2,
            "a2a.push_timeout_s": 2,
            **overrides,
        }
        with trio.fail_after(60):
            async with running_gateway(make_config(tmp_path, **settings)) as h:
                yield h, prefix
        nursery.cancel_scope.cancel()


async def waiting_task(h: Harness) -> str:
    """A task of key A waiting for its approval (``TASK_STATE_INPUT_REQUIRED``)."""
    asked = await stream(h, call("SendStreamingMessage", message(TOOL_SCRIPT)), A)
    assert states(asked)[-1] == "TASK_STATE_INPUT_REQUIRED"
    return str(asked[0][1]["result"]["task"]["id"])


def update(body: dict[str, Any]) -> str:
    if "statusUpdate" in body:
        return str(body["statusUpdate"]["status"]["state"])
    parts = body["artifactUpdate"]["artifact"]["parts"]
    return "text:" + "".join(p["text"] for p in parts)


@pytest.fixture(params=["sqlite", pytest.param("redis", marks=pytest.mark.slow)])
def backend(request: pytest.FixtureRequest) -> dict[str, Any]:
    """Each test on both stores (the Redis one: a redis-server of the test's own)."""
    if request.param == "sqlite":
        return {}
    server: RedisServer = request.getfixturevalue("own_redis")
    return {"store.backend": "redis", "store.url": server.url}


async def test_a_tasks_notifications_in_order_retried_signed_with_its_token(
    tmp_path: Path, backend: dict[str, Any]
) -> None:
    receiver = Receiver(script=[503, "hang"])  # the first notification is tried three times
    async with pushing(tmp_path, receiver, **backend) as (h, prefix):
        card = (await h.http.get("/.well-known/agent-card.json", headers=A)).json()
        assert card["capabilities"]["pushNotifications"] is True
        task = await waiting_task(h)
        config = {"taskId": task, "url": prefix + "task-1", "token": "tok-123"}
        made = await rpc(h, call(CREATE, config), A)
        assert made["result"]["taskId"] == task and made["result"]["token"] == "tok-123"
        config_id = made["result"]["id"]
        got = await rpc(
            h, call("GetTaskPushNotificationConfig", {"taskId": task, "id": config_id}), A
        )
        assert got["result"] == made["result"]
        listed = await rpc(h, call("ListTaskPushNotificationConfigs", {"taskId": task}), A)
        assert listed["result"]["configs"] == [made["result"]]
        # Another key's task: its configs are not found, as the task is not.
        for method, params in (
            ("GetTaskPushNotificationConfig", {"taskId": task, "id": config_id}),
            ("ListTaskPushNotificationConfigs", {"taskId": task}),
            ("DeleteTaskPushNotificationConfig", {"taskId": task, "id": config_id}),
            (CREATE, config),
        ):
            assert code(await rpc(h, call(method, params), B)) == -32001, method
        done = await rpc(h, call("SendMessage", message("yes", taskId=task)), A)
        assert done["result"]["task"]["status"]["state"] == "TASK_STATE_COMPLETED"
        accepted = await receiver.wait_accepted(3)
        for _ in range(1000):  # each leaves the outbox once accepted
            if not await h.node.store.outbox_depth():
                break
            await trio.sleep(0.01)
        assert await h.node.store.outbox_depth() == 0
    assert [update(r.event) for r in accepted] == [
        "TASK_STATE_WORKING",
        "text:All done.",
        "TASK_STATE_COMPLETED",
    ]
    assert [r.status for r in receiver.received] == [503, "hang", 200, 200, 200]
    ids = [r.headers["webhook-id"] for r in receiver.received]
    assert ids[0] == ids[1] == ids[2] and ids[2] < ids[3] < ids[4]  # retried, then in order
    for r in receiver.received:
        assert r.headers["x-a2a-notification-token"] == "tok-123"
        assert (
            r.event["statusUpdate" if "statusUpdate" in r.event else "artifactUpdate"]["taskId"]
            == task
        )


async def test_notifications_owed_at_a_restart_are_sent_after_it(tmp_path: Path) -> None:
    """The receiver refuses everything until the gateway stops; the next gateway on the
    same store sends what was owed, in order, and the config is still the task's."""
    receiver = Receiver(script=[503] * 1000)
    async with pushing(tmp_path, receiver) as (h, prefix):
        task = await waiting_task(h)
        config = {"taskId": task, "url": prefix + "r", "token": "tok-r"}
        assert "result" in await rpc(h, call(CREATE, config), A)
        await rpc(h, call("SendMessage", message("yes", taskId=task)), A)
        await receiver.wait_received(3)  # tried, refused
    receiver.script = []
    async with pushing(tmp_path, receiver) as (h, prefix):
        accepted = await receiver.wait_accepted(3)
        listed = await rpc(h, call("ListTaskPushNotificationConfigs", {"taskId": task}), A)
        assert [c["token"] for c in listed["result"]["configs"]] == ["tok-r"]
    assert [update(r.event) for r in accepted] == [
        "TASK_STATE_WORKING",
        "text:All done.",
        "TASK_STATE_COMPLETED",
    ]


async def test_urls_tokens_and_counts_that_are_refused(
    tmp_path: Path, backend: dict[str, Any]
) -> None:
    receiver = Receiver()
    limits = {"a2a.push_max_configs": 2, **backend}
    async with pushing(tmp_path, receiver, **limits) as (h, prefix):
        task = await waiting_task(h)
        port = receiver.port
        for url in (
            "https://elsewhere.example/hooks/x",  # another host
            f"http://127.0.0.1:{port}/hooksx",  # beside the prefix's path
            f"http://127.0.0.1:{port}/other/x",
            f"http://user:pw@127.0.0.1:{port}/hooks/x",  # credentials
            f"http://127.0.0.1:{port}@evil.example/hooks/x",
            prefix + "../admin",  # out of the prefix's path
            prefix + "%2e%2e/admin",
            prefix + "a\\..\\admin",
            prefix + "x#frag",
            prefix + "é",
            prefix + "x" * 3000,
            prefix + "a b",
        ):
            answer = await rpc(h, call(CREATE, {"taskId": task, "url": url}), A)
            assert (code(answer), reason(answer)) == (-32602, "push_url_not_allowed"), url
        for bad in ({"token": "a\r\nX-Evil: 1"}, {"token": "t" * 600}, {"id": "../x"}):
            answer = await rpc(h, call(CREATE, {"taskId": task, "url": prefix + "x", **bad}), A)
            assert code(answer) == -32602, bad
        creds = {"authentication": {"scheme": "Basic", "credentials": "dTpw"}}
        answer = await rpc(h, call(CREATE, {"taskId": task, "url": prefix + "x", **creds}), A)
        assert reason(answer) == "push_authentication_not_supported"
        for n in (1, 2):
            made = await rpc(h, call(CREATE, {"taskId": task, "url": prefix, "id": f"c{n}"}), A)
            assert made["result"]["id"] == f"c{n}"
        again = await rpc(h, call(CREATE, {"taskId": task, "url": prefix + "y", "id": "c2"}), A)
        assert again["result"]["url"] == prefix + "y"  # the same id: replaced, not one more
        third = await rpc(h, call(CREATE, {"taskId": task, "url": prefix, "id": "c3"}), A)
        assert (code(third), reason(third)) == (-32004, "too_many_push_configs")
        forged = await rpc(h, call(CREATE, {"taskId": task + "x", "url": prefix}), A)
        assert code(forged) == -32001
        gone = await rpc(
            h, call("DeleteTaskPushNotificationConfig", {"taskId": task, "id": "c1"}), A
        )
        assert gone["result"] == {}
        missing = {"taskId": task, "id": "c1"}
        answer = await rpc(h, call("GetTaskPushNotificationConfig", missing), A)
        assert (code(answer), reason(answer)) == (-32001, "push_config_not_found")
        await rpc(h, call("SendMessage", message("no", taskId=task)), A)  # the task ends
        ended = await rpc(h, call(CREATE, {"taskId": task, "url": prefix}), A)
        assert (code(ended), reason(ended)) == (-32004, "task_not_active")
        await receiver.wait_accepted(3)  # c2's: working, the reply, completed
        assert all(r.headers["content-type"] == "application/json" for r in receiver.received)
        context = task.rpartition(".")[0]
        assert h.node.sessions[context].record.push_configs  # kept with the session...
        r = await h.http.delete(f"/sessions/{context}", headers=A)
        assert r.status_code in (200, 204), r.text
        assert await h.node.store.get_session(context) is None  # ...and gone with it
        answer = await rpc(h, call("ListTaskPushNotificationConfigs", {"taskId": task}), A)
        assert code(answer) == -32001


async def test_a_config_sent_with_the_message_misses_nothing_of_its_task(
    tmp_path: Path,
) -> None:
    """``configuration.taskPushNotificationConfig`` of a new task's message: kept before
    the turn starts, so its first notification is its ``TASK_STATE_WORKING``."""
    receiver = Receiver()
    async with pushing(tmp_path, receiver) as (h, prefix):
        push = {"url": prefix + "m", "token": "tok-m"}
        body = {**message(TEXT), "configuration": {"taskPushNotificationConfig": push}}
        done = (await rpc(h, call("SendMessage", body), A))["result"]["task"]
        assert done["status"]["state"] == "TASK_STATE_COMPLETED"
        accepted = await receiver.wait_accepted(3)
        listed = await rpc(h, call("ListTaskPushNotificationConfigs", {"taskId": done["id"]}), A)
        assert [c["url"] for c in listed["result"]["configs"]] == [prefix + "m"]
        bad = {**message(TEXT), "configuration": {"taskPushNotificationConfig": {"url": "x"}}}
        answer = await rpc(h, call("SendMessage", bad), A)
        assert (code(answer), reason(answer)) == (-32602, "push_url_not_allowed")
    assert [update(r.event) for r in accepted] == [
        "TASK_STATE_WORKING",
        "text:Hello there, friend.",
        "TASK_STATE_COMPLETED",
    ]
    assert {r.headers["x-a2a-notification-token"] for r in accepted} == {"tok-m"}


async def test_a_config_sent_with_an_approvals_answer_gets_the_rest_of_the_task(
    tmp_path: Path,
) -> None:
    receiver = Receiver()
    async with pushing(tmp_path, receiver) as (h, prefix):
        task = await waiting_task(h)
        answer = {
            **message("yes", taskId=task),
            "configuration": {"taskPushNotificationConfig": {"url": prefix + "a", "id": "ans"}},
        }
        done = await rpc(h, call("SendMessage", answer), A)
        assert done["result"]["task"]["status"]["state"] == "TASK_STATE_COMPLETED"
        accepted = await receiver.wait_accepted(3)
    assert [update(r.event) for r in accepted] == [
        "TASK_STATE_WORKING",
        "text:All done.",
        "TASK_STATE_COMPLETED",
    ]
    assert "x-a2a-notification-token" not in accepted[0].headers  # none given


async def test_a_notification_that_cannot_be_made_costs_only_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(*args: Any) -> Any:
        raise RuntimeError("a bug in the feed")

    monkeypatch.setattr("gateway.doors.a2a.push.Push._notes", broken)
    receiver = Receiver()
    async with pushing(tmp_path, receiver) as (h, prefix):
        push = {"url": prefix + "m"}
        body = {**message(TEXT), "configuration": {"taskPushNotificationConfig": push}}
        done = (await rpc(h, call("SendMessage", body), A))["result"]["task"]
        assert done["status"]["state"] == "TASK_STATE_COMPLETED"  # the turn went on
        assert done["artifacts"][0]["parts"][0]["text"] == "Hello there, friend."
    assert receiver.received == []
    failed = [r for r in caplog.records if getattr(r, "event", "") == "a2a_push_failed"]
    assert len(failed) == 3 and "a bug in the feed" in failed[0].getMessage()


async def test_where_push_is_not_offered_a_config_with_a_message_is_refused(gw: Harness) -> None:
    body = {**message(TEXT), "configuration": {"taskPushNotificationConfig": {"url": "x"}}}
    answer = await rpc(gw, call("SendMessage", body))
    assert code(answer) == -32003
    card = (await gw.http.get("/.well-known/agent-card.json")).json()
    assert card["capabilities"]["pushNotifications"] is False
    assert await gw.node.store.list_sessions(limit=10, before=None) == ([], False)  # none made


def test_push_prefixes_the_config_refuses(tmp_path: Path) -> None:
    def load(**flat: Any) -> None:
        load_config(None, {}, {"store.path": str(tmp_path / "g.db"), **flat})

    secret = {"a2a.push_secret": SECRET}
    for prefix in (
        "https://hooks.example.com",  # no path: would match hooks.example.com.evil.net
        "http://hooks.example.com/",  # http, not loopback
        "https://user:pw@hooks.example.com/",
        "ftp://hooks.example.com/",
        "https://hooks.example.com/a?b",
    ):
        with pytest.raises(ConfigError, match=r"a2a\.push_url_prefixes"):
            load(**{"a2a.push_url_prefixes": [prefix]}, **secret)
    with pytest.raises(ConfigError, match=r"a2a\.push_secret"):
        load(**{"a2a.push_url_prefixes": ["https://hooks.example.com/"]})
    load(**{"a2a.push_url_prefixes": ["https://hooks.example.com/a2a/"]}, **secret)
    load(**{"a2a.push_url_prefixes": ["http://127.0.0.1:8080/"]}, **secret)

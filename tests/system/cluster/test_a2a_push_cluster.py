"""A2A push configs on two nodes (docs/doors/a2a.md "Push notifications").

Two whole gateways on one redis-server: a task runs on node a, its client sets
its push config through node b (a change made where the session runs: the
owner writes its own record), reads it back through either node, and a
receiver on loopback gets the task's notifications in order, with the token.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from tests.conftest import TOOL_SCRIPT
from tests.integration.doors.a2a.test_a2a_rpc import KEYS, A, call, message, rpc, states, stream
from tests.redis_support import RedisServer, own_redis
from tests.system.cluster.test_replica import two_nodes
from tests.webhook_support import SECRET, Receiver

pytestmark = pytest.mark.slow  # redis-server

__all__ = ["own_redis"]  # fixture


async def test_a_config_set_through_a_replica_is_the_owners_and_its_notifications_come(
    tmp_path: Path, own_redis: RedisServer
) -> None:
    receiver = Receiver()
    async with trio.open_nursery() as nursery:
        await nursery.start(receiver.serve)
        prefix = f"http://127.0.0.1:{receiver.port}/hooks/"
        more: dict[str, Any] = {
            "auth.api_keys": KEYS,
            "tools.require_approval": ["sleep"],
            "a2a.push_url_prefixes": [prefix],
            "a2a.push_secret": SECRET,
            "a2a.push_retry_first_s": 0.05,
        }
        with trio.fail_after(90):
            async with two_nodes(tmp_path, own_redis, **more) as (a, b):
                asked = await stream(a, call("SendStreamingMessage", message(TOOL_SCRIPT)), A)
                assert states(asked)[-1] == "TASK_STATE_INPUT_REQUIRED"
                task = asked[0][1]["result"]["task"]["id"]
                context = task.rpartition(".")[0]
                assert a.node.runs_here(context) and not b.node.runs_here(context)
                config = {"taskId": task, "url": prefix + "t", "token": "tok-b", "id": "on-b"}
                made = await rpc(b, call("CreateTaskPushNotificationConfig", config), A)
                assert made["result"]["id"] == "on-b", made
                assert [c.id for c in a.node.sessions[context].record.push_configs] == ["on-b"]
                for node in (a, b):
                    listed = await rpc(
                        node, call("ListTaskPushNotificationConfigs", {"taskId": task}), A
                    )
                    assert listed["result"]["configs"] == [made["result"]]
                done = await rpc(b, call("SendMessage", message("yes", taskId=task)), A)
                assert done["result"]["task"]["status"]["state"] == "TASK_STATE_COMPLETED"
                accepted = await receiver.wait_accepted(3)
                gone = {"taskId": task, "id": "on-b"}
                assert (await rpc(b, call("DeleteTaskPushNotificationConfig", gone), A))[
                    "result"
                ] == {}
                assert a.node.sessions[context].record.push_configs == []
        nursery.cancel_scope.cancel()
    kinds = [next(iter(r.event)) for r in accepted]
    assert kinds == ["statusUpdate", "artifactUpdate", "statusUpdate"]
    assert accepted[-1].event["statusUpdate"]["status"]["state"] == "TASK_STATE_COMPLETED"
    assert all(r.headers["x-a2a-notification-token"] == "tok-b" for r in accepted)

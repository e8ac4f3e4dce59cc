"""The AI SDK's doors on two nodes of one Redis (docs/scale-out.md; docs/doors/aisdk.md).

A chat created through one node is answered through the other: a new turn,
an approval answered in the next request, a resume and a stop all act on the
node that runs the session, and the replica's responses are the same
messages (``two_nodes`` of tests/system/cluster/test_replica.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from tests.aisdk_support import read, request, user
from tests.conftest import TOOL_SCRIPT
from tests.integration.doors.aisdk.test_aisdk_http import LONG_NAP, TEXT, chat
from tests.redis_support import RedisServer, own_redis
from tests.system.cluster.test_replica import two_nodes

# slow: redis-server; real Redis pub/sub and TTLs run on the real clock
pytestmark = pytest.mark.slow

__all__ = ["own_redis"]  # fixture


async def test_a_chat_is_answered_by_either_node(tmp_path: Path, own_redis: RedisServer) -> None:
    with trio.fail_after(30):
        async with two_nodes(tmp_path, own_redis, **{"tools.require_approval": ["sleep"]}) as (
            a,
            b,
        ):
            chat_id = "chat-replica"
            first = await chat(a, request(chat_id, user(TEXT)))  # created on a: a runs it
            assert first.text == "Hello there, friend."
            assert not b.node.runs_here(chat_id)
            question = user(TOOL_SCRIPT)
            m = await chat(b, request(chat_id, question))
            assert m.finish_reason == "tool-calls"
            [tool] = [p for p in m.parts if p["type"] == "dynamic-tool"]
            tool["state"] = "approval-responded"
            tool["approval"]["approved"] = True
            m = await chat(b, request(chat_id, question, m.as_sent()), message=m)
            assert tool["state"] == "output-available" and m.finish_reason == "stop"
            assert m.text == "Running it now.All done."
            # A resume and a stop through the replica, of a turn the owner runs (it
            # waits for an approval: each response ends there, the turn goes on).
            live = await chat(a, request(chat_id, user(LONG_NAP)))
            assert live.finish_reason == "tool-calls"
            async with b.http.stream("GET", f"/ai-sdk/chat/{chat_id}/stream") as r:
                assert r.status_code == 200
                again = await read(r)
            assert again.parts == live.parts and again.finish_reason == "tool-calls"
            stop = await b.http.post(f"/ai-sdk/chat/{chat_id}/stop", json={})
            assert stop.status_code == 202, stop.text
            with trio.fail_after(5):
                while a.node.sessions[chat_id].turn is not None:
                    await a.node.changed()
            r = await b.http.get(f"/ai-sdk/chat/{chat_id}/stream")
            assert r.status_code == 204

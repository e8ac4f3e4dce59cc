"""An AG-UI run's stream when its queue is closed (gateway.doors.agui.sse), without a socket.

Too slow is the slow-client rule (the transport closes the connection); any
other close (the session deleted, this node's relay of it lost) ends the run
with ``RUN_ERROR`` whose ``code`` names the close, so ``@ag-ui/client`` sees
why rather than a cut connection (docs/doors/agui.md).
"""

from __future__ import annotations

import json

import pytest
import trio

from gateway.config import StreamConfig
from gateway.doors.agui.mapping import RunMapper
from gateway.doors.agui.resume import RunFeed
from gateway.doors.agui.sse import RunSubscriber, stream_run
from gateway.doors.oneway import SlowClient
from gateway.metrics import Metrics
from tests.session_fakes import FakeSession


async def _streamed(code: str) -> list[dict[str, object]]:
    sub = RunSubscriber(FakeSession(), StreamConfig(), Metrics())  # type: ignore[arg-type]
    feed = RunFeed(RunMapper("sess_1", "run_1", "turn_1"), 0)
    sent: list[bytes] = []

    async def send(data: bytes) -> None:
        sent.append(data)

    sub.request_close(code)
    with trio.fail_after(5):
        await stream_run(sub, feed, [], send, 15.0)
    lines = b"".join(sent).decode().splitlines()
    return [json.loads(line[6:]) for line in lines if line.startswith("data: ")]


async def test_a_deleted_session_ends_the_run_with_a_run_error_naming_it() -> None:
    [error] = await _streamed("session_deleted")
    assert error["type"] == "RUN_ERROR" and error["code"] == "session_deleted"
    assert error["message"] == "The session was deleted."


async def test_a_slow_run_is_still_cut_by_its_transport() -> None:
    with pytest.raises(SlowClient):
        await _streamed("client_too_slow")

"""Traces across two nodes (docs/operating.md "Traces"): the trace context travels with the turn.

Two ``gateway serve`` processes on one Redis, each exporting OTLP/HTTP to a
receiver on loopback (tests/system/operating/test_telemetry_otlp.py), each under a
``service.name`` of its own. A turn posted with a W3C ``traceparent`` to the
node that does not run the session is carried to the one that does (the
``StartTurn`` operation, with the context in its ``trace`` field): the spans
are made there, in the client's trace, under the client's span; the delegated
worker's turn is under its parent's tool span; the node that took the request
makes none.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio

from tests.cluster_support import CONFIG, Cluster, Node, peers
from tests.redis_support import RedisServer, ensure_redis_server
from tests.scripts import DELEGATE
from tests.system.operating.test_telemetry_otlp import Receiver, attributes

pytest.importorskip("opentelemetry.sdk", reason="the otel extra: pip install 'gateway[otel]'")
pytest.importorskip("opentelemetry.proto", reason="the otel extra: pip install 'gateway[otel]'")

pytestmark = pytest.mark.slow  # redis-server and two gateway processes

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
CLIENT_SPAN = "b7ad6b7169203331"


async def test_a_turn_posted_to_the_replica_joins_the_client_s_trace_on_the_owner(
    tmp_path: Path,
) -> None:
    receiver = Receiver()
    async with trio.open_nursery() as nursery:
        [listener] = await trio.open_tcp_listeners(0, host="127.0.0.1")
        endpoint = f"http://127.0.0.1:{listener.socket.getsockname()[1]}/v1/traces"
        nursery.start_soon(trio.serve_listeners, receiver.serve, [listener])
        config = CONFIG + (
            f'[telemetry]\ntraces = "otlp"\nendpoint = "{endpoint}"\n'
            'service_name = "gw-{port}"\nshutdown_timeout_s = 5.0\n'
        )
        redis = RedisServer(ensure_redis_server(), tmp_path / "redis")
        redis.start()
        cluster = Cluster(redis, tmp_path, config)
        try:
            # Blocking (processes booting, then stopping): off the Trio thread, so that the
            # receiver answers the nodes' exports meanwhile (their flush at SIGTERM).
            owner, replica = await trio.to_thread.run_sync(cluster.start, 2)
            sid, turn_id = await _delegate_through(owner, replica)
            statuses = await trio.to_thread.run_sync(cluster.close)
            assert set(statuses.values()) == {0}, cluster.logs()
        finally:
            await trio.to_thread.run_sync(cluster.close)
            redis.stop()
        nursery.cancel_scope.cancel()

    ours = [s for s in receiver.spans if s.trace_id == bytes.fromhex(TRACE_ID)]
    assert {receiver.services[s.span_id] for s in receiver.spans} == {f"gw-{owner.port}"}
    assert len(ours) == len(receiver.spans), [s.name for s in receiver.spans]
    turns = [s for s in ours if s.name == "invoke_agent default"]
    [parent] = [t for t in turns if attributes(t)["gateway.turn.id"] == turn_id]
    [worker] = [t for t in turns if t is not parent]
    [tool] = [s for s in ours if s.name == "execute_tool delegate"]
    assert attributes(parent)["gen_ai.conversation.id"] == sid
    assert parent.parent_span_id == bytes.fromhex(CLIENT_SPAN)
    assert parent.trace_state == "vendor=opaque"  # tracestate travelled too
    assert tool.parent_span_id == parent.span_id
    assert worker.parent_span_id == tool.span_id
    assert attributes(worker)["gen_ai.conversation.id"] != sid
    assert len([s for s in ours if s.name == "chat echo"]) == 3


async def _delegate_through(owner_node: Node, replica_node: Node) -> tuple[str, str]:
    """A session made on the first node, and a delegating turn posted to the second."""
    async with peers([owner_node, replica_node]) as (owner, replica):
        sid = await owner.create_session()
        async with replica.watch(sid) as watch:
            r = await replica.http.post(
                f"/sessions/{sid}/turns",
                json={"content": json.dumps(DELEGATE)},
                headers={
                    "traceparent": f"00-{TRACE_ID}-{CLIENT_SPAN}-01",
                    "tracestate": "vendor=opaque",
                },
            )
            assert r.status_code == 202, r.text
            turn_id = str(r.json()["turn_id"])
            with trio.fail_after(30):  # real clock: processes on real sockets
                await watch.until_turn_ends(turn_id)
    return sid, turn_id

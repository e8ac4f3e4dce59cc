"""Three nodes on one Redis serve every session (docs/scale-out.md).

docs/reference.md "Command line": any node serves any session's clients (attach,
snapshot, replay, live), and turns, cancels and permission decisions can be
sent to any node. Three real ``gateway serve`` processes on one redis-server
(tests/cluster_support.py), one cluster for the whole module; each test makes
its own session on the first node (which then owns it: it holds the lease) and
clients on each node, and checks:

- clients on every node get the IDENTICAL event sequence of a turn (ids,
  types, actors, payloads), whether it was submitted to the owner or to
  another node, a burst of hundreds of events included (docs/protocol.md sections 3
  and 7), and end in the same view;
- a client that drops mid-message and resumes with ``since`` on another node
  converges: the same final message as a client that stayed, no event twice,
  none missing (docs/protocol.md §3, the seam rule);
- a snapshot attach on a node that has never seen the session shows its
  messages, the one still streaming included, and the live events after the
  snapshot's cut follow without gap or duplicate;
- a snapshot on a node that never saw the session shows a permission the
  turn waits for; a cancel, a permission decision and feedback sent to a node
  that is not the owner act on the session (docs/protocol.md sections 2 and 8), and so
  does a compaction (section 12); a non-owner
  answers as the owner would (409 ``turn_in_progress``, 409
  ``turn_not_in_flight``, 404);
- SIGTERM of the owner mid-turn (docs/reference.md "Command line"): the turn is
  cancelled with ``reason: "shutdown"`` for the clients on the other nodes
  too, the node exits 0, and having released its leases it leaves the
  session to the next node at once (the next turn: 202, no ``lease_s`` wait).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import msgspec
import pytest
import trio

from gateway.protocol.events import Event
from tests.cluster_support import (
    LEASE_S,
    Cluster,
    Node,
    assert_increasing,
    catalog,
    peers,
    running_cluster,
    wire,
)
from tests.conftest import TOOL_SCRIPT, types
from tests.redis_support import ensure_redis_server

# slow: redis-server and gateway serve processes
pytestmark = pytest.mark.slow

# An assistant message that streams for about a second: time to drop and come back.
SLOW_TEXT = {
    "script": {"delay_ms": 10, "rounds": [[{"thinking": "Let me think."}, {"lorem": 100}]]}
}
# A tool that waits for approval ([tools] require_approval), then a last round.
APPROVAL = {
    "script": {
        "rounds": [
            [{"tool_use": {"name": "read_file", "input": {"path": "note.txt"}}}],
            [{"text": "Read it."}],
        ]
    }
}
BURST = {"script": {"rounds": [[{"thinking": "Quickly."}, {"lorem": 300}]]}}
LONG_TOOL = {"script": {"rounds": [[{"tool_use": {"name": "sleep", "input": {"seconds": 30}}}]]}}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with running_cluster(ensure_redis_server(), tmp_path_factory.mktemp("cluster"), 3) as c:
        yield c


@pytest.fixture
def nodes(cluster: Cluster) -> list[Node]:
    """Three live nodes; the first creates each test's session (and owns it)."""
    return cluster.ensure(3)


def messages_of(state: dict[str, Any]) -> list[dict[str, Any]]:
    return list(state["messages"])


async def test_clients_on_every_node_get_the_identical_sequence(nodes: list[Node]) -> None:
    with trio.fail_after(20):
        async with peers(nodes) as (a, b, c):
            sid = await a.create_session()
            async with a.watch(sid) as wa, b.watch(sid) as wb, c.watch(sid) as wc:
                # to the owner, then to a node that is not (forwarded to the owner); then
                # a burst (no delay: hundreds of events, in few large batches) to the third
                for submitter, script in ((a, TOOL_SCRIPT), (b, TOOL_SCRIPT), (c, BURST)):
                    turn_id = await submitter.submit(sid, script)
                    seen = [await w.turn(turn_id) for w in (wa, wb, wc)]
                    first = seen[0]
                    assert types(first)[:3] == ["turn.started", "route.decided", "llm.call_started"]
                    assert "text.delta" in types(first)
                    assert first[-1].type == "turn.completed", types(first)
                    assert first[-1].payload.stop_reason == "end_turn"
                    assert_increasing(first, f"turn submitted to {submitter.name}")
                    for other, watch in zip(seen[1:], (wb, wc), strict=True):
                        assert wire(other) == wire(first), f"{watch.node.name} differs"
                # and each client's whole stream: the same events, in the same order
                assert wire(wa.events) == wire(wb.events) == wire(wc.events)
                assert types(wa.events).count("tool.completed") == 2
                assert types(wa.events).count("text.delta") > 300
                state = wa.client.reducer.state()
                replies = [m["content"] for m in state["messages"] if m["role"] == "assistant"]
                assert replies.count([{"type": "text", "text": "All done."}]) == 2
                assert [b["type"] for b in replies[-1]] == ["thinking", "text"]
                assert state == wb.client.reducer.state() == wc.client.reducer.state()


async def test_a_client_dropped_mid_message_resumes_on_another_node(nodes: list[Node]) -> None:
    with trio.fail_after(20):
        async with peers(nodes) as (a, b, c):
            sid = await a.create_session()
            async with a.watch(sid) as steady:
                async with b.watch(sid) as dropped:
                    turn_id = await a.submit(sid, SLOW_TEXT)
                    for _ in range(5):  # well into the message's text
                        await dropped.until_type("text.delta")
                held = list(dropped.events)
                reducer = dropped.client.reducer
                async with c.watch(sid, since=held[-1].id, reducer=reducer) as resumed:
                    await resumed.until_turn_ends(turn_id)
                    await steady.until_turn_ends(turn_id)
                    after = list(resumed.events)
                    replayed = after[: resumed.ack.replay_event_count]

    # no duplicate, no event out of order: the two connections are one stream
    assert_increasing(held + after, "before the drop, then after the resume")
    # the message was still streaming: the replay restores it with a message.snapshot,
    # and from that event on the resumed stream is exactly the steady client's
    assert "message.snapshot" in types(replayed), types(replayed)
    snapshot = next(e for e in after if e.type == "message.snapshot")
    assert snapshot.payload.message.status == "in_progress"
    tail = [e for e in after if e.id > snapshot.id]
    assert wire(tail) == wire([e for e in steady.events if snapshot.id < e.id <= after[-1].id]), (
        "gap or duplicate after the seam"
    )
    # no catalog event missing between the drop and the end of the turn
    missed = [e for e in steady.events if held[-1].id < e.id <= after[-1].id]
    assert [e.id for e in catalog(missed)] == [e.id for e in catalog(after)]
    # converged: the same final message as the client that never left
    assert messages_of(reducer.state()) == messages_of(steady.client.reducer.state())
    assert reducer.streaming is None
    final = reducer.state()["messages"][-1]
    assert final["status"] == "complete" and final["content"][-1]["type"] == "text"


async def test_a_snapshot_on_a_node_that_never_saw_the_session(nodes: list[Node]) -> None:
    with trio.fail_after(20):
        async with peers(nodes) as (a, _, c):
            sid = await a.create_session()
            async with a.watch(sid) as steady:
                first = await a.submit(sid, "hello cluster")
                await steady.until_turn_ends(first)
                second = await a.submit(sid, SLOW_TEXT)
                for _ in range(3):
                    await steady.until_type("text.delta")
                # c never had a request for this session until this one
                async with c.watch(sid, snapshot=True) as late:
                    await late.until_turn_ends(second)
                    await steady.until_turn_ends(second)
                    snap = late.snapshot
                    assert snap is not None
                    later = list(late.events)
                    final = messages_of(late.client.reducer.state())

    shown = [(m.role, m.status, m.turn_id) for m in snap.messages]
    assert shown == [
        ("user", "complete", first),
        ("assistant", "complete", first),
        ("user", "complete", second),
        ("assistant", "in_progress", second),  # streaming when the snapshot was cut
    ]
    assert snap.messages[1].content[0].text == "You said: hello cluster"  # type: ignore[union-attr]
    assert snap.session.current_turn_id == second
    cut = snap.snapshot_at_event_id
    assert cut is not None and all(e.id > cut for e in later)
    assert_increasing(later, "after the snapshot")
    # the live events after the cut: exactly the steady client's, none missing, none twice
    expected: list[Event] = [e for e in steady.events if cut < e.id <= later[-1].id]
    assert wire(later) == wire(expected)
    assert final == messages_of(steady.client.reducer.state())


async def test_a_workers_request_is_answered_from_its_root_on_a_non_owner(
    nodes: list[Node],
) -> None:
    """docs/protocol.md §2, §5, §6: a worker's request reaches its root's stream on every node,
    b's snapshot of the root lists it (with the worker's id), and b answers it on the root."""
    with trio.fail_after(20):
        async with peers(nodes) as (a, b, _):
            sid = await a.create_session(workspace_path="notes")
            root = nodes[0].workdir.parent / "workspaces"
            (root / "local" / "notes" / "note.txt").write_text("a note\n")
            task = msgspec.json.encode(APPROVAL).decode()
            script = {
                "script": {
                    "rounds": [
                        [{"tool_use": {"name": "delegate", "input": {"task": task}}}],
                        [{"text": "Delegated."}],
                    ]
                }
            }
            async with a.watch(sid) as wa, b.watch(sid, filter="preset:chat") as wb:
                turn_id = await a.submit(sid, script)
                [*_, asked] = await wb.until_type("permission.requested")
                assert asked.session_id != sid  # the worker's own id
                async with b.watch(sid, snapshot=True) as newcomer:
                    assert newcomer.snapshot is not None
                    [pending] = newcomer.snapshot.session.pending_permissions
                    assert (pending.perm_id, pending.session_id) == (
                        asked.payload.perm_id,
                        asked.session_id,
                    )
                r = await b.decide(sid, asked.payload.perm_id, "allow")
                assert r.status_code == 202, r.text
                done = await wa.turn(turn_id)
                assert done[-1].type == "turn.completed"
                delegated = next(e for e in done if e.type == "delegate.completed")
                assert delegated.payload.result == "Read it."


async def test_cancel_and_permission_sent_to_a_non_owner_act_on_the_turn(
    nodes: list[Node],
) -> None:
    with trio.fail_after(20):
        async with peers(nodes) as (a, b, c):
            # The nodes share one workspace root (cluster_support), as on shared storage.
            sid = await a.create_session(workspace_path="notes")
            root = nodes[0].workdir.parent / "workspaces"
            (root / "local" / "notes" / "note.txt").write_text("a note\n")
            async with a.watch(sid) as wa, c.watch(sid) as wc:
                # a permission decision, sent to b
                turn_id = await a.submit(sid, APPROVAL)
                [*_, asked] = await wa.until_type("permission.requested")
                # b has never seen the session: its snapshot shows the request, to answer
                async with b.watch(sid, snapshot=True) as newcomer:
                    assert newcomer.snapshot is not None
                    [pending] = newcomer.snapshot.session.pending_permissions
                    assert pending.perm_id == asked.payload.perm_id
                    assert pending.tool_name == "read_file"
                busy = await b.post_turn(sid, "meanwhile")  # the owner's answer, from b
                assert busy.status_code == 409, busy.text
                assert busy.json()["error"]["code"] == "turn_in_progress"
                r = await b.decide(sid, asked.payload.perm_id, "allow")
                assert r.status_code == 202, r.text
                allowed = await wa.turn(turn_id)
                assert wire(await wc.turn(turn_id)) == wire(allowed)
                resolved = next(e for e in allowed if e.type == "permission.resolved")
                assert resolved.payload.decision == "allow"
                done = next(e for e in allowed if e.type == "tool.completed")
                assert "a note" in str(done.payload.result)
                assert allowed[-1].type == "turn.completed"
                again = await c.decide(sid, asked.payload.perm_id, "deny")  # no longer pending
                assert again.status_code in (404, 409), again.text

                # feedback on the reply, sent to c
                reply = next(e for e in allowed if e.type == "llm.call_completed")
                body = {"message_id": reply.payload.message_id, "rating": 1, "comment": "ok"}
                r = await c.http.post(f"/sessions/{sid}/feedback", json=body)
                assert r.status_code == 202, r.text
                for w in (wa, wc):
                    [*_, recorded] = await w.until_type("feedback.recorded")
                    assert msgspec.to_builtins(recorded.payload) == body

                # a cancel, sent to c while the owner runs a tool
                turn_id = await a.submit(sid, LONG_TOOL)
                await wa.until_type("tool.called")
                r = await c.cancel(sid, turn_id, "enough")
                assert r.status_code == 202, r.text
                cancelled = await wa.turn(turn_id)
                assert wire(await wc.turn(turn_id)) == wire(cancelled)
                assert types(cancelled)[-2:] == ["tool.failed", "turn.cancelled"]
                assert cancelled[-2].payload.error_class == "cancelled"
                end = cancelled[-1].payload
                assert (end.reason, end.phase) == ("enough", "tools")
                # the owner's answers, from a node that is not the owner
                late = await b.cancel(sid, turn_id)
                assert late.status_code == 409 and late.json()["error"]["code"] == (
                    "turn_not_in_flight"
                ), late.text
                unknown = await c.cancel(sid, "turn_unknown")
                assert unknown.status_code == 404, unknown.text

                # a compaction, sent to b (docs/protocol.md §12): it runs on the owner,
                # and every node's clients see it
                r = await b.http.post(f"/sessions/{sid}/compact", json={})
                assert r.status_code == 202, r.text
                for w in (wa, wc):
                    [*_, compacted] = await w.until_type("context.compacted")
                    assert (compacted.payload.trigger, compacted.turn_id) == ("manual", None)


async def test_sigterm_of_the_owner_hands_its_sessions_over_at_once(
    cluster: Cluster, nodes: list[Node]
) -> None:
    owner = nodes[0]
    with trio.fail_after(20):
        async with peers(nodes) as (a, b, c):
            sid = await a.create_session()
            async with a.watch(sid) as wa, b.watch(sid) as wb:
                turn_id = await a.submit(sid, LONG_TOOL)
                await wb.until_type("tool.called")
                owner.terminate()
                cancelled = await wb.turn(turn_id)
                assert types(cancelled)[-2:] == ["tool.failed", "turn.cancelled"]
                assert (cancelled[-1].payload.reason, cancelled[-1].payload.phase) == (
                    "shutdown",
                    "tools",
                )
                closed = await wa.until_closed()
                assert closed.reason is not None and closed.reason.code == 1001, closed.reason
                assert await trio.to_thread.run_sync(owner.wait) == 0
                # its lease released on the way out: the next turn runs at once, elsewhere
                started = trio.current_time()
                next_turn = await c.submit(sid, "hello again")
                done = await wb.turn(next_turn)
                assert done[-1].type == "turn.completed"
                assert trio.current_time() - started < LEASE_S, "waited for the lease to lapse"
                assert_increasing(wb.events, "b's stream")

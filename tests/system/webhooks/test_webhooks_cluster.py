"""Webhooks on a cluster (docs/doors/webhooks.md, docs/scale-out.md): a failover loses no delivery.

Two ``gateway serve`` nodes on one redis-server (tests/cluster_support.py,
``lease_s`` = 1 s). Three sessions run two turns each on the first node,
whose webhook receiver hangs every request: the events are committed, each
lane's first delivery is in flight on that node (its claims in Redis say so),
none is accepted. Then that node is killed (SIGKILL) and the receiver comes
back: the survivor takes the dead node's lanes over and delivers every
``turn.started`` and ``turn.completed``, verified with the ``standardwebhooks``
package, none lost, in event order per session; a delivery seen twice has
the same ``webhook-id`` and the same body.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from gateway.webhooks.delivery import POLL_S
from tests.cluster_support import CONFIG, Cluster, peers, running_cluster
from tests.conftest import free_port
from tests.redis_support import ensure_redis_server
from tests.webhook_support import Received, Receiver, redis_command, webhook_toml

pytestmark = pytest.mark.slow  # redis-server and gateway serve processes, killed

EVENTS = ["turn.started", "turn.completed"]
SESSIONS = 3
TURNS = 2


@pytest.fixture
def receiver() -> Receiver:
    """Hangs every request until told otherwise (the nodes' attempts time out after 5 s)."""
    return Receiver(script=["hang"] * 1000, port=free_port())


@pytest.fixture
def cluster(tmp_path: Path, receiver: Receiver) -> Iterator[Cluster]:
    hook = webhook_toml("crm", receiver.url, EVENTS, timeout_s=5, max_attempts=1000)
    with running_cluster(ensure_redis_server(), tmp_path, 2, CONFIG + hook) as c:
        yield c


def first_acceptances(accepted: list[Received]) -> list[Received]:
    """Each delivery's first acceptance, in the order they came."""
    seen: set[str] = set()
    out = []
    for r in accepted:
        if r.headers["webhook-id"] not in seen:
            seen.add(r.headers["webhook-id"])
            out.append(r)
    return out


async def test_a_kill_9_of_the_owner_between_commit_and_delivery_loses_nothing(
    cluster: Cluster, receiver: Receiver
) -> None:
    owner, survivor = cluster.live
    port = cluster.redis.port
    with trio.fail_after(120):
        async with trio.open_nursery() as nursery:
            await nursery.start(receiver.serve)
            async with peers([owner, survivor]) as (first, _):
                sids = [await first.create_session() for _ in range(SESSIONS)]
                for sid in sids:
                    async with first.watch(sid) as w:
                        for turn in range(TURNS):
                            turn_id = await first.submit(sid, f"hello {turn}")
                            await w.until_turn_ends(turn_id)
                wanted = {
                    sid: [e for e in await first.replay(sid) if e.type in EVENTS] for sid in sids
                }
                expected = sum(len(events) for events in wanted.values())
                assert expected == SESSIONS * TURNS * 2
                # Committed, and each lane's first attempt is in flight on the owner.
                await receiver.wait_received(SESSIONS)
                owner_id = redis_command(port, "GET", f"gw:lease:{{{sids[0]}}}")
                claims = [redis_command(port, "GET", f"gw:obclaim:crm:{{{sid}}}") for sid in sids]
                assert owner_id in claims, (owner_id, claims)  # the takeover is exercised
                pending = redis_command(port, "SCARD", "gw:oblanes")
                assert pending == SESSIONS
                owner.kill()
                killed = trio.current_time()
                receiver.script.clear()  # the receiver answers 200 from now on
                with trio.fail_after(60):
                    while len(first_acceptances(receiver.accepted)) < expected:
                        await receiver.wait_accepted(len(receiver.accepted) + 1)
                    while True:  # the survivor takes them out of the outbox
                        if redis_command(port, "SCARD", "gw:oblanes") == 0:
                            break
                        await trio.sleep(0.05)
                # Taken over after the claims lapsed (a lease time), at the survivor's next
                # read of the outbox (every half lease time), not at its slow poll.
                assert trio.current_time() - killed < POLL_S
            nursery.cancel_scope.cancel()
    delivered = first_acceptances(receiver.accepted)
    for sid, events in wanted.items():
        got = [r.event["id"] for r in delivered if r.event["session_id"] == sid]
        assert got == [e.id for e in events], sid  # every one, in event order
    for line in survivor.log_events():  # no delivery dropped, no outbox failure
        assert line["level"] not in ("error", "critical"), line
    bodies: dict[str, bytes] = {}
    for r in receiver.received:  # a duplicate is the same delivery: same id, same body
        assert bodies.setdefault(r.headers["webhook-id"], r.body) == r.body
        assert r.headers["webhook-id"] == r.event["id"]

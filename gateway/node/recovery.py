"""Crash recovery: closing the turns a dead node left in flight (docs/protocol.md §9).

At start-up, and on Redis every half ``lease_s`` (the ``recovery`` task), the
store's open turns are closed, family by family from the root, workers
before their parents, by the node that can take the root's lease
(gateway.node.failover). A family whose lease a live node holds is running
there, and is left alone; a dead node's leases expire within ``lease_s``. A
turn running on this node is not interrupted. With SQLite every lease is this
node's: all of them are closed at start-up.
"""

from __future__ import annotations

import logging

import trio

from gateway.errors import StoreError
from gateway.logs import event
from gateway.node.core import NodeCore
from gateway.node.failover import recovered

log = logging.getLogger("gateway.node")


async def close_interrupted_turns(node: NodeCore) -> None:
    """One pass: close every turn left in flight that this node can take (module docstring)."""
    records = await node.store.open_turns()
    by_id = {r.id: r for r in records}

    def root_of(sid: str) -> str:
        parent = by_id[sid].parent_session_id
        return root_of(parent) if parent in by_id else sid

    failover = node.failover
    closed = 0
    for root_id in dict.fromkeys(root_of(r.id) for r in records):
        live = node.sessions.get(root_id)
        if live is not None and live.turn is not None:
            continue  # running here
        if root_id in failover.claiming:
            continue  # a request is taking it: it closes the turns itself
        # Registered as a claim, so that a request for it waits for this
        # pass (its turn must come after the closing: Failover.claim).
        failover.claiming[root_id] = claiming = trio.Event()
        try:
            taken = await node.leases.take(root_id)
            if taken is None:
                continue  # a live node runs it
            await failover.ids_above(taken)
            root = await node.registry.load(root_id)
            if root is not None and root.turn is None:
                closed += await failover.take_over(root, taken)
        except Exception as exc:  # one session's history must not keep the node down
            event(
                log, logging.ERROR, "session_failed",
                f"session {root_id}: could not close the turns left by a crash: {exc}",
                exc_info=exc, session_id=root_id, component="recovery",
            )  # fmt: skip
            node.metrics.session_failures.labels("recovery").inc()
        finally:
            del failover.claiming[root_id]
            claiming.set()
    if closed:
        recovered(closed)
        await node.wait_durable()


async def keep_recovering(node: NodeCore) -> None:
    """The ``recovery`` task (Redis): close the turns of nodes that died since.

    Every half lease time: a dead node's turn is closed at most 1.5 x
    ``lease_s`` after its last renewal (docs/operating.md "Running several nodes").
    """
    while True:
        await trio.sleep(node.config.store.lease_s / 2)
        try:
            await close_interrupted_turns(node)
        except StoreError as exc:  # tried again next round
            event(
                log, logging.ERROR, "store_read_failed",
                f"store: looking for interrupted turns failed: {exc}", error=str(exc),
            )  # fmt: skip

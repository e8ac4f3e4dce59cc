"""Failover: taking a session's lease over, and losing it (docs/scale-out.md).

Several nodes on one Redis: the node holding a session's lease runs it. A
request for a session whose lease is free takes it here (:meth:`Failover.claim`),
with its family (a session and its workers, from the root), reads the
session afresh from the store (another node ran it until now), issues ids
above every id the previous holder could have issued (docs/protocol.md §1),
and closes the turns it left in flight, workers before their parents
(docs/protocol.md sections 8 and 9). A node that loses a lease stops running the
session at once (:meth:`Failover.lease_lost`).
"""

from __future__ import annotations

import logging

import trio

from gateway.errors import StoreError
from gateway.logs import event
from gateway.node import deletion
from gateway.node.core import NodeCore
from gateway.session.recovery import close_interrupted
from gateway.session.session import Session
from gateway.store.lease import Taken

log = logging.getLogger("gateway.node")


class Failover:
    """This node's side of the lease hand-over of its sessions."""

    def __init__(self, node: NodeCore) -> None:
        self.node = node
        self.claiming: dict[str, trio.Event] = {}  # sessions whose lease a request is taking
        self._closing = trio.Lock()  # closing interrupted turns: one at a time

    async def claim(self, session: Session) -> None:
        """Take the session's lease if nobody holds it: every request for a session comes here.

        A request racing another that is taking it waits for that one (its
        turn closes first).
        """
        claiming = self.claiming.get(session.id)
        if claiming is not None:
            await claiming.wait()
        elif not self.node.leases.holds(session.id):
            self.claiming[session.id] = claiming = trio.Event()
            try:
                await self._claim(session)
            finally:
                del self.claiming[session.id]
                claiming.set()

    async def _claim(self, session: Session) -> None:
        """Take the session's lease if it is free; close the turn a dead holder left open.

        This node then runs the session's turns (the one it left in flight is
        closed before any new one can start: nothing awaits between this and
        a turn's submission). A session held elsewhere stays as it is: a
        replica here for this node's clients, whatever acts on it sent to its
        owner (gateway.node.placement). A replica whose lease this node takes
        is read afresh from the store first (:meth:`took_over`).
        """
        try:
            taken = await self.node.leases.take(session.id)
            if taken is None:
                return
            await self.ids_above(taken)
            if taken.new and session.turn is None:
                closed = await self._take_family(session, taken)
                if closed:
                    recovered(closed)
        except StoreError as exc:  # tried again at the next request or recovery pass
            event(
                log, logging.ERROR, "store_read_failed",
                f"session {session.id}: taking its lease failed: {exc}",
                error=str(exc), session_id=session.id,
            )  # fmt: skip

    async def ids_above(self, taken: Taken) -> None:
        """Issue the next ids above every id the lease's previous holder could have issued.

        (docs/protocol.md §1: a session's ids increase across a failover.)
        """
        sequencer = self.node.sequencer
        while sequencer.needs_block_above(taken.counter):
            sequencer.renew()
            await self.node.store.flush()

    async def _take_family(self, session: Session, taken: Taken) -> int:
        """This node just took the session's lease (it was free): its family comes with it.

        From the family's root (a worker asked for alone brings its parents'
        leases, where free), so that one node closes a family's turns, its
        ids in one order, workers first (:meth:`take_over`).

        Returns:
            How many turns were closed.
        """
        await self.took_over(session, taken)
        root = session.family
        if root is not session:
            held = await self._take_patiently(root.id)
            if held is not None and root.turn is None:
                await self.ids_above(held)
                return await self.take_over(root, held)  # the session among its workers
        return await self.take_over(session, None)

    async def take_over(self, session: Session, taken: Taken | None) -> int:
        """Close the turns a session's family left in flight here, workers first.

        ``taken``: the session's lease, if this node just took it (the session
        is read afresh from the store first: :meth:`took_over`). The leases of
        its workers are taken too, where free (docs/protocol.md sections 8 and 9: a
        delegate's worker is closed before its parent).

        Returns:
            How many turns were closed.
        """
        if taken is not None and taken.new:
            await self.took_over(session, taken)
        closed = 0
        for worker in list(session.workers):
            held = await self._take_patiently(worker.id)
            if held is None or worker.turn is not None:
                continue  # a live node runs it, or this one does
            await self.ids_above(held)
            closed += await self.take_over(worker, held)
        closed += await self._close_if_interrupted(session)
        session.next_turn()  # its queued turns go on here (docs/protocol.md §2 "A busy session")
        return closed

    async def _take_patiently(self, session_id: str) -> Taken | None:
        """Take a lease, allowing a third of ``lease_s`` for it to lapse.

        A dead node's leases were renewed in one round, so they lapse within
        moments of each other: a family's are all free, or soon. (A lease of a
        node alone on its store is always taken at once.)
        """
        leases = self.node.leases
        taken = await leases.take(session_id)
        if taken is None:
            wait = self.node.config.store.lease_s
            with trio.move_on_after(wait / 3):
                while taken is None:
                    await trio.sleep(wait / 20)
                    taken = await leases.take(session_id)
        return taken

    async def took_over(self, session: Session, taken: Taken) -> None:
        """Read a session afresh from the store: another node ran it until now.

        Its record and messages are the store's (the previous owner wrote
        them, durably, as it went); everything up to ``taken.counter`` is read
        from the store by a replay; workers it made that this node never
        loaded are loaded now (a parent's replay and closing include them).
        """
        node = self.node
        await node.wait_durable()  # this node's own writes of it first (it may have run it)
        node.placement.heard(session.family.id)  # nodes that watched its previous owner still do
        store = node.store
        record = await store.get_session(session.id)
        if record is None:  # deleted by another node meanwhile (docs/protocol.md §13)
            deletion.forget_replica(node, session)
            return
        stored = await store.load_messages(session.id)
        size = await store.event_bytes(session.id)  # max_session_mb: once, at load
        session.reload(record, stored, taken.counter, size)
        for worker_id in await store.worker_ids(session.id):
            if worker_id not in node.sessions:
                await node.registry.load(worker_id)
        await self._caught_up(session.family)

    async def _caught_up(self, family: Session) -> None:
        """Close this node's clients of the family if the store holds an event they missed.

        They had the previous owner's batches over pub/sub, published after
        their commit: one it committed and died before publishing is in the
        store only (docs/protocol.md §9 "Redis and several nodes": a node that
        loses some of those batches closes its clients with ``relay_gap``, and
        they resume with ``since``). Checked against the highest id relayed
        here, so a client that saw everything keeps its stream.
        """
        scope = family.scope(True)
        if not any(len(s.hub) for s in scope):
            return
        relayed = self.node.placement.relayed_up_to(family.id)
        if await self.node.store.events_after([s.id for s in scope], relayed, 1):
            close_clients(family, "relay_gap", settled=True)

    async def _close_if_interrupted(self, session: Session) -> bool:
        """Close the session's turn left in flight, if it has one and none runs here.

        One at a time, so that a recovery pass and a request taking the same
        lease never close a turn twice.
        """
        async with self._closing:
            if session.turn is not None or session.record.current_turn_id is None:
                return False
            await close_interrupted(session)
            return True

    def lease_lost(self, session_id: str) -> None:
        """This node lost the session's lease: it stops acting on the session.

        Another node may hold it now (or will, once Redis answers again): the
        session's turn is stopped here without a further event (its new owner
        closes it as interrupted, docs/protocol.md §9), and this node's clients
        of its family are closed with ``relay_gap`` so that they resume against
        the owner. Writes this node had already queued are dropped by the
        store (its lease fences them), and its held batches go to no client.
        """
        event(
            log, logging.ERROR, "lease_lost",
            f"session {session_id}: this node lost its lease; it stops running it here",
            session_id=session_id, component="lease",
        )  # fmt: skip
        self.node.metrics.session_failures.labels("lease").inc()
        session = self.node.sessions.get(session_id)
        if session is not None:
            session.stop_here()
            close_clients(session.family, "relay_gap")

    def lease_renew_failed(self, exc: StoreError) -> None:
        event(
            log, logging.ERROR, "lease_renew_failed",
            f"store: renewing the session leases failed: {exc} (retrying)", error=str(exc),
        )  # fmt: skip


def close_clients(family: Session, code: str, *, settled: bool = False) -> None:
    """Close every client of the family on this node with the close named ``code``;
    ``settled``: not those still in their seam (their cut is yet to come)."""
    for s in family.scope(True):
        for sub in s.hub.subscribers():
            if not (settled and sub in s.joining):
                sub.request_close(code)


def recovered(turns: int) -> None:
    event(
        log, logging.INFO, "turns_recovered",
        f"closed {turns} turns left in flight by a node that died", turns=turns,
    )  # fmt: skip

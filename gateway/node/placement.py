"""Placement: which node runs a session, chosen once at start-up (docs/scale-out.md).

One interface, :class:`Placement`, two implementations:

- :class:`LocalPlacement`, for a node alone on its store (SQLite): every
  session runs here, and whatever acts on one acts at once;
- :class:`ClusteredPlacement`, for several nodes on one Redis: the node holding
  a session's lease runs it; any other node keeps a *replica* of it for its
  own clients. Their live events come from the owner over the cluster link
  (one publish per batch per family), and whatever acts on the session is an
  operation sent to the owner (:mod:`gateway.cluster.ops`), answered exactly
  as the owner's own routes would answer it.

What an operation does on the node that runs the session is
gateway.node.operations.
"""

from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING, Protocol

import trio

from gateway.cluster import ops
from gateway.errors import Refused, StoreError, unavailable
from gateway.logs import event
from gateway.node import deletion, recovery
from gateway.node.core import NodeCore
from gateway.node.failover import close_clients
from gateway.node.operations import Notice, changing_nodes, notice, perform
from gateway.node.registry import pinning
from gateway.protocol.framing import event_frame
from gateway.session.hub import Emitted
from gateway.session.session import Session

if TYPE_CHECKING:
    from gateway.cluster.link import Cluster, LiveBatch

log = logging.getLogger("gateway.node")


class Placement(Protocol):
    """Where each session runs, and how what acts on it gets there."""

    alone: bool
    """This node is the deployment's only one: whatever happened to a session happened here."""

    def runs_here(self, session_id: str) -> bool:
        """Whether this node may run the session's turns (it holds the session's lease)."""
        ...

    async def claim(self, session: Session) -> None:
        """A request names the session: take its lease here if nobody holds it."""
        ...

    async def ask_owner(
        self, session: Session, op: ops.Operation, *, patient: bool = False
    ) -> ops.Answer | None:
        """Run ``op`` on the node running the session; ``None``: that is this node.

        Raises:
            Refused: the owner's own refusal, exactly as its routes would
                answer; ``session_owner_unreachable`` or ``store_unavailable``.
        """
        ...

    def forward(self, session: Session, op: Notice) -> None:
        """Carry ``op`` out on the node running the session, without waiting."""
        ...

    def relay(self, family: Session, session: Session, events: list[Emitted]) -> None:
        """A batch this node released, for the other nodes' clients."""
        ...

    async def watch(self, session: Session, *, tell_owner: bool = True) -> None:
        """A client here subscribes: receive the family's live batches if it runs elsewhere."""
        ...

    def heard(self, root_id: str) -> None:
        """This node took a family over: the nodes that watched it still do."""
        ...

    def keep_recovering(self, nursery: trio.Nursery) -> None:
        """Start closing, from now on, the turns of nodes that die (gateway.node.recovery)."""
        ...

    def watched_elsewhere(self, root_id: str) -> bool:
        """Whether another node may have clients of the family (gateway.node.unloading)."""
        ...

    def unloaded(self, root_id: str) -> None:
        """The family left this node's memory: what the placement kept for it goes too."""
        ...

    def relayed_up_to(self, root_id: str) -> int:
        """The highest id of the family that another node's live batches brought here (0: none)."""
        ...

    def joined(self, root_id: str, cut: int) -> None:
        """The family's only client here has everything up to ``cut`` (its snapshot's or
        replay's): :meth:`relayed_up_to` counts from there at least."""
        ...

    async def hand_over(self) -> None:
        """A clean stop, before the leases go: the other nodes get this node's last batches."""
        ...


async def choose(node: NodeCore, nursery: trio.Nursery) -> Placement:
    """The node's placement, picked once at start-up from its store's leases.

    On Redis the cluster link starts here, in ``nursery`` (task ``cluster``),
    and the attach tokens (gateway.node.attach_tokens) and the per-key limits
    (gateway.node.limits, task ``limits``) move to Redis.
    """
    if not node.leases.leases.shared:
        return LocalPlacement()
    from gateway.cluster.link import Cluster  # coredis: imported only when used
    from gateway.node.attach_tokens import RedisAttachTokens
    from gateway.node.limits import RedisKeyLimits
    from gateway.store.redis.keys import record_and_owner_keys

    placement = ClusteredPlacement(node)
    cluster = Cluster(
        node.config.store.url,
        "gw:",
        node.node_id,
        placement.serve,
        placement.on_live,
        placement.relay_gap,
    )
    placement.cluster = node.cluster = cluster
    await nursery.start(cluster.run, name="cluster")
    node.tokens = RedisAttachTokens(cluster.redis_call, "gw:", node.tokens.ttl_s)
    record_key, owner_key = record_and_owner_keys("gw:")
    shared = RedisKeyLimits(
        cluster.redis_call,
        "gw:",
        node.node_id,
        node.config.store.lease_s,
        record_key,
        owner_key,
    )
    await nursery.start(shared.run, name="limits")
    node.limits.share(shared)  # the per-key limits count for the deployment (docs/scale-out.md)
    return placement


class LocalPlacement:
    """A node alone on its store: every session runs here."""

    alone = True

    def runs_here(self, session_id: str) -> bool:
        return True

    async def claim(self, session: Session) -> None:
        return None

    async def ask_owner(
        self, session: Session, op: ops.Operation, *, patient: bool = False
    ) -> ops.Answer | None:
        return None

    def forward(self, session: Session, op: Notice) -> None:
        notice(session, op)

    def relay(self, family: Session, session: Session, events: list[Emitted]) -> None:
        return None

    async def watch(self, session: Session, *, tell_owner: bool = True) -> None:
        return None

    def heard(self, root_id: str) -> None:
        return None

    def keep_recovering(self, nursery: trio.Nursery) -> None:
        return None  # every lease is this node's: all were closed at start-up

    def watched_elsewhere(self, root_id: str) -> bool:
        return False

    def unloaded(self, root_id: str) -> None:
        return None

    def relayed_up_to(self, root_id: str) -> int:
        return 0

    def joined(self, root_id: str, cut: int) -> None:
        return None

    async def hand_over(self) -> None:
        return None


class ClusteredPlacement:
    """Several nodes on one Redis: a session runs where its lease is (module docstring)."""

    alone = False

    def __init__(self, node: NodeCore) -> None:
        self.node = node
        self.cluster: Cluster  # set by choose(), before anything is asked
        self._relayed: dict[str, tuple[str, int]] = {}  # family -> (owner, last batch number)
        self._relayed_seq: dict[str, int] = {}  # family -> the highest id relayed here
        self._checking: dict[str, list[LiveBatch]] = {}  # family -> batches of its new owner

    def runs_here(self, session_id: str) -> bool:
        return self.node.leases.holds(session_id)

    async def claim(self, session: Session) -> None:
        await self.node.failover.claim(session)

    def keep_recovering(self, nursery: trio.Nursery) -> None:
        nursery.start_soon(recovery.keep_recovering, self.node, name="recovery")

    def heard(self, root_id: str) -> None:
        self.cluster.heard(root_id)

    def watched_elsewhere(self, root_id: str) -> bool:
        """Another node said it watches the family: probe whether it still does.

        The probe is an empty live batch; the family's audience ends once one
        reaches no node (gateway.cluster.link), and a node without clients of
        it that receives one stops watching (:meth:`on_live`).
        """
        if not self.cluster.has_audience(root_id):
            return False
        self.cluster.publish(root_id, root_id, [])
        return True

    def unloaded(self, root_id: str) -> None:
        """The family left memory here: its relay bookkeeping goes, and its subscription."""
        self._relayed.pop(root_id, None)
        self._relayed_seq.pop(root_id, None)
        self._checking.pop(root_id, None)
        self.cluster.forget(root_id)

    def relayed_up_to(self, root_id: str) -> int:
        return self._relayed_seq.get(root_id, 0)

    def joined(self, root_id: str, cut: int) -> None:
        self._relayed_seq[root_id] = max(self._relayed_seq.get(root_id, 0), cut)

    async def hand_over(self) -> None:
        """What this node emitted is made durable, then published (a clean stop).

        The other nodes' clients get its last events (its turns' closing, its
        clients' goodbyes after the drain) before another node takes its
        sessions over, so none is missed there (docs/protocol.md §9 "Redis
        and several nodes"). Bounded by ``shutdown_grace_s``.
        """
        node = self.node
        with trio.move_on_after(node.config.server.shutdown_grace_s), contextlib.suppress(Refused):
            await node.wait_durable()
            await self.cluster.flush()

    # --- asking the owner ----------------------------------------------------------

    async def ask_owner(
        self, session: Session, op: ops.Operation, *, patient: bool = False
    ) -> ops.Answer | None:
        """Send ``op`` to the node holding the session's lease; ``None``: it is this node.

        A session whose lease is free is taken here first (its dead holder's
        turn closed: gateway.node.failover), and then runs here. ``patient``:
        when the holder does not answer (it died: a client's snapshot or
        replay on a survivor), wait up to ``lease_s`` for its lease to lapse
        and take it.

        Raises:
            Refused: the owner's own refusal, exactly as its routes would
                answer; ``session_owner_unreachable`` (it did not answer in
                ``commit_timeout_s``) or ``store_unavailable`` (Redis did not).
        """
        node = self.node
        if self.runs_here(session.id):
            return None
        leases = node.leases.leases
        try:
            holder = await leases.holder(session.id)
            if holder is None:
                await node.get_session(session.id)  # takes the free lease
                if self.runs_here(session.id):
                    return None
                holder = await leases.holder(session.id)
        except StoreError as exc:
            raise unavailable(exc) from None
        if holder is None or holder == node.node_id:  # changing hands right now
            raise changing_nodes(session.id)
        store = node.config.store
        # A turn may wait for a process slot on the owner first (gateway.tools.process_slots):
        # its answer is given that much longer, so the wait ends as the owner's own
        # 503 over_capacity, not as session_owner_unreachable.
        wait_s = store.commit_timeout_s + (
            node.process_slots.wait_s if isinstance(op, ops.StartTurn) else 0
        )
        try:
            return await self.cluster.call(holder, session.id, op, wait_s, store.lease_s)
        except StoreError as exc:
            raise unavailable(exc) from None
        except Refused as exc:
            if not patient or exc.code != "session_owner_unreachable":
                raise
            with trio.move_on_after(store.lease_s * 1.5):
                while not self.runs_here(session.id):
                    await trio.sleep(store.lease_s / 5)
                    await node.get_session(session.id)  # takes the lease once it lapsed
                return None
            raise

    def forward(self, session: Session, op: Notice) -> None:
        if self.runs_here(session.id):
            notice(session, op)
            return

        async def send() -> None:
            with contextlib.suppress(Refused):
                if await self.ask_owner(session, op) is None:  # it took the free lease
                    notice(session, op)

        name = f"cluster-forward {type(op).__name__} {session.id}"
        self.node.registry.nursery.start_soon(send, name=name)

    # --- live batches ---------------------------------------------------------------

    def relay(self, family: Session, session: Session, events: list[Emitted]) -> None:
        rows = [(e.seq, e.type, e.actor, e.turn_id, e.ts, e.data) for e in events]
        self.cluster.publish(family.id, session.id, rows)

    async def watch(self, session: Session, *, tell_owner: bool = True) -> None:
        """Receive the live batches of the session's family here (a replica's client subscribes).

        ``tell_owner``: ask the owner to publish them (``False`` when a
        snapshot or replay asked of it next says so anyway, before its cut).

        Raises:
            Refused: ``store_unavailable``: Redis did not take the subscription.
        """
        if self.runs_here(session.id):
            return
        root = session.family.id
        if root not in self.cluster.watched:
            self._relayed.pop(root, None)
        try:
            await self.cluster.watch(root)
        except StoreError as exc:
            raise unavailable(exc) from None
        # Then the owner publishes the family's batches (it did not while
        # nobody watched): told before any cut is taken.
        if tell_owner:
            await self.ask_owner(session, ops.Watch(), patient=True)

    def on_live(self, root: str, batch: LiveBatch) -> None:
        """A live batch of a watched family from its owner: fanned out to this node's clients.

        A batch whose number does not follow the last one of the same owner
        means pub/sub lost some: the family's clients here are closed with
        ``relay_gap`` and resume with ``since`` (gateway.cluster.link). A
        batch of another owner than the last waits for the store's word
        (:meth:`_handed_over`).
        """
        node = self.node
        family = node.sessions.get(root)
        if family is None or not any(len(s.hub) for s in family.scope(True)):
            self._relayed.pop(root, None)
            self.cluster.unwatch(root)
            return
        if self.runs_here(batch.session_id):
            return  # a late batch of a node that ran it before this one: its own are the truth
        waiting = self._checking.get(root)
        if waiting is not None:
            waiting.append(batch)
            return
        last = self._relayed.get(root)
        if last is not None and last[0] != batch.node:  # another node runs it now
            self._checking[root] = [batch]
            node.registry.nursery.start_soon(self._handed_over, root, name=f"handed-over {root}")
            return
        self._deliver(root, family, batch)

    async def _handed_over(self, root: str) -> None:
        """The family's batches come from another owner: hold them until the store says
        whether the previous owner committed any that never reached this node.

        (It died between a commit and its publish.) The new owner's batches
        are numbered its own way, so only the store tells: an event of the
        family above the highest id relayed here and below the new owner's
        first closes the clients here with ``relay_gap`` (docs/protocol.md §9
        "Redis and several nodes"); else the held batches go out, in order.
        """
        node = self.node
        family = node.sessions.get(root)
        stored = None
        if family is not None:
            ids = [s.id for s in family.scope(True)]
            with contextlib.suppress(StoreError):  # not known: the clients resume
                stored = await node.store.events_after(ids, self.relayed_up_to(root), 1)
        waiting = self._checking.pop(root, None)
        if waiting is None or family is None:
            return  # a gap closed its clients meanwhile, or it left memory
        first = next((b.events[0][0] for b in waiting if b.events), None)
        if stored is None or (stored and (first is None or stored[0].seq < first)):
            self.relay_gap(root)
            return
        for batch in waiting:
            self._deliver(root, family, batch)

    def _deliver(self, root: str, family: Session, batch: LiveBatch) -> None:
        """Fan a batch of the family's owner out here, unless it shows a gap in its numbers."""
        node = self.node
        last = self._relayed.get(root)
        self._relayed[root] = (batch.node, batch.batch_no)
        if last is not None and last[0] == batch.node and batch.batch_no != last[1] + 1:
            self.relay_gap(root)
            return
        if not batch.events and not batch.deleted:
            return  # its owner's probe: clients here still watch it (gateway.node.unloading)
        if batch.deleted:  # its owner deleted it: its clients here close too (section 13)
            deleted = node.sessions.get(batch.session_id)
            if deleted is not None:
                deletion.forget_replica(node, deleted)
            return
        sid = batch.session_id
        if batch.events:
            self._relayed_seq[root] = max(self._relayed_seq.get(root, 0), batch.events[-1][0])
        events = [  # each frame rebuilt once on this node, for all its clients
            Emitted(seq, type_, actor, sid, turn_id, ts, data, event_frame(data))
            for seq, type_, actor, turn_id, ts, data in batch.events
        ]
        session = node.sessions.get(batch.session_id)
        if session is not None and session.family is family:
            session.publish(events)
        else:  # a worker this node has not loaded: its parent's clients may take it
            family.publish(events, from_worker=True)

    def relay_gap(self, root: str) -> None:
        """Live batches of the family may have been lost: its clients here resume with since."""
        self._relayed.pop(root, None)
        self._checking.pop(root, None)
        family = self.node.sessions.get(root)
        if family is None:
            return
        event(
            log, logging.WARNING, "relay_gap",
            f"session {root}: live events from its node were lost; its clients here resume"
            " with since", session_id=root,
        )  # fmt: skip
        close_clients(family, "relay_gap")

    # --- serving the other nodes ------------------------------------------------------

    async def serve(self, session_id: str, op: ops.Operation) -> ops.Answer:
        """Serve another node's operation on a session this node runs (:meth:`ask_owner`).

        The session is held in memory while it is served (gateway.node.unloading).
        """
        pins = pinning()
        try:
            return await self._serve(session_id, op)
        finally:
            pins.release()

    async def _serve(self, session_id: str, op: ops.Operation) -> ops.Answer:
        session = await self.node.get_session(session_id)
        if session is None:
            raise Refused("session_not_found", f"no session {session_id!r}")
        if not self.runs_here(session_id):  # the lease moved meanwhile: the sender retries
            raise changing_nodes(session_id)
        if isinstance(op, ops.Watch | ops.TakeSnapshot | ops.Replay):
            self.cluster.heard(session.family.id)  # before the cut: no batch after it is missed
        return await perform(self.node, session, op)

"""Deleting a session: ``DELETE /sessions/{id}`` on the node that runs it (docs/protocol.md §13).

In order, so that nothing of the session comes back and every client sees an end:

1. The session and every worker under it (live here or only stored) become
   unknown to every new request at once (404, and a WebSocket handshake 404);
   a load already in progress is waited for, so that it is deleted too.
2. Each turn in flight among them is cancelled with ``reason:
   "session_deleted"``: the section 8 sequence is emitted, made durable and
   handed to the clients' queues, within ``shutdown_grace_s``.
3. Their clients are closed with 1000 ``session_deleted`` (after what was
   queued for them, ``turn.cancelled`` included: gateway.protocol.closes), and
   a client does not reconnect after it.
4. Their tasks end for good and they leave this node's memory (a worker
   leaves its parent's list; the parent stays).
5. The store deletes their records, messages, events and files in one transaction,
   after everything written before (:meth:`gateway.store.base.Store.delete_sessions`).
6. Their own workspace directories are removed (only one made for the
   session, never one the client named: gateway.tools.workspace), and their
   Claude Code state (gateway.runtimes.claude_code.paths), their
   leases dropped, and their owner's session count given back.
7. On several nodes the owner publishes a ``deleted`` notice on the family's
   live channel, after its last batch: every node watching it closes its
   clients of the session the same way and drops its replica
   (:func:`forget_replica`); the node that sent the DELETE drops its own
   replica in any case (:func:`deleted_elsewhere`), and a node whose replica
   had no clients finds the session gone when it next takes its lease
   (gateway.node.failover).
"""

from __future__ import annotations

import logging

import trio

from gateway.errors import StoreError, unavailable
from gateway.logs import event
from gateway.node.core import NodeCore
from gateway.runtimes.claude_code.paths import remove_state
from gateway.session import busy
from gateway.session.session import Session
from gateway.store.base import SessionRecord

log = logging.getLogger("gateway.node")

POLL_S = 0.02  # how often a wait for a turn's end or the owner's notice looks again
REASON = "session_deleted"  # turn.cancelled's reason, and the close's code


async def delete(node: NodeCore, session: Session) -> None:
    """Delete ``session`` and its workers (module docstring).

    Raises:
        Refused: ``store_unavailable``: the store did not answer (the session
            stays unknown on this node until a restart; a retry deletes it).
    """
    registry = node.registry
    live = _tree(session)
    for s in live:  # nothing queued starts from now on, whatever ends meanwhile (§2)
        s.deleting = True
        busy.put_back(s)  # not even one taken from the queue, not yet started
    try:
        ids = await _stored_tree(node, session.id)
    except StoreError as exc:
        for s in live:  # not deleted after all: what waits goes on
            s.deleting = False
            s.next_turn()
        raise unavailable(exc) from None
    ids += [s.id for s in live if s.id not in ids]
    registry.deleting.update(ids)
    for sid in ids:
        await registry.loaded(sid)
    live = _tree(session)  # with what a load in progress added
    await _cancel_turns(node, live)
    close_clients(node, {s.id for s in live})
    for s in reversed(live):  # workers first
        registry.forget(s)
    if node.cluster is not None:  # the other nodes' clients of it close too, after its events
        node.cluster.publish(session.family.id, session.id, [], deleted=True)
    try:
        records = [r for r in [await node.store.get_session(sid) for sid in ids] if r]
        await node.store.delete_sessions(ids)
    except StoreError as exc:
        raise unavailable(exc) from None
    node.files.forget(ids)  # their bytes cached for a provider (gateway.session.files)
    await _release(node, records)
    registry.deleting.difference_update(ids)  # the store answers for them from now on
    event(
        log, logging.INFO, "session_deleted", f"session {session.id} deleted",
        session_id=session.id, workers=len(ids) - 1,
    )  # fmt: skip


async def deleted_elsewhere(node: NodeCore, session: Session) -> None:
    """This node asked the owner to delete ``session``, a replica here: it leaves this node.

    Its clients here close once the owner's notice arrives, after the last
    events (:func:`forget_replica`, from the live batches); at most
    ``commit_timeout_s`` is waited for it.
    """
    live = _tree(session)
    if any(len(s.hub) for s in live):
        for _ in range(round(node.config.store.commit_timeout_s / POLL_S)):
            if node.sessions.get(session.id) is not session:
                return
            await trio.sleep(POLL_S)
    if node.sessions.get(session.id) is session:
        forget_replica(node, session)


def forget_replica(node: NodeCore, session: Session) -> None:
    """The owner deleted a session this node keeps a replica of: its clients here end too."""
    live = _tree(session)
    close_clients(node, {s.id for s in live})
    for s in reversed(live):
        node.registry.forget(s)
        node.leases.held.pop(s.id, None)


def close_clients(node: NodeCore, ids: set[str]) -> None:
    """Close every client of these sessions on this node with 1000 ``session_deleted``.

    The subscribed ones (the session's own hub: a parent's clients that take
    a deleted worker's events stay) and the connections not subscribed yet.
    """
    for sid in ids:
        s = node.sessions.get(sid)
        if s is not None:
            for sub in s.hub.subscribers():
                sub.request_close(REASON)
    for conn in list(node.connections):
        if conn.session.id in ids and conn.closing is None:
            conn.request_close(REASON)


def _tree(session: Session) -> list[Session]:
    """The session and its live workers, parents before their workers."""
    out = [session]
    for worker in list(session.workers):
        out += _tree(worker)
    return out


async def _stored_tree(node: NodeCore, session_id: str) -> list[str]:
    """The session's id and its stored workers', recursively, parents first."""
    out = [session_id]
    for worker in await node.store.worker_ids(session_id):
        out += await _stored_tree(node, worker)
    return out


async def _cancel_turns(node: NodeCore, live: list[Session]) -> None:
    """Cancel every turn in flight among them; wait for their sequences to be delivered."""
    for s in live:  # nothing queued starts (docs/protocol.md §2 "A busy session")
        busy.forget_waiting(s)
    with trio.move_on_after(node.config.server.shutdown_grace_s):
        while any(s.turn is not None for s in live):
            for s in live:
                if s.turn is not None:
                    s.turn.request_cancel(REASON)
            await trio.sleep(POLL_S)
        await node.wait_durable()  # hence handed to the clients' queues before the close


async def _release(node: NodeCore, records: list[SessionRecord]) -> None:
    """What the sessions held besides the store: workspaces, leases, the owner's count."""
    for rec in records:
        node.leases.held.pop(rec.id, None)
        node.limits.session_deleted(rec.owner)
        # Its Claude Code transcripts, if it ran Claude Code: nothing of it comes back.
        await trio.to_thread.run_sync(remove_state, node.workspaces.root, rec.id)
        try:
            await node.workspaces.remove(session_id=rec.id, recorded=rec.workspace_path)
        except OSError as exc:  # the session is gone all the same; the directory is named
            event(
                log, logging.WARNING, "workspace_not_removed",
                f"session {rec.id}: its workspace was not removed: {exc}",
                session_id=rec.id, error=str(exc),
            )  # fmt: skip

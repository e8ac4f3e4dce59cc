"""Admission: whether a session takes a turn now, and the refusal when it does not.

docs/protocol.md §2 (``POST .../turns``, ``POST .../compact``): one turn at a
time per session, only on the node that runs it (docs/scale-out.md), none
once shutdown began, none once the session holds ``max_session_mb``, none
once the store refuses every write (docs/protocol.md §15).
"""

from __future__ import annotations

import math

from gateway.errors import Refused, unavailable
from gateway.session.core import SessionCore
from gateway.store.base import Store

MB = 1024 * 1024
"""A megabyte of ``max_session_mb``: 2**20 bytes."""


def check_idle(session: SessionCore) -> None:
    """Refuse a turn (or a compaction) on a node that does not run it, or while the session
    is busy: a turn runs, or turns are queued (docs/protocol.md §2 "A busy session").

    Raises:
        Refused: as :func:`check_here`; ``turn_in_progress``.
    """
    check_here(session)
    if session.turn is not None:
        raise Refused(
            "turn_in_progress", f"turn {session.turn.id} is still in flight on {session.id}"
        )
    if session.record.queued_turns:
        raise Refused(
            "turn_in_progress",
            f'session {session.id} has turns queued: send with if_busy "queue" to queue another',
        )


def check_here(session: SessionCore) -> None:
    """Refuse a turn on a node that does not run the session, or once shutdown began.

    Raises:
        Refused: ``shutting_down``; ``session_elsewhere`` where several nodes
            share a store and another node holds the session's lease (both with
            ``Retry-After``).
    """
    if session.node.shutting_down:  # its leases are let go within shutdown_grace_s
        wait = math.ceil(session.node.config.server.shutdown_grace_s)
        raise Refused(
            "shutting_down",
            f"the gateway is shutting down; retry in {wait} s (on Redis, another node"
            " then runs the session)",
            retry_after_s=wait,
        )
    if not session.node.runs_here(session.id):
        # Turns run only on the lease holder; until they are routed to it
        # (docs/scale-out.md), the client tries again: once a dead holder's
        # lease lapses, the next request takes it and closes its turn first.
        wait = math.ceil(session.node.config.store.lease_s)
        raise Refused(
            "session_elsewhere",
            f"session {session.id} runs on another node of this deployment; "
            f"retry in {wait} s (its lease lapses within store.lease_s if that node died)",
            retry_after_s=wait,
        )


def check_size(session: SessionCore) -> None:
    """Refuse a turn once the session holds ``max_session_mb`` or more (docs/protocol.md §15).

    Raises:
        Refused: ``session_too_large``, naming its size and the limit.
    """
    limit_mb = session.node.config.limits.max_session_mb
    size = session.stored_bytes
    if limit_mb and size >= limit_mb * MB:
        raise Refused(
            "session_too_large",
            f"session {session.id} holds {size / MB:.1f} MB of stored data, its max_session_mb"
            f" is {limit_mb}: it takes no more turns (it can still be read; start a new"
            " session to go on)",
        )


def check_store(store: Store) -> None:
    """Refuse a turn (or a compaction) the store could never hold (docs/protocol.md §15).

    Raises:
        Refused: ``store_unavailable`` (with ``Retry-After``) once the store
            refuses every write until a restart (its file deleted or replaced).
    """
    if store.refusing is not None:
        raise unavailable(store.refusing)

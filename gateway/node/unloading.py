"""Unloading: an idle session leaves memory, and comes back when used (docs/protocol.md §13).

The ``unloader`` task looks at the node's sessions every quarter of
``idle_unload_s`` (at most every 30 s). A family (a root session and its
workers: they load together, gateway.node.registry) leaves memory when none
of them has been used for ``idle_unload_s`` and none is *busy*:

- a turn in flight, a compaction queued, or a permission request pending;
- a client here (a subscription, or a request or stream holding it:
  :func:`gateway.node.registry.pinning`);
- batches waiting for their commit, a load of one of them in progress, a
  lease being taken, or a lease lost and being handed over;
- on several nodes, another node watching its live batches (its clients
  there): the owner probes with an empty batch, and the family is free once
  one reaches nobody (gateway.cluster.link).

Leaving memory, in order: the family becomes unknown to new requests (they
wait, then load it afresh), its tasks end (its session-scope MCP servers and
a Claude Code process stop with them), what it wrote is made durable, its
leases are given back (another node may take it at once), and what the node
kept for it elsewhere is dropped. Then the store's caches in this process are
freed (SQLite's page caches: they fill again as reads need them) and the
allocator gives its free pages back to the system. The next request, attach or turn loads it
from the store: ids, snapshot and replay are the store's, as they were.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
from collections.abc import Callable

import trio
import trio.lowlevel

from gateway.errors import Refused, StoreError
from gateway.logs import event
from gateway.node.core import NodeCore
from gateway.session.session import Session

log = logging.getLogger("gateway.node")

MAX_PERIOD_S = 30.0  # the longest between two looks, whatever idle_unload_s is

M_ARENA_MAX = -8  # glibc's mallopt parameter (malloc.h)
ALLOCATOR_ARENAS = 2  # the event loop's, and one its worker threads share

try:  # glibc: give the heap's free pages back to the system (the RSS an operator watches)
    _libc = ctypes.CDLL("libc.so.6")
    _malloc_trim: Callable[[int], int] | None = _libc.malloc_trim
    _mallopt: Callable[[int, int], int] | None = _libc.mallopt
except (OSError, AttributeError):  # another C library: its own policy
    _malloc_trim = _mallopt = None


def limit_allocator_arenas() -> None:
    """At most :data:`ALLOCATOR_ARENAS` malloc arenas (glibc), unless ``MALLOC_ARENA_MAX`` says.

    Called once by ``gateway serve`` before its first thread. glibc gives each
    thread that allocates an arena of its own, up to 8 per core; the store's
    worker threads (``trio.to_thread``: a different one from call to call)
    then leave a little memory in each of up to 16 arenas after every load,
    each arena with its own fragments that ``malloc_trim`` cannot give back:
    RSS grew about 1.3 KiB per session loaded and unloaded again (3 x 3,000
    sessions), and stays flat with two arenas (one arena too). The threads
    sharing one arena run one store query at a time per connection: its lock
    is rarely contended.
    """
    if _mallopt is not None and "MALLOC_ARENA_MAX" not in os.environ:
        _mallopt(M_ARENA_MAX, ALLOCATOR_ARENAS)


def _give_back_memory() -> None:
    """What unloaded sessions held goes back to the system, not only to the allocator."""
    if _malloc_trim is not None:
        _malloc_trim(0)


async def keep_unloading(node: NodeCore) -> None:
    """The ``unloader`` task: unload idle families for as long as the node runs."""
    idle_s = node.config.sessions.idle_unload_s
    period = min(idle_s / 4, MAX_PERIOD_S)
    while True:
        await trio.sleep(period)
        roots = idle_families(node, trio.current_time(), idle_s)
        if roots:
            await unload(node, roots)


def idle_families(node: NodeCore, now: float, idle_s: float) -> list[Session]:
    """The families that may leave memory now (module docstring); busy ones count as used now."""
    out = []
    for root in list(node.sessions.values()):
        if root.parent is not None:
            continue
        family = root.scope(True)
        if any(busy(node, s) for s in family) or node.placement.watched_elsewhere(root.id):
            root.used_at = now
        elif now - max(s.used_at for s in family) >= idle_s:
            out.append(root)
    return out


def busy(node: NodeCore, session: Session) -> bool:
    """Whether something holds the session in memory now (module docstring)."""
    return bool(
        session.turn is not None
        or len(session.hub)
        or session.pins
        or session.permissions.pending()
        or session.supervisor.compaction_queued
        or session.family.awaiting_commit
        or session.fenced
        or node.registry.busy(session)
        or session.id in node.failover.claiming
    )


async def unload(node: NodeCore, roots: list[Session]) -> None:
    """Take these families out of memory, all in one go (module docstring)."""
    registry = node.registry
    families = [root.scope(True) for root in roots]
    everyone = [s for family in families for s in family]
    for family in families:  # unknown to requests, tasks cancelled: one synchronous step
        registry.unload(family)
    try:
        for session in everyone:
            await session.ended.wait()  # its session-scope servers are closed
        with trio.move_on_after(node.config.store.commit_timeout_s), contextlib.suppress(Refused):
            await node.wait_durable()  # before its lease goes: a new holder reads it all
        with contextlib.suppress(StoreError):  # not given back: they lapse within lease_s
            await node.leases.release([s.id for s in everyone])
        for root in roots:
            node.placement.unloaded(root.id)
    finally:
        for family in families:
            registry.unloaded(family)
    node.metrics.sessions_unloaded.inc(len(everyone))
    with contextlib.suppress(StoreError):  # a cache kept costs memory, not correctness
        await node.store.release_memory()
    _give_back_memory()
    for root, family in zip(roots, families, strict=True):
        event(
            log, logging.INFO, "session_unloaded",
            f"session {root.id} unloaded after {node.config.sessions.idle_unload_s:g} s unused",
            session_id=root.id, workers=len(family) - 1,
        )  # fmt: skip

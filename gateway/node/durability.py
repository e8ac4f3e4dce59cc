"""Commit release: a batch that carries a catalog event goes out once it is durable.

docs/protocol.md §9. A session *holds* such a batch (and every later batch of
its family) until the store reports the commit of its put
(:meth:`gateway.session.session.Session.emit`); :meth:`Durability.on_commit`
releases what waited, in order. A request that must answer only once what it
did is durable waits with :meth:`Durability.durable_or_503`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

import trio

from gateway.config import StoreConfig
from gateway.errors import Refused, StoreError, unavailable
from gateway.logs import SLOW_FLUSH_S, event
from gateway.metrics import Metrics
from gateway.store.base import Store

if TYPE_CHECKING:
    from gateway.session.session import Session

log = logging.getLogger("gateway.node")


class Durability:
    """The families waiting for a commit, and the waits for one."""

    def __init__(self, store: Store, config: StoreConfig, metrics: Metrics) -> None:
        self.store = store
        self.config = config
        self.metrics = metrics
        self._holding: dict[Session, None] = {}  # families with batches waiting for a commit

    def attach(self, on_refusing: Callable[[StoreError], None]) -> None:
        """Listen to the store's commits, write failures and flushes (it is open).

        ``on_refusing`` is told when the store begins to refuse every write
        (its file deleted or replaced: docs/protocol.md §15).
        """
        self.store.on_commit = self.on_commit
        self.store.on_write_error = self._store_write_failed
        self.store.on_flush = self._store_flushed
        self.store.on_refusing = on_refusing

    def holding(self, family: Session) -> None:
        """``family`` has batches waiting for their commit (:meth:`Session.emit`)."""
        self._holding[family] = None

    def on_commit(self, committed: int) -> None:
        """The store committed every put up to ticket ``committed``: release what waited.

        Each family's batches go out in the order they were emitted; a batch
        emitted meanwhile (a slow client's warning) waits for its own commit.
        """
        for family in list(self._holding):
            held = family.awaiting_commit
            while held and held[0][0] <= committed:
                _, session, events = held.popleft()
                session.release(events)
            if not held:
                self._holding.pop(family, None)

    async def wait_durable(self) -> None:
        """Return once everything put so far is committed.

        Raises:
            Refused: ``store_unavailable``, at once, once the store refuses
                every write: what was put will never be committed.
        """
        try:
            await self.store.wait_committed(self.store.ticket())
        except StoreError as exc:
            raise unavailable(exc) from None

    async def durable_or_503(self) -> None:
        """:meth:`wait_durable` for a request, within ``commit_timeout_s``.

        Raises:
            Refused: ``store_unavailable`` when the store does not commit in
                time, and at once when it takes no more writes (its file was
                deleted or replaced: docs/protocol.md §15), also when it
                finds so while the request waits.
        """
        store = self.store
        if store.refusing is not None:
            raise unavailable(store.refusing)
        with trio.move_on_after(self.config.commit_timeout_s):
            await self.wait_durable()
            return
        failure = store.refusing or store.failure
        if failure is not None:  # the reason, in the answer
            raise unavailable(failure)
        raise Refused(
            "store_unavailable", "the store did not commit in time; the request may be retried"
        )

    def _store_write_failed(self, exc: Exception) -> None:
        event(
            log, logging.ERROR, "store_write_failed",
            f"store: {exc} (retrying; live events wait for the commit)", error=str(exc),
        )  # fmt: skip
        self.metrics.store_write_failures.inc()

    def _store_flushed(self, duration_s: float, rows: int) -> None:
        """The store committed ``rows`` in ``duration_s``: observed, and logged when slow."""
        self.metrics.store_flush_duration.observe(duration_s)
        self.metrics.store_flush_rows.observe(rows)
        if duration_s > SLOW_FLUSH_S:
            ms = round(duration_s * 1000)
            event(
                log, logging.WARNING, "store_flush_slow",
                f"store: a commit of {rows} rows took {ms} ms", duration_ms=ms, rows=rows,
            )  # fmt: skip

"""The trace store: its interface (:mod:`.base`) and its two backends.

At this package's root, what holds whatever the backend: the records and the
``Store`` Protocol (:mod:`.base`), the group commit (:mod:`.group_commit`), and
the rules, sans-IO, of the idempotency records (:mod:`.idempotency`), the webhook
outbox (:mod:`.outbox`) and the session leases (:mod:`.lease`). One package per
backend, cut the same way (``store.py``, ``outbox.py``, ``requests.py``,
``leases.py``, ``batch.py``):

- :class:`SqliteStore` (:mod:`.sqlite`): the embedded default, one node.
- :class:`~gateway.store.redis.store.RedisStore` (:mod:`.redis`): Redis, so that several
  nodes can share one store (docs/scale-out.md).

:func:`open_store` picks one from ``[store] backend`` (docs/reference.md).
"""

from gateway.config import StoreConfig
from gateway.store.base import SessionRecord, Store, StoredEvent, StoredMessage, StoreState
from gateway.store.sqlite.store import SqliteStore

__all__ = [
    "SessionRecord",
    "SqliteStore",
    "Store",
    "StoreState",
    "StoredEvent",
    "StoredMessage",
    "open_store",
]


def open_store(config: StoreConfig) -> Store:
    """The store ``[store]`` names, not opened yet (``await store.open()`` does that)."""
    flush_interval_s = config.flush_interval_ms / 1000
    if config.backend == "redis":
        # Imported here: coredis takes a third of a second to import, which an
        # SQLite gateway (and every test of one) need not pay.
        from gateway.store.redis.store import RedisStore

        return RedisStore(config.url, flush_interval_s=flush_interval_s)
    # Ids above the clock: they do not go backwards even if the file is lost (docs/protocol.md §15).
    return SqliteStore(config.path, flush_interval_s=flush_interval_s, ids_above_clock=True)

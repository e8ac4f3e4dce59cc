"""The trace store: its interface (:mod:`.base`) and its two backends.

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

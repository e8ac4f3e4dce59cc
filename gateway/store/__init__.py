"""The trace store: its interface (:mod:`.base`) and the embedded SQLite backend."""

from gateway.store.base import SessionRecord, Store, StoredEvent, StoredMessage, StoreState
from gateway.store.sqlite import SqliteStore

__all__ = [
    "SessionRecord",
    "SqliteStore",
    "Store",
    "StoreState",
    "StoredEvent",
    "StoredMessage",
]

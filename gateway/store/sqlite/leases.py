"""The session leases of a node alone on its SQLite store (gateway.store.lease)."""

from __future__ import annotations

from collections.abc import Sequence

from gateway.store.lease import Taken


class LocalLeases:
    """The leases of a node that is alone on its store (SQLite): all of them are its own."""

    shared = False

    def __init__(self, node_id: str, ttl_ms: int) -> None:
        self.node_id = node_id
        self.ttl_ms = ttl_ms

    async def acquire(self, session_id: str) -> Taken | None:
        return Taken()

    async def renew(self, session_ids: Sequence[str]) -> list[str]:
        return []

    async def release(self, session_ids: Sequence[str]) -> None:
        return None

    async def holder(self, session_id: str) -> str | None:
        return self.node_id

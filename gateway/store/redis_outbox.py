"""The webhook outbox of the Redis store: not built yet (docs/protocol.md §14).

A mixin of :class:`gateway.store.redis.RedisStore`. The config refuses
``[webhooks.NAME]`` with ``[store] backend = "redis"``, so the store never
routes an event here; should one ask, it says so.
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.errors import StoreError
from gateway.store.outbox import Lane, OutboxEntry

_NOT_BUILT = "the Redis store keeps no webhook outbox yet"


class RedisOutbox:
    """The outbox methods of :class:`gateway.store.base.Store` on Redis: refused."""

    async def outbox_lanes(self) -> list[Lane]:
        raise StoreError(_NOT_BUILT)

    async def outbox_lane(self, lane: Lane, after_seq: int, limit: int) -> list[OutboxEntry]:
        raise StoreError(_NOT_BUILT)

    async def outbox_depth(self) -> int:
        raise StoreError(_NOT_BUILT)

    async def outbox_delete(self, done: Sequence[OutboxEntry]) -> None:
        raise StoreError(_NOT_BUILT)

"""The webhook outbox: deliveries owed to receivers, durable (docs/doors/webhooks.md).

A catalog event that a configured webhook subscribes to is put in the outbox
in the same write as the event itself (the group commit's batch: one SQLite
transaction, one Redis ``MULTI``/``EXEC``), so a kill -9 between the commit
and the delivery loses nothing: the delivery loop (:mod:`gateway.webhooks`)
reads what is pending after a restart and carries on. An entry holds a copy of
the event's wire JSON, so a retention purge or a ``DELETE`` of the session
does not take a delivery owed away; it leaves the outbox once delivered, or
once dropped after the webhook's ``max_attempts``.

:data:`Routes` is how the store knows which events go there: event type ->
the names of the webhooks that want it, set once before the first write.
Each backend keeps the outbox its own way: :mod:`gateway.store.sqlite.outbox`
(a table), :mod:`gateway.store.redis.outbox` (a sorted set per lane, and the
lanes' claims: several nodes deliver).
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

Routes = Mapping[str, tuple[str, ...]]
"""Event type -> the webhooks (their ``[webhooks.NAME]``) that are sent it."""


class OutboxEntry(msgspec.Struct, frozen=True):
    """One delivery owed: event ``seq`` of ``session_id`` to webhook ``hook``."""

    hook: str
    seq: int
    session_id: str
    data: bytes  # the event's wire JSON, the POST's body


Lane = tuple[str, str]
"""(webhook, session id): the deliveries that go one at a time, in event order."""

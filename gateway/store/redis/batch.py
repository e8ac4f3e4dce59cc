"""A Redis batch: its rows, and the one ``MULTI``/``EXEC`` that writes them.

A record becomes its row when it is put (msgspec Structs are mutable: what is
stored is what the caller had at put time). :class:`Transaction` queues a
batch's commands in one transaction (gateway.store.redis.store's docstring:
fencing, the blocks of event ids), then reads Redis's answers: the rows it
refused on their own, and the top of each block it allocated.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import msgspec
from coredis.patterns.pipeline import Pipeline
from coredis.tokens import PureToken

from gateway.store.base import SessionRecord, StoredEvent, StoredMessage
from gateway.store.group_commit import Batch
from gateway.store.redis.keys import Keys
from gateway.store.redis.outbox import Delivery, delivery_row, queue_deliveries
from gateway.store.redis.scripts import ADD_EVENTS, PUT_SESSION, UPSERT_MESSAGES, session_write

_encoder = msgspec.msgpack.Encoder()

_MessageRow = tuple[str, str, bytes]  # (session, message id, encoded)
_EventRow = tuple[int, str, int, bytes]  # (seq, session, ts, member)


class RedisBatch(Batch):
    """The Redis rows of a batch (:class:`gateway.store.group_commit.Batch`)."""

    def __init__(self) -> None:
        super().__init__()
        self.sessions: list[tuple[SessionRecord, bytes]] = []
        self.messages: list[_MessageRow] = []
        self.events: list[_EventRow] = []
        self.blocks: list[tuple[int, Callable[[int], None]]] = []  # (size, granted)
        self.deliveries: list[Delivery] = []  # webhook deliveries (gateway.store.redis.outbox)

    def rows(self) -> tuple[list[Any], ...]:
        return (self.sessions, self.messages, self.events, self.blocks, self.deliveries)

    def add_session(self, rec: SessionRecord) -> None:
        self.sessions.append((msgspec.structs.replace(rec), _encoder.encode(rec)))
        self.size += 1

    def add_message(self, msg: StoredMessage) -> int:
        m = msg.message
        data = _encoder.encode(msg)
        self.messages.append((m.session_id, m.id, data))
        self.size += 1
        return len(data)

    def add_event(self, ev: StoredEvent) -> None:
        member = _encoder.encode((ev.seq, ev.type, ev.ts, ev.data))
        self.events.append((ev.seq, ev.session_id, ev.ts, member))
        self.size += 1

    def add_block(self, block: int, granted: Callable[[int], None]) -> None:
        self.blocks.append((block, granted))
        self.size += 1

    def add_outbox(self, hook: str, ev: StoredEvent, data: bytes | None = None) -> None:
        body = ev.data if data is None else data
        self.deliveries.append(delivery_row(hook, ev.session_id, ev.seq, body))
        self.outbox += 1


class Transaction:
    """One batch as the commands of one ``MULTI``, for the node ``node`` (its fence).

    :meth:`queue` queues them; :meth:`answered` reads Redis's answers.
    """

    def __init__(self, keys: Keys, node: str) -> None:
        self._keys = keys
        self._node = node
        self.rows: list[str] = []  # what each queued command writes, for a refusal's report
        self.owners: dict[int, str] = {}  # a fenced command's row -> the session it writes
        self.fenced: list[str] = []  # once answered: the sessions whose writes were dropped
        self._grants: list[tuple[int, Callable[[int], None]]] = []  # (result index, granted)

    def queue(self, p: Pipeline[bytes], batch: RedisBatch) -> None:
        """Queue every row of ``batch`` in the ``MULTI`` ``p``."""
        k, node, rows = self._keys, self._node, self.rows
        for rec, data in batch.sessions:
            p.eval(PUT_SESSION, *session_write(k, rec, data, node))
            self._row(f"session {rec.id}", rec.id)
        self._queue_messages(p, batch.messages)
        self._queue_events(p, batch.events)
        # Their webhook deliveries: the same MULTI, the same fence.
        first = len(rows)
        for i, sid in enumerate(queue_deliveries(p, k, batch.deliveries, node, rows)):
            self.owners[first + i] = sid
        for block, granted in batch.blocks:
            p.zincrby(k.meta, "event_ceiling", block)
            self._grants.append((len(rows), granted))
            rows.append(f"a block of {block} event ids")
        ceiling = max([batch.ceiling or 0, *(seq for seq, *_ in batch.events)])
        if ceiling:
            p.zadd(k.meta, {"event_ceiling": ceiling}, comparison=PureToken.GT)
            rows.append("event ceiling")

    # One script per session for its messages, and one for its events,
    # however many: a command costs far more than a member (the figures
    # in docs/performance.md; a tool turn writes a message at every block's end).

    def _queue_messages(self, p: Pipeline[bytes], rows: Sequence[_MessageRow]) -> None:
        k = self._keys
        by_session: dict[str, list[str | bytes]] = {}
        for sid, mid, data in rows:
            by_session.setdefault(sid, [self._node]).extend((mid, data))
        for sid, upserts in by_session.items():
            keys = [k.lease(sid), k.messages(sid), k.message_order(sid)]
            p.eval(UPSERT_MESSAGES, keys, upserts)
            self._row(f"{len(upserts) // 2} messages of {sid}", sid)

    def _queue_events(self, p: Pipeline[bytes], rows: Sequence[_EventRow]) -> None:
        k = self._keys
        by_session: dict[str, list[str | bytes | int]] = {}
        seqs: dict[str, list[int]] = {}
        for seq, sid, ts, member_bytes in rows:
            by_session.setdefault(sid, [self._node, sid]).extend((seq, member_bytes, ts))
            seqs.setdefault(sid, []).append(seq)
        for sid, events in by_session.items():
            p.eval(ADD_EVENTS, [k.lease(sid), k.events(sid), k.ets], events)
            self._row(f"events {min(seqs[sid])}..{max(seqs[sid])} of {sid}", sid)

    def _row(self, what: str, session_id: str) -> None:
        """A queued command fenced by ``session_id``'s lease."""
        self.owners[len(self.rows)] = session_id
        self.rows.append(what)

    def answered(self, results: Sequence[Any]) -> list[str]:
        """The rows Redis refused on their own, given its answers; each block's grant is told.

        The sessions whose writes the fence dropped are in :attr:`fenced`.
        """
        refused: dict[str, None] = {}
        fenced: dict[str, None] = {}
        for row, (what, result) in enumerate(zip(self.rows, results, strict=False)):
            if isinstance(result, Exception):
                refused[f"{what}: {result}"] = None
            elif isinstance(result, list):  # fenced: the lease is another node's
                holder = result[0].decode() if isinstance(result[0], bytes) else result[0]
                refused[f"{what}: its lease is {holder}'s, not this node's"] = None
                fenced[self.owners[row]] = None
        self.fenced = list(fenced)
        for index, granted in self._grants:
            top = results[index] if index < len(results) else None
            if isinstance(top, int | float | bytes | str):
                granted(int(float(top)))
        return list(refused)

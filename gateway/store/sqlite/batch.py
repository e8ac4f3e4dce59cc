"""A SQLite batch's rows, and the statements that write them (gateway.store.group_commit).

A record becomes its row when it is put (msgspec Structs are mutable: what is
stored is what the caller had at put time); the writer applies the rows in
one transaction (:meth:`gateway.store.sqlite.database.Database.write`).
"""

from __future__ import annotations

from typing import Any

import msgspec

from gateway.store.base import (
    PushConfig,
    QueuedTurn,
    Rewind,
    SessionRecord,
    StoredEvent,
    StoredMessage,
)
from gateway.store.group_commit import Batch
from gateway.store.sqlite import outbox

SESSION_COLUMNS = (
    "id, created_at, workspace_path, active_model, metadata, parent_session_id,"
    " routing_policy_version, cost_so_far_usd, turn_count, current_turn_id, current_turn_seq,"
    " owner, agent, queued_turns, rewinds, push_configs"
)
UPSERT_SESSION = f"""
    INSERT INTO sessions ({SESSION_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
    ON CONFLICT (id) DO UPDATE SET
        created_at = excluded.created_at,
        workspace_path = excluded.workspace_path,
        active_model = excluded.active_model,
        metadata = excluded.metadata,
        parent_session_id = excluded.parent_session_id,
        routing_policy_version = excluded.routing_policy_version,
        cost_so_far_usd = excluded.cost_so_far_usd,
        turn_count = excluded.turn_count,
        current_turn_id = excluded.current_turn_id,
        current_turn_seq = excluded.current_turn_seq,
        agent = excluded.agent,
        queued_turns = excluded.queued_turns,
        rewinds = excluded.rewinds,
        push_configs = excluded.push_configs
    WHERE sessions.owner = excluded.owner
"""
# A session's owner is its own from its first write: the upsert above never
# changes it (another owner's row is left whole), and a new session named by
# its client is inserted only where no row has its id (Store.insert_session),
# one transaction that tells which.
INSERT_SESSION = UPSERT_SESSION.split("ON CONFLICT")[0] + "ON CONFLICT (id) DO NOTHING"
# An upsert keeps the row, hence its ord: a rewritten message keeps its place.
UPSERT_MESSAGE = """
    INSERT INTO messages (session_id, id, data, complete_event_id, stop_reason, complete_ts)
    VALUES (?, ?, ?, ?, ?, ?)
    ON CONFLICT (session_id, id) DO UPDATE SET
        data = excluded.data,
        complete_event_id = excluded.complete_event_id,
        stop_reason = excluded.stop_reason,
        complete_ts = excluded.complete_ts
"""
INSERT_EVENT = "INSERT INTO events (seq, session_id, type, ts, data) VALUES (?, ?, ?, ?, ?)"

_encoder = msgspec.json.Encoder()
_metadata_decoder = msgspec.json.Decoder(dict[str, Any])
_queued_decoder = msgspec.json.Decoder(list[QueuedTurn])
_rewinds_decoder = msgspec.json.Decoder(list[Rewind])
_push_decoder = msgspec.json.Decoder(list[PushConfig])

_SessionRow = tuple[
    str,
    int,
    str,
    str,
    bytes,
    str | None,
    str,
    float,
    int,
    str | None,
    int,
    str,
    str,
    bytes,
    bytes,
    bytes,
]
_MessageRow = tuple[str, str, bytes, str | None, str | None, int | None]
_EventRow = tuple[int, str, str, int, bytes]


class SqliteBatch(Batch):
    """The SQLite rows of a batch (:class:`gateway.store.group_commit.Batch`)."""

    def __init__(self) -> None:
        super().__init__()
        self.sessions: list[_SessionRow] = []
        self.messages: list[_MessageRow] = []
        self.events: list[_EventRow] = []
        self.deliveries: list[outbox.OutboxRow] = []

    def rows(self) -> tuple[list[Any], ...]:
        return (self.sessions, self.messages, self.events, self.deliveries)

    def add_session(self, rec: SessionRecord) -> None:
        self.sessions.append(session_row(rec))
        self.size += 1

    def add_message(self, msg: StoredMessage) -> int:
        m = msg.message
        data = _encoder.encode(m)
        self.messages.append(
            (m.session_id, m.id, data, msg.complete_event_id, msg.stop_reason, msg.complete_ts)
        )
        self.size += 1
        return len(data)

    def add_event(self, ev: StoredEvent) -> None:
        self.events.append((ev.seq, ev.session_id, ev.type, ev.ts, ev.data))
        self.size += 1

    def add_outbox(self, hook: str, ev: StoredEvent, data: bytes | None = None) -> None:
        self.deliveries.append((hook, ev.seq, ev.session_id, ev.data if data is None else data))
        self.outbox += 1


def session_row(rec: SessionRecord) -> _SessionRow:
    return (
        rec.id,
        rec.created_at,
        rec.workspace_path,
        rec.active_model,
        _encoder.encode(rec.metadata),
        rec.parent_session_id,
        rec.routing_policy_version,
        rec.cost_so_far_usd,
        rec.turn_count,
        rec.current_turn_id,
        rec.current_turn_seq,
        rec.owner,
        rec.agent,
        _encoder.encode(rec.queued_turns),
        _encoder.encode(rec.rewinds),
        _encoder.encode(rec.push_configs),
    )


def session_record(row: tuple[Any, ...]) -> SessionRecord:
    (id_, created, workspace, model, metadata, parent, policy, cost, turns, turn_id, seq, owner,
     agent, queued, rewinds, push) = row  # fmt: skip
    return SessionRecord(
        id=id_,
        created_at=created,
        workspace_path=workspace,
        active_model=model,
        metadata=_metadata_decoder.decode(metadata),
        parent_session_id=parent,
        routing_policy_version=policy,
        cost_so_far_usd=cost,
        turn_count=turns,
        current_turn_id=turn_id,
        current_turn_seq=seq,
        owner=owner,
        agent=agent,
        queued_turns=_queued_decoder.decode(queued),
        rewinds=_rewinds_decoder.decode(rewinds),
        push_configs=_push_decoder.decode(push),
    )

"""Where a turn starts in its session's events: the id a replay of the whole turn begins after.

A front end that streams one turn (an AG-UI run, an AI SDK chat response)
re-attaches by replaying the session's events after this id
(docs/doors/agui.md, docs/doors/aisdk.md): the id before the turn's ``turn.started``, read from
the session's in-memory tail, else from the store (after an unload or a
restart; above the retention floor only).
"""

from __future__ import annotations

import contextlib

import msgspec

from gateway.session.session import Session
from gateway.store.base import StoredEvent, each_event_after


class _TurnOf(msgspec.Struct):
    turn_id: str | None = None


_turn_of = msgspec.json.Decoder(_TurnOf)


class _Found(Exception):
    def __init__(self, seq: int) -> None:
        self.seq = seq


def tail_turn_start(session: Session, turn_id: str) -> int | None:
    """The id before the turn's ``turn.started``, if the session's tail still holds it."""
    for em in reversed(session.tail):
        if em.type == "turn.started" and em.turn_id == turn_id:
            return em.seq - 1
    return None


async def turn_starts(session: Session, turn_ids: list[str]) -> dict[str, int]:
    """:func:`turn_start` of several turns at once: one read of the store at most."""
    found = {t: s for t in turn_ids if (s := tail_turn_start(session, t)) is not None}
    wanted = set(turn_ids) - found.keys()
    if not wanted:
        return found
    node = session.node

    def take(row: StoredEvent) -> None:
        if row.type == "turn.started":
            turn_id = _turn_of.decode(row.data).turn_id
            if turn_id in wanted:
                found[turn_id] = row.seq - 1
                wanted.discard(turn_id)
                if not wanted:
                    raise _Found(row.seq)

    with contextlib.suppress(_Found):  # every start found: the rest is not read
        await each_event_after(node.store, [session.id], node.retention_floor, take)
    return found


async def turn_start(session: Session, turn_id: str) -> int | None:
    """The id before the turn's ``turn.started``: the tail's, else the store's (None: gone)."""
    found = tail_turn_start(session, turn_id)
    if found is not None:
        return found
    node = session.node

    def take(row: StoredEvent) -> None:
        if row.type == "turn.started" and _turn_of.decode(row.data).turn_id == turn_id:
            raise _Found(row.seq - 1)

    try:
        await each_event_after(node.store, [session.id], node.retention_floor, take)
    except _Found as hit:
        return hit.seq
    return None

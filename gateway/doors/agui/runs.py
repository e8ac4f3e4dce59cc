"""The AG-UI runs a router answered, found again to re-attach to them (docs/doors/agui.md).

A run that starts a turn is found from the store, so a re-attach works after
the session was unloaded or the node restarted: the turn's user message has
an id made of the thread and the run id (:func:`user_message_id`), so the
stored conversation says which turn the run is, what history its
``MESSAGES_SNAPSHOT`` showed (the messages before that one) and when it
started (the message's ``created_at``); the run's start is the id before the
turn's ``turn.started`` (from the session's tail, or read from the store).
A run that resumed a turn's interrupts starts no turn: it is known to this
router's memory only (:class:`RunBook`, the last :data:`MAX_RECORDS` runs).
A remembered run is the session's only while its turn is one of the
session's messages' turns, or one of its queued turns (waiting, in no message
yet): a session deleted (``DELETE /sessions/{id}``) takes its runs with it,
even when its id names a new session since.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Collection
from typing import TYPE_CHECKING

from gateway.doors.agui.resume import RunRecord
from gateway.ids import new_message_id
from gateway.protocol.shapes import Message
from gateway.session.session import Session
from gateway.session.turn_start import tail_turn_start, turn_start

if TYPE_CHECKING:
    from gateway.node import Node

MAX_RECORDS = 10_000
"""The runs a router remembers (the oldest forgotten first; a turn's run is found again)."""


def user_message_id(thread_id: str, run_id: str) -> str:
    """The id of the user message of the turn a run starts (module docstring)."""
    digest = hashlib.sha256(f"agui\0{thread_id}\0{run_id}".encode()).hexdigest()
    return f"msg_{digest[:20]}"


class RunBook:
    """The runs a router answered, by (thread, run id) (module docstring)."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self._records: OrderedDict[tuple[str, str], RunRecord] = OrderedDict()

    def message_id(self, thread_id: str, run_id: str, history: list[Message]) -> str:
        """The new turn's user message id: the run's, unless the thread has it already.

        A client that sends a run id twice on a thread gets a fresh id the second
        time (that run is then found in memory only).
        """
        mid = user_message_id(thread_id, run_id)
        return new_message_id() if any(m.id == mid for m in history) else mid

    def start_of(self, session: Session, turn_id: str, fallback: int) -> int:
        """The id before the turn's ``turn.started``, from the session's tail, else ``fallback``."""
        found = tail_turn_start(session, turn_id)
        return fallback if found is None else found

    def recall(self, thread_id: str, run_id: str) -> RunRecord | None:
        """The run's record, if this router answered it and still remembers it (memory only)."""
        return self._records.get((thread_id, run_id))

    def remember(self, thread_id: str, run_id: str, record: RunRecord) -> None:
        key = (thread_id, run_id)
        self._records[key] = record
        self._records.move_to_end(key)
        while len(self._records) > MAX_RECORDS:
            self._records.popitem(last=False)

    async def find(
        self,
        session: Session,
        run_id: str,
        messages: list[Message],
        queued: Collection[str] = (),
    ) -> RunRecord | None:
        """The run's record: remembered, or made again from the store (module docstring).

        Args:
            messages: the session's conversation (``Node.messages_of``).
            queued: the ids of its queued turns (a queued run's turn is in no message).
        """
        key = (session.id, run_id)
        record = self._records.get(key)
        if record is not None:
            if record.turn_id in queued or any(m.turn_id == record.turn_id for m in messages):
                return record
            del self._records[key]  # a deleted session's, whose id was made again since
        mid = user_message_id(session.id, run_id)
        index = next((i for i, m in enumerate(messages) if m.id == mid), None)
        if index is None or messages[index].turn_id is None:
            return None
        message = messages[index]
        turn_id = message.turn_id
        assert turn_id is not None
        start = await turn_start(session, turn_id)
        if start is None:
            return None
        record = RunRecord(turn_id, start, index, message.created_at, message.id)
        self.remember(session.id, run_id, record)
        return record

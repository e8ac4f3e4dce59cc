"""A session's conversation as the store holds it, read back when it is loaded.

Each message, when each assistant message was completed (a replay rebuilds
its ``message.complete`` with its original id, docs/protocol.md §3), and each
message's size as the store encodes it (``max_session_mb``, docs/protocol.md §15).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import msgspec

from gateway.ids import parse_event_id
from gateway.protocol.shapes import Message
from gateway.session.call import Completion
from gateway.store.base import StoredMessage

_size_encoder = msgspec.json.Encoder()  # a loaded message's size, as SQLite stores it


@dataclass
class History:
    """The conversation as stored (:func:`read`)."""

    messages: list[Message] = field(default_factory=list)
    completions: dict[str, Completion] = field(default_factory=dict)
    message_bytes: dict[str, int] = field(default_factory=dict)
    # The last ts stamped (docs/protocol.md §4: never goes backwards within a
    # session); after a load, the newest completion known is the floor.
    last_ts: int = 0


def read(stored: Iterable[StoredMessage]) -> History:
    """The conversation as stored, when each assistant message was completed, and its size."""
    history = History()
    for sm in stored:
        history.messages.append(sm.message)
        history.message_bytes[sm.message.id] = len(_size_encoder.encode(sm.message))
        if sm.complete_event_id and sm.stop_reason and sm.complete_ts is not None:
            seq = parse_event_id(sm.complete_event_id)
            if seq is not None:
                history.completions[sm.message.id] = Completion(seq, sm.complete_ts, sm.stop_reason)
                history.last_ts = max(history.last_ts, sm.complete_ts)
    return history

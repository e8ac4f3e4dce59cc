"""A session's conversation as the store holds it, read back when it is loaded.

Each message, when each assistant message was completed (a replay rebuilds
its ``message.complete`` with its original id, docs/protocol.md §3), and each
message's size as the store encodes it (``max_session_mb``, docs/protocol.md §15).
The session record's rewinds (docs/protocol.md §2 "Edit and regenerate") say
which stored messages are rewound (:func:`gateway.session.rewind.split`): they
are kept apart from the conversation, and counted and completed all the same
(they stay stored, and a replay may rebuild their ``message.complete``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import msgspec

from gateway.ids import parse_event_id
from gateway.protocol.shapes import Message
from gateway.session import rewind
from gateway.session.call import Completion
from gateway.store.base import Rewind, StoredMessage

_size_encoder = msgspec.json.Encoder()  # a loaded message's size, as SQLite stores it


@dataclass
class History:
    """The conversation as stored (:func:`read`)."""

    messages: list[Message] = field(default_factory=list)  # the conversation (not rewound)
    rewound: list[Message] = field(default_factory=list)  # its rewound messages
    completions: dict[str, Completion] = field(default_factory=dict)
    message_bytes: dict[str, int] = field(default_factory=dict)
    # The last ts stamped (docs/protocol.md §4: never goes backwards within a
    # session); after a load, the newest completion known is the floor.
    last_ts: int = 0

    def parts(
        self,
    ) -> tuple[list[Message], list[Message], dict[str, Completion], dict[str, int], int]:
        """Its fields, in order, for the session that takes them."""
        return self.messages, self.rewound, self.completions, self.message_bytes, self.last_ts


def read(stored: Iterable[StoredMessage], rewinds: Sequence[Rewind] = ()) -> History:
    """The conversation as stored, its rewinds applied; when each assistant message was
    completed, and each message's size (rewound ones included)."""
    history = History()
    every: list[Message] = []
    for sm in stored:
        every.append(sm.message)
        history.message_bytes[sm.message.id] = len(_size_encoder.encode(sm.message))
        if sm.complete_event_id and sm.stop_reason and sm.complete_ts is not None:
            seq = parse_event_id(sm.complete_event_id)
            if seq is not None:
                history.completions[sm.message.id] = Completion(seq, sm.complete_ts, sm.stop_reason)
                history.last_ts = max(history.last_ts, sm.complete_ts)
    history.messages, history.rewound = rewind.split(every, rewinds)
    return history

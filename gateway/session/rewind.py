"""Edit and regenerate: a turn that rewinds the conversation (docs/protocol.md §2).

``POST .../turns`` with ``rewind_to``, the id of one of the session's user
messages: the conversation goes on from the history before that message, then
the turn's own. The messages from that one on are *rewound*: they stay stored
(and counted in ``max_session_mb``), readable with ``GET .../messages?
include_rewound=true`` and by id, but they leave every view.

Three steps, each here:

1. :func:`check`, when the turn is submitted (:meth:`Session.submit_turn`):
   ``message_not_found`` for an id the session does not hold (another
   session's id included), ``message_rewound`` for one already rewound,
   ``not_a_user_message`` for an assistant's, a ``context`` message or a user
   message of tool results only.
2. :func:`apply`, when the turn starts (the agent loop, right before
   ``turn.started``, in the same synchronous step, so in the same commit):
   ``history.rewound`` is emitted, a :class:`~gateway.store.base.Rewind` is
   added to the session record (saved with ``turn.started``), and the messages
   from that one on move from ``session.messages`` (the conversation: what the
   model is sent, what the snapshot and ``GET .../messages`` show) to
   ``session.rewound`` (kept in memory, as they were before: a replay spanning
   the rewind rebuilds their ``message.complete``, a permission of theirs is
   still told apart from an unknown one).
3. :func:`split`, when a session is loaded (a restart, a failover, an unloaded
   session used again: gateway.session.history): which stored messages are
   rewound, from the stored order and the record's rewinds alone
   (:func:`hidden`), so every node finds the same branch.

What a rewind hides (:func:`hidden`), decided here: in the stored order, from
its ``before_message_id`` up to (not including) the first message of the turn
that rewound, its user message. That is exactly what the conversation held
from that message on when the turn started, since the store keeps each
message where it was first put and the turn's user message is put last.
Rewinds nest: a later one may hide messages of an earlier one's turn, and
those an earlier one hid stay hidden. A compaction's ``context`` message
(docs/protocol.md §12) stored after ``before_message_id`` is rewound with the
rest: the model then sees the history before that message uncompacted (a
later call compacts it again if it must); one stored before it stays, and so
does what it replaces, which it only names when stored before it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Protocol

from gateway.errors import Refused
from gateway.logs import event
from gateway.protocol.events import HistoryRewound, Payload, StreamEvent
from gateway.protocol.shapes import Message, ToolResultBlock
from gateway.session.hub import Emitted
from gateway.session.turn import Turn
from gateway.store.base import Rewind, SessionRecord, Store

log = logging.getLogger("gateway.session")


class Conversation(Protocol):
    """What a rewind uses of its session (:class:`gateway.session.session.Session`)."""

    @property
    def id(self) -> str: ...

    record: SessionRecord
    messages: list[Message]  # the conversation as the views show it
    rewound: list[Message]  # its rewound messages (module docstring)

    def emit(self, payloads: Iterable[Payload | StreamEvent], turn_id: str | None) -> list[Emitted]:
        """Emit a batch of events in the session's stream."""
        ...


def is_user_message(message: Message) -> bool:
    """A message a person wrote (a turn's, or a steer's): ``role: "user"`` with a block that
    is not a tool result (text, an image, a document: a turn's content may be an image
    alone, docs/protocol.md §2), not a user message that only carries tool results."""
    return message.role == "user" and any(
        not isinstance(b, ToolResultBlock) for b in message.content
    )


class Holder(Protocol):
    """What :func:`check` reads of a session: its conversation and its rewound messages."""

    @property
    def id(self) -> str: ...

    @property
    def messages(self) -> Sequence[Message]: ...

    @property
    def rewound(self) -> Sequence[Message]: ...


def check(session: Holder, message_id: str | None, new_id: str | None = None) -> None:
    """Whether a turn may rewind to ``message_id`` (``None``: no rewind, nothing to check),
    and whether its user message, ``new_id``, may join the conversation.

    A door that names a user message after its client's id (the AI SDK's, AG-UI's)
    may send one a rewind took out (a client's view older than the session's):
    stored already, in its place, it is refused ``message_rewound``, never stored
    again where it would rejoin the conversation.

    Raises:
        Refused: ``message_not_found``, ``message_rewound``, ``not_a_user_message``.
    """
    if new_id is not None and any(m.id == new_id for m in session.rewound):
        raise Refused(
            "message_rewound",
            f"message {new_id} of {session.id} was rewound: the client's view of the session"
            " is older than the session; load it again",
        )
    if message_id is None:
        return
    target = next((m for m in session.messages if m.id == message_id), None)
    if target is None:
        if any(m.id == message_id for m in session.rewound):
            raise Refused(
                "message_rewound",
                f"message {message_id} of {session.id} was rewound already: rewind to a"
                " message of the history as it is now",
            )
        raise Refused("message_not_found", f"no message {message_id!r} in {session.id}")
    if not is_user_message(target):
        raise Refused(
            "not_a_user_message",
            f"message {message_id} of {session.id} is not a user's message ({target.role}):"
            " a turn rewinds to a user message",
        )


def apply(session: Conversation, turn: Turn) -> None:
    """Rewind the conversation for a turn that starts now, if it asks to (module docstring).

    Call right before the turn's user message is added and its ``turn.started``
    emitted, in the same synchronous step; the caller saves the record. A
    target that is no longer a user message of the conversation (nothing
    between :func:`check` and here changes it; a bug if so) is logged and the
    turn goes on without a rewind.
    """
    message_id = turn.rewind_to
    if message_id is None:
        return
    messages = session.messages
    at = next((i for i, m in enumerate(messages) if m.id == message_id), None)
    if at is None or not is_user_message(messages[at]):
        event(
            log, logging.ERROR, "rewind_skipped",
            f"turn {turn.id}: {message_id} is no longer a user message of the conversation;"
            " the turn goes on without a rewind",
            session_id=session.id, turn_id=turn.id,
        )  # fmt: skip
        turn.rewind_to = None
        return
    session.rewound.extend(messages[at:])
    del messages[at:]
    # A new list: the record's list may be a stored record's (never changed in place).
    session.record.rewinds = [*session.record.rewinds, Rewind(message_id, turn.id)]
    session.emit([HistoryRewound(message_id, turn.id)], turn.id)


def hidden(messages: Sequence[Message], rewinds: Sequence[Rewind]) -> set[str]:
    """The ids of the rewound messages (module docstring), pure.

    Args:
        messages: every stored message of the session, in the stored order.
        rewinds: the record's rewinds, oldest first. One whose message is not
            among ``messages`` hides nothing; one whose turn's user message is
            not (it always is: both are written in one commit) hides to the end.
    """
    position = {m.id: i for i, m in enumerate(messages)}
    out: set[str] = set()
    for rewind in rewinds:
        start = position.get(rewind.before_message_id)
        if start is None:
            continue
        end = next(
            (i for i in range(start + 1, len(messages)) if messages[i].turn_id == rewind.turn_id),
            len(messages),
        )
        out.update(m.id for m in messages[start:end])
    return out


def split(
    messages: Sequence[Message], rewinds: Sequence[Rewind]
) -> tuple[list[Message], list[Message]]:
    """The conversation and the rewound messages, each in the stored order (:func:`hidden`)."""
    gone = hidden(messages, rewinds) if rewinds else set()
    return [m for m in messages if m.id not in gone], [m for m in messages if m.id in gone]


async def stored(
    store: Store, session_id: str, rewinds: Sequence[Rewind] | None = None
) -> tuple[list[Message], set[str]]:
    """Every message the store holds of a session, in the stored order, and the ids of the
    rewound ones (``GET .../messages?include_rewound=true``, docs/protocol.md §2).

    ``rewinds``: the session's (where it runs here); ``None``: its stored record's,
    read after the messages, so a rewind committed in between hides what it hid.

    Raises:
        StoreError: the store did not answer.
    """
    messages = [sm.message for sm in await store.load_messages(session_id)]
    if rewinds is None:
        record = await store.get_session(session_id)
        rewinds = record.rewinds if record is not None else []
    return messages, hidden(messages, rewinds)


async def stored_conversation(store: Store, session_id: str) -> list[Message]:
    """The conversation as the store holds it: its messages less the rewound ones.

    Raises:
        StoreError: the store did not answer.
    """
    messages, gone = await stored(store, session_id)
    return [m for m in messages if m.id not in gone]


__all__ = [
    "Conversation",
    "Holder",
    "apply",
    "check",
    "hidden",
    "is_user_message",
    "split",
    "stored",
    "stored_conversation",
]

"""The operations one node asks of the node that runs a session, and their answers.

docs/scale-out.md: whatever acts on a session (a turn, a cancel, a permission
decision, feedback, a snapshot or replay's cut...) runs on the node holding
its lease. Each operation and each answer is a tagged msgspec Struct, so the
owner dispatches with ``match`` (:func:`gateway.node.placement.perform`) and
the type checker names an operation left unhandled. Nodes of one build talk
to each other: the shapes are not versioned.
"""

from __future__ import annotations

from typing import Any, Literal, TypeVar

import msgspec

from gateway.errors import Refused
from gateway.protocol.http import ForkCreated, IfBusy
from gateway.protocol.shapes import Message, SessionSummary

# --- operations ------------------------------------------------------------------------


class Watch(msgspec.Struct, tag="watch"):
    """A replica has clients of the session's family: publish its live batches."""


class StartTurn(msgspec.Struct, tag="turn"):
    """``POST .../turns``: start a turn; answered once it is accepted (durable).

    ``trace``: the W3C trace context its request came with (``traceparent``,
    ``tracestate``: gateway.telemetry), so that the turn's spans join the
    client's trace on whichever node runs it; empty when traces are off.
    """

    message: Message
    trace: dict[str, str] = {}
    # docs/protocol.md §2 "A busy session" and "Edit and regenerate".
    if_busy: IfBusy = "reject"
    rewind_to: str | None = None


class CancelTurn(msgspec.Struct, tag="cancel"):
    """Cancel the turn in flight (docs/protocol.md §8)."""

    turn_id: str
    reason: str
    requested_by: str


class DecidePermission(msgspec.Struct, tag="permission"):
    """Resolve a pending permission request (docs/protocol.md §2)."""

    perm_id: str
    decision: str
    content: dict[str, Any] | None = None


class RecordFeedback(msgspec.Struct, tag="feedback"):
    """``POST .../feedback``: emit ``feedback.recorded``."""

    message_id: str
    rating: Literal[-1, 1]
    comment: str | None


class Compact(msgspec.Struct, tag="compact"):
    """``POST .../compact`` (docs/protocol.md §12)."""


class DeleteSession(msgspec.Struct, tag="delete"):
    """``DELETE /sessions/{id}``: the session and its workers, for good (docs/protocol.md §13)."""


class ChangePushConfig(msgspec.Struct, tag="push"):
    """An A2A push config of one of the session's tasks put, replacing the task's config of
    its ``id`` (at most ``max_configs`` of tasks in flight or queued), or deleted (``url``
    empty): docs/doors/a2a.md "Push notifications"."""

    turn_id: str
    id: str
    url: str = ""
    token: str = ""
    max_configs: int = 0


class Fork(msgspec.Struct, tag="fork"):
    """``POST /sessions/{id}/fork``: a fork of the session, made where the session runs (its
    turn, messages, workspace and Claude Code transcript are there: docs/protocol.md §2)."""

    fork_id: str  # chosen first (kept with an Idempotency-Key)
    at_message_id: str | None
    owner: str  # the caller's key id: the fork's owner


class Warn(msgspec.Struct, tag="warn"):
    """Emit ``bus.handler_warning`` (a replica's slow client, docs/protocol.md sections 3 and 8)."""

    subscription: str
    reason: str
    detail: str


class Unregistered(msgspec.Struct, tag="unregistered"):
    """Emit ``bus.subscriber_unregistered`` for a replica's client."""

    name: str
    reason: str


class State(msgspec.Struct, tag="state"):
    """The session's summary as its owner sees it (its turn, its pending permissions)."""


class TakeSnapshot(msgspec.Struct, tag="snapshot"):
    """A snapshot's frame and cut (docs/protocol.md §3), of the ``limit`` last messages."""

    limit: int


class Replay(msgspec.Struct, tag="replay"):
    """A replay's frames and cut: ``frame`` is the client's ``subscribe`` frame itself."""

    frame: bytes
    max_events: int


Operation = (
    Watch
    | StartTurn
    | CancelTurn
    | DecidePermission
    | RecordFeedback
    | Compact
    | DeleteSession
    | Fork
    | ChangePushConfig
    | Warn
    | Unregistered
    | State
    | TakeSnapshot
    | Replay
)

# --- answers ---------------------------------------------------------------------------


class Done(msgspec.Struct, tag="done"):
    """The operation was carried out; nothing to return."""


class Summary(msgspec.Struct, tag="summary"):
    """The answer to :class:`State`."""

    summary: SessionSummary


class Forked(msgspec.Struct, tag="forked"):
    """The answer to :class:`Fork`: what ``POST /sessions/{id}/fork`` answers."""

    fork: ForkCreated


class Snapshot(msgspec.Struct, tag="snapshot"):
    """The answer to :class:`TakeSnapshot`: the frame's JSON and its cut."""

    data: bytes
    cut: int


class Replayed(msgspec.Struct, tag="replayed"):
    """The answer to :class:`Replay`: the event frames in id order and the cut."""

    frames: list[bytes]
    cut: int


class ReplayRejected(msgspec.Struct, tag="replay_rejected"):
    """The answer to :class:`Replay` that is a ``subscribe_error`` (docs/protocol.md §3)."""

    code: str
    message: str


class PushChanged(msgspec.Struct, tag="push_changed"):
    """The answer to :class:`ChangePushConfig`: ``""`` done, else ``too_many`` or
    ``not_found``."""

    problem: str = ""


class Refusal(msgspec.Struct, tag="refused"):
    """The owner refused: raised again on the asking node as the same ``Refused``."""

    code: str
    message: str
    retry_after_s: int | None = None


class TurnTaken(msgspec.Struct, tag="turn_taken"):
    """The answer to :class:`StartTurn`: the turn started, was queued (at ``position``),
    or steered into the running turn ``turn_id`` (docs/protocol.md §2 "A busy session")."""

    turn_id: str
    queued: bool = False
    position: int | None = None
    steered: bool = False


Answer = (
    Done
    | Summary
    | Snapshot
    | Replayed
    | ReplayRejected
    | Refusal
    | TurnTaken
    | Forked
    | PushChanged
)

A = TypeVar("A", Summary, Snapshot, TurnTaken, Forked, PushChanged)


def expect(answer: Answer, kind: type[A]) -> A:
    """The owner's answer, of the one kind its operation has.

    Raises:
        Refused: ``session_owner_unreachable``: the owner answered something
            else (a node of another build).
    """
    if not isinstance(answer, kind):
        raise Refused(
            "session_owner_unreachable",
            f"the node running the session answered {type(answer).__name__}, not {kind.__name__}",
        )
    return answer


__all__ = [
    "Answer",
    "CancelTurn",
    "Compact",
    "DecidePermission",
    "DeleteSession",
    "Done",
    "Fork",
    "Forked",
    "Operation",
    "RecordFeedback",
    "Refusal",
    "Replay",
    "ReplayRejected",
    "Replayed",
    "Snapshot",
    "StartTurn",
    "State",
    "Summary",
    "TakeSnapshot",
    "Unregistered",
    "Warn",
    "Watch",
    "expect",
]

"""A2A's tasks are turns, its contexts sessions (docs/doors/a2a.md "Tasks and contexts").

A task id is ``{session_id}.{turn_id}``: the session is the task's context
and the turn is the task, so a task is found from its id alone, with the
ownership every route of a session has (docs/protocol.md §2): another key's
task, a forged id (a turn of no such session), an id that is no task id are
all the one answer, task not found (:class:`TaskNotFound`), with the same
message. A turn is the session's while one of its messages is of that turn,
or while it is in flight or queued.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gateway.doors.context import CLIENT_ID, DoorContext
from gateway.errors import ApiError
from gateway.protocol.shapes import SessionSummary
from gateway.session.session import Session
from gateway.session.turn_start import turn_start

_TURN = re.compile(r"turn_[A-Za-z0-9_-]{1,100}")


class TaskNotFound(ApiError):
    """No task of that id for this caller (A2A's ``TaskNotFoundError``, -32001)."""

    def __init__(self, task_id: str) -> None:
        super().__init__(404, "task_not_found", f"no task {task_id[:200]!r}")


def task_id(session_id: str, turn_id: str) -> str:
    """The task of a turn (module docstring)."""
    return f"{session_id}.{turn_id}"


def parse_task_id(value: str) -> tuple[str, str] | None:
    """A task id's session and turn (None: not a task id)."""
    session_id, dot, turn_id = value.rpartition(".")
    if not dot or not CLIENT_ID.fullmatch(session_id) or not _TURN.fullmatch(turn_id):
        return None
    return session_id, turn_id


@dataclass
class FoundTask:
    """A task as its caller may see it: its session, turn, and the session's state."""

    id: str
    session: Session
    turn_id: str
    summary: SessionSummary
    known_start: int | None = None  # its start, read already (ListTasks: all in one read)

    @property
    def in_flight(self) -> bool:
        return self.summary.current_turn_id == self.turn_id

    @property
    def queued(self) -> bool:
        queued = self.summary.queued_turns
        return isinstance(queued, list) and any(q.turn_id == self.turn_id for q in queued)

    @property
    def waiting(self) -> bool:
        """In flight and waiting for an approval (``TASK_STATE_INPUT_REQUIRED``)."""
        return self.in_flight and bool(self.summary.pending_permissions)

    async def start(self) -> int | None:
        """The id before its turn's ``turn.started`` (None: not started, or no longer held)."""
        if self.queued:
            return None
        if self.known_start is not None:
            return self.known_start
        return await turn_start(self.session, self.turn_id)


async def find_task(ctx: DoorContext, caller: str | None, value: str) -> FoundTask:
    """The task ``value`` as ``caller`` may see it (module docstring).

    Raises:
        TaskNotFound: unknown, another key's, forged, or no task id at all.
    """
    parsed = parse_task_id(value)
    if parsed is None:
        raise TaskNotFound(value)
    session_id, turn_id = parsed
    try:
        session = await ctx.session(session_id, caller)
    except ApiError as exc:
        if exc.status == 404:
            raise TaskNotFound(value) from None
        raise
    summary = await ctx.node.live_summary(session)
    found = FoundTask(value, session, turn_id, summary)
    if found.in_flight or found.queued:
        return found
    messages = await ctx.node.messages_of(session)
    if not any(m.turn_id == turn_id for m in messages):
        raise TaskNotFound(value)
    return found

"""A task's stream, made of its turn's events, after a cursor (docs/doors/a2a.md), sans-IO.

A task is a turn (docs/protocol.md §7). :class:`TaskFeed` is fed the
session's events (live, or replayed from the turn's start through the seam,
docs/protocol.md §3) and makes the task's A2A events, each with a
**cursor**, the position a client resumes from:

- ``{event_id}.{chars}``: the gateway event it was made of (each makes one
  A2A event at most; the opening is at the feed's start, or at the cursor it
  resumed from), and how many characters of the reply's text the client
  holds with it.
- Status and file events are sent when their position is after the cursor's;
  the reply's text by its characters: a replay holds a completed message as
  its ``message.complete`` and one still streaming as a ``message.snapshot``
  (streaming-only events are not replayed), so a message the client saw in
  part comes again only from its first character the client lacks.
- The stream opens with the task (``Task``) as it stood at the cursor, then
  every event after it; it ends once the task is terminal, or waits for an
  answer (``TASK_STATE_INPUT_REQUIRED``, the queue drained and the approval
  still open).
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Any

from gateway.doors.a2a import shapes as a2
from gateway.doors.attachments import file_url
from gateway.ids import format_event_id, parse_event_id
from gateway.protocol.events import (
    Envelope,
    LlmCallFailed,
    MessageComplete,
    MessageSnapshot,
    PermissionRequested,
    PermissionResolved,
    TextDelta,
    ToolCompleted,
    TurnCancelled,
    TurnCompleted,
)
from gateway.protocol.shapes import TextBlock

_FROM_WORKERS = frozenset({"permission.requested", "permission.resolved"})

REPLY = "reply"
"""The artifact of the reply's text (one per task: every assistant message of the turn)."""


@dataclass(frozen=True)
class Cursor:
    """Where a client is in a task's stream (module docstring). ``chars`` None: whatever
    the reply's text holds at ``seq`` (the gateway's own continuation, never a client's)."""

    seq: int
    chars: int | None

    def __str__(self) -> str:
        return f"{format_event_id(self.seq)}.{self.chars or 0}"


def parse_cursor(value: str) -> Cursor | None:
    """A cursor as a client sends it back (None: not one)."""
    head, _, chars = value.strip().partition(".")
    seq = parse_event_id(head)
    if seq is None or not (chars.isascii() and chars.isdecimal() and len(chars) < 12):
        return None
    return Cursor(seq, int(chars))


def iso(ms: int) -> str:
    """An envelope's ``ts`` as protobuf's JSON writes a Timestamp (RFC 3339, UTC)."""
    when = datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC)
    return when.strftime("%Y-%m-%dT%H:%M:%S.") + f"{when.microsecond // 1000:03d}Z"


Out = tuple[Cursor, a2.StreamResponse]


class TaskFeed:
    """One task's A2A events after a cursor (module docstring).

    Args:
        task_id: the task's id (:func:`gateway.doors.a2a.tasks.task_id`).
        session_id: its context.
        turn_id: its turn.
        start: the feed's start: the id before the first event it is fed.
        cursor: what the client holds already (None: nothing).
        base: what a file's URL begins with (``[server] public_url``).
        state: the task's state at ``start``.
        history: the messages of the opening ``Task``.
        answered: approvals being answered by the request this feed streams (a
            replay's open approval among them does not end the stream).
    """

    def __init__(
        self,
        task_id: str,
        session_id: str,
        turn_id: str,
        start: int,
        cursor: Cursor | None = None,
        base: str = "",
        state: str = "TASK_STATE_SUBMITTED",
        history: list[a2.Message] | None = None,
        answered: frozenset[str] = frozenset(),
    ) -> None:
        self.task_id, self.session_id, self.turn_id = task_id, session_id, turn_id
        self.base = base
        self.cursor = cursor or Cursor(start, 0)
        self.skip = self.cursor.chars  # the reply's characters the client holds
        self.state = state
        self.status_message: a2.Message | None = None
        self.timestamp: str | None = None
        self.history = history
        self.text: list[str] = []  # the reply's text, in pieces
        self.total = 0
        self.seen: dict[str, int] = {}  # characters of each message taken
        self.files: list[a2.Artifact] = []
        self.pending: dict[str, PermissionRequested] = {}
        self.answered = answered
        self.started = False  # its turn.started seen: its workers' approvals are its own
        self.failure = ""
        self.opened = False
        self.finished = False
        self._seq = start

    # --- what the feed is given -------------------------------------------------------

    def receive(self, event: Envelope[Any]) -> list[Out]:
        """The A2A events made of one gateway event (none for another turn's)."""
        if self.finished or not self._ours(event):
            return []
        seq = parse_event_id(event.id)
        if seq is None:
            return []
        self._seq = seq
        if self.skip is None and seq > self.cursor.seq:
            self.skip = self.total  # the continuation: the text up to its cursor was seen
        p = event.payload
        if event.type == "turn.started":
            return self._status("TASK_STATE_WORKING", event.ts)
        if isinstance(p, TextDelta):
            return self._text(p.message_id, p.text)
        if isinstance(p, MessageComplete):
            return self._whole(p.message_id, "".join(_texts(p.final_content)))
        if isinstance(p, MessageSnapshot) and p.message.role == "assistant":
            return self._whole(p.message.id, "".join(_texts(p.message.content)))
        if isinstance(p, ToolCompleted) and p.files:
            return self._files(p)
        if isinstance(p, LlmCallFailed) and p.purpose != "sampling":  # its tool's (§11)
            self.failure = f"{p.error_class}: {p.message}"
        elif isinstance(p, PermissionRequested):
            self.pending[p.perm_id] = p
            return self._status("TASK_STATE_INPUT_REQUIRED", event.ts, _question(p))
        elif isinstance(p, PermissionResolved) and p.perm_id in self.pending:
            del self.pending[p.perm_id]
            if not self.pending:
                return self._status("TASK_STATE_WORKING", event.ts)
        elif isinstance(p, TurnCompleted):
            failed = p.stop_reason == "error"
            state = "TASK_STATE_FAILED" if failed else "TASK_STATE_COMPLETED"
            why = _agent_text(self.failure or "the turn failed") if failed else None
            out = self._status(state, event.ts, why)
            self.finished = True
            return out
        elif isinstance(p, TurnCancelled):
            out = self._status("TASK_STATE_CANCELED", event.ts, _agent_text(p.reason))
            self.finished = True
            return out
        return []

    def _ours(self, event: Envelope[Any]) -> bool:
        """The turn's own events, and, while it runs, its workers' approvals: a worker's
        ``permission.*`` reaches its ancestors' streams only (docs/protocol.md §5 "Worker
        sessions"), and a session runs one turn at a time, so they are this one's."""
        if event.session_id == self.session_id:
            if event.turn_id == self.turn_id and event.type == "turn.started":
                self.started = True
            return event.turn_id == self.turn_id
        return self.started and event.type in _FROM_WORKERS

    def pause(self) -> list[Out]:
        """The queue is drained: the opening if not yet sent; an open approval ends the stream."""
        if self.skip is None:
            self.skip = self.total
        out = self.open()
        if self.state == "TASK_STATE_INPUT_REQUIRED" and self.pending.keys() - self.answered:
            self.finished = True
        return out

    def open(self) -> list[Out]:
        """The opening ``Task``, as it stands now, unless it was sent (module docstring)."""
        if self.opened:
            return []
        self.opened = True
        at = Cursor(self.cursor.seq, self.total if self.skip is None else self.skip)
        task = a2.Task(
            id=self.task_id,
            context_id=self.session_id,
            status=self._task_status(),
            history=self.history,
            metadata={"cursor": str(at)},
        )
        return [(at, a2.StreamResponse(task=task))]

    # --- the task as it stands ----------------------------------------------------------

    def task(self, history: list[a2.Message] | None = None) -> a2.Task:
        """The whole task: its status, the reply so far and its files (``GetTask``)."""
        artifacts: list[a2.Artifact] = []
        text = "".join(self.text)
        if text:
            artifacts.append(a2.Artifact(artifact_id=REPLY, name=REPLY, parts=[a2.Part(text=text)]))
        artifacts += self.files
        return a2.Task(
            id=self.task_id,
            context_id=self.session_id,
            status=self._task_status(),
            artifacts=artifacts or None,
            history=history,
        )

    # --- the events made ---------------------------------------------------------------

    def _here(self) -> Cursor:
        """The cursor of the A2A event made of the current gateway event."""
        return Cursor(self._seq, self.total)

    def _task_status(self) -> a2.TaskStatus:
        return a2.TaskStatus(
            state=self.state, message=self.status_message, timestamp=self.timestamp
        )

    def _status(self, state: str, ts: int, message: a2.Message | None = None) -> list[Out]:
        at = self._here()
        # Sent after the cursor only; the opening first, as the task stood before it.
        opened = self.open() if at.seq > self.cursor.seq else None
        if message is not None:
            message.task_id, message.context_id = self.task_id, self.session_id
            message.message_id = message.message_id or f"status:{at.seq}"
        self.state, self.status_message, self.timestamp = state, message, iso(ts)
        if opened is None:
            return []
        update = a2.TaskStatusUpdateEvent(
            task_id=self.task_id,
            context_id=self.session_id,
            status=self._task_status(),
            metadata={"cursor": str(at)},
        )
        return [*opened, (at, a2.StreamResponse(status_update=update))]

    def _whole(self, message_id: str, full: str) -> list[Out]:
        """A message's text as a replay holds it: what the feed has not taken of it."""
        return self._text(message_id, full[self.seen.get(message_id, 0) :])

    def _text(self, message_id: str, piece: str) -> list[Out]:
        """Text of the reply: sent from the first character the client lacks."""
        if not piece:
            return []
        first = self.seen.get(message_id, 0) == 0
        self.seen[message_id] = self.seen.get(message_id, 0) + len(piece)
        if first and self.total:
            piece = "\n\n" + piece  # the turn's messages, one after the other
        before = self.total
        self.total += len(piece)
        self.text.append(piece)
        at = self._here()
        skip = self.skip if self.skip is not None else self.total
        visible = piece[max(0, skip - before) :]
        if not visible:
            return []
        opened = self.open()
        update = a2.TaskArtifactUpdateEvent(
            task_id=self.task_id,
            context_id=self.session_id,
            artifact=a2.Artifact(artifact_id=REPLY, name=REPLY, parts=[a2.Part(text=visible)]),
            append=self.total > len(visible),
            metadata={"cursor": str(at)},
        )
        return [*opened, (at, a2.StreamResponse(artifact_update=update))]

    def _files(self, p: ToolCompleted) -> list[Out]:
        """A tool's files: an artifact of parts by URL (docs/protocol.md §2 "Files")."""
        assert p.files
        parts = [
            a2.Part(
                url=file_url(self.base, self.session_id, f.file_id),
                media_type=f.media_type,
                filename=f.file_id,
                metadata={"fileId": f.file_id, "size": f.size},
            )
            for f in p.files
        ]
        artifact = a2.Artifact(artifact_id=f"files:{p.tool_use_id}", name=p.tool_name, parts=parts)
        self.files.append(artifact)
        at = self._here()
        if at.seq <= self.cursor.seq:
            return []
        update = a2.TaskArtifactUpdateEvent(
            task_id=self.task_id,
            context_id=self.session_id,
            artifact=artifact,
            metadata={"cursor": str(at)},
        )
        return [*self.open(), (at, a2.StreamResponse(artifact_update=update))]


def _texts(blocks: list[Any]) -> list[str]:
    return [b.text for b in blocks if isinstance(b, TextBlock)]


def _agent_text(text: str) -> a2.Message:
    return a2.Message(role="ROLE_AGENT", parts=[a2.Part(text=text)])


def _question(p: PermissionRequested) -> a2.Message:
    """An approval as the status message of ``TASK_STATE_INPUT_REQUIRED``: a prompt, and
    what it asks as data (docs/doors/a2a.md "Approvals")."""
    asked: dict[str, Any] = {
        "permId": p.perm_id,
        "kind": p.kind,
        "toolName": p.tool_name,
        "toolUseId": p.tool_use_id,
        "input": p.input,
        "expiresAt": iso(p.expires_at),
        "answer": {"decision": ["allow", "deny"]},
    }
    if isinstance(p.message, str):
        asked["message"] = p.message
    if isinstance(p.requested_schema, dict):
        asked["requestedSchema"] = p.requested_schema
    prompt = f"Allow {p.tool_name}? Answer with a message to this task: yes or no."
    if p.kind == "elicitation_url":  # the URL to open, in the text a client shows (§11)
        prompt = (
            f"{p.tool_name} asks: {p.message} Open {p.input.get('url')}, then answer"
            " with a message to this task: yes (done) or no."
        )
    elif p.kind == "sampling":
        prompt = f"{p.message}. Allow? Answer with a message to this task: yes or no."
    return a2.Message(
        message_id=f"ask:{p.perm_id}",
        role="ROLE_AGENT",
        parts=[a2.Part(text=prompt), a2.Part(data=asked)],
    )

"""Re-attaching to an AG-UI run: the SSE ids, the run's record, the resumed mapping.

Sans-IO, like :mod:`gateway.doors.agui.mapping` (docs/doors/agui.md "Re-attaching").

- **Ids.** Every AG-UI event of a run goes out with an SSE ``id:``: the id of
  the gateway event it was made of (or, for one made without a gateway event,
  the last one before it), and ``{id}:{n}`` for the n-th further AG-UI event
  made at that id (``tool.use_end`` makes ``TOOL_CALL_ARGS`` and
  ``TOOL_CALL_END``, a turn's end closes blocks then ``RUN_FINISHED``), so
  a ``Last-Event-ID`` names the exact event a client got last. The opening
  (``RUN_STARTED``, ``MESSAGES_SNAPSHOT``) is at the run's start: the node's
  last event id when the run subscribed, below every event of its turn.
- **The record.** A run is recorded (:class:`RunRecord`) with its turn, its
  start and the history its snapshot showed, so the same run can be mapped
  again from its start.
- **The resumed stream** (:class:`RunFeed`) maps the run again from its start
  (a replay through the seam, then live), and sends only what comes after the
  client's cursor: first ``RUN_STARTED``, then the start events of every step
  and block the client saw start and not end (sent again as it got them), then
  the rest. A run whose end the client already got sends ``RUN_STARTED`` and
  that end again. Streaming-only events are not replayed (docs/protocol.md
  §3): the replay holds a message as its ``message.complete`` (or, while it
  streams, a ``message.snapshot`` then its live deltas), and its blocks are
  rebuilt from it, whole (:meth:`RunMapper.rebuilt`). A message completed
  after the cursor so comes whole, under the same ids, even if the client saw
  part of it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gateway.doors.agui import shapes as ag
from gateway.doors.agui.mapping import RunMapper
from gateway.ids import format_event_id, parse_event_id
from gateway.protocol.events import (
    Envelope,
    PermissionRequested,
)

Position = tuple[int, int]
"""Where an AG-UI event is in its run: the gateway event's sequence number, and n."""

Tagged = tuple[Position, ag.AguiEvent]


def event_id(pos: Position) -> str:
    """The SSE ``id:`` of the event at ``pos`` (module docstring)."""
    seq, n = pos
    return format_event_id(seq) + (f":{n}" if n else "")


def parse_cursor(value: str) -> Position | None:
    """A ``Last-Event-ID`` as a position (None: not one of these ids)."""
    head, colon, n = value.strip().partition(":")
    seq = parse_event_id(head)
    if seq is None or (colon and not (n.isascii() and n.isdecimal() and len(n) < 10)):
        return None
    return seq, int(n or 0)


@dataclass(frozen=True)
class RunRecord:
    """What re-attaching to a run needs (module docstring)."""

    turn_id: str
    start: int  # the node's last event id when the run subscribed
    history_len: int  # the thread's messages its MESSAGES_SNAPSHOT was made of
    started_ms: int  # its RUN_STARTED's timestamp
    own: str | None = None  # the id of the user message the run sent (none: a resume run)


@dataclass
class RunFeed:
    """One run's gateway events in, its AG-UI events out with their positions.

    Args:
        mapper: the run's mapping.
        start: the run's start (:attr:`RunRecord.start`).
        cursor: the client's ``Last-Event-ID``; None: everything is sent, as for a
            cursor below the run's start (the client has none of the run: the
            last id it got of the thread's run before).
        rebuild: rebuild the blocks the run sees only as a whole message: a
            replay's, or, live, those of the message a run joined mid-stream
            (a steered run, docs/doors/agui.md "The run and the thread").
    """

    mapper: RunMapper
    start: int
    cursor: Position | None = None
    rebuild: bool = False
    _seq: int = -1
    _n: int = -1
    _open: dict[tuple[str, str], ag.AguiEvent] = field(default_factory=dict)
    _end: ag.AguiEvent | None = None
    _begun: bool = False
    _ts: int | None = None  # the last gateway event's

    def __post_init__(self) -> None:
        self._seq = self.start
        if self.cursor is not None and self.cursor < (self.start, 0):
            self.cursor = None  # before the opening: the whole run
        self._begun = self.cursor is None

    @property
    def finished(self) -> bool:
        return self.mapper.finished

    def opening(self, events: list[ag.AguiEvent]) -> list[Tagged]:
        """The run's opening (``RUN_STARTED``, ``MESSAGES_SNAPSHOT``), at its start."""
        return self._emit(events)

    def closed(self, code: str, message: str, ts: int | None) -> list[Tagged]:
        """:meth:`RunMapper.closed`, at the last event's id."""
        return self._emit(self.mapper.closed(code, message, ts))

    def receive(self, event: Envelope[Any]) -> list[Tagged]:
        """The AG-UI events of one gateway event (:meth:`RunMapper.receive`)."""
        seq = parse_event_id(event.id)
        if seq is not None and seq != self._seq:
            self._seq, self._n = seq, -1
        self._ts = event.ts
        made = self.mapper.rebuilt(event) if self.rebuild else []
        return self._emit(made + self.mapper.receive(event))

    def pause(self, ts: int | None) -> list[Tagged]:
        """:meth:`RunMapper.pause`, at the last event's id and time (``ts`` before any)."""
        return self._emit(self.mapper.pause(ts if self._ts is None else self._ts))

    def replayed(self, events: list[Envelope[Any]], ts: int | None) -> list[Tagged]:
        """A replay's events, then the resumed stream's beginning if nothing came after the cursor.

        Approvals asked together end the run together, as a live run's do when
        its queue runs dry: a replay pauses after each event that is not
        followed by another ``permission.requested``.
        """
        out: list[Tagged] = []
        for i, event in enumerate(events):
            out += self.receive(event)
            following = events[i + 1].payload if i + 1 < len(events) else None
            if not isinstance(following, PermissionRequested):
                out += self.pause(ts)
        if not self._begun:  # the client had all the replay shows: it resumes here
            out += self._begin()
        return out

    def _emit(self, events: list[ag.AguiEvent]) -> list[Tagged]:
        out: list[Tagged] = []
        for event in events:
            self._n += 1
            pos = (self._seq, self._n)
            if not self._begun:
                assert self.cursor is not None
                if pos <= self.cursor:
                    self._track(event)  # the client has it
                    continue
                out += self._begin()
            out.append((pos, event))
        return out

    def _begin(self) -> list[Tagged]:
        """``RUN_STARTED``, what the client saw open, the end if it saw it (module docstring)."""
        self._begun = True
        assert self.cursor is not None
        m = self.mapper
        started = ag.RunStarted(thread_id=m.thread_id, run_id=m.run_id, timestamp=None)
        again: list[ag.AguiEvent] = [started, *self._open.values()]
        if self._end is not None:
            again.append(self._end)
        return [(self.cursor, e) for e in again]

    def _track(self, event: ag.AguiEvent) -> None:
        """Keep the start events of what is open at the cursor (and the run's end)."""
        match event:
            case ag.StepStarted() | ag.StepFinished():
                key = ("step", event.step_name)
            case ag.TextMessageStart() | ag.TextMessageEnd():
                key = ("text", event.message_id)
            case ag.ReasoningStart() | ag.ReasoningEnd():
                key = ("reasoning", event.message_id)
            case ag.ReasoningMessageStart() | ag.ReasoningMessageEnd():
                key = ("reasoning_message", event.message_id)
            case ag.ToolCallStart() | ag.ToolCallEnd():
                key = ("tool", event.tool_call_id)
            case ag.RunFinished() | ag.RunError():
                self._end = event
                return
            case _:
                return
        if isinstance(event, _STARTS):
            self._open[key] = event
        else:
            self._open.pop(key, None)


_STARTS = (
    ag.StepStarted,
    ag.TextMessageStart,
    ag.ReasoningStart,
    ag.ReasoningMessageStart,
    ag.ToolCallStart,
)

"""What a soak client checks about the stream it receives (sans-IO).

:class:`StreamAudit` is fed every server frame one client gets, across all
its reconnects, and counts what the contract forbids:

- **order** (docs/protocol.md sections 1 and 3): each event reaches a client once, in
  id order. An id seen before is a *duplicate*; an id below the last one
  that was never seen is *out of order*. Across a reconnect with ``since`` the
  same holds: the cursor is the last id received.
- **the state model**: every event goes through the project's reference
  reducer (:class:`gateway.client.Reducer`), which raises on a move the
  contract does not allow (a delta for a block never started or already
  ended, a second ``message.start`` while one streams, a turn ending while
  another is in flight). Each such refusal is a *violation*.
- **block lifecycle and content** (section 5): when ``message.complete``
  arrives, every block the client saw start must have ended, and each
  block's text (or final input) as built from its deltas must equal
  ``final_content``: a lost or doubled delta shows here. A block restored from
  a ``message.snapshot`` is exempt from the "ended" check only (the reducer
  cannot tell whether its end came before the snapshot, gateway/client/reducer.py).
- **turns and messages closed**: :meth:`StreamAudit.finish` reports a turn
  still in flight or a message still streaming once the load has stopped.

:func:`compare_replay` is the *lost* check: a replay from a cursor the client
had (``since``) must hold exactly the replayable events (catalog events and
``message.complete``) that the client received live after that cursor.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gateway.client import Reducer
from gateway.protocol.events import EVENT_TYPES, Event
from gateway.protocol.frames import EventFrame, ServerFrame, Snapshot

# Events a replay carries again (docs/protocol.md §3): the catalog, and the
# streaming layer's message.complete rebuilt with its live id. A
# message.snapshot of a replay gets an id of its own (docs/protocol.md), so it
# is not compared.
REPLAYABLE = frozenset(
    {name for name, spec in EVENT_TYPES.items() if spec.catalog} | {"message.complete"}
)

MAX_DETAILS = 20  # violations kept verbatim; the rest are only counted


@dataclass
class StreamAudit:
    """One client's view of one session, checked frame by frame (module docstring).

    Args:
        session_id: the session whose stream this is.
        keep_replayable: record the id of every replayable event received, in
            order, for :func:`compare_replay` (the stayers do).
    """

    session_id: str
    keep_replayable: bool = False
    reducer: Reducer = field(init=False)
    received: int = 0
    duplicated: int = 0
    out_of_order: int = 0
    violations: int = 0
    details: list[str] = field(default_factory=list)
    last_id: str | None = None
    replayable: list[str] = field(default_factory=list)
    _seen: set[str] = field(default_factory=set)
    _stale: str | None = None  # a message whose deltas a reconnect interrupted

    def __post_init__(self) -> None:
        self.reducer = Reducer(self.session_id)

    def feed(self, frame: ServerFrame) -> None:
        """Check and apply one server frame (``snapshot`` and ``event`` frames count)."""
        if isinstance(frame, Snapshot):
            self._stale = None
            self._apply(frame)
            if frame.snapshot_at_event_id is not None:
                self.last_id = max(self.last_id or "", frame.snapshot_at_event_id)
            return
        if not isinstance(frame, EventFrame):
            return
        event = frame.event
        self.received += 1
        if event.id in self._seen:
            self.duplicated += 1
            self._note(f"duplicate {event.id} {event.type}")
            return
        self._seen.add(event.id)
        if self.last_id is not None and event.id <= self.last_id:
            self.out_of_order += 1
            self._note(f"out of order: {event.id} {event.type} after {self.last_id}")
            return
        self.last_id = event.id
        if (
            self.keep_replayable
            and event.type in REPLAYABLE
            and event.session_id == self.session_id
        ):
            self.replayable.append(event.id)
        if event.type == "message.snapshot":
            self._stale = None  # the reducer restores the message afresh
        elif event.type == "message.complete" and event.session_id == self.session_id:
            self._check_blocks(event)
        self._apply(frame)

    def resubscribed(self) -> None:
        """The client subscribes again after a gap (``since``, docs/protocol.md §3).

        A message that was streaming when the client went away cannot be
        checked against its deltas: the ones sent meanwhile were never
        received, and the replay restores the message with ``message.snapshot``
        (checked from there on) or finishes it with ``message.complete``
        (authoritative, nothing to compare).
        """
        streaming = self.reducer.streaming
        self._stale = None if streaming is None else streaming.message_id

    def restart(self) -> None:
        """Start the state model over (after a violation, so the client can go on)."""
        self.reducer = Reducer(self.session_id)

    def finish(self) -> None:
        """The load has stopped: no turn may be in flight, no message streaming."""
        turn = self.reducer.turn
        if turn is not None and turn.status == "in_flight":
            self._violation(f"turn {turn.turn_id} never closed")
        if self.reducer.streaming is not None:
            self._violation(f"message {self.reducer.streaming.message_id} never completed")

    def _apply(self, frame: ServerFrame) -> None:
        try:
            self.reducer.apply(frame)
        except ValueError as exc:
            self._violation(f"reducer: {exc}")
            self.restart()

    def _check_blocks(self, event: Event) -> None:
        streaming = self.reducer.streaming
        final = getattr(event.payload, "final_content", None)
        if streaming is None or final is None or streaming.message_id != event.payload.message_id:
            return  # a replayed message.complete (nothing streamed), or the reducer says why
        if streaming.message_id == self._stale:
            self._stale = None
            return
        for index, block in sorted(streaming.blocks.items()):
            if not block.closed and not block.restored:
                self._violation(f"{event.id}: block {index} of {streaming.message_id} never ended")
            built = block.as_content_block()
            if index >= len(final) or final[index] != built:
                self._violation(
                    f"{event.id}: block {index} of {streaming.message_id} built from its deltas "
                    f"({_describe(built)}) differs from final_content "
                    f"({_describe(final[index]) if index < len(final) else 'no such block'})"
                )

    def _violation(self, what: str) -> None:
        self.violations += 1
        self._note(what)

    def _note(self, what: str) -> None:
        if len(self.details) < MAX_DETAILS:
            self.details.append(f"{self.session_id}: {what}")


@dataclass(frozen=True)
class ReplayCheck:
    """A replay compared with what a client received live (:func:`compare_replay`)."""

    compared: int  # replayable events in the replay
    lost: list[str]  # replayed, never received live
    unexpected: list[str]  # received live after the cursor, not in the replay
    order_differs: bool


def compare_replay(
    live: list[str], since: str, replay: list[str], *, live_before: str | None = None
) -> ReplayCheck:
    """Compare the replay after ``since`` with the client's live replayable ids.

    The live ids compared are those after ``since`` and up to the replay's
    last id, or up to ``live_before`` if that is later: what came after both
    was emitted after the replay was computed.

    Args:
        live: the replayable event ids the client received, in order.
        since: the cursor the replay was asked from (one of the client's ids).
        replay: the replayable event ids of the replay, in order.
        live_before: the client's last replayable id when the replay was
            asked for: everything up to it was emitted before, so the replay
            must hold it.
    """
    top = max(replay[-1] if replay else since, live_before or since)
    window = [i for i in live if since < i <= top]
    replayed = set(replay)
    got = set(window)
    return ReplayCheck(
        compared=len(replay),
        lost=[i for i in replay if i not in got],
        unexpected=[i for i in window if i not in replayed],
        order_differs=window != replay and replayed == got,
    )


def _describe(block: object) -> str:
    """A block, short: its kind and its text's length and ends."""
    text = getattr(block, "text", None) or getattr(block, "thinking", None)
    if isinstance(text, str):
        return f"{type(block).__name__}, {len(text)} chars, {text[:20]!r}...{text[-20:]!r}"
    return repr(block)[:100]

"""What a turn sent to a busy session does: reject, queue, interrupt or steer.

docs/protocol.md §2 "A busy session". A session is busy while a turn is in
flight or turns are queued. The queued turns live in the session record
(``SessionRecord.queued_turns``), written in the same synchronous step as the
event that announces them (``turn.queued``), so a queued turn is exactly as
durable as a started one and a restart finds it (``Store.open_turns``).

- **queue**: appended to the record, ``turn.queued``; started in order by
  :func:`start_next`, which the agent loop calls in the step that ends a turn
  (after its terminal event), and recovery after it closed an interrupted one.
  A turn starting from the queue leaves the record in the step that emits its
  ``turn.started`` (:func:`started`), never before: a crash in between finds it
  still queued, and so does a cancel (:func:`cancel_queued`), an interrupt, a
  delete or a shutdown (:func:`put_back`: the agent loop skips the turn it took).
- **interrupt**: the running turn is cancelled (reason ``interrupted``) and the
  new turn waits in :attr:`Supervisor.interrupters`, ahead of the queue; a
  second interrupt cancels the first as soon as it started. Not durable
  before it starts: its request is answered once its ``turn.started`` is, and
  refused if the running turn is still closing when it stops waiting
  (:func:`withdraw`) or once shutdown began: it never starts then.
- **steer**: kept in the record as a queued turn marked ``steering`` (durable,
  no event), and the session's :class:`Pulse` fired; the native loop takes it
  before its next model call (:func:`take_steers`: ``turn.steered``, the user
  message joins the turn), a ``claude-code`` turn hands it to Claude Code's
  streaming input where the CLI waits for the gateway (at a tool's hooks, or
  woken by the pulse while it waits for a permission:
  :mod:`gateway.runtimes.claude_code.steering`). A steer its turn did not take
  becomes a queued turn of its own (:func:`start_next`: ``turn.queued``).
"""

from __future__ import annotations

import math
from collections import deque
from typing import Protocol

import msgspec
import trio

from gateway.cluster import ops
from gateway.errors import Refused, unavailable
from gateway.ids import new_turn_id
from gateway.protocol.events import Payload, StreamEvent, TurnCancelled, TurnQueued, TurnSteered
from gateway.protocol.http import IfBusy
from gateway.protocol.shapes import Message, QueuedTurnInfo
from gateway.session import admission, rewind
from gateway.session.core import NodeView, SessionCore
from gateway.session.turn import Turn
from gateway.store.base import QueuedTurn, SessionRecord, Store

INTERRUPTED = "interrupted"
"""The ``turn.cancelled`` reason of a turn an ``interrupt`` ended."""


class Pulse:
    """Wakes whoever waits for the next steer of a session's running turn.

    A waiter takes :attr:`event` before it looks at the record, then waits on
    it: a steer that comes in between has set that event already (nothing is
    missed); :meth:`fire` sets it and puts a new one in its place.
    """

    def __init__(self) -> None:
        self.event = trio.Event()

    def fire(self) -> None:
        self.event.set()
        self.event = trio.Event()


class Lane(Protocol):
    """Where a session's turns wait to run (:class:`gateway.session.supervisor.Supervisor`)."""

    interrupters: deque[Turn]

    def queue_turn(self, turn: Turn) -> None: ...


class BusyNode(NodeView, Protocol):
    """What this module uses of a session's node."""

    @property
    def store(self) -> Store: ...


class BusyCore(SessionCore, Protocol):
    """What :func:`check_new` uses of a session."""

    messages: list[Message]


class BusyHost(BusyCore, Protocol):
    """What this module uses of a session."""

    turn: Turn | None  # settable here: the turn lock
    fenced: bool
    deleted: bool
    steered: Pulse  # fired when a steer for the running turn is kept
    deleting: bool

    @property
    def node(self) -> BusyNode: ...

    @property
    def supervisor(self) -> Lane: ...

    def save_record(self) -> None: ...

    def add_message(self, message: Message) -> None: ...

    @property
    def rewound(self) -> list[Message]: ...

    def submit_turn(
        self, user_message: Message, if_busy: IfBusy = "reject", rewind_to: str | None = None
    ) -> Turn: ...


def is_busy(session: SessionCore) -> bool:
    """A turn in flight, or turns queued (docs/protocol.md §2 "A busy session")."""
    return session.turn is not None or bool(session.record.queued_turns)


def submit(
    session: BusyHost,
    message: Message,
    if_busy: IfBusy,
    rewind_to: str | None = None,
    trace: dict[str, str] | None = None,
) -> Turn | ops.TurnTaken:
    """Take a turn as ``if_busy`` says: a :class:`Turn` to wait for (started now, or after
    an interrupt), or the answer of one queued or steered (durable once the store
    committed what was put so far).

    Raises:
        Refused: as :meth:`Session.submit_turn` (``turn_in_progress`` for
            ``reject``; ``message_rewound`` for a message id a rewind took out,
            queued or steered too); ``queue_full`` past ``[turns] max_queued``.
    """
    if if_busy == "reject" or not is_busy(session):
        return session.submit_turn(message, if_busy, rewind_to)
    admission.check_here(session)
    check_new(session, message)
    _check_not_waiting(session, message)
    admission.check_size(session)
    admission.check_store(session.node.store)
    # docs/protocol.md §2 "Edit and regenerate": the target, and (whatever if_busy says) a
    # message id a rewind took out, which would be stored again in its place among them.
    rewind.check(session, rewind_to, message.id)
    running = session.turn
    if if_busy == "interrupt":
        return _interrupt(session, message, rewind_to)
    if if_busy == "steer" and running is not None and not running.cancelling:
        return _steer(session, running, message, trace or {})
    return _queue(session, message, trace or {})


def check_new(session: BusyCore, message: Message) -> None:
    """A message id is taken once: one already waiting or in the conversation is the same
    message sent again (a door's id derived from the client's, two requests racing), not
    a second turn of it, which would replace the first's message where it starts.

    Raises:
        Refused: ``turn_in_progress``.
    """
    waiting = (q.user_message.id for q in session.record.queued_turns)
    if message.id in waiting or any(m.id == message.id for m in session.messages):
        raise Refused(
            "turn_in_progress",
            f"message {message.id} was sent to {session.id} already: its turn is under way",
        )


def _check_not_waiting(session: BusyHost, message: Message) -> None:
    """:func:`check_new` for the turns waiting in memory: an interrupting turn, and the
    turn that started from the lane but has not added its user message yet.

    Raises:
        Refused: ``turn_in_progress``.
    """
    turns = [*session.supervisor.interrupters, *([session.turn] if session.turn else [])]
    if any(t.user_message.id == message.id for t in turns):
        raise Refused(
            "turn_in_progress",
            f"message {message.id} was sent to {session.id} already: its turn is under way",
        )


def _check_room(session: BusyHost) -> None:
    limit = session.node.config.turns.max_queued
    waiting = len(session.record.queued_turns) + len(session.supervisor.interrupters)
    if waiting >= limit:
        raise Refused(
            "queue_full",
            f"session {session.id} has {waiting} turns waiting, its [turns] max_queued is"
            f" {limit}: cancel one, or send it once the queue moved",
        )


def _queue(session: BusyHost, message: Message, trace: dict[str, str]) -> ops.TurnTaken:
    """Queue the turn: in the record and announced, in one step (module docstring)."""
    _check_room(session)
    turn_id = message.turn_id or new_turn_id()
    position = _announce(session, [_queued(turn_id, message, trace)])[0]
    return ops.TurnTaken(turn_id, queued=True, position=position)


def _queued(turn_id: str, message: Message, trace: dict[str, str]) -> QueuedTurn:
    """A queued turn of this message under this turn id: the message is the turn's."""
    return QueuedTurn(turn_id, msgspec.structs.replace(message, turn_id=turn_id), trace)


def _announce(session: BusyHost, entries: list[QueuedTurn]) -> list[int]:
    """Append queued turns to the record and emit their ``turn.queued``; their positions."""
    record = session.record
    kept = [q for q in record.queued_turns if q.turn_id not in {e.turn_id for e in entries}]
    record.queued_turns = kept + entries
    positions = [position(record, e.turn_id) for e in entries]
    session.save_record()
    for entry, at in zip(entries, positions, strict=True):
        session.emit([TurnQueued(entry.turn_id, at, entry.user_message)], entry.turn_id)
    return positions


def position(record: SessionRecord, turn_id: str) -> int:
    """A queued turn's place, 1 starting next (steers waiting for their turn are not turns)."""
    ids = [q.turn_id for q in record.queued_turns if q.steering is None]
    return ids.index(turn_id) + 1


def _steer(
    session: BusyHost, running: Turn, message: Message, trace: dict[str, str]
) -> ops.TurnTaken:
    """Keep the message for the running turn (durable with the record; module docstring)."""
    _check_room(session)
    turn_id = message.turn_id or new_turn_id()  # the turn it becomes if it is not taken
    entry = QueuedTurn(turn_id, message, trace, steering=running.id)
    session.record.queued_turns = [*session.record.queued_turns, entry]
    session.save_record()
    session.steered.fire()
    return ops.TurnTaken(running.id, steered=True)


def _interrupt(session: BusyHost, message: Message, rewind_to: str | None) -> Turn:
    """Cancel the running turn; this one starts next, ahead of the queue."""
    _check_room(session)
    turn = Turn(message.turn_id or new_turn_id(), message, rewind_to=rewind_to)
    lane = session.supervisor
    lane.interrupters.append(turn)
    running = None if put_back(session) else session.turn
    if running is not None:
        running.request_cancel(INTERRUPTED)  # a no-op if it is cancelling already
    else:  # only queued turns, none started yet (a moment at a restart)
        start_next(session)
    return turn


def put_back(session: BusyHost) -> bool:
    """A queued turn :func:`start_next` took and the agent loop has not started yet is queued
    still (it leaves the record with its ``turn.started``): it lets the turn lock go and
    waits in its place, never started by the loop (it skips a turn that is done): for an
    interrupting turn to go first; through a shutdown, or while the store refuses every
    write, as every queued turn does; for good once a delete began. Whether there was one."""
    taken = session.turn
    if taken is None or not any(q.turn_id == taken.id for q in session.record.queued_turns):
        return False
    session.turn = None
    taken.finish("requeued")
    return True


def start_next(session: BusyHost) -> None:
    """The turn before ended (or none runs after a recovery): start the next one.

    First the steers no running turn will take become queued turns
    (``turn.queued``); then an interrupting turn starts, else the first queued
    one. Nothing starts on a session that is stopping here, being deleted, on a node
    shutting down, or once the store refuses every write: its queued turns stay
    in the store for the next run.
    """
    if session.turn is not None or session.fenced or session.deleted or session.deleting:
        return
    record = session.record
    orphans = [q for q in record.queued_turns if q.steering is not None]
    if orphans:
        _announce(
            session,
            [_queued(q.turn_id, q.user_message, q.trace) for q in orphans],
        )
    lane = session.supervisor
    node = session.node
    if node.shutting_down:  # an interrupting turn is not durable: refused, not kept
        wait = math.ceil(node.config.server.shutdown_grace_s)
        _drop_interrupters(
            lane,
            Refused(
                "shutting_down",
                f"the gateway is shutting down: retry in {wait} s",
                retry_after_s=wait,
            ),
        )
        return
    if node.store.refusing is not None:  # nothing more is written: a turn would only fail
        _drop_interrupters(lane, unavailable(node.store.refusing))
        return
    _drop_stale_rewinds(session, lane)
    if lane.interrupters:
        turn = lane.interrupters.popleft()
        if lane.interrupters:  # a later interrupt ends this one as soon as it started
            turn.request_cancel(INTERRUPTED)
    elif record.queued_turns:
        first = record.queued_turns[0]
        turn = Turn(first.turn_id, first.user_message, trace=dict(first.trace))
    else:
        return
    session.turn = turn
    lane.queue_turn(turn)


def cancel_running(session: BusyHost, reason: str) -> None:
    """Cancel the session's turn in flight for the node's sake (a shutdown, the store
    refusing every write: docs/protocol.md §8); a queued turn taken but not started is
    put back instead (:func:`put_back`): it waits, as every queued turn does then."""
    if not put_back(session) and session.turn is not None:
        session.turn.request_cancel(reason)


def _drop_stale_rewinds(session: BusyHost, lane: Lane) -> None:
    """Refuse the interrupting turns whose ``rewind_to`` a turn that started since they
    were checked rewound (two interrupts with ``rewind_to`` at once, the first to an
    earlier message): never started, as a target found rewound at submit is refused."""
    for turn in list(lane.interrupters):
        try:
            rewind.check(session, turn.rewind_to)
        except Refused as refused:
            lane.interrupters.remove(turn)
            turn.drop(refused)


def _drop_interrupters(lane: Lane, refused: Refused) -> None:
    while lane.interrupters:
        lane.interrupters.popleft().drop(refused)


def withdraw(session: BusyHost, turn: Turn) -> bool:
    """An interrupting turn whose request stops waiting before the running turn closed (a
    tool slow to stop): it leaves the lane, never to start, since nothing of it is durable
    (its request is refused, not answered 202). Whether it was still waiting."""
    lane = session.supervisor
    if turn not in lane.interrupters:
        return False
    lane.interrupters.remove(turn)
    running = session.turn
    turn.drop(
        Refused(
            "turn_in_progress",
            f"turn {running.id if running else '?'} on {session.id} is still closing"
            f" (docs/protocol.md §8): turn {turn.id} was not started; send it again",
            retry_after_s=1,
        )
    )
    return True


def started(record: SessionRecord, turn: Turn) -> None:
    """A turn's ``turn.started`` goes out: it leaves the queue, in the same step."""
    if any(q.turn_id == turn.id for q in record.queued_turns):
        record.queued_turns = [q for q in record.queued_turns if q.turn_id != turn.id]


def steering(record: SessionRecord, turn: Turn) -> bool:
    """Whether steers wait for ``turn`` to take them."""
    return any(q.steering == turn.id for q in record.queued_turns)


def take_steers(session: BusyHost, turn: Turn) -> list[Message]:
    """The running turn takes the steers sent for it (the native loop before its next model
    call, a ``claude-code`` turn as it hands them to Claude Code): they join it, in
    order, each announced with ``turn.steered``, in one step (the record drops them
    as the messages are added). The messages taken, as the turn's."""
    record = session.record
    taken = [q for q in record.queued_turns if q.steering == turn.id]
    if not taken:
        return []
    record.queued_turns = [q for q in record.queued_turns if q.steering != turn.id]
    payloads: list[Payload | StreamEvent] = []
    messages: list[Message] = []
    for q in taken:
        message = msgspec.structs.replace(q.user_message, turn_id=turn.id)
        session.add_message(message)
        payloads.append(TurnSteered(turn.id, message))
        messages.append(message)
    session.save_record()
    session.emit(payloads, turn.id)
    return messages


def cancel_queued(session: BusyHost, turn_id: str, reason: str) -> bool:
    """Cancel a queued turn: out of the record, ``turn.cancelled`` (phase ``queued``) in the
    same step. Whether the session had it queued.

    One :func:`start_next` took already (the turn lock's, waiting for the agent loop)
    is queued still: it leaves the record only with its ``turn.started``
    (:func:`started`). It then never starts (the loop skips a turn that is done)
    and the next waiting one takes the lock.
    """
    record = session.record
    if not any(q.turn_id == turn_id and q.steering is None for q in record.queued_turns):
        return False
    record.queued_turns = [q for q in record.queued_turns if q.turn_id != turn_id]
    session.save_record()
    session.emit([TurnCancelled(turn_id, reason, "queued", False)], turn_id)
    taken = session.turn
    if taken is not None and taken.id == turn_id:
        session.turn = None
        taken.finish("cancelled")
        start_next(session)
    return True


def forget_waiting(session: BusyHost) -> None:
    """The session is being deleted: its queued turns and steers never start (the record
    goes with it), its interrupting turns end unstarted (their requests: 404)."""
    session.record.queued_turns = []
    lane = session.supervisor
    while lane.interrupters:
        lane.interrupters.popleft().drop(
            Refused("session_not_found", f"session {session.id} was deleted")
        )


def queued_info(record: SessionRecord) -> list[QueuedTurnInfo]:
    """The queued turns as a summary lists them, next first (steers are not listed)."""
    turns = [q for q in record.queued_turns if q.steering is None]
    return [QueuedTurnInfo(q.turn_id, i, q.user_message) for i, q in enumerate(turns, 1)]

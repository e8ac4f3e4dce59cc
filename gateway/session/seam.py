"""The seam: register, cut, replay or snapshot, then live (docs/protocol.md §3).

A client that subscribes must get every event exactly once, in id order,
across the join of what it is sent first (a replay from its ``since``, or a
snapshot) and the live stream. Four steps, in this order, make it so:

1. **register**: a :class:`Gate` goes into the client's outbound queue and the
   client joins the session's hub. From here on, every live batch queues up
   behind the gate (the writer stops at a gate until it opens).
2. **cut**: the replay or snapshot is computed; its *cut* is the id of the
   last event it covers (a snapshot's is the node's last issued id, read in
   the same synchronous step as the state; a replay's is the last event it
   holds).
3. **replay or snapshot**: once everything it shows is durable (PROTOCOL
   section 9), the gate opens with the ack and the replay or snapshot.
4. **live**: the writer sends what opened the gate, then every queued event
   with an id above the cut (:func:`past_cut`); an event at or below it was
   in the replay or snapshot already. After that the client is live.

A ``subscribe_error`` (``cursor_expired``, ``replay_too_large``) opens the
gate with the error and a cut above every id, so the live events queued
behind it are dropped, and the client is unregistered.

Replay (:func:`replay`) rebuilds what was streaming-only: a
``message.complete`` with its original id for each assistant message
completed after the cursor, and one ``message.snapshot`` (with a fresh id)
for a message still streaming. Snapshot (:func:`snapshot`) is the session
summary and its last messages, the streaming one included as far as it got.
Both fit ``[stream] snapshot_max_bytes`` (docs/protocol.md §15,
:mod:`gateway.protocol.fit`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import trio

from gateway.cluster import ops
from gateway.config import StreamConfig
from gateway.errors import Refused, SubscribeRejected
from gateway.ids import format_event_id, now_ms, parse_event_id
from gateway.protocol.events import EVENT_TYPES, Event, MessageComplete, MessageSnapshot
from gateway.protocol.filters import Filter, FilterKey
from gateway.protocol.fit import fit_message_snapshot, fit_snapshot
from gateway.protocol.frames import Subscribe, SubscribeAck, SubscribeError, encode
from gateway.protocol.framing import event_frame, text_frame
from gateway.protocol.shapes import Usage
from gateway.session.hub import Emitted, FrameBatch, Group, Subscriber
from gateway.session.rollup import join
from gateway.session.session import Session
from gateway.store.base import StoredEvent, each_event_after


class Gate:
    """The seam marker in a client's outbound queue (module docstring, step 1)."""

    __slots__ = ("cut", "payload", "ready")

    def __init__(self) -> None:
        self.ready = trio.Event()
        self.payload = b""
        self.cut = 0

    def open(self, payload: bytes, cut: int) -> None:
        """Let the writer pass: send ``payload``, then the queued events above ``cut``."""
        self.payload, self.cut = payload, cut
        self.ready.set()


def past_cut(batch: FrameBatch, cut: int) -> FrameBatch | None:
    """What of a live batch queued behind a gate still goes to the client (step 4).

    Its events with an id above the cut: the batch itself when all of them
    are (every batch once the client is live: the cut is then below them), a
    smaller batch when some are, ``None`` when none is. A rolled-up delta
    (docs/protocol.md §3 "Delta rollup") whose parts straddle the cut is
    rolled up again from its parts above it.
    """
    events = batch.events
    first = events[0]
    if (first.parts[0].seq if first.parts else first.seq) > cut:
        return batch
    rest: list[Emitted] = []
    for e in events:
        if e.seq <= cut:
            continue
        if e.parts and e.parts[0].seq <= cut:
            e = join([p for p in e.parts if p.seq > cut])
        rest.append(e)
    return FrameBatch(rest) if rest else None


class SeamSubscriber(Subscriber, Protocol):
    """A client's side of the seam: its outbound queue and its registration."""

    def enqueue(self, item: Gate) -> None:
        """Put the gate in the outbound queue (the slack of the bound always has room)."""
        ...

    def registered(self, group: Group | None) -> None:
        """The hub group the client joined (``None``: it was unregistered)."""
        ...


@dataclass(frozen=True)
class Subscribed:
    """What a ``subscribe`` came to (for the connection's log line)."""

    mode: str  # "live", "snapshot" or "replay"
    replayed: int = 0  # events a replay sent
    error: SubscribeRejected | None = None  # a subscribe_error was sent instead


async def subscribe(
    session: Session,
    sub: SeamSubscriber,
    request: Subscribe,
    resolved: Filter,
    key: FilterKey,
    config: StreamConfig,
) -> Subscribed:
    """Run the seam for one ``subscribe`` frame (module docstring, steps 1 to 3).

    A replay is measured (``gateway_replay_size_events``,
    ``gateway_replay_duration_seconds``) from the subscribe to its frames
    being ready, store reads and the wait for their commit included.
    """
    gate = Gate()
    sub.enqueue(gate)
    window = config.coalesce_ms if request.coalesce_ms is None else request.coalesce_ms
    alone = not any(len(s.hub) for s in session.family.scope(True))
    sub.registered(session.hub.subscribe(sub, key, window))
    mode = "snapshot" if request.snapshot else "live" if request.since is None else "replay"
    node = session.node
    session.joining.add(sub)
    try:
        # Where another node runs it, its live batches come from there from now on
        # (a snapshot or replay asked of the owner tells it to publish them).
        await node.watch(session, tell_owner=not request.snapshot and request.since is None)
        if request.snapshot:
            data, cut = await owners_snapshot(session, config.snapshot_messages)
            ack = SubscribeAck(resolved, None, True, 0)
            gate.open(text_frame(encode(ack)) + text_frame(data), cut)
            _joined(session, cut, alone)
        elif request.since is not None:
            started = trio.current_time()
            frames, cut = await owners_replay(session, request, key, config.replay_max_events)
            ack = SubscribeAck(resolved, request.since, False, len(frames))
            gate.open(text_frame(encode(ack)) + b"".join(frames), cut)
            _joined(session, cut, alone)
            metrics = session.node.metrics
            metrics.replays.inc(len(frames))
            metrics.replay_size.observe(len(frames))
            metrics.replay_duration.observe(trio.current_time() - started)
            return Subscribed(mode, len(frames))
        else:
            gate.open(text_frame(encode(SubscribeAck(resolved, None, False, 0))), 0)
    except SubscribeRejected as exc:
        session.hub.unsubscribe(sub)
        sub.registered(None)
        error = SubscribeError(exc.code, exc.message)  # type: ignore[arg-type]
        gate.open(text_frame(encode(error)), sys.maxsize)  # drop what queued behind it
        return Subscribed(mode, error=exc)
    except Refused as exc:  # a replica whose owner (or Redis) did not answer: come back
        session.hub.unsubscribe(sub)
        sub.registered(None)
        gate.open(b"", sys.maxsize)
        sub.request_close("relay_gap")
        return Subscribed(mode, error=SubscribeRejected(exc.code, str(exc)))
    finally:
        session.joining.discard(sub)
    return Subscribed(mode)


def _joined(session: Session, cut: int, alone: bool) -> None:
    """A client that joined its family alone on this node has everything up to ``cut``:
    a takeover here compares the store with that, not only with the live batches relayed
    (gateway.node.failover: a client that missed nothing keeps its stream)."""
    if alone:
        session.node.placement.joined(session.family.id, cut)


async def owners_snapshot(session: Session, limit: int) -> tuple[bytes, int]:
    """The snapshot's JSON and cut, from the node that runs the session.

    Computed here when that is this node (or it just took the session over
    from a dead one), else asked of the owner, which holds the streaming
    message and issues the ids the cut is about.
    """
    answer = await session.node.ask_owner(session, ops.TakeSnapshot(limit), patient=True)
    if answer is None:
        return await durable_snapshot(session, limit)
    taken = ops.expect(answer, ops.Snapshot)
    return taken.data, taken.cut


async def durable_snapshot(session: Session, limit: int) -> tuple[bytes, int]:
    """:func:`snapshot`, once everything it shows is durable (docs/protocol.md §9).

    Its byte cap is the config of the node that runs the session (every node
    of a deployment has the same ``[stream]``).
    """
    data, cut = snapshot(session, limit, session.node.config.stream.snapshot_max_bytes)
    await session.node.wait_durable()
    return data, cut


async def owners_replay(
    session: Session, request: Subscribe, key: FilterKey, max_events: int
) -> tuple[list[bytes], int]:
    """:func:`replay` of ``request.since``, from the node that runs the session.

    Computed here when that is this node, else by the owner (it has the
    tail and the streaming layer), given the subscribe frame itself.

    Raises:
        SubscribeRejected: as :func:`replay`, from whichever node replayed.
    """
    assert request.since is not None
    answer = await session.node.ask_owner(
        session, ops.Replay(encode(request), max_events), patient=True
    )
    match answer:
        case None:
            return await replay(session, request.since, key, max_events)
        case ops.Replayed():
            return answer.frames, answer.cut
        case ops.ReplayRejected():
            raise SubscribeRejected(answer.code, answer.message)
        case _:
            raise Refused("session_owner_unreachable", f"a replay answered {answer!r}")


def snapshot(session: Session, limit: int, max_bytes: int) -> tuple[bytes, int]:
    """The encoded ``snapshot`` frame and its cut (docs/protocol.md sections 3, 6 and 15).

    Computed synchronously, so nothing is emitted between reading the state
    and reading the cut: the cut is simply the node's last issued id. Sent
    once everything it shows is durable; events up to its cut that are still
    held reach the client's queue later and are dropped at the seam. The
    frame is never over ``max_bytes`` (:func:`gateway.protocol.fit.fit_snapshot`:
    older messages left out, ``has_more``, a block too big cut); fitting it
    changes what the frame shows, never its cut.
    """
    messages = list(session.messages)
    streaming = session.calls.streaming_message()
    if streaming is not None:
        messages.append(streaming)
    cut = session.node.sequencer.last
    data = fit_snapshot(
        session.summary(),
        messages,
        format_event_id(cut) if cut else None,
        limit=limit,
        max_bytes=max_bytes,
    )
    return data, cut


@dataclass
class _Replay:
    """The frames picked so far, by id, within the bound."""

    since: str
    max_events: int
    picked: dict[int, bytes]

    def check_size(self) -> None:
        if len(self.picked) > self.max_events:
            raise SubscribeRejected(
                "replay_too_large",
                f"more than replay_max_events={self.max_events} events after {self.since}; "
                "subscribe with a snapshot",
            )


async def replay(
    session: Session, since: str, key: FilterKey, max_events: int
) -> tuple[list[bytes], int]:
    """Every matching event after ``since``, rebuilt where it was streaming-only.

    Reads the store for what the sessions' in-memory tails no longer hold,
    then the tails, the completions and the streaming message in one
    synchronous step.

    Returns:
        The event frames in id order, and the cut (the last replayed id, or
        the cursor's own when nothing is newer).

    Raises:
        SubscribeRejected: ``cursor_expired`` or ``replay_too_large``.
    """
    node = session.node
    since_seq = parse_event_id(since)
    if since_seq is None or since_seq > max(node.sequencer.last, session.tail.floor):
        raise SubscribeRejected("cursor_expired", f"{since!r} is not an event id of this node")
    if since_seq < node.retention_floor:
        raise SubscribeRejected(
            "cursor_expired",
            f"{since!r} is older than the retention window; subscribe with a snapshot",
        )
    # Every worker, even without include_worker_sessions: their permission
    # events reach this stream whatever the filter (docs/protocol.md §5).
    sessions = session.scope(True)
    out = _Replay(since, max_events, {})

    def take(seq: int, type_: str, actor: str, session_id: str, frame: Callable[[], bytes]) -> None:
        if key.matches(type_, actor, session_id != session.id):
            out.picked[seq] = frame()
            out.check_size()

    def take_stored(row: StoredEvent) -> None:
        actor = EVENT_TYPES[row.type].actor
        take(row.seq, row.type, actor, row.session_id, _later(event_frame, row.data))

    need_store = [s.id for s in sessions if since_seq < s.tail.floor]
    if need_store:
        await node.durable_or_503()  # what the tails dropped is in the store
        await each_event_after(node.store, need_store, since_seq, take_stored)
    # From here on nothing awaits: tail, completions and the streaming
    # message are read in one step, after everything the store returned.
    for s in sessions:
        newer: list[Emitted] = []  # the tail after the cursor, read from its end
        for em in reversed(s.tail):
            if em.seq <= since_seq:
                break
            newer.append(em)
        newer.reverse()
        for em in key.select(newer, s is not session):
            if em.seq not in out.picked:
                out.picked[em.seq] = em.frame
        out.check_size()
        _streaming_layer(s, since_seq, take)
    ordered = sorted(out.picked)
    frames = [out.picked[q] for q in ordered]
    # Sent only once all it holds is durable: tail events may still be held.
    await node.wait_durable()
    return frames, ordered[-1] if ordered else since_seq


def _streaming_layer(session: Session, since_seq: int, take: Callable[..., None]) -> None:
    """The streaming-only part of a replay, rebuilt from the messages (module docstring):
    the rewound ones too, completed before they were rewound (docs/protocol.md §2)."""
    for msg in (*session.messages, *session.rewound):
        done = session.completions.get(msg.id)
        if done is None or done.seq <= since_seq:
            continue
        payload = MessageComplete(msg.id, done.stop_reason, msg.content, msg.usage or Usage())
        event = Event(
            format_event_id(done.seq), "message.complete", session.id, msg.turn_id,
            done.ts, "llm", payload,
        )  # fmt: skip
        take(done.seq, "message.complete", "llm", session.id, _later(_frame_of, event))
    streaming = session.calls.streaming_message()
    call = session.calls.current
    if streaming is not None and call is not None and call.last_seq > since_seq:
        # An id of its own (ids are never reused, docs/protocol.md §1), above
        # every delta folded into it: the seam drops those live deltas.
        seq = session.node.sequencer.next()
        event = Event(
            format_event_id(seq), "message.snapshot", session.id, call.turn_id,
            now_ms(), "llm", MessageSnapshot(streaming),
        )  # fmt: skip
        # Cut to fit like a snapshot frame (docs/protocol.md §15): clients refuse
        # a frame over their limit as they would a snapshot.
        max_bytes = session.node.config.stream.snapshot_max_bytes
        take(seq, "message.snapshot", "llm", session.id, lambda: _fitted_frame(event, max_bytes))


def _later(fn: Callable[[Any], bytes], arg: Any) -> Callable[[], bytes]:
    """``fn(arg)``, computed only if the event is picked."""
    return lambda: fn(arg)


def _frame_of(event: Event) -> bytes:
    return event_frame(encode(event))


def _fitted_frame(event: Event, max_bytes: int) -> bytes:
    return event_frame(fit_message_snapshot(event, max_bytes))

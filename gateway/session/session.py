"""A live session: its state, its emission path, its views, and its runtime nursery.

Runtime shape (the issue's "Shape", drawn)::

    session nursery  (Session.run)
    ├── "agent-loop <id>"   runs turns: drives the provider, runs tools, emits
    │                       the turn's domain events (PROTOCOL section 7)
    └── "translator <id>"   drains raw provider events from the inbox in
                            batches, translates them (gateway.translate),
                            and emits the whole batch at once

Emission (:meth:`Session.emit`) is synchronous and is the only way an event
leaves the session: it assigns the node-wide id, encodes and frames the event
once, enqueues catalog events on the store's batching writer and the session's
in-memory tail, and fans the batch out through the hub. Every state change that
a snapshot or replay reads (a finished message, a tool result) happens in the
same synchronous step as the event that announces it, so a snapshot can never
fall between the two.

Durability first (PROTOCOL section 9): a batch that carries a catalog event is
*held* until the store has committed it, and every later batch of the same
session family (a session and its workers, whose events share streams) waits
behind it, so the order on the wire never changes and no client ever receives
a catalog event the store could lose. The node releases held batches when the
store reports a commit (:meth:`gateway.node.Node.on_commit`). A snapshot or a
replay, which read state directly, wait for the commit of everything they read
before they are sent.

A session is a failure boundary: an exception in its agent loop or its
translator task is logged with its traceback, counted
(``gateway_session_failures_total``), the turn in flight is closed with
``turn.completed`` (``stop_reason: error``), and the session goes on with its
next turn (:meth:`Session.run`). Nothing of it reaches another session or the
node.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import msgspec
import trio
import trio.testing

from gateway.errors import ApiError, ProviderError, SubscribeRejected
from gateway.ids import format_event_id, new_turn_id, now_ms, parse_event_id
from gateway.protocol.events import (
    EVENT_TYPES,
    BusHandlerWarning,
    BusSubscriberUnregistered,
    Event,
    MessageComplete,
    MessageSnapshot,
    Payload,
    StreamEvent,
    stream_event,
)
from gateway.protocol.filters import FilterKey
from gateway.protocol.frames import Snapshot, encode
from gateway.protocol.shapes import Message, SessionSummary, StopReason, Usage
from gateway.server.websocket import text_frame
from gateway.session.hub import Emitted, Hub, Subscriber
from gateway.session.sequencer import EventSequencer
from gateway.session.turn import Turn
from gateway.store.base import SessionRecord, Store, StoredEvent, StoredMessage
from gateway.translate import Translator

log = logging.getLogger("gateway.session")

_EVENT_FRAME_HEAD = b'{"type":"event","event":'


def event_frame(data: bytes) -> bytes:
    """The WebSocket frame of ``EventFrame(event)`` around the event's encoded JSON.

    Spliced rather than re-encoded: the event's bytes are the ones the store
    keeps, and a replay wraps them the same way (tests/test_fanout.py checks
    the splice decodes to the ``EventFrame`` it stands for).
    """
    return text_frame(_EVENT_FRAME_HEAD + data + b"}")


@dataclass(slots=True)
class Completion:
    """How an assistant message's live ``message.complete`` went out (to rebuild it on replay)."""

    seq: int
    ts: int
    stop_reason: StopReason


@dataclass(eq=False)
class Call:
    """One LLM call in flight: its translator and the rendezvous with the agent loop."""

    turn_id: str
    translator: Translator
    done: trio.Event = field(default_factory=trio.Event)
    last_seq: int = 0  # id of the last event emitted for this call's message
    error_class: str | None = None
    error_message: str = ""
    lost: list[StreamEvent] = field(default_factory=list)  # translated, but their emit failed


class Inbox:
    """Agent loop -> translator task: raw provider events, bounded, taken whole.

    Unlike a memory channel, it never hands an item to a waiting receiver
    ahead of time: until the translator task takes them in its own step, the
    items are here, so the agent loop can settle a call synchronously with
    nothing in flight (:meth:`Session.settle`).
    """

    def __init__(self, bound: int) -> None:
        self._bound = bound
        self._items: deque[Any] = deque()
        self._ready = trio.Event()
        self._room = trio.Event()

    async def put(self, item: Any) -> None:
        await trio.lowlevel.checkpoint_if_cancelled()
        while len(self._items) >= self._bound:
            self._room = trio.Event()
            await self._room.wait()
        self._items.append(item)
        self._ready.set()

    def take(self) -> list[Any]:
        """Everything queued, now."""
        items = list(self._items)
        self._items.clear()
        self._room.set()
        return items

    async def wait(self) -> None:
        """Wait until something is queued (without taking it)."""
        while not self._items:
            self._ready = trio.Event()
            await self._ready.wait()


class EndCall(msgspec.Struct):
    """Inbox item: the provider stream ended (cleanly or not)."""

    error_class: str | None = None
    message: str = ""


class CancelCall(msgspec.Struct):
    """Inbox item: the call was cancelled (PROTOCOL section 8, row 1)."""


@dataclass(eq=False)
class PermissionRequest:
    """A tool waiting for ``allow``/``deny`` (``POST .../permissions/{perm_id}``)."""

    perm_id: str
    tool_use_id: str
    decision: str | None = None
    closed: bool = False  # decided, timed out, or the turn moved on
    decided: trio.Event = field(default_factory=trio.Event)


@dataclass
class ReplayResult:
    frames: list[bytes]
    cut: int  # the last replayed id (the seam cut)


class Session:
    """One session's state and runtime. Created and owned by :class:`gateway.node.Node`."""

    def __init__(
        self,
        node: Any,
        record: SessionRecord,
        stored: Iterable[StoredMessage] = (),
        parent: Session | None = None,
    ) -> None:
        self.node = node
        self.record = record
        self.parent = parent
        # The family shares streams (a parent's clients may take its workers'
        # events), so it shares the hold: batches waiting for their commit.
        self.family: Session = parent.family if parent else self
        self.held: deque[tuple[int, Session, list[Emitted]]] = deque()
        self.workers: list[Session] = []
        self.hub: Hub = Hub(parent.hub if parent else None, node.metrics)
        self.messages: list[Message] = []
        self.completions: dict[str, Completion] = {}
        for sm in stored:
            self.messages.append(sm.message)
            if sm.complete_event_id and sm.stop_reason and sm.complete_ts is not None:
                seq = parse_event_id(sm.complete_event_id)
                if seq is not None:
                    self.completions[sm.message.id] = Completion(
                        seq, sm.complete_ts, sm.stop_reason
                    )
        self.turn: Turn | None = None
        self.permissions: dict[str, PermissionRequest] = {}
        self.call: Call | None = None
        seqr: EventSequencer = node.sequencer
        # Catalog events of this session, newest last; everything up to
        # ``tail_floor`` may be only in the store.
        self.tail: deque[Emitted] = deque()
        self.tail_max = node.config.stream.replay_max_events
        self.tail_floor = seqr.last
        self._inbox = Inbox(256)
        self._turns_tx, self._turns_rx = trio.open_memory_channel[Turn](1)
        self.agent: Any = None  # the AgentLoop, once run() started it

    @property
    def id(self) -> str:
        return self.record.id

    # --- emission ------------------------------------------------------------

    def emit(self, payloads: Iterable[Payload | StreamEvent], turn_id: str | None) -> list[Emitted]:
        """Give each event its id and send the batch on its way (module docstring)."""
        node = self.node
        seqr: EventSequencer = node.sequencer
        store: Store = node.store
        ts = now_ms()
        sid = self.id
        out: list[Emitted] = []
        catalog = False
        for item in payloads:
            se = item if isinstance(item, StreamEvent) else stream_event(item)
            spec = EVENT_TYPES[se.type]
            seq = seqr.next()
            data = encode(
                Event(format_event_id(seq), se.type, sid, turn_id, ts, spec.actor, se.payload)
            )
            em = Emitted(seq, se.type, spec.actor, sid, turn_id, ts, data, event_frame(data))
            if spec.catalog:
                store.put_event(StoredEvent(seq, sid, se.type, ts, data))
                catalog = True
                self.tail.append(em)
                if len(self.tail) > self.tail_max:
                    self.tail_floor = self.tail.popleft().seq
            out.append(em)
        if not out:
            return out
        if self.call is not None and out[0].type in _CALL_TYPES:
            self.call.last_seq = out[-1].seq
        node.metrics.events_emitted(out)
        family = self.family
        if catalog:  # held until its commit (module docstring)
            family.held.append((store.ticket(), self, out))
            node.holding(family)
        elif family.held:  # behind the family's held batches, released with the last
            family.held.append((family.held[-1][0], self, out))
        else:
            self.publish(out)
        return out

    def publish(self, out: list[Emitted]) -> None:
        """Fan a batch out now, then apply the slow-client rule (PROTOCOL section 3).

        A failure in a subscriber is contained here: logged, counted, and the
        session goes on (the connection's own task notices its socket).
        """
        node = self.node
        try:
            overflowed = self.hub.publish(out, trio.current_time())
            for sub in overflowed:
                node.slow_client(sub)
        except Exception:
            log.exception("session %s: fan-out of %d events failed", self.id, len(out))
            node.metrics.session_failures.labels("hub").inc()

    def warn(self, subscription: str, reason: str, detail: str) -> None:
        """Emit ``bus.handler_warning`` (PROTOCOL sections 3 and 8)."""
        self.emit([BusHandlerWarning(subscription, reason, detail)], None)

    def unregistered(self, sub: Subscriber, reason: str) -> None:
        """Drop a subscription and record ``bus.subscriber_unregistered``."""
        if self.hub.unsubscribe(sub):
            self.emit([BusSubscriberUnregistered(sub.name, reason)], None)

    # --- views -----------------------------------------------------------------

    def summary(self) -> SessionSummary:
        r = self.record
        turn = self.turn
        return SessionSummary(
            id=r.id,
            workspace_path=r.workspace_path,
            active_model=r.active_model,
            routing_policy_version=r.routing_policy_version,
            cost_so_far_usd=r.cost_so_far_usd,
            turn_count=r.turn_count,
            current_turn_id=turn.id if turn else None,
            current_turn_status="in_flight" if turn else None,
            parent_session_id=r.parent_session_id,
        )

    def streaming_message(self) -> Message | None:
        """The assistant message being streamed right now, as far as it was emitted."""
        call = self.call
        if call is None or not call.translator.started or call.translator.finished:
            return None
        return call.translator.snapshot()

    def snapshot(self, limit: int) -> tuple[Snapshot, int]:
        """The ``snapshot`` frame and its cut (PROTOCOL sections 3 and 6).

        Computed synchronously, so nothing is emitted between reading the state
        and reading the cut: the cut is simply the node's last issued id.
        """
        messages = list(self.messages)
        streaming = self.streaming_message()
        if streaming is not None:
            messages.append(streaming)
        cut: int = self.node.sequencer.last
        snap = Snapshot(
            session=self.summary(),
            messages=messages[-limit:] if limit else [],
            snapshot_at_event_id=format_event_id(cut) if cut else None,
        )
        return snap, cut

    async def snapshot_durable(self, limit: int) -> tuple[Snapshot, int]:
        """:meth:`snapshot`, returned once everything it shows is durable (PROTOCOL section 9).

        Events up to its cut that are still held reach the client's queue
        later and are dropped at the seam, so nothing is lost or doubled.
        """
        snap, cut = self.snapshot(limit)
        await self.node.wait_durable()
        return snap, cut

    def scope(self, include_workers: bool) -> list[Session]:
        """This session and, when asked, its worker sessions, recursively."""
        out = [self]
        if include_workers:
            for w in self.workers:
                out += w.scope(True)
        return out

    async def replay(self, since: str, key: FilterKey, max_events: int) -> ReplayResult:
        """Every matching event after ``since``, rebuilt where it was streaming-only.

        PROTOCOL section 3: persisted catalog events, a rebuilt
        ``message.complete`` (with its original id) for each assistant message
        completed after the cursor, and one ``message.snapshot`` for a message
        still streaming. The caller registered its queue first (the seam).

        Raises:
            SubscribeRejected: ``cursor_expired`` or ``replay_too_large``.
        """
        seqr: EventSequencer = self.node.sequencer
        since_seq = parse_event_id(since)
        if since_seq is None or since_seq > seqr.last:
            raise SubscribeRejected("cursor_expired", f"{since!r} is not an event id of this node")
        if since_seq < self.node.retention_floor:
            raise SubscribeRejected(
                "cursor_expired",
                f"{since!r} is older than the retention window; subscribe with a snapshot",
            )
        sessions = self.scope(key.include_worker_sessions)
        picked: dict[int, bytes] = {}

        def check_size() -> None:
            if len(picked) > max_events:
                raise SubscribeRejected(
                    "replay_too_large",
                    f"more than replay_max_events={max_events} events after {since}; "
                    "subscribe with a snapshot",
                )

        def take(
            seq: int, type_: str, actor: str, session_id: str, frame: Callable[[], bytes]
        ) -> None:
            if key.matches(type_, actor, session_id != self.id):
                picked[seq] = frame()
                check_size()

        need_store = [s.id for s in sessions if since_seq < s.tail_floor]
        if need_store:
            await self.node.store.flush()
            after = since_seq
            while True:
                rows = await self.node.store.events_after(need_store, after, 5000)
                for row in rows:
                    actor = EVENT_TYPES[row.type].actor
                    take(row.seq, row.type, actor, row.session_id, _later(event_frame, row.data))
                if len(rows) < 5000:
                    break
                after = rows[-1].seq
        # From here on nothing awaits: tail, completions and the streaming
        # message are read in one step, after everything the store returned.
        for s in sessions:
            newer: list[Emitted] = []  # the tail after the cursor, read from its end
            for em in reversed(s.tail):
                if em.seq <= since_seq:
                    break
                newer.append(em)
            newer.reverse()
            for em in key.select(newer, s is not self):
                if em.seq not in picked:
                    picked[em.seq] = em.frame
            check_size()
            s._replay_streaming_layer(since_seq, take)
        ordered = sorted(picked)
        result = ReplayResult([picked[q] for q in ordered], ordered[-1] if ordered else since_seq)
        # Sent only once all it holds is durable: tail events may still be held.
        await self.node.wait_durable()
        return result

    def _replay_streaming_layer(self, since_seq: int, take: Callable[..., None]) -> None:
        for msg in self.messages:
            done = self.completions.get(msg.id)
            if done is None or done.seq <= since_seq:
                continue
            payload = MessageComplete(msg.id, done.stop_reason, msg.content, msg.usage or Usage())
            event = Event(
                format_event_id(done.seq), "message.complete", self.id, msg.turn_id,
                done.ts, "llm", payload,
            )  # fmt: skip
            take(done.seq, "message.complete", "llm", self.id, _later(_frame_of, event))
        streaming = self.streaming_message()
        call = self.call
        if streaming is not None and call is not None and call.last_seq > since_seq:
            # An id of its own (ids are never reused, PROTOCOL section 1), above
            # every delta folded into it: the seam drops those live deltas.
            seq = self.node.sequencer.next()
            event = Event(
                format_event_id(seq), "message.snapshot", self.id, call.turn_id,
                now_ms(), "llm", MessageSnapshot(streaming),
            )  # fmt: skip
            take(seq, "message.snapshot", "llm", self.id, _later(_frame_of, event))

    # --- turns -------------------------------------------------------------------

    def submit_turn(self, user_message: Message) -> Turn:
        """Take a turn (the turn lock), to run on the agent loop (PROTOCOL section 2).

        Raises:
            ApiError: 409 ``turn_in_progress``; 503 ``shutting_down``.
        """
        if self.node.shutting_down:
            raise ApiError(503, "shutting_down", "the gateway is shutting down")
        if self.turn is not None:
            raise ApiError(
                409, "turn_in_progress", f"turn {self.turn.id} is still in flight on {self.id}"
            )
        turn = Turn(user_message.turn_id or new_turn_id(), user_message)
        self.turn = turn
        self._turns_tx.send_nowait(turn)
        return turn

    async def accepted(self, turn: Turn) -> None:
        """Return once the turn's ``turn.started`` (and its user message) is durable.

        ``POST .../turns`` answers 202 then, so an accepted turn survives a
        crash (PROTOCOL section 9).

        Raises:
            ApiError: 503 ``store_unavailable`` past ``commit_timeout_s``.
        """
        with trio.move_on_after(self.node.config.store.commit_timeout_s):
            await turn.started.wait()
        await self.node.durable_or_503()

    def cancel_turn(self, turn_id: str, reason: str, requested_by: str) -> None:
        """Cancel the turn in flight (PROTOCOL section 8), whoever asks.

        A second cancel of a cancelling turn is a no-op plus ``bus.handler_warning``.

        Raises:
            ApiError: 404 ``turn_not_found`` for a turn this session never had;
                409 ``turn_not_in_flight`` for a finished one.
        """
        turn = self.turn
        if turn is None or turn.id != turn_id:
            if any(m.turn_id == turn_id for m in self.messages):
                raise ApiError(409, "turn_not_in_flight", f"turn {turn_id} has already ended")
            raise ApiError(404, "turn_not_found", f"no turn {turn_id!r} in {self.id}")
        if not turn.request_cancel(reason):
            self.warn(requested_by, "cancel_ignored", f"turn {turn_id} is already cancelling")

    def decide_permission(self, perm_id: str, decision: str) -> None:
        """Resolve a pending permission (PROTOCOL section 2).

        Raises:
            ApiError: 404 ``permission_not_found``; 409 if already resolved.
        """
        request = self.permissions.get(perm_id)
        if request is None:
            raise ApiError(404, "permission_not_found", f"no permission {perm_id!r} in {self.id}")
        if request.closed or request.decision is not None:
            raise ApiError(409, "permission_resolved", f"permission {perm_id} is no longer waiting")
        request.decision = decision
        request.decided.set()

    def add_message(self, message: Message, completion: Completion | None = None) -> None:
        """Append or replace a message of the conversation, in memory and in the store."""
        for i, m in enumerate(self.messages):
            if m.id == message.id:
                self.messages[i] = message
                break
        else:
            self.messages.append(message)
        if completion is not None:
            self.completions[message.id] = completion
        self.node.store.put_message(
            StoredMessage(
                message,
                format_event_id(completion.seq) if completion else None,
                completion.stop_reason if completion else None,
                completion.ts if completion else None,
            )
        )

    def save_record(self) -> None:
        self.node.store.put_session(self.record)

    # --- runtime -------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The session nursery: the agent loop and the translator (module docstring).

        The failure boundary: if either task fails, the failure is logged and
        counted, the turn in flight is closed for every client, and both tasks
        start again for the next turn. A session failing over and over (five
        times within a second) pauses a second before it starts again.
        """
        from gateway.session.agent import AgentLoop

        agent = self.agent = AgentLoop(self)
        recent: deque[float] = deque(maxlen=5)
        while True:
            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._translate_loop, name=f"translator {self.id}")
                    nursery.start_soon(agent.run, self._turns_rx, name=f"agent-loop {self.id}")
                    task_status.started()
                    task_status = trio.TASK_STATUS_IGNORED
                return
            except Exception as exc:
                self.failed("session", exc)
                agent.abort()
                recent.append(time.monotonic())
                if len(recent) == recent.maxlen and recent[-1] - recent[0] < 1.0:
                    await trio.sleep(1.0)

    def failed(self, component: str, exc: BaseException, turn_id: str | None = None) -> None:
        """Log a failure caught at this session's boundary, once, and count it."""
        where = f" in turn {turn_id}" if turn_id else ""
        log.error(
            "session %s: %s failed%s: %s: %s",
            self.id, component, where, type(exc).__name__, exc, exc_info=exc,
        )  # fmt: skip
        self.node.metrics.session_failures.labels(component).inc()

    async def feed(self, raw: Any) -> None:
        """Agent loop -> translator task: one raw provider event."""
        await self._inbox.put(raw)

    def settle(self, end: EndCall | CancelCall) -> None:
        """End the call in flight now: translate what is still queued, then ``end``.

        Synchronous, in the agent loop's own step, so that ending a call never
        waits on the translator task (which a hard cancel may have stopped
        already): the translator task streams, the agent loop settles.
        """
        call = self.call
        if call is None:
            return
        self._process(call, [*self._inbox.take(), end])

    async def _translate_loop(self) -> None:
        """Drain what the provider has ready, translate it, emit it as one batch.

        Batches grow with load. When the translator is woken within
        ``batch_window_ms`` of its last batch (the provider is streaming faster
        than that), it first waits until every other task of the gateway is
        blocked (the writers have sent the last batch), at most
        ``batch_window_ms``, and takes all that came meanwhile: under load, a
        per-event cost per client becomes a per-batch one. Woken after a
        longer pause, it emits at once: waiting could not gather more, and
        costs a cancel scope and a trip through the scheduler per event.
        """
        window = self.node.config.stream.batch_window_ms / 1000
        last = -math.inf
        while True:
            await self._inbox.wait()
            if window and trio.current_time() - last < window:
                with trio.move_on_after(window):
                    await trio.testing.wait_all_tasks_blocked()
            # Taken and processed in one step: nothing is held across an
            # await, so the agent loop's settle() can never miss an item.
            items = self._inbox.take()
            call = self.call
            if items and call is not None:
                try:
                    self._process(call, items)
                except Exception as exc:
                    self.failed("translator", exc, call.turn_id)
                    self.break_call(call, exc)
            last = trio.current_time()

    def break_call(self, call: Call, exc: BaseException) -> None:
        """End a call whose translation or emission failed, as a provider error would.

        The message is closed for clients (``message.complete`` with
        ``stop_reason: error``) as far as they saw it: ends lost with a failed
        emission are sent again for blocks whose start went out, and nothing
        of a message whose start was lost. The agent loop then emits
        ``llm.call_failed`` and ends the turn (PROTOCOL section 7).
        """
        if call.done.is_set():
            return
        call.error_class = "api_error"
        call.error_message = f"the gateway failed to stream the call: {type(exc).__name__}"
        tr = call.translator
        try:
            lost = call.lost
            lost_types = {e.type for e in lost}
            if "message.start" in lost_types:
                tr.fail(call.error_class, call.error_message)
                self._finish_call(call, [])
                return
            started = {_block(e) for e in lost if e.type in _BLOCK_STARTS}
            out = [e for e in lost if e.type in _BLOCK_ENDS and _block(e) not in started]
            if not tr.finished:
                out += [
                    e for e in tr.fail(call.error_class, call.error_message)
                    if _block(e) not in started
                ]  # fmt: skip
                self._finish_call(call, self.emit(out, call.turn_id) if out else [])
                return
            message = tr.message
            if "message.complete" in lost_types and message is not None:
                usage = message.usage or Usage()
                complete = MessageComplete(message.id, "error", message.content, usage)
                out.append(stream_event(complete))
                emitted = self.emit(out, call.turn_id)
                failed = msgspec.structs.replace(message, status="error")
                self.add_message(failed, Completion(emitted[-1].seq, emitted[-1].ts, "error"))
            elif out:
                self.emit(out, call.turn_id)
        except Exception as again:
            self.failed("translator", again, call.turn_id)
        finally:
            if self.call is call:
                self.call = None
            call.done.set()

    def _process(self, call: Call, items: list[Any]) -> None:
        events: list[StreamEvent] = []
        for item in items:
            events += self._translate(call, item)
        try:
            emitted = self.emit(events, call.turn_id) if events else []
        except Exception:
            call.lost += events
            raise
        if call.translator.finished or _ended(items):
            self._finish_call(call, emitted)
        elif any(e.type in _DURABLE_POINTS for e in events):
            # The message so far is stored as its blocks end, so that a crash
            # keeps what was finished (PROTOCOL section 9).
            self.node.store.put_message(StoredMessage(call.translator.snapshot(), None))

    def _translate(self, call: Call, item: Any) -> list[StreamEvent]:
        tr = call.translator
        if isinstance(item, EndCall):
            if item.error_class is not None:
                call.error_class, call.error_message = item.error_class, item.message
                return tr.fail(item.error_class, item.message)
            if not tr.finished:
                call.error_class = "network"
                call.error_message = "the model stream ended before message_stop"
                return tr.fail(call.error_class, call.error_message)
            return []
        if isinstance(item, CancelCall):
            call.error_class, call.error_message = "cancelled", "cancelled"
            return tr.cancel()
        if tr.finished:
            return []
        try:
            return tr.feed(item)
        except ProviderError as exc:  # a provider breaking the stream protocol
            log.warning("session %s: provider stream rejected: %s", self.id, exc)
            call.error_class, call.error_message = "api_error", str(exc)
            return tr.fail("api_error", str(exc))
        except Exception as exc:  # the translator's own bug: that call fails
            self.failed("translator", exc, call.turn_id)
            call.error_class = "api_error"
            call.error_message = f"the gateway failed to translate the stream: {type(exc).__name__}"
            return tr.fail(call.error_class, call.error_message)

    def _finish_call(self, call: Call, emitted: list[Emitted]) -> None:
        if call.done.is_set():
            return
        tr = call.translator
        if tr.error is not None and call.error_class is None:
            call.error_class, call.error_message = tr.error.error_class, tr.error.message
        message = tr.message
        if message is not None:
            complete = next((e for e in reversed(emitted) if e.type == "message.complete"), None)
            completion = None
            if complete is not None and tr.stop_reason is not None:
                completion = Completion(complete.seq, complete.ts, tr.stop_reason)
            self.add_message(message, completion)
        self.call = None
        call.done.set()


_CALL_TYPES = frozenset(t for t, s in EVENT_TYPES.items() if not s.catalog)
_DURABLE_POINTS = frozenset({"message.start", "text.end", "thinking.end", "tool.use_end"})


_ENDS = (EndCall, CancelCall)


def _ended(items: list[Any]) -> bool:
    return any(isinstance(i, _ENDS) for i in items)


def _block(event: StreamEvent) -> int | None:
    index: int | None = getattr(event.payload, "content_block_index", None)
    return index


_BLOCK_STARTS = frozenset({"text.start", "thinking.start", "tool.use_start"})
_BLOCK_ENDS = frozenset({"text.end", "thinking.end", "tool.use_end"})


def _later(fn: Callable[[Any], bytes], arg: Any) -> Callable[[], bytes]:
    """``fn(arg)``, computed only if the event is picked."""
    return lambda: fn(arg)


def _frame_of(event: Event) -> bytes:
    return event_frame(encode(event))


__all__ = ["Call", "CancelCall", "Completion", "EndCall", "Inbox", "Session", "event_frame"]

"""The LLM call in flight: the agent loop feeds it, the translator task streams it.

Task tree, inside the session nursery::

    agent-loop <id>     reads the provider's stream and puts each raw event
    │                   in the call's inbox (:meth:`CallStream.feed`); once the
    │                   stream is over it settles the call (:meth:`CallStream.settle`)
    translator <id>     :meth:`CallStream.run`: takes what the inbox holds, runs it
                        through the call's :class:`~gateway.translate.Translator`
                        (sans-IO) and emits the canonical events as one batch

**Batches grow with load, and only with load.** Woken within
``batch_window_ms`` of its last batch (the provider streams faster than
that), the translator task first waits until the session's writers have
drained (:class:`gateway.session.hub.Backlog`: every client's writer has
taken what the last batch gave it), at most ``batch_window_ms``, and takes
everything that came meanwhile: under load, a per-event cost per client
becomes a per-batch one. Woken after a longer pause, or with no writer behind,
it emits at once: waiting could not gather more. The signal is the session's
own; nothing of another session, or of the process, decides its batches.

**The streaming/settling split.** The translator task streams; the agent loop
settles: ending a call (a clean end, a provider error, a cancel) translates
what is still queued and the end marker synchronously, in the agent loop's own
step, so it never waits on the translator task (which a hard cancel may have
stopped already) and a cancel can never land between the last event and the
call's end (docs/protocol.md §8, row 1).

**Failures.** A provider breaking the stream protocol fails the call as an
``api_error``; a failure of the translation or of the emission closes the
message for clients as far as they saw it (:meth:`CallStream.break_call`).
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

import msgspec
import trio

from gateway import telemetry
from gateway.errors import ProviderError
from gateway.logs import event
from gateway.metrics import Metrics
from gateway.protocol.events import EVENT_TYPES, MessageComplete, Payload, StreamEvent, stream_event
from gateway.protocol.shapes import Message, StopReason, Usage
from gateway.providers.raw import RawEvent
from gateway.session.checkpoints import Checkpoints
from gateway.session.hub import Backlog, Emitted
from gateway.translate import Translator

log = logging.getLogger("gateway.session")


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
    # Trio time the call began (gateway_time_to_first_token_seconds); None once
    # its first text or thinking delta went out.
    started_at: float | None = field(default_factory=trio.current_time)
    unkept: bool = False  # changed since last stored: marked for the checkpoint


class EndCall(msgspec.Struct):
    """Inbox item: the provider stream ended (cleanly or not)."""

    error_class: str | None = None
    message: str = ""


class CancelCall(msgspec.Struct):
    """Inbox item: the call was cancelled (docs/protocol.md §8, row 1)."""


Item = RawEvent | EndCall | CancelCall
"""What the inbox carries: the provider's raw events, then how the call ended."""


class Inbox:
    """Agent loop -> translator task: raw provider events, bounded, taken whole.

    Unlike a memory channel, it never hands an item to a waiting receiver
    ahead of time: until the translator task takes them in its own step, the
    items are here, so the agent loop can settle a call synchronously with
    nothing in flight (:meth:`CallStream.settle`).
    """

    def __init__(self, bound: int) -> None:
        self._bound = bound
        self._items: deque[Item] = deque()
        self._ready = trio.Event()
        self._room = trio.Event()

    async def put(self, item: Item) -> None:
        await trio.lowlevel.checkpoint_if_cancelled()
        while len(self._items) >= self._bound:
            self._room = trio.Event()
            await self._room.wait()
        self._items.append(item)
        self._ready.set()

    def take(self) -> list[Item]:
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


class CallHost(Protocol):
    """What a call needs of its session: emission, the conversation, failure reports."""

    @property
    def id(self) -> str:
        """The session's id (in log lines)."""
        ...

    def emit(self, payloads: Iterable[Payload | StreamEvent], turn_id: str | None) -> list[Emitted]:
        """Emit a batch of events (:meth:`gateway.session.session.Session.emit`)."""
        ...

    def add_message(self, message: Message, completion: Completion | None = None) -> None:
        """Record a finished message (and how its ``message.complete`` went out)."""
        ...

    def keep_partial(self, message: Message) -> None:
        """Store the streaming message as far as it got (docs/protocol.md §9)."""
        ...

    def failed(self, component: str, exc: BaseException, turn_id: str | None = None) -> None:
        """Log and count a failure caught at the session's boundary."""
        ...


class CallStream:
    """The call in flight and the translator task that streams it (module docstring).

    Args:
        host: the session the call's events are emitted in.
        backlog: the writers' backlog of the session's clients (the batching signal).
        window_s: ``batch_window_ms``, in seconds; 0 turns batching off.
        metrics: where each call's time to first token is observed.
        checkpoints: the node's checkpoint (``[store] checkpoint_ms``,
            :mod:`gateway.session.checkpoints`): the streaming message is
            stored within the period after it changed; None (``checkpoint_ms =
            0``): at each block's end.
    """

    def __init__(
        self,
        host: CallHost,
        backlog: Backlog,
        window_s: float,
        metrics: Metrics | None = None,
        checkpoints: Checkpoints | None = None,
    ) -> None:
        self._host = host
        self._backlog = backlog
        self._window = window_s
        self._checkpoints = checkpoints
        self._metrics = metrics
        self._inbox = Inbox(256)
        self.current: Call | None = None

    def start(self, call: Call) -> None:
        """Make ``call`` the one in flight (the agent loop, before the provider streams)."""
        self.current = call

    def streaming_message(self) -> Message | None:
        """The assistant message being streamed right now, as far as it was emitted."""
        call = self.current
        if call is None or not call.translator.started or call.translator.finished:
            return None
        return call.translator.snapshot()

    async def feed(self, raw: RawEvent) -> None:
        """Agent loop -> translator task: one raw provider event."""
        await self._inbox.put(raw)

    def settle(self, end: EndCall | CancelCall) -> None:
        """End the call in flight now: translate what is still queued, then ``end``."""
        call = self.current
        if call is None:
            return
        self._process(call, [*self._inbox.take(), end])

    async def run(self) -> None:
        """The translator task: drain what the provider has ready, emit it as one batch."""
        window = self._window
        last = -math.inf
        while True:
            await self._inbox.wait()
            if window and trio.current_time() - last < window:
                with trio.move_on_after(window):
                    await self._backlog.drained()
            # Taken and processed in one step: nothing is held across an
            # await, so the agent loop's settle() can never miss an item.
            items = self._inbox.take()
            call = self.current
            if items and call is not None:
                try:
                    self._process(call, items)
                except Exception as exc:
                    self._host.failed("translator", exc, call.turn_id)
                    self.break_call(call, exc)
            if self._checkpoints is not None:  # awake anyway: the checkpoint may ride it
                self._checkpoints.ride()
            last = trio.current_time()

    def keep_due(self) -> None:
        """The node's checkpoint is due: store the streaming message if it changed since.

        A failure to store it fails the call, as a failed emission does.
        """
        call = self.current
        if call is None or not call.unkept:
            return
        call.unkept = False  # stored now, or there is nothing left to store
        if call.translator.finished:
            return
        try:
            self._keep(call)
        except Exception as exc:
            self._host.failed("translator", exc, call.turn_id)
            self.break_call(call, exc)

    def _keep(self, call: Call) -> None:
        """Store the streaming message as far as it was emitted (docs/protocol.md §9)."""
        self._host.keep_partial(call.translator.snapshot())
        call.unkept = False

    def break_call(self, call: Call, exc: BaseException) -> None:
        """End a call whose translation or emission failed, as a provider error would.

        The message is closed for clients (``message.complete`` with
        ``stop_reason: error``) as far as they saw it: ends lost with a failed
        emission are sent again for blocks whose start went out, and nothing
        of a message whose start was lost. The agent loop then emits
        ``llm.call_failed`` and ends the turn (docs/protocol.md §7).
        """
        if call.done.is_set():
            return
        host = self._host
        call.error_class = "api_error"
        call.error_message = f"the gateway failed to stream the call: {type(exc).__name__}"
        tr = call.translator
        try:
            lost = call.lost
            lost_types = {e.type for e in lost}
            if "message.start" in lost_types:
                tr.fail(call.error_class, call.error_message)
                self._finish(call, [])
                return
            started = {_block(e) for e in lost if e.type in _BLOCK_STARTS}
            out = [e for e in lost if e.type in _BLOCK_ENDS and _block(e) not in started]
            if not tr.finished:
                out += [
                    e for e in tr.fail(call.error_class, call.error_message)
                    if _block(e) not in started
                ]  # fmt: skip
                self._finish(call, host.emit(out, call.turn_id) if out else [])
                return
            message = tr.message
            if "message.complete" in lost_types and message is not None:
                usage = message.usage or Usage()
                complete = MessageComplete(message.id, "error", message.content, usage)
                out.append(stream_event(complete))
                emitted = host.emit(out, call.turn_id)
                failed = msgspec.structs.replace(message, status="error")
                host.add_message(failed, Completion(emitted[-1].seq, emitted[-1].ts, "error"))
            elif out:
                host.emit(out, call.turn_id)
        except Exception as again:
            host.failed("translator", again, call.turn_id)
        finally:
            if self.current is call:
                self.current = None
            call.done.set()
            _traced(call)

    def _process(self, call: Call, items: list[Item]) -> None:
        events: list[StreamEvent] = []
        for item in items:
            events += self._translate(call, item)
        try:
            emitted = self._host.emit(events, call.turn_id) if events else []
        except Exception:
            call.lost += events
            raise
        if call.started_at is not None and emitted:
            self._first_token(call, emitted)
        if call.translator.finished or _ended(items):
            self._finish(call, emitted)
            return
        # The message so far is stored so that a crash keeps what clients were
        # shown (docs/protocol.md §9): at message.start, then at the node's
        # node's checkpoint within the period after it changed (a block ended,
        # text streamed: gateway.session.checkpoints, every session's in one
        # step, so in one commit), or at each block's end with no checkpoint. Bounded by time,
        # the cost stays flat however many blocks a message has (each store is
        # a snapshot of the whole message); bench/crash_loss.py measures what
        # a kill loses.
        kinds = {e.type for e in events}
        checkpoints = self._checkpoints
        if "message.start" in kinds or (checkpoints is None and kinds & _BLOCK_ENDS):
            self._keep(call)
        elif checkpoints is not None and not call.unkept and kinds & _CHANGES:
            call.unkept = True
            checkpoints.mark(self)

    def _translate(self, call: Call, item: Item) -> list[StreamEvent]:
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
            event(
                log, logging.WARNING, "provider_stream_rejected",
                f"turn {call.turn_id}: provider stream rejected: {exc}",
                session_id=self._host.id, turn_id=call.turn_id, error=str(exc),
            )  # fmt: skip
            call.error_class, call.error_message = "api_error", str(exc)
            return tr.fail("api_error", str(exc))
        except Exception as exc:  # the translator's own bug: that call fails
            self._host.failed("translator", exc, call.turn_id)
            call.error_class = "api_error"
            call.error_message = f"the gateway failed to translate the stream: {type(exc).__name__}"
            return tr.fail(call.error_class, call.error_message)

    def _first_token(self, call: Call, emitted: list[Emitted]) -> None:
        """Observe the call's time to first token, at its first text or thinking delta.

        Once per call (``started_at`` is cleared); the batches before it cost
        one scan of their types, the ones after it nothing.
        """
        started = call.started_at
        if started is None or not any(e.type in _FIRST_TOKENS for e in emitted):
            return
        call.started_at = None
        if self._metrics is not None:
            self._metrics.time_to_first_token.observe(trio.current_time() - started)

    def _finish(self, call: Call, emitted: list[Emitted]) -> None:
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
            self._host.add_message(message, completion)
        self.current = None
        call.done.set()
        _traced(call)


def _traced(call: Call) -> None:
    """The call's ``chat`` span ends (:mod:`gateway.telemetry`; nothing when traces are off)."""
    if telemetry.current() is None:
        return
    message = call.translator.message
    usage = (message.usage if message else None) or call.translator.usage
    telemetry.call_ended(
        call.turn_id,
        call.error_class,
        call.error_message,
        message.model if message else None,
        message.id if message else None,
        call.translator.stop_reason,
        usage.input_tokens,
        usage.output_tokens,
    )


CALL_TYPES = frozenset(t for t, s in EVENT_TYPES.items() if not s.catalog)
"""The streaming-only event types: a call's message, as it streams (docs/protocol.md §5)."""

_FIRST_TOKENS = frozenset({"text.delta", "thinking.delta"})
_CHANGES = frozenset(
    {"text.delta", "thinking.delta", "tool.use_input_delta", "text.end", "thinking.end",
     "tool.use_end"}
)  # fmt: skip
_BLOCK_STARTS = frozenset({"text.start", "thinking.start", "tool.use_start"})
_BLOCK_ENDS = frozenset({"text.end", "thinking.end", "tool.use_end"})
_ENDS = (EndCall, CancelCall)


def _ended(items: list[Item]) -> bool:
    return any(isinstance(i, _ENDS) for i in items)


def _block(event: StreamEvent) -> int | None:
    index: int | None = getattr(event.payload, "content_block_index", None)
    return index

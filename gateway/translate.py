"""The translator: one LLM call's raw stream in, canonical stream events out.

Sans-IO, like h11's ``Connection``: no sockets, no awaits. The session's
translator task feeds it every :mod:`raw event <gateway.providers.raw>` of one
call and emits what :meth:`Translator.feed` returns; every provider (scripted,
Anthropic, OpenAI-compatible) goes through this one class.

It implements docs/protocol.md §5 (every block has an explicit start, deltas
and end; ``message.complete`` carries the authoritative ``final_content``),
section 7 (a provider error closes the open blocks, then ``message.complete``
with ``stop_reason: error``) and section 8 row 1 (a cancel during the stream
closes the open blocks, then ``message.complete`` with ``stop_reason:
cancelled``). The ``llm.call_*`` and ``turn.*`` events that follow belong to
the session, not to this class.

The whole lifecycle lives in the tables :data:`_MESSAGE_MOVES`,
:data:`_BLOCK_MOVES` and :data:`_ACCEPTED_DELTAS`::

    message  awaiting_start --message_start--> streaming --message_stop, error--> finished
             (cancel() and fail() finish it from any phase; once finished they do nothing)
    block    unseen --content_block_start--> open --content_block_stop--> closed
             deltas only while open, and only of a kind the block's type accepts

Any other move raises ``ProviderError("api_error", ...)`` naming it, before
anything changes, so the caller can still :meth:`~Translator.fail` the
translator to close what is open.

Where the contract is silent:

- Stop reasons Anthropic has and the contract lacks (``pause_turn``,
  ``refusal``, any future one) become ``end_turn``: the model stopped of its
  own accord and nothing is left to run. ``message_stop`` without any
  ``stop_reason`` is ``end_turn`` too.
- ``message_stop`` with blocks still open closes them first, so every block
  still gets its end.
- A block that opens with content (``content_block_start`` carrying text, a
  thinking signature or a non-empty tool input) is treated as an empty block
  followed by a delta of that content, so the deltas always add up to
  ``final_content``.
- A tool block's ``final_input`` is :func:`gateway.partial_json.best_effort`
  of its input: the object itself when the JSON is one whole object, the
  largest parseable prefix when it was cut or malformed, ``{}`` when empty or
  not an object. A model's malformed input then reaches the tool layer
  (which can refuse it) instead of failing the call.
- ``content_block_index`` is the block's position in order of start, from 0
  (docs/protocol.md §5), whatever index the provider gave it: a provider may
  start at 1 or skip indices (Anthropic's server tool blocks). The provider's
  index only addresses the block's deltas and stop.
- Several ``signature_delta`` events in one thinking block are concatenated,
  as text is.
- Usage fields are "last wins" across ``message_start`` and
  ``message_delta`` (Anthropic's counts are cumulative); ``cost_usd`` comes from
  the ``pricing`` callable, for cancelled and failed calls too: their tokens
  were spent.
- An ``error`` event (or :meth:`~Translator.fail`) before ``message_start``
  ends the translator with no events and no message; :attr:`Translator.error`
  is set either way.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, ClassVar

import msgspec

from gateway.errors import ProviderError
from gateway.partial_json import best_effort
from gateway.protocol.events import (
    MessageComplete,
    MessageStart,
    StreamEvent,
    TextDelta,
    TextEnd,
    TextStart,
    ThinkingDelta,
    ThinkingEnd,
    ThinkingStart,
    ToolUseEnd,
    ToolUseInputDelta,
    ToolUseStart,
    stream_event,
)
from gateway.protocol.shapes import (
    ContentBlock,
    Message,
    MessageStatus,
    RedactedThinkingBlock,
    StopReason,
    TextBlock,
    ThinkingBlock,
    ToolUseBlock,
    Usage,
)
from gateway.providers.raw import (
    ERROR_CLASSES,
    RawContentBlock,
    RawContentBlockDelta,
    RawContentBlockStart,
    RawContentBlockStop,
    RawDelta,
    RawError,
    RawEvent,
    RawInputJsonDelta,
    RawMessageDelta,
    RawMessageStart,
    RawMessageStop,
    RawPing,
    RawRedactedThinkingBlock,
    RawSignatureDelta,
    RawTextBlock,
    RawTextDelta,
    RawThinkingBlock,
    RawThinkingDelta,
    RawToolUseBlock,
    RawUsage,
)

# Anthropic stop reasons the contract knows; any other becomes end_turn.
_STOP_REASONS: dict[str, StopReason] = {
    "end_turn": "end_turn",
    "max_tokens": "max_tokens",
    "stop_sequence": "stop_sequence",
    "tool_use": "tool_use",
}
_USAGE_FIELDS = (
    "input_tokens",
    "output_tokens",
    "cache_read_input_tokens",
    "cache_creation_input_tokens",
)


class _Chunks:
    """Text that arrives in pieces: O(1) to append on the hot path, joined when read."""

    __slots__ = ("_parts",)

    def __init__(self) -> None:
        self._parts: list[str] = []

    def append(self, part: str) -> None:
        self._parts.append(part)

    def joined(self) -> str:
        if len(self._parts) > 1:
            self._parts = ["".join(self._parts)]  # later reads start from here
        return self._parts[0] if self._parts else ""


# --- the four block kinds -----------------------------------------------------


class _BlockState(enum.Enum):
    # The values complete "content block N, which ..." in error messages.
    UNSEEN = "was never opened"
    OPEN = "is already open"
    CLOSED = "is already closed"


class _Block(ABC):
    """One content block of the message: its buffers and its canonical events."""

    kind: ClassVar[str]  # the ContentBlock type, for error messages

    def __init__(self, message_id: str, index: int, opening: list[RawDelta]) -> None:
        self.message_id = message_id
        self.index = index
        self.state = _BlockState.UNSEEN
        self._opening = opening

    def start(self) -> list[StreamEvent]:
        """The start event, then a delta for each piece of content it opened with."""
        return [self._start_event(), *(self.delta(delta) for delta in self._opening)]

    @abstractmethod
    def _start_event(self) -> StreamEvent: ...

    @abstractmethod
    def delta(self, delta: RawDelta) -> StreamEvent:
        """Record one delta (of a kind :data:`_ACCEPTED_DELTAS` admits) and echo it."""

    @abstractmethod
    def end(self) -> StreamEvent: ...

    @abstractmethod
    def content(self) -> ContentBlock:
        """The block as it stands: final once ended, partial before."""


class _Text(_Block):
    kind = "text"

    def __init__(self, message_id: str, index: int, opening: RawTextBlock) -> None:
        super().__init__(message_id, index, [RawTextDelta(opening.text)] if opening.text else [])
        self._text = _Chunks()

    def _start_event(self) -> StreamEvent:
        return stream_event(TextStart(self.message_id, self.index))

    def delta(self, delta: RawDelta) -> StreamEvent:
        assert isinstance(delta, RawTextDelta)
        self._text.append(delta.text)
        return stream_event(TextDelta(self.message_id, self.index, delta.text))

    def end(self) -> StreamEvent:
        return stream_event(TextEnd(self.message_id, self.index))

    def content(self) -> ContentBlock:
        return TextBlock(self._text.joined())


class _Thinking(_Block):
    kind = "thinking"

    def __init__(self, message_id: str, index: int, opening: RawThinkingBlock) -> None:
        deltas: list[RawDelta] = []
        if opening.thinking:
            deltas.append(RawThinkingDelta(opening.thinking))
        if opening.signature:
            deltas.append(RawSignatureDelta(opening.signature))
        super().__init__(message_id, index, deltas)
        self._thinking = _Chunks()
        self._signature = _Chunks()

    def _start_event(self) -> StreamEvent:
        return stream_event(ThinkingStart(self.message_id, self.index, redacted=False))

    def delta(self, delta: RawDelta) -> StreamEvent:
        if isinstance(delta, RawSignatureDelta):
            self._signature.append(delta.signature)
            return stream_event(ThinkingDelta(self.message_id, self.index, "", delta.signature))
        assert isinstance(delta, RawThinkingDelta)
        self._thinking.append(delta.thinking)
        return stream_event(ThinkingDelta(self.message_id, self.index, delta.thinking, None))

    def end(self) -> StreamEvent:
        signature = self._signature.joined() or None
        return stream_event(ThinkingEnd(self.message_id, self.index, signature))

    def content(self) -> ContentBlock:
        return ThinkingBlock(self._thinking.joined(), self._signature.joined() or None)


class _RedactedThinking(_Block):
    """Encrypted reasoning: it opens with all its data and takes no delta from the provider.

    Its data goes out as the one ``thinking.delta`` of the block (``redacted:
    true`` on the start says the text is opaque), so that this block too is
    rebuilt from its own start, deltas and end, like every other.
    """

    kind = "redacted_thinking"

    def __init__(self, message_id: str, index: int, opening: RawRedactedThinkingBlock) -> None:
        super().__init__(message_id, index, [RawThinkingDelta(opening.data)])
        self._data = opening.data

    def _start_event(self) -> StreamEvent:
        return stream_event(ThinkingStart(self.message_id, self.index, redacted=True))

    def delta(self, delta: RawDelta) -> StreamEvent:
        # Only the opening delta gets here: _ACCEPTED_DELTAS admits none from the provider.
        assert isinstance(delta, RawThinkingDelta)
        return stream_event(ThinkingDelta(self.message_id, self.index, delta.thinking, None))

    def end(self) -> StreamEvent:
        return stream_event(ThinkingEnd(self.message_id, self.index, None))

    def content(self) -> ContentBlock:
        return RedactedThinkingBlock(self._data)


class _ToolUse(_Block):
    kind = "tool_use"

    def __init__(self, message_id: str, index: int, opening: RawToolUseBlock) -> None:
        deltas: list[RawDelta] = []
        if opening.input:
            deltas.append(RawInputJsonDelta(msgspec.json.encode(opening.input).decode()))
        super().__init__(message_id, index, deltas)
        self._id = opening.id
        self._name = opening.name
        self._json = _Chunks()
        self._final_input: dict[str, Any] | None = None

    def _start_event(self) -> StreamEvent:
        return stream_event(ToolUseStart(self.message_id, self.index, self._id, self._name))

    def delta(self, delta: RawDelta) -> StreamEvent:
        assert isinstance(delta, RawInputJsonDelta)
        self._json.append(delta.partial_json)
        return stream_event(
            ToolUseInputDelta(self.message_id, self.index, self._id, delta.partial_json)
        )

    def end(self) -> StreamEvent:
        self._final_input = best_effort(self._json.joined())
        return stream_event(
            ToolUseEnd(self.message_id, self.index, self._id, self._name, self._final_input)
        )

    def content(self) -> ContentBlock:
        final_input = self._final_input
        if final_input is None:
            final_input = best_effort(self._json.joined())
        return ToolUseBlock(self._id, self._name, final_input)


def _open_block(message_id: str, index: int, opening: RawContentBlock) -> _Block:
    match opening:
        case RawTextBlock():
            return _Text(message_id, index, opening)
        case RawThinkingBlock():
            return _Thinking(message_id, index, opening)
        case RawRedactedThinkingBlock():
            return _RedactedThinking(message_id, index, opening)
        case RawToolUseBlock():
            return _ToolUse(message_id, index, opening)


# --- the lifecycle: every legal move, and nothing else -------------------------


class _Phase(enum.Enum):
    # The values complete "<event> received ..." in error messages.
    AWAITING_START = "before message_start"
    STREAMING = "while the message is streaming"
    FINISHED = "after the message ended"


_MESSAGE_MOVES: dict[tuple[_Phase, type[msgspec.Struct]], _Phase] = {
    (_Phase.AWAITING_START, RawMessageStart): _Phase.STREAMING,
    (_Phase.AWAITING_START, RawPing): _Phase.AWAITING_START,
    (_Phase.AWAITING_START, RawError): _Phase.FINISHED,
    (_Phase.STREAMING, RawContentBlockStart): _Phase.STREAMING,
    (_Phase.STREAMING, RawContentBlockDelta): _Phase.STREAMING,
    (_Phase.STREAMING, RawContentBlockStop): _Phase.STREAMING,
    (_Phase.STREAMING, RawMessageDelta): _Phase.STREAMING,
    (_Phase.STREAMING, RawPing): _Phase.STREAMING,
    (_Phase.STREAMING, RawMessageStop): _Phase.FINISHED,
    (_Phase.STREAMING, RawError): _Phase.FINISHED,
}

_BLOCK_MOVES: dict[tuple[_BlockState, type[msgspec.Struct]], _BlockState] = {
    (_BlockState.UNSEEN, RawContentBlockStart): _BlockState.OPEN,
    (_BlockState.OPEN, RawContentBlockDelta): _BlockState.OPEN,
    (_BlockState.OPEN, RawContentBlockStop): _BlockState.CLOSED,
}

_ACCEPTED_DELTAS: dict[type[_Block], frozenset[type[msgspec.Struct]]] = {
    _Text: frozenset({RawTextDelta}),
    _Thinking: frozenset({RawThinkingDelta, RawSignatureDelta}),
    _RedactedThinking: frozenset(),
    _ToolUse: frozenset({RawInputJsonDelta}),
}


def _name(raw: msgspec.Struct) -> str:
    """A raw event's or delta's wire name, e.g. ``content_block_delta``."""
    return str(raw.__struct_config__.tag)


BYTES_PER_BLOCK = 512
"""What a block may need of a snapshot frame once cut to its bare shape, with room to spare."""


def max_blocks(snapshot_max_bytes: int) -> int:
    """The most content blocks of one message: whatever it holds, a snapshot carries it.

    docs/protocol.md §15: a snapshot frame is never larger than
    ``snapshot_max_bytes``, and a message still streaming is always in it (its
    live deltas name it, so it cannot be left out): cut to their bare shapes
    (gateway.protocol.fit), its blocks must fit. A bare block is a few dozen
    bytes (a tool use's id and name a few hundred at most), so a message of at
    most ``snapshot_max_bytes / 512`` blocks always does, with half the frame
    to spare: 128 blocks at the smallest cap (64 KiB), 16,384 at the default.
    A provider sending more fails the call (``api_error``, naming the limit).
    """
    return snapshot_max_bytes // BYTES_PER_BLOCK


def _illegal(problem: str) -> ProviderError:
    return ProviderError("api_error", f"illegal provider stream: {problem}")


# --- the translator ---------------------------------------------------------------


class Translator:
    """Turns the raw events of one LLM call into canonical stream events.

    Args:
        session_id: the session the message belongs to.
        turn_id: the turn it belongs to.
        model: the model asked for; used when ``message_start`` names none.
        created_at: the message's ``created_at`` (ms since the epoch).
        pricing: the cost in USD of a usage, if known; it fills ``cost_usd``.
        max_blocks: the most content blocks a message may have, or None for no
            limit; the block beyond is an illegal move (:func:`max_blocks`).
    """

    def __init__(
        self,
        *,
        session_id: str,
        turn_id: str | None,
        model: str,
        created_at: int,
        pricing: Callable[[Usage], float | None] | None = None,
        max_blocks: int | None = None,
    ) -> None:
        self._max_blocks = max_blocks
        self._session_id = session_id
        self._turn_id = turn_id
        self._model = model
        self._created_at = created_at
        self._pricing = pricing
        self._phase = _Phase.AWAITING_START
        self._message_id: str | None = None
        # By the provider's index, in order of start (the order of canonical indices).
        self._blocks: dict[int, _Block] = {}
        self._usage = Usage()
        self._stop_reason: StopReason | None = None
        self._message: Message | None = None
        self.error: ProviderError | None = None
        """Why the call failed: the fed ``error`` event, or what :meth:`fail` was told."""

    # --- state ---

    @property
    def message_id(self) -> str | None:
        """The provider's message id, from ``message_start``."""
        return self._message_id

    @property
    def started(self) -> bool:
        return self._message_id is not None

    @property
    def finished(self) -> bool:
        return self._phase is _Phase.FINISHED

    @property
    def stop_reason(self) -> StopReason | None:
        """The provider's stop reason so far; the final one once finished."""
        return self._stop_reason

    @property
    def usage(self) -> Usage:
        """Token counts so far, priced when a ``pricing`` was given."""
        return self._priced_usage()

    @property
    def message(self) -> Message | None:
        """The finished message (status complete, cancelled or error), else ``None``."""
        return self._message

    def snapshot(self) -> Message:
        """The message as it stands, for ``message.snapshot`` and ``snapshot`` frames.

        Status ``in_progress`` while streaming (text and thinking so far, tool
        input parsed best-effort, ``open_block_index`` the position of the
        block still streaming or ``None``: docs/protocol.md §6); once finished,
        the finished message.

        Raises:
            RuntimeError: there is no message yet (before ``message_start``).
        """
        if self._message is not None:
            return self._message
        if self._message_id is None:
            raise RuntimeError("no message to snapshot before message_start")
        message = self._message_of("in_progress", self._content(), self._priced_usage())
        # One block streams at a time (providers open the next after the last
        # ends); were several open, the last is the one deltas continue in.
        open_at = [
            block.index for block in self._blocks.values() if block.state is _BlockState.OPEN
        ]
        message.open_block_index = open_at[-1] if open_at else None
        return message

    # --- input ---

    def feed(self, raw: RawEvent) -> list[StreamEvent]:
        """Translate one raw event.

        Returns:
            The canonical events it causes, in order (often one, maybe none).

        Raises:
            ProviderError: ``api_error``, the event is an illegal move; the
                translator is left as it was.
        """
        then = _MESSAGE_MOVES.get((self._phase, type(raw)))
        if then is None:
            raise _illegal(f"{_name(raw)} received {self._phase.value}")
        match raw:
            case RawContentBlockDelta():  # the hot path first
                events = [self._delta(raw)]
            case RawContentBlockStart():
                events = self._start_block(raw)
            case RawContentBlockStop():
                events = [self._stop_block(raw)]
            case RawMessageDelta():
                self._record_usage(raw.usage)
                if raw.delta.stop_reason is not None:
                    self._stop_reason = _STOP_REASONS.get(raw.delta.stop_reason, "end_turn")
                events = []
            case RawMessageStart():
                events = [self._start_message(raw)]
            case RawMessageStop():
                events = self._finish("complete", self._stop_reason or "end_turn")
            case RawError():
                error_class = ERROR_CLASSES.get(raw.error.type, "api_error")
                events = self._fail(ProviderError(error_class, raw.error.message))
            case RawPing():
                events = []
        self._phase = then
        return events

    def cancel(self) -> list[StreamEvent]:
        """End the message as cancelled (docs/protocol.md §8, during an LLM stream).

        Returns:
            The end of every open block, in index order (a tool's
            ``final_input`` is what parses of its input), then
            ``message.complete`` with ``stop_reason: cancelled`` and the partial
            content. Nothing before ``message_start`` or once finished.
        """
        if self._phase is _Phase.FINISHED:
            return []
        events = self._finish("cancelled", "cancelled") if self.started else []
        self._phase = _Phase.FINISHED
        return events

    def fail(self, error_class: str, message: str) -> list[StreamEvent]:
        """End the message as failed (docs/protocol.md §7), e.g. on a raised ProviderError.

        Returns:
            Like :meth:`cancel`, with ``stop_reason: error``. Sets :attr:`error`
            unless already finished.
        """
        if self._phase is _Phase.FINISHED:
            return []
        events = self._fail(ProviderError(error_class, message))
        self._phase = _Phase.FINISHED
        return events

    # --- transitions ---

    def _start_message(self, raw: RawMessageStart) -> StreamEvent:
        self._message_id = raw.message.id
        self._model = raw.message.model or self._model
        self._record_usage(raw.message.usage)
        return stream_event(MessageStart(raw.message.id, "assistant", self._model))

    def _move_block(
        self, raw: RawContentBlockStart | RawContentBlockDelta | RawContentBlockStop
    ) -> tuple[_Block | None, _BlockState]:
        """The block ``raw`` is about, and the state it moves to; raises if illegal."""
        block = self._blocks.get(raw.index)
        state = _BlockState.UNSEEN if block is None else block.state
        then = _BLOCK_MOVES.get((state, type(raw)))
        if then is None:
            raise _illegal(f"{_name(raw)} for content block {raw.index}, which {state.value}")
        return block, then

    def _start_block(self, raw: RawContentBlockStart) -> list[StreamEvent]:
        _, then = self._move_block(raw)
        if self._max_blocks is not None and len(self._blocks) >= self._max_blocks:
            raise ProviderError(
                "api_error",
                f"the model's message has more than {self._max_blocks} content blocks"
                " (the most a snapshot can carry: [stream] snapshot_max_bytes / "
                f"{BYTES_PER_BLOCK})",
            )
        assert self._message_id is not None  # _MESSAGE_MOVES: we are streaming
        block = _open_block(self._message_id, len(self._blocks), raw.content_block)
        block.state = then
        self._blocks[raw.index] = block
        return block.start()

    def _delta(self, raw: RawContentBlockDelta) -> StreamEvent:
        block, _ = self._move_block(raw)
        assert block is not None  # _BLOCK_MOVES: only a start meets an unseen block
        if type(raw.delta) not in _ACCEPTED_DELTAS[type(block)]:
            raise _illegal(
                f"{_name(raw.delta)} does not fit content block {raw.index}, a {block.kind} block"
            )
        return block.delta(raw.delta)

    def _stop_block(self, raw: RawContentBlockStop) -> StreamEvent:
        block, then = self._move_block(raw)
        assert block is not None  # _BLOCK_MOVES: only a start meets an unseen block
        block.state = then
        return block.end()

    def _fail(self, error: ProviderError) -> list[StreamEvent]:
        self.error = error
        return self._finish("error", "error") if self.started else []

    def _finish(self, status: MessageStatus, stop_reason: StopReason) -> list[StreamEvent]:
        """Close what is open, in index order, then ``message.complete``."""
        events = []
        for block in self._blocks.values():
            if block.state is _BlockState.OPEN:
                block.state = _BLOCK_MOVES[(block.state, RawContentBlockStop)]
                events.append(block.end())
        self._stop_reason = stop_reason
        content, usage = self._content(), self._priced_usage()
        self._message = self._message_of(status, content, usage)
        events.append(
            stream_event(MessageComplete(self._message.id, stop_reason, list(content), usage))
        )
        return events

    # --- helpers ---

    def _record_usage(self, raw: RawUsage) -> None:
        for field in _USAGE_FIELDS:
            value = getattr(raw, field)
            if value is not None:
                setattr(self._usage, field, value)

    def _priced_usage(self) -> Usage:
        usage = msgspec.structs.replace(self._usage)
        if self._pricing is not None:
            usage.cost_usd = self._pricing(usage)
        return usage

    def _content(self) -> list[ContentBlock]:
        return [block.content() for block in self._blocks.values()]

    def _message_of(
        self, status: MessageStatus, content: list[ContentBlock], usage: Usage
    ) -> Message:
        assert self._message_id is not None  # _MESSAGE_MOVES: message_start came
        return Message(
            id=self._message_id,
            session_id=self._session_id,
            turn_id=self._turn_id,
            role="assistant",
            content=content,
            status=status,
            created_at=self._created_at,
            model=self._model,
            usage=usage,
        )

"""The reference client state model: server frames in, one session's state out.

Sans-IO, like h11: a :class:`Reducer` owns no socket and never awaits; a
terminal UI or a test feeds it every server frame with :meth:`Reducer.apply`
and reads its attributes. The state is the one seed 000 argues for: the
finished messages, plus at most one *streaming* message whose blocks are
addressed by ``content_block_index`` and each go through an explicit
start -> deltas -> end lifecycle (docs/protocol.md §5). Nothing is inferred
from timing; a move the contract does not allow (a delta for a block that was
never started, for another message than the streaming one, after its end)
raises :class:`ValueError`, because it can only be a server bug.

What a client shows of this state, the two views of docs/protocol.md §10,
is :mod:`gateway.client.views`: pure functions of a reducer.
``gateway/ui/reducer.js`` is this module and that one in JS, for the browser;
tests/streaming-conformance/ holds both to the same recorded traces.

Where the contract is silent, this module decides:

- **Restored blocks.** ``message.snapshot`` (and a ``snapshot`` frame's
  ``in_progress`` message) carries a partial :class:`Message` whose
  ``open_block_index`` names the block still streaming (docs/protocol.md §6):
  every other restored block has ended, and with ``null`` all have. A server
  older than that field leaves it out; then blocks stream one at a time (the
  provider's ``content_block_start``/``_stop`` order, which the translator
  keeps), so every restored block but the last has ended, and the last stays
  open until its ``*.end`` arrives or a later block starts (had its end come
  after the snapshot, it would have arrived before that start). Either way, a
  later start also closes an earlier restored block; live blocks close only on
  their ``*.end``.
- **Restored tool input.** The snapshot carries a tool block's input parsed,
  not its raw partial JSON, and a parsed prefix cannot take more raw text. A
  restored tool block therefore shows the snapshot's input until
  ``tool.use_end`` brings ``final_input``; its later input deltas are checked
  but cannot change what it shows.
- **Finished messages.** ``message.complete`` carries neither ``model`` nor
  ``created_at``: the built message takes the model of the streaming message
  (``None`` when it was never seen, as after a replay) and the event's ``ts``.
- **Pending permissions.** A snapshot's ``pending_permissions`` are the
  requests still waiting; ``permission.requested`` adds one, and
  ``permission.resolved``, the end of its tool (``tool.completed`` or
  ``tool.failed``: a cancel leaves a request unresolved, docs/protocol.md §8)
  or the end of its turn removes it.
- **Worker sessions.** With ``include_worker_sessions`` a stream carries
  worker events (docs/protocol.md §5). Each worker session gets a reducer of
  its own in :attr:`Reducer.workers`, fed those events; it may join a worker
  mid-message (after a snapshot of the parent, which does not show workers),
  so it skips the moves it cannot make instead of raising (counted in its
  :attr:`Reducer.skipped`). ``delegate.started`` links a worker to the tool
  use and task that started it (:attr:`Reducer.links`).
- **Turns.** A snapshot's turn is in flight when ``current_turn_status`` says
  so; otherwise the session is idle and ``turn`` is ``None``. How each turn
  ended is kept in :attr:`Reducer.turn_outcomes`, as far as this client saw
  it end (a snapshot replaces what was known, as it replaces everything).
- **A busy session** (docs/protocol.md §2 "A busy session"). :attr:`Reducer.queued`
  holds the turns waiting to start, next first, with their user messages:
  ``turn.queued`` appends one (the server appends too: its ``position`` is
  where it stood then), its ``turn.started`` or its ``turn.cancelled`` with
  ``phase: "queued"`` (which ends no turn in flight) removes it, and a
  snapshot's ``queued_turns`` replaces them. A queued turn's user message is
  not a message of the conversation before its ``turn.started``. A steer the
  running turn took (``turn.steered``) is: it is put at the end of the
  finished messages, where the server stores it (after the round's tool
  results, before the next round).
- **Cut blocks** (docs/protocol.md §15). A snapshot that had to fit
  ``snapshot_max_bytes`` may leave older messages out (:attr:`Reducer.has_more`:
  page them with ``GET .../messages?before=``) and send a block cut, marked
  ``truncated``. A finished block stays as sent (the client may fetch the
  whole message by id); a restored streaming block keeps the mark while its
  deltas append to what was sent (its end: the open block is cut at its
  beginning), until ``message.complete`` brings the message whole. A tool
  result cut in the snapshot is listed in :attr:`Reducer.truncated_results`.
- **Worker requests.** A worker's ``permission.requested`` and
  ``permission.resolved`` reach the parent's stream whatever its filter
  (docs/protocol.md §5), and a parent's snapshot lists its workers' pending
  requests with their ``session_id`` (section 6): the parent keeps them in
  its own :attr:`Reducer.permissions` too, so the one who has to answer sees
  them (the worker's reducer, with ``include_worker_sessions``, as well).
- **Compactions** (docs/protocol.md §12). ``context.compacting`` opens
  :attr:`Reducer.compacting` until ``context.compacted`` (or the end of the
  turn, or a snapshot, which cannot say a compaction is under way). The event
  does not carry the summary: ``context.compacted`` puts, at the end of the
  finished messages, the ``context`` message ``summary_message_id`` names
  with a ``compaction`` block marked ``truncated`` (its summary ``""``, to be
  fetched whole with ``GET .../messages/{id}`` and :meth:`Reducer.replace_message`,
  as a block a snapshot cut) whose ``replaces`` lists the messages this
  client holds before ``first_kept_message_id``. A snapshot's ``context``
  message stands as sent. The replaced messages stay: no client loses
  history; only the model's view is shorter. A compaction without a summary
  message (``summary_message_id: null``) puts nothing.
- **Rewinds** (docs/protocol.md §2 "Edit and regenerate"). ``history.rewound``
  removes the finished messages from ``before_message_id`` on, and the tool
  results of their tool uses (a snapshot taken after it shows neither). A
  client that does not hold that message (a snapshot left it out: it is older
  than every message held) removes every message it holds, and pages on from
  it (:attr:`Reducer.oldest_message_id`: ``GET .../messages?before=`` takes a
  rewound message's id). The turn that rewound then starts as any other.
- **Forks** (docs/protocol.md §2, "Forks"). ``session.forked``, a fork's first
  event, changes nothing: the fork's copied history was never events of the
  fork (a replay from before it holds none of it), so a client gets it from
  the fork's snapshot, as every client that attaches with one does.
- **Files** (docs/protocol.md §2 "Files"). A message's ``image``, ``document``
  and ``audio`` blocks are kept as they came (references: the bytes are never
  in a frame). A tool's files (``tool.completed.files``, a stored
  ``tool_result`` block's ``files``) are in its :class:`ToolOutcome`.
- **Duplicates.** Event ids compare as strings (docs/protocol.md §1). The server
  promises each event once (section 3), so the reducer compares ids only to
  prove it: an event at or below the cursor is counted in
  :attr:`Reducer.duplicates_ignored` and otherwise ignored.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

import msgspec

from gateway.partial_json import best_effort
from gateway.protocol.events import (
    ContextCompacted,
    ContextCompacting,
    DelegateStarted,
    Event,
    HistoryRewound,
    MessageComplete,
    MessageSnapshot,
    MessageStart,
    PermissionRequested,
    PermissionResolved,
    SessionForked,
    TextDelta,
    TextEnd,
    TextStart,
    ThinkingDelta,
    ThinkingEnd,
    ThinkingStart,
    ToolCompleted,
    ToolErrorClass,
    ToolFailed,
    ToolUseEnd,
    ToolUseInputDelta,
    ToolUseStart,
    TurnCancelled,
    TurnCompleted,
    TurnQueued,
    TurnStarted,
    TurnSteered,
)
from gateway.protocol.frames import EventFrame, ServerFrame, Snapshot
from gateway.protocol.shapes import (
    CompactionBlock,
    ContentBlock,
    FileBlock,
    Message,
    MessageStatus,
    PendingPermission,
    RedactedThinkingBlock,
    StopReason,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)

BlockKind = Literal["text", "thinking", "redacted_thinking", "tool_use"]

# The block lifecycle, docs/protocol.md §5: which kinds of open block each
# delta or end event may address. Starts open a block; nothing else does.
_BLOCK_KINDS: dict[str, tuple[BlockKind, ...]] = {
    "text.delta": ("text",),
    "text.end": ("text",),
    "thinking.delta": ("thinking", "redacted_thinking"),
    "thinking.end": ("thinking", "redacted_thinking"),
    "tool.use_input_delta": ("tool_use",),
    "tool.use_end": ("tool_use",),
}

_BlockPayload = TextDelta | TextEnd | ThinkingDelta | ThinkingEnd | ToolUseInputDelta | ToolUseEnd
_BlockEvent = TextStart | ThinkingStart | ToolUseStart | _BlockPayload

_STATUS_BY_STOP_REASON: dict[StopReason, MessageStatus] = {
    "cancelled": "cancelled",
    "error": "error",
}


@dataclass
class StreamingBlock:
    """One content block of the streaming message, as far as it has streamed.

    ``text`` holds a text block's text, a thinking block's thinking or a
    redacted block's data (``thinking.delta`` carries it for a block opened
    with ``redacted: true``). ``last_chunk`` is the text of the latest
    non-empty delta (the replace-then-append view shows a thinking block's
    latest chunk only, docs/protocol.md §10); empty for a restored block,
    whose chunks are unknown. ``partial_json`` is ``None`` for a tool block
    restored from a snapshot, whose raw input text is unknown.
    """

    kind: BlockKind
    text: str = ""
    last_chunk: str = ""
    signature: str | None = None
    tool_use_id: str = ""
    tool_name: str = ""
    partial_json: str | None = ""
    snapshot_input: dict[str, Any] = field(default_factory=dict)
    final_input: dict[str, Any] | None = None
    closed: bool = False
    restored: bool = False
    truncated: bool = False  # restored from a block a snapshot cut (docs/protocol.md §15)

    @classmethod
    def restore(cls, block: ContentBlock) -> StreamingBlock:
        """The open block a snapshot's content block stands for."""
        match block:
            case TextBlock(text=text, truncated=cut):
                return cls("text", text=text, restored=True, truncated=cut is True)
            case ThinkingBlock(thinking=thinking, signature=signature, truncated=cut):
                return cls(
                    "thinking",
                    text=thinking,
                    signature=signature,
                    restored=True,
                    truncated=cut is True,
                )
            case RedactedThinkingBlock(data=data, truncated=cut):
                return cls("redacted_thinking", text=data, restored=True, truncated=cut is True)
            case ToolUseBlock(id=id_, name=name, input=input_, truncated=cut):
                return cls(
                    "tool_use",
                    tool_use_id=id_,
                    tool_name=name,
                    partial_json=None,
                    snapshot_input=input_,
                    restored=True,
                    truncated=cut is True,
                )
        raise ValueError(f"a streaming assistant message cannot hold a {block!r}")

    @property
    def input(self) -> dict[str, Any]:
        """A tool block's input: final once ended, else the best parse so far."""
        if self.final_input is not None:
            return self.final_input
        if self.partial_json is None:
            return self.snapshot_input
        return best_effort(self.partial_json)

    def as_content_block(self) -> ContentBlock:
        """The block as the content block it is becoming (``truncated`` as restored)."""
        cut: bool | msgspec.UnsetType = True if self.truncated else msgspec.UNSET
        match self.kind:
            case "text":
                return TextBlock(self.text, truncated=cut)
            case "thinking":
                return ThinkingBlock(self.text, self.signature, truncated=cut)
            case "redacted_thinking":
                return RedactedThinkingBlock(self.text, truncated=cut)
            case "tool_use":
                # Its final input (tool.use_end) is whole.
                whole = self.final_input is not None
                return ToolUseBlock(
                    self.tool_use_id, self.tool_name, self.input,
                    truncated=msgspec.UNSET if whole else cut,
                )  # fmt: skip


@dataclass
class StreamingMessage:
    """The one assistant message being streamed; its blocks by content_block_index."""

    message_id: str
    model: str | None
    blocks: dict[int, StreamingBlock] = field(default_factory=dict)
    turn_id: str | None = None

    @classmethod
    def restore(cls, message: Message) -> StreamingMessage:
        """The streaming message an ``in_progress`` message stands for (module docstring).

        ``open_block_index`` (docs/protocol.md §6) says which block still
        streams; every other one has ended. Without it (an older server),
        every block but the last has ended.
        """
        streaming = cls(message.id, message.model, turn_id=message.turn_id)
        for index, block in enumerate(message.content):
            streaming.start(index, StreamingBlock.restore(block))
        open_index = message.open_block_index
        if not isinstance(open_index, msgspec.UnsetType):
            for index, restored in streaming.blocks.items():
                restored.closed = index != open_index
        return streaming

    def open_block(self) -> tuple[int, StreamingBlock] | None:
        """The block still streaming, if one is: the last one not closed."""
        for index in sorted(self.blocks, reverse=True):
            if not self.blocks[index].closed:
                return index, self.blocks[index]
        return None

    def start(self, index: int, block: StreamingBlock) -> None:
        """Open the block at ``index``; restored blocks before it have ended."""
        if index in self.blocks:
            raise ValueError(f"block {index} of message {self.message_id} started twice")
        for earlier_index, earlier in self.blocks.items():
            if earlier_index < index and earlier.restored:
                earlier.closed = True
        self.blocks[index] = block

    def addressed_block(self, event_type: str, index: int) -> StreamingBlock:
        """The open block that a delta or end event of ``event_type`` addresses."""
        block = self.blocks.get(index)
        where = f"{event_type} for block {index} of message {self.message_id}"
        if block is None:
            raise ValueError(f"{where}: the block was never started")
        if block.closed:
            raise ValueError(f"{where}: the block has already ended")
        if block.kind not in _BLOCK_KINDS[event_type]:
            raise ValueError(f"{where}: the block is a {block.kind} block")
        return block

    def block_event(self, event_type: str, payload: _BlockEvent) -> None:
        """A block of this message starts, grows or ends (docs/protocol.md §5).

        Raises:
            ValueError: a move the block lifecycle does not allow.
        """
        match payload:
            case TextStart():
                self.start(payload.content_block_index, StreamingBlock("text"))
            case ThinkingStart():
                kind: BlockKind = "redacted_thinking" if payload.redacted else "thinking"
                self.start(payload.content_block_index, StreamingBlock(kind))
            case ToolUseStart():
                block = StreamingBlock(
                    "tool_use", tool_use_id=payload.tool_use_id, tool_name=payload.tool_name
                )
                self.start(payload.content_block_index, block)
            case TextDelta():
                block = self._open_block(event_type, payload)
                block.text += payload.text
                if payload.text:
                    block.last_chunk = payload.text
            case ThinkingDelta():
                block = self._open_block(event_type, payload)
                block.text += payload.text
                if payload.text:
                    block.last_chunk = payload.text
                if payload.signature is not None:
                    block.signature = payload.signature
            case ToolUseInputDelta():
                block = self._open_block(event_type, payload)
                if block.partial_json is not None:
                    block.partial_json += payload.partial_json
            case TextEnd():
                self._open_block(event_type, payload).closed = True
            case ThinkingEnd():
                block = self._open_block(event_type, payload)
                if payload.signature is not None:
                    block.signature = payload.signature
                block.closed = True
            case ToolUseEnd():
                block = self._open_block(event_type, payload)
                block.tool_name = block.tool_name or payload.tool_name  # docs/protocol.md §5
                block.final_input = payload.final_input
                block.closed = True

    def _open_block(self, event_type: str, payload: _BlockPayload) -> StreamingBlock:
        """The open block a delta or end addresses, of the right kind and tool use id."""
        block = self.addressed_block(event_type, payload.content_block_index)
        if (
            isinstance(payload, ToolUseInputDelta | ToolUseEnd)
            and payload.tool_use_id != block.tool_use_id
        ):
            raise ValueError(
                f"{event_type} for tool use {payload.tool_use_id}, but block "
                f"{payload.content_block_index} is tool use {block.tool_use_id}"
            )
        return block

    def state(self) -> dict[str, Any]:
        """Plain values for :meth:`Reducer.state`; blocks in index order."""
        return {
            "message_id": self.message_id,
            "model": self.model,
            "blocks": [
                {"index": index, "closed": block.closed, **_builtins(block.as_content_block())}
                for index, block in sorted(self.blocks.items())
            ],
        }


@dataclass(frozen=True)
class ToolOutcome:
    """How a tool use ended, paired with the ``tool_use`` block of the same id.

    ``content`` is ``tool.completed.result`` or ``tool.failed.message``.
    ``error_class`` is ``None`` when the outcome was rebuilt from a snapshot's
    ``tool_result`` block, which does not carry it. ``files``: the files the
    tool returned (``tool.completed.files``, the block's ``files``), by reference.
    """

    tool_use_id: str
    status: Literal["completed", "failed"]
    content: str
    error_class: ToolErrorClass | None = None
    files: tuple[FileBlock, ...] = ()

    @classmethod
    def of_block(cls, block: ToolResultBlock) -> ToolOutcome:
        """The outcome a stored ``tool_result`` block stands for (a snapshot, a page)."""
        status: Literal["completed", "failed"] = "failed" if block.is_error else "completed"
        files = () if isinstance(block.files, msgspec.UnsetType) else tuple(block.files)
        return cls(block.tool_use_id, status, block.content, files=files)

    def state(self) -> dict[str, Any]:
        """Plain values; ``files`` only when the tool returned some."""
        state: dict[str, Any] = {
            "tool_use_id": self.tool_use_id,
            "status": self.status,
            "content": self.content,
            "error_class": self.error_class,
        }
        if self.files:
            state["files"] = [_builtins(f) for f in self.files]
        return state


@dataclass(frozen=True)
class TurnState:
    """The session's current (or last) turn; ``stop_reason`` once completed."""

    turn_id: str
    status: Literal["in_flight", "completed", "cancelled"]
    stop_reason: StopReason | None = None


@dataclass(frozen=True)
class WorkerLink:
    """What ``delegate.started`` says of a worker session: the tool use and task behind it."""

    worker_session_id: str
    tool_use_id: str
    task: str
    parent_session_id: str


class Reducer:
    """One session's state, built from every server frame of its stream.

    Args:
        session_id: the session whose stream this is; events of other
            (worker) sessions go to a reducer of their own in :attr:`workers`.
        lenient: skip (and count in :attr:`skipped`) a move the contract does
            not allow instead of raising; for a stream joined at an unknown
            point, as a worker's after a snapshot of its parent.
    """

    def __init__(self, session_id: str, *, lenient: bool = False) -> None:
        self.session_id = session_id
        self.lenient = lenient
        self.messages: list[Message] = []
        self.streaming: StreamingMessage | None = None
        self.tool_results: dict[str, ToolOutcome] = {}
        self.turn: TurnState | None = None
        self.turn_outcomes: dict[str, TurnState] = {}
        # Turns waiting to start, next first: turn id -> its user message (docs/protocol.md
        # §2 "A busy session"); they leave with their turn.started or turn.cancelled.
        self.queued: dict[str, Message] = {}
        self.permissions: dict[str, PendingPermission] = {}
        self.workers: dict[str, Reducer] = {}
        self.links: dict[str, WorkerLink] = {}
        self.last_event_id: str | None = None
        self.duplicates_ignored = 0
        self.skipped = 0
        # docs/protocol.md §15: the last snapshot left older messages out, and
        # the tool results it sent cut (module docstring, "Cut blocks").
        self.has_more = False
        self.truncated_results: set[str] = set()
        self.oldest_message_id: str | None = None  # the first the snapshot (or a page) sent
        # docs/protocol.md §12: the compaction under way (module docstring, "Compactions").
        self.compacting: ContextCompacting | None = None

    def apply(self, frame: ServerFrame) -> None:
        """Apply one server frame; only ``snapshot`` and ``event`` frames change state.

        Raises:
            ValueError: the frame makes a move the contract does not allow.
        """
        if isinstance(frame, Snapshot):
            self._apply_snapshot(frame)
        elif isinstance(frame, EventFrame):
            self.apply_event(frame.event)

    def apply_event(self, event: Event) -> None:
        """Apply one event (docs/protocol.md sections 4, 5, 7 and 8).

        Unknown types are skipped (section 4); the cursor still moves past
        them. A failed move leaves the state and the cursor as they were.

        Raises:
            ValueError: the event makes a move the contract does not allow.
        """
        if self.last_event_id is not None and event.id <= self.last_event_id:
            self.duplicates_ignored += 1
            return
        if event.session_id == self.session_id:
            self._dispatch(event)
        else:
            worker = self.workers.get(event.session_id)
            if worker is None:
                worker = self.workers[event.session_id] = Reducer(event.session_id, lenient=True)
            worker._dispatch(event)
            if isinstance(event.payload, PermissionRequested | PermissionResolved):
                # A worker's request is the parent's to answer (module docstring).
                self._permission(event)
        if isinstance(event.payload, DelegateStarted):
            p = event.payload
            link = WorkerLink(p.worker_session_id, p.tool_use_id, p.task, event.session_id)
            self.links[p.worker_session_id] = link
        self.last_event_id = event.id

    def state(self) -> dict[str, Any]:
        """The state as plain values (dicts, lists, strings), equal for equal sessions.

        A client that stayed live and one that resumed with replay (section 3)
        reach equal states. To that end finished messages leave out
        ``created_at`` and ``model``, which ``message.complete`` does not carry,
        and streaming blocks show what they are becoming (a tool block's input
        parsed, not its raw JSON text), as ``message.snapshot`` carries them.
        One short window after a resume cannot be closed from the payloads
        (module docstring): a restored tool block's input stays as the
        snapshot had it until ``tool.use_end``. (Before ``open_block_index``,
        a restored last block that had already ended also looked open until
        the next block started.)
        """
        state: dict[str, Any] = {
            "messages": [_message_state(message) for message in self.messages],
            "streaming": None if self.streaming is None else self.streaming.state(),
            "tool_results": {id_: outcome.state() for id_, outcome in self.tool_results.items()},
            "turn": None if self.turn is None else asdict(self.turn),
            "pending_permissions": [_builtins(p) for p in self.permissions.values()],
            "compacting": None if self.compacting is None else _builtins(self.compacting),
            "last_event_id": self.last_event_id,
        }
        if self.queued:  # turns waiting to start (absent when none, as in a snapshot)
            state["queued"] = [
                {"turn_id": turn_id, "user_message": _message_state(message)}
                for turn_id, message in self.queued.items()
            ]
        return state

    @property
    def running_turn_id(self) -> str | None:
        """The id of the turn in flight, or ``None`` when the session is idle."""
        turn = self.turn
        return turn.turn_id if turn is not None and turn.status == "in_flight" else None

    def tool_use(self, tool_use_id: str) -> ToolUseBlock | None:
        """The finished ``tool_use`` block of that id, to pair with its outcome (seed 002)."""
        for message in reversed(self.messages):
            for block in message.content:
                if isinstance(block, ToolUseBlock) and block.id == tool_use_id:
                    return block
        return None

    def prepend_history(self, messages: Sequence[Message], has_more: bool) -> None:
        """Older finished messages (a page of ``GET .../messages``, oldest first) before the first.

        What a snapshot left out (docs/protocol.md §15): page it with
        ``before=`` :attr:`oldest_message_id` while :attr:`has_more`.
        """
        known = {message.id for message in self.messages}
        older = [message for message in messages if message.id not in known]
        for message in older:
            for block in message.content:
                if isinstance(block, ToolResultBlock) and message.role == "user":
                    self.tool_results.setdefault(block.tool_use_id, ToolOutcome.of_block(block))
        self.messages = [m for m in older if not _tool_results_only(m)] + self.messages
        if older:
            self.oldest_message_id = older[0].id
        self.has_more = has_more

    def replace_message(self, message: Message) -> None:
        """A finished message fetched whole (``GET .../messages/{id}``) in place of one sent cut."""
        for position, existing in enumerate(self.messages):
            if existing.id == message.id:
                self.messages[position] = message
        for block in message.content:
            if isinstance(block, ToolResultBlock) and block.tool_use_id in self.truncated_results:
                self.truncated_results.discard(block.tool_use_id)
                outcome = self.tool_results.get(block.tool_use_id)
                if outcome is not None:
                    whole = ToolOutcome.of_block(block)
                    self.tool_results[block.tool_use_id] = replace(
                        outcome, content=block.content, files=whole.files
                    )

    # --- frames ----------------------------------------------------------------

    def _apply_snapshot(self, snapshot: Snapshot) -> None:
        """A ``snapshot`` frame replaces everything (docs/protocol.md sections 3 and 6)."""
        session = snapshot.session
        if session.id != self.session_id:
            raise ValueError(f"snapshot of session {session.id} in the stream of {self.session_id}")
        messages = list(snapshot.messages)
        in_progress = bool(messages) and messages[-1].status == "in_progress"
        self.streaming = StreamingMessage.restore(messages.pop()) if in_progress else None
        # A user message of tool results only is what tool.completed/tool.failed
        # announce live: it lives in tool_results, as it does for a live client.
        self.messages = [m for m in messages if not _tool_results_only(m)]
        self.tool_results = {
            block.tool_use_id: ToolOutcome.of_block(block)
            for message in messages
            if message.role == "user"
            for block in message.content
            if isinstance(block, ToolResultBlock)
        }
        self.truncated_results = {
            block.tool_use_id
            for message in messages
            for block in message.content
            if isinstance(block, ToolResultBlock) and block.truncated is True
        }
        self.has_more = snapshot.has_more
        streaming_id = None if self.streaming is None else self.streaming.message_id
        self.oldest_message_id = messages[0].id if messages else streaming_id
        turn_id = session.current_turn_id
        in_flight = turn_id is not None and session.current_turn_status == "in_flight"
        self.turn = TurnState(turn_id, "in_flight") if turn_id is not None and in_flight else None
        self.turn_outcomes = {}
        queued = session.queued_turns or []
        self.queued = {q.turn_id: q.user_message for q in queued}
        self.permissions = {p.perm_id: p for p in session.pending_permissions}
        self.compacting = None  # a snapshot cannot say one is under way (section 6)
        # The parent's snapshot shows no worker: what was known of them is
        # replaced too, and rebuilt from their later events.
        self.workers = {}
        self.links = {}
        self.last_event_id = snapshot.snapshot_at_event_id

    # --- events ------------------------------------------------------------------

    def _dispatch(self, event: Event) -> None:
        if not self.lenient:
            self._move(event)
            return
        try:
            self._move(event)
        except ValueError:
            self.skipped += 1  # a failed move changes nothing (apply_event)

    def _move(self, event: Event) -> None:
        match event.payload:
            case TurnStarted() as p:
                self._turn_started(p)
            case TurnCompleted() as p:
                self._end_turn(TurnState(p.turn_id, "completed", p.stop_reason))
            case TurnCancelled(phase="queued") as p:  # never started: it leaves the queue
                self.queued.pop(p.turn_id, None)
                self.turn_outcomes[p.turn_id] = TurnState(p.turn_id, "cancelled")
            case TurnCancelled() as p:
                self._end_turn(TurnState(p.turn_id, "cancelled"))
            case TurnQueued() as p:
                self.queued[p.turn_id] = p.user_message
            case TurnSteered() as p:  # the running turn took it: a message of the turn
                self._put(p.user_message)
            case ToolCompleted() as p:
                files = tuple(p.files or ())
                self._tool_outcome(ToolOutcome(p.tool_use_id, "completed", p.result, files=files))
            case ToolFailed() as p:
                self._tool_outcome(ToolOutcome(p.tool_use_id, "failed", p.message, p.error_class))
            case PermissionRequested() | PermissionResolved():
                self._permission(event)
            case ContextCompacting() as p:
                self.compacting = p
            case ContextCompacted() as p:
                self._compacted(event, p)
            case HistoryRewound() as p:
                self._rewound(p)
            case MessageStart() as p:
                self._message_start(event, p)
            case MessageSnapshot() as p:
                self.streaming = StreamingMessage.restore(p.message)
            case MessageComplete() as p:
                self._message_complete(event, p)
            case (
                TextStart() | ThinkingStart() | ToolUseStart()
                | TextDelta() | ThinkingDelta() | ToolUseInputDelta()
                | TextEnd() | ThinkingEnd() | ToolUseEnd()
            ) as p:  # fmt: skip
                self._streaming(event.type, p.message_id).block_event(event.type, p)
            case SessionForked():
                pass  # a fork's first event: its copied history is in its snapshot (section 10)
            case _:
                pass  # an unknown type, or one that does not change this state

    def _permission(self, event: Event) -> None:
        """A request added or resolved, the session's own or a worker's (``session_id``)."""
        match event.payload:
            case PermissionRequested() as p:
                self.permissions[p.perm_id] = PendingPermission(
                    p.perm_id,
                    event.session_id,
                    p.kind,
                    p.tool_use_id,
                    p.tool_name,
                    p.input,
                    p.expires_at,
                    p.message,
                    p.requested_schema,
                )
            case PermissionResolved() as p:
                self.permissions.pop(p.perm_id, None)

    def _compacted(self, event: Event, payload: ContextCompacted) -> None:
        """The compaction's ``context`` message, its summary still to fetch (module docstring)."""
        self.compacting = None
        if payload.summary_message_id is None:
            return
        replaces: list[str] = []
        for message in self.messages:
            if message.id == payload.first_kept_message_id:
                break
            if message.role != "context":
                replaces.append(message.id)
        block = CompactionBlock("", replaces, truncated=True)
        self._put(
            Message(
                id=payload.summary_message_id,
                session_id=event.session_id,
                turn_id=event.turn_id,
                role="context",
                content=[block],
                status="complete",
                created_at=event.ts,
            )
        )

    def _rewound(self, payload: HistoryRewound) -> None:
        """The messages from ``before_message_id`` on leave (module docstring, "Rewinds")."""
        at = next(
            (i for i, m in enumerate(self.messages) if m.id == payload.before_message_id), None
        )
        if at is None:  # older than every message held: all of them go
            at = 0
            if self.has_more:
                self.oldest_message_id = payload.before_message_id
        gone = self.messages[at:]
        del self.messages[at:]
        for message in gone:
            for block in message.content:
                if isinstance(block, ToolUseBlock):
                    self.tool_results.pop(block.id, None)
                    self.truncated_results.discard(block.id)

    def _turn_started(self, payload: TurnStarted) -> None:
        if self.turn is not None and self.turn.status == "in_flight":
            raise ValueError(
                f"turn.started for {payload.turn_id} while {self.turn.turn_id} is in flight"
            )
        self.queued.pop(payload.turn_id, None)
        self._put(payload.user_message)
        self.turn = TurnState(payload.turn_id, "in_flight")

    def _end_turn(self, ended: TurnState) -> None:
        # A client that resumed from a cursor in the middle of a turn never saw
        # it start; only the end of a turn other than the one in flight is wrong.
        current = self.turn
        if (
            current is not None
            and current.status == "in_flight"
            and current.turn_id != ended.turn_id
        ):
            raise ValueError(
                f"turn {ended.turn_id} {ended.status} while {current.turn_id} is in flight"
            )
        self.turn = ended
        self.turn_outcomes[ended.turn_id] = ended
        self.permissions.clear()  # a turn's requests end with it
        self.compacting = None  # and so does a compaction it began

    def _tool_outcome(self, outcome: ToolOutcome) -> None:
        # The tool_use may precede a resume cursor: the outcome is kept unpaired.
        self.tool_results[outcome.tool_use_id] = outcome
        for perm_id, pending in list(self.permissions.items()):
            if pending.tool_use_id == outcome.tool_use_id:
                del self.permissions[perm_id]

    def _message_start(self, event: Event, payload: MessageStart) -> None:
        if self.streaming is not None:
            raise ValueError(
                f"message.start for {payload.message_id} while "
                f"{self.streaming.message_id} is still streaming"
            )
        self.streaming = StreamingMessage(payload.message_id, payload.model, turn_id=event.turn_id)

    def _message_complete(self, event: Event, payload: MessageComplete) -> None:
        """Finish the streaming message from ``final_content``, which is authoritative.

        With no streaming message this is a replayed ``message.complete``
        (docs/protocol.md §3), which needs no ``message.start`` before it.
        """
        streaming = self.streaming
        if streaming is not None and streaming.message_id != payload.message_id:
            raise ValueError(
                f"message.complete for {payload.message_id} while "
                f"{streaming.message_id} is streaming"
            )
        self._put(
            Message(
                id=payload.message_id,
                session_id=event.session_id,
                turn_id=event.turn_id,
                role="assistant",
                content=list(payload.final_content),
                status=_STATUS_BY_STOP_REASON.get(payload.stop_reason, "complete"),
                created_at=event.ts,
                model=None if streaming is None else streaming.model,
                usage=payload.usage,
            )
        )
        self.streaming = None

    def _streaming(self, event_type: str, message_id: str) -> StreamingMessage:
        """The streaming message, which ``message_id`` must name."""
        if self.streaming is None:
            raise ValueError(f"{event_type} for message {message_id}, but none is streaming")
        if self.streaming.message_id != message_id:
            raise ValueError(
                f"{event_type} for message {message_id}, "
                f"but {self.streaming.message_id} is streaming"
            )
        return self.streaming

    def _put(self, message: Message) -> None:
        """Append a finished message, replacing one of the same id in place."""
        for position, existing in enumerate(self.messages):
            if existing.id == message.id:
                self.messages[position] = message
                return
        self.messages.append(message)


def _message_state(message: Message) -> dict[str, Any]:
    state = _builtins(message)
    del state["created_at"]
    state.pop("model", None)
    return state


def _builtins(value: msgspec.Struct) -> dict[str, Any]:
    result: dict[str, Any] = msgspec.to_builtins(value)
    return result


def _tool_results_only(message: Message) -> bool:
    return (
        message.role == "user"
        and bool(message.content)
        and all(isinstance(b, ToolResultBlock) for b in message.content)
    )

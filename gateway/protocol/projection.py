"""One turn's events as a door's messages, sans-IO: what every block-speaking door shares.

A door that speaks of blocks and steps (AG-UI, the AI SDK, the next one)
streams one turn of a session as messages of its own kind. The walk over the
gateway's events (docs/protocol.md sections 5, 7 and 8) is the same for each:

- **The turn filter.** Only the turn's events count, and a delegated
  worker's ``permission.requested`` and ``permission.resolved``, which reach
  its ancestors' streams and are answered from there (docs/protocol.md §5).
  Nothing counts once the door has finished.
- **The blocks.** A ``text``, ``thinking`` (``redacted`` when its data is
  opaque) or ``tool`` block is opened by its start event, fed by its deltas
  and closed by its end event (:attr:`Block.ended`), or cut: by the
  ``message.complete`` of its message (what a cancel or an error left open,
  docs/protocol.md §7, §8), or by the end of the turn or of the stream. An
  empty delta is nothing; a redacted block's data and a tool's input are kept
  on the block as they come (a tool that streamed none gets its whole input
  as one delta at its end).
- **The steps.** Each model call, from ``llm.call_started`` to its
  completion or its failure (the last failure is kept: :attr:`Projection.failure`);
  an MCP server's sampling call (``purpose: "sampling"``) is none.
- **The closing.** :meth:`Projection.close_all`: the open blocks, then the
  open steps; :meth:`Projection.end` also finishes the projection.

:class:`Projection` does that walk. A door configures it with its
:class:`Emitters`: a :class:`BlockEmitter` per block kind (what a block's
start, delta and end become, and the door's name for the block), a
:class:`StepEmitter`, and a table of handlers of its own by payload type (tool
results, approvals, compaction, the turn's end): every event is one look-up,
never a ladder of ``isinstance``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, Protocol, TypeVar

import msgspec

from gateway.protocol.events import (
    Envelope,
    LlmCallCompleted,
    LlmCallFailed,
    LlmCallStarted,
    MessageComplete,
    Payload,
    PermissionRequested,
    PermissionResolved,
    TextDelta,
    TextEnd,
    TextStart,
    ThinkingDelta,
    ThinkingEnd,
    ThinkingStart,
    ToolUseEnd,
    ToolUseInputDelta,
    ToolUseStart,
)
from gateway.protocol.rebuild import unstarted

Out = TypeVar("Out")

BlockKind = Literal["text", "thinking", "redacted", "tool"]

Key = tuple[str, int]
"""A block: its message and its index in it."""


@dataclass
class Block:
    """One open block, as the projection keeps it (module docstring)."""

    kind: BlockKind
    message_id: str
    index: int
    tool_use_id: str = ""  # a tool's
    tool_name: str = ""  # a tool's
    id: str = ""  # the door's name for it (BlockEmitter.name)
    data: list[str] = field(default_factory=list)  # a redacted block's data, a tool's input
    ended: bool = False  # closed by its own end event; False: cut
    signature: str | None = None  # a thinking block's, from its end
    input: Any = None  # a tool's final input, from its end


def indexed_id(block: Block) -> str:
    """``{message_id}:{index}``: the name both doors give a thinking block."""
    return f"{block.message_id}:{block.index}"


class BlockEmitter(Protocol[Out]):
    """What one kind of block becomes at a door."""

    def name(self, block: Block) -> str:
        """The door's id for the block, once, as it opens (kept as :attr:`Block.id`)."""
        ...

    def start(self, block: Block, ts: int) -> list[Out]: ...

    def delta(self, block: Block, text: str, ts: int) -> list[Out]:
        """A non-empty delta of a text, thinking (not redacted) or tool block."""
        ...

    def end(self, block: Block, ts: int | None) -> list[Out]:
        """The block closed: by its end event (:attr:`Block.ended`), or cut."""
        ...


class StepEmitter(Protocol[Out]):
    """What a model call's start and end become at a door."""

    def start(self, call_id: str, ts: int) -> list[Out]: ...

    def end(self, call_id: str, ts: int | None) -> list[Out]: ...


Handler = Callable[[Any, Envelope[Any]], list[Out]]
"""A door's handler of one payload type: the payload, and its envelope."""


@dataclass(frozen=True)
class Emitters(Generic[Out]):
    """A door's configuration of the projection (module docstring)."""

    blocks: Mapping[BlockKind, BlockEmitter[Out]]
    steps: StepEmitter[Out]
    events: Mapping[type[Payload], Handler[Out]]


class Projection(Generic[Out]):
    """One turn of one session as a door's messages (module docstring).

    Args:
        session_id: the session the door streams (a worker's events are not its).
        turn_id: the turn; events of any other map to nothing.
        emitters: the door's configuration.
    """

    def __init__(self, session_id: str, turn_id: str, emitters: Emitters[Out]) -> None:
        self.session_id = session_id
        self.turn_id = turn_id
        self.finished = False
        self.failure: LlmCallFailed | None = None  # the turn's last failed model call
        self._blocks = emitters.blocks
        self._steps_emit = emitters.steps
        self._open: dict[Key, Block] = {}
        self._seen: set[Key] = set()  # every block started
        self._steps: list[str] = []  # the calls started and not ended
        own: dict[type[Payload], Handler[Out]] = {
            TextStart: self._text_start,
            ThinkingStart: self._thinking_start,
            ToolUseStart: self._tool_start,
            TextDelta: self._text_delta,
            ThinkingDelta: self._text_delta,
            ToolUseInputDelta: self._input_delta,
            TextEnd: self._text_end,
            ThinkingEnd: self._thinking_end,
            ToolUseEnd: self._tool_end,
            MessageComplete: self._message_complete,
            LlmCallStarted: self._step_started,
            LlmCallCompleted: self._step_ended,
            LlmCallFailed: self._step_failed,
        }
        assert not own.keys() & emitters.events.keys(), "a door handles the block events"
        self._table = {**emitters.events, **own}

    def owns(self, event: Envelope[Any]) -> bool:
        """The turn filter (module docstring)."""
        if event.turn_id == self.turn_id:
            return True
        worker = event.session_id != self.session_id
        return worker and isinstance(event.payload, PermissionRequested | PermissionResolved)

    def receive(self, event: Envelope[Any]) -> list[Out]:
        """The door's messages of one event (none once finished, none of another turn)."""
        if self.finished or not self.owns(event):
            return []
        handler = self._table.get(type(event.payload))
        return [] if handler is None else handler(event.payload, event)

    def rebuilt(self, event: Envelope[Any]) -> list[Out]:
        """The messages of the blocks of a whole message (a replay's) not yet started."""
        out: list[Out] = []
        for payload in unstarted(event.payload, self.started):
            out += self.receive(msgspec.structs.replace(event, payload=payload))
        return out

    def started(self, message_id: str, index: int) -> bool:
        """Whether the block has been started (a replay rebuilds the others)."""
        return (message_id, index) in self._seen

    def close_message(self, message_id: str, ts: int | None) -> list[Out]:
        """Cut what is open in ``message_id`` (docs/protocol.md §7, §8)."""
        out: list[Out] = []
        for key in [k for k in self._open if k[0] == message_id]:
            out += self._close(key, ts)
        return out

    def close_all(self, ts: int | None) -> list[Out]:
        """Cut every open block, then end every open step."""
        out: list[Out] = []
        for key in list(self._open):
            out += self._close(key, ts)
        for call_id in self._steps:
            out += self._steps_emit.end(call_id, ts)
        self._steps.clear()
        return out

    def end(self, ts: int | None) -> list[Out]:
        """Finish: nothing more is received; what is open is closed (:meth:`close_all`)."""
        self.finished = True
        return self.close_all(ts)

    # --- blocks --------------------------------------------------------------------------

    def _start(self, block: Block, ts: int) -> list[Out]:
        emitter = self._blocks[block.kind]
        block.id = emitter.name(block)
        key = (block.message_id, block.index)
        self._open[key] = block
        self._seen.add(key)
        return emitter.start(block, ts)

    def _text_start(self, p: TextStart, e: Envelope[Any]) -> list[Out]:
        return self._start(Block("text", p.message_id, p.content_block_index), e.ts)

    def _thinking_start(self, p: ThinkingStart, e: Envelope[Any]) -> list[Out]:
        kind: BlockKind = "redacted" if p.redacted else "thinking"
        return self._start(Block(kind, p.message_id, p.content_block_index), e.ts)

    def _tool_start(self, p: ToolUseStart, e: Envelope[Any]) -> list[Out]:
        block = Block("tool", p.message_id, p.content_block_index, p.tool_use_id, p.tool_name)
        return self._start(block, e.ts)

    def _delta(self, key: Key, text: str, ts: int) -> list[Out]:
        block = self._open.get(key)
        if block is None:
            return []
        if block.kind == "redacted":  # opaque: kept for its end
            block.data.append(text)
            return []
        if not text:
            return []
        if block.kind == "tool":
            block.data.append(text)
        return self._blocks[block.kind].delta(block, text, ts)

    def _text_delta(self, p: TextDelta | ThinkingDelta, e: Envelope[Any]) -> list[Out]:
        return self._delta((p.message_id, p.content_block_index), p.text, e.ts)

    def _input_delta(self, p: ToolUseInputDelta, e: Envelope[Any]) -> list[Out]:
        return self._delta((p.message_id, p.content_block_index), p.partial_json, e.ts)

    def _text_end(self, p: TextEnd, e: Envelope[Any]) -> list[Out]:
        return self._close((p.message_id, p.content_block_index), e.ts, ended=True)

    def _thinking_end(self, p: ThinkingEnd, e: Envelope[Any]) -> list[Out]:
        key = (p.message_id, p.content_block_index)
        block = self._open.get(key)
        if block is not None:
            block.signature = p.signature
        return self._close(key, e.ts, ended=True)

    def _tool_end(self, p: ToolUseEnd, e: Envelope[Any]) -> list[Out]:
        key = (p.message_id, p.content_block_index)
        block = self._open.get(key)
        if block is None:
            return []
        out: list[Out] = []
        if not block.data:  # no delta streamed: the input in one piece
            whole = msgspec.json.encode(p.final_input).decode()
            block.data.append(whole)
            out += self._blocks["tool"].delta(block, whole, e.ts)
        block.tool_name, block.input = p.tool_name, p.final_input
        return out + self._close(key, e.ts, ended=True)

    def _close(self, key: Key, ts: int | None, *, ended: bool = False) -> list[Out]:
        block = self._open.pop(key, None)
        if block is None:
            return []
        block.ended = ended
        return self._blocks[block.kind].end(block, ts)

    def _message_complete(self, p: MessageComplete, e: Envelope[Any]) -> list[Out]:
        return self.close_message(p.message_id, e.ts)

    # --- steps ---------------------------------------------------------------------------

    def _step_started(self, p: LlmCallStarted, e: Envelope[Any]) -> list[Out]:
        if p.purpose == "sampling":  # an MCP server's, inside a tool call: no step of the turn
            return []
        self._steps.append(p.call_id)
        return self._steps_emit.start(p.call_id, e.ts)

    def _step_failed(self, p: LlmCallFailed, e: Envelope[Any]) -> list[Out]:
        if p.purpose == "sampling":  # its tool fails, not the turn (docs/protocol.md §11)
            return []
        self.failure = p
        return self._step_ended(p, e)

    def _step_ended(self, p: LlmCallCompleted | LlmCallFailed, e: Envelope[Any]) -> list[Out]:
        if p.call_id not in self._steps:
            return []
        self._steps.remove(p.call_id)
        return self._steps_emit.end(p.call_id, e.ts)

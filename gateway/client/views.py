"""The two views of a session (docs/protocol.md §10), pure functions of the reduced state.

A :class:`~gateway.client.reducer.Reducer` holds what the events said; a view
is what a client shows of it. Each view here is a pure function of a
reducer's state, never of timing or of the order a client learnt things in,
so a client that attached with a snapshot, or resumed with ``since``, shows
what one that saw every event live shows (tests/streaming-conformance/). Both
return plain JSON values (dicts, lists, strings, numbers, ``None``), the same
shapes as ``gateway/ui/reducer.js`` returns, so one file of expected views
checks both languages.

- :func:`full_view`: every message with every block (thinking, text, tool
  calls paired with their results by ``tool_use_id``, seed 002), the pending
  permission requests, and the worker sessions when asked for.
- :func:`simple_view`, *replace-then-append* (seed 004), for end users: the
  thread of user messages and one assistant reply per turn (the text of the
  turn's latest round: appended as it streams, replaced when a later round
  starts), one status line while a turn runs (the latest thinking chunk, or
  the tool being prepared, awaiting approval or running), and the pending
  permission requests, which an end user has to answer.

Where section 10 is silent, decided here (docs/protocol.md, "Views"):

- **What both attach paths know.** A view shows only what a snapshot carries
  as well as the events: no usage, no timings, no error class of a failed
  tool (its message is its result), no decision of a resolved permission.
- **A tool's status.** ``streaming`` while its block is open; ``completed`` or
  ``failed`` once its outcome is known (``result`` is the outcome's text);
  ``awaiting_approval`` while a permission request for it is pending;
  ``pending`` once its block ended while its message still streams;
  ``running`` once its message is complete and its turn still in flight
  (a snapshot cannot tell "about to run" from "running"); ``not_run`` when
  its message was cancelled or failed, or its turn ended without an outcome.
- **The reply of a turn** is the text blocks of the turn's latest assistant
  message, joined. Its status is ``in_progress`` while the turn is in flight;
  once it ended, how it ended as this client saw it (``error`` for a
  ``turn.completed`` with ``stop_reason: error``, ``cancelled``, else
  ``complete``). A client that did not see the end (it attached later with a
  snapshot) infers it from the messages, as the server writes them (PROTOCOL
  sections 7 to 9): the latest message's status when ``cancelled`` or
  ``error``; for a complete message that asked for tools, ``cancelled`` when
  one of their results is the ``cancelled`` error, ``error`` when results came
  but no later round (its call failed before a message started), else
  ``complete`` (no tool ran: the turn stopped there, as with ``max_tokens``).
  A turn with no assistant message has no reply entry.
- **Compactions** (docs/protocol.md §12). A ``context`` message is its own
  item where it stands in the message list, after the messages it replaces,
  which stay. The full view shows its ``compaction`` block (``summary``,
  ``replaces``; ``truncated`` while the summary is still to fetch, as after
  ``context.compacted``: the event does not carry it). The simple view shows
  it as one quiet entry of role ``context`` (no text: it is never assistant
  text; ``replaces`` is how many messages it stands for).
- **Permissions** are every pending request, the session's own and its
  workers' (``session_id`` says whose), with ``kind``; an elicitation's
  ``message`` and ``requested_schema`` (``None`` for a tool approval) are
  what a client builds its form from (section 11).
- **A busy session** (docs/protocol.md §2 "A busy session"). The turns waiting to
  start are not in the conversation: both views list them after it, in
  ``queued`` (next first; left out when none, as ``SessionSummary.queued_turns``
  is), each ``{turn_id, message_id, position, text}``: ``position`` is its
  place in the queue now (1 starts next; counted here, so it moves up as
  turns ahead of it start or are cancelled), ``text`` its user message's text
  blocks joined with newlines. A queued turn leaves the list when it starts
  (its user message then enters the conversation, as any turn's) or is
  cancelled. A steer the running turn took (``turn.steered``) is a user
  message of that turn, in place: after the round it followed, before the
  next; both views mark it ``steered: true`` (a user message of a turn that
  already has one before it, so a snapshot tells it as the events do). In the
  simple view the turn's reply then moves below it: the next round's reply
  answers it, so it stands after it (until that round starts, the earlier
  round's text stays where it was).
- **Files** (docs/protocol.md §2 "Files"). An ``image``, ``document`` or
  ``audio`` block is a :class:`FileView` in the full view, where it stands
  (``{type, file_id, media_type, size, open: false}``: a reference, never the
  bytes; a client fetches them from ``GET /sessions/{id}/files/{file_id}``).
  A tool whose outcome brought files (``tool.completed.files``, a snapshot's
  ``tool_result`` ``files``) has them in its view's ``files`` (left out when
  none). The simple view's entry of a message with files has them in
  ``files`` (left out when none), its ``text`` still the text blocks only.
  :func:`file_line` is one file as a line of text:
  ``[image image/png 12.3 KiB file_…]``.
- **The status line** is ``{"kind": "compacting"}`` while a compaction is
  under way (``context.compacting`` without its ``context.compacted``), turn
  or no turn; a snapshot cannot say so, so a client that attaches during a
  compaction shows it only from the next event of it. Otherwise it shows, for
  the turn in flight only: the open thinking
  block's latest chunk (a restored block's chunks are unknown: empty until
  its next chunk); else the tool block being written (``preparing``); else,
  once the round's message is complete, the first of its tools awaiting
  approval, else the first still running. While text streams, or between
  blocks, there is no status line: the text itself shows progress.
"""

from __future__ import annotations

from typing import Any, Literal, NotRequired, TypedDict, TypeVar

import msgspec

from gateway.client.reducer import Reducer, StreamingBlock, StreamingMessage
from gateway.protocol.shapes import (
    AudioBlock,
    CompactionBlock,
    ContentBlock,
    DocumentBlock,
    FileBlock,
    ImageBlock,
    Message,
    PendingPermission,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)

ToolStatus = Literal[
    "streaming", "pending", "awaiting_approval", "running", "completed", "failed", "not_run"
]
ReplyStatus = Literal["in_progress", "complete", "cancelled", "error"]


class TextView(TypedDict):
    """``truncated`` (only when true): a snapshot sent the block cut (docs/protocol.md §15)."""

    type: Literal["text"]
    text: str
    open: bool
    truncated: NotRequired[bool]


class ThinkingView(TypedDict):
    type: Literal["thinking"]
    text: str
    open: bool
    truncated: NotRequired[bool]


class RedactedThinkingView(TypedDict):
    """Opaque reasoning: there is nothing to show but that it is there."""

    type: Literal["redacted_thinking"]
    open: bool


class ToolUseView(TypedDict):
    """A tool call paired with its result (seed 002)."""

    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]
    open: bool
    status: ToolStatus
    result: str | None
    perm_id: str | None
    truncated: NotRequired[bool]  # its input or its result was sent cut (section 15)
    files: NotRequired[list[FileView]]  # the files its result brought (only when some)


class CompactionView(TypedDict):
    """A ``context`` message's summary of older messages (docs/protocol.md §12).

    ``truncated`` (only when true): the summary is not known yet (``""``):
    fetch the message whole (``GET .../messages/{id}``).
    """

    type: Literal["compaction"]
    summary: str
    replaces: list[str]
    open: bool
    truncated: NotRequired[bool]


class FileView(TypedDict):
    """A file of a message (docs/protocol.md §2 "Files"), by reference: its bytes are at
    ``GET /sessions/{id}/files/{file_id}``."""

    type: Literal["image", "document", "audio"]
    file_id: str
    media_type: str
    size: int
    open: bool


BlockView = TextView | ThinkingView | RedactedThinkingView | ToolUseView | CompactionView | FileView


class MessageView(TypedDict):
    """``steered`` (only when true): a user message the running turn took (``turn.steered``)."""

    id: str
    role: Literal["user", "assistant", "context"]
    turn_id: str | None
    status: Literal["complete", "in_progress", "cancelled", "error"]
    blocks: list[BlockView]
    steered: NotRequired[bool]


class QueuedView(TypedDict):
    """A turn waiting to start (docs/protocol.md §2 "A busy session"): ``position`` 1 starts
    next; ``text`` is its user message's text."""

    turn_id: str
    message_id: str
    position: int
    text: str


class PermissionView(TypedDict):
    """A pending request (docs/protocol.md §6, §11): a tool's approval or an elicitation."""

    perm_id: str
    session_id: str
    kind: Literal["tool", "elicitation", "sampling", "elicitation_url"]
    tool_use_id: str
    tool_name: str
    input: dict[str, Any]
    expires_at: int
    message: str | None
    requested_schema: dict[str, Any] | None


class WorkerView(TypedDict):
    """A worker session as far as its events reached this stream.

    ``tool_use_id`` and ``task`` come from the ``delegate.started`` that
    started it (``None`` when this client did not see it).
    """

    session_id: str
    tool_use_id: str | None
    task: str | None
    running_turn_id: str | None
    messages: list[MessageView]


class FullView(TypedDict):
    session_id: str
    running_turn_id: str | None
    messages: list[MessageView]
    permissions: list[PermissionView]
    workers: NotRequired[list[WorkerView]]
    queued: NotRequired[list[QueuedView]]  # only when turns are queued


class ThreadEntry(TypedDict):
    """A user message, the one reply of a turn, or a compaction (``replaces``: how many)."""

    role: Literal["user", "assistant", "context"]
    turn_id: str | None
    message_id: str
    text: str
    status: ReplyStatus
    replaces: NotRequired[int]
    steered: NotRequired[bool]  # a user message the running turn took (turn.steered)
    files: NotRequired[list[FileView]]  # the message's files (only when some)


class ThinkingStatus(TypedDict):
    kind: Literal["thinking"]
    text: str


class ToolStatusLine(TypedDict):
    kind: Literal["tool"]
    state: Literal["preparing", "awaiting_approval", "running"]
    tool_use_id: str
    tool_name: str


class CompactingStatus(TypedDict):
    kind: Literal["compacting"]
    trigger: str


StatusLine = ThinkingStatus | ToolStatusLine | CompactingStatus


class SimpleView(TypedDict):
    thread: list[ThreadEntry]
    status: StatusLine | None
    permissions: list[PermissionView]
    queued: NotRequired[list[QueuedView]]  # only when turns are queued


# --- full ----------------------------------------------------------------------


def full_view(reducer: Reducer, *, workers: bool = False) -> FullView:
    """Every message with every block, tools paired with their results (section 10 "full").

    Args:
        reducer: the session's reduced state.
        workers: add the worker sessions this stream carried
            (``include_worker_sessions``), in the order they first appeared.

    Returns:
        A JSON-able :class:`FullView`.
    """
    view: FullView = {
        "session_id": reducer.session_id,
        "running_turn_id": reducer.running_turn_id,
        "messages": _messages(reducer),
        "permissions": _permissions(reducer),
    }
    if workers:
        view["workers"] = [_worker(reducer, worker) for worker in reducer.workers.values()]
    queued = queued_view(reducer)
    if queued:
        view["queued"] = queued
    return view


def queued_view(reducer: Reducer) -> list[QueuedView]:
    """The turns waiting to start, next first (module docstring, "A busy session")."""
    return [
        {
            "turn_id": turn_id,
            "message_id": message.id,
            "position": position,
            "text": _text_of(message),
        }
        for position, (turn_id, message) in enumerate(reducer.queued.items(), start=1)
    ]


def _text_of(message: Message) -> str:
    """A user message's text blocks, joined with newlines (as the simple view shows it)."""
    return "\n".join(b.text for b in message.content if isinstance(b, TextBlock))


def _steered(message: Message, turns_asked: set[str | None]) -> bool:
    """A user message of a turn that already has one before it: a steer it took (module
    docstring, "A busy session"). ``turns_asked`` collects the turns seen so far."""
    if message.role != "user":
        return False
    steered = message.turn_id is not None and message.turn_id in turns_asked
    turns_asked.add(message.turn_id)
    return steered


def _worker(parent: Reducer, worker: Reducer) -> WorkerView:
    link = parent.links.get(worker.session_id)
    return {
        "session_id": worker.session_id,
        "tool_use_id": None if link is None else link.tool_use_id,
        "task": None if link is None else link.task,
        "running_turn_id": worker.running_turn_id,
        "messages": _messages(worker),
    }


def _messages(reducer: Reducer) -> list[MessageView]:
    views = [_finished_message(reducer, message) for message in reducer.messages]
    turns_asked: set[str | None] = set()
    for message, view in zip(reducer.messages, views, strict=True):
        if _steered(message, turns_asked):
            view["steered"] = True
    if reducer.streaming is not None:
        views.append(_streaming_message(reducer, reducer.streaming))
    return views


def _finished_message(reducer: Reducer, message: Message) -> MessageView:
    blocks: list[BlockView] = []
    for block in message.content:
        view = _finished_block(reducer, message, block)
        if view is not None:
            blocks.append(view)
    return {
        "id": message.id,
        "role": message.role,
        "turn_id": message.turn_id,
        "status": message.status,
        "blocks": blocks,
    }


def _finished_block(reducer: Reducer, message: Message, block: ContentBlock) -> BlockView | None:
    match block:
        case TextBlock(text=text, truncated=cut):
            return _cut(TextView(type="text", text=text, open=False), cut is True)
        case ThinkingBlock(thinking=thinking, truncated=cut):
            return _cut(ThinkingView(type="thinking", text=thinking, open=False), cut is True)
        case RedactedThinkingBlock():
            return {"type": "redacted_thinking", "open": False}
        case ToolUseBlock(id=id_, name=name, input=input_, truncated=cut):
            # Without an outcome: it runs while its complete message's turn is in flight.
            running = (
                message.status == "complete"
                and message.turn_id is not None
                and message.turn_id == reducer.running_turn_id
            )
            status: ToolStatus = "running" if running else "not_run"
            view = _tool_view(reducer, id_, name, input_, open_=False, otherwise=status)
            return _cut(view, cut is True or "truncated" in view)
        case CompactionBlock(summary=summary, replaces=replaces, truncated=cut):
            compaction: CompactionView = {
                "type": "compaction",
                "summary": summary,
                "replaces": list(replaces),
                "open": False,
            }
            if cut is True:
                compaction["truncated"] = True
            return compaction
        case ImageBlock() | DocumentBlock() | AudioBlock():
            return file_view(block)
        case ToolResultBlock():
            return None  # paired with its tool_use instead
    return None


def file_view(block: FileBlock) -> FileView:
    """A file block as the views show it (module docstring, "Files")."""
    kind: Literal["image", "document", "audio"] = (
        "image"
        if isinstance(block, ImageBlock)
        else "document"
        if isinstance(block, DocumentBlock)
        else "audio"
    )
    return {
        "type": kind,
        "file_id": block.file_id,
        "media_type": block.media_type,
        "size": block.size,
        "open": False,
    }


def file_line(file: FileView) -> str:
    """One file as a line of text: ``[image image/png 12.3 KiB file_…]``."""
    return f"[{file['type']} {file['media_type']} {human_size(file['size'])} {file['file_id']}]"


def files_in(blocks: list[BlockView]) -> list[FileView]:
    """The file blocks of a message's view, in order."""
    return [
        b for b in blocks if b["type"] == "image" or b["type"] == "document" or b["type"] == "audio"
    ]


def human_size(size: int) -> str:
    """``512 B``, ``12.3 KiB``, ``4.0 MiB``."""
    if size < 1024:
        return f"{size} B"
    unit, name = (1024, "KiB") if size < 1024 * 1024 else (1024 * 1024, "MiB")
    tenths = (size * 10 + unit // 2) // unit  # in integers: a half rounds up, as in the JS
    return f"{tenths // 10}.{tenths % 10} {name}"


def _files_of(message: Message) -> list[FileView]:
    return [
        file_view(b)
        for b in message.content
        if isinstance(b, ImageBlock | DocumentBlock | AudioBlock)
    ]


def _streaming_message(reducer: Reducer, streaming: StreamingMessage) -> MessageView:
    blocks: list[BlockView] = []
    for _, block in sorted(streaming.blocks.items()):
        blocks.append(_streaming_block(reducer, block))
    return {
        "id": streaming.message_id,
        "role": "assistant",
        "turn_id": streaming.turn_id,
        "status": "in_progress",
        "blocks": blocks,
    }


def _streaming_block(reducer: Reducer, block: StreamingBlock) -> BlockView:
    open_ = not block.closed
    match block.kind:
        case "text":
            return _cut(TextView(type="text", text=block.text, open=open_), block.truncated)
        case "thinking":
            return _cut(ThinkingView(type="thinking", text=block.text, open=open_), block.truncated)
        case "redacted_thinking":
            return {"type": "redacted_thinking", "open": open_}
        case "tool_use":
            otherwise: ToolStatus = "streaming" if open_ else "pending"
            view = _tool_view(
                reducer, block.tool_use_id, block.tool_name, block.input, open_, otherwise
            )
            cut = block.truncated and block.final_input is None
            return _cut(view, cut or "truncated" in view)


def _tool_view(
    reducer: Reducer,
    tool_use_id: str,
    name: str,
    input_: dict[str, Any],
    open_: bool,
    otherwise: ToolStatus,
) -> ToolUseView:
    """A tool block and what became of it: outcome, pending permission, or ``otherwise``."""
    outcome = reducer.tool_results.get(tool_use_id)
    permission = _permission_for(reducer, tool_use_id)
    status: ToolStatus = otherwise
    result: str | None = None
    if outcome is not None:
        status, result = outcome.status, outcome.content
    elif permission is not None and not open_:
        status = "awaiting_approval"
    view: ToolUseView = {
        "type": "tool_use",
        "id": tool_use_id,
        "name": name,
        "input": input_,
        "open": open_,
        "status": status,
        "result": result,
        "perm_id": None if permission is None or outcome is not None else permission.perm_id,
    }
    if outcome is not None and outcome.files:
        view["files"] = [file_view(f) for f in outcome.files]
    return _cut(view, outcome is not None and tool_use_id in reducer.truncated_results)


_View = TypeVar("_View", TextView, ThinkingView, ToolUseView)


def _cut(view: _View, truncated: bool) -> _View:
    """``view``, with ``truncated: true`` when what it shows was sent cut (section 15)."""
    if truncated:
        view["truncated"] = True
    return view


def _permission_for(reducer: Reducer, tool_use_id: str) -> PendingPermission | None:
    for pending in reducer.permissions.values():
        if pending.tool_use_id == tool_use_id:
            return pending
    return None


def _permissions(reducer: Reducer) -> list[PermissionView]:
    return [
        {
            "perm_id": p.perm_id,
            "session_id": p.session_id,
            "kind": p.kind,
            "tool_use_id": p.tool_use_id,
            "tool_name": p.tool_name,
            "input": p.input,
            "expires_at": p.expires_at,
            "message": None if isinstance(p.message, msgspec.UnsetType) else p.message,
            "requested_schema": (
                None if isinstance(p.requested_schema, msgspec.UnsetType) else p.requested_schema
            ),
        }
        for p in reducer.permissions.values()
    ]


# --- replace-then-append -------------------------------------------------------------


def simple_view(reducer: Reducer) -> SimpleView:
    """The replace-then-append view (section 10, seed 004), for end users.

    Args:
        reducer: the session's reduced state.

    Returns:
        A JSON-able :class:`SimpleView`: no thinking and no tool block is ever
        content; see the module docstring for what each part shows.
    """
    thread: list[ThreadEntry] = []
    latest: dict[str | None, tuple[int, Message | StreamingMessage]] = {}
    turns_asked: set[str | None] = set()
    moving: set[str | None] = set()  # turns whose next round's reply goes below a steer
    for message in reducer.messages:
        if message.role == "user":
            entry: ThreadEntry = {
                "role": "user",
                "turn_id": message.turn_id,
                "message_id": message.id,
                "text": _text_of(message),
                "status": "complete",
            }
            if _steered(message, turns_asked):
                entry["steered"] = True
                if message.turn_id in latest:  # it answered a round: the next goes below
                    moving.add(message.turn_id)
            files = _files_of(message)
            if files:
                entry["files"] = files
            thread.append(entry)
        elif message.role == "context":
            blocks = [b for b in message.content if isinstance(b, CompactionBlock)]
            replaced = sum(len(b.replaces) for b in blocks)
            thread.append(
                {
                    "role": "context",
                    "turn_id": message.turn_id,
                    "message_id": message.id,
                    "text": "",
                    "status": "complete",
                    "replaces": replaced,
                }
            )
        else:
            _reply(thread, latest, message.turn_id, message, moving)
    if reducer.streaming is not None:
        _reply(thread, latest, reducer.streaming.turn_id, reducer.streaming, moving)
    for turn_id, (position, last) in latest.items():
        thread[position]["status"] = _reply_status(reducer, turn_id, last)
    view: SimpleView = {
        "thread": thread,
        "status": _status_line(reducer),
        "permissions": _permissions(reducer),
    }
    queued = queued_view(reducer)
    if queued:
        view["queued"] = queued
    return view


def _reply(
    thread: list[ThreadEntry],
    latest: dict[str | None, tuple[int, Message | StreamingMessage]],
    turn_id: str | None,
    message: Message | StreamingMessage,
    moving: set[str | None],
) -> None:
    """Put ``message`` as its turn's reply: a later round replaces an earlier one, in its
    place, or below the steers taken since (``moving``; module docstring)."""
    if isinstance(message, StreamingMessage):
        message_id = message.message_id
        text = "".join(
            block.text for _, block in sorted(message.blocks.items()) if block.kind == "text"
        )
    else:
        message_id = message.id
        text = "".join(b.text for b in message.content if isinstance(b, TextBlock))
    entry: ThreadEntry = {
        "role": "assistant",
        "turn_id": turn_id,
        "message_id": message_id,
        "text": text,
        "status": "in_progress",
    }
    if turn_id in moving:  # the earlier round's reply leaves its place
        moving.discard(turn_id)
        gone = latest.pop(turn_id)[0]
        del thread[gone]
        for other, (at, last) in latest.items():
            if at > gone:
                latest[other] = (at - 1, last)
    if turn_id in latest:
        position = latest[turn_id][0]
        thread[position] = entry
    else:
        position = len(thread)
        thread.append(entry)
    latest[turn_id] = (position, message)


def _reply_status(
    reducer: Reducer, turn_id: str | None, message: Message | StreamingMessage
) -> ReplyStatus:
    """How the turn of this reply stands (module docstring, "The reply of a turn")."""
    if turn_id is not None and turn_id == reducer.running_turn_id:
        return "in_progress"
    if isinstance(message, StreamingMessage):
        return "in_progress"  # a turn that ended with its message open: a server bug
    known = reducer.turn_outcomes.get(turn_id) if turn_id is not None else None
    if known is not None:
        if known.status == "cancelled":
            return "cancelled"
        return "error" if known.stop_reason == "error" else "complete"
    if message.status in ("cancelled", "error"):
        return "error" if message.status == "error" else "cancelled"
    asked = [b.id for b in message.content if isinstance(b, ToolUseBlock)]
    outcomes = [reducer.tool_results[i] for i in asked if i in reducer.tool_results]
    if any(o.status == "failed" and o.content == "cancelled" for o in outcomes):
        return "cancelled"
    return "error" if outcomes else "complete"


def _status_line(reducer: Reducer) -> StatusLine | None:
    """The one status line of the turn in flight (module docstring, "The status line")."""
    if reducer.compacting is not None:
        return {"kind": "compacting", "trigger": reducer.compacting.trigger}
    running = reducer.running_turn_id
    if running is None:
        return None
    streaming = reducer.streaming
    if streaming is not None and streaming.turn_id == running:
        opened = streaming.open_block()
        if opened is None:
            return None
        block = opened[1]
        match block.kind:
            case "thinking":
                return {"kind": "thinking", "text": block.last_chunk}
            case "redacted_thinking":
                return {"kind": "thinking", "text": ""}
            case "tool_use":
                return {
                    "kind": "tool",
                    "state": "preparing",
                    "tool_use_id": block.tool_use_id,
                    "tool_name": block.tool_name,
                }
            case "text":
                return None
    waiting: list[ToolStatusLine] = []
    for message in reducer.messages:
        if message.role != "assistant" or message.turn_id != running:
            continue
        if message.status != "complete":
            continue
        for b in message.content:
            if isinstance(b, ToolUseBlock) and b.id not in reducer.tool_results:
                state: Literal["awaiting_approval", "running"] = (
                    "awaiting_approval" if _permission_for(reducer, b.id) else "running"
                )
                waiting.append(
                    {"kind": "tool", "state": state, "tool_use_id": b.id, "tool_name": b.name}
                )
    for line in waiting:
        if line["state"] == "awaiting_approval":
            return line
    return waiting[0] if waiting else None

"""Context compaction, without I/O: what to compact, and what the model sees (docs/protocol.md §12).

A session keeps every message it ever had; a model's context does not grow
with it. A compaction stores one ``context`` message whose
:class:`~gateway.protocol.shapes.CompactionBlock` summarises the oldest
messages and names them in ``replaces``; from then on the model is sent
:func:`model_view`, not the whole conversation. The store, ``GET
.../messages``, snapshots and every client's view keep all the messages: only
the model's view is shorter.

The rules, where PROTOCOL is silent:

1. The model's view (:func:`model_view`) is the latest ``context`` message,
   then every other message that it does not replace, in stored order.
   Earlier ``context`` messages are never sent: each compaction summarises the
   view it found, the previous summary included, and its ``replaces`` lists
   every message the view has left behind so far (cumulative), so the latest
   one alone says what the model sees. A message still ``in_progress`` is
   never in the view.
2. What a compaction replaces (:func:`plan`) is a prefix of the current view:
   everything before the turn it keeps. It keeps the turn in flight (from its
   first message on), or, with no turn in flight (``POST .../compact``), the
   latest turn. It never splits a tool use from its result: the prefix ends
   where no ``tool_use`` before the cut has its ``tool_result`` after it, or
   the other way round (a cut that would is moved earlier, keeping more).
   A prefix with no message besides the previous ``context`` message has
   nothing to compact (``None``).
3. The estimate of a call's input (:func:`estimate`): the ``input_tokens``
   (cache reads and writes included) that the provider reported for the
   latest call made on the current view, plus ceil(characters / 4) of what
   was added since (that call's own answer included). Before any such call
   (a new session, or right after a compaction) it is ceil(characters / 4)
   of the whole view. Characters: text, thinking, tool input JSON, tool
   result content, a summary. System prompt and tool definitions are counted
   only through a reported ``input_tokens``. A file the model is sent adds
   its tokens by :func:`gateway.providers.attachments.file_tokens`: an image
   1,600 (Anthropic's most for one image: the gateway does not decode it to
   know its size), a document its size / 4; audio, never sent, nothing.
4. The summary request (:func:`summary_request`): the same model, the system
   prompt :data:`SUMMARY_SYSTEM`, one user message holding the replaced
   messages rendered as text (:func:`render`, at most
   :data:`SUMMARY_INPUT_MAX_CHARS` characters: a longer rendering keeps its
   beginning and end), no tools, at most :data:`SUMMARY_MAX_TOKENS` tokens.
   A file is rendered as a line naming it (``[image FILE_ID image/png, 1234
   bytes]``); its bytes are not sent to the summary call.
5. A file is never summarised away without a word (:func:`files_note`): a
   summary is followed by the line ``Files in the replaced messages:`` and
   each file of every message the context message replaces (its ``replaces``,
   cumulative), ``FILE_ID (MEDIA_TYPE, SIZE bytes)``, ``, `` between two, so
   the model knows they existed and a client can find them. A truncation
   (no summary) drops files as it drops text, and says so in
   ``context.compacted`` (``method: "truncate"``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import msgspec

from gateway.protocol.shapes import (
    AudioBlock,
    CompactionBlock,
    ContentBlock,
    DocumentBlock,
    FileBlock,
    ImageBlock,
    Message,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from gateway.providers.attachments import file_tokens
from gateway.providers.base import ModelRequest
from gateway.providers.history import MESSAGE_SEPARATOR, SUMMARY_MARKER, tool_images

SUMMARY_SYSTEM = (
    SUMMARY_MARKER + " You are summarising the earlier part of a conversation between a"
    " user and an AI assistant that uses tools, so that the assistant can go on without it."
    " Write a concise summary that keeps everything needed to continue: the user's goals and"
    " requests, decisions made, facts learned, files and commands involved with their"
    " results, and what remains to do. Write only the summary."
)
"""The summary call's system prompt. It begins with ``[gateway:compaction]``, by which
the scripted model knows a summary request (:mod:`gateway.providers.scripted`)."""

SUMMARY_MAX_TOKENS = 2048
"""``max_tokens`` of the summary call (a constant: no config key for it yet)."""

SUMMARY_INPUT_MAX_CHARS = 400_000
"""At most this many characters of rendered messages go to the summary call (about
100k tokens at 4 characters a token): a longer rendering keeps its start and end."""


@dataclass(frozen=True)
class Plan:
    """One compaction to make: the view's prefix to replace, and where the view goes on."""

    replaced: list[Message]  # the view's prefix: what the summary is written from
    replaces: list[str]  # the ids the new context message names (rule 1: cumulative)
    first_kept: Message | None  # the first message the view keeps


def model_view(messages: Sequence[Message]) -> list[Message]:
    """The messages the model is sent, oldest first (rule 1)."""
    latest: Message | None = None
    for message in messages:
        if message.role == "context" and message.status != "in_progress":
            latest = message
    hidden = set(_replaces(latest)) if latest is not None else set()
    rest = [
        m
        for m in messages
        if m.role != "context" and m.status != "in_progress" and m.id not in hidden
    ]
    return [latest, *rest] if latest is not None else rest


def plan(messages: Sequence[Message], keep_turn_id: str | None) -> Plan | None:
    """What to compact now, or ``None`` when there is nothing (rule 2).

    Args:
        messages: the session's messages, oldest first (all of them, as stored).
        keep_turn_id: the turn in flight, kept whole; ``None``: keep the latest turn.
    """
    view = model_view(messages)
    turn_id = keep_turn_id
    if turn_id is None:
        turn_id = next((m.turn_id for m in reversed(view) if m.role != "context"), None)
    cut = next(
        (i for i, m in enumerate(view) if m.role != "context" and m.turn_id == turn_id),
        len(view),
    )
    while cut > 0 and _splits(view, cut):
        cut -= 1
    prefix = view[:cut]
    newly = [m.id for m in prefix if m.role != "context"]
    if not newly:
        return None
    previous = prefix[0] if prefix and prefix[0].role == "context" else None
    replaces = [*(_replaces(previous) if previous is not None else []), *newly]
    return Plan(prefix, replaces, view[cut] if cut < len(view) else None)


def _replaces(message: Message) -> list[str]:
    return [i for b in message.content if isinstance(b, CompactionBlock) for i in b.replaces]


def _splits(view: Sequence[Message], cut: int) -> bool:
    """Whether cutting before ``view[cut]`` parts a tool use from its result."""
    uses_before, results_before = _tool_ids(view[:cut])
    uses_after, results_after = _tool_ids(view[cut:])
    return bool(uses_before & results_after or results_before & uses_after)


def _tool_ids(messages: Sequence[Message]) -> tuple[set[str], set[str]]:
    uses: set[str] = set()
    results: set[str] = set()
    for message in messages:
        for block in message.content:
            if isinstance(block, ToolUseBlock):
                uses.add(block.id)
            elif isinstance(block, ToolResultBlock):
                results.add(block.tool_use_id)
    return uses, results


# --- the estimate -------------------------------------------------------------


def estimate(messages: Sequence[Message]) -> int:
    """The estimated input tokens of a call on the session's view now (rule 3)."""
    view = model_view(messages)
    for position in range(len(view) - 1, -1, -1):
        message = view[position]
        if message.role == "context":
            break  # no call was made on this view yet
        if message.role == "assistant" and message.usage is not None:
            usage = message.usage
            reported = (
                usage.input_tokens
                + (usage.cache_read_input_tokens or 0)
                + (usage.cache_creation_input_tokens or 0)
            )
            if reported:
                return reported + tokens(view[position:])
    return tokens(view)


def tokens(messages: Sequence[Message]) -> int:
    """ceil(characters / 4) of these messages, and the tokens of their files (rule 3)."""
    chars = sum(_chars(b) for m in messages for b in m.content)
    files = sum(file_tokens(f) for m in messages for b in m.content for f in _sent(b))
    return math.ceil(chars / 4) + files


def _sent(block: ContentBlock) -> list[FileBlock]:
    """The files of a block a model is sent (gateway.providers.history, rule 2)."""
    if isinstance(block, ImageBlock | DocumentBlock):
        return [block]
    if isinstance(block, ToolResultBlock) and block.files:
        return tool_images(block.files)
    return []


def _files(block: ContentBlock) -> list[FileBlock]:
    """Every file of a block, audio included."""
    if isinstance(block, ImageBlock | DocumentBlock | AudioBlock):
        return [block]
    return list(block.files) if isinstance(block, ToolResultBlock) and block.files else []


def _named(block: FileBlock) -> str:
    return f"{block.file_id} ({block.media_type}, {block.size} bytes)"


def files_note(messages: Sequence[Message], replaces: Sequence[str]) -> str:
    """The line naming the files of the replaced messages (rule 5); "" when they have none."""
    ids = set(replaces)
    found: dict[str, str] = {}
    for message in messages:
        if message.id in ids:
            for block in message.content:
                found.update((f.file_id, _named(f)) for f in _files(block))
    return "Files in the replaced messages: " + ", ".join(found.values()) if found else ""


def _chars(block: ContentBlock) -> int:
    match block:
        case TextBlock():
            return len(block.text)
        case ThinkingBlock():
            return len(block.thinking)
        case ToolUseBlock():
            return len(msgspec.json.encode(block.input))
        case ToolResultBlock():
            return len(block.content)
        case CompactionBlock():
            return len(block.summary)
    return 0


# --- the summary request ----------------------------------------------------------


def render(messages: Sequence[Message]) -> str:
    """The messages as text for the summary call, :data:`MESSAGE_SEPARATOR` between two."""
    parts = []
    for message in messages:
        lines = []
        for block in message.content:
            match block:
                case TextBlock() if block.text:
                    lines.append(block.text)
                case ToolUseBlock():
                    lines.append(
                        f"[tool call {block.name}] {msgspec.json.encode(block.input).decode()}"
                    )
                case ToolResultBlock():
                    error = " (error)" if block.is_error else ""
                    lines.append(f"[tool result{error}] {block.content}")
                    lines += [_file_line(f) for f in block.files or []]
                case ImageBlock() | DocumentBlock() | AudioBlock():
                    lines.append(_file_line(block))
                case CompactionBlock() if block.summary:
                    lines.append(f"[summary of what came before] {block.summary}")
        if lines:
            parts.append(f"{message.role}: " + "\n".join(lines))
    text = MESSAGE_SEPARATOR.join(parts)
    if len(text) > SUMMARY_INPUT_MAX_CHARS:
        half = SUMMARY_INPUT_MAX_CHARS // 2
        omitted = len(text) - 2 * half
        text = f"{text[:half]}\n\n[... {omitted} characters left out ...]\n\n{text[-half:]}"
    return text


def _file_line(block: FileBlock) -> str:
    """A file in a rendering (rule 4): named, never its bytes."""
    kind = block.__struct_config__.tag
    return f"[{kind} {block.file_id} {block.media_type}, {block.size} bytes]"


def summary_request(model: str, replaced: Sequence[Message], session_id: str) -> ModelRequest:
    """The summary call of a compaction (rule 4)."""
    transcript = Message(
        "msg_compaction_request",
        session_id,
        None,
        "user",
        [TextBlock(render(replaced))],
        "complete",
        0,
    )
    return ModelRequest(
        model=model,
        messages=[transcript],
        tools=[],
        max_tokens=SUMMARY_MAX_TOKENS,
        system=SUMMARY_SYSTEM,
    )

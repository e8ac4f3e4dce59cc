"""The conversation a model is sent, rebuilt from the message store for every call.

The session keeps every message as it happened (docs/protocol.md §6): a cancelled
assistant message with half a text block, a thinking block cut off before its
signature, tool uses that never ran. A model API refuses most of that, so each
call rebuilds the conversation with :func:`rebuild`, which both providers share
(the Anthropic provider sends its blocks as they are, the OpenAI-compatible one
maps them to its own roles).

The rules, where PROTOCOL is silent (it only says the history comes from the
message store):

1. Messages still ``in_progress`` are left out; ``complete``, ``cancelled``
   and ``error`` ones are kept, partial content included: the user saw it.
2. Blocks a role cannot carry are dropped: a user message keeps text,
   images, documents and tool results, an assistant message text, thinking,
   redacted thinking and tool uses (never a file: a model writes none).
   Audio is dropped wherever it is (no provider of the gateway takes audio:
   docs/protocol.md §2 "Files"), and a tool result keeps only the images of
   its ``files`` (``UNSET`` when none is left). Empty text blocks are dropped
   (the API refuses them), and so are thinking blocks without a signature:
   the API verifies every thinking block it is sent, and a block cut off
   mid-stream never got its signature. Redacted thinking is kept as it came.
   The files kept are what :func:`model_files` names: the ones whose bytes a
   call needs (``ModelRequest.files``).
3. Consecutive messages of one role are merged into one, in order (the API
   wants the roles to alternate): for instance a turn cancelled before the
   model answered leaves two user messages in a row.
4. Tool uses and tool results are paired: an assistant tool use is kept only
   if the next (merged) user message has its result, and a tool result only
   if the assistant message just before has its tool use. A cancelled call's
   tool uses never ran and are dropped this way. A user message's tool
   results come first, as the API requires, in the order of their tool uses
   (tools finish in any order; the request is the same whatever it was).
   Pairs are matched within those two messages only, one result per use, in
   order: an id met again (docs/protocol.md §1 wants tool use ids unique, but
   OpenAI-compatible servers that repeat theirs were passed through before
   the gateway gave them ids of its own, and their sessions are stored so)
   pairs with its own result, and is sent renamed, ``<id>_2``, ``<id>_3``...,
   the same on the use and its result, so the ids a model is sent are unique.
   The renaming is a pure function of the history, so every call of a
   session sends the same ids (a provider's prompt cache keeps working).
5. A message left with nothing to say is dropped: an assistant message
   without text or a tool use (thinking alone leads nowhere), a user message
   without any block. The neighbours it separated are merged (rule 3).
6. A tool result is sent without its ``structured_content`` (PROTOCOL
   section 6 keeps it for clients): no model API knows that field
   (Anthropic's ``tool_result`` would refuse it as an unknown key), and the
   model already has the result's text.
7. A ``context`` message (docs/protocol.md §12) is read by the model as a user
   message: :data:`SUMMARY_PREFIX` and its summary, one text block; a
   truncation's (no summary) says nothing and is dropped. Its neighbours
   merge with it by rule 3: the user message after it becomes one user
   message, the summary first (the API wants the roles to alternate). Which
   messages a context message stands for is the caller's business
   (:func:`gateway.session.compaction.model_view`): this module renders
   whatever it is given.
8. A call carries at most :data:`~gateway.providers.attachments.REQUEST_FILE_BYTES`
   of files (:func:`within_budget`): the newest message's first, each in its
   order, a file counted once; an older file past it is, in its place, a line
   of text saying so (:func:`~gateway.providers.attachments.not_sent`), and a
   tool result's image past it a line after the result's text. The session
   keeps every file; only what one call sends is bounded.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import msgspec

from gateway.protocol.shapes import (
    CompactionBlock,
    ContentBlock,
    DocumentBlock,
    FileBlock,
    ImageBlock,
    Message,
    RedactedThinkingBlock,
    Role,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from gateway.providers.attachments import REQUEST_FILE_BYTES, not_sent

SUMMARY_PREFIX = "Summary of the earlier conversation:\n\n"
"""How a ``context`` message reads to the model (rule 6)."""

SUMMARY_MARKER = "[gateway:compaction]"
"""How the system prompt of a compaction's summary call begins
(:data:`gateway.session.compaction.SUMMARY_SYSTEM`): the scripted model knows it by it."""

MESSAGE_SEPARATOR = "\n\n---\n\n"
"""Between two messages rendered as text for a summary call
(:func:`gateway.session.compaction.render`)."""


@dataclass(frozen=True)
class HistoryMessage:
    """One message of the rebuilt conversation: a role and its blocks, in order.

    Not a :class:`~gateway.protocol.shapes.Message`: it has no id or status,
    and may stand for several stored messages merged into one.
    """

    role: Role
    content: list[ContentBlock]


def rebuild(messages: Iterable[Message]) -> list[HistoryMessage]:
    """The conversation to send, by the rules of the module docstring.

    Args:
        messages: the session's messages, oldest first.

    Returns:
        Alternating user and assistant messages, each with something to say.
    """
    history = _merged(_as_read(message) for message in messages if message.status != "in_progress")
    return _merged(message for message in _paired(history) if _says_something(message))


def _as_read(message: Message) -> HistoryMessage:
    """Rules 2 and 6: the blocks of a message the model may be sent, in its role."""
    if message.role == "context":
        summary = "".join(b.summary for b in message.content if isinstance(b, CompactionBlock))
        return HistoryMessage("user", [TextBlock(SUMMARY_PREFIX + summary)] if summary else [])
    return HistoryMessage(
        message.role,
        [_kept(b) for b in message.content if _fits(message.role, b)],
    )


def _fits(role: Role, block: ContentBlock) -> bool:
    """Rule 2: can a message of this role carry this block?"""
    match block:
        case TextBlock():
            return bool(block.text)
        case ToolResultBlock() | ImageBlock() | DocumentBlock():
            return role == "user"
        case ThinkingBlock():
            return role == "assistant" and bool(block.signature)
        case RedactedThinkingBlock() | ToolUseBlock():
            return role == "assistant"
    return False


def _kept(block: ContentBlock) -> ContentBlock:
    """Rule 2: a tool result with the images of its files only."""
    if not isinstance(block, ToolResultBlock) or not block.files:
        return block
    images = tool_images(block.files)
    return msgspec.structs.replace(block, files=images or msgspec.UNSET)


def tool_images(files: Sequence[FileBlock]) -> list[FileBlock]:
    """Rule 2: the files of a tool result that a model is sent (its images)."""
    return [f for f in files if isinstance(f, ImageBlock)]


def model_files(messages: Iterable[Message]) -> list[str]:
    """The ids of the files a call on these messages sends (rule 2), in order, once each.

    Images and documents of user messages, images of tool results; never
    audio, never a file of an assistant or an in-progress message. Pairing
    (rule 4) is not applied: a file of an unpaired tool result is read for
    nothing, never missed.
    """
    found: dict[str, None] = {}
    for message in messages:
        if message.role != "user" or message.status == "in_progress":
            continue
        for block in message.content:
            if isinstance(block, ImageBlock | DocumentBlock):
                found[block.file_id] = None
            elif isinstance(block, ToolResultBlock) and block.files:
                found.update((f.file_id, None) for f in tool_images(block.files))
    return list(found)


def _merged(history: Iterable[HistoryMessage]) -> list[HistoryMessage]:
    """Rule 3: one message per run of a role, its blocks in order."""
    return [
        HistoryMessage(role, [block for message in run for block in message.content])
        for role, run in itertools.groupby(history, key=lambda message: message.role)
    ]


def _paired(history: list[HistoryMessage]) -> list[HistoryMessage]:
    """Rule 4: keep the tool uses answered by the next message, and their results.

    After :func:`_merged` the roles alternate, so the results of an assistant
    message's tool uses can only be in the message right after it.
    """
    wire_ids: set[str] = set()  # every tool use id sent so far
    kept: list[HistoryMessage] = []
    answers: list[ToolResultBlock] = []  # for the next user message, in tool use order
    for position, message in enumerate(history):
        if message.role == "user":
            rest = [b for b in message.content if not isinstance(b, ToolResultBlock)]
            kept.append(HistoryMessage("user", [*answers, *rest]))
            answers = []
            continue
        following = history[position + 1].content if position + 1 < len(history) else []
        results: dict[str, list[ToolResultBlock]] = {}
        for block in following:
            if isinstance(block, ToolResultBlock):
                results.setdefault(block.tool_use_id, []).append(block)
        content: list[ContentBlock] = []
        for block in message.content:
            if not isinstance(block, ToolUseBlock):
                content.append(block)
            elif results.get(block.id):
                result = results[block.id].pop(0)
                wire_id = _unique(block.id, wire_ids)
                content.append(msgspec.structs.replace(block, id=wire_id))
                answers.append(  # rule 6: the model gets the text, not the structure
                    msgspec.structs.replace(
                        result, tool_use_id=wire_id, structured_content=msgspec.UNSET
                    )
                )
        kept.append(HistoryMessage("assistant", content))
    return kept


def _unique(tool_use_id: str, taken: set[str]) -> str:
    """``tool_use_id``, or ``<id>_2``, ``<id>_3``... if already taken; now taken too."""
    candidate, n = tool_use_id, 1
    while candidate in taken:
        n += 1
        candidate = f"{tool_use_id}_{n}"
    taken.add(candidate)
    return candidate


def _says_something(message: HistoryMessage) -> bool:
    """Rule 5."""
    if message.role == "user":
        return bool(message.content)
    return any(isinstance(b, TextBlock | ToolUseBlock) for b in message.content)


def within_budget(messages: Sequence[Message], most: int = REQUEST_FILE_BYTES) -> list[Message]:
    """Rule 8: ``messages`` with the files past ``most`` bytes, the oldest, as lines of text."""
    left, counted = most, set[str]()

    def fits(f: FileBlock) -> bool:
        nonlocal left
        if f.file_id not in counted:
            if f.size > left:
                return False
            left -= f.size
            counted.add(f.file_id)
        return True

    out: list[Message] = []
    for message in reversed(messages):
        if message.role != "user" or message.status == "in_progress":
            out.append(message)
            continue
        content: list[ContentBlock] = []
        for block in message.content:
            if isinstance(block, ImageBlock | DocumentBlock) and not fits(block):
                block = TextBlock(not_sent(block, most))
            elif isinstance(block, ToolResultBlock) and block.files:
                past = [f for f in tool_images(block.files) if not fits(f)]
                if past:
                    files = [f for f in block.files if f not in past]
                    lines = "\n".join(not_sent(f, most) for f in past)
                    text = f"{block.content}\n{lines}" if block.content else lines
                    block = msgspec.structs.replace(
                        block, content=text, files=files or msgspec.UNSET
                    )
            content.append(block)
        changed = any(a is not b for a, b in zip(content, message.content, strict=True))
        out.append(msgspec.structs.replace(message, content=content) if changed else message)
    return out[::-1]

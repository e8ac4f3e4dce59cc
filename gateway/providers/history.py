"""The conversation a model is sent, rebuilt from the message store for every call.

The session keeps every message as it happened (PROTOCOL section 6): a cancelled
assistant message with half a text block, a thinking block cut off before its
signature, tool uses that never ran. A model API refuses most of that, so each
call rebuilds the conversation with :func:`rebuild`, which both providers share
(the Anthropic provider sends its blocks as they are, the OpenAI-compatible one
maps them to its own roles).

The rules, where PROTOCOL is silent (it only says the history comes from the
message store):

1. Messages still ``in_progress`` are left out; ``complete``, ``cancelled``
   and ``error`` ones are kept, partial content included: the user saw it.
2. Blocks a role cannot carry are dropped: a user message keeps text and
   tool results, an assistant message text, thinking, redacted thinking and
   tool uses. Empty text blocks are dropped (the API refuses them), and so
   are thinking blocks without a signature: the API verifies every thinking
   block it is sent, and a block cut off mid-stream never got its signature.
   Redacted thinking is kept as it came.
3. Consecutive messages of one role are merged into one, in order (the API
   wants the roles to alternate): for instance a turn cancelled before the
   model answered leaves two user messages in a row.
4. Tool uses and tool results are paired: an assistant tool use is kept only
   if the next (merged) user message has its result, and a tool result only
   if the assistant message just before has its tool use. A cancelled call's
   tool uses never ran and are dropped this way. A user message's tool
   results come first, as the API requires, in the order of their tool uses
   (tools finish in any order; the request is the same whatever it was).
5. A message left with nothing to say is dropped: an assistant message
   without text or a tool use (thinking alone leads nowhere), a user message
   without any block. The neighbours it separated are merged (rule 3).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass

from gateway.protocol.shapes import (
    ContentBlock,
    Message,
    RedactedThinkingBlock,
    Role,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)


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
    history = _merged(
        HistoryMessage(message.role, [b for b in message.content if _fits(message.role, b)])
        for message in messages
        if message.status != "in_progress"
    )
    return _merged(message for message in _paired(history) if _says_something(message))


def _fits(role: Role, block: ContentBlock) -> bool:
    """Rule 2: can a message of this role carry this block?"""
    match block:
        case TextBlock():
            return bool(block.text)
        case ToolResultBlock():
            return role == "user"
        case ThinkingBlock():
            return role == "assistant" and bool(block.signature)
        case RedactedThinkingBlock() | ToolUseBlock():
            return role == "assistant"
    return False


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
    paired: dict[str, int] = {}  # tool use id -> its place among the kept tool uses
    for asking, answering in itertools.pairwise(history):
        if asking.role == "assistant":
            answered = {b.tool_use_id for b in answering.content if isinstance(b, ToolResultBlock)}
            for block in asking.content:
                if isinstance(block, ToolUseBlock) and block.id in answered:
                    paired[block.id] = len(paired)

    def place(block: ContentBlock) -> int:
        return paired[block.tool_use_id] if isinstance(block, ToolResultBlock) else len(paired)

    kept = []
    for message in history:
        content = [block for block in message.content if _kept(block, paired)]
        if message.role == "user":
            content.sort(key=place)
        kept.append(HistoryMessage(message.role, content))
    return kept


def _kept(block: ContentBlock, paired: dict[str, int]) -> bool:
    match block:
        case ToolUseBlock():
            return block.id in paired
        case ToolResultBlock():
            return block.tool_use_id in paired
    return True


def _says_something(message: HistoryMessage) -> bool:
    """Rule 5."""
    if message.role == "user":
        return bool(message.content)
    return any(isinstance(b, TextBlock | ToolUseBlock) for b in message.content)

"""A message's blocks as the streaming events that would have made them (docs/protocol.md §5).

A replay holds a message as its ``message.complete`` (or, while it streams,
a ``message.snapshot``): streaming-only events are not replayed
(docs/protocol.md §3). A front end that speaks in blocks (AG-UI, the AI SDK)
rebuilds the blocks it has not seen start from it, whole.
"""

from __future__ import annotations

from collections.abc import Callable

from gateway.protocol.events import (
    MessageComplete,
    MessageSnapshot,
    Payload,
    TextDelta,
    TextEnd,
    TextStart,
    ThinkingDelta,
    ThinkingEnd,
    ThinkingStart,
    ToolUseEnd,
    ToolUseStart,
)
from gateway.protocol.shapes import (
    ContentBlock,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    ToolUseBlock,
)


def block_events(mid: str, i: int, block: ContentBlock, is_open: bool) -> list[Payload]:
    """A block as the streaming events that would have made it (docs/protocol.md §5)."""
    events: list[Payload]
    match block:
        case TextBlock():
            events = [TextStart(mid, i), TextDelta(mid, i, block.text), TextEnd(mid, i)]
        case ThinkingBlock():
            events = [
                ThinkingStart(mid, i, False),
                ThinkingDelta(mid, i, block.thinking, None),
                ThinkingEnd(mid, i, block.signature),
            ]
        case RedactedThinkingBlock():
            events = [
                ThinkingStart(mid, i, True),
                ThinkingDelta(mid, i, block.data, None),
                ThinkingEnd(mid, i, None),
            ]
        case ToolUseBlock():
            events = [
                ToolUseStart(mid, i, block.id, block.name),
                ToolUseEnd(mid, i, block.id, block.name, block.input),
            ]
        case _:
            return []
    return events[:-1] if is_open else events


def unstarted(payload: Payload, started: Callable[[str, int], bool]) -> list[Payload]:
    """The events of the blocks of a whole message (``message.complete`` or
    ``message.snapshot``) that ``started(message_id, index)`` says were not seen start."""
    open_index: int | None
    if isinstance(payload, MessageComplete):
        message_id, blocks, open_index = payload.message_id, payload.final_content, None
    elif isinstance(payload, MessageSnapshot):
        m = payload.message
        message_id, blocks = m.id, m.content
        open_index = m.open_block_index if isinstance(m.open_block_index, int) else None
    else:
        return []
    out: list[Payload] = []
    for i, block in enumerate(blocks):
        if not started(message_id, i):
            out += block_events(message_id, i, block, i == open_index)
    return out

"""Frames that fit: a snapshot under ``[stream] snapshot_max_bytes`` (docs/protocol.md §15).

Sans-IO: messages in, encoded frame out. A session's history grows without
bound, but a client refuses a frame over its own limit (close 1009), so a
``snapshot`` frame (and a replay's ``message.snapshot``) is cut to fit:

- **Older messages first.** Messages are encoded once each, from the newest
  backwards, and summed until the next one would not fit; it and everything
  older are left out. ``has_more`` is true whenever the session has messages
  older than the first one sent, whatever left them out (``snapshot_messages``
  or the byte cap): a client pages them with ``GET .../messages?before=<the
  first sent id>``. Older messages are never encoded at all.
- **A block too big, cut.** When even the newest message alone does not fit,
  its largest blocks are cut (largest first, only as much as needed) and each
  cut block is marked ``"truncated": true``; ``GET /sessions/{id}/messages/
  {message_id}`` answers the whole message. What is cut: a text block's
  ``text``, a thinking block's ``thinking`` (its ``signature`` kept), a
  redacted thinking block's ``data`` and a tool result's ``content`` keep
  their beginning; a tool use's ``input`` becomes ``{}`` (a prefix of JSON is
  not JSON).
- **The open block keeps its end.** The block an ``in_progress`` message is
  still streaming (``open_block_index``) is cut at its *beginning* instead:
  its live deltas continue after what was sent, so the client's text stays
  contiguous (a truncated head, then the tail and the deltas); the
  ``message.complete`` that ends the message carries it whole. The cut
  changes no event and no id, so the seam's cut (``snapshot_at_event_id``)
  and its exactly-once rule are untouched.
- **The summary.** Its queued turns' user messages (docs/protocol.md §2 "A
  busy session") take at most half the cap: the largest are cut as a message
  is, marked truncated (``turn.queued`` and, once it started, ``GET
  .../messages`` have them whole). A pending permission whose input alone
  would push the frame over the cap has its input sent as ``{}``, marked
  truncated.

The streaming message is always sent, cut as far as its blocks allow: live
deltas name it, and a client cannot apply them to a message it never got.
Only a message of so many blocks that their bare shapes exceed the cap could
make a frame larger than the cap; every other frame fits, and the tests
check the sizes.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from gateway.protocol.events import Event, MessageSnapshot
from gateway.protocol.frames import encode
from gateway.protocol.shapes import (
    ContentBlock,
    Message,
    PendingPermission,
    RedactedThinkingBlock,
    SessionSummary,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)

TRUNCATED_FIELD = len(b',"truncated":true')
"""What marking a block truncated adds to its JSON."""


class _SnapshotWire(msgspec.Struct, tag="snapshot", tag_field="type"):
    """:class:`gateway.protocol.frames.Snapshot`, its messages already encoded (same JSON)."""

    session: SessionSummary
    messages: list[msgspec.Raw]
    snapshot_at_event_id: str | None
    has_more: bool = False


def fit_snapshot(
    session: SessionSummary,
    messages: Sequence[Message],
    snapshot_at_event_id: str | None,
    *,
    limit: int,
    max_bytes: int,
) -> bytes:
    """The encoded ``snapshot`` frame of ``messages`` (oldest first), never over ``max_bytes``.

    At most the newest ``limit`` messages (module docstring); each is encoded
    at most once, and only those from the newest back to the first that does
    not fit.
    """
    session = _fit_summary(session, snapshot_at_event_id, max_bytes)
    # The frame with no messages, ``has_more`` at its longer spelling (false).
    room = max_bytes - len(encode(_SnapshotWire(session, [], snapshot_at_event_id, False)))
    candidates = messages[max(0, len(messages) - limit) :] if limit > 0 else []
    kept: list[bytes] = []
    used = 0
    for message in reversed(candidates):
        data = encode(message)
        extra = len(data) + (1 if kept else 0)  # the comma between two messages
        if used + extra <= room:
            kept.append(data)
            used += extra
            continue
        if not kept:  # the newest alone does not fit: it comes cut
            cut, fits = cut_message(message, room, size=len(data))
            if fits or message.status == "in_progress":
                kept.append(encode(cut))
        break
    kept.reverse()
    has_more = len(kept) < len(messages)
    raws = [msgspec.Raw(data) for data in kept]
    return encode(_SnapshotWire(session, raws, snapshot_at_event_id, has_more))


EVENT_FRAME_OVERHEAD = len(b'{"type":"event","event":}')
"""What the ``event`` frame (docs/protocol.md §3) adds around an event's JSON."""


def fit_message_snapshot(event: Event, max_bytes: int) -> bytes:
    """A ``message.snapshot`` event's JSON, its message cut so that its frame fits ``max_bytes``.

    The same cut as a snapshot's newest message (module docstring), the open
    block keeping its end; ``max_bytes`` bounds the whole ``event`` frame.
    """
    data = encode(event)
    payload = event.payload
    max_bytes -= EVENT_FRAME_OVERHEAD
    if len(data) <= max_bytes or not isinstance(payload, MessageSnapshot):
        return data
    message = payload.message
    size = len(encode(message))
    cut, _ = cut_message(message, size - (len(data) - max_bytes), size=size)
    return encode(msgspec.structs.replace(event, payload=MessageSnapshot(cut)))


def cut_message(message: Message, budget: int, *, size: int | None = None) -> tuple[Message, bool]:
    """``message`` with its largest blocks cut until its JSON is at most ``budget`` bytes.

    Args:
        size: the length of ``message``'s JSON, when the caller has it.

    Returns:
        The cut message, and whether it fits (it does unless its blocks'
        bare shapes alone exceed ``budget``).
    """
    total = len(encode(message)) if size is None else size
    if total <= budget:
        return message, True
    blocks = list(message.content)
    sizes = [len(encode(block)) for block in blocks]
    open_index = message.open_block_index if message.status == "in_progress" else None
    # One level for every block: those under it stay whole, those over it are
    # cut to it, so each large block keeps a part (the open one its end).
    level = _level(sizes, budget - (total - sum(sizes)))
    for index in range(len(blocks)):
        if sizes[index] > level:
            cut = _cut_block(blocks[index], sizes[index], level, keep_end=index == open_index)
            new_size = len(encode(cut))
            total += new_size - sizes[index]
            blocks[index], sizes[index] = cut, new_size
    # A block cannot always come down to the level (its other fields): then
    # the largest are cut further, as far as needed.
    for index in sorted(range(len(blocks)), key=sizes.__getitem__, reverse=True):
        if total <= budget:
            break
        target = sizes[index] - (total - budget)
        cut = _cut_block(blocks[index], sizes[index], target, keep_end=index == open_index)
        new_size = len(encode(cut))
        total += new_size - sizes[index]
        blocks[index], sizes[index] = cut, new_size
    return msgspec.structs.replace(message, content=blocks), total <= budget


def _level(sizes: list[int], room: int) -> int:
    """The largest size L with ``sum(min(size, L)) <= room`` (every block at most L)."""
    ordered = sorted(sizes)
    for position, size in enumerate(ordered):
        left = len(ordered) - position
        if size * left > room:
            return max(0, room // left)
        room -= size
    return ordered[-1] if ordered else 0


def _cut_block(block: ContentBlock, size: int, target: int, *, keep_end: bool) -> ContentBlock:
    """``block`` (``size`` bytes of JSON) cut to at most ``target`` bytes where it can be."""
    if isinstance(block, ToolUseBlock):
        return msgspec.structs.replace(block, input={}, truncated=True)
    field = _CUT_FIELD[type(block)]
    text: str = getattr(block, field)
    text_size = len(encode(text))
    # The block's JSON is its other fields, the string and the mark.
    room = target - (size - text_size) - TRUNCATED_FIELD
    kept = cut_string(text, room, keep_end=keep_end)
    return msgspec.structs.replace(block, **{field: kept, "truncated": True})


_CUT_FIELD: dict[type, str] = {
    TextBlock: "text",
    ThinkingBlock: "thinking",
    RedactedThinkingBlock: "data",
    ToolResultBlock: "content",
}


def cut_string(text: str, max_json: int, *, keep_end: bool = False) -> str:
    """The longest start (or end) of ``text`` whose JSON string is at most ``max_json`` bytes.

    A character takes one byte of JSON or more (UTF-8, escapes), so the
    search starts from the length its average predicts and steps from there:
    a few encodings of at most ``max_json`` bytes each, never of all of ``text``.
    """

    def size(count: int) -> int:
        return len(encode(text[len(text) - count :] if keep_end else text[:count]))

    high = min(len(text), max(0, max_json - 2))  # at most one character a byte, and the quotes
    if high == 0 or size(high) <= max_json:
        return _part(text, high, keep_end)
    # ``low`` fits, ``high`` does not; guess from the average bytes per character.
    low, guess = 0, (max_json - 2) * high // max(1, size(high) - 2)
    step = 1
    while low + 1 < high:
        probe = min(max(guess, low + 1), high - 1)
        if size(probe) <= max_json:
            low, guess = probe, probe + step
        else:
            high, guess = probe, probe - step
        step *= 2
        if step > 4:  # the guess was off: halve what is left instead
            guess = (low + high) // 2
    return _part(text, low, keep_end)


def _part(text: str, count: int, keep_end: bool) -> str:
    return text[len(text) - count :] if keep_end else text[:count]


def _fit_queued(session: SessionSummary, max_bytes: int) -> SessionSummary:
    """The summary, its queued turns' user messages cut (their largest blocks first, marked
    truncated) so that together they take at most half of ``max_bytes``: the rest is the
    history's (docs/protocol.md §2 "A busy session": each may be ``max_body_bytes``)."""
    queued = session.queued_turns
    if isinstance(queued, msgspec.UnsetType) or not queued:
        return session
    sizes = [len(encode(q.user_message)) for q in queued]
    budget = max_bytes // 2
    if sum(sizes) <= budget:
        return session
    level = _level(sizes, budget)
    cut = [
        msgspec.structs.replace(q, user_message=cut_message(q.user_message, level, size=n)[0])
        if n > level
        else q
        for q, n in zip(queued, sizes, strict=True)
    ]
    return msgspec.structs.replace(session, queued_turns=cut)


def _fit_summary(
    session: SessionSummary, snapshot_at_event_id: str | None, max_bytes: int
) -> SessionSummary:
    """The summary, its queued turns cut to half the frame (:func:`_fit_queued`), then its
    largest pending permission inputs sent as ``{}`` while it does not fit."""
    session = _fit_queued(session, max_bytes)
    total = len(encode(_SnapshotWire(session, [], snapshot_at_event_id, False)))
    if total <= max_bytes or not session.pending_permissions:
        return session
    pending = list(session.pending_permissions)
    sizes = [len(encode(p.input)) for p in pending]
    for index in sorted(range(len(pending)), key=sizes.__getitem__, reverse=True):
        if total <= max_bytes:
            break
        cut: PendingPermission = msgspec.structs.replace(pending[index], input={}, truncated=True)
        total += len(b"{}") + TRUNCATED_FIELD - sizes[index]
        pending[index] = cut
    return msgspec.structs.replace(session, pending_permissions=pending)

"""What Claude Code's messages say, as the gateway's events and raw stream events (sans-IO).

docs/protocol.md §11's mapping, the parts that need no process, no session
and no clock: each function takes an SDK message (or a piece of one) and
returns what the runtime (:mod:`gateway.runtimes.claude_code.runtime`) feeds
to the translator or emits.

- **Whole messages.** Claude Code streams only the main thread: a
  sub-agent's messages come whole. :class:`WholeMessages` replays each as
  the raw stream events it would have had, so the worker's stream is the
  native one (ids, block lifecycle, snapshot, replay).
- **Compaction.** Claude Code's ``PreCompact`` hook starts it
  (``context.compacting``), ``compact_boundary`` gives its figures
  (:func:`compaction_figures`), and the user message that follows it holds
  the summary, which :func:`compact_summary` takes out of Claude Code's
  framing; :func:`compaction` is both events at once, for a boundary with
  no hook before it.
- **What the gateway does not know.** A stream event, delta or content block
  of a type the translator does not know is skipped (a block with its deltas
  and stop) and counted, never a failed call (:class:`KnownEvents`); so is a
  whole message's block (:class:`WholeMessages`). The runtime adds the
  count to ``gateway_unknown_events_total{runtime="claude-code"}``.
- **Structured results.** A user message's ``tool_use_result`` (Edit's
  ``structuredPatch``, TodoWrite's ``todos``...) is its one tool result's
  structured result (:func:`structured_result`).
- **The result.** ``error_max_turns`` is ``max_rounds``; an error result is a
  failed call of the API's status class (:func:`result_failure`); the stop
  reason is the result's, else the stream's (:func:`result_stop`).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Container, Iterator
from typing import Any, Literal

import msgspec
from claude_agent_sdk import AssistantMessage, ResultMessage, SystemMessage, UserMessage
from claude_agent_sdk import TextBlock as SdkText
from claude_agent_sdk import ThinkingBlock as SdkThinking
from claude_agent_sdk import ToolResultBlock as SdkToolResult
from claude_agent_sdk import ToolUseBlock as SdkToolUse

from gateway.ids import new_message_id
from gateway.protocol.events import ContextCompacted, ContextCompacting
from gateway.protocol.shapes import StopReason
from gateway.providers.errors import status_class
from gateway.providers.raw import RawEvent
from gateway.runtimes.claude_code.summary import compact_summary as compact_summary

RawData = dict[str, Any]
"""One raw stream event of the Messages API, as JSON (:mod:`gateway.providers.raw` reads it)."""

_STOP_REASONS = {"end_turn", "max_tokens", "stop_sequence", "tool_use"}
_REPORT_START = "The report follows:\n"
_REPORT_END = "\nagentId: "


def token_count(value: Any) -> int:
    """A token count Claude Code gave (a number, or its text), 0 when none."""
    try:
        return max(0, int(value))
    except (TypeError, ValueError):
        return 0


def result_text(content: str | list[dict[str, Any]] | None) -> str:
    """A tool result's content as text (its text parts, joined)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))


def report_text(result: str) -> str:
    """The sub-agent's report in its ``Agent`` tool result (the whole result if not found).

    Claude Code frames it: a notice ending ``The report follows:``, the report
    with every line indented two spaces, then ``agentId:`` and its usage.
    """
    start = result.find(_REPORT_START)
    if start < 0:
        return result.strip()
    start += len(_REPORT_START)
    end = result.find(_REPORT_END, start)
    body = result[start : end if end >= 0 else len(result)]
    return "\n".join(line.removeprefix("  ") for line in body.split("\n")).strip()


def block_events(index: int, block: Any) -> list[RawData]:
    """The raw stream events of one content block of a whole message (none: not streamed)."""
    if isinstance(block, SdkText):
        start: RawData = {"type": "text", "text": ""}
        deltas = [{"type": "text_delta", "text": block.text}]
    elif isinstance(block, SdkThinking):
        start = {"type": "thinking", "thinking": ""}
        deltas = [{"type": "thinking_delta", "thinking": block.thinking}]
        if block.signature:
            deltas.append({"type": "signature_delta", "signature": block.signature})
    elif isinstance(block, SdkToolUse):
        start = {"type": "tool_use", "id": block.id, "name": block.name, "input": {}}
        deltas = [{"type": "input_json_delta", "partial_json": json.dumps(block.input)}]
    else:
        return []
    return [
        {"type": "content_block_start", "index": index, "content_block": start},
        *({"type": "content_block_delta", "index": index, "delta": d} for d in deltas),
        {"type": "content_block_stop", "index": index},
    ]


class KnownEvents:
    """The raw stream events the translator knows; the others skipped and counted.

    A ``content_block_start`` of an unknown type skips its block: its deltas
    and stop too (counted once). An unknown delta of a known block, or an
    unknown event, is skipped alone. :attr:`skipped` is the count since the
    last :meth:`take`.
    """

    def __init__(self) -> None:
        self._blocks: set[int] = set()  # of the message streaming: unknown blocks' indexes
        self.skipped = 0

    def read(self, data: RawData) -> RawEvent | None:
        """The event as the translator reads it, or None: skip it."""
        kind, index = data.get("type"), data.get("index")
        if kind == "message_start":
            self._blocks.clear()
        elif kind in ("content_block_delta", "content_block_stop") and index in self._blocks:
            return None
        try:
            raw: RawEvent = msgspec.convert(data, RawEvent)
        except msgspec.ValidationError:
            if kind == "content_block_start" and isinstance(index, int):
                self._blocks.add(index)
            self.skipped += 1
            return None
        return raw

    def take(self) -> int:
        """The count skipped since the last call."""
        count, self.skipped = self.skipped, 0
        return count


def structured_result(message: UserMessage) -> Any:
    """The structured result of a user message's one tool result (None: none, or several).

    Claude Code gives a tool's structured result beside its text, as the
    message's ``tool_use_result``; with several results in one message it
    could not be told whose, so none is kept.
    """
    data = message.tool_use_result
    if not data or isinstance(message.content, str):
        return None
    results = [b for b in message.content if isinstance(b, SdkToolResult)]
    return data if len(results) == 1 else None


def compaction_figures(message: SystemMessage) -> tuple[Literal["auto", "manual"], int, int]:
    """A ``compact_boundary``'s trigger, ``pre_tokens`` and ``post_tokens`` (0: not given)."""
    meta = message.data.get("compact_metadata") or {}
    trigger: Literal["auto", "manual"] = "manual" if meta.get("trigger") == "manual" else "auto"
    return trigger, token_count(meta.get("pre_tokens")), token_count(meta.get("post_tokens"))


def compaction(message: SystemMessage) -> list[ContextCompacting | ContextCompacted]:
    """A compaction seen only at its boundary: ``context.compacting`` then ``context.compacted``.

    Its ``compact_metadata`` gives the trigger (``auto`` or ``manual``) and
    ``pre_tokens``; ``post_tokens`` is its own when it gives one, else 0 (not
    known). No summary was seen: ``summary_message_id`` and
    ``first_kept_message_id`` are null. docs/protocol.md §12.
    """
    trigger, pre, post = compaction_figures(message)
    return [
        ContextCompacting(trigger, pre),
        ContextCompacted(trigger, "summary", pre, post, None, None),
    ]


def result_failure(result: ResultMessage) -> tuple[str, str] | None:
    """An error result as the failed call's ``error_class`` and message (None: no error)."""
    if not result.is_error:
        return None
    status = result.api_error_status
    error_class = status_class(status) if status else "api_error"
    detail = "; ".join(result.errors or []) or result.result or result.subtype
    return error_class, f"Claude Code: {detail}"


def result_stop(result: ResultMessage, streamed: StopReason | None) -> StopReason:
    """The stop reason of a turn that ended well: the result's, else the stream's last."""
    reason = result.stop_reason if result.stop_reason in _STOP_REASONS else streamed
    return reason or "end_turn"  # type: ignore[return-value]


@dataclasses.dataclass
class _Replaying:
    """A whole message being replayed as a stream."""

    id: str
    index: int = 0
    output_tokens: int = 0
    tool_ids: set[str] = dataclasses.field(default_factory=set)


class WholeMessages:
    """A sub-agent's whole messages, as the raw stream events they would have had.

    Claude Code gives a message block by block (one ``AssistantMessage`` each,
    the same id): the message ends at the next message, a tool result, the
    sub-agent's end (:meth:`end`), or once ``can_use_tool`` asks of one of its
    tools (``asked``: a later block of it is then a message of its own, its
    id suffixed).
    """

    def __init__(self) -> None:
        self._open: _Replaying | None = None
        self._ids: set[str] = set()
        self.last_text = ""  # of the messages replayed (:meth:`report`)
        self.skipped = 0  # blocks of a type not known, not replayed

    def holds(self, tool_use_id: str) -> bool:
        """Whether the message being replayed has the tool use ``tool_use_id``."""
        return self._open is not None and tool_use_id in self._open.tool_ids

    def message(self, message: AssistantMessage, asked: Container[str]) -> Iterator[RawData]:
        """The raw events of one ``AssistantMessage`` (lazily: ``asked`` is read as they go)."""
        mid = message.message_id or new_message_id()
        if self._open is not None and self._open.id != mid.partition("~")[0]:
            yield from self.end()
        replaying = self._open
        if replaying is None:
            real, n = mid, 1
            while mid in self._ids:
                n += 1
                mid = f"{real}~{n}"
            self._ids.add(mid)
            replaying = self._open = _Replaying(real)
            usage = dict(message.usage or {})
            body = {"id": mid, "model": message.model, "usage": {**usage, "output_tokens": 0}}
            yield {"type": "message_start", "message": body}
        replaying.output_tokens = int((message.usage or {}).get("output_tokens") or 0)
        ends = False
        for block in message.content:
            events = block_events(replaying.index, block)
            if not events:
                self.skipped += 1
                continue
            yield from events
            replaying.index += 1
            if isinstance(block, SdkText):
                self.last_text = block.text
            if isinstance(block, SdkToolUse):
                replaying.tool_ids.add(block.id)
                ends = ends or block.id in asked
        if ends:
            yield from self.end()

    def end(self) -> list[RawData]:
        """End the message being replayed, if one is."""
        replaying, self._open = self._open, None
        if replaying is None:
            return []
        reason = "tool_use" if replaying.tool_ids else "end_turn"
        delta = {"stop_reason": reason, "stop_sequence": None}
        usage = {"output_tokens": replaying.output_tokens}
        return [
            {"type": "message_delta", "delta": delta, "usage": usage},
            {"type": "message_stop"},
        ]

    def report(self, text: str, model: str) -> list[RawData]:
        """The sub-agent's final report, as its last message.

        Claude Code does not give a sub-agent's last message as a message: its
        text is the ``Agent`` tool's result (the report). Replayed once (not
        if the sub-agent's last message said exactly that).
        """
        if not text or text == self.last_text:
            return []
        usage = {"input_tokens": 0, "output_tokens": 0}
        body = {"id": new_message_id(), "model": model, "usage": usage}
        delta = {"stop_reason": "end_turn", "stop_sequence": None}
        return [
            {"type": "message_start", "message": body},
            *block_events(0, SdkText(text)),
            {"type": "message_delta", "delta": delta, "usage": {"output_tokens": 0}},
            {"type": "message_stop"},
        ]

"""Claude Code's compactions, as the native loop shows them (docs/protocol.md §12).

``context.compacting`` when Claude Code starts (its ``PreCompact`` hook, the
trigger its own, ``pre_tokens`` the gateway's estimate), then, at
``compact_boundary`` and the summary Claude Code sends after it, a
``context`` message whose ``compaction`` block holds that summary and
replaces every message before it, and ``context.compacted`` naming it. A
compaction Claude Code reports failed closes with ``post_tokens`` =
``pre_tokens`` and no message; ``POST .../compact`` is Claude Code's
``/compact`` between turns (:meth:`Compaction.command`).

The runtime (:class:`~gateway.runtimes.claude_code.runtime.ClaudeCode`) hands
each message it reads to :meth:`Compaction.take` first, and closes a
compaction still open when its turn ends (:meth:`Compaction.over`).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING, Any, Literal

import trio
from claude_agent_sdk import ResultMessage, SystemMessage, UserMessage
from claude_agent_sdk.types import HookContext, HookInput, HookJSONOutput

from gateway.ids import new_message_id, now_ms
from gateway.logs import event
from gateway.protocol.events import ContextCompacted, ContextCompacting
from gateway.protocol.shapes import CompactionBlock, Message, Usage
from gateway.runtimes.claude_code.messages import compact_summary, compaction_figures
from gateway.session.compaction import estimate

if TYPE_CHECKING:
    from gateway.runtimes.claude_code.owner import Owner
    from gateway.runtimes.claude_code.process import CliProcess

log = logging.getLogger("gateway.claude_code")


@dataclasses.dataclass
class _Compacting:
    """A compaction of Claude Code's under way: ``context.compacting`` is out."""

    trigger: Literal["auto", "manual"]
    pre_tokens: int  # the gateway's estimate, in context.compacting
    turn_id: str | None
    figures: tuple[int, int] | None = None  # compact_boundary's pre and post tokens, once seen


class Compaction:
    """The compactions of one session's Claude Code (module docstring)."""

    def __init__(self, owner: Owner) -> None:
        self._owner = owner
        self._compacting: _Compacting | None = None  # a compaction under way

    async def command(self, process: CliProcess, timeout_s: float) -> None:
        """``POST .../compact``: Claude Code's own ``/compact``, between turns.

        The CLI is started if it is not running (in a slot of its agent); the
        command's result is read like a turn's, within ``timeout_s`` (the
        agent's ``turn_timeout_s``), its cost booked to the session. A CLI that
        does not answer in time is stopped (the next turn resumes).
        """
        process.begin()
        try:
            await process.settle_previous()
            await process.start()
            inbox = process.inbox
            assert inbox is not None
            await process.query("/compact")
            with trio.move_on_after(timeout_s) as timer:
                while True:
                    try:
                        message = await inbox.receive()
                    except trio.EndOfChannel:
                        break
                    process.took(message)
                    if self.take(message):
                        pass
                    elif isinstance(message, ResultMessage):
                        process.book_cost(message.total_cost_usd)
                    if process.done:
                        break
            if timer.cancelled_caught:
                process.stop()
        finally:
            self.over(cancelled=False)
            process.end()

    async def pre_compact(
        self, input: HookInput, tool_use_id: str | None, context: HookContext
    ) -> HookJSONOutput:
        """Claude Code's ``PreCompact`` hook: it starts compacting (``context.compacting``)."""
        manual = dict(input).get("trigger") == "manual"
        self._started("manual" if manual else "auto")
        return {}

    def _started(self, trigger: Literal["auto", "manual"]) -> None:
        """``context.compacting``, once per compaction: ``pre_tokens`` the native estimate."""
        if self._compacting is not None:
            return
        current = self._owner.current
        turn_id = current[0].id if current is not None else None
        session = self._owner.session
        pre = estimate(session.messages)
        self._compacting = _Compacting(trigger, pre, turn_id)
        session.emit([ContextCompacting(trigger, pre)], turn_id)

    def take(self, message: Any) -> bool:
        """A message of a compaction (its boundary, its summary, its failure): taken here.

        After ``compact_boundary`` the next message is the summary (a user
        message of the main thread, its content text); any other ends the
        compaction without one, and is the caller's.
        """
        if isinstance(message, SystemMessage) and message.subtype == "compact_boundary":
            trigger, pre, post = compaction_figures(message)
            self._started(trigger)  # no hook before it: both events now
            assert self._compacting is not None
            self._compacting.figures = (pre, post)
            return True
        compacting = self._compacting
        if compacting is None:
            return False
        if compacting.figures is None:
            data = message.data if isinstance(message, SystemMessage) else {}
            if data.get("compact_result") == "failed":
                self._compacted(None, str(data.get("compact_error") or "failed"))
                return True
            return False
        if (
            isinstance(message, UserMessage)
            and message.parent_tool_use_id is None
            and isinstance(message.content, str)
        ):
            self._compacted(compact_summary(message.content))
            return True
        self._compacted(None)
        return False

    def over(self, cancelled: bool) -> None:
        """A turn or ``/compact`` ends: a compaction still open is closed (a cancelled
        turn's ``turn.cancelled`` closes it, as the native loop's)."""
        compacting = self._compacting
        if compacting is not None and (compacting.figures is not None or not cancelled):
            self._compacted(None, None if compacting.figures is not None else "no boundary")
        self._compacting = None

    def _compacted(self, summary: str | None, failed: str | None = None) -> None:
        """``context.compacted``; with a summary, after its ``context`` message is stored.

        The message replaces every message of the session before it (Claude
        Code's summary stands for the whole conversation): the native
        ``compaction`` block, ``first_kept_message_id`` null.
        """
        compacting, self._compacting = self._compacting, None
        assert compacting is not None
        s, trigger, turn_id = self._owner.session, compacting.trigger, compacting.turn_id
        if compacting.figures is None or failed is not None:  # Claude Code failed it
            pre = compacting.pre_tokens
            s.emit([ContextCompacted(trigger, "summary", pre, pre, None, None)], turn_id)
            event(
                log, logging.WARNING, "claude_code_compaction_failed",
                f"session {s.id}: Claude Code's compaction failed: {failed}",
                session_id=s.id, turn_id=turn_id, trigger=trigger, error=failed,
            )  # fmt: skip
            return
        pre, post = compacting.figures
        pre = pre or compacting.pre_tokens
        summary_id = None
        if summary:
            replaces = [
                m.id for m in s.messages if m.role != "context" and m.status != "in_progress"
            ]
            message = Message(
                new_message_id(), s.id, turn_id, "context", [CompactionBlock(summary, replaces)],
                "complete", now_ms(), s.record.active_model, Usage(),
            )  # fmt: skip
            s.add_message(message)
            summary_id = message.id
        s.emit([ContextCompacted(trigger, "summary", pre, post, summary_id, None)], turn_id)
        event(
            log, logging.INFO, "context_compacted",
            f"session {s.id}: Claude Code compacted its context ({trigger}): {pre} -> {post}"
            " tokens", session_id=s.id, turn_id=turn_id, trigger=trigger, method="summary",
            pre_tokens=pre, post_tokens=post,
        )  # fmt: skip

"""Running one context compaction: the summary call, the ``context`` message, the events.

docs/protocol.md §12; :mod:`gateway.session.compaction` decides what is
compacted and what the model sees, this module does it:

1. ``context.compacting`` (``trigger``, ``pre_tokens``: the estimate of the
   view before).
2. The summary call: the agent's own provider and model, a
   :func:`~gateway.session.compaction.summary_request` (no tools, bounded
   ``max_tokens``). It emits no ``llm.*`` events and no message stream: it is
   not a call of the conversation. Its usage and cost are the turn's (in
   ``turn.completed``) or, for ``POST .../compact``, booked to the session's
   cost directly, and kept on the context message (``usage``, ``model``).
3. In one synchronous step: the ``context`` message (status ``complete``,
   ``turn_id`` the turn in flight or null, a
   :class:`~gateway.protocol.shapes.CompactionBlock` whose summary ends with
   the line naming the replaced messages' files,
   :func:`~gateway.session.compaction.files_note`) is stored through the
   session's ``add_message`` like every message, and ``context.compacted``
   is emitted (``post_tokens``: the estimate of the new view,
   ``summary_message_id``: that message, ``first_kept_message_id``: the first
   message the view keeps, null if none).

Where the contract is silent:

- A summary call that fails (a ``ProviderError``, an in-stream ``error``, a
  stream cut before ``message_stop``, an empty summary, anything raised, or,
  outside a turn, ``[turns] timeout_s`` passing) falls back to ``method:
  "truncate"``: the context message is stored all the same, with ``summary:
  ""``, so that the truncation survives a restart; ``summary_message_id`` is
  never null.
- A cancel during the summary call (the turn's cancel, its timeout, shutdown)
  propagates: nothing is stored and no ``context.compacted`` follows; the
  turn's own ending (``turn.cancelled``) closes the ``context.compacting``.
  The model's view is as before: no half compaction.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

import trio

from gateway.errors import ProviderError
from gateway.ids import new_message_id, now_ms
from gateway.logs import event
from gateway.protocol.events import ContextCompacted, ContextCompacting, Payload, StreamEvent
from gateway.protocol.shapes import CompactionBlock, Message, Usage
from gateway.providers.base import ModelRequest, TextReply, text_reply
from gateway.providers.factory import Providers
from gateway.session.compaction import estimate, files_note, plan, summary_request
from gateway.session.hub import Emitted
from gateway.store.base import SessionRecord

log = logging.getLogger("gateway.compaction")

Trigger = Literal["auto", "manual", "overflow"]


class CompactionHost(Protocol):
    """What a compaction uses of its session."""

    record: SessionRecord

    @property
    def id(self) -> str: ...

    @property
    def messages(self) -> Sequence[Message]: ...

    def emit(
        self, payloads: Sequence[Payload | StreamEvent], turn_id: str | None
    ) -> list[Emitted]: ...

    def add_message(self, message: Message) -> None: ...

    def failed(self, component: str, exc: BaseException, turn_id: str | None = None) -> None: ...


class CompactionServices(Protocol):
    """What a compaction uses of its node."""

    providers: Providers  # the session's agent's provider writes the summary

    def pricing(self, model: str) -> Callable[[Usage], float | None]: ...


@dataclass(eq=False)
class Request:
    """A ``POST .../compact`` queued for the agent loop, which runs it between two turns."""

    done: trio.Event = field(default_factory=trio.Event)


@dataclass(frozen=True)
class Compacted:
    """A compaction that was made."""

    message: Message  # the context message
    usage: Usage  # the summary call's (zeros when it failed before reporting any)


async def compact(
    s: CompactionHost,
    node: CompactionServices,
    trigger: Trigger,
    turn_id: str | None,
    *,
    timeout_s: float = math.inf,
) -> Compacted | None:
    """Compact the session's model view now; ``None`` when there is nothing to compact.

    Args:
        turn_id: the turn in flight (kept whole, and the events' and the
            message's turn), or ``None`` (the latest turn is kept).
        timeout_s: the summary call's own bound (outside a turn; a turn's
            calls are bounded by the turn's deadline).
    """
    p = plan(s.messages, turn_id)
    if p is None:
        return None
    pre = estimate(s.messages)
    s.emit([ContextCompacting(trigger, pre)], turn_id)
    model = s.record.active_model
    summary, usage = "", Usage()
    with trio.move_on_after(timeout_s):
        summary, usage = await _summarise(
            s, node, summary_request(model, p.replaced, s.id), turn_id
        )
    method: Literal["summary", "truncate"] = "summary" if summary else "truncate"
    note = files_note(s.messages, p.replaces) if summary else ""
    if note:  # no file summarised away without a word (docs/protocol.md §12)
        summary = f"{summary}\n\n{note}"
    message = Message(
        new_message_id(),
        s.id,
        turn_id,
        "context",
        [CompactionBlock(summary, p.replaces)],
        "complete",
        now_ms(),
        model,
        usage,
    )
    s.add_message(message)
    post = estimate(s.messages)
    first_kept = p.first_kept.id if p.first_kept is not None else None
    s.emit([ContextCompacted(trigger, method, pre, post, message.id, first_kept)], turn_id)
    event(
        log, logging.INFO, "context_compacted",
        f"session {s.id}: compacted {len(p.replaced)} messages ({trigger}, {method}):"
        f" {pre} -> {post} tokens", session_id=s.id, turn_id=turn_id, trigger=trigger,
        method=method, pre_tokens=pre, post_tokens=post,
    )  # fmt: skip
    return Compacted(message, usage)


async def _summarise(
    s: CompactionHost, node: CompactionServices, request: ModelRequest, turn_id: str | None
) -> tuple[str, Usage]:
    """The summary's text ("" when the call failed: module docstring) and the call's usage."""
    try:
        reply = await text_reply(node.providers.for_agent(s.record.agent), request)
    except ProviderError as exc:
        event(
            log, logging.WARNING, "compaction_summary_failed",
            f"session {s.id}: the summary call failed, truncating: {exc.error_class}: {exc}",
            session_id=s.id, turn_id=turn_id, code=exc.error_class,
        )  # fmt: skip
        reply = TextReply("", Usage(), "")
    except Exception as exc:  # a provider's bug fails the summary, not the turn
        s.failed("provider", exc, turn_id)
        reply = TextReply("", Usage(), "")
    reply.usage.cost_usd = node.pricing(request.model)(reply.usage)
    return reply.text.strip(), reply.usage

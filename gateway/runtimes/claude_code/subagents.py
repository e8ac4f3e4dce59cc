"""Claude Code's sub-agents, as worker sessions with ``delegate.*`` events (docs/protocol.md §5).

Claude Code runs a sub-agent for an ``Agent`` (``Task``) tool use, and
streams only the main thread: a sub-agent's messages come whole. Its worker
session is made before it runs, in the ``PreToolUse`` hook
(:meth:`SubAgents.make_worker`: ``spawn_worker``, the limits of
docs/protocol.md §15, the key's ``max_sessions_per_key`` and
``turns_per_minute_per_key`` included): one they refuse is denied, fails
``limit`` and never runs. Once the parent's ``tool.called`` is out, the
sub-agent's worker gets ``delegate.started``;
its turn runs on an agent loop of the worker whose runtime is fed the
sub-agent's messages by the parent's (no process of its own), each replayed
as raw stream events through the worker's translator
(:class:`~gateway.runtimes.claude_code.messages.WholeMessages`). Its
approvals are the worker's permission requests, answered from the parent.

- A foreground sub-agent's turn ends with its ``Agent`` tool's result, its
  report replayed as the worker's last message, then ``delegate.completed``
  (or ``failed``) and the parent's ``tool.completed``.
- A background one (Claude Code's default: the tool returns at once,
  ``tool.completed``) ends with its task (``task_notification`` /
  ``task_updated``), its last message its own. The parent's turn goes on
  until Claude Code is idle: its task's notification wakes the main thread
  for one more answer, the turn's last call.
- A cancel of the parent cancels the worker's turn first (``delegate.failed``
  ``cancelled_by_user``); Claude Code's interrupt stops its background
  tasks.
- The worker's ``cost_usd`` is its calls' priced usage; the parent's turn
  cost is Claude Code's total, which includes the sub-agent's, so it is not
  booked again (``workers_cost_usd`` 0).
- A worker made for a tool use that then started no sub-agent (the client
  denied the ``Agent`` tool, Claude Code failed it) is deleted once the
  tool's result comes, or the turn ends: its session slot is given back (its
  turn stays counted, as a native ``delegate``'s once made).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Literal, cast

import trio
from claude_agent_sdk import (
    TERMINAL_TASK_STATUSES,
    TaskNotificationMessage,
    TaskStartedMessage,
    TaskUpdatedMessage,
    UserMessage,
)
from claude_agent_sdk import ToolResultBlock as SdkToolResult

from gateway.errors import ToolError
from gateway.ids import new_message_id, new_turn_id, now_ms
from gateway.logs import event
from gateway.protocol.events import DelegateCompleted, DelegateFailed, DelegateStarted
from gateway.protocol.shapes import Message, TextBlock
from gateway.runtimes.claude_code.messages import result_text
from gateway.session.turn import Turn

if TYPE_CHECKING:
    from gateway.runtimes.claude_code.owner import Owner
    from gateway.session.loop_api import WorkerHost

log = logging.getLogger("gateway.claude_code")

_Feed = tuple[trio.MemorySendChannel[Any], trio.MemoryReceiveChannel[Any]]


@dataclasses.dataclass
class SubAgentDone:
    """Into a worker's feed: the parent's ``Agent`` tool has its result; the worker's turn ends."""

    is_error: bool
    text: str


@dataclasses.dataclass
class Flush:
    """Into a worker's feed: ``can_use_tool`` asks of ``tool_use_id``; end its message."""

    tool_use_id: str


@dataclasses.dataclass
class Sub:
    """A sub-agent of the turn in flight: its worker session, turn, feed and mirror runtime."""

    tool_use_id: str
    worker: WorkerHost
    turn: Turn
    send: trio.MemorySendChannel[Any]
    runtime: Owner
    background: bool  # its Agent tool returned at once; it ends with its task


class SubAgents:
    """The sub-agents of a session's turn in flight, each a worker (module docstring)."""

    def __init__(self, runtime: Owner) -> None:
        self._runtime = runtime
        self._subs: dict[str, Sub] = {}  # by the parent's Agent tool use id
        self._pending: list[TaskStartedMessage] = []  # until their tool.called
        self._feeds: dict[str, _Feed] = {}
        self._changed = trio.Event()
        self._tasks: dict[str, Sub] = {}  # by Claude Code's task id (can_use_tool's agent_id)
        self._made: dict[str, WorkerHost] = {}  # made in the hook, not started yet (tool use id)

    def runtimes(self) -> list[Owner]:
        """The mirror runtimes of the turn's sub-agents (their workers' streams)."""
        return [sub.runtime for sub in self._subs.values()]

    @property
    def waiting(self) -> bool:
        """Whether a sub-agent started whose worker waits for its tool's ``tool.called``."""
        return bool(self._pending)

    def task_started(self, message: TaskStartedMessage) -> None:
        """Claude Code started a sub-agent, maybe before its tool's message ended.

        The worker appears once the parent's ``tool.called`` is out
        (:meth:`start_announced`); what the sub-agent says meanwhile is kept.
        """
        assert message.tool_use_id
        self._feeds.setdefault(message.tool_use_id, trio.open_memory_channel(math.inf))
        self._pending.append(message)

    async def make_worker(self, tool_use_id: str) -> tuple[str | None, bool]:
        """The ``PreToolUse`` hook admits a sub-agent: make its worker session now.

        ``spawn_worker`` counts it against the key's ``max_sessions_per_key``
        and its turn against ``turns_per_minute_per_key``, as a native
        ``delegate``'s; the worker waits for its sub-agent's start. Returns
        the refusal (None: made) and whether it is a limit's (else an error,
        the store's).
        """
        s = self._runtime.session
        try:
            self._made[tool_use_id] = cast("WorkerHost", await s.spawn_worker(tool_use_id))
        except ToolError as exc:
            event(
                log, logging.INFO, "claude_code_subagent_refused",
                f"session {s.id}: a sub-agent was refused before it ran: {exc}",
                session_id=s.id, tool_use_id=tool_use_id, code=exc.error_class, error=str(exc),
            )  # fmt: skip
            return str(exc), exc.error_class == "limit"
        return None, False

    async def end_unused(self) -> None:
        """The turn ends: the workers made for sub-agents that never started are deleted."""
        await self._drop_unused(self._made)

    async def _drop_unused(self, tool_use_ids: Iterable[str]) -> None:
        """Delete the workers made for these tool uses that started no sub-agent."""
        for tool_use_id in list(tool_use_ids):
            worker = self._made.pop(tool_use_id, None)
            if worker is None:
                continue
            with trio.CancelScope(shield=True):
                try:
                    await self._runtime.node.delete_session(worker)
                except Exception as exc:  # the store is away: it stays, an empty worker
                    self._runtime.session.failed("claude-code-subagent", exc)

    async def start_announced(self, turn: Turn) -> None:
        """Start the workers of the sub-agents whose ``Agent`` tool use was announced."""
        pending, self._pending = self._pending, []
        announced = self._runtime.approvals.announced
        for message in pending:
            called = announced.get(message.tool_use_id or "")
            if called is not None and called.is_set():
                await self._started(turn, message)
            else:
                self._pending.append(message)

    async def _started(self, turn: Turn, message: TaskStartedMessage) -> None:
        """Claude Code started a sub-agent for an ``Agent`` tool use: its worker session.

        Made before it ran, in the ``PreToolUse`` hook (:meth:`make_worker`),
        where the turn's and the key's limits refused it or let it be. One
        started without the hook (none was made: a query of Claude Code's own,
        between turns) is made here; refused here, it runs all the same,
        unseen: its ``Agent`` tool's result is the parent's as ever.
        """
        runtime = self._runtime
        s = runtime.session
        tool_use_id = message.tool_use_id
        if tool_use_id is None or tool_use_id in self._subs:
            return
        try:
            made = self._made.pop(tool_use_id, None)
            worker = made or cast("WorkerHost", await s.spawn_worker(tool_use_id))
        except ToolError as exc:
            self._feeds.pop(tool_use_id, None)
            event(
                log, logging.WARNING, "claude_code_subagent_unseen",
                f"session {s.id}: a sub-agent runs without a worker session: {exc}",
                session_id=s.id, tool_use_id=tool_use_id, error=str(exc),
            )  # fmt: skip
            return
        prompt = str(message.data.get("prompt") or message.description)
        task = Message(
            new_message_id(), worker.id, new_turn_id(), "user", [TextBlock(prompt)], "complete",
            now_ms(),
        )  # fmt: skip
        send, receive = self._feeds.pop(tool_use_id)
        worker_runtime = runtime.for_worker(worker, receive)
        worker_runtime.background = bool(message.data.get("is_backgrounded"))
        worker_turn = Turn(task.turn_id or new_turn_id(), task)
        worker.turn = worker_turn  # the worker's turn lock: cancel and snapshot see it
        sub = Sub(tool_use_id, worker, worker_turn, send, worker_runtime, worker_runtime.background)
        self._subs[tool_use_id] = self._tasks[message.task_id] = sub
        self._changed.set()
        self._changed = trio.Event()
        s.emit([DelegateStarted(tool_use_id, worker.id, prompt)], turn.id)
        runtime.start_worker_turn(worker_runtime, worker_turn)

    def _find(self, agent_id: str) -> Sub | None:
        """The worker of the sub-agent ``agent_id`` (the only one, when the id is unknown)."""
        sub = self._tasks.get(agent_id)
        if sub is None and len(self._subs) == 1:
            [sub] = self._subs.values()
        return sub

    async def wait_for(self, agent_id: str, wait_s: float) -> Sub | None:
        """The worker of ``agent_id``, once it started (its tool's ``tool.called``)."""
        sub = self._find(agent_id)
        with trio.move_on_after(wait_s):
            while sub is None and (self._pending or self._feeds):
                await self._changed.wait()
                sub = self._find(agent_id)
        return sub

    def forward(self, tool_use_id: str, message: Any) -> None:
        """A sub-agent's message, into its worker's feed (or one about to start: kept)."""
        sub = self._subs.get(tool_use_id)
        feed = sub.send if sub is not None else self._feeds.get(tool_use_id, (None,))[0]
        if feed is not None:
            with contextlib.suppress(trio.ClosedResourceError):
                feed.send_nowait(message)

    async def results(self, turn: Turn, message: UserMessage) -> None:
        """Results of ``Agent`` tools: their workers' turns end, then ``delegate.*``."""
        if isinstance(message.content, str):
            return
        ids = [r.tool_use_id for r in message.content if isinstance(r, SdkToolResult)]
        await self._drop_unused(i for i in ids if i not in self._feeds)  # no sub-agent started
        for result in message.content:
            if not isinstance(result, SdkToolResult):
                continue
            sub = self._subs.get(result.tool_use_id)
            if sub is not None and not sub.background:  # a background one: task_ended
                del self._subs[result.tool_use_id]
                done = SubAgentDone(bool(result.is_error), result_text(result.content))
                sub.send.send_nowait(done)
                sub.send.close()
                await self._ended(turn, sub, cancelled=False)

    async def task_ended(
        self, turn: Turn, message: TaskNotificationMessage | TaskUpdatedMessage
    ) -> None:
        """A background sub-agent's task ended: its worker's turn ends, then ``delegate.*``.

        (A foreground one ends with its ``Agent`` tool's result: :meth:`results`.)
        """
        if isinstance(message, TaskUpdatedMessage):
            status = message.status or str(message.patch.get("status") or "")
        else:
            status = message.status
        sub = self._tasks.get(message.task_id)
        if status not in TERMINAL_TASK_STATUSES or sub is None or not sub.background:
            return
        if self._subs.pop(sub.tool_use_id, None) is None:
            return  # ended already
        failed = status != "completed"
        sub.send.send_nowait(SubAgentDone(failed, f"the sub-agent's task {status}"))
        sub.send.close()
        await self._ended(turn, sub, cancelled=False)

    async def end_all(self, turn: Turn) -> None:
        """The turn ends early: each open worker's turn is cancelled (or, when the CLI
        went away, fails), in its stream, before the parent's ``delegate.failed``."""
        subs, self._subs = list(self._subs.values()), {}
        self._pending.clear()
        self._feeds.clear()
        await self.end_unused()
        cancelled = turn.cancel_scope.cancel_called
        with trio.CancelScope(shield=True):
            for sub in subs:
                if cancelled:
                    sub.turn.request_cancel("parent_cancelled")
                sub.send.close()
                await self._ended(turn, sub, cancelled=cancelled)

    async def _ended(self, turn: Turn, sub: Sub, cancelled: bool) -> None:
        s = self._runtime.session
        self._tasks = {k: v for k, v in self._tasks.items() if v is not sub}
        with trio.move_on_after(s.cancel_grace_s):
            await sub.turn.done.wait()
        worker_id, tool_use_id = sub.worker.id, sub.tool_use_id
        if cancelled:
            failed = DelegateFailed(
                tool_use_id, worker_id, "cancelled_by_user", "the parent turn was cancelled"
            )
            s.emit([failed], turn.id)
        elif sub.turn.outcome in ("end_turn", "max_tokens", "stop_sequence"):
            done = DelegateCompleted(tool_use_id, worker_id, sub.turn.final_text)
            s.emit([done], turn.id)
        else:
            mode: Literal["timeout", "error"] = (
                "timeout" if sub.turn.cancel_reason == "timeout" else "error"
            )
            message = f"the worker's turn ended with {sub.turn.outcome}"
            s.emit([DelegateFailed(tool_use_id, worker_id, mode, message)], turn.id)

"""A Claude Code session's turns: what the CLI says, as the native runtime's events.

The runtime the agent loop (:mod:`gateway.session.agent`) runs a
``claude-code`` agent's turns on; the loop emits each turn's start and end,
and the cancel sequences of docs/protocol.md §8. docs/protocol.md §11:

- **The stream events go through the gateway's translator.** Each
  ``StreamEvent.event`` is converted field for field into a
  :mod:`raw event <gateway.providers.raw>` (as the Anthropic provider converts
  the SDK's) and fed to the session's :class:`~gateway.session.call.CallStream`,
  so ids, block lifecycle, snapshots, replay and the seam are the native
  ones. The message id is the API's own. The text, thinking and tool blocks
  of the SDK's ``AssistantMessage`` repeat what the stream said and are not
  used.
- **Tools.** Claude Code runs its own: a tool use in an assistant message,
  and its ``tool_result`` in the next user message, are ``tool.called``
  (with the call's end), then ``tool.completed`` or ``tool.failed``. A
  result that comes before its ``tool.called`` is kept until then.
- **The result** is ``turn.completed`` (usage; the cost is the CLI's
  ``total_cost_usd`` for the turn), once the CLI says it is ``idle``: a
  background sub-agent's task notification wakes the main thread for one
  more query after the result, and that answer is the turn's too (another
  LLM call, its result the turn's end); an error of the API or the CLI is
  ``llm.call_failed`` (:mod:`gateway.runtimes.claude_code.messages`). A CLI
  that dies mid-turn closes the turn as a network failure (an open
  permission request resolved ``cancelled``, ``turn.completed`` ``error``);
  the next turn starts another, which resumes.
- **Cancellation.** A cancel cancels the turn's scope as for the native
  runtime; on the way out this module resolves the open permission
  requests (``cancelled``) and sends ``interrupt()``, shielded and bounded
  (:meth:`CliProcess.interrupt <gateway.runtimes.claude_code.process.CliProcess.interrupt>`:
  it stops the background sub-agents too);
  then the agent loop emits the sequence of the turn's phase. The
  interrupted query's remaining messages are read and dropped, until the
  CLI is idle, before the next query.
- **Compaction**, as the native loop shows it (docs/protocol.md §12):
  ``context.compacting`` at Claude Code's ``PreCompact`` hook, the summary it
  sends after ``compact_boundary`` as a ``context`` message, then
  ``context.compacted``; ``POST .../compact`` sends its ``/compact`` between
  turns (:mod:`gateway.runtimes.claude_code.compaction`).
- **Limits.** The ``PreToolUse`` hook counts every tool use against the
  turn's ``[limits]`` (:mod:`gateway.runtimes.claude_code.limits`): one past
  ``max_tool_uses_per_turn``, or a sub-agent past ``max_workers_per_turn`` or
  ``max_delegate_depth``, is denied before it runs and fails ``limit``. A
  sub-agent they admit is a worker session and a turn of the key: its worker
  is made there, in the hook, so one the key's ``max_sessions_per_key`` or
  ``turns_per_minute_per_key`` refuses is denied too (``limit``) and never runs.
- **The phase.** ``llm`` from the query until a message ends, ``seam`` from a
  message with tool uses until a permission is granted or a result comes
  back, ``tools`` then, ``llm`` again at the next message.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import trio
from claude_agent_sdk import (
    AssistantMessage,
    ClaudeSDKClient,
    ResultMessage,
    StreamEvent,
    SystemMessage,
    TaskNotificationMessage,
    TaskStartedMessage,
    TaskUpdatedMessage,
    UserMessage,
)
from claude_agent_sdk import ToolResultBlock as SdkToolResult

from gateway.agents import AgentProfile
from gateway.protocol.claude_code_tools import is_sub_agent
from gateway.protocol.events import (
    LlmCallCompleted,
    ToolCalled,
    ToolCompleted,
)
from gateway.protocol.shapes import (
    StopReason,
    ToolUseBlock,
    Usage,
)
from gateway.providers.raw import RawMessageStart, RawMessageStop
from gateway.runtimes.claude_code import endings
from gateway.runtimes.claude_code.compaction import Compaction
from gateway.runtimes.claude_code.hooks import pre_tool_use
from gateway.runtimes.claude_code.limits import TurnLimits
from gateway.runtimes.claude_code.messages import (
    KnownEvents,
    RawData,
    WholeMessages,
    report_text,
    result_failure,
    result_stop,
    result_text,
    structured_result,
)
from gateway.runtimes.claude_code.options import MODEL_PREFIX
from gateway.runtimes.claude_code.permissions import Approvals
from gateway.runtimes.claude_code.process import CliProcess
from gateway.runtimes.claude_code.steering import Steering, prompt
from gateway.runtimes.claude_code.subagents import Flush, SubAgentDone, SubAgents
from gateway.runtimes.transport import ToolProcessTransport
from gateway.session.call import Call, EndCall
from gateway.session.turn import Turn
from gateway.tools.process import ToolProcesses

if TYPE_CHECKING:
    from gateway.runtimes.claude_code.owner import Owner
    from gateway.session.loop_api import RuntimeHost, WorkerHost
    from gateway.session.turn import TurnState

log = logging.getLogger("gateway.claude_code")


class _ProcessGone(Exception):
    """The CLI's stream ended while a turn waited for it."""


class ClaudeCode:
    """One session's Claude Code process, and the turns it runs (module docstring).

    Args:
        loop: the session's agent loop (its emission, endings and cancel sequences).
        nursery: where the process task runs (the agent loop's own, inside the session's).
        processes: the daemon's tool processes.
        feed: a worker session's: its sub-agent's messages, from the parent's
            runtime (no process of its own).
    """

    def __init__(
        self,
        loop: RuntimeHost,
        nursery: trio.Nursery,
        processes: ToolProcesses,
        feed: trio.MemoryReceiveChannel[Any] | None = None,
    ) -> None:
        self.loop = loop
        self.session = loop.session
        self.node = loop.node
        self._nursery = nursery
        self._processes = processes
        self.current: tuple[Turn, TurnState] | None = None
        self.approvals = Approvals(self)
        self.compaction = Compaction(self)
        self.limits: TurnLimits | None = None  # the turn in flight's (the main session's)
        self.parent: ClaudeCode | None = None  # a worker's: the runtime that feeds it
        self.steering = Steering(self)  # a steer, handed to the CLI (docs/protocol.md §11)
        hook = pre_tool_use([self.steering.before_tool, self._within_limits])
        self.process = CliProcess(
            loop, nursery, processes, self.approvals.can_use_tool, hook, self.approvals.refused,
            pre_compact=self.compaction.pre_compact, post_tool_use=self.steering.after_tool,
        )  # fmt: skip
        self.subagents = SubAgents(self)
        self.feed = feed
        self.background = False  # a worker's: its sub-agent runs in the background
        # before their tool.called: the result, its structured result
        self._early_results: dict[str, tuple[SdkToolResult, Any]] = {}
        self._whole = WholeMessages()  # a worker's: its sub-agent's messages, replayed
        self._known = KnownEvents()  # the stream events the translator knows
        self._turn_cost = 0.0  # the turn's share of the CLI's total_cost_usd

    @property
    def agent(self) -> AgentProfile:
        return self.loop.agent

    @property
    def client(self) -> ClaudeSDKClient | None:
        """The SDK client of the session's running CLI (None: none runs)."""
        return self.process.client

    @property
    def transport(self) -> ToolProcessTransport | None:
        return self.process.transport

    def idle(self) -> bool:
        return self.process.idle()

    def idle_since(self) -> float:
        return self.process.idle_since()

    def stop(self) -> None:
        self.process.stop()

    # --- a turn ------------------------------------------------------------------------

    async def run_turn(self, turn: Turn, state: TurnState) -> StopReason:
        """Run one turn through Claude Code; the agent loop emits its ending."""
        self.process.begin()
        try:
            # What the CLI still says is no turn's: a query of its own that asks meanwhile
            # is denied at once ("no turn is running"), not held for this turn's tool.called.
            await self.process.settle_previous()
            self.current = (turn, state)
            if self.feed is None:
                limits = self.node.config.limits
                self.limits = TurnLimits(
                    limits.max_tool_uses_per_turn, limits.max_workers_per_turn,
                    limits.max_delegate_depth, self.session.depth,
                )  # fmt: skip
            self._turn_cost = 0.0
            turn.enter("llm")
            try:
                if self.feed is None:
                    await self.process.start(turn)  # a rewound turn: where it resumes
                    content = await prompt(self, turn.user_message)
                    await self.process.query(content, turn.user_message.id)
                return await self._follow(turn, state)
            except _ProcessGone:
                return self._failed(turn, state, "network", "the Claude Code process exited")
            except Exception as exc:  # the SDK or the CLI failed: the call's failure
                if isinstance(exc, AssertionError):
                    raise
                message = f"Claude Code failed: {type(exc).__name__}: {exc}"
                return self._failed(turn, state, "api_error", message)
        finally:
            self.current = None
            self.limits = None
            self.process.end()
            if turn.in_flight:  # cancelled, or broken: close the requests, stop the query
                self.approvals.end(turn)
                await self.subagents.end_all(turn)
                await self.process.interrupt()
            await self.subagents.end_unused()
            self.compaction.over(turn.in_flight)
            self.approvals.reset()
            self._early_results.clear()
            if self.client is None and self.feed is None:  # the POST's slot, never used
                self.node.process_slots.release(self.agent.name, self.session.id)

    async def _follow(self, turn: Turn, state: TurnState) -> StopReason:
        """Map what Claude Code says until the query's result and the CLI's ``idle``.

        A background sub-agent's task notification wakes the main thread for
        one more query after the result: its answer is the turn's next call,
        and the last result is the turn's end (module docstring). Every call
        ends before the turn does (docs/protocol.md §7): a CLI gone while one
        streams died mid-turn, even after a result (§11), and a call still open
        when the turn ends fails (:func:`.endings.end_open_call`).
        """
        inbox = self.feed if self.feed is not None else self.process.inbox
        assert inbox is not None
        ended: StopReason | None = None  # a result came: the turn ends once the CLI is idle
        while True:
            try:
                message = await inbox.receive()
            except trio.EndOfChannel:
                if ended is not None and not endings.streaming(state):  # its answer was whole
                    return ended  # the CLI went before its idle
                raise _ProcessGone from None
            if self.feed is not None:  # a worker's: its sub-agent's messages
                stop = await self._sub_agent_message(turn, state, message)
                if stop is not None:
                    return stop
                continue
            self.process.took(message)
            stop = await self._message(turn, state, message)
            if stop is not None:
                ended = stop
            if ended is not None and self.process.done:
                return endings.end_open_call(self, turn, state, ended)
            if self.subagents.waiting:
                await self.subagents.start_announced(turn)
            if self._early_results:  # results that came before their tool.called (and workers)
                pending = {b.id: b for b in state.pending_tools}
                for tool_use_id in [i for i in self._early_results if i in pending]:
                    early, structured = self._early_results.pop(tool_use_id)
                    self._tool_result(turn, state, pending[tool_use_id], early, structured)

    async def _message(self, turn: Turn, state: TurnState, message: Any) -> StopReason | None:
        """One message of the main thread's; the turn's end at its result."""
        if self.compaction.take(message):
            return None
        if isinstance(message, StreamEvent):
            if message.parent_tool_use_id is None:
                await self._stream_event(turn, state, message.event)
        elif isinstance(message, UserMessage):
            if message.parent_tool_use_id is None:
                await self.subagents.results(turn, message)
                self._tool_results(turn, state, message)
            else:
                self.subagents.forward(message.parent_tool_use_id, message)
        elif isinstance(message, (TaskNotificationMessage, TaskUpdatedMessage)):
            await self.subagents.task_ended(turn, message)
        elif isinstance(message, TaskStartedMessage) and _sub_agent(message):
            self.subagents.task_started(message)
        elif isinstance(message, SystemMessage):
            pass  # init, status, session state: nothing for the clients (yet)
        elif isinstance(message, ResultMessage):
            return self._result(turn, state, message)
        elif isinstance(message, AssistantMessage) and message.parent_tool_use_id:
            self.subagents.forward(message.parent_tool_use_id, message)  # a sub-agent's, whole
        # (the main thread's AssistantMessage: what its stream said already)
        return None

    async def _stream_event(self, turn: Turn, state: TurnState, data: RawData) -> None:
        s = self.session
        raw = self._known.read(data)
        self._count_unknown(self._known.take() + self._whole.skipped)
        self._whole.skipped = 0
        if raw is None:  # a type the translator does not know: skipped, counted
            return
        if isinstance(raw, RawMessageStart):
            if raw.message.model and not raw.message.model.startswith(MODEL_PREFIX):
                raw.message.model = MODEL_PREFIX + raw.message.model
            self._start_call(turn, state)
        call = state.call
        if call is None or call.done.is_set():
            endings.broken(self, turn, state)
            return
        await s.calls.feed(raw)
        if isinstance(raw, RawMessageStop):
            self._end_call(turn, state, call)

    def _count_unknown(self, count: int) -> None:
        """Events and blocks skipped as unknown: ``gateway_unknown_events_total``."""
        if count:
            self.node.metrics.unknown_events.labels("claude-code").inc(count)

    def _start_call(self, turn: Turn, state: TurnState) -> None:
        """A new LLM call of the turn: ``llm.call_started``, a translator, the call in flight."""
        if turn.phase != "llm":
            turn.enter("llm")
        endings.broken(self, turn, state)  # the previous call's end, if the gateway broke it
        state.call_failed_emitted = False  # the new call's failure has not gone out
        state.rounds += 1
        state.results_message = None  # the next tool results are a new message
        self.loop.open_call(turn, state)

    def _end_call(self, turn: Turn, state: TurnState, call: Call) -> None:
        """The message ended: ``llm.call_completed``, then its tool uses' ``tool.called``.

        A message the gateway could not translate, or that ended with no stop
        reason, is the call's ``llm.call_failed`` at once (docs/protocol.md §7:
        every call ends, completed or failed); the turn's result then adds no
        call of its own (:meth:`_failed`).
        """
        s = self.session
        s.calls.settle(EndCall())
        state.usage += call.translator.usage
        message = call.translator.message
        stop_reason = call.translator.stop_reason
        if call.error_class is not None or message is None or stop_reason is None:
            if call.error_class is None:
                call.error_class = "api_error"
                call.error_message = "Claude Code's message ended with no stop reason"
            endings.broken(self, turn, state)
            return
        s.emit(
            [LlmCallCompleted(state.call_id, message.id, stop_reason, message.usage or Usage())],
            turn.id,
        )
        turn.enter("seam")
        tool_uses = [b for b in message.content if isinstance(b, ToolUseBlock)]
        if not tool_uses:
            return
        s.emit([ToolCalled(b.id, b.name, b.input) for b in tool_uses], turn.id)
        state.pending_tools += tool_uses
        state.tool_uses += len(tool_uses)
        self.approvals.announce(tool_uses)

    def _tool_results(self, turn: Turn, state: TurnState, message: UserMessage) -> None:
        """A user message with tool results: each pending tool completes or fails."""
        if isinstance(message.content, str):
            return
        pending = {b.id: b for b in state.pending_tools}
        structured = structured_result(message)
        for result in message.content:
            if not isinstance(result, SdkToolResult):
                continue
            block = pending.get(result.tool_use_id)
            if block is None:  # Claude Code ran it before its message ended: kept till then
                self._early_results[result.tool_use_id] = (result, structured)
                continue
            self._tool_result(turn, state, block, result, structured)

    def _tool_result(
        self,
        turn: Turn,
        state: TurnState,
        block: ToolUseBlock,
        result: SdkToolResult,
        structured: Any = None,
    ) -> None:
        """One pending tool's result: ``tool.completed`` or ``tool.failed``.

        Its structured result (``tool_use_result``) is the event's
        ``structured_result`` and the stored block's ``structured_content``, as
        an MCP tool's in the native loop (docs/protocol.md §6).
        """
        if turn.phase == "seam":
            turn.enter("tools")
        text = result_text(result.content)
        started = self.approvals.started.get(block.id, trio.current_time())
        ms = round((trio.current_time() - started) * 1000)
        if result.is_error:
            denied = block.id in self.approvals.denied
            error_class = "permission_denied" if denied else "error"
            if self._refused(block.id):
                error_class = "limit"
            self.loop.tool_failed(turn, state, block, error_class, text, ms)
        else:
            self.loop._tool_result(turn, state, block, text, is_error=False, structured=structured)
            self.session.emit([ToolCompleted(block.id, block.name, text, ms, structured)], turn.id)

    async def _within_limits(self, hook_input: dict[str, Any], tool_use_id: str) -> str | None:
        """The ``PreToolUse`` hook's check of the turn's limits (:mod:`.limits`), then,
        for a sub-agent they admit, of its key's: its worker session is made now
        (:meth:`SubAgents.make_worker <.subagents.SubAgents.make_worker>`) or refused."""
        limits = self.limits
        if limits is None:  # a query Claude Code runs on its own, between turns
            return None
        name = str(hook_input.get("tool_name") or "")
        agent_id = hook_input.get("agent_id")
        refusal = limits.admit(tool_use_id, name, str(agent_id) if agent_id else None)
        if refusal is not None or not is_sub_agent(name):
            return refusal
        refusal, limited = await self.subagents.make_worker(tool_use_id)
        if refusal is not None:
            limits.workers -= 1  # it never starts
            if limited:
                limits.refused[tool_use_id] = refusal
        return refusal

    def _refused(self, tool_use_id: str) -> bool:
        """Whether the limits refused the tool use (a worker asks its parent's)."""
        owner = self.parent if self.feed is not None else self
        limits = owner.limits if owner is not None else None
        return limits is not None and tool_use_id in limits.refused

    def _result(self, turn: Turn, state: TurnState, result: ResultMessage) -> StopReason:
        """The query's result: how the turn ends (the agent loop emits ``turn.completed``)."""
        total = result.total_cost_usd
        if total is not None:
            cost, self.process.cost_seen = max(0.0, total - self.process.cost_seen), total
            self._turn_cost += cost
            state.usage.cost_usd = self._turn_cost
        if result.subtype == "error_max_turns":
            return self._close_pending(turn, state, "max_rounds")
        failure = result_failure(result)
        if failure is not None:
            return self._failed(turn, state, *failure)
        call = state.call
        if call is not None and call.error_class is not None:  # its llm.call_failed went out
            return self._failed(turn, state, call.error_class, call.error_message or "")
        stop = call.translator.stop_reason if call is not None else None
        return self._close_pending(turn, state, result_stop(result, stop))

    def _close_pending(self, turn: Turn, state: TurnState, reason: StopReason) -> StopReason:
        for block in list(state.pending_tools):  # Claude Code gave no result for it
            self.loop.tool_failed(turn, state, block, "error", "Claude Code gave no result")
        return reason

    def _failed(self, turn: Turn, state: TurnState, error_class: str, message: str) -> StopReason:
        """A failed call, and the turn's end (:func:`.endings.failed`)."""
        return endings.failed(self, turn, state, error_class, message)

    # --- compaction (docs/protocol.md §12) ------------------------------------------------

    async def compact(self) -> None:
        """``POST .../compact``: Claude Code's own ``/compact``, between turns
        (:meth:`Compaction.command <.compaction.Compaction.command>`)."""
        await self.compaction.command(self.process, self.agent.turn_timeout_s)

    # --- a worker session's (docs/protocol.md §5) -------------------------------------------

    def for_worker(self, worker: WorkerHost, feed: trio.MemoryReceiveChannel[Any]) -> ClaudeCode:
        """The runtime of a sub-agent's worker session, fed its messages by this one.

        Its loop is of this session's loop class (:mod:`gateway.session.agent`
        imports this package, not the other way round).
        """
        loop = type(self.loop)(worker, self.node)
        runtime = ClaudeCode(loop, self._nursery, self._processes, feed=feed)
        runtime.parent = self
        loop.runtime = runtime
        return runtime

    def start_worker_turn(self, runtime: Owner, turn: Turn) -> None:
        """Run a worker's turn, in this session's runtime nursery."""
        name = f"claude-code-subagent {runtime.session.id}"
        self._nursery.start_soon(runtime.loop.run_turn, turn, name=name)

    async def _sub_agent_message(
        self, turn: Turn, state: TurnState, message: Any
    ) -> StopReason | None:
        """One message of the sub-agent a worker's turn runs; the turn's end at its end."""
        whole = self._whole
        if isinstance(message, AssistantMessage):
            await self._replay(turn, state, whole.message(message, self.approvals.announced))
        elif isinstance(message, UserMessage):
            await self._replay(turn, state, whole.end())
            self._tool_results(turn, state, message)
        elif isinstance(message, Flush):
            if whole.holds(message.tool_use_id):
                await self._replay(turn, state, whole.end())
        elif isinstance(message, SubAgentDone):
            await self._replay(turn, state, whole.end())
            if message.is_error:
                return self._failed(turn, state, "api_error", message.text)
            if not self.background:
                model = self.session.record.active_model.removeprefix(MODEL_PREFIX)
                await self._replay(turn, state, whole.report(report_text(message.text), model))
            return self._close_pending(turn, state, "end_turn")
        return None

    async def _replay(self, turn: Turn, state: TurnState, events: Iterable[RawData]) -> None:
        for data in events:
            await self._stream_event(turn, state, data)


def _sub_agent(message: TaskStartedMessage) -> bool:
    """Whether a task Claude Code started is a sub-agent (an ``Agent`` tool's), not a
    background shell (``local_bash``) or another kind of task, which is the tool's own."""
    return bool(message.tool_use_id) and message.task_type in (None, "local_agent")

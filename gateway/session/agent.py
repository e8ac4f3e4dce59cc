"""The agent loop: one turn after another, in PROTOCOL section 7's order.

A turn runs under its own cancel scope (with the ``turn_timeout_s`` deadline);
each LLM call streams raw provider events to the session's translator task; a
call that stops with ``tool_use`` hands its tool blocks to the tool batch, whose
tools run concurrently in the batch's nursery. Whatever ends the turn, exactly
one of ``turn.completed`` or ``turn.cancelled`` closes it, and the turn lock is
released in the same step.

Whatever ends a turn early, :mod:`gateway.session.cancel` holds the sequence
it ends with: the three cancel sequences of PROTOCOL section 8 (by the turn's
phase) and the crash sequence.

The loop works through a narrow view of its session (:class:`TurnHost`) and
of its node (:class:`AgentServices`): it emits, records messages and the
session record, and hands the LLM call in flight to the session's
:class:`~gateway.session.call.CallStream`; nothing else of the session is its
business.

A turn runs at most ``[limits] max_tool_uses_per_turn`` tool uses (PROTOCOL
section 15), counting every ``tool_use`` block the model asked for in the
turn, across its rounds: those beyond are announced (``tool.called``) and fail
at once with ``tool.failed`` (``limit``) without running, all in one step, and
the turn goes on to the next model round, which sees the errors and can answer.
A worker's turn is a turn of its own, with its own count.

Failures are contained where they happen: a tool that raises anything is a
``tool.failed`` (``error``); a provider that raises anything is an
``llm.call_failed`` (``api_error``); a tool batch in which every tool failed
before running goes on to the next model round, which sees the errors. Any
other exception in a turn is a gateway bug: it is logged with its traceback
and counted, and the turn is closed as a provider error would close it
(PROTOCOL section 7: ``message.complete`` and ``llm.call_failed`` if a call
was streaming, ``tool.failed`` for each pending tool, ``turn.completed`` with
``stop_reason: error``); the session takes its next turn.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Sequence
from contextlib import aclosing
from typing import TYPE_CHECKING, Any, Protocol, get_args

import trio

from gateway.agents import AgentProfile, Agents
from gateway.config import Config
from gateway.errors import ProviderError, ToolError
from gateway.ids import new_call_id, new_message_id, now_ms
from gateway.logs import event
from gateway.metrics import Metrics
from gateway.protocol.events import (
    LlmCallCompleted,
    LlmCallFailed,
    LlmCallStarted,
    LlmErrorClass,
    Payload,
    PermissionRequested,
    PermissionResolved,
    RouteDecided,
    StreamEvent,
    ToolCalled,
    ToolCompleted,
    ToolFailed,
    TurnCompleted,
    TurnStarted,
)
from gateway.protocol.shapes import (
    Message,
    StopReason,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
    Usage,
)
from gateway.providers.base import ModelRequest
from gateway.providers.factory import Providers
from gateway.runtimes.slots import ProcessSlots
from gateway.session import cancel, compactor
from gateway.session.call import Call, CallStream, Completion, EndCall
from gateway.session.compaction import estimate, model_view
from gateway.session.hub import Emitted
from gateway.session.permissions import PermissionRequest, Permissions
from gateway.session.turn import Turn
from gateway.store.base import SessionRecord
from gateway.tools.process import ToolProcesses
from gateway.tools.registry import SessionTools, ToolContext, ToolSession
from gateway.tools.workspace import Workspaces
from gateway.translate import Translator, max_blocks

if TYPE_CHECKING:
    from gateway.runtimes.claude_code import ClaudeCode

log = logging.getLogger("gateway.agent")


class AgentServices(Protocol):
    """What the agent loop uses of its node: config, agents, providers, tools, pricing, pace."""

    config: Config
    agents: Agents
    providers: Providers
    metrics: Metrics
    processes: ToolProcesses  # the daemon's tool processes (a claude-code agent's CLI)
    process_slots: ProcessSlots  # a claude-code agent's max_processes on this node
    workspaces: Workspaces  # where a session's workspace is on this host

    def session_tools(self, session: TurnHost) -> SessionTools:
        """The tools the session's agent sees now (PROTOCOL section 11)."""
        ...

    async def tools_ready(self, session: TurnHost) -> None:
        """Wait for the session's MCP servers still starting (bounded)."""
        ...

    def pricing(self, model: str) -> Callable[[Usage], float | None]:
        """``cost_usd`` of a usage on ``model``."""
        ...

    def notify(self) -> None:
        """A turn ended (shutdown waits for that)."""
        ...

    async def wait_durable(self) -> None:
        """Return once everything emitted so far is committed."""
        ...


class TurnHost(ToolSession, Protocol):
    """The agent loop's narrow view of its session (module docstring)."""

    record: SessionRecord

    @property
    def messages(self) -> Sequence[Message]: ...

    @property
    def permissions(self) -> Permissions: ...

    @property
    def calls(self) -> CallStream: ...

    def emit(self, payloads: Iterable[Payload | StreamEvent], turn_id: str | None) -> list[Emitted]:
        """Emit a batch of events in the session's stream."""
        ...

    def add_message(self, message: Message, completion: Completion | None = None) -> None:
        """Append or replace a message of the conversation."""
        ...

    def save_record(self) -> None:
        """Store the session record (turn count, cost, the turn in flight)."""
        ...

    def end_turn(self, turn: Turn) -> None:
        """Release the turn lock."""
        ...

    def failed(self, component: str, exc: BaseException, turn_id: str | None = None) -> None:
        """Log and count a failure caught at the session's boundary."""
        ...


class AgentLoop:
    """Runs the turns of one session, one at a time."""

    def __init__(self, session: TurnHost, node: AgentServices) -> None:
        self.s = session
        self.node = node
        self.current: tuple[Turn, TurnState] | None = None  # the turn in flight
        self.runtime: ClaudeCode | None = None  # a claude-code agent's runtime (run())

    @property
    def agent(self) -> AgentProfile:
        """The session's agent, as configured now (a SIGHUP may have re-read its prompt)."""
        return self.node.agents[self.s.record.agent]

    @property
    def tools(self) -> SessionTools:
        """The session's tools now: built-in and MCP, its agent's (asked at every use)."""
        return self.node.session_tools(self.s)

    async def run(self, turns: trio.MemoryReceiveChannel[Turn | compactor.Request]) -> None:
        """Take the session's turns and compactions, one at a time, until the session ends.

        A ``claude-code`` agent's session runs its turns through
        :mod:`gateway.runtimes.claude_code`, whose CLI process task lives in a
        nursery of this task: it ends with the session (PROTOCOL section 11).
        """
        if self.agent.runtime != "claude-code":
            await self._jobs(turns)
            return
        from gateway.runtimes.claude_code import ClaudeCode  # the extra: imported when used

        async with trio.open_nursery() as nursery:
            self.runtime = ClaudeCode(self, nursery, self.node.processes)
            try:
                await self._jobs(turns)
            finally:
                self.runtime = None
                nursery.cancel_scope.cancel()

    async def _jobs(self, turns: trio.MemoryReceiveChannel[Turn | compactor.Request]) -> None:
        async for job in turns:
            if isinstance(job, compactor.Request):
                await self.compact_now(job)
            else:
                await self.run_turn(job)

    def abort(self) -> None:
        """Close the turn in flight after the session's tasks failed (Session.run)."""
        current, self.current = self.current, None
        if current is not None and current[0].in_flight:
            cancel.crash_sequence(self, *current)

    async def run_turn(self, turn: Turn) -> None:
        s = self.s
        state = TurnState()
        self.current = (turn, state)
        timeout = self.agent.turn_timeout_s
        turn.cancel_scope.deadline = trio.current_time() + timeout
        try:
            with turn.cancel_scope:
                self._start(turn)
                if self.runtime is not None:  # runtime = "claude-code" (PROTOCOL section 11)
                    stop_reason = await self.runtime.run_turn(turn, state)
                else:
                    await self.node.tools_ready(self.s)  # an MCP server still starting lists first
                    stop_reason = await self._turn_body(turn, state)
                self.finish(turn, state, stop_reason)
        except Exception as exc:  # a gateway bug: closed below, as a provider error
            s.failed("agent-loop", exc, turn.id)
        finally:
            self.current = None
            # Decided from the scopes, not from the exception: a Cancelled may
            # arrive wrapped in an ExceptionGroup from the tool batch's nursery.
            if turn.in_flight:
                outer_cancelled = trio.current_effective_deadline() == -math.inf
                if turn.cancel_scope.cancel_called or outer_cancelled:
                    if turn.cancel_reason is None:
                        timed_out = trio.current_time() >= turn.cancel_scope.deadline
                        turn.cancel_reason = "timeout" if timed_out else "shutdown"
                    cancel.cancel_sequence(self, turn, state)  # synchronous: nothing to shield
                else:  # a crash: still close the turn for every client
                    cancel.crash_sequence(self, turn, state)
            elif not state.ended:  # closed, but its last event was lost to a failure
                self.emit_terminal(turn, state, "error")

    def _start(self, turn: Turn) -> None:
        s = self.s
        s.record.turn_count += 1
        s.add_message(turn.user_message)
        [started] = s.emit([TurnStarted(turn.id, turn.user_message)], turn.id)
        event(
            log, logging.INFO, "turn_started", f"turn {turn.id} started",
            session_id=s.id, turn_id=turn.id, turn_count=s.record.turn_count,
        )  # fmt: skip
        # Committed with turn.started: a restart finds this turn (PROTOCOL section 9).
        s.record.current_turn_id, s.record.current_turn_seq = turn.id, started.seq
        s.save_record()
        s.emit(
            [RouteDecided(s.record.active_model, "session_model", s.record.routing_policy_version)],
            turn.id,
        )
        turn.started.set()

    # --- the turn ------------------------------------------------------------

    async def _turn_body(self, turn: Turn, state: TurnState) -> StopReason:
        while True:
            # The loop does not run ahead of the store by more than a round:
            # what it emitted is committed and on its way to the clients before
            # the next call (held events would otherwise leave in one burst
            # that a client's bounded queue cannot take).
            await self.node.wait_durable()
            turn.enter("llm")
            state.rounds += 1
            call = await self._model_round(turn, state)
            if call.error_class is not None:
                if not state.call_failed_emitted:
                    self.call_failed(turn, state, call)
                self._provider_error(turn, call)
                return "error"
            message = call.translator.message
            assert message is not None and call.translator.stop_reason is not None
            stop_reason = call.translator.stop_reason
            self.s.emit(
                [
                    LlmCallCompleted(
                        state.call_id, message.id, stop_reason, message.usage or Usage()
                    )
                ],
                turn.id,
            )
            turn.enter("seam")
            tool_uses = [b for b in message.content if isinstance(b, ToolUseBlock)]
            if stop_reason != "tool_use" or not tool_uses:
                return stop_reason
            state.pending_tools = tool_uses
            if state.rounds >= self.agent.max_rounds:
                self._last_round(turn, state, tool_uses)
                return "max_rounds"
            await self._run_tools(turn, state, tool_uses)

    def open_call(self, turn: Turn, state: TurnState) -> Call:
        """``llm.call_started`` and the call its stream is translated into (either runtime)."""
        s = self.s
        model = s.record.active_model
        state.call_id = new_call_id()
        s.emit([LlmCallStarted(state.call_id, model)], turn.id)
        call = Call(
            turn.id,
            Translator(
                session_id=s.id,
                turn_id=turn.id,
                model=model,
                created_at=now_ms(),
                pricing=self.node.pricing(model),
                max_blocks=max_blocks(self.node.config.stream.snapshot_max_bytes),
            ),
        )
        s.calls.start(call)
        state.call = call
        return call

    async def _call_model(self, turn: Turn, state: TurnState) -> Call:
        s = self.s
        call = self.open_call(turn, state)
        model = s.record.active_model
        agent = self.agent
        request = ModelRequest(
            model=model,
            messages=model_view(s.messages),  # PROTOCOL section 12
            tools=self.tools.specs(),
            max_tokens=agent.max_tokens,
            system=agent.system or None,
            temperature=agent.temperature,
            thinking_budget_tokens=agent.thinking_budget_tokens,
        )
        try:
            provider = self.node.providers.for_agent(agent.name)
            async with aclosing(provider.stream(request)) as stream:
                async for raw in stream:
                    if call.done.is_set():  # the translation failed: nobody listens
                        break
                    await s.calls.feed(raw)
        except ProviderError as exc:
            end = EndCall(exc.error_class, exc.message)
            state.overflowed = exc.context_overflow
        except Exception as exc:  # a provider's bug is that call's failure, not the turn's
            s.failed("provider", exc, turn.id)
            end = EndCall("api_error", f"the provider failed: {type(exc).__name__}: {exc}")
        else:
            end = EndCall()
        # The stream is over: settling it is synchronous, so a cancel cannot
        # land between the last event and the call's end.
        s.calls.settle(end)
        state.usage += call.translator.usage
        return call

    # --- context compaction (PROTOCOL section 12) ------------------------------------

    def context_max_tokens(self) -> int:
        """The threshold of compaction: the agent's (the one place that reads it)."""
        return self.agent.context_max_tokens

    async def _model_round(self, turn: Turn, state: TurnState) -> Call:
        """One LLM call of the turn, with the compactions of PROTOCOL section 12 around it.

        Before the call: ``auto`` when the estimated input is above
        :meth:`context_max_tokens`. A call the provider refuses as too long
        (``ProviderError.context_overflow``) is closed for the clients as any
        failed call (``llm.call_started`` then ``llm.call_failed``,
        ``invalid_request``), then compacted once (``overflow``) and made
        again, once: a second refusal is the turn's provider error. A refusal
        with nothing to compact is that error at once.
        """
        if estimate(self.s.messages) > self.context_max_tokens():
            await self._compact(turn, state, "auto")
        state.overflowed = False
        call = await self._call_model(turn, state)
        if call.error_class is not None and state.overflowed:
            state.overflowed = False
            self.call_failed(turn, state, call)
            if await self._compact(turn, state, "overflow"):
                return await self._call_model(turn, state)
            state.call_failed_emitted = True
        return call

    async def _compact(self, turn: Turn, state: TurnState, trigger: compactor.Trigger) -> bool:
        """Compact within the turn (phase ``llm``); whether anything was compacted.

        The previous call is done with: a cancel during the summary call is
        the ``llm`` phase's with no call to close, only ``turn.cancelled``.
        """
        state.call = None
        done = await compactor.compact(self.s, self.node, trigger, turn.id)
        if done is None:
            return False
        state.usage += done.usage
        return True

    async def compact_now(self, request: compactor.Request) -> None:
        """``POST .../compact`` (``manual``), between turns, bounded by the agent's turn timeout.

        A ``claude-code`` session's context is Claude Code's: its ``/compact``
        (:meth:`gateway.runtimes.claude_code.ClaudeCode.compact`).
        """
        s = self.s
        if self.runtime is not None:
            try:
                await self.runtime.compact()
            except Exception as exc:  # a gateway bug, or the CLI failed: the session goes on
                s.failed("compaction", exc)
            finally:
                request.done.set()
            return
        try:
            done = await compactor.compact(
                s, self.node, "manual", None, timeout_s=self.agent.turn_timeout_s
            )
            if done is not None and done.usage.cost_usd:
                s.record.cost_so_far_usd += done.usage.cost_usd
                s.save_record()
        except Exception as exc:  # a gateway bug: the session goes on with its next turn
            s.failed("compaction", exc)
        finally:
            request.done.set()

    def _provider_error(self, turn: Turn, call: Call) -> None:
        """Log and count an LLM call that failed (not a cancel: that is the turn's)."""
        error_class = call.error_class or "api_error"
        label = error_class if error_class in _LLM_ERROR_CLASSES else "other"
        self.node.metrics.provider_errors.labels(label).inc()
        event(
            log, logging.WARNING, "provider_error",
            f"turn {turn.id}: the model call failed: {error_class}: {call.error_message}",
            session_id=self.s.id, turn_id=turn.id, code=error_class, error=call.error_message,
            model=self.s.record.active_model,
        )  # fmt: skip

    def call_failed(self, turn: Turn, state: TurnState, call: Call) -> None:
        message = call.translator.message
        self.s.emit(
            [
                LlmCallFailed(
                    state.call_id,
                    call.error_class or "api_error",  # type: ignore[arg-type]
                    call.error_message,
                    message.id if message else None,
                )
            ],
            turn.id,
        )

    # --- tools -----------------------------------------------------------------

    async def _run_tools(self, turn: Turn, state: TurnState, tool_uses: list[ToolUseBlock]) -> None:
        """The tool batch: every call of the message concurrently, in the batch's nursery.

        The turn stays at the seam until the first tool enters execution; a
        tool waiting for permission has not (PROTOCOL section 8).
        """
        s = self.s
        s.emit([ToolCalled(b.id, b.name, b.input) for b in tool_uses], turn.id)
        limit = self.node.config.limits.max_tool_uses_per_turn
        allowed = tool_uses
        if limit:
            room = max(0, limit - state.tool_uses)
            allowed, refused = tool_uses[:room], tool_uses[room:]
            if refused:
                self._refuse(turn, state, refused, limit)
        state.tool_uses += len(tool_uses)
        async with trio.open_nursery() as nursery:
            for block in allowed:
                nursery.start_soon(
                    self._run_tool, turn, state, block, name=f"tool {block.name} {block.id}"
                )
        state.results_message = None

    def _last_round(self, turn: Turn, state: TurnState, blocks: list[ToolUseBlock]) -> None:
        """The model asked for tools in the turn's last round (``max_rounds``): none runs.

        No model round would see their results, so running them would do
        what nobody reads. Each is announced and fails (``limit``) in one step,
        as :meth:`_refuse` does; the conversation keeps a result for every
        tool use, so the session's next turn is a valid request.
        """
        self.s.emit([ToolCalled(b.id, b.name, b.input) for b in blocks], turn.id)
        state.tool_uses += len(blocks)
        message = f"not run: the turn reached its max_rounds ({self.agent.max_rounds}) model calls"
        self._fail_unrun(turn, state, blocks, message)

    def _refuse(self, turn: Turn, state: TurnState, blocks: list[ToolUseBlock], limit: int) -> None:
        """Fail tool uses past ``max_tool_uses_per_turn`` without running them (``limit``).

        One step for all of them: one rewrite of the results message, one batch
        of ``tool.failed``, one log line (a model asking for a thousand tools
        costs three writes, not a thousand).
        """
        message = (
            f"not run: this turn asked for more than its max_tool_uses_per_turn ({limit}) tool uses"
        )
        self._fail_unrun(turn, state, blocks, message)

    def _fail_unrun(
        self, turn: Turn, state: TurnState, blocks: list[ToolUseBlock], message: str
    ) -> None:
        """Fail tool uses that never ran (``limit``): one results rewrite, one batch, one line."""
        s = self.s
        refused = {b.id for b in blocks}
        state.pending_tools = [b for b in state.pending_tools if b.id not in refused]
        if state.results_message is None:
            state.results_message = Message(
                new_message_id(), s.id, turn.id, "user", [], "complete", now_ms()
            )
        state.results_message.content += [ToolResultBlock(b.id, message, True) for b in blocks]
        s.add_message(state.results_message)
        s.emit([ToolFailed(b.id, b.name, "limit", message, 0) for b in blocks], turn.id)
        event(
            log, logging.WARNING, "tool_limit",
            f"turn {turn.id}: {len(blocks)} tool uses failed without running: {message}",
            session_id=s.id, turn_id=turn.id, code="limit", count=len(blocks),
        )  # fmt: skip

    async def _run_tool(self, turn: Turn, state: TurnState, block: ToolUseBlock) -> None:
        s = self.s
        ctx = ToolContext(
            session_id=s.id,
            turn_id=turn.id,
            tool_use_id=block.id,
            workspace_path=s.record.workspace_path,
            kill_grace_s=self.node.config.tools.kill_grace_s,
            session=s,
            tool_name=block.name,
        )
        started = trio.current_time()
        tools = self.tools
        tool_label = block.name if block.name in tools else "unknown"

        def elapsed_ms(outcome: str = "failed") -> int:
            seconds = trio.current_time() - started
            self.node.metrics.tool_duration.labels(tool_label, outcome).observe(seconds)
            return round(seconds * 1000)

        try:
            tools.validate(block.name, block.input)
            if self.agent.needs_approval(block.name):
                await self._permission(turn, state, block)
            if turn.phase == "seam":
                turn.enter("tools")
            output = await tools.execute(block.name, block.input, ctx)
        except ToolError as exc:
            self.tool_failed(turn, state, block, exc.error_class, exc.message, elapsed_ms())
        except Exception as exc:  # a tool's bug fails that tool only
            s.failed("tool", exc, turn.id)
            message = f"the tool failed: {type(exc).__name__}: {exc}"
            self.tool_failed(turn, state, block, "error", message, elapsed_ms())
        except trio.Cancelled:
            self.tool_failed(turn, state, block, "cancelled", "cancelled", elapsed_ms("cancelled"))
            raise
        else:
            self._tool_result(
                turn, state, block, output.content, is_error=False, structured=output.structured
            )
            s.emit(
                [
                    ToolCompleted(
                        block.id,
                        block.name,
                        output.content,
                        elapsed_ms("completed"),
                        output.structured,
                    )
                ],
                turn.id,
            )

    async def _permission(self, turn: Turn, state: TurnState, block: ToolUseBlock) -> None:
        """Wait for ``allow`` (PROTOCOL section 5 ``permission.*``).

        Raises:
            ToolError: ``permission_denied`` on ``deny`` or after ``approval_timeout_s``.
        """
        s = self.s
        timeout = self.node.config.tools.approval_timeout_s
        expires_at = now_ms() + round(timeout * 1000)
        request = s.permissions.open(block.id, block.name, block.input, expires_at)
        s.emit(
            [PermissionRequested(request.perm_id, block.id, block.name, block.input, expires_at)],
            turn.id,
        )
        try:
            with trio.move_on_after(timeout):
                await request.decided.wait()
        except trio.Cancelled:
            _resolved_by_cancel(s, turn, request)
            raise
        finally:
            request.closed = True
        if request.decision is None:
            request.decision = "timeout"
        s.emit([PermissionResolved(request.perm_id, request.decision)], turn.id)  # type: ignore[arg-type]
        if request.decision == "allow":
            return
        verb = "was denied" if request.decision == "deny" else "timed out"
        raise ToolError("permission_denied", f"permission for {block.name} {verb}")

    def tool_failed(
        self,
        turn: Turn,
        state: TurnState,
        block: ToolUseBlock,
        error_class: str,
        message: str,
        duration_ms: int | None = None,
    ) -> None:
        self._tool_result(turn, state, block, message, is_error=True)
        self.s.emit(
            [ToolFailed(block.id, block.name, error_class, message, duration_ms)],  # type: ignore[arg-type]
            turn.id,
        )
        broke = error_class in ("error", "timeout")  # not a cancel, a refusal or a model's slip
        event(
            log, logging.WARNING if broke else logging.INFO, "tool_failed",
            f"tool {block.name} ({block.id}) failed: {error_class}: {message}",
            session_id=self.s.id, turn_id=turn.id, tool=block.name, tool_use_id=block.id,
            code=error_class, duration_ms=duration_ms,
        )  # fmt: skip

    def _tool_result(
        self,
        turn: Turn,
        state: TurnState,
        block: ToolUseBlock,
        content: str,
        *,
        is_error: bool,
        structured: Any = None,
    ) -> None:
        """Record a tool's result in the conversation, in the step that announces it.

        A structured result is kept in the block (``structured_content``), so a
        snapshot shows what ``tool.completed`` showed (PROTOCOL section 6).
        """
        s = self.s
        state.pending_tools = [b for b in state.pending_tools if b.id != block.id]
        if state.results_message is None:
            state.results_message = Message(
                new_message_id(), s.id, turn.id, "user", [], "complete", now_ms()
            )
        result = ToolResultBlock(block.id, content, is_error)
        if structured is not None:
            result.structured_content = structured
        state.results_message.content.append(result)
        s.add_message(state.results_message)

    # --- endings -------------------------------------------------------------------

    def finish(self, turn: Turn, state: TurnState, stop_reason: StopReason) -> None:
        self.close_turn(turn, state, stop_reason)
        self.emit_terminal(turn, state, stop_reason)

    def emit_terminal(self, turn: Turn, state: TurnState, stop_reason: StopReason) -> None:
        cost, workers = _turn_cost(turn, state)
        self.s.emit([TurnCompleted(turn.id, stop_reason, state.usage, cost, workers)], turn.id)
        state.ended = True

    def close_turn(self, turn: Turn, state: TurnState, outcome: str) -> None:
        """Release the turn lock and book the cost, in the step that ends the turn."""
        s = self.s
        last = s.messages[-1] if s.messages else None
        final_text = ""
        if last is not None and last.role == "assistant" and last.turn_id == turn.id:
            final_text = "".join(b.text for b in last.content if isinstance(b, TextBlock))
        phase = turn.phase
        turn.cost_usd, _ = _turn_cost(turn, state)  # before done: a parent's delegate reads it
        turn.finish(outcome, final_text)
        s.record.cost_so_far_usd += turn.cost_usd
        s.record.current_turn_id, s.record.current_turn_seq = None, 0
        s.save_record()
        s.end_turn(turn)
        self._turn_ended(turn, state, outcome, phase)  # after the lock is free, whatever it does

    def _turn_ended(self, turn: Turn, state: TurnState, outcome: str, phase: str) -> None:
        """One line and the turn metrics, in the step that ends the turn."""
        seconds = trio.current_time() - state.started_at
        label = outcome if outcome in _TURN_OUTCOMES else "other"
        metrics = self.node.metrics
        metrics.turns.labels(label).inc()
        metrics.turn_duration.labels(label).observe(seconds)
        ms = round(seconds * 1000)
        cancelled = outcome == "cancelled"
        event(
            log, logging.INFO, "turn_ended",
            f"turn {turn.id} {'cancelled' if cancelled else 'ended'}: {outcome} after {ms} ms",
            session_id=self.s.id, turn_id=turn.id, duration_ms=ms, stop_reason=outcome,
            reason=turn.cancel_reason if cancelled else None, phase=phase if cancelled else None,
            input_tokens=state.usage.input_tokens, output_tokens=state.usage.output_tokens,
        )  # fmt: skip


def _turn_cost(turn: Turn, state: TurnState) -> tuple[float, float]:
    """A turn's cost, its delegated workers' included, and their part (PROTOCOL section 5)."""
    workers = turn.workers_cost_usd
    return (state.usage.cost_usd or 0.0) + workers, workers


def _resolved_by_cancel(s: TurnHost, turn: Turn, request: PermissionRequest) -> None:
    """A cancel ends a request still waiting: ``permission.resolved`` ``cancelled``.

    PROTOCOL section 5: every request is resolved, and one a cancel ended says
    so, in the step of its tool's ``tool.failed (cancelled)`` that follows
    (nothing awaits between the two). One decided just as the cancel landed
    keeps its decision: its tool never ran, and its ``tool.failed`` says why.
    """
    request.closed = True
    request.decision = request.decision or "cancelled"
    s.emit([PermissionResolved(request.perm_id, request.decision)], turn.id)  # type: ignore[arg-type]


_TURN_OUTCOMES = frozenset(get_args(StopReason))
_LLM_ERROR_CLASSES = frozenset(get_args(LlmErrorClass))


class TurnState:
    """What one turn has done so far (for its ending)."""

    def __init__(self) -> None:
        self.started_at = trio.current_time()  # the turn's duration is measured from here
        self.usage = Usage()
        self.call_id = ""
        self.call: Call | None = None
        self.pending_tools: list[ToolUseBlock] = []
        self.tool_uses = 0  # tool_use blocks the model asked for so far (max_tool_uses_per_turn)
        self.rounds = 0  # LLM calls so far (the agent's max_rounds)
        self.results_message: Message | None = None
        self.ended = False  # its terminal event went out
        self.overflowed = False  # the last call was refused as too long (PROTOCOL section 12)
        self.call_failed_emitted = False  # its llm.call_failed went out already

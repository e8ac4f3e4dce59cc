"""The agent loop: one turn after another, in PROTOCOL section 7's order.

A turn runs under its own cancel scope (with the ``turn_timeout_s`` deadline);
each LLM call streams raw provider events to the session's translator task; a
call that stops with ``tool_use`` hands its tool blocks to the tool batch, whose
tools run concurrently in the batch's nursery. Whatever ends the turn, exactly
one of ``turn.completed`` or ``turn.cancelled`` closes it, and the turn lock is
released in the same step.

Cancellation (PROTOCOL section 8) takes one path whatever asked for it (a
``cancel`` frame, the HTTP route, the timeout, shutdown): ``Turn.request_cancel``
cancels the turn's scope, and the turn's phase (:mod:`gateway.session.turn`)
decides the sequence:

- ``llm``: the translator closes the open blocks and emits ``message.complete``
  (``cancelled``); then ``llm.call_failed`` (``cancelled``), ``turn.cancelled``.
- ``seam``: each tool that has not entered execution emits ``tool.failed``
  (``cancelled``); then ``turn.cancelled``.
- ``tools``: each tool, running or not yet started, emits ``tool.failed``
  (``cancelled``) from its own task; then ``turn.cancelled``.

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
from contextlib import aclosing
from typing import TYPE_CHECKING

import trio

from gateway.errors import ProviderError, ToolError
from gateway.ids import new_call_id, new_message_id, new_perm_id, now_ms
from gateway.protocol.events import (
    LlmCallCompleted,
    LlmCallFailed,
    LlmCallStarted,
    PermissionRequested,
    PermissionResolved,
    RouteDecided,
    ToolCalled,
    ToolCompleted,
    ToolFailed,
    TurnCancelled,
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
from gateway.session.session import Call, CancelCall, EndCall, PermissionRequest
from gateway.session.turn import Turn
from gateway.tools.registry import ToolContext
from gateway.translate import Translator

if TYPE_CHECKING:
    from gateway.session.session import Session

log = logging.getLogger("gateway.agent")


class AgentLoop:
    """Runs the turns of one session, one at a time."""

    def __init__(self, session: Session) -> None:
        self.s = session
        self.node = session.node
        self.current: tuple[Turn, _TurnState] | None = None  # the turn in flight

    async def run(self, turns: trio.MemoryReceiveChannel[Turn]) -> None:
        async for turn in turns:
            await self.run_turn(turn)

    def abort(self) -> None:
        """Close the turn in flight after the session's tasks failed (Session.run)."""
        current, self.current = self.current, None
        if current is not None and current[0].in_flight:
            self._crash_sequence(*current)

    async def run_turn(self, turn: Turn) -> None:
        s = self.s
        state = _TurnState()
        self.current = (turn, state)
        timeout = self.node.config.turns.timeout_s
        turn.cancel_scope.deadline = trio.current_time() + timeout
        try:
            with turn.cancel_scope:
                self._start(turn)
                stop_reason = await self._turn_body(turn, state)
                self._finish(turn, state, stop_reason)
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
                    self._cancel_sequence(turn, state)  # synchronous: nothing to shield
                else:  # a crash: still close the turn for every client
                    self._crash_sequence(turn, state)
            elif not state.ended:  # closed, but its last event was lost to a failure
                self._emit_terminal(turn, state, "error")

    def _start(self, turn: Turn) -> None:
        s = self.s
        s.record.turn_count += 1
        s.add_message(turn.user_message)
        [started] = s.emit([TurnStarted(turn.id, turn.user_message)], turn.id)
        # Committed with turn.started: a restart finds this turn (PROTOCOL section 9).
        s.record.current_turn_id, s.record.current_turn_seq = turn.id, started.seq
        s.save_record()
        s.emit(
            [RouteDecided(s.record.active_model, "session_model", s.record.routing_policy_version)],
            turn.id,
        )
        turn.started.set()

    # --- the turn ------------------------------------------------------------

    async def _turn_body(self, turn: Turn, state: _TurnState) -> StopReason:
        while True:
            # The loop does not run ahead of the store by more than a round:
            # what it emitted is committed and on its way to the clients before
            # the next call (held events would otherwise leave in one burst
            # that a client's bounded queue cannot take).
            await self.node.wait_durable()
            turn.enter("llm")
            call = await self._call_model(turn, state)
            if call.error_class is not None:
                self._call_failed(turn, state, call)
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
            await self._run_tools(turn, state, tool_uses)

    async def _call_model(self, turn: Turn, state: _TurnState) -> Call:
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
            ),
        )
        s.call = state.call = call
        request = ModelRequest(
            model=model,
            messages=[m for m in s.messages if m.status != "in_progress"],
            tools=self.node.tools.specs(),
            max_tokens=self.node.config.model.max_tokens,
        )
        try:
            async with aclosing(self.node.provider.stream(request)) as stream:
                async for raw in stream:
                    if call.done.is_set():  # the translation failed: nobody listens
                        break
                    await s.feed(raw)
        except ProviderError as exc:
            end = EndCall(exc.error_class, exc.message)
        except Exception as exc:  # a provider's bug is that call's failure, not the turn's
            s.failed("provider", exc, turn.id)
            end = EndCall("api_error", f"the provider failed: {type(exc).__name__}: {exc}")
        else:
            end = EndCall()
        # The stream is over: settling it is synchronous, so a cancel cannot
        # land between the last event and the call's end.
        s.settle(end)
        state.usage += call.translator.usage
        return call

    def _call_failed(self, turn: Turn, state: _TurnState, call: Call) -> None:
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

    async def _run_tools(
        self, turn: Turn, state: _TurnState, tool_uses: list[ToolUseBlock]
    ) -> None:
        """The tool batch: every call of the message concurrently, in the batch's nursery.

        The turn stays at the seam until the first tool enters execution; a
        tool waiting for permission has not (PROTOCOL section 8).
        """
        s = self.s
        s.emit([ToolCalled(b.id, b.name, b.input) for b in tool_uses], turn.id)
        async with trio.open_nursery() as nursery:
            for block in tool_uses:
                nursery.start_soon(
                    self._run_tool, turn, state, block, name=f"tool {block.name} {block.id}"
                )
        state.results_message = None

    async def _run_tool(self, turn: Turn, state: _TurnState, block: ToolUseBlock) -> None:
        s = self.s
        ctx = ToolContext(
            session_id=s.id,
            turn_id=turn.id,
            tool_use_id=block.id,
            workspace_path=s.record.workspace_path,
            kill_grace_s=self.node.config.tools.kill_grace_s,
            extras={"node": self.node, "session": s, "turn": turn},
        )
        started = trio.current_time()

        def elapsed_ms() -> int:
            return round((trio.current_time() - started) * 1000)

        try:
            self.node.tools.validate(block.name, block.input)
            if block.name in self.node.config.tools.require_approval:
                await self._permission(turn, state, block)
            if turn.phase == "seam":
                turn.enter("tools")
            output = await self.node.tools.execute(block.name, block.input, ctx)
        except ToolError as exc:
            self._tool_failed(turn, state, block, exc.error_class, exc.message, elapsed_ms())
        except Exception as exc:  # a tool's bug fails that tool only
            s.failed("tool", exc, turn.id)
            message = f"the tool failed: {type(exc).__name__}: {exc}"
            self._tool_failed(turn, state, block, "error", message, elapsed_ms())
        except trio.Cancelled:
            self._tool_failed(turn, state, block, "cancelled", "cancelled", elapsed_ms())
            raise
        else:
            self._tool_result(turn, state, block, output.content, is_error=False)
            s.emit(
                [
                    ToolCompleted(
                        block.id, block.name, output.content, elapsed_ms(), output.structured
                    )
                ],
                turn.id,
            )

    async def _permission(self, turn: Turn, state: _TurnState, block: ToolUseBlock) -> None:
        """Wait for ``allow`` (PROTOCOL section 5 ``permission.*``).

        Raises:
            ToolError: ``permission_denied`` on ``deny`` or after ``approval_timeout_s``.
        """
        s = self.s
        timeout = self.node.config.tools.approval_timeout_s
        request = PermissionRequest(new_perm_id(), block.id)
        s.permissions[request.perm_id] = request
        expires_at = now_ms() + round(timeout * 1000)
        s.emit(
            [PermissionRequested(request.perm_id, block.id, block.name, block.input, expires_at)],
            turn.id,
        )
        try:
            with trio.move_on_after(timeout):
                await request.decided.wait()
        finally:
            request.closed = True  # a cancel leaves it unresolved: its tool.failed says why
        if request.decision is None:
            request.decision = "timeout"
        s.emit([PermissionResolved(request.perm_id, request.decision)], turn.id)  # type: ignore[arg-type]
        if request.decision == "allow":
            return
        verb = "was denied" if request.decision == "deny" else "timed out"
        raise ToolError("permission_denied", f"permission for {block.name} {verb}")

    def _tool_failed(
        self,
        turn: Turn,
        state: _TurnState,
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

    def _tool_result(
        self, turn: Turn, state: _TurnState, block: ToolUseBlock, content: str, *, is_error: bool
    ) -> None:
        """Record a tool's result in the conversation, in the step that announces it."""
        s = self.s
        state.pending_tools = [b for b in state.pending_tools if b.id != block.id]
        if state.results_message is None:
            state.results_message = Message(
                new_message_id(), s.id, turn.id, "user", [], "complete", now_ms()
            )
        state.results_message.content.append(ToolResultBlock(block.id, content, is_error))
        s.add_message(state.results_message)

    # --- endings -------------------------------------------------------------------

    def _cancel_sequence(self, turn: Turn, state: _TurnState) -> None:
        """Emit the one sequence of PROTOCOL section 8 that the phase calls for."""
        s = self.s
        phase = turn.phase
        if phase in ("starting", "llm"):
            call = state.call
            if call is not None and not call.done.is_set():
                s.settle(CancelCall())
            if call is not None and call.error_class is None and phase == "llm":
                # The call finished just as the cancel landed: that is the seam.
                message = call.translator.message
                assert message is not None and call.translator.stop_reason is not None
                s.emit(
                    [
                        LlmCallCompleted(
                            state.call_id,
                            message.id,
                            call.translator.stop_reason,
                            message.usage or Usage(),
                        )
                    ],
                    turn.id,
                )
                turn.enter("seam")
                tool_uses = [b for b in message.content if isinstance(b, ToolUseBlock)]
                state.pending_tools = tool_uses if call.translator.stop_reason == "tool_use" else []
                phase = "seam"
            elif call is not None:
                self._call_failed(turn, state, call)
        # Tools that never got a task of their own (the cancel landed at the
        # seam, before the batch started) are failed here; the others already
        # failed from their own tasks.
        for block in list(state.pending_tools):
            self._tool_failed(turn, state, block, "cancelled", "cancelled")
        partial = any(m.role == "assistant" and m.turn_id == turn.id for m in s.messages)
        sequence_phase = "llm" if phase == "starting" else phase
        self._close_turn(turn, state, "cancelled")
        s.emit(
            [TurnCancelled(turn.id, turn.cancel_reason or "cancelled", sequence_phase, partial)],  # type: ignore[arg-type]
            turn.id,
        )
        state.ended = True

    def _crash_sequence(self, turn: Turn, state: _TurnState) -> None:
        """Close a turn that a gateway bug broke, as a provider error would (module docstring).

        Each step is attempted on its own: whatever else fails, the turn ends
        with ``turn.completed`` (``error``) and the session is free again.
        """
        s = self.s
        call = state.call
        try:
            if call is not None and not call.done.is_set():
                s.break_call(call, RuntimeError("the turn failed"))
            if call is not None and turn.phase == "llm":
                self._call_failed(turn, state, call)
            for block in list(state.pending_tools):
                self._tool_failed(turn, state, block, "error", "the turn failed before it ran")
        except Exception as exc:
            s.failed("agent-loop", exc, turn.id)
        finally:
            if s.call is call:
                s.call = None
            self._finish(turn, state, "error")

    def _finish(self, turn: Turn, state: _TurnState, stop_reason: StopReason) -> None:
        self._close_turn(turn, state, stop_reason)
        self._emit_terminal(turn, state, stop_reason)

    def _emit_terminal(self, turn: Turn, state: _TurnState, stop_reason: StopReason) -> None:
        cost = state.usage.cost_usd or 0.0
        self.s.emit([TurnCompleted(turn.id, stop_reason, state.usage, cost)], turn.id)
        state.ended = True

    def _close_turn(self, turn: Turn, state: _TurnState, outcome: str) -> None:
        """Release the turn lock and book the cost, in the step that ends the turn."""
        s = self.s
        last = s.messages[-1] if s.messages else None
        final_text = ""
        if last is not None and last.role == "assistant" and last.turn_id == turn.id:
            final_text = "".join(b.text for b in last.content if isinstance(b, TextBlock))
        turn.finish(outcome, final_text)
        s.record.cost_so_far_usd += state.usage.cost_usd or 0.0
        s.record.current_turn_id, s.record.current_turn_seq = None, 0
        s.save_record()
        if s.turn is turn:
            s.turn = None
        self.node.notify()


class _TurnState:
    """What one turn has done so far (for its ending)."""

    def __init__(self) -> None:
        self.usage = Usage()
        self.call_id = ""
        self.call: Call | None = None
        self.pending_tools: list[ToolUseBlock] = []
        self.results_message: Message | None = None
        self.ended = False  # its terminal event went out

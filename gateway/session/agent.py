"""The agent loop: one turn after another, in docs/protocol.md §7's order.

A turn runs under its own cancel scope (with the ``turn_timeout_s`` deadline);
each LLM call streams raw provider events to the session's translator task; a
call that stops with ``tool_use`` hands its tool blocks to the tool round
(:mod:`gateway.session.tool_round`). Whatever ends the turn, exactly one of
``turn.completed`` or ``turn.cancelled`` closes it, and the turn lock is
released in the same step (:mod:`gateway.session.closing_live`); a turn that ends
early closes with the sequence :mod:`gateway.session.closing` decides from
its phase and what it left open (docs/protocol.md §8).

The loop works through a narrow view of its session and of its node
(:mod:`gateway.session.loop_api`): it emits, records messages and the session
record, and hands the LLM call in flight to the session's
:class:`~gateway.session.call.CallStream`; nothing else of the session is its
business. An agent whose turns another runtime runs (``runtime =
"claude-code"``, docs/protocol.md §11) gets it from its node, which asks
:mod:`gateway.runtimes`: the loop names no runtime.

Failures are contained where they happen: a tool that raises anything is a
``tool.failed`` (``error``); a provider that raises anything is an
``llm.call_failed`` (``api_error``); a tool batch in which every tool failed
before running goes on to the next model round, which sees the errors. Any
other exception in a turn is a gateway bug: it is logged with its traceback
and counted, and the turn is closed as a provider error would close it
(docs/protocol.md §7); the session takes its next turn.
"""

from __future__ import annotations

import logging
import math
from contextlib import aclosing
from typing import Any

import trio

from gateway import telemetry
from gateway.agents import AgentProfile
from gateway.errors import ProviderError, Refused
from gateway.ids import new_call_id, now_ms
from gateway.logs import event
from gateway.protocol.events import (
    LlmCallCompleted,
    LlmCallStarted,
    RouteDecided,
    TurnStarted,
    error_label,
)
from gateway.protocol.shapes import StopReason, ToolUseBlock, Usage
from gateway.providers.base import ModelRequest
from gateway.providers.history import model_files, within_budget
from gateway.session import busy, closing, compaction_live, rewind
from gateway.session.call import Call, EndCall
from gateway.session.closing_live import TurnEnding
from gateway.session.compaction import estimate, model_view
from gateway.session.loop_api import AgentServices, Runtime, TurnHost
from gateway.session.tool_round import ToolRound, fail_tool, record_result
from gateway.session.turn import Turn, TurnState
from gateway.tools.registry import SessionTools
from gateway.translate import Translator, max_blocks

__all__ = ["AgentLoop", "AgentServices", "TurnHost"]  # the two views: their home is loop_api

log = logging.getLogger("gateway.agent")


class AgentLoop:
    """Runs the turns of one session, one at a time."""

    def __init__(self, session: TurnHost, node: AgentServices) -> None:
        self.session = session
        self.node = node
        self.current: tuple[Turn, TurnState] | None = None  # the turn in flight
        self.runtime: Runtime | None = None  # another runtime's, if the agent has one (run())
        self.tool_round = ToolRound(session, node)
        self.ending = TurnEnding(session, node)

    @property
    def agent(self) -> AgentProfile:
        """The session's agent, as configured now (a SIGHUP may have re-read its prompt)."""
        return self.node.agents[self.session.record.agent]

    @property
    def tools(self) -> SessionTools:
        """The session's tools now: built-in and MCP, its agent's (asked at every use)."""
        return self.node.session_tools(self.session)

    async def run(self, turns: trio.MemoryReceiveChannel[Turn | compaction_live.Request]) -> None:
        """Take the session's turns and compactions, one at a time, until the session ends.

        An agent with a runtime of its own (the node's ``runtime_of``)
        runs its turns through it; the runtime's process task lives in a
        nursery of this task: it ends with the session (docs/protocol.md §11).
        """
        make = self.node.runtime_of(self.agent)
        if make is None:
            await self._jobs(turns)
            return
        async with trio.open_nursery() as nursery:
            self.runtime = make(self, nursery, self.node.processes)
            try:
                await self._jobs(turns)
            finally:
                self.runtime = None
                nursery.cancel_scope.cancel()

    async def _jobs(self, turns: trio.MemoryReceiveChannel[Turn | compaction_live.Request]) -> None:
        async for job in turns:
            if isinstance(job, compaction_live.Request):
                await self.compact_now(job)
            elif job.in_flight:  # not a queued turn cancelled as it left the queue (busy)
                await self.run_turn(job)
            # In the step that ended it: the next waiting turn (docs/protocol.md §2 "A busy
            # session"); after a compaction too (a turn sent meanwhile was queued).
            self.session.next_turn()

    def abort(self) -> None:
        """Close the turn in flight after the session's tasks failed (Session.run)."""
        current, self.current = self.current, None
        if current is not None and current[0].in_flight:
            self.ending.close(*current, "crash")
        self.session.next_turn()

    async def run_turn(self, turn: Turn) -> None:
        state = TurnState()
        self.current = (turn, state)
        timeout = self.agent.turn_timeout_s
        turn.cancel_scope.deadline = trio.current_time() + timeout
        try:
            with turn.cancel_scope:
                self._start(turn)
                stop_reason: StopReason | None
                if self.runtime is not None:  # another runtime's turn (docs/protocol.md §11)
                    stop_reason = await self.runtime.run_turn(turn, state)
                else:
                    # an MCP server still starting lists first
                    await self.node.tools_ready(self.session)
                    stop_reason = await self._turn_body(turn, state)
                if stop_reason is not None:  # None: closed already (a provider failure)
                    self.ending.finish(turn, state, stop_reason)
        except Exception as exc:  # a gateway bug: closed below, as a provider error
            self.session.failed("agent-loop", exc, turn.id)
        finally:
            self.current = None
            self._close_left(turn, state)

    def _close_left(self, turn: Turn, state: TurnState) -> None:
        """Close a turn its task left in flight: cancelled, or broken by a gateway bug."""
        if turn.in_flight:
            why, reason = closing.why_closed(
                cancelled=turn.cancel_scope.cancel_called
                or trio.current_effective_deadline() == -math.inf,
                requested=turn.cancel_reason,
                timed_out=trio.current_time() >= turn.cancel_scope.deadline,
            )
            if why == "cancel":
                turn.cancel_reason = reason
            self.ending.close(turn, state, why)  # synchronous: nothing to shield
        elif not state.ended:  # closed, but its last event was lost to a failure
            self.ending.emit_terminal(turn, state, "error")

    def _start(self, turn: Turn) -> None:
        s = self.session
        s.record.turn_count += 1
        record = s.record
        delegated_by = record.metadata.get("delegated_by") if record.parent_session_id else None
        telemetry.turn_started(
            s.id, turn.id, record.agent, record.active_model, delegated_by, turn.trace
        )
        rewind.apply(s, turn)  # history.rewound, then turn.started (docs/protocol.md §2)
        s.add_message(turn.user_message)
        busy.started(record, turn)  # out of the queue, committed with turn.started
        [started] = s.emit([TurnStarted(turn.id, turn.user_message)], turn.id)
        event(
            log, logging.INFO, "turn_started", f"turn {turn.id} started",
            session_id=s.id, turn_id=turn.id, turn_count=s.record.turn_count,
        )  # fmt: skip
        # Committed with turn.started: a restart finds this turn (docs/protocol.md §9).
        s.record.current_turn_id, s.record.current_turn_seq = turn.id, started.seq
        s.save_record()
        s.emit(
            [RouteDecided(s.record.active_model, "session_model", s.record.routing_policy_version)],
            turn.id,
        )
        turn.started.set()

    # --- the turn ------------------------------------------------------------

    async def _turn_body(self, turn: Turn, state: TurnState) -> StopReason | None:
        while True:
            # The loop does not run ahead of the store by more than a round:
            # what it emitted is committed and on its way to the clients before
            # the next call (held events would otherwise leave in one burst
            # that a client's bounded queue cannot take).
            await self.node.wait_durable()
            # Steered messages join the turn before its next call (docs/protocol.md §2).
            self.session.take_steers(turn)
            turn.enter("llm")
            state.rounds += 1
            call = await self._model_round(turn, state)
            if call.error_class is not None:
                self._provider_error(turn, call)
                self.ending.close(turn, state, "provider_error")
                return None
            message = call.translator.message
            assert message is not None and call.translator.stop_reason is not None
            stop_reason = call.translator.stop_reason
            self.session.emit(
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
                self.tool_round.last_round(turn, state, tool_uses)
                return "max_rounds"
            await self.tool_round.run(turn, state, tool_uses)

    def open_call(self, turn: Turn, state: TurnState) -> Call:
        """``llm.call_started`` and the call its stream is translated into (either runtime)."""
        s = self.session
        model = s.record.active_model
        state.call_id = new_call_id()
        s.emit([LlmCallStarted(state.call_id, model)], turn.id)
        agent = self.agent
        telemetry.call_started(s.id, turn.id, model, agent.max_tokens, agent.temperature)
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
        s = self.session
        call = self.open_call(turn, state)
        model = s.record.active_model
        agent = self.agent
        view = within_budget(model_view(s.messages))  # docs/protocol.md §12; §2 "Files"
        try:
            request = ModelRequest(
                model=model,
                messages=view,
                tools=self.tools.specs(),
                max_tokens=agent.max_tokens,
                system=agent.system or None,
                temperature=agent.temperature,
                thinking_budget_tokens=agent.thinking_budget_tokens,
                # The bytes of the files it names (docs/protocol.md §2 "Files").
                files=await self.node.files.read(s.id, model_files(view)),
            )
            provider = self.node.providers.for_agent(agent.name)
            async with aclosing(provider.stream(request)) as stream:
                async for raw in stream:
                    if call.done.is_set():  # the translation failed: nobody listens
                        break
                    await s.calls.feed(raw)
        except ProviderError as exc:
            end = EndCall(exc.error_class, exc.message)
            state.overflowed = exc.context_overflow
        except Refused as exc:  # the store could not give the files back: no call was made
            end = EndCall("api_error", f"the session's files could not be read: {exc.message}")
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

    # --- context compaction (docs/protocol.md §12) ------------------------------------

    def context_max_tokens(self) -> int:
        """The threshold of compaction: the agent's (the one place that reads it)."""
        return self.agent.context_max_tokens

    async def _model_round(self, turn: Turn, state: TurnState) -> Call:
        """One LLM call of the turn, with the compactions of docs/protocol.md §12 around it.

        Before the call: ``auto`` when the estimated input is above
        :meth:`context_max_tokens`. A call the provider refuses as too long
        (``ProviderError.context_overflow``) is closed for the clients as any
        failed call (``llm.call_started`` then ``llm.call_failed``,
        ``invalid_request``), then compacted once (``overflow``) and made
        again, once: a second refusal is the turn's provider error. A refusal
        with nothing to compact is that error at once.
        """
        if estimate(self.session.messages) > self.context_max_tokens():
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

    async def _compact(
        self, turn: Turn, state: TurnState, trigger: compaction_live.Trigger
    ) -> bool:
        """Compact within the turn (phase ``llm``); whether anything was compacted.

        The previous call is done with: a cancel during the summary call is
        the ``llm`` phase's with no call to close, only ``turn.cancelled``.
        """
        state.call = None
        done = await compaction_live.compact(self.session, self.node, trigger, turn.id)
        if done is None:
            return False
        state.usage += done.usage
        return True

    async def compact_now(self, request: compaction_live.Request) -> None:
        """``POST .../compact`` (``manual``), between turns, bounded by the agent's turn timeout.

        A session run by another runtime compacts its own context
        (``claude-code``: its ``/compact``, docs/protocol.md §11).
        """
        s = self.session
        if self.runtime is not None:
            try:
                await self.runtime.compact()
            except Exception as exc:  # a gateway bug, or the CLI failed: the session goes on
                s.failed("compaction", exc)
            finally:
                request.done.set()
            return
        try:
            done = await compaction_live.compact(
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
        self.node.metrics.provider_errors.labels(error_label(error_class)).inc()
        event(
            log, logging.WARNING, "provider_error",
            f"turn {turn.id}: the model call failed: {error_class}: {call.error_message}",
            session_id=self.session.id, turn_id=turn.id, code=error_class, error=call.error_message,
            model=self.session.record.active_model,
        )  # fmt: skip

    # --- what a runtime calls back (gateway.session.loop_api.RuntimeHost) -----------

    def call_failed(self, turn: Turn, state: TurnState, call: Call) -> None:
        """``llm.call_failed`` for ``call``, as it failed."""
        self.ending.call_failed(turn, state, call)

    def tool_failed(
        self,
        turn: Turn,
        state: TurnState,
        block: ToolUseBlock,
        error_class: str,
        message: str,
        duration_ms: int | None = None,
    ) -> None:
        fail_tool(self.session, turn, state, block, error_class, message, duration_ms)

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
        record_result(
            self.session, turn, state, block, content, is_error=is_error, structured=structured
        )

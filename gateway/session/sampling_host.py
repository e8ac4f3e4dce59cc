"""An MCP server's sampling request, served by the calling session's model (docs/protocol.md §11).

The MCP client (gateway.mcp.sampling) ties the request to the session whose
tool call is in flight and hands it here as a
:class:`~gateway.tools.sampling.SamplingRequest`. In order:

1. **The agent's ``mcp_sampling``**: ``deny`` refuses at once (no
   permission asked); ``ask`` (the default) asks the user, ``allow`` does not.
   A ``claude-code`` agent's model is its CLI's: refused too.
2. **The turn**: the call's turn must be the one in flight and not
   cancelling; a sampling call counts as one of its ``max_rounds`` LLM calls
   (past it: refused, ``limit``).
3. **The question** (``ask``): ``permission.requested`` with ``kind:
   "sampling"``, the calling tool's ``tool_use_id`` and ``tool_name``, and
   ``input`` = ``{"server", "system_prompt", "messages", "max_tokens"}``
   (each text cut at :data:`SHOWN_CHARS` characters, at most
   :data:`SHOWN_MESSAGES` messages: the event stays small), waited on within
   ``approval_timeout_s``; anything but ``allow`` refuses.
4. **The call**: the session's provider and model, the server's messages and
   system prompt (the agent's system prompt is not sent), no tools,
   ``max_tokens`` = the server's, capped at the agent's ``max_tokens``.
   ``llm.call_started`` / ``llm.call_completed`` (or ``llm.call_failed``)
   with ``purpose: "sampling"`` frame it in the turn's stream; no message
   stream and no stored message (the answer goes to the server only: the
   ``message_id`` of ``llm.call_completed`` names no message). Its usage and
   cost are the turn's (``turn.completed``).

A cancel (the turn's, or the tool call's end: gateway.mcp.sampling) during
the call ends it with ``llm.call_failed`` (``cancelled``, ``purpose:
"sampling"``), before the tool's own ``tool.failed``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, cast

import trio

from gateway import telemetry
from gateway.errors import ProviderError, ToolError
from gateway.ids import new_call_id, new_message_id, now_ms
from gateway.protocol.events import (
    LlmCallCompleted,
    LlmCallFailed,
    LlmCallStarted,
    PermissionRequested,
    PermissionResolved,
    error_label,
)
from gateway.protocol.shapes import Message, PermissionKind, TextBlock, Usage
from gateway.providers.base import ModelRequest, text_reply
from gateway.session.core import SessionCore
from gateway.session.permissions import PermissionRequest
from gateway.tools.sampling import Sampled, SamplingRequest

if TYPE_CHECKING:
    from gateway.agents import AgentProfile
    from gateway.session.loop_api import AgentServices
    from gateway.session.turn import Turn, TurnState
    from gateway.tools.registry import ToolContext

SHOWN_CHARS = 2000
"""A sampling request's system prompt and each message, in its ``permission.requested``."""

SHOWN_MESSAGES = 20
"""The last messages of a sampling request shown in its ``permission.requested``."""

# MCP's stop reasons, by the gateway's (docs/protocol.md §5)
_STOP = {"end_turn": "endTurn", "max_tokens": "maxTokens", "stop_sequence": "stopSequence"}


class Loop(Protocol):
    """What sampling uses of the session's agent loop (gateway.session.agent.AgentLoop)."""

    current: tuple[Turn, TurnState] | None

    @property
    def agent(self) -> AgentProfile: ...

    @property
    def node(self) -> AgentServices: ...


class ServerRequests:
    """A session's side of an MCP server's sampling and URL-mode questions (a mixin of Session).

    The :class:`~gateway.tools.registry.ToolSession` methods; the session is
    a :class:`SessionCore` whose agent loop is ``agent``.
    """

    agent: Loop | None

    async def elicit_url(
        self, ctx: ToolContext, message: str, url: str, completed: trio.Event | None = None
    ) -> str:
        """An MCP server's URL-mode question (:func:`elicit_url`)."""
        return await elicit_url(cast(SessionCore, self), ctx, message, url, completed)

    async def sample(self, ctx: ToolContext, request: SamplingRequest) -> Sampled:
        """An MCP server's sampling request (:func:`sample`)."""
        return await sample(cast(SessionCore, self), self.agent, ctx, request)


async def sample(
    s: SessionCore, loop: Loop | None, ctx: ToolContext, request: SamplingRequest
) -> Sampled:
    """Serve ``request`` for the tool call ``ctx`` (module docstring).

    Raises:
        ToolError: ``permission_denied`` (the agent, the user), ``limit``
            (the turn's ``max_rounds``), ``error`` (no turn, the call failed).
    """
    if loop is None:
        raise ToolError("error", "sampling refused: the session is not running")
    agent = loop.agent
    if agent.mcp_sampling == "deny":
        raise ToolError("permission_denied", f"sampling refused: agent {agent.name!r} denies it")
    if agent.runtime != "native":  # its model is its CLI's: no call of the gateway's to make
        raise ToolError("permission_denied", f"sampling refused: agent {agent.name!r} runs a CLI")
    turn, state = _turn_of(loop, ctx)
    _count_round(agent, state, count=agent.mcp_sampling != "ask")  # nobody asked past it
    max_tokens = min(request.max_tokens, agent.max_tokens)
    if agent.mcp_sampling == "ask":
        decision = await _ask(s, ctx, request, max_tokens)
        if decision != "allow":
            raise ToolError("permission_denied", f"sampling refused: the user's answer: {decision}")
        turn, state = _turn_of(loop, ctx)  # still the turn, not cancelled meanwhile
        _count_round(agent, state)  # a denied one counts for nothing
    return await _call(s, loop, turn, state, ctx, request, max_tokens)


def _turn_of(loop: Loop, ctx: ToolContext) -> tuple[Turn, TurnState]:
    current = loop.current
    if current is None or current[0].id != ctx.turn_id or not current[0].in_flight:
        raise ToolError("error", "sampling refused: the tool's turn is over")
    if current[0].cancelling:
        raise ToolError("error", "sampling refused: the tool's turn is being cancelled")
    return current


def _count_round(agent: AgentProfile, state: TurnState, *, count: bool = True) -> None:
    """Refuse past the turn's ``max_rounds``; else count the call (with ``count``)."""
    if state.rounds >= agent.max_rounds:
        raise ToolError(
            "limit", f"sampling refused: the turn made its max_rounds ({agent.max_rounds}) calls"
        )
    state.rounds += count


def shown(request: SamplingRequest, max_tokens: int) -> dict[str, Any]:
    """The ``input`` of a sampling request's ``permission.requested`` (bounded)."""
    messages = request.messages[-SHOWN_MESSAGES:]
    return {
        "server": request.server,
        "system_prompt": _cut(request.system_prompt or ""),
        "messages": [{"role": role, "text": _cut(text)} for role, text in messages],
        "messages_left_out": len(request.messages) - len(messages),
        "max_tokens": max_tokens,
    }


def _cut(text: str) -> str:
    return text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS] + " [...]"


async def _ask(s: SessionCore, ctx: ToolContext, request: SamplingRequest, max_tokens: int) -> str:
    """``permission.requested`` (``kind: "sampling"``) and its answer."""
    message = f"MCP server {request.server!r} asks the agent's model for a completion"
    input = shown(request, max_tokens)
    return await wait_permission(
        s, ctx, "sampling", input, message, tool_name=ctx.tool_name or "mcp"
    )


async def wait_permission(
    s: SessionCore,
    ctx: ToolContext,
    kind: PermissionKind,
    input: dict[str, Any],
    message: str,
    *,
    tool_name: str,
    completed: trio.Event | None = None,
) -> str:
    """Open a request of ``kind``, emit it, wait for its decision (``cancelled`` on a cancel).

    ``completed``, once set while it waits, decides it ``allow`` (a URL-mode
    elicitation the server says is done). Waited on within ``approval_timeout_s``.
    """
    timeout = s.node.config.tools.approval_timeout_s
    expires_at = now_ms() + round(timeout * 1000)
    request = s.permissions.open(
        ctx.tool_use_id, tool_name, input, expires_at, kind=kind, message=message
    )
    asked = PermissionRequested(
        request.perm_id, ctx.tool_use_id, tool_name, input, expires_at, kind, message
    )
    s.emit([asked], ctx.turn_id)
    decision = "cancelled"
    try:
        with trio.move_on_after(timeout):
            async with trio.open_nursery() as nursery:
                if completed is not None:
                    nursery.start_soon(_allow_when, completed, request, name="completed")
                await request.decided.wait()
                nursery.cancel_scope.cancel()
        decision = request.decision or "timeout"
    finally:
        request.closed = True
        request.decision = decision
        s.emit([PermissionResolved(request.perm_id, decision)], ctx.turn_id)  # type: ignore[arg-type]
    return decision


async def _allow_when(completed: trio.Event, request: PermissionRequest) -> None:
    await completed.wait()
    if not request.decided.is_set():
        request.decision = "allow"
        request.decided.set()


async def elicit_url(
    s: SessionCore, ctx: ToolContext, message: str, url: str, completed: trio.Event | None = None
) -> str:
    """A server's URL-mode elicitation: ``permission.requested`` ``kind: "elicitation_url"``.

    docs/protocol.md §11: ``input`` is ``{"url": url}`` (checked by
    gateway.mcp.questions before), ``message`` the server's; ``allow`` means
    the user went there, ``deny`` declined; the timeout and a cancel cancel;
    ``completed`` (the server's ``notifications/elicitation/complete``) allows.
    """
    return await wait_permission(
        s, ctx, "elicitation_url", {"url": url}, message,
        tool_name=ctx.tool_name or "mcp", completed=completed,
    )  # fmt: skip


async def _call(
    s: SessionCore,
    loop: Loop,
    turn: Turn,
    state: TurnState,
    ctx: ToolContext,
    request: SamplingRequest,
    max_tokens: int,
) -> Sampled:
    """The model call, framed by ``llm.call_*`` (``purpose: "sampling"``), booked to the turn."""
    model = s.record.active_model
    call_id = new_call_id()
    s.emit([LlmCallStarted(call_id, model, "sampling")], turn.id)
    telemetry.call_started(
        s.id, turn.id, model, max_tokens, request.temperature,
        sampling_for=(ctx.tool_use_id, call_id),
    )  # fmt: skip
    messages = [
        Message(f"msg_sampling_{i}", s.id, turn.id, role, [TextBlock(text)], "complete", 0)  # type: ignore[arg-type]
        for i, (role, text) in enumerate(request.messages)
    ]
    model_request = ModelRequest(
        model=model,
        messages=messages,
        tools=[],
        max_tokens=max_tokens,
        system=request.system_prompt or None,
        temperature=request.temperature,
    )
    metrics = loop.node.metrics
    try:
        reply = await text_reply(loop.node.providers.for_agent(loop.agent.name), model_request)
    except trio.Cancelled:
        s.emit([LlmCallFailed(call_id, "cancelled", "cancelled", None, "sampling")], turn.id)
        _traced(call_id, "cancelled", "cancelled")
        raise
    except ProviderError as exc:
        s.emit([LlmCallFailed(call_id, exc.error_class, exc.message, None, "sampling")], turn.id)  # type: ignore[arg-type]
        metrics.provider_errors.labels(error_label(exc.error_class)).inc()
        _traced(call_id, exc.error_class, exc.message)
        raise ToolError("error", f"sampling failed: {exc.error_class}: {exc.message}") from None
    except Exception as exc:  # a provider's bug fails the sampling, not the turn
        s.failed("provider", exc, turn.id)
        s.emit([LlmCallFailed(call_id, "api_error", repr(exc), None, "sampling")], turn.id)
        metrics.provider_errors.labels("api_error").inc()
        _traced(call_id, "api_error", repr(exc))
        raise ToolError("error", "sampling failed: the provider failed") from None
    text, usage, stop = reply.text, reply.usage, reply.stop_reason
    usage.cost_usd = loop.node.pricing(model)(usage)
    state.usage += usage
    stop_reason = stop if stop in _STOP else "end_turn"
    message_id = new_message_id()
    s.emit(
        [LlmCallCompleted(call_id, message_id, stop_reason, usage, "sampling")],  # type: ignore[arg-type]
        turn.id,
    )
    _traced(call_id, None, "", model, message_id, stop_reason, usage)
    return Sampled(text, model, _STOP[stop_reason])


def _traced(
    call_id: str,
    error_class: str | None,
    why: str,
    model: str | None = None,
    message_id: str | None = None,
    stop_reason: str | None = None,
    usage: Usage | None = None,
) -> None:
    """The sampling call's ``chat`` span ends (docs/operating.md "Traces")."""
    usage = usage or Usage()
    telemetry.call_ended(
        call_id, error_class, why, model, message_id, stop_reason,
        usage.input_tokens, usage.output_tokens,
    )  # fmt: skip

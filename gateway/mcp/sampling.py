"""An MCP server's sampling requests (``sampling/createMessage``) during its tool calls.

docs/protocol.md §11 ("MCP tools", sampling). A request is served for the
session whose call is in flight on the connection, as an elicitation is
(gateway.mcp.questions): with calls of several sessions in flight on a shared
server it cannot be tied to one and is refused (``mcp_sampling_ambiguous``
logged); with no call in flight it is refused. What it asks is checked here,
before the session sees it: text content only (no images, no tools: the
client advertises neither), at most :data:`MAX_SAMPLING_CHARS` characters,
``max_tokens`` at least 1. At most :data:`MAX_SAMPLINGS` of one session are
served at once on one connection; more are refused at once. Refusals are
logged at most a line a second (gateway.mcp.quiet).

The session (gateway.session.sampling_host) then applies its agent's
``mcp_sampling``, asks its user and calls its model. Every refusal is a
JSON-RPC error the server sees: ``-1`` when the agent or the user refused
(MCP's "user rejected"), invalid params for a request that cannot be served,
invalid request otherwise. The capability is advertised on every connection:
a connection may be shared by sessions of agents that allow it and agents
that deny it, so the refusal is per request.
"""

from __future__ import annotations

import logging
from contextlib import suppress

import mcp_types as types
import trio
from mcp.client.session import ClientRequestContext

from gateway.errors import ToolError
from gateway.logs import event
from gateway.mcp.quiet import Quiet, more
from gateway.tools.registry import ToolContext
from gateway.tools.sampling import SamplingRequest

log = logging.getLogger("gateway.mcp")

MAX_SAMPLINGS = 2
"""A session's sampling requests served at once on one connection; more are refused.

Each may ask the user and make a model call: a server that sends a thousand
``sampling/createMessage`` at once must not make a thousand."""

MAX_SAMPLING_CHARS = 1_000_000
"""The text of one sampling request (its messages and system prompt) at most, in characters."""

USER_REJECTED = -1
"""The JSON-RPC error code of a sampling the agent or the user refused (MCP's own example)."""


def calling(server: str, calls: dict[object, ToolContext], quiet: Quiet) -> ToolContext | None:
    """The context of the one session whose calls are in flight, or None (logged when several,
    at most a line a second: ``quiet``)."""
    sessions = {ctx.session_id for ctx in calls.values()}
    left_out = quiet.due() if len(sessions) > 1 else None
    if left_out is not None:
        event(
            log, logging.WARNING, "mcp_sampling_ambiguous",
            f"MCP server {server} sent a sampling request while calls of {len(sessions)}"
            f" sessions were in flight: refused{more(left_out)}",
            server=server, count=len(sessions), left_out=left_out or None,
        )  # fmt: skip
    if len(sessions) != 1:
        return None
    return next(iter(calls.values()))


def request_of(server: str, params: types.CreateMessageRequestParams) -> SamplingRequest:
    """The session's request, from what the server asked.

    Raises:
        ValueError: what cannot be served (the server is told, invalid params).
    """
    if params.tools or params.tool_choice is not None:
        raise ValueError("tools in a sampling request are not supported")
    if params.max_tokens < 1:
        raise ValueError("max_tokens must be at least 1")
    messages: list[tuple[str, str]] = []
    size = len(params.system_prompt or "")
    for message in params.messages:
        texts = []
        for block in message.content_as_list:
            if not isinstance(block, types.TextContent):
                raise ValueError(f"only text content is supported, not {block.type!r}")
            texts.append(block.text)
        text = "\n".join(texts)
        size += len(text)
        messages.append((message.role, text))
    if not messages:
        raise ValueError("a sampling request needs at least one message")
    if size > MAX_SAMPLING_CHARS:
        raise ValueError(f"the request's text is over {MAX_SAMPLING_CHARS} characters")
    return SamplingRequest(
        server=server,
        messages=tuple(messages),
        max_tokens=params.max_tokens,
        system_prompt=params.system_prompt,
        temperature=params.temperature,
        stop_sequences=tuple(params.stop_sequences or ()),
    )


class Samplings:
    """The sampling requests of one server connection, by the session they are served for.

    Args:
        server: the server's name (in log lines and refusals).
        calls: the connection's calls in flight (the caller's context each), oldest first.
    """

    def __init__(self, server: str, calls: dict[object, ToolContext]) -> None:
        self.server = server
        self._calls = calls
        self._serving: dict[str, list[tuple[trio.CancelScope, trio.Event]]] = {}
        self._quiet = Quiet()  # a flood of refusals: a line a second (gateway.mcp.quiet)
        self._quiet_ambiguous = Quiet()

    async def sample(
        self, context: ClientRequestContext, params: types.CreateMessageRequestParams
    ) -> types.CreateMessageResult | types.ErrorData:
        """A server's sampling request during a call: served for the calling session."""
        ctx = calling(self.server, self._calls, self._quiet_ambiguous)
        if ctx is None or ctx.session is None:
            return self._refused(types.INVALID_REQUEST, "no tool call of one session in flight")
        try:
            request = request_of(self.server, params)
        except ValueError as exc:
            return self._refused(types.INVALID_PARAMS, str(exc), ctx.session_id)
        serving = self._serving.setdefault(ctx.session_id, [])
        if len(serving) >= MAX_SAMPLINGS:
            return self._refused(
                types.INVALID_REQUEST, f"over {MAX_SAMPLINGS} at once", ctx.session_id
            )
        entry = (trio.CancelScope(), trio.Event())
        serving.append(entry)
        try:
            with entry[0]:
                sampled = await ctx.session.sample(ctx, request)
        except ToolError as exc:
            code = (
                USER_REJECTED if exc.error_class == "permission_denied" else types.INVALID_REQUEST
            )
            return self._refused(
                code, exc.message.removeprefix("sampling refused: "), ctx.session_id
            )
        finally:
            entry[1].set()
            with suppress(ValueError):
                serving.remove(entry)
        if entry[0].cancelled_caught:
            return self._refused(types.INVALID_REQUEST, "cancelled: the tool call ended")
        return types.CreateMessageResult(
            role="assistant",
            content=types.TextContent(type="text", text=sampled.text),
            model=sampled.model,
            stop_reason=sampled.stop_reason,
        )

    def _refused(self, code: int, why: str, session_id: str | None = None) -> types.ErrorData:
        left_out = self._quiet.due()
        if left_out is not None:
            event(
                log, logging.WARNING, "mcp_sampling_refused",
                f"MCP server {self.server}: a sampling request was refused: {why}{more(left_out)}",
                server=self.server, session_id=session_id, error=why, left_out=left_out or None,
            )  # fmt: skip
        return types.ErrorData(code=code, message=f"sampling refused: {why}")

    async def end(self, session_id: str) -> None:
        """The session's last call here ended: so do its sampling requests (as questions do)."""
        serving = self._serving.pop(session_id, [])
        for scope, _ in serving:
            scope.cancel()
        with trio.CancelScope(shield=True), trio.move_on_after(1.0):
            for _, done in serving:
                await done.wait()

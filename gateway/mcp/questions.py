"""An MCP server's questions (``elicitation/create``) during its tool calls (docs/protocol.md §11).

A question is asked of the session whose call is in flight on the
connection (:meth:`gateway.tools.registry.ToolSession.elicit`: a
``permission.requested`` of kind ``elicitation``); when calls of several
sessions are in flight on a shared server at once, the question cannot be
tied to one of them (MCP's stdio carries no request it relates to) and is
cancelled, with a warning (``mcp_elicitation_ambiguous``). A session's
questions end with its last call on the connection (:meth:`Questions.end`).
"""

from __future__ import annotations

import logging
from contextlib import suppress

import mcp_types as types
import pydantic
import trio
from mcp.client.session import ClientRequestContext

from gateway.logs import event
from gateway.mcp.tools import elicitation_problem
from gateway.tools.registry import ToolContext

log = logging.getLogger("gateway.mcp")

MAX_QUESTIONS = 4
"""A session's elicitations in flight on one connection; a server asking more at once is cancelled.

Each is a pending permission in every snapshot of the session: a server that
sends a thousand ``elicitation/create`` at once must not make a thousand."""


class Questions:
    """The questions of one server connection, by the session they are asked of.

    Args:
        server: the server's name (in log lines).
        calls: the connection's calls in flight (the caller's context each), oldest first.
    """

    def __init__(self, server: str, calls: dict[object, ToolContext]) -> None:
        self.server = server
        self._calls = calls
        # Questions being asked, by session: each ended with that session's last call here.
        self._asked: dict[str, list[tuple[trio.CancelScope, trio.Event]]] = {}

    async def ask(
        self, context: ClientRequestContext, params: types.ElicitRequestParams
    ) -> types.ElicitResult | types.ErrorData:
        """A server's question during a call: asked of the calling session's user."""
        if not isinstance(params, types.ElicitRequestFormParams):
            return types.ErrorData(
                code=types.INVALID_REQUEST, message="only form elicitations are supported"
            )
        sessions = {ctx.session_id for ctx in self._calls.values()}
        if len(sessions) != 1:
            event(
                log, logging.WARNING, "mcp_elicitation_ambiguous",
                f"MCP server {self.server} asked a question while calls of {len(sessions)}"
                " sessions were in flight: cancelled",
                server=self.server, count=len(sessions),
            )  # fmt: skip
            return types.ElicitResult(action="cancel")
        ctx = next(iter(self._calls.values()))
        if ctx.session is None:
            return types.ElicitResult(action="cancel")
        schema = params.requested_schema
        if isinstance(schema, pydantic.BaseModel):
            schema = schema.model_dump(by_alias=True, exclude_none=True)
        problem = elicitation_problem(params.message, schema)
        if problem is not None:
            event(
                log, logging.WARNING, "mcp_elicitation_refused",
                f"MCP server {self.server} asked a question that cannot be asked: {problem}",
                server=self.server, session_id=ctx.session_id, error=problem,
            )  # fmt: skip
            return types.ErrorData(code=types.INVALID_PARAMS, message=f"refused: {problem}")
        asked = self._asked.setdefault(ctx.session_id, [])
        if len(asked) >= MAX_QUESTIONS:
            event(
                log, logging.WARNING, "mcp_elicitation_refused",
                f"MCP server {self.server} asked over {MAX_QUESTIONS} questions at once: cancelled",
                server=self.server, session_id=ctx.session_id, error="too many at once",
            )  # fmt: skip
            return types.ElicitResult(action="cancel")
        question = (trio.CancelScope(), trio.Event())
        asked.append(question)
        try:
            with question[0]:
                decision, content = await ctx.session.elicit(ctx, params.message, dict(schema))
        finally:
            question[1].set()
            with suppress(ValueError):
                asked.remove(question)
        if question[0].cancelled_caught:
            return types.ElicitResult(action="cancel")
        if decision == "allow":
            return types.ElicitResult(action="accept", content=content or {})
        if decision == "deny":
            return types.ElicitResult(action="decline")
        return types.ElicitResult(action="cancel")

    async def end(self, session_id: str) -> None:
        """The session's last call here ended (done, failed, cancelled): so do its questions.

        The server's question runs in the SDK's task, not the call's, so a
        turn's cancel or the call's timeout would leave it open (a pending
        permission, answered by nobody, until approval_timeout_s). Cancelled
        here, it is resolved ``cancelled`` (docs/protocol.md §11) before the
        call's own ``tool.failed`` (waited for, shielded, a second at most).
        """
        questions = self._asked.pop(session_id, [])
        for scope, _ in questions:
            scope.cancel()
        with trio.CancelScope(shield=True), trio.move_on_after(1.0):
            for _, done in questions:
                await done.wait()

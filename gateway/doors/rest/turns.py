"""A session's turns and what acts on one: cancel, permissions, compaction, feedback.

docs/protocol.md sections 2, 8 (cancellation), 10 (permissions) and 12 (compaction).
"""

from __future__ import annotations

from gateway.doors.context import DoorContext, rewind_if_busy
from gateway.doors.rest import idempotency
from gateway.errors import ApiError
from gateway.http.parsing import decode, decode_optional, user_content
from gateway.http.server import Request, Response, json_response
from gateway.ids import message_id_of, new_turn_id, now_ms
from gateway.protocol.http import (
    Accepted,
    CancelAccepted,
    CancelTurn,
    Compact,
    Feedback,
    PermissionDecision,
    SubmitTurn,
    TurnAccepted,
)
from gateway.protocol.shapes import Message
from gateway.tenancy import NO_OWNER


class Turns:
    """The handlers of a session's turns and what acts on one (module docstring).

    Args:
        ctx: the doors' context (gateway.doors.context).
    """

    def __init__(self, ctx: DoorContext) -> None:
        self.ctx = ctx

    async def submit_turn(self, req: Request, session_id: str) -> Response:
        """``POST /sessions/{id}/turns``: answered once the turn is durable."""
        caller = self.ctx.authenticate(req)
        session = await self.ctx.session(session_id, caller)
        body = decode(req, SubmitTurn)
        content = user_content(body.content)
        if_busy = rewind_if_busy(body.if_busy, body.rewind_to, self.ctx.config.turns.if_busy)
        parent = session.parent
        if (
            parent is not None
            and self.ctx.node.agents[parent.record.agent].runtime == "claude-code"
        ):
            # Its turns are Claude Code's sub-agent's, run by its parent's CLI
            # (gateway.runtimes.claude_code): one sent here would start a new,
            # unrelated Claude Code conversation.
            raise ApiError(
                409,
                "subagent_session",
                f"{session.id} is a Claude Code sub-agent of {parent.id}: "
                f"send turns to {parent.id}",
            )
        owner = caller or NO_OWNER

        async def start(turn_id: str) -> Response:
            message = Message(
                message_id_of(turn_id), session.id, turn_id, "user", content, "complete", now_ms()
            )
            taken = await self.ctx.counted_turn(owner, session, message, if_busy, body.rewind_to)
            return json_response(
                202, TurnAccepted(taken.turn_id, taken.queued, taken.position, taken.steered)
            )

        async def find(turn_id: str) -> Response | None:
            messages = await self.ctx.node.messages_of(session)
            if not any(m.turn_id == turn_id and m.role == "user" for m in messages):
                return None
            await self.ctx.node.durable_or_503()  # made here, maybe not yet durable (a 503 before)
            return json_response(202, TurnAccepted(turn_id))

        # At most once per Idempotency-Key (gateway.doors.rest.idempotency): the turn's
        # id is chosen first and kept with the key.
        return await idempotency.once(self.ctx, req, owner, new_turn_id(), start, find)

    async def cancel_turn(self, req: Request, session_id: str, turn_id: str) -> Response:
        """``POST /sessions/{id}/turns/{turn_id}/cancel`` (docs/protocol.md §8)."""
        session = await self.ctx.session(session_id, self.ctx.authenticate(req))
        body = decode_optional(req, CancelTurn) or CancelTurn()
        await self.ctx.node.cancel_turn(
            session, turn_id, body.reason or "user", f"http:{req.client}"
        )
        return json_response(202, CancelAccepted(turn_id))

    async def decide(self, req: Request, session_id: str, perm_id: str) -> Response:
        """``POST /sessions/{id}/permissions/{perm_id}``: allow, deny, or answer an elicitation."""
        session = await self.ctx.session(session_id, self.ctx.authenticate(req))
        body = decode(req, PermissionDecision)
        await self.ctx.node.decide_permission(session, perm_id, body.decision, body.content)
        return json_response(202, Accepted("resolved"))

    async def compact(self, req: Request, session_id: str) -> Response:
        """``POST /sessions/{id}/compact``: a manual compaction (docs/protocol.md §12)."""
        session = await self.ctx.session(session_id, self.ctx.authenticate(req))
        decode_optional(req, Compact)
        await self.ctx.node.compact(session)
        return json_response(202, Accepted("compacting"))

    async def feedback(self, req: Request, session_id: str) -> Response:
        """``POST /sessions/{id}/feedback``: a rating of one message."""
        session = await self.ctx.session(session_id, self.ctx.authenticate(req))
        body = decode(req, Feedback)
        await self.ctx.node.record_feedback(session, body.message_id, body.rating, body.comment)
        return json_response(202, Accepted("recorded"))

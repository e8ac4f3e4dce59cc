"""A session's turns and what acts on one: cancel, permissions, compaction, feedback.

docs/protocol.md sections 2, 8 (cancellation), 10 (permissions) and 12 (compaction).
"""

from __future__ import annotations

from gateway.doors.context import DoorContext, rewind_if_busy
from gateway.doors.rest import idempotency
from gateway.errors import ApiError, StoreError, unavailable
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
from gateway.session import busy, rewind
from gateway.session.session import Session
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
        # Refused before its inline files are kept: a refused turn keeps none of them.
        content = await self.ctx.node.files.resolve(
            session.id,
            session.record.owner,
            user_content(body.content),
            refuse=self.ctx.file_refusal(session),
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
            found = await self._made(session, turn_id)
            if found is not None:  # made here, maybe not yet durable (a 503 before)
                await self.ctx.node.durable_or_503()
            return None if found is None else json_response(202, found)

        # At most once per Idempotency-Key (gateway.doors.rest.idempotency): the turn's
        # id is chosen first and kept with the key.
        return await idempotency.once(self.ctx, req, owner, new_turn_id(), start, find)

    async def _made(self, session: Session, turn_id: str) -> TurnAccepted | None:
        """What an earlier attempt of a turn's request made, if anything: a started (or
        steered) user message, else a queued turn or steer (docs/protocol.md §2 "A busy
        session": its message's id is derived from the turn's)."""
        message_id = message_id_of(turn_id)
        node = self.ctx.node
        for m in [*await node.messages_of(session), *await self._rewound(session)]:
            if m.role == "user" and (m.id == message_id or m.turn_id == turn_id):
                return TurnAccepted(m.turn_id or turn_id, steered=m.turn_id != turn_id)
        record = session.record
        if not node.runs_here(session.id):  # the store's, as messages_of reads it
            try:
                record = await node.store.get_session(session.id) or record
            except StoreError as exc:
                raise unavailable(exc) from None
        for q in record.queued_turns:
            if q.turn_id == turn_id and q.steering is not None:
                return TurnAccepted(q.steering, steered=True)
            if q.turn_id == turn_id:
                return TurnAccepted(turn_id, queued=True, position=busy.position(record, turn_id))
        return None

    async def _rewound(self, session: Session) -> list[Message]:
        """The session's rewound messages (a turn made, then rewound by a later one)."""
        node = self.ctx.node
        if node.runs_here(session.id):
            return list(session.rewound)
        try:
            every, gone = await rewind.stored(node.store, session.id)
        except StoreError as exc:
            raise unavailable(exc) from None
        return [m for m in every if m.id in gone]

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

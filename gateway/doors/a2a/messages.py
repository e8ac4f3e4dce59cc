"""``SendMessage`` and ``SendStreamingMessage``: a new task, or the answer to one.

docs/doors/a2a.md "Messages". A message without ``taskId`` is a new task:
one turn of its context's session (``contextId``: a session of the caller's
key, made with that id when unknown, as AG-UI's ``threadId``; none: a new
session, of the agent its metadata names, ``agent`` or ``skill``, else the
default agent). A message with ``taskId`` answers the task's open approval
(``TASK_STATE_INPUT_REQUIRED``). What refuses a new task is checked before
its session is made (its parts, its files' bytes, the key's turn rate), as
every door does. The task's subscriber joins the session's hub before the
turn is submitted or the approval decided, so it misses nothing.
"""

from __future__ import annotations

from typing import Any

import msgspec

from gateway.doors import attachments
from gateway.doors.a2a import parts
from gateway.doors.a2a import shapes as a2
from gateway.doors.a2a.history import limit_of
from gateway.doors.a2a.push import Push
from gateway.doors.a2a.rpc import INVALID_PARAMS, UNSUPPORTED_OPERATION, RpcFailure, result_response
from gateway.doors.a2a.stream import TaskStreams
from gateway.doors.a2a.tasks import FoundTask, find_task, task_id
from gateway.doors.context import ClientNamedSessions, DoorContext
from gateway.errors import ApiError
from gateway.http.server import Request, Response, StreamingResponse
from gateway.ids import new_message_id, new_turn_id, now_ms
from gateway.protocol.shapes import Message
from gateway.session.session import Session
from gateway.tenancy import NO_OWNER


class Messages:
    """The message methods of one router (module docstring)."""

    def __init__(self, ctx: DoorContext, streams: TaskStreams, push: Push) -> None:
        self.ctx = ctx
        self.node = ctx.node
        self.streams = streams
        self.push = push
        self.contexts = ClientNamedSessions(ctx, "contextId", "invalid_context_id")

    async def send(
        self,
        req: Request,
        caller: str | None,
        rid: a2.RequestId,
        body: a2.SendMessageRequest,
        streaming: bool,
    ) -> Response | StreamingResponse:
        """One message: a task streamed, or answered once it is terminal or waits for an
        answer (``SendMessage``; at once with ``returnImmediately``)."""
        message = body.message
        if message.role != "ROLE_USER":
            raise RpcFailure(
                INVALID_PARAMS, "a message to the agent is ROLE_USER", "invalid_params"
            )
        if message.task_id:
            return await self._answer(req, caller, rid, body, streaming)
        return await self._new(req, caller, rid, body, streaming)

    async def _new(
        self,
        req: Request,
        caller: str | None,
        rid: a2.RequestId,
        body: a2.SendMessageRequest,
        streaming: bool,
    ) -> Response | StreamingResponse:
        message, owner = body.message, caller or NO_OWNER
        agent = _agent_named(message.metadata) or _agent_named(body.metadata)
        if agent is not None and agent not in self.node.agents:
            names = ", ".join(self.node.agents.names())
            raise ApiError(422, "unknown_agent", f"no agent {agent[:60]!r} (agents: {names})")
        context = message.context_id or None
        if context is not None:
            self.contexts.check(context)
        config = body.configuration
        shown = limit_of(config.history_length if config is not None else None)  # -32602 first
        asked = config.task_push_notification_config if config is not None else None
        push = self.push.checked(asked, "") if asked is not None else None
        base = self.ctx.config.server.public_url
        said = await attachments.read(
            lambda: parts.sent(message, context or "", base), len(req.body)
        )
        known = context is not None and bool(said.file_ids) and await self._known(context)
        await attachments.check(self.node.files, said, known, self.ctx.file_refusal(None))
        await self.node.limits.check_turn(owner)  # counted with the turn, below
        session = await self._context(context, caller, agent)
        content = await attachments.kept(self.ctx, session, said)
        turn_id = new_turn_id()
        user = Message(new_message_id(), session.id, turn_id, "user", content, "complete", now_ms())
        submitted: list[str] = []

        async def submit() -> None:
            if push is not None:  # before the turn: its notifications miss nothing
                await self.push.put(session, msgspec.structs.replace(push, turn_id=turn_id))
            taken = await self.ctx.counted_turn(owner, session, user)
            submitted.append(taken.turn_id)  # a steered message's task is the turn it joined
            if push is not None and taken.turn_id != turn_id:  # the config is the joined turn's
                await self.push.drop(session, turn_id, push.id)
                await self.push.put(session, msgspec.structs.replace(push, turn_id=taken.turn_id))

        task = ("", session, turn_id)
        sub, feed, release = await self.streams.open_task(req, task, None, None)
        try:
            await submit()
        except BaseException:
            sub.leave("client_closed")
            release()
            raise
        turn_id = submitted[0]
        ref = task_id(session.id, turn_id)
        history = [parts.echo(message, ref, session.id)][:shown] or None  # historyLength
        feed.task_id, feed.turn_id, feed.history = ref, turn_id, history
        if streaming:  # returnImmediately is SendMessage's: a stream is answered at once
            return self.streams.respond(sub, feed, rid, release, feed.open())
        if config is not None and config.return_immediately:
            sub.leave("task_finished")
            release()
            return result_response(rid, a2.SendMessageResponse(task=feed.task(history)))
        try:
            await self.streams.follow(sub, feed)
        finally:
            if sub.subscribed:
                sub.leave("task_finished")
            release()
        return result_response(rid, a2.SendMessageResponse(task=feed.task(history)))

    async def _answer(
        self,
        req: Request,
        caller: str | None,
        rid: a2.RequestId,
        body: a2.SendMessageRequest,
        streaming: bool,
    ) -> Response | StreamingResponse:
        """A message to a task waiting for an approval: the answer, then the rest of it."""
        message = body.message
        assert message.task_id
        found = await find_task(self.ctx, caller, message.task_id)
        if message.context_id and message.context_id != found.session.id:
            raise RpcFailure(
                INVALID_PARAMS, "contextId is not the task's context", "invalid_params"
            )
        decision, perm, content = self._decision(found, message)
        pending = [p.perm_id for p in found.summary.pending_permissions]
        targets = [perm] if perm is not None else pending
        asked = body.configuration.task_push_notification_config if body.configuration else None
        if asked is not None:  # the task's config, kept before its answer lets it go on
            await self.push.put(found.session, self.push.checked(asked, found.turn_id))

        async def decide() -> None:
            for perm_id in targets:
                await self.node.decide_permission(found.session, perm_id, decision, content)

        start = await found.start()
        task = (found.id, found.session, found.turn_id)
        sub, feed, release = await self.streams.open_task(
            req, task, start, None, decide, answered=frozenset(targets)
        )
        if streaming:
            return self.streams.respond(sub, feed, rid, release, [])
        try:
            await self.streams.follow(sub, feed)
        finally:
            if sub.subscribed:
                sub.leave("task_finished")
            release()
        return result_response(rid, a2.SendMessageResponse(task=feed.task()))

    def _decision(
        self, found: FoundTask, message: a2.Message
    ) -> tuple[str, str | None, dict[str, Any] | None]:
        if not found.waiting:
            ended = not (found.in_flight or found.queued)
            raise RpcFailure(
                UNSUPPORTED_OPERATION,
                f"task {found.id} "
                + ("has ended" if ended else "waits for no answer")
                + ": a new message without taskId starts a new task of the context",
                "task_not_waiting",
                409,
            )
        decision, perm, content = parts.decision(message)
        pending = found.summary.pending_permissions
        if perm is not None and perm not in {p.perm_id for p in pending}:
            why = f"no open approval {perm[:60]!r} on this task"
            raise RpcFailure(INVALID_PARAMS, why, "invalid_answer", 422)
        if content is not None and perm is None and len(pending) > 1:  # never half decided
            why = "content answers one elicitation: with several open, name it with permId"
            raise RpcFailure(INVALID_PARAMS, why, "invalid_answer", 422)
        return decision, perm, content

    async def _context(self, context: str | None, caller: str | None, agent: str | None) -> Session:
        """The message's context: named (found or made), or a new session of ``agent``."""
        if context is None:
            return await self.node.create_session(agent=agent, owner=caller or NO_OWNER)
        session = await self.contexts.get(context, caller)
        if agent is not None and session.record.agent != agent:
            raise ApiError(
                422,
                "unknown_agent",
                f"context {context} is of agent {session.record.agent!r}, not {agent[:60]!r}",
            )
        return session

    async def _known(self, context: str) -> bool:
        return (
            context in self.node.sessions or await self.node.store.get_session(context) is not None
        )


def _agent_named(metadata: dict[str, Any] | None) -> str | None:
    """The agent a message's metadata names: ``agent``, else ``skill`` (a card's skill id)."""
    if not metadata:
        return None
    for key in ("agent", "skill"):
        value = metadata.get(key)
        if isinstance(value, str) and value:
            return value
    return None

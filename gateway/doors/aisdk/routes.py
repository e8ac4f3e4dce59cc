"""The AI SDK over HTTP: ``POST /ai-sdk/chat``, its resume and its stop.

Routes of the AI SDK's door (gateway.doors.aisdk.door), so they share the
router's boundary and the doors' authentication, ownership and rate limits
(docs/protocol.md §2). A chat is a session (its ``id``, created and owned by
the caller's key when unknown); a request's answer is one turn's assistant
UI message, streamed by :func:`gateway.doors.aisdk.stream.respond`
(docs/doors/aisdk.md). :class:`Responses` starts a response
for the WebSocket transport (gateway.doors.aisdk.ws) as well.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import msgspec

from gateway.doors import attachments
from gateway.doors.aisdk import edits
from gateway.doors.aisdk.mapping import ChatMapper, user_message_id
from gateway.doors.aisdk.stream import DONE, HEADERS, ResponseSubscriber, respond, sse
from gateway.doors.context import (
    COALESCE,
    NAMED_TURN_UNAVAILABLE,
    SSE_HEADERS,
    ClientNamedSessions,
    DoorContext,
    coalesce_query,
    once,
    rewind_if_busy,
)
from gateway.errors import ApiError, StoreError
from gateway.http.openapi import Operation
from gateway.http.parsing import decode
from gateway.http.server import Request, Response, StreamingResponse, json_response
from gateway.ids import new_turn_id, now_ms, parse_event_id
from gateway.protocol.shapes import Message, QueuedTurnInfo
from gateway.session.fork_point import origin_of
from gateway.session.session import Session
from gateway.session.turn_start import turn_start
from gateway.store.base import SessionRecord
from gateway.tenancy import NO_OWNER

# --- the request (the transports' bodies) ---------------------------------------------


class UiMessage(msgspec.Struct):
    """A UI message as ``useChat`` keeps it: only what the gateway reads of it."""

    id: str
    role: str
    parts: list[dict[str, Any]] = msgspec.field(default_factory=list)
    metadata: Any = None


class ChatRequest(msgspec.Struct, rename="camel"):
    """``DefaultChatTransport``'s body (any other field the client adds is ignored)."""

    id: str
    messages: list[UiMessage]
    trigger: str = "submit-message"
    message_id: str | None = None


class ChatStopped(msgspec.Struct):
    """``POST /ai-sdk/chat/{id}/stop``'s answer: the turn being cancelled."""

    session_id: str
    turn_id: str


_MAX_LINEAGE = 32
"""How many sessions back a chat's forks are followed (:meth:`Responses._lineage`)."""

CHAT = Operation(
    "Send an AI SDK chat message (a UI message stream over SSE)",
    None,
    body=ChatRequest,
    query=(COALESCE,),
    media_type="text/event-stream",
    errors={
        400: ("invalid_query",),
        404: ("session_not_found", "message_not_found"),
        409: (
            "turn_in_progress",
            "turn_not_in_flight",
            "session_too_large",
            "message_rewound",
            "too_many_files",
        ),
        # A file part (docs/doors/aisdk.md "Files"); a data URL's errors are an upload's.
        413: ("file_too_large",),
        415: ("unsupported_media_type",),
        422: (
            "invalid_query",
            "invalid_chat_id",
            "unknown_file",
            "unsupported_file_url",
            "unsupported_content",
            "invalid_file",
        ),
        429: ("rate_limited", "too_many_sessions", "quota_exceeded"),
        503: NAMED_TURN_UNAVAILABLE,
    },
    description="`DefaultChatTransport`'s body: `id` is a session id (an unknown "
    "one is created, owned by the caller's key); a last `user` message's text "
    "and `file` parts are the turn (a file as a `data:` URL, or the URL of a "
    "file of the chat, `/sessions/{id}/files/{file_id}`: the gateway fetches "
    "nothing); a last `assistant` message with tool parts in state "
    "`approval-responded` answers those approvals and continues the turn; an "
    'edited user message, or `trigger: "regenerate-message"`, starts a turn '
    'that rewinds to it (docs/protocol.md §2 "Edit and regenerate"). The '
    "answer is `text/event-stream` with `x-vercel-ai-ui-message-stream: v1`: "
    "UI message chunks, then `data: [DONE]` (docs/doors/aisdk.md). Dropping "
    "the stream does not cancel the turn; `POST /ai-sdk/chat/{id}/stop` does.",
)

RESUME = Operation(
    "Resume the AI SDK chat's turn in flight (SSE)",
    None,
    query=(COALESCE,),
    media_type="text/event-stream",
    errors={
        400: ("invalid_query",),
        404: ("session_not_found",),
        422: ("invalid_query",),
        503: ("over_capacity", "store_unavailable", "session_elsewhere"),
    },
    description="The turn's whole assistant message so far, then live, as "
    "`DefaultChatTransport` replays a resumed stream; 204 when no turn is in "
    "flight (docs/doors/aisdk.md).",
)

STOP = Operation(
    "Stop the AI SDK chat's turn in flight",
    ChatStopped,
    202,
    body_required=False,
    errors={404: ("session_not_found",), 409: ("turn_not_in_flight",)},
    description="The cancellation of `POST /sessions/{id}/turns/{turn_id}/cancel` "
    "(docs/protocol.md §8): the response streaming the turn ends with `abort`, "
    "then `finish`.",
)


@dataclass
class Opened:
    """A response ready to stream: its subscriber (subscribed) and its mapper."""

    session: Session
    sub: ResponseSubscriber
    mapper: ChatMapper
    error: str | None = None  # the turn cannot be replayed: the response says so and ends


class Responses:
    """The AI SDK's handlers, and how a response starts (module docstring)."""

    def __init__(self, ctx: DoorContext) -> None:
        self.ctx = ctx
        self.node = ctx.node
        self.config = ctx.config
        self.chats = ClientNamedSessions(ctx, "id", "invalid_chat_id")

    # --- starting a response -----------------------------------------------------

    async def send(
        self,
        caller: str | None,
        chat_id: str,
        messages: list[UiMessage],
        trigger: str,
        client: str,
        coalesce_ms: int | None = None,
    ) -> Opened:
        """The response to a send (module docstring): a new turn, approvals answered, or a
        turn that rewinds to the message an edit or a regeneration names (edits).
        ``coalesce_ms``: its stream's delta rollup window (None: the server's)."""
        if not messages:
            raise ApiError(422, "invalid_body", "messages is empty")
        last = messages[-1]
        if last.role == "assistant" and trigger != edits.REGENERATE:
            return await self._answer(caller, chat_id, last, client, coalesce_ms)
        if last.role != "user":
            raise ApiError(422, "invalid_body", f"the last message's role is {last.role!r}")
        self.chats.check(chat_id)
        base = self.config.server.public_url
        urls = sum(len(p["url"]) for p in last.parts if isinstance(p.get("url"), str))
        said = await attachments.read(lambda: user_sent(last, chat_id, base), urls)
        key = caller or NO_OWNER
        rewind_to: str | None = None
        known = await self._known(chat_id)
        if known:  # a repeated request is that turn: no new one
            session = await self.ctx.session(chat_id, caller)
            conversation = await self.node.messages_of(session)
            sent = edits.find(await self._lineage(session), last.id, conversation)
            if sent is not None and sent.turn_id is not None:
                if trigger != edits.REGENERATE and edits.same_content(sent, said):
                    return await self._replay(session, sent.turn_id, client, window=coalesce_ms)
                rewind_to = sent.id  # edited, or regenerated (docs/doors/aisdk.md)
            elif trigger != edits.REGENERATE:  # sent again while its turn waits in the queue
                mid = user_message_id(chat_id, last.id)
                repeated = await self._queued_send(session, mid, client, coalesce_ms)
                if repeated is not None:
                    return repeated
        if trigger == edits.REGENERATE and rewind_to is None:
            raise ApiError(
                404, "message_not_found", f"no message of {chat_id} to regenerate: {last.id[:40]!r}"
            )
        # What refuses a new turn comes before its chat is made (nothing left on a 429,
        # nor on a file refused: its bytes are checked first).
        await attachments.check(self.node.files, said, known, self.ctx.file_refusal(None))
        await self.node.limits.check_turn(key)  # counted with the turn, below
        session = await self.chats.get(chat_id, caller)
        state = await self.node.live_summary(session)
        if state.pending_permissions:
            raise ApiError(
                409,
                "turn_in_progress",
                f"turn {state.current_turn_id or '?'} on {session.id} waits for approval: "
                "answer it (tool parts in state approval-responded) or stop it",
            )
        content = await attachments.kept(self.ctx, session, said)
        turn_id = new_turn_id()
        mid = user_message_id(chat_id, last.id)
        if rewind_to is not None:  # the message rewound to keeps its id, stored
            mid = edits.edited_id(chat_id, last.id, turn_id)
        message = Message(mid, session.id, turn_id, "user", content, "complete", now_ms())
        busy = rewind_if_busy(None, rewind_to, self.config.turns.if_busy)
        sub = await self._live(session, client, coalesce_ms)
        try:  # a busy chat: as [turns] if_busy says (docs/doors/aisdk.md)
            taken = await self.ctx.counted_turn(key, session, message, busy, rewind_to)
        except BaseException:
            session.hub.unsubscribe(sub)
            raise
        # A steered send streams the turn it joined; a queued one, its own once it starts.
        return Opened(session, sub, self._mapper(session, taken.turn_id))

    async def _queued_send(
        self, session: Session, mid: str, client: str, window: int | None
    ) -> Opened | None:
        """A message ``mid`` sent again while its turn is queued ([turns] if_busy "queue",
        docs/protocol.md §2 "A busy session"): that turn, streamed once it starts, as the
        first send's was (its message is in no history yet). ``None``: not queued.
        """
        if not any(q.user_message.id == mid for q in await self._queued(session)):
            return None
        sub = await self._live(session, client, window)  # before it can start: nothing missed
        queued = next((q for q in await self._queued(session) if q.user_message.id == mid), None)
        if queued is not None:
            return Opened(session, sub, self._mapper(session, queued.turn_id))
        session.hub.unsubscribe(sub)  # it started meanwhile: in the history now
        history = await self.node.messages_of(session)
        sent = next((m for m in history if m.id == mid), None)
        if sent is not None and sent.turn_id is not None:
            return await self._replay(session, sent.turn_id, client, window=window)
        return None  # cancelled while queued: sent again, it is a new turn

    async def _queued(self, session: Session) -> list[QueuedTurnInfo]:
        waiting = (await self.node.live_summary(session)).queued_turns
        return [] if isinstance(waiting, msgspec.UnsetType) else waiting

    async def _lineage(self, session: Session) -> list[str]:
        """The chat's id, then those of the sessions it was forked from, nearest first (as far
        as their records say: a deleted source's own source is not known)."""
        ids = [session.id]
        record: SessionRecord | None = session.record
        while record is not None and len(ids) < _MAX_LINEAGE:
            origin, _ = origin_of(record.metadata)
            if origin is None or not origin.session_id or origin.session_id in ids:
                break
            ids.append(origin.session_id)
            live = self.node.sessions.get(origin.session_id)
            try:
                record = live.record if live else await self.node.store.get_session(ids[-1])
            except StoreError:
                break
        return ids

    async def _known(self, chat_id: str) -> bool:
        return (
            chat_id in self.node.sessions or await self.node.store.get_session(chat_id) is not None
        )

    async def _answer(
        self, caller: str | None, chat_id: str, last: UiMessage, client: str, window: int | None
    ) -> Opened:
        """Approvals answered in the assistant message: decided, and the turn continued."""
        session = await self.ctx.session(chat_id, caller)
        meta = last.metadata.get("gateway") if isinstance(last.metadata, dict) else None
        meta = meta if isinstance(meta, dict) else {}
        state = await self.node.live_summary(session)
        named = meta.get("turnId") if isinstance(meta.get("turnId"), str) else None
        turn_id = state.current_turn_id
        if named is not None and named != turn_id and await self._has_turn(session, named):
            turn_id = named  # a turn of this chat that ended: how it ended
        if turn_id is None:
            raise ApiError(409, "turn_not_in_flight", f"no turn in flight on {session.id}")
        pending = {p.perm_id for p in state.pending_permissions}
        answers = [a for a in _approvals(last) if a[0] in pending]
        cursor = meta.get("lastEventId")
        after = parse_event_id(cursor) if isinstance(cursor, str) else None
        if after is None:  # no position: what comes from now on
            after = self.node.sequencer.last
        answering = {a[0] for a in answers}
        opened = await self._replay(session, turn_id, client, after, answering, window)
        if opened.error is not None or turn_id != state.current_turn_id:
            return opened  # nothing decided for a turn that cannot be streamed, or is over
        try:
            for perm_id, approved in answers:
                decision = "allow" if approved else "deny"
                await self.ctx.decide_answered(session, perm_id, decision)
        except BaseException:
            session.hub.unsubscribe(opened.sub)
            raise
        return opened

    async def _has_turn(self, session: Session, turn_id: str) -> bool:
        """Whether ``turn_id`` is one of the session's turns (a client's metadata is no proof)."""
        return any(m.turn_id == turn_id for m in await self.node.messages_of(session))

    async def resume(
        self, caller: str | None, chat_id: str, client: str, coalesce_ms: int | None = None
    ) -> Opened | None:
        """The response of the turn in flight, from its start (None: no turn in flight);
        ``coalesce_ms``: its stream's delta rollup window (None: the server's)."""
        session = await self.ctx.session(chat_id, caller)
        turn_id = (await self.node.live_summary(session)).current_turn_id
        if turn_id is None:
            return None
        return await self._replay(session, turn_id, client, window=coalesce_ms)

    async def _replay(
        self,
        session: Session,
        turn_id: str,
        client: str,
        after: int = -1,
        answering: set[str] | None = None,
        window: int | None = None,
    ) -> Opened:
        """A response of ``turn_id`` mapped from its start: a replay through the seam, then live."""
        mapper = self._mapper(session, turn_id, after, frozenset(answering or ()))
        sub = ResponseSubscriber(session, self.config.stream, self.node.metrics, client)
        start = await turn_start(session, turn_id)
        if start is None:
            sub.leave("turn_not_found")
            return Opened(session, sub, mapper, f"turn {turn_id} can no longer be replayed")
        if await self.ctx.subscribe(session, sub, since=start, coalesce_ms=window) is not None:
            session.hub.unsubscribe(sub)
            return Opened(session, sub, mapper, f"turn {turn_id} can no longer be replayed")
        return Opened(session, sub, mapper)

    def _mapper(
        self,
        session: Session,
        turn_id: str,
        after: int = -1,
        answering: frozenset[str] = frozenset(),
    ) -> ChatMapper:
        """The response's mapper; its files' URLs after ``[server] public_url`` when set."""
        base = self.config.server.public_url
        return ChatMapper(session.id, turn_id, after, answering, file_base=base)

    async def _live(self, session: Session, client: str, window: int | None) -> ResponseSubscriber:
        sub = ResponseSubscriber(session, self.config.stream, self.node.metrics, client)
        await self.ctx.subscribe(session, sub, coalesce_ms=window)
        return sub

    # --- the HTTP doors --------------------------------------------------------------

    async def chat(self, req: Request) -> StreamingResponse:
        """``POST /ai-sdk/chat`` (module docstring)."""
        caller = self.ctx.authenticate(req)
        body = decode(req, ChatRequest)
        window = coalesce_query(req)
        release = once(await self.node.limits.open_stream(caller or NO_OWNER, "ai_sdk"))
        try:
            opened = await self.send(
                caller, body.id, body.messages, body.trigger, req.client, window
            )
        except BaseException:
            release()
            raise
        return self._response(opened, release)

    async def chat_stream(self, req: Request, chat_id: str) -> Response | StreamingResponse:
        """``GET /ai-sdk/chat/{id}/stream``: 204, or the turn in flight from its start."""
        caller = self.ctx.authenticate(req)
        window = coalesce_query(req)
        release = once(await self.node.limits.open_stream(caller or NO_OWNER, "ai_sdk"))
        try:
            opened = await self.resume(caller, chat_id, req.client, window)
        except BaseException:
            release()
            raise
        if opened is None:
            release()
            return Response(204, b"")
        return self._response(opened, release)

    async def chat_stop(self, req: Request, chat_id: str) -> Response:
        """``POST /ai-sdk/chat/{id}/stop``: cancel the turn (docs/protocol.md §8)."""
        session = await self.ctx.session(chat_id, self.ctx.authenticate(req))
        turn_id = (await self.node.live_summary(session)).current_turn_id
        if turn_id is None:
            raise ApiError(409, "turn_not_in_flight", f"no turn in flight on {chat_id}")
        await self.node.cancel_turn(session, turn_id, "user", f"ai-sdk:{req.client}")
        return json_response(202, ChatStopped(session.id, turn_id))

    def _response(self, opened: Opened, release: Callable[[], None]) -> StreamingResponse:
        """The response's SSE answer; what it holds given back when it ends, or never starts."""
        sub, mapper = opened.sub, opened.mapper
        interval = self.config.stream.ping_interval_s

        async def run(send: Callable[[bytes], Awaitable[None]]) -> None:
            try:
                await respond(sub, mapper, sse, send, interval, opened.error)
                await send(DONE)
            finally:
                if sub.subscribed:  # a client gone before the pump began
                    sub.leave("client_closed")
                release()

        def abandon() -> None:
            if sub.subscribed:
                sub.leave("client_closed")
            release()

        return StreamingResponse(run, headers=[*SSE_HEADERS, *HEADERS], abandon=abandon)


def user_sent(message: UiMessage, chat_id: str, base: str = "") -> attachments.Sent:
    """A user message's ``text`` and ``file`` parts, in order (422 for any other part,
    or none): a file part's ``url`` is a data URL or a file of the chat
    (gateway.doors.attachments), its ``mediaType`` says whether it is an image
    or a document; ``base``: ``[server] public_url``, under whose path a URL may be."""
    parts: list[str | attachments.Attachment] = []
    for i, part in enumerate(message.parts):
        kind, url, media_type = part.get("type"), part.get("url"), part.get("mediaType")
        if kind == "text" and isinstance(part.get("text"), str):
            parts.append(part["text"])
        elif kind == "file" and isinstance(url, str) and isinstance(media_type, str):
            where = f"parts[{i}]"
            parts.append(attachments.attachment(url, media_type, None, chat_id, where, base))
        else:
            shown = str(kind)[:40]
            raise ApiError(
                422, "invalid_body", f"user message parts must be text or file, got {shown!r}"
            )
    said = attachments.Sent(parts)
    if said.empty():
        raise ApiError(422, "invalid_body", "the user message has no text and no file")
    return said


def _approvals(message: UiMessage) -> list[tuple[str, bool]]:
    """The approvals answered in an assistant message: (approval id, approved)."""
    out: list[tuple[str, bool]] = []
    for part in message.parts:
        kind = part.get("type")
        tool = isinstance(kind, str) and (kind.startswith("tool-") or kind == "dynamic-tool")
        approval = part.get("approval")
        if tool and part.get("state") == "approval-responded" and isinstance(approval, dict):
            ident, approved = approval.get("id"), approval.get("approved")
            if isinstance(ident, str) and isinstance(approved, bool):
                out.append((ident, approved))
    return out

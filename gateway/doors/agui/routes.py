"""AG-UI's handlers: ``POST /agui`` (a run, answered as SSE), its re-attach and its cancel.

Routes of the AG-UI door (gateway.doors.agui.door: :meth:`AguiRoutes.agui_run`,
:meth:`AguiRoutes.agui_cancel`, :meth:`AguiRoutes.agui_stream`, with their
API-document operations :data:`RUN`, :data:`CANCEL` and :data:`STREAM`), so
they share the router's boundary and the doors' authentication, ownership and
rate limits (docs/protocol.md §2). A run is one turn of the thread's session,
started or resumed here and streamed by
:func:`gateway.doors.agui.sse.stream_run`; the decisions of the mapping are in
docs/doors/agui.md.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import msgspec

from gateway.doors import attachments
from gateway.doors.agui import shapes as ag
from gateway.doors.agui.mapping import RunMapper
from gateway.doors.agui.resume import RunFeed, RunRecord, Tagged, parse_cursor
from gateway.doors.agui.runs import RunBook
from gateway.doors.agui.shapes import (
    CancelRun,
    InputMessage,
    ResumeEntry,
    RunAgentInput,
    RunCancelling,
)
from gateway.doors.agui.sse import RunSubscriber, stream_run, tagged_sse
from gateway.doors.context import (
    COALESCE,
    NAMED_TURN_UNAVAILABLE,
    SSE_HEADERS,
    ClientNamedSessions,
    DoorContext,
    coalesce_query,
    once,
)
from gateway.errors import ApiError, Refused
from gateway.http.openapi import Operation
from gateway.http.parsing import decode
from gateway.http.server import Request, Response, StreamingResponse, json_response
from gateway.ids import new_turn_id, now_ms
from gateway.protocol.shapes import Message
from gateway.session.session import Session
from gateway.tenancy import NO_OWNER

T = TypeVar("T")


RUN = Operation(
    "Run an AG-UI agent turn (SSE of AG-UI events)",
    None,
    body=RunAgentInput,
    query=(COALESCE,),
    media_type="text/event-stream",
    errors={
        400: ("invalid_query",),
        404: ("session_not_found",),
        409: ("turn_in_progress", "session_too_large", "too_many_files"),
        # A file part (docs/doors/agui.md "Files"); inline data's errors are an upload's.
        413: ("file_too_large",),
        415: ("unsupported_media_type",),
        422: (
            "invalid_query",
            "invalid_thread_id",
            "invalid_resume",
            "unknown_file",
            "unsupported_file_url",
            "unsupported_content",
            "invalid_file",
        ),
        429: ("rate_limited", "too_many_sessions", "quota_exceeded"),
        503: NAMED_TURN_UNAVAILABLE,
    },
    description="An AG-UI `RunAgentInput`; the answer is `text/event-stream`, "
    "one `data: {AG-UI event}` per event and a `: ping` comment after "
    "`ping_interval_s` idle (docs/doors/agui.md). `threadId` is a "
    "session id (an unknown one is created, owned by the caller's key); "
    "the last `user` message's text and files (`image` and `document` parts, "
    "a `data` source or the URL of a file of the thread: nothing is fetched) "
    "are the turn's content; the run is the "
    "turn. A run that stops for a tool approval ends with `RUN_FINISHED` "
    "whose outcome is `interrupt`; the next run on the thread carries "
    '`resume`, one entry per interrupt (`payload`: `{"decision": '
    '"allow"|"deny"}`; `cancelled`: deny). Closing the stream does not '
    "cancel the turn: `POST /agui/{session_id}/cancel` (the threadId) does. "
    "Errors before the stream starts are the JSON error bodies.",
)
"""``POST /agui`` in the API document."""

CANCEL = Operation(
    "Cancel the AG-UI run (the turn) in flight on a thread",
    RunCancelling,
    202,
    body=CancelRun,
    body_required=False,
    errors={409: ("turn_not_in_flight",)},
    description="`session_id` is the run's `threadId`. The same cancellation "
    "as `POST /sessions/{id}/turns/{turn_id}/cancel` (docs/protocol.md §8): "
    "every client of the session sees it, and the run's stream ends with "
    "`RUN_FINISHED` (outcome `cancelled`). With `runId`, that run's turn, in "
    "flight or queued (it never starts); 409 once it has ended.",
)
"""``POST /agui/{session_id}/cancel`` in the API document."""

STREAM = Operation(
    "Re-attach to an AG-UI run (SSE of AG-UI events)",
    None,
    query=(COALESCE,),
    media_type="text/event-stream",
    errors={
        400: ("invalid_query",),
        404: ("session_not_found", "run_not_found"),
        422: ("invalid_last_event_id", "invalid_query"),
        503: (
            "over_capacity",
            "store_unavailable",
            "session_elsewhere",
            "session_owner_unreachable",
        ),
    },
    description="`session_id` is the run's `threadId`. With a `Last-Event-ID` "
    "header (the `id:` of the last event received), what came after it; "
    "without, the whole run. The stream begins with `RUN_STARTED`, then the "
    "start events of every step and block the client saw start and not end, "
    "then the rest of the run, live while it goes on, until `RUN_FINISHED` or "
    "`RUN_ERROR` (docs/doors/agui.md). 404 `run_not_found`: a run this "
    "gateway did not start or no longer holds.",
)
"""``GET /agui/{session_id}/runs/{run_id}/stream`` in the API document."""


class AguiRoutes:
    """The AG-UI handlers of one router, and what they keep between runs (module docstring).

    Args:
        ctx: the doors' context (its authentication, sessions and turn submission).
    """

    def __init__(self, ctx: DoorContext) -> None:
        self.ctx = ctx
        self.node = ctx.node
        self.config = ctx.config
        self._decode = decode
        self._threads = ClientNamedSessions(ctx, "threadId", "invalid_thread_id")
        self.book = RunBook(ctx.node)  # the runs answered, to re-attach (gateway.doors.agui.runs)

    async def agui_run(self, req: Request) -> StreamingResponse:
        """``POST /agui``: one AG-UI run, the turn it starts or resumes (docs/doors/agui.md).

        The run's subscriber joins the session's hub (through the seam) before
        the turn is submitted or its approvals decided, so the stream misses
        nothing; every refusal comes before the stream starts, as a JSON error.
        """
        caller = self.ctx.authenticate(req)
        body = self._decode(req, RunAgentInput)
        window = coalesce_query(req)
        # What refuses a new run is checked before its thread is made: a run
        # refused 422 or 429 leaves no session behind (nor a count of one), nor
        # one whose files are refused (their bytes are checked first).
        base = self.config.server.public_url
        said = None
        if not body.resume:
            said = await attachments.read(
                lambda: user_sent(body.messages, body.thread_id, base), len(req.body)
            )
        if said is not None:
            known = await self._known(body.thread_id, said)
            await attachments.check(self.node.files, said, known, self.ctx.file_refusal(None))
            await self.node.limits.check_turn(caller or NO_OWNER)  # counted with the turn, below
        # A stream, counted as a WebSocket is (503 over_capacity), until it ends.
        release = once(await self.node.limits.open_stream(caller or NO_OWNER, "agui"))
        try:
            return await self._run(req, body, caller, said, release, window)
        except BaseException:
            release()
            raise

    async def _run(
        self,
        req: Request,
        body: RunAgentInput,
        caller: str | None,
        said: attachments.Sent | None,
        release: Callable[[], None],
        window: int | None = None,
    ) -> StreamingResponse:
        """:meth:`agui_run`, its stream counted: the thread, the subscriber, the turn
        (``window``: its delta rollup window, None: the server's)."""
        # A resume has nothing to resume on a thread that does not exist: 404, none made.
        thread = self.ctx.session if body.resume else self._thread
        session = await thread(body.thread_id, caller)
        state = await self.node.live_summary(session)  # the owner's, wherever it runs
        history = await self.node.messages_of(session)
        limit = self.config.stream.snapshot_messages
        sub = RunSubscriber(session, self.config.stream, self.node.metrics, req.client)
        if body.resume and state.current_turn_id is None:
            # Answered elsewhere (another client, the WebSocket protocol, a
            # timeout) and the turn has ended: the run says so and finishes.
            release()
            return self._closed_run(body, history[-limit:] if limit else [])
        message: Message | None = None  # the run's own, when it sends one
        if body.resume:
            decisions = _resume_decisions(
                body.resume, {p.perm_id for p in state.pending_permissions}
            )
            assert state.current_turn_id is not None
            turn_id = state.current_turn_id
            start, started_ms = await self._subscribe(session, sub, window), now_ms()
            try:
                for perm_id, decision, answer in decisions:
                    await self.ctx.decide_answered(session, perm_id, decision, answer)
            except BaseException:
                session.hub.unsubscribe(sub)
                raise
        else:
            assert said is not None
            if state.pending_permissions:
                raise ApiError(
                    409,
                    "turn_in_progress",
                    f"turn {state.current_turn_id or '?'} on {session.id} waits for "
                    "approval: send a run with resume",
                )
            content = await attachments.kept(self.ctx, session, said)
            turn_id = new_turn_id()
            # A queued run's message is in no history yet (docs/protocol.md §2).
            queued = state.queued_turns if state.queued_turns is not msgspec.UNSET else []
            sent = [*history, *(q.user_message for q in queued)]
            mid = self.book.message_id(session.id, body.run_id, sent)
            message = Message(
                mid, session.id, turn_id, "user", content, "complete", now_ms(),
                client_id=_last_user(body.messages).id,  # named so in snapshots ("Ids")
            )  # fmt: skip
            start, started_ms = await self._subscribe(session, sub, window), message.created_at
            try:  # a busy thread: as [turns] if_busy says (docs/doors/agui.md)
                taken = await self.ctx.counted_turn(caller or NO_OWNER, session, message)
            except BaseException:
                session.hub.unsubscribe(sub)
                raise
            turn_id = taken.turn_id  # a steered run streams the turn it joined
            start = self.book.start_of(session, turn_id, start)  # as found after a restart
        own = None if message is None else message.id
        record = RunRecord(turn_id, start, len(history), started_ms, own)
        self.book.remember(session.id, body.run_id, record)
        # A steered run joins its turn mid-stream: the message it sees only complete
        # comes whole (docs/doors/agui.md), as the AI SDK's steered response has it.
        mapper = RunMapper(body.thread_id, body.run_id, turn_id, self._base)
        feed = RunFeed(mapper, start, rebuild=True)
        opening = feed.opening(self._opening(feed.mapper, record, history, message))
        return self._response(sub, feed, opening, release)

    def _response(
        self, sub: RunSubscriber, feed: RunFeed, opening: list[Tagged], release: Callable[[], None]
    ) -> StreamingResponse:
        """The run's SSE answer; its stream's count given back when it ends, or never starts."""
        interval = self.config.stream.ping_interval_s

        async def run(send: Callable[[bytes], Awaitable[None]]) -> None:
            try:
                await stream_run(sub, feed, opening, send, interval)
            finally:
                release()

        def abandon() -> None:
            sub.leave("client_closed")
            release()

        return StreamingResponse(run, headers=SSE_HEADERS, abandon=abandon)

    def _closed_run(self, body: RunAgentInput, history: list[Message]) -> StreamingResponse:
        """A resume of interrupts that were answered elsewhere, on a thread whose turn ended.

        Its entries are stale, not wrong: an AG-UI client keeps its interrupts
        until a run finishes, so the run finishes at once (``RUN_STARTED``, the
        thread's ``MESSAGES_SNAPSHOT`` with how the turn ended, ``RUN_FINISHED``)
        and the front end is free again (docs/doors/agui.md).
        """
        feed = RunFeed(
            RunMapper(body.thread_id, body.run_id, "", self._base), self.node.sequencer.last
        )
        opening = feed.mapper.start(history, now_ms(), self._snapshot_cap)
        events = feed.opening([*opening, feed.mapper.idle_finish(now_ms())])

        async def run(send: Callable[[bytes], Awaitable[None]]) -> None:
            await send(tagged_sse(events))

        return StreamingResponse(run, headers=SSE_HEADERS)

    async def agui_stream(self, req: Request, session_id: str, run_id: str) -> StreamingResponse:
        """``GET /agui/{session_id}/runs/{run_id}/stream``: re-attach to a run.

        The run is mapped again from its start: the seam replays the session's
        events after the run's start, then the subscriber is live (no gap, no
        duplicate at the seam); :class:`~gateway.doors.agui.resume.RunFeed` sends
        what comes after the client's ``Last-Event-ID`` (docs/doors/agui.md).
        """
        session = await self.ctx.session(session_id, self.ctx.authenticate(req))
        window = coalesce_query(req)
        header = req.headers.get("last-event-id")
        cursor = parse_cursor(header) if header else None
        if header and cursor is None:
            raise ApiError(
                422, "invalid_last_event_id", f"Last-Event-ID {header[:60]!r} is no event id"
            )
        messages = await self.node.messages_of(session)
        waiting = (await self.node.live_summary(session)).queued_turns
        waits = [] if isinstance(waiting, msgspec.UnsetType) else waiting
        record = await self.book.find(session, run_id, messages, [q.turn_id for q in waits])
        if record is None:
            raise ApiError(404, "run_not_found", f"no run {run_id[:60]!r} on {session.id}")
        history = messages[: record.history_len]
        release = once(await self.node.limits.open_stream(session.record.owner, "agui"))
        try:
            sub = RunSubscriber(session, self.config.stream, self.node.metrics, req.client)
            error = await self.ctx.subscribe(session, sub, since=record.start, coalesce_ms=window)
            if error is not None:
                raise ApiError(
                    404, "run_not_found", f"run {run_id[:60]!r} can no longer be replayed: {error}"
                )
        except BaseException:
            release()
            raise
        feed = RunFeed(
            RunMapper(session.id, run_id, record.turn_id, self._base), record.start, cursor, True
        )
        sent = [*messages, *(q.user_message for q in waits)]  # a queued run's is in no history
        own = next((m for m in sent if m.id == record.own), None) if record.own else None
        opening = feed.opening(self._opening(feed.mapper, record, history, own))
        return self._response(sub, feed, opening, release)

    def _opening(
        self, mapper: RunMapper, record: RunRecord, history: list[Message], own: Message | None
    ) -> list[ag.AguiEvent]:
        """A run's ``RUN_STARTED`` and ``MESSAGES_SNAPSHOT``, as it began (the same again):
        where the thread has messages before the run, those and the run's own (``own``: the
        client holds it, and ``@ag-ui/client`` drops what a snapshot leaves out;
        docs/doors/agui.md "Ids")."""
        limit = self.config.stream.snapshot_messages
        before = history[: record.history_len]
        sent = [*before, own] if before and own is not None else before  # none: no snapshot
        shown = sent[-limit:] if limit else []
        return mapper.start(shown, record.started_ms, self._snapshot_cap)

    @property
    def _base(self) -> str:
        """What a file's URL begins with: ``[server] public_url``, else nothing (a path)."""
        return self.config.server.public_url

    @property
    def _snapshot_cap(self) -> int:
        """A run's ``MESSAGES_SNAPSHOT`` fits as a snapshot frame does (docs/protocol.md §15)."""
        return self.config.stream.snapshot_max_bytes

    async def _known(self, thread_id: str, said: attachments.Sent) -> bool:
        """Whether the thread exists, when the message has files (else moot)."""
        if not said.file_ids:
            return False
        return (
            thread_id in self.node.sessions
            or await self.node.store.get_session(thread_id) is not None
        )

    async def _thread(self, thread_id: str, caller: str | None) -> Session:
        """The thread's session, created (owned by the caller's key) when unknown."""
        return await self._threads.get(thread_id, caller)

    async def _subscribe(self, session: Session, sub: RunSubscriber, window: int | None) -> int:
        """Join the session's hub, live; the run's start (every later event is above it)."""
        await self.ctx.subscribe(session, sub, coalesce_ms=window)
        return self.node.sequencer.last

    async def agui_cancel(self, req: Request, session_id: str) -> Response:
        """``POST /agui/{session_id}/cancel``: cancel the thread's turn (docs/protocol.md §8).

        With ``runId``, that run's turn: in flight, or queued behind another (then it
        never starts, docs/protocol.md §2 "A busy session"); 409 once it has ended.
        """
        session = await self.ctx.session(session_id, self.ctx.authenticate(req))
        body = self._decode(req, CancelRun) if req.body.strip() else CancelRun()
        turn_id = (await self.node.live_summary(session)).current_turn_id
        if body.run_id is not None:
            record = self.book.recall(session.id, body.run_id)
            # A run answered through another node of the deployment is not known here:
            # the turn in flight stands for it.
            if record is not None or self.node.placement.alone:
                turn_id = record.turn_id if record is not None else None
        which = f"run {body.run_id}" if body.run_id is not None else "run"
        not_in_flight = ApiError(409, "turn_not_in_flight", f"no {which} in flight on {session_id}")
        if turn_id is None:
            raise not_in_flight
        try:
            await self.node.cancel_turn(
                session, turn_id, body.reason or "user", f"agui:{req.client}"
            )
        except Refused as exc:  # the run's turn has ended (or its thread is a new one)
            if exc.code not in ("turn_not_in_flight", "turn_not_found"):
                raise
            raise not_in_flight from None
        return json_response(
            202, RunCancelling(session_id=session_id, run_id=body.run_id, turn_id=turn_id)
        )


# --- helpers -----------------------------------------------------------------------


def user_sent(messages: list[InputMessage], thread_id: str, base: str = "") -> attachments.Sent:
    """The last user message: a string, or its parts (docs/doors/agui.md "Files"):
    ``text``; ``image`` and ``document`` (AG-UI 1.0: a ``data`` source, base64
    with its ``mimeType``, or a ``url`` one); the legacy ``binary`` (``data``,
    ``url``, or ``id`` a file id of the thread). 422 otherwise, or when empty. ``base``:
    ``[server] public_url``, under whose path a URL may be."""
    content = _last_user(messages).content
    if isinstance(content, str):
        content = [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise ApiError(422, "invalid_body", "the user message's content must be text or parts")
    said = attachments.Sent(
        [_part(p, thread_id, f"content[{i}]", base) for i, p in enumerate(content)]
    )
    if said.empty():
        raise ApiError(422, "invalid_body", "content must not be empty")
    return said


def _part(part: object, thread_id: str, where: str, base: str) -> str | attachments.Attachment:
    """One part of a user message's content (:func:`user_sent`)."""
    if not isinstance(part, dict):
        raise ApiError(422, "invalid_body", f"{where}: a part is an object")
    kind = part.get("type")
    if kind == "text" and isinstance(part.get("text"), str):
        return str(part["text"])
    if kind in ("image", "document") and isinstance(part.get("source"), dict):
        source: dict[str, Any] = part["source"]
        value, mime = source.get("value"), source.get("mimeType")
        mime = mime if isinstance(mime, str) else None
        if source.get("type") == "data" and isinstance(value, str) and mime:
            return attachments.inline(value, mime, kind, where)
        if source.get("type") == "url" and isinstance(value, str):
            return attachments.attachment(value, mime, kind, thread_id, where, base)
        raise ApiError(
            422,
            "invalid_body",
            f"{where}: a {kind} part's source must be data (value, mimeType) or url "
            "(a provider's file handle names nothing the gateway holds)",
        )
    if kind == "binary" and isinstance(part.get("mimeType"), str):
        mime = part["mimeType"]
        data, url, ident = part.get("data"), part.get("url"), part.get("id")
        if isinstance(data, str):
            return attachments.inline(data, mime, None, where)
        if isinstance(url, str):
            return attachments.attachment(url, mime, None, thread_id, where, base)
        if isinstance(ident, str):
            path = f"/sessions/{thread_id}/files/{ident}"
            return attachments.attachment(path, mime, None, thread_id, where)
    shown = str(kind)[:40]
    raise ApiError(
        422,
        "invalid_body",
        f"{where}: user message parts must be text, image, document or binary, got {shown!r}",
    )


_DECISIONS: dict[object, str] = {"allow": "allow", "deny": "deny", True: "allow", False: "deny"}


def _resume_decisions(
    entries: list[ResumeEntry], pending: set[str]
) -> list[tuple[str, str, dict[str, Any] | None]]:
    """Each interrupt's decision; every open interrupt answered exactly once (AG-UI 1.0).

    An elicitation's interrupt (docs/protocol.md §11) answers with ``{"decision":
    "allow", "content": {...}}``, its ``responseSchema``; the content is checked
    against the elicitation's schema by the permissions, as on the native route.

    Raises:
        ApiError: 422 ``invalid_resume``: an unknown or repeated id, an open one
            unanswered, or a ``resolved`` payload that is no decision.
    """
    ids = [e.interrupt_id for e in entries]
    if not pending:  # the turn goes on, its approvals answered elsewhere: nothing to decide
        return []
    if len(set(ids)) != len(ids) or set(ids) != pending:
        raise ApiError(
            422,
            "invalid_resume",
            f"resume must answer each open interrupt once: open {sorted(pending)}, got {ids}",
        )
    out: list[tuple[str, str, dict[str, Any] | None]] = []
    for e in entries:
        if e.status == "cancelled":
            out.append((e.interrupt_id, "deny", None))
            continue
        p = e.payload
        content = None
        if isinstance(p, dict):
            content = p.get("content")
            if content is not None and not isinstance(content, dict):
                raise ApiError(
                    422,
                    "invalid_resume",
                    f"interrupt {e.interrupt_id}: content must be an object",
                )
            p = p.get("decision", p.get("approved"))
        decision = _DECISIONS.get(p) if isinstance(p, str | bool) else None
        if decision is None:
            raise ApiError(
                422,
                "invalid_resume",
                f'interrupt {e.interrupt_id}: payload must be {{"decision": "allow"|"deny"}}',
            )
        out.append((e.interrupt_id, decision, content))
    return out


def _last_user(messages: list[InputMessage]) -> InputMessage:
    """The run's message: the last ``user`` one (422 without one)."""
    last = next((m for m in reversed(messages) if m.role == "user"), None)
    if last is None:
        raise ApiError(422, "invalid_body", "messages has no user message")
    return last

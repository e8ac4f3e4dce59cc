"""The router of the HTTP API (PROTOCOL section 2), and the handshake of the session stream.

The table of routes (path, method, handler, what the API document says) is
gateway.server.route_table; the handlers are in gateway.server.handlers, one
module per resource. :class:`Api` answers a request from that table: the
boundary, the route, the caller's key, and the session the caller may see.

Every body is JSON and declared once as a ``msgspec.Struct``; every error is an
:class:`~gateway.errors.ApiError` turned into ``{"error": {"code", "message"}}``
by the transport. Statuses: 400 malformed JSON or query (a repeated query
parameter too), 401 missing credentials, 403 wrong key or attach token or
Origin, 404 unknown, 405 wrong method (with ``Allow``), 409 conflict, 413 too
large (transport), 415 a POST whose body is not declared
``Content-Type: application/json``, 421 a ``Host`` the gateway does not
answer, 422 schema-invalid.

The boundary (PROTOCOL section 15), in this order, before anything else on
every route and the stream handshake: the ``Host`` (421), the ``Origin``
(403, or a CORS preflight answered), a repeated query parameter (400); then
the route (404, 405), then a POST's content type (415), then the key.
Requiring ``application/json`` on every POST, an empty body included, is
what makes a browser preflight every cross-site POST: a page on another
origin can send ``text/plain`` (or nothing) without asking, and the
preflight is where its Origin is refused (gateway.server.auth.Boundary).

Authentication: where API keys are configured (``[auth] api_keys`` or
``api_keys_file``, gateway.server.auth), every route but ``/healthz`` needs
``Authorization: Bearer KEY``. The stream handshake is the exception: browsers
cannot set headers on a WebSocket, so the single-use attach token (obtained with
the key from ``GET /sessions/{id}``) is its credential; a handshake that does
carry a Bearer key (a non-browser client) is checked like any route.

Ownership (PROTOCOL section 2): a session belongs to the key that created it,
and to any other key it does not exist: :meth:`Api._session` answers 404
``session_not_found`` with the body an unknown id gets, on every route of the
session, and ``GET /sessions`` lists only what the caller sees (filtered in the
store query, so pages and ``before`` work). Sessions created without keys
(owner ``""``) are seen by every key.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import trio

from gateway import ui
from gateway.agui.mapping import RunMapper
from gateway.agui.shapes import CancelRun, InputMessage, ResumeEntry, RunAgentInput, RunCancelling
from gateway.agui.sse import RunSubscriber, sse, stream_run
from gateway.errors import ApiError, StoreError, unavailable
from gateway.ids import new_message_id, new_turn_id, now_ms
from gateway.node import Node
from gateway.protocol.filters import resolve_filter
from gateway.protocol.frames import Subscribe
from gateway.protocol.shapes import ContentBlock, Message
from gateway.server.auth import NO_OWNER, ApiKeys, Boundary, sees
from gateway.server.http import (
    Request,
    Response,
    StreamingResponse,
    WebSocketAccept,
    json_response,
)
from gateway.server.openapi import ID_PATTERN, Documented, Operation, path_regex
from gateway.server.request_parsing import decode as _decode
from gateway.server.request_parsing import decode_optional as _decode_optional
from gateway.server.request_parsing import json_content_type, known_query
from gateway.server.request_parsing import user_content as _user_content
from gateway.session import seam
from gateway.session.session import Session

SSE_HEADERS = [("cache-control", "no-cache"), ("x-accel-buffering", "no")]
"""An AG-UI run's stream: never cached, never buffered by a proxy (nginx reads the second)."""


# --- the table's entries ----------------------------------------------------------

Handler = Callable[..., Awaitable[Response | WebSocketAccept | StreamingResponse]]
"""A route's handler: ``handler(api, req, *ids)``, the path's ids in order."""


@dataclass(frozen=True, slots=True)
class Route:
    """One path of the route table, and per method its handler and :class:`Operation`.

    ``name`` is the path's name in the ``gateway_http_requests`` metric;
    ``path`` (with ``{id}`` segments) is where the API document lists it,
    ``None`` for a path it does not list (the web page).
    """

    pattern: re.Pattern[str]
    name: str
    methods: Mapping[str, tuple[Handler, Operation]]
    path: str | None


def route(path: str, name: str, **methods: tuple[Handler, Operation]) -> Route:
    """A route of the API: ``path`` with ``{id}`` segments, each captured for the handler."""
    return Route(path_regex(path), name, methods, path)


def page_route(pattern: str, name: str, handler: Handler, operation: Operation) -> Route:
    """A route of the web page: GET (and so HEAD), a regex ``pattern``, undocumented."""
    return Route(re.compile(pattern + "$"), name, {"GET": (handler, operation)}, None)


# --- the router -------------------------------------------------------------------


class Api:
    """The router over one :class:`~gateway.node.Node`, answering from a route table.

    The handlers reach the node and the caller through it (:meth:`_authenticate`,
    :meth:`_session`); the AG-UI handlers are its own methods.
    """

    def __init__(self, node: Node, table: Iterable[Route], keys: ApiKeys | None = None) -> None:
        self.node = node
        self.config = node.config
        self.keys = keys if keys is not None else ApiKeys(node.config.auth)
        self.boundary = Boundary(node.config)
        table = list(table)
        # What the router matches, in table order: (pattern, method: handler, name).
        self.routes: list[tuple[re.Pattern[str], dict[str, Handler], str]] = [
            (r.pattern, {m: h for m, (h, _) in r.methods.items()}, r.name) for r in table
        ]
        self.documented = [  # what /openapi.json says of each route
            Documented(r.path, method, handler.__name__, operation)
            for r in table
            if r.path is not None
            for method, (handler, operation) in r.methods.items()
        ]
        self._operations = {  # (route, method): its rules
            (r.name, method): operation
            for r in table
            for method, (_, operation) in r.methods.items()
        }
        self.documents: dict[bool, bytes] = {}  # the API document (with or without auth)
        self.page_files: dict[str, ui.Asset] | None = None  # the web page's, read on first use
        self._agui_runs: dict[str, tuple[str, str]] = {}  # session: its last AG-UI (run, turn)
        self._agui_creating: dict[str, trio.Event] = {}  # thread ids being created

    async def __call__(self, req: Request) -> Response | WebSocketAccept | StreamingResponse:
        """Answer ``req``: the boundary first (module docstring), then its route."""
        self.boundary.check_host(req.headers.get("host"))  # 421
        origin = req.headers.get("origin")
        listed = self.boundary.check_origin(origin, req.scheme, req.headers.get("host"))  # 403
        if (
            req.method == "OPTIONS"
            and origin is not None
            and "access-control-request-method" in req.headers
        ):  # a CORS preflight, of an allowed origin (any other was refused just above)
            headers = self.boundary.preflight_headers(listed) if listed else []
            return Response(204, b"", headers=headers)
        try:
            answer = await self._route(req)
        except ApiError as exc:
            if listed:  # the page can then read why it was refused
                exc.headers = (*exc.headers, *self.boundary.cors_headers(listed))
            raise
        except StoreError as exc:
            unanswered = unavailable(exc)
            if listed:
                unanswered.headers = (*unanswered.headers, *self.boundary.cors_headers(listed))
            raise unanswered from None
        if listed and not isinstance(answer, WebSocketAccept):  # (no CORS for a WebSocket)
            answer.headers = [*answer.headers, *self.boundary.cors_headers(listed)]
        return answer

    async def _route(self, req: Request) -> Response | WebSocketAccept | StreamingResponse:
        if req.repeated_query:
            name = req.repeated_query[0]
            raise ApiError(
                400,
                "duplicate_query_parameter",
                f"query parameter {name[:100]!r} is given more than once",
            )
        for pattern, methods, name in self.routes:
            match = pattern.match(req.path)
            if match is None:
                continue
            handler = methods.get(req.method)
            if handler is None and req.method == "HEAD":
                handler = methods.get("GET")  # RFC 9110 9.3.2: GET without the body
            if handler is None:
                allow = ", ".join([*methods, "HEAD"] if "GET" in methods else methods)
                raise ApiError(
                    405,
                    "method_not_allowed",
                    f"{req.method} {req.path}: use {allow}",
                    headers=(("Allow", allow),),
                )
            # The rules the document states, read from the same table (HEAD: the GET's).
            operation = self._operations[name, req.method if req.method in methods else "GET"]
            if req.method == "POST":
                json_content_type(req)  # 415
            if operation.auth == "required":
                self._authenticate(req)
            known_query(req, operation)
            try:
                answer = await handler(self, req, *match.groups())
            except ApiError as exc:
                self.node.metrics.http_requests.labels(name, str(exc.status)).inc()
                raise
            status = 101 if isinstance(answer, WebSocketAccept) else answer.status
            self.node.metrics.http_requests.labels(name, str(status)).inc()
            return answer
        raise ApiError(404, "not_found", f"no route for {req.path}")

    def _authenticate(self, req: Request) -> str | None:
        """The caller: the id of its API key, or ``None`` where no keys are configured.

        Raises:
            ApiError: 401 ``unauthorized`` without ``Authorization: Bearer``, 403
                ``forbidden`` for a key that is not (or no longer) accepted.
        """
        if not self.keys.enabled:
            return None
        header = req.headers.get("authorization", "")
        scheme, _, key = header.partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            raise ApiError(401, "unauthorized", "send Authorization: Bearer <api key>")
        caller = self.keys.identify(key.strip())
        if caller is None:
            raise ApiError(403, "forbidden", "the API key is not valid")
        return caller

    async def _session(self, session_id: str, caller: str | None) -> Session:
        """The session, as ``caller`` may see it (PROTOCOL section 2).

        Another key's session is answered exactly as an unknown id (same status,
        code and message: no oracle), and is not even loaded from the store: a
        stored session's owner is read first, one store read as for an unknown id.

        Raises:
            ApiError: 404 ``session_not_found``.
        """
        unknown = ApiError(404, "session_not_found", f"no session {session_id!r}")
        if caller is not None and session_id not in self.node.sessions:
            record = await self.node.store.get_session(session_id)
            if record is not None and not sees(caller, record.owner):
                raise unknown
        session: Session | None = await self.node.get_session(session_id)
        if session is None or not sees(caller, session.record.owner):
            raise unknown
        return session

    async def _counted_turn(self, key: str, session: Session, message: Message) -> None:
        """Submit a turn within the key's rate limit; return once it is durable (section 9).

        The turn is counted in the step that checks the limit (two racing
        requests cannot both take the last one) and refunded if it is refused
        (409, or sent to an owner that could not take it); one accepted but
        not yet durable (503 ``store_unavailable``) stays counted.
        """
        limits = self.node.limits
        limits.check_turn(key)  # 429 rate_limited, with Retry-After
        limits.count_turn(key)
        try:
            await self.node.submit_turn(session, message)  # on whichever node runs it
        except ApiError as exc:
            if exc.code != "store_unavailable":
                limits.refund_turn(key)
            raise

    # --- the AG-UI handlers (docs/protocol.md "AG-UI") -----------------------------

    async def agui_run(self, req: Request) -> StreamingResponse:
        """``POST /agui``: one AG-UI run, the turn it starts or resumes (docs/protocol.md "AG-UI").

        The run's subscriber joins the session's hub (through the seam) before
        the turn is submitted or its approvals decided, so the stream misses
        nothing; every refusal comes before the stream starts, as a JSON error.
        """
        caller = self._authenticate(req)
        body = _decode(req, RunAgentInput)
        # What refuses a new run is checked before its thread is made: a run
        # refused 422 or 429 leaves no session behind (nor a count of one).
        content = None if body.resume else _agui_content(body.messages)
        if content is not None:
            self.node.limits.check_turn(caller or NO_OWNER)  # counted with the turn, below
        session = await self._agui_thread(body.thread_id, caller)
        state = await self.node.live_summary(session)  # the owner's, wherever it runs
        history = await self.node.messages_of(session)
        limit = self.config.stream.snapshot_messages
        sub = RunSubscriber(session, self.config.stream.queue_max_events)
        if body.resume and state.current_turn_id is None:
            # Answered elsewhere (another client, the WebSocket protocol, a
            # timeout) and the turn has ended: the run says so and finishes.
            return self._agui_closed_run(body, history[-limit:] if limit else [])
        if body.resume:
            decisions = _resume_decisions(
                body.resume, {p.perm_id for p in state.pending_permissions}
            )
            assert state.current_turn_id is not None
            turn_id = state.current_turn_id
            await self._agui_subscribe(session, sub)
            try:
                for perm_id, decision, answer in decisions:
                    await self.node.decide_permission(session, perm_id, decision, answer)
            except BaseException:
                session.hub.unsubscribe(sub)
                raise
        else:
            assert content is not None
            if state.pending_permissions:
                raise ApiError(
                    409,
                    "turn_in_progress",
                    f"turn {state.current_turn_id or '?'} on {session.id} waits for "
                    "approval: send a run with resume",
                )
            turn_id = new_turn_id()
            message = Message(
                new_message_id(), session.id, turn_id, "user", content, "complete", now_ms()
            )
            await self._agui_subscribe(session, sub)
            try:
                await self._counted_turn(caller or NO_OWNER, session, message)
            except BaseException:
                session.hub.unsubscribe(sub)
                raise
        self._agui_runs[session.id] = (body.run_id, turn_id)
        mapper = RunMapper(body.thread_id, body.run_id, turn_id)
        opening = mapper.start(history[-limit:] if limit else [], now_ms(), self._snapshot_cap)
        interval = self.config.stream.ping_interval_s

        async def run(send: Callable[[bytes], Awaitable[None]]) -> None:
            await stream_run(sub, mapper, opening, send, interval)

        return StreamingResponse(
            run,
            headers=SSE_HEADERS,
            abandon=lambda: sub.leave("client_closed"),
        )

    def _agui_closed_run(self, body: RunAgentInput, history: list[Message]) -> StreamingResponse:
        """A resume of interrupts that were answered elsewhere, on a thread whose turn ended.

        Its entries are stale, not wrong: an AG-UI client keeps its interrupts
        until a run finishes, so the run finishes at once (``RUN_STARTED``, the
        thread's ``MESSAGES_SNAPSHOT`` with how the turn ended, ``RUN_FINISHED``)
        and the front end is free again (docs/protocol.md "AG-UI").
        """
        mapper = RunMapper(body.thread_id, body.run_id, "")
        opening = mapper.start(history, now_ms(), self._snapshot_cap)
        events = [*opening, mapper.idle_finish(now_ms())]

        async def run(send: Callable[[bytes], Awaitable[None]]) -> None:
            await send(sse(events))

        return StreamingResponse(run, headers=SSE_HEADERS)

    @property
    def _snapshot_cap(self) -> int:
        """An AG-UI run's ``MESSAGES_SNAPSHOT`` fits as a snapshot frame does (PROTOCOL §15)."""
        return self.config.stream.snapshot_max_bytes

    async def _agui_thread(self, thread_id: str, caller: str | None) -> Session:
        """The thread's session, created (owned by the caller's key) when unknown."""
        if not _THREAD_ID.fullmatch(thread_id):
            raise ApiError(
                422,
                "invalid_thread_id",
                f"threadId must be 1 to 128 of A-Z a-z 0-9 _ -, got {thread_id[:40]!r}",
            )
        creating = self._agui_creating.get(thread_id)
        if creating is not None:  # a run racing this one is creating it: then it is known
            await creating.wait()
        if thread_id in self.node.sessions or await self.node.store.get_session(thread_id):
            return await self._session(thread_id, caller)  # another key's: 404
        # Created meanwhile, during the store read: being created, or already
        # done (its creation ended before this read's answer came back; the
        # read ran before its commit): either way not this run's to create.
        if thread_id in self._agui_creating or thread_id in self.node.sessions:
            return await self._agui_thread(thread_id, caller)
        self._agui_creating[thread_id] = done = trio.Event()
        try:
            return await self.node.create_session(owner=caller or NO_OWNER, session_id=thread_id)
        finally:
            del self._agui_creating[thread_id]
            done.set()

    async def _agui_subscribe(self, session: Session, sub: RunSubscriber) -> None:
        resolved, key = resolve_filter("preset:full")
        await seam.subscribe(
            session, sub, Subscribe("preset:full"), resolved, key, self.config.stream
        )

    async def agui_cancel(self, req: Request, session_id: str) -> Response:
        """``POST /agui/{session_id}/cancel``: cancel the thread's turn (PROTOCOL section 8)."""
        session = await self._session(session_id, self._authenticate(req))
        body = _decode_optional(req, CancelRun) or CancelRun()
        turn_id = (await self.node.live_summary(session)).current_turn_id
        run = self._agui_runs.get(session.id)
        # A run started through another node of the deployment is not known here.
        known = run is not None or self.node.cluster is None
        if turn_id is None or (body.run_id is not None and known and run != (body.run_id, turn_id)):
            raise ApiError(
                409, "turn_not_in_flight", f"no run {body.run_id or ''} in flight on {session_id}"
            )
        await self.node.cancel_turn(session, turn_id, body.reason or "user", f"agui:{req.client}")
        return json_response(
            202, RunCancelling(session_id=session_id, run_id=body.run_id, turn_id=turn_id)
        )


# --- AG-UI's helpers ---------------------------------------------------------------


_THREAD_ID = re.compile(f"(?={ID_PATTERN}$).{{1,128}}")


def _agui_content(messages: list[InputMessage]) -> list[ContentBlock]:
    """The last user message's text: a string, or its ``text`` parts (422 otherwise)."""
    last = next((m for m in reversed(messages) if m.role == "user"), None)
    if last is None:
        raise ApiError(422, "invalid_body", "messages has no user message")
    content = last.content
    if isinstance(content, list):
        texts = [p.get("text") for p in content if isinstance(p, dict) and p.get("type") == "text"]
        if len(texts) != len(content) or not all(isinstance(t, str) for t in texts):
            raise ApiError(422, "invalid_body", "user message parts must all be text")
        content = "".join(str(t) for t in texts)
    if not isinstance(content, str):
        raise ApiError(422, "invalid_body", "the user message's content must be text")
    return _user_content(content)


_DECISIONS: dict[object, str] = {"allow": "allow", "deny": "deny", True: "allow", False: "deny"}


def _resume_decisions(
    entries: list[ResumeEntry], pending: set[str]
) -> list[tuple[str, str, dict[str, Any] | None]]:
    """Each interrupt's decision; every open interrupt answered exactly once (AG-UI 1.0).

    An elicitation's interrupt (PROTOCOL section 11) answers with ``{"decision":
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

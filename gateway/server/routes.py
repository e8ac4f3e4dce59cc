"""The HTTP routes of PROTOCOL section 2, and the handshake of the session stream.

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
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import msgspec
import trio

from gateway import ui
from gateway.agui.mapping import RunMapper
from gateway.agui.shapes import CancelRun, InputMessage, ResumeEntry, RunAgentInput, RunCancelling
from gateway.agui.sse import RunSubscriber, sse, stream_run
from gateway.errors import ApiError, Refused, StoreError, unavailable
from gateway.ids import new_message_id, new_turn_id, now_ms
from gateway.metrics import CONTENT_TYPE
from gateway.node import Node
from gateway.protocol.filters import resolve_filter
from gateway.protocol.frames import Subscribe
from gateway.protocol.http import (
    Accepted,
    AgentList,
    AgentListing,
    CancelAccepted,
    CancelTurn,
    Compact,
    CreateSession,
    Feedback,
    Health,
    MessagePage,
    PermissionDecision,
    Ready,
    SessionAttach,
    SessionCreated,
    SessionList,
    SessionListing,
    SubmitTurn,
    TurnAccepted,
)
from gateway.protocol.shapes import ContentBlock, Message, TextBlock
from gateway.server.auth import NO_OWNER, ApiKeys, Boundary, sees
from gateway.server.connection import StreamConnection
from gateway.server.http import (
    Request,
    Response,
    StreamingResponse,
    WebSocketAccept,
    json_response,
)
from gateway.server.openapi import (
    ID_PATTERN,
    Documented,
    Operation,
    Query,
    build_document,
    path_regex,
)
from gateway.server.refusals import as_http, http_error
from gateway.server.websocket import WebSocket
from gateway.session import seam
from gateway.session.session import Session, summary_of

SSE_HEADERS = [("cache-control", "no-cache"), ("x-accel-buffering", "no")]
"""An AG-UI run's stream: never cached, never buffered by a proxy (nginx reads the second)."""

# --- query parameters (for the API document; the handlers read them) --------------

LIMIT = Query(
    "limit",
    {"type": "integer", "minimum": 1, "maximum": 200, "default": 50},
    "How many to answer, 1 to 200 (400 `invalid_query` if not an integer, 422 if out of range).",
)
BEFORE_SESSION = Query(
    "before", {"type": "string"}, "A session id: the page of sessions older than it."
)
BEFORE_MESSAGE = Query(
    "before", {"type": "string"}, "A message id: the page of messages before it."
)
ATTACH = Query(
    "attach",
    {"type": "string"},
    "The single-use attach token of `GET /sessions/{session_id}`.",
    required=True,
)


# --- routing -------------------------------------------------------------------

T = TypeVar("T")
Route = Callable[..., Awaitable[Response | WebSocketAccept | StreamingResponse]]


class Api:
    """The route table and the handlers, over one :class:`~gateway.node.Node`."""

    def __init__(self, node: Node, keys: ApiKeys | None = None) -> None:
        self.node = node
        self.config = node.config
        self.keys = keys if keys is not None else ApiKeys(node.config.auth)
        self.boundary = Boundary(node.config)
        self.routes: list[tuple[re.Pattern[str], dict[str, Route], str]] = []
        self.documented: list[Documented] = []  # what /openapi.json says of each route
        self._operations: dict[tuple[str, str], Operation] = {}  # (route, method): its rules
        self._openapi: dict[bool, bytes] = {}  # the document, built once (with or without auth)
        self._agui_runs: dict[str, tuple[str, str]] = {}  # session: its last AG-UI (run, turn)
        self._agui_creating: dict[str, trio.Event] = {}  # thread ids being created
        session = "/sessions/{session_id}"
        self._add(
            "/healthz",
            "healthz",
            GET=(self.healthz, Operation("Liveness probe", Health, auth="none")),
        )
        self._add(
            "/readyz",
            "readyz",
            GET=(
                self.readyz,
                Operation(
                    "Readiness probe",
                    Ready,
                    auth="none",
                    errors={503: ("draining", "store_unavailable")},
                    description="200 while the gateway accepts work; 503 `draining` once "
                    "a graceful shutdown began (the listener stays open until the turns "
                    "in flight are closed), so a load balancer stops sending; 503 "
                    "`store_unavailable` (with `Retry-After`) while the store's commits "
                    "fail, or for good once its file was deleted or replaced.",
                ),
            ),
        )
        self._add(
            "/metrics",
            "metrics",
            GET=(
                self.metrics,
                Operation(
                    "Prometheus metrics",
                    None,
                    media_type="text/plain",
                    description="The Prometheus text exposition format.",
                ),
            ),
        )
        self._add(
            "/openapi.json",
            "openapi",
            GET=(self.openapi, Operation("This document (OpenAPI 3.1)", None)),
        )
        self._add(
            "/agents",
            "agents",
            GET=(
                self.list_agents,
                Operation(
                    "The agents a session may run",
                    AgentList,
                    description="Each agent's runtime, model and tools (PROTOCOL section 11); "
                    "never its system prompt. `default` marks the agent of a POST /sessions "
                    "that names none.",
                ),
            ),
        )
        self._add(
            "/sessions",
            "sessions",
            GET=(
                self.list_sessions,
                Operation(
                    "List sessions, newest first",
                    SessionList,
                    query=(LIMIT, BEFORE_SESSION),
                    errors={404: ("session_not_found",)},
                ),
            ),
            POST=(
                self.create_session,
                Operation(
                    "Create a session",
                    SessionCreated,
                    201,
                    body=CreateSession,
                    body_required=False,
                    errors={
                        422: ("invalid_workspace", "invalid_model", "unknown_agent"),
                        429: ("too_many_sessions",),
                        503: ("store_unavailable",),
                    },
                    description="An empty body takes every default. Answered once the "
                    "session is committed.",
                ),
            ),
        )
        self._add(
            session,
            "session",
            GET=(
                self.get_session,
                Operation(
                    "A session, with a fresh attach token and its stream's URL",
                    SessionAttach,
                    description="Every call issues a new single-use attach token.",
                ),
            ),
        )
        self._add(
            f"{session}/messages",
            "messages",
            GET=(
                self.list_messages,
                Operation(
                    "A session's messages, oldest first",
                    MessagePage,
                    query=(LIMIT, BEFORE_MESSAGE),
                    errors={404: ("message_not_found",)},
                ),
            ),
        )
        self._add(
            f"{session}/messages/{{message_id}}",
            "message",
            GET=(
                self.get_message,
                Operation(
                    "One message of a session, whole",
                    Message,
                    errors={404: ("message_not_found",)},
                    description="A finished message, every block whole: what a snapshot "
                    'sent cut (`"truncated": true`, PROTOCOL section 15). A message '
                    "still streaming, another session's message or an unknown id: 404 "
                    "`message_not_found` (the streaming one's `message.complete` "
                    "carries it whole).",
                ),
            ),
        )
        self._add(
            f"{session}/turns",
            "turns",
            POST=(
                self.submit_turn,
                Operation(
                    "Start a turn",
                    TurnAccepted,
                    202,
                    body=SubmitTurn,
                    errors={
                        409: ("turn_in_progress", "session_too_large", "subagent_session"),
                        429: ("rate_limited",),
                        503: (
                            "shutting_down",
                            "store_unavailable",
                            "session_elsewhere",
                            "over_capacity",
                        ),
                    },
                    description="`content` is a string or a list of `text` blocks (other "
                    "block types: 422). Answered once the turn is durable. A session holding "
                    "`max_session_mb` of stored data or more takes no more turns: 409 "
                    "`session_too_large`. A `claude-code` agent's turn first waits (up to "
                    "5 s) for one of its `max_processes` on the node: 503 `over_capacity`, "
                    "with `Retry-After`, when none came free.",
                ),
            ),
        )
        self._add(
            f"{session}/turns/{{turn_id}}/cancel",
            "cancel",
            POST=(
                self.cancel_turn,
                Operation(
                    "Cancel a turn in flight",
                    CancelAccepted,
                    202,
                    body=CancelTurn,
                    body_required=False,
                    errors={404: ("turn_not_found",), 409: ("turn_not_in_flight",)},
                ),
            ),
        )
        self._add(
            f"{session}/permissions/{{perm_id}}",
            "permission",
            POST=(
                self.decide,
                Operation(
                    "Allow or deny a tool call waiting for permission, or answer an elicitation",
                    Accepted,
                    202,
                    body=PermissionDecision,
                    errors={
                        404: ("permission_not_found",),
                        409: ("permission_resolved",),
                        422: ("invalid_content",),
                    },
                ),
            ),
        )
        self._add(
            f"{session}/compact",
            "compact",
            POST=(
                self.compact,
                Operation(
                    "Compact the model's context now",
                    Accepted,
                    202,
                    body=Compact,
                    body_required=False,
                    errors={
                        409: ("turn_in_progress", "nothing_to_compact"),
                        503: ("shutting_down", "session_elsewhere"),
                    },
                    description='PROTOCOL section 12, `trigger: "manual"`: the messages '
                    "before the latest turn are replaced, for the model only, by one `context` "
                    "message (a summary); `context.compacting` and `context.compacted` follow "
                    "in the stream (turn_id null). Runs between turns: a turn submitted "
                    "meanwhile starts after it. 409 `nothing_to_compact` when the model's "
                    "context holds only the latest turn.",
                ),
            ),
        )
        self._add(
            f"{session}/feedback",
            "feedback",
            POST=(
                self.feedback,
                Operation(
                    "Rate a message",
                    Accepted,
                    202,
                    body=Feedback,
                    errors={404: ("message_not_found",)},
                    description="Emits `feedback.recorded` on the message's turn.",
                ),
            ),
        )
        self._add(
            f"{session}/stream",
            "stream",
            GET=(
                self.stream,
                Operation(
                    "The session's WebSocket (the handshake)",
                    None,
                    101,
                    query=(ATTACH,),
                    auth="optional",
                    errors={
                        400: ("invalid_websocket_handshake",),
                        403: (
                            "attach_token_required",
                            "attach_token_invalid",
                            "attach_token_expired",
                        ),
                        426: ("upgrade_required", "unsupported_websocket_version"),
                        503: ("over_capacity",),
                    },
                    description="A WebSocket handshake (RFC 6455: `Upgrade: websocket`, "
                    "`Connection: Upgrade`, `Sec-WebSocket-Version: 13`, a "
                    "`Sec-WebSocket-Key`), refused with a status before any upgrade: an "
                    "unknown session first (404), then the attach token (403). Its "
                    "credential is the attach token, not the API key.",
                ),
            ),
        )
        self._add(
            "/agui",
            "agui",
            POST=(
                self.agui_run,
                Operation(
                    "Run an AG-UI agent turn (SSE of AG-UI events)",
                    None,
                    body=RunAgentInput,
                    media_type="text/event-stream",
                    errors={
                        404: ("session_not_found",),
                        409: ("turn_in_progress", "session_too_large"),
                        422: ("invalid_thread_id", "invalid_resume"),
                        429: ("rate_limited", "too_many_sessions"),
                        503: (
                            "shutting_down",
                            "store_unavailable",
                            "session_elsewhere",
                            "session_owner_unreachable",
                        ),
                    },
                    description="An AG-UI `RunAgentInput`; the answer is `text/event-stream`, "
                    "one `data: {AG-UI event}` per event and a `: ping` comment after "
                    '`ping_interval_s` idle (docs/protocol.md "AG-UI"). `threadId` is a '
                    "session id (an unknown one is created, owned by the caller's key); "
                    "the last `user` message's text is the turn's content; the run is the "
                    "turn. A run that stops for a tool approval ends with `RUN_FINISHED` "
                    "whose outcome is `interrupt`; the next run on the thread carries "
                    '`resume`, one entry per interrupt (`payload`: `{"decision": '
                    '"allow"|"deny"}`; `cancelled`: deny). Closing the stream does not '
                    "cancel the turn: `POST /agui/{session_id}/cancel` (the threadId) does. "
                    "Errors before the stream starts are the JSON error bodies.",
                ),
            ),
        )
        self._add(
            "/agui/{session_id}/cancel",
            "agui_cancel",
            POST=(
                self.agui_cancel,
                Operation(
                    "Cancel the AG-UI run (the turn) in flight on a thread",
                    RunCancelling,
                    202,
                    body=CancelRun,
                    body_required=False,
                    errors={409: ("turn_not_in_flight",)},
                    description="`session_id` is the run's `threadId`. The same cancellation "
                    "as `POST /sessions/{id}/turns/{turn_id}/cancel` (PROTOCOL section 8): "
                    "every client of the session sees it, and the run's stream ends with "
                    "`RUN_FINISHED` (outcome `cancelled`). With `runId`, 409 unless that "
                    "run's turn is the one in flight.",
                ),
            ),
        )
        # The web page (gateway.ui): public (it holds no data), and not part of the
        # API document (it is not the API); its asset names have dots, unlike ids.
        self._assets: dict[str, ui.Asset] | None = None  # read on first use
        self._add_page("/", "page", self.page, Operation("The web page", None, auth="none"))
        asset = Operation("A file of the web page", None, auth="none")
        self._add_page("/ui/([^/]+)", "ui", self.asset, asset)

    def _add(self, path: str, name: str, **methods: tuple[Route, Operation]) -> None:
        """One route: ``path`` with ``{id}`` segments, and per method its handler and document.

        The handler gets the path's ids as positional arguments, in order.
        """
        self.routes.append((path_regex(path), {m: h for m, (h, _) in methods.items()}, name))
        for method, (handler, operation) in methods.items():
            self.documented.append(Documented(path, method, handler.__name__, operation))
            self._operations[name, method] = operation

    def _add_page(self, pattern: str, name: str, handler: Route, operation: Operation) -> None:
        """A route of the web page: GET (and so HEAD), a regex ``pattern``, undocumented."""
        self.routes.append((re.compile(pattern + "$"), {"GET": handler}, name))
        self._operations[name, "GET"] = operation

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
            unanswered = http_error(unavailable(exc))
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
                _json_content_type(req)  # 415
            if operation.auth == "required":
                self._authenticate(req)
            _known_query(req, operation)
            try:
                answer = await handler(req, *match.groups())
            except (ApiError, Refused) as exc:
                error = as_http(exc)  # a refusal: its status by the table
                self.node.metrics.http_requests.labels(name, str(error.status)).inc()
                raise error from None
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

    # --- handlers ------------------------------------------------------------------

    async def healthz(self, req: Request) -> Response:
        return json_response(200, Health())

    async def readyz(self, req: Request) -> Response:
        """Readiness (the README's "Operating it"): 503 ``draining`` once shutdown began.

        And 503 ``store_unavailable`` whenever commits fail (PROTOCOL section
        15: a full disk, Redis away, the store's file deleted or replaced),
        until one lands again: the gateway would answer a write with 503 then.
        """
        if self.node.shutting_down:
            raise ApiError(
                503, "draining", "the gateway is shutting down; send new work to another node"
            )
        failure = self.node.store.failure
        if failure is not None:
            raise unavailable(failure)
        return json_response(200, Ready())

    async def metrics(self, req: Request) -> Response:
        return Response(200, self.node.metrics.render(), content_type=CONTENT_TYPE)

    async def openapi(self, req: Request) -> Response:
        """``GET /openapi.json``: the OpenAPI 3.1 document of this table (PROTOCOL section 2).

        Built from the route table and the Structs on first use, then cached;
        the ``bearer`` scheme is in it while API keys are configured.
        """
        auth = self.keys.enabled  # keys can come and go with the keys file (SIGHUP)
        document = self._openapi.get(auth)
        if document is None:
            document = self._openapi[auth] = build_document(
                self.documented, auth=auth, server_url=self.config.server.public_url
            )
        return Response(200, document)

    async def create_session(self, req: Request) -> Response:
        owner = self._authenticate(req) or NO_OWNER
        body = _decode_optional(req, CreateSession) or CreateSession()
        session = await self.node.create_session(  # 429 past max_sessions_per_key
            workspace_path=body.workspace_path,
            model=body.model,
            agent=body.agent,
            metadata=body.metadata,
            owner=owner,
        )
        r = session.record
        return json_response(201, SessionCreated(r.id, r.active_model, r.created_at, r.agent))

    async def list_agents(self, req: Request) -> Response:
        """``GET /agents`` (PROTOCOL sections 2, 11): what a session may pick."""
        self._authenticate(req)
        agents = self.node.agents
        listing = [
            AgentListing(
                profile.name,
                profile.runtime,
                profile.model,
                profile.name == agents.default,
                self.node.tool_infos(profile.name),
            )
            for profile in agents.profiles()
        ]
        return json_response(200, AgentList(listing))

    async def list_sessions(self, req: Request) -> Response:
        caller = self._authenticate(req)
        limit = _int_query(req, "limit", default=50, low=1, high=200)
        await self.node.durable_or_503()  # the page shows every session created so far
        before = req.query.get("before")
        if before is not None:
            cursor = await self.node.store.get_session(before)
            if cursor is None or not sees(caller, cursor.owner):
                raise ApiError(404, "session_not_found", f"no session {before!r} to page before")
        records, has_more = await self.node.store.list_sessions(
            limit=limit, before=before, visible_to=caller
        )
        listings = []
        for rec in records:
            live = self.node.sessions.get(rec.id)
            here = live is not None and self.node.runs_here(rec.id)  # else: the store's record
            summary = (
                live.summary()
                if live and here
                else summary_of(rec, tools=self.node.tool_infos(rec.agent))
            )
            listings.append(SessionListing(summary, rec.created_at, rec.metadata))
        return json_response(200, SessionList(listings, has_more))

    async def get_session(self, req: Request, session_id: str) -> Response:
        session = await self._session(session_id, self._authenticate(req))
        token = await self.node.issue_token(session.id)
        url = f"{self._ws_base(req)}/sessions/{session.id}/stream?attach={token}"
        record = session.record
        return json_response(
            200, SessionAttach(session.id, record.active_model, token, url, record.agent)
        )

    def _ws_base(self, req: Request) -> str:
        """Where ``ws_url`` points (PROTOCOL section 2): the public URL, else this request's Host.

        Without ``public_url``, the scheme follows the request's: ``wss://``
        when a trusted proxy says the client came over https
        (``X-Forwarded-Proto``, see :func:`gateway.server.http.forwarded_client`).
        """
        public: str = self.config.server.public_url.rstrip("/")
        if public:
            return "ws" + public.removeprefix("http")  # http -> ws, https -> wss
        server = self.config.server
        host = req.headers.get("host") or f"{server.host}:{server.port}"
        return f"{'wss' if req.scheme == 'https' else 'ws'}://{host}"

    async def list_messages(self, req: Request, session_id: str) -> Response:
        session = await self._session(session_id, self._authenticate(req))
        limit = _int_query(req, "limit", default=50, low=1, high=200)
        messages = await self.node.messages_of(session)
        end = len(messages)
        before = req.query.get("before")
        if before is not None:
            end = next((i for i, m in enumerate(messages) if m.id == before), -1)
            if end < 0:
                raise ApiError(404, "message_not_found", f"no message {before!r} in {session_id}")
        start = max(0, end - limit)
        return json_response(200, MessagePage(messages[start:end], start > 0))

    async def get_message(self, req: Request, session_id: str, message_id: str) -> Response:
        """One finished message, whole (PROTOCOL section 15: what a snapshot cut).

        The session's own messages only, as the caller may see the session
        (:meth:`_session`); the newest are the likeliest, so they are looked
        at first.
        """
        session = await self._session(session_id, self._authenticate(req))
        for message in reversed(await self.node.messages_of(session)):
            if message.id == message_id:
                return json_response(200, message)
        raise ApiError(404, "message_not_found", f"no message {message_id!r} in {session_id}")

    async def submit_turn(self, req: Request, session_id: str) -> Response:
        caller = self._authenticate(req)
        session = await self._session(session_id, caller)
        body = _decode(req, SubmitTurn)
        content = _user_content(body.content)
        parent = session.parent
        if parent is not None and self.node.agents[parent.record.agent].runtime == "claude-code":
            # Its turns are Claude Code's sub-agent's, run by its parent's CLI
            # (gateway.runtimes.claude_code): one sent here would start a new,
            # unrelated Claude Code conversation.
            raise ApiError(
                409,
                "subagent_session",
                f"{session.id} is a Claude Code sub-agent of {parent.id}: send turns to"
                f" {parent.id}",
            )
        turn_id = new_turn_id()
        message = Message(
            new_message_id(), session.id, turn_id, "user", content, "complete", now_ms()
        )
        key = caller or NO_OWNER
        await self._counted_turn(key, session, message)
        return json_response(202, TurnAccepted(turn_id))

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
        except Refused as exc:
            if exc.code != "store_unavailable":
                limits.refund_turn(key)
            raise

    async def cancel_turn(self, req: Request, session_id: str, turn_id: str) -> Response:
        session = await self._session(session_id, self._authenticate(req))
        body = _decode_optional(req, CancelTurn) or CancelTurn()
        await self.node.cancel_turn(session, turn_id, body.reason or "user", f"http:{req.client}")
        return json_response(202, CancelAccepted(turn_id))

    async def decide(self, req: Request, session_id: str, perm_id: str) -> Response:
        session = await self._session(session_id, self._authenticate(req))
        body = _decode(req, PermissionDecision)
        await self.node.decide_permission(session, perm_id, body.decision, body.content)
        return json_response(202, Accepted("resolved"))

    async def compact(self, req: Request, session_id: str) -> Response:
        session = await self._session(session_id, self._authenticate(req))
        _decode_optional(req, Compact)
        await self.node.compact(session)
        return json_response(202, Accepted("compacting"))

    async def feedback(self, req: Request, session_id: str) -> Response:
        session = await self._session(session_id, self._authenticate(req))
        body = _decode(req, Feedback)
        await self.node.record_feedback(session, body.message_id, body.rating, body.comment)
        return json_response(202, Accepted("recorded"))

    async def stream(self, req: Request, session_id: str) -> WebSocketAccept:
        """The handshake of ``/sessions/{id}/stream``, refused before any upgrade (PROTOCOL §2).

        Its Host and Origin were checked as every request's (:meth:`__call__`).
        """
        # A browser cannot send Authorization: the token is then the only credential.
        # A client that does send a Bearer key is held to it (another key's session: 404).
        bearer = req.headers.get("authorization", "").partition(" ")[0].lower() == "bearer"
        caller = self._authenticate(req) if bearer else None
        session = await self._session(session_id, caller)
        await self.node.redeem_token(req.query.get("attach"), session.id)
        # The stream counts against its session's owner, released however it ends.
        release = self.node.limits.open_stream(session.record.owner)  # 503 over_capacity

        async def run(ws: WebSocket) -> None:
            conn = StreamConnection(session, ws, req.client)
            self.node.connections.add(conn)
            try:
                await conn.run()
            finally:
                release()
                self.node.connections.discard(conn)
                self.node.notify()  # shutdown waits for the connections to close

        return WebSocketAccept(run, abandon=release)  # abandon: the upgrade did not happen

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

    async def page(self, req: Request) -> Response:
        """``GET /``: the web page (gateway.ui)."""
        return self._serve(req, ui.INDEX)

    async def asset(self, req: Request, name: str) -> Response:
        """``GET /ui/NAME``: a file of the page; 404 for any name that is not one (gateway.ui)."""
        return self._serve(req, name)

    def _serve(self, req: Request, name: str) -> Response:
        if self._assets is None:
            self._assets = ui.load()
        found = self._assets.get(name)
        if found is None:
            raise ApiError(404, "not_found", f"no file {name!r} in the web page")
        if found.fresh(req.headers.get("if-none-match")):
            return Response(304, b"", found.content_type, found.headers())
        return Response(200, found.body, found.content_type, found.headers())


# --- helpers -----------------------------------------------------------------------


def _decode_optional(req: Request, type_: type[T]) -> T | None:
    """The body as ``type_``, or ``None`` for an empty body."""
    return _decode(req, type_) if req.body.strip() else None


def _decode(req: Request, type_: type[T]) -> T:
    """The body as ``type_``: 400 for malformed JSON, 422 for a schema violation."""
    if not req.body.strip():
        raise ApiError(400, "invalid_json", "the request body is empty; JSON expected")
    try:
        return msgspec.json.decode(req.body, type=type_)
    except msgspec.ValidationError as exc:
        raise ApiError(422, "invalid_body", str(exc)) from None
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:
        # msgspec raises UnicodeDecodeError for invalid UTF-8 inside a string.
        raise ApiError(400, "invalid_json", f"the body is not valid JSON: {exc}") from None
    except RecursionError:  # PROTOCOL section 2: a 4xx however deep the input, never a 500
        raise ApiError(400, "invalid_json", "the body is nested too deeply to decode") from None


def _json_content_type(req: Request) -> None:
    """415 ``unsupported_media_type`` unless the POST says ``Content-Type: application/json``.

    Parameters (``; charset=utf-8``) are allowed, the type compares
    case-insensitively; an empty body needs it too (PROTOCOL section 15: a
    browser sends an empty ``text/plain`` POST cross-site without a preflight).
    """
    declared = req.headers.get("content-type", "")
    if declared.partition(";")[0].strip().lower() != "application/json":
        shown = f"{declared[:100]!r}" if declared else "none"
        raise ApiError(
            415,
            "unsupported_media_type",
            f"a POST needs Content-Type: application/json (got {shown}; PROTOCOL section 15)",
        )


def _known_query(req: Request, operation: Operation) -> None:
    """422 ``invalid_query`` for a query parameter the operation does not take.

    A misspelt ``?limt=5`` would otherwise be ignored without a word, as an
    unknown body field is not (``forbid_unknown_fields``).
    """
    unknown = sorted(set(req.query) - {q.name for q in operation.query})
    if unknown:
        takes = ", ".join(q.name for q in operation.query) or "none"
        raise ApiError(
            422,
            "invalid_query",
            f"unknown query parameter {unknown[0]!r} (this route takes: {takes})",
        )


def _int_query(req: Request, name: str, *, default: int, low: int, high: int) -> int:
    raw = req.query.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ApiError(400, "invalid_query", f"{name} must be an integer, got {raw!r}") from None
    if not low <= value <= high:
        raise ApiError(
            422, "invalid_query", f"{name} must be between {low} and {high}, got {value}"
        )
    return value


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


def _user_content(content: str | list[ContentBlock]) -> list[ContentBlock]:
    blocks: list[ContentBlock] = [TextBlock(content)] if isinstance(content, str) else content
    if not blocks or all(isinstance(b, TextBlock) and not b.text for b in blocks):
        raise ApiError(422, "invalid_body", "content must not be empty")
    for b in blocks:
        if not isinstance(b, TextBlock):
            raise ApiError(
                422,
                "invalid_body",
                f"user content blocks must be text, got {b.__struct_config__.tag!r}",
            )
    return blocks

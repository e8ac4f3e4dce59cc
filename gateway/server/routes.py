"""The HTTP routes of PROTOCOL section 2, and the handshake of the session stream.

Every body is JSON and declared once as a ``msgspec.Struct``; every error is an
:class:`~gateway.errors.ApiError` turned into ``{"error": {"code", "message"}}``
by the transport. Statuses: 400 malformed JSON or query, 401 missing
credentials, 403 wrong key or attach token or Origin, 404 unknown, 405 wrong
method (with ``Allow``), 409 conflict, 413 too large (transport), 422
schema-invalid.

Authentication: where ``[auth] api_keys`` is set, every route but
``/healthz`` needs ``Authorization: Bearer KEY``. The stream handshake is the
exception: browsers cannot set headers on a WebSocket, so the single-use attach
token (obtained with the key from ``GET /sessions/{id}``) is its credential.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import Any, Literal, TypeVar

import msgspec

from gateway.errors import ApiError
from gateway.ids import new_message_id, new_turn_id, now_ms
from gateway.metrics import CONTENT_TYPE
from gateway.node import Node
from gateway.protocol.events import FeedbackRecorded
from gateway.protocol.shapes import ContentBlock, Message, SessionSummary, TextBlock
from gateway.server.connection import StreamConnection
from gateway.server.http import Request, Response, WebSocketAccept, json_response
from gateway.server.websocket import WebSocket
from gateway.session.session import Session, summary_of

# --- bodies -------------------------------------------------------------------


class CreateSession(msgspec.Struct, forbid_unknown_fields=True):
    workspace_path: str | None = None
    model: str | None = None
    metadata: dict[str, Any] | None = None


class SessionCreated(msgspec.Struct):
    session_id: str
    active_model: str
    created_at: int


class SessionListing(msgspec.Struct):
    """One entry of ``GET /sessions``: the summary plus when and with what it was made."""

    session: SessionSummary
    created_at: int
    metadata: dict[str, Any]


class SessionList(msgspec.Struct):
    sessions: list[SessionListing]
    has_more: bool


class SessionAttach(msgspec.Struct):
    session_id: str
    active_model: str
    attach_token: str
    ws_url: str


class MessagePage(msgspec.Struct):
    messages: list[Message]
    has_more: bool


class SubmitTurn(msgspec.Struct, forbid_unknown_fields=True):
    content: str | list[ContentBlock]


class TurnAccepted(msgspec.Struct):
    turn_id: str


class CancelTurn(msgspec.Struct, forbid_unknown_fields=True):
    reason: str | None = None


class CancelAccepted(msgspec.Struct):
    turn_id: str
    status: Literal["cancelling"] = "cancelling"


class PermissionDecision(msgspec.Struct, forbid_unknown_fields=True):
    decision: Literal["allow", "deny"]


class Feedback(msgspec.Struct, forbid_unknown_fields=True):
    message_id: str
    rating: Literal[-1, 1]
    comment: str | None = None


class Accepted(msgspec.Struct):
    status: str


class Health(msgspec.Struct):
    status: str = "ok"


# --- routing -------------------------------------------------------------------

T = TypeVar("T")
Route = Callable[..., Awaitable[Response | WebSocketAccept]]
_ID = r"([A-Za-z0-9_\-]+)"


class Api:
    """The route table and the handlers, over one :class:`~gateway.node.Node`."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.config = node.config
        self.routes: list[tuple[re.Pattern[str], dict[str, Route], str]] = []
        self._add("/healthz", "healthz", GET=self.healthz)
        self._add("/metrics", "metrics", GET=self.metrics)
        self._add("/sessions", "sessions", GET=self.list_sessions, POST=self.create_session)
        self._add(f"/sessions/{_ID}", "session", GET=self.get_session)
        self._add(f"/sessions/{_ID}/messages", "messages", GET=self.list_messages)
        self._add(f"/sessions/{_ID}/turns", "turns", POST=self.submit_turn)
        self._add(f"/sessions/{_ID}/turns/{_ID}/cancel", "cancel", POST=self.cancel_turn)
        self._add(f"/sessions/{_ID}/permissions/{_ID}", "permission", POST=self.decide)
        self._add(f"/sessions/{_ID}/feedback", "feedback", POST=self.feedback)
        self._add(f"/sessions/{_ID}/stream", "stream", GET=self.stream)

    def _add(self, pattern: str, name: str, **methods: Route) -> None:
        self.routes.append((re.compile(pattern + "$"), methods, name))

    async def __call__(self, req: Request) -> Response | WebSocketAccept:
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
            if name not in ("healthz", "stream"):
                self._authenticate(req)
            try:
                answer = await handler(req, *match.groups())
            except ApiError as exc:
                self.node.metrics.http_requests.labels(name, str(exc.status)).inc()
                raise
            status = answer.status if isinstance(answer, Response) else 101
            self.node.metrics.http_requests.labels(name, str(status)).inc()
            return answer
        raise ApiError(404, "not_found", f"no route for {req.path}")

    def _authenticate(self, req: Request) -> None:
        keys = self.config.auth.api_keys
        if not keys:
            return
        header = req.headers.get("authorization", "")
        scheme, _, key = header.partition(" ")
        if scheme.lower() != "bearer" or not key:
            raise ApiError(401, "unauthorized", "send Authorization: Bearer <api key>")
        if key.strip() not in keys:
            raise ApiError(403, "forbidden", "the API key is not valid")

    async def _session(self, session_id: str) -> Session:
        session: Session | None = await self.node.get_session(session_id)
        if session is None:
            raise ApiError(404, "session_not_found", f"no session {session_id!r}")
        return session

    # --- handlers ------------------------------------------------------------------

    async def healthz(self, req: Request) -> Response:
        return json_response(200, Health())

    async def metrics(self, req: Request) -> Response:
        return Response(200, self.node.metrics.render(), content_type=CONTENT_TYPE)

    async def create_session(self, req: Request) -> Response:
        body = _decode_optional(req, CreateSession) or CreateSession()
        session = await self.node.create_session(
            workspace_path=body.workspace_path, model=body.model, metadata=body.metadata
        )
        r = session.record
        return json_response(201, SessionCreated(r.id, r.active_model, r.created_at))

    async def list_sessions(self, req: Request) -> Response:
        limit = _int_query(req, "limit", default=50, low=1, high=200)
        await self.node.store.flush()
        before = req.query.get("before")
        if before is not None and await self.node.store.get_session(before) is None:
            raise ApiError(404, "session_not_found", f"no session {before!r} to page before")
        records, has_more = await self.node.store.list_sessions(limit=limit, before=before)
        listings = []
        for rec in records:
            live = self.node.sessions.get(rec.id)
            summary = live.summary() if live else summary_of(rec)
            listings.append(SessionListing(summary, rec.created_at, rec.metadata))
        return json_response(200, SessionList(listings, has_more))

    async def get_session(self, req: Request, session_id: str) -> Response:
        session = await self._session(session_id)
        token = self.node.tokens.issue(session.id)
        url = f"{self._ws_base(req)}/sessions/{session.id}/stream?attach={token}"
        return json_response(
            200, SessionAttach(session.id, session.record.active_model, token, url)
        )

    def _ws_base(self, req: Request) -> str:
        public: str = self.config.server.public_url.rstrip("/")
        if public:
            return "ws" + public.removeprefix("http")  # http -> ws, https -> wss
        server = self.config.server
        host = req.headers.get("host") or f"{server.host}:{server.port}"
        return f"ws://{host}"

    async def list_messages(self, req: Request, session_id: str) -> Response:
        session = await self._session(session_id)
        limit = _int_query(req, "limit", default=50, low=1, high=200)
        messages = session.messages
        end = len(messages)
        before = req.query.get("before")
        if before is not None:
            end = next((i for i, m in enumerate(messages) if m.id == before), -1)
            if end < 0:
                raise ApiError(404, "message_not_found", f"no message {before!r} in {session_id}")
        start = max(0, end - limit)
        return json_response(200, MessagePage(messages[start:end], start > 0))

    async def submit_turn(self, req: Request, session_id: str) -> Response:
        session = await self._session(session_id)
        body = _decode(req, SubmitTurn)
        content = _user_content(body.content)
        turn_id = new_turn_id()
        message = Message(
            new_message_id(), session.id, turn_id, "user", content, "complete", now_ms()
        )
        turn = session.submit_turn(message)
        await session.accepted(turn)  # 202 once the turn is durable (PROTOCOL section 9)
        return json_response(202, TurnAccepted(turn_id))

    async def cancel_turn(self, req: Request, session_id: str, turn_id: str) -> Response:
        session = await self._session(session_id)
        body = _decode_optional(req, CancelTurn) or CancelTurn()
        session.cancel_turn(turn_id, body.reason or "user", f"http:{req.client}")
        return json_response(202, CancelAccepted(turn_id))

    async def decide(self, req: Request, session_id: str, perm_id: str) -> Response:
        session = await self._session(session_id)
        body = _decode(req, PermissionDecision)
        session.decide_permission(perm_id, body.decision)
        return json_response(202, Accepted("resolved"))

    async def feedback(self, req: Request, session_id: str) -> Response:
        session = await self._session(session_id)
        body = _decode(req, Feedback)
        message = next((m for m in session.messages if m.id == body.message_id), None)
        if message is None:
            raise ApiError(
                404, "message_not_found", f"no message {body.message_id!r} in {session_id}"
            )
        session.emit(
            [FeedbackRecorded(body.message_id, body.rating, body.comment)], message.turn_id
        )
        return json_response(202, Accepted("recorded"))

    async def stream(self, req: Request, session_id: str) -> WebSocketAccept:
        """The handshake of ``/sessions/{id}/stream``, refused before any upgrade (PROTOCOL §2)."""
        origins = self.config.auth.allowed_origins
        origin = req.headers.get("origin")
        if origins and origin is not None and origin not in origins:
            raise ApiError(403, "origin_not_allowed", f"Origin {origin!r} is not allowed")
        session = await self._session(session_id)
        self.node.tokens.redeem(req.query.get("attach"), session.id)

        async def run(ws: WebSocket) -> None:
            conn = StreamConnection(session, ws)
            self.node.connections.add(conn)
            try:
                await conn.run()
            finally:
                self.node.connections.discard(conn)
                self.node.notify()  # shutdown waits for the connections to close

        return WebSocketAccept(run)


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
    except msgspec.DecodeError as exc:
        raise ApiError(400, "invalid_json", f"the body is not valid JSON: {exc}") from None
    except RecursionError:  # PROTOCOL section 2: a 4xx however deep the input, never a 500
        raise ApiError(400, "invalid_json", "the body is nested too deeply to decode") from None


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

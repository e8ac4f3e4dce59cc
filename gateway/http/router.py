"""The router of the HTTP API (docs/protocol.md §2), and the handshake of the session stream.

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

The boundary (docs/protocol.md §15), in this order, before anything else on
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

Ownership (docs/protocol.md §2): a session belongs to the key that created it,
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

from gateway import telemetry, ui
from gateway.doors.agui.routes import AguiRoutes
from gateway.doors.aisdk.routes import Responses
from gateway.errors import ApiError, Refused, StoreError, unavailable
from gateway.http.openapi import Documented, Operation, path_regex
from gateway.http.parsing import json_content_type, known_query
from gateway.http.refusals import as_http, http_error
from gateway.http.server import (
    Request,
    Response,
    StreamingResponse,
    WebSocketAccept,
)
from gateway.node import Node
from gateway.node.registry import pinning
from gateway.protocol.shapes import Message
from gateway.session.session import Session
from gateway.tenancy import ApiKeys, Boundary, sees

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
    :meth:`_session`); AG-UI's keep their state in :attr:`agui`.
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
        self.agui = AguiRoutes(self)  # AG-UI's handlers and their state (gateway.agui.routes)
        self.aisdk = Responses(self)  # the AI SDK's doors (gateway.aisdk.routes)

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
            answer = await self._held(req)
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

    async def _held(self, req: Request) -> Response | WebSocketAccept | StreamingResponse:
        """:meth:`_route`, the sessions it names held in memory until it is answered.

        A plain answer releases them once made; a WebSocket or an SSE stream
        once it is over (gateway.node.unloading: a session with clients stays).
        """
        pins = pinning()
        try:
            answer = await self._route(req)
        except BaseException:
            pins.release()
            raise
        if isinstance(answer, Response):
            pins.release()
            return answer
        run, abandon = answer.run, answer.abandon

        async def held(arg: Any) -> None:
            try:
                await run(arg)
            finally:
                pins.release()

        def abandoned() -> None:
            pins.release()
            abandon()

        answer.run, answer.abandon = held, abandoned
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
                with telemetry.incoming(req.headers):  # its traceparent, for a turn's spans
                    answer = await handler(self, req, *match.groups())
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
        """The session, as ``caller`` may see it (docs/protocol.md §2).

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
        counted = await limits.count_turn(key)  # 429 rate_limited, with Retry-After
        try:
            await self.node.submit_turn(session, message)  # on whichever node runs it
        except Refused as exc:
            if exc.code != "store_unavailable":
                await limits.refund_turn(key, counted)
            raise

"""The router of the HTTP API (docs/protocol.md §2): the boundary, then the route.

The routes are the doors' (gateway.doors: each door lists its own, and
gateway.app registers the doors in order); :class:`Router` answers a request
from them: the boundary, the route, the caller's key where the route's
:class:`Operation` asks for it. What a handler does past that (the caller's
sessions, turns, streams) is its door's, through gateway.doors.context.

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
preflight is where its Origin is refused (gateway.http.boundary.Boundary).

Authentication: where API keys are configured (``[auth] api_keys`` or
``api_keys_file``, gateway.tenancy), every route but ``/healthz`` needs
``Authorization: Bearer KEY``. The stream handshake is the exception: browsers
cannot set headers on a WebSocket, so the single-use attach token (obtained with
the key from ``GET /sessions/{id}``) is its credential; a handshake that does
carry a Bearer key (a non-browser client) is checked like any route.

Ownership (docs/protocol.md §2): a session belongs to the key that created it,
and to any other key it does not exist:
:meth:`gateway.doors.context.DoorContext.session` answers 404
``session_not_found`` with the body an unknown id gets, on every route of the
session, and ``GET /sessions`` lists only what the caller sees (filtered in the
store query, so pages and ``before`` work). Sessions created without keys
(owner ``""``) are seen by every key.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from gateway import telemetry
from gateway.errors import ApiError, Refused, StoreError, unavailable
from gateway.http.boundary import Boundary, authenticate
from gateway.http.openapi import Documented, Operation, path_regex
from gateway.http.parsing import body_content_type, known_query
from gateway.http.refusals import as_http, http_error
from gateway.http.server import Request, Response, StreamingResponse, WebSocketAccept
from gateway.metrics import Metrics
from gateway.tenancy import ApiKeys

# --- the table's entries ----------------------------------------------------------

Answer = Response | WebSocketAccept | StreamingResponse
"""What a handler answers: a response, a WebSocket to upgrade to, or a stream."""

Handler = Callable[..., Awaitable[Answer]]
"""A route's handler: ``handler(req, *ids)``, the path's ids in order; a door's
handlers are its methods, so they reach their door's state and context."""


class Held(Protocol):
    """What a request holds while it is answered (the sessions it names: gateway.node.registry)."""

    def release(self) -> None: ...


@dataclass(frozen=True, slots=True)
class Route:
    """One path of a door's routes, and per method its handler and :class:`Operation`.

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


class Router:
    """Answers a request from the registered doors' routes (module docstring).

    Args:
        table: every route, in the API document's order (the first match answers).
        boundary: the Host and Origin rules.
        keys: the API keys, for the routes whose operation requires one.
        metrics: where ``gateway_http_requests`` is counted.
        hold: called as a request starts; what it returns is released once the
            request is answered, or its stream over (the sessions it names).
    """

    def __init__(
        self,
        table: Iterable[Route],
        *,
        boundary: Boundary,
        keys: ApiKeys,
        metrics: Metrics,
        hold: Callable[[], Held],
    ) -> None:
        self.boundary = boundary
        self.keys = keys
        self.metrics = metrics
        self.hold = hold
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

    async def __call__(self, req: Request) -> Answer:
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
            answer = await self._pinned(req)
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

    async def _pinned(self, req: Request) -> Answer:
        """:meth:`_route`, the sessions it names pinned in memory until it is answered.

        A plain answer releases them once made; a WebSocket or an SSE stream
        once it is over (gateway.node.unloading: a session with clients stays).
        """
        pins = self.hold()
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

    async def _route(self, req: Request) -> Answer:
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
                body_content_type(req, operation.body_types)  # 415
            if operation.auth == "required":
                authenticate(self.keys, req)
            known_query(req, operation)
            try:
                with telemetry.incoming(req.headers):  # its traceparent, for a turn's spans
                    answer = await handler(req, *match.groups())
            except (ApiError, Refused) as exc:
                error = as_http(exc)  # a refusal: its status by the table
                self.metrics.http_requests.labels(name, str(error.status)).inc()
                raise error from None
            status = 101 if isinstance(answer, WebSocketAccept) else answer.status
            self.metrics.http_requests.labels(name, str(status)).inc()
            return answer
        raise ApiError(404, "not_found", f"no route for {req.path}")

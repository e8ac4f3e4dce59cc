"""``GET /openapi.json``: the OpenAPI 3.1 document of the HTTP API (docs/protocol.md §2).

One source of truth. Each route of the API is declared once, by its door
(gateway.doors.rest.door and the others), with an :class:`Operation` per method: the Struct the
handler decodes, its query parameters, the Struct it answers with, and the errors
only it gives. The JSON schemas are msgspec's own, of those very Structs
(``msgspec.json.schema_components``); this module only assembles them into the
document, so a field added to a Struct is in the document with nothing else to
edit, and a route added without an :class:`Operation` does not type-check.

The errors an operation can answer are derived, then extended by its own:

====================================  =============================================
every operation (the transport)       400 ``malformed_request``, ``conflicting_framing``,
                                      ``unsupported_transfer_encoding``; 408
                                      ``request_timeout``, 413 ``body_too_large``,
                                      431 ``headers_too_large``
every operation (the boundary,        421 ``misdirected_request`` (a Host not
docs/protocol.md §15)                  answered), 403 ``origin_not_allowed`` (an
                                      Origin not allowed), 400
                                      ``duplicate_query_parameter``
every operation (the router)          422 ``invalid_query``: a query parameter it
                                      does not take
every POST                            415 ``unsupported_media_type``: not
                                      ``Content-Type: application/json``
takes an API key, keys configured     401 ``unauthorized``, 403 ``forbidden``
decodes a JSON body                   400 ``invalid_json``, 422 ``invalid_body``
an integer query parameter            400 ``invalid_query`` (422 out of range)
an id in the path                     404 ``not_found`` (not an id: no route)
a route of ``/sessions`` or ``/agui``  503 ``store_unavailable`` (the store did not answer)
a ``{session_id}`` in the path        404 ``session_not_found``; 503
                                      ``store_unavailable``, and, on several nodes,
                                      ``session_owner_unreachable`` (the node running
                                      the session did not answer: gateway.cluster)
====================================  =============================================

Each error answer is the body ``{"error": {"code", "message"}}``
(:class:`~gateway.http.server.ErrorBody`) with ``code`` one of those listed for
that operation and status: a client can switch on it. Not per operation: 405
``method_not_allowed`` (with ``Allow``) for a method a path does not have, and
``HEAD`` wherever ``GET`` is, answered as the ``GET`` without its body.

Security: where API keys are configured, a ``bearer`` scheme applies to every
operation but ``/healthz`` and ``/readyz`` (probes, never asked) and the stream
handshake (optional: its credential is the attach token, docs/protocol.md §2, but
a key sent is checked); ``/openapi.json`` itself needs the key like the other
routes. The router reads the same :attr:`Operation.auth` and
:attr:`Operation.query` it documents, so the document cannot drift from them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any, Literal

import msgspec

from gateway.http.server import ErrorBody

ID_PATTERN = "[A-Za-z0-9_-]+"
"""What an id in a path is: one segment of these characters (anything else has no route)."""

_PARAMETER = re.compile(r"\{([a-z_]+)\}")
_REF = "#/components/schemas/{name}"
OPENAPI_VERSION = "3.1.0"

_PATH_PARAMETERS = {
    "session_id": "A session id (`sess_…`), as `POST /sessions` answered it.",
    "turn_id": "A turn id (`turn_…`), as `POST …/turns` answered it.",
    "perm_id": "A permission id, from the `permission.requested` event.",
}


def path_regex(path: str) -> re.Pattern[str]:
    """The pattern that routes ``path``: each ``{name}`` is one id segment, captured in order."""
    return re.compile(_PARAMETER.sub(f"({ID_PATTERN})", path) + "$")


@dataclass(frozen=True, slots=True)
class Query:
    """One query parameter of an operation. ``schema`` is its JSON schema."""

    name: str
    schema: Mapping[str, Any]
    description: str
    required: bool = False


@dataclass(frozen=True, slots=True)
class Operation:
    """What the document says of one route and method; declared with the route.

    Args:
        summary: one line.
        answer: the Struct of the success answer's JSON body (None: no JSON body).
        status: the success status.
        body: the Struct the handler decodes from the request body, if any.
        body_required: False where an empty body is accepted (the Struct's defaults).
        query: the query parameters.
        errors: the errors only this operation gives, status to codes (the derived
            ones are in the module docstring).
        auth: where keys are configured, ``"required"``: the route needs one;
            ``"optional"``: a Bearer key is checked when sent (the stream handshake,
            whose credential is its attach token); ``"none"``: never asked (probes).
        media_type: the success answer's content type.
        description: what a client needs beyond the schemas.
        idempotent: it takes an ``Idempotency-Key`` header (docs/protocol.md §13).
        body_types: the media types of a raw body (a file, docs/protocol.md §2
            "Files") taken instead of JSON; any other ``Content-Type`` is 415.
    """

    summary: str
    answer: type | None
    status: int = 200
    body: type | None = None
    body_required: bool = True
    query: tuple[Query, ...] = ()
    errors: Mapping[int, tuple[str, ...]] = field(default_factory=dict)
    auth: Literal["required", "optional", "none"] = "required"
    media_type: str = "application/json"
    description: str = ""
    idempotent: bool = False
    body_types: tuple[str, ...] = ()


IDEMPOTENCY_KEY = {
    "name": "Idempotency-Key",
    "in": "header",
    "required": False,
    "description": "1 to 255 printable ASCII characters: within 24 h, the same key with the"
    " same request answers what the first answered (with Idempotent-Replayed: true), and"
    " makes nothing again; another request under it is 422 idempotency_key_reused, one"
    " still in progress 409 idempotency_key_in_use (docs/protocol.md section 13).",
    "schema": {"type": "string", "minLength": 1, "maxLength": 255, "pattern": "^[ -~]+$"},
}
"""The header parameter of an idempotent operation."""


@dataclass(frozen=True, slots=True)
class Documented:
    """One documented route and method, as its door declared it."""

    path: str  # with ``{name}`` segments
    method: str  # upper case
    operation_id: str  # the handler's name
    operation: Operation


def build_document(routes: Iterable[Documented], *, auth: bool, server_url: str = "") -> bytes:
    """The OpenAPI 3.1 document of ``routes``, encoded.

    Args:
        routes: every route and method of the API, in table order.
        auth: whether API keys are configured (the ``bearer`` scheme, 401 and 403).
        server_url: the configured public URL, if any (the document's ``servers``).
    """
    routes = list(routes)
    structs = _structs(routes)
    refs, schemas = msgspec.json.schema_components(structs, ref_template=_REF)
    ref_of = dict(zip(structs, refs, strict=True))
    paths: dict[str, dict[str, Any]] = {}
    for route in routes:
        item = paths.setdefault(route.path, {})
        item[route.method.lower()] = _operation(route, ref_of, auth, routes)
    document: dict[str, Any] = {
        "openapi": OPENAPI_VERSION,
        "info": {
            "title": "gateway",
            "version": _version(),
            "summary": "A streaming gateway for LLM agent sessions: its HTTP API.",
            "description": _DESCRIPTION,
        },
        "paths": paths,
        "components": {"schemas": schemas},
    }
    if server_url:
        document["servers"] = [{"url": server_url.rstrip("/")}]
    if auth:
        document["components"]["securitySchemes"] = {
            "bearer": {
                "type": "http",
                "scheme": "bearer",
                "description": "One of the configured API keys (`[auth] api_keys`, "
                "`api_keys_file`).",
            }
        }
        document["security"] = [{"bearer": []}]
    return msgspec.json.encode(document)


_DESCRIPTION = """\
Every body is JSON, and every POST says `Content-Type: application/json` (else 415), \
an empty body included. Every error is `{"error": {"code", "message"}}`; the codes each \
operation can give are listed with its statuses. A request is refused before its route \
when its `Host` is not a name the gateway answers (421, `[server] allowed_hosts`), when \
it carries an `Origin` that is neither the gateway's own nor listed in \
`[auth] allowed_origins` (403), or when a query parameter is repeated (400); a listed \
origin gets the CORS headers and its preflights (`OPTIONS`) answered. Any path answers 405 \
`method_not_allowed` (with `Allow`) to a method it does not list, and `HEAD` wherever \
`GET` is listed (the `GET`'s answer without its body). The session's events are \
streamed over the WebSocket of `GET /sessions/{session_id}/stream` (PROTOCOL \
sections 3 to 9, not described here)."""


def _structs(routes: list[Documented]) -> list[type]:
    """Every Struct the document refers to, each once, in first-use order."""
    seen: dict[type, None] = {ErrorBody: None}
    for route in routes:
        for struct in (route.operation.body, route.operation.answer):
            if struct is not None:
                seen[struct] = None
    return list(seen)


def _operation(
    route: Documented, ref_of: Mapping[type, Any], auth: bool, routes: list[Documented]
) -> dict[str, Any]:
    op = route.operation
    out: dict[str, Any] = {"operationId": route.operation_id, "summary": op.summary}
    if op.description:
        out["description"] = op.description
    parameters = [
        {
            "name": name,
            "in": "path",
            "required": True,
            "description": _PATH_PARAMETERS.get(name, "An id."),
            "schema": {"type": "string", "pattern": f"^{ID_PATTERN}$"},
        }
        for name in _PARAMETER.findall(route.path)
    ]
    parameters += [
        {
            "name": q.name,
            "in": "query",
            "required": q.required,
            "description": q.description,
            "schema": dict(q.schema),
        }
        for q in op.query
    ]
    if op.idempotent:
        parameters.append(IDEMPOTENCY_KEY)
    if parameters:
        out["parameters"] = parameters
    if op.body_types:
        raw = {"type": "string", "format": "binary"}
        out["requestBody"] = {
            "required": True,
            "content": {t: {"schema": raw} for t in op.body_types},
        }
    elif op.body is not None:
        out["requestBody"] = {
            "required": op.body_required,
            "content": {"application/json": {"schema": ref_of[op.body]}},
        }
    success: dict[str, Any] = {"description": HTTPStatus(op.status).phrase}
    if op.answer is not None:
        success["content"] = {op.media_type: {"schema": ref_of[op.answer]}}
        links = _links(route, op.answer, routes)
        if links:
            success["links"] = links
    elif op.media_type == "text/event-stream":
        success["content"] = {op.media_type: {"schema": SSE_EVENT}}
    elif op.media_type != "application/json":
        success["content"] = {op.media_type: {"schema": {"type": "string"}}}
    responses: dict[str, Any] = {str(op.status): success}
    for status, codes in sorted(_errors(route, auth).items()):
        responses[str(status)] = _error_response(status, codes, ref_of[ErrorBody])
    out["responses"] = responses
    if auth and op.auth == "none":
        out["security"] = []  # open even where keys are configured
    elif auth and op.auth == "optional":
        out["security"] = [{}, {"bearer": []}]  # OpenAPI's "either none or this one"
    return out


_QUERY_SOURCES = {"attach": "attach_token"}
"""Query parameters and the answer field that holds a value for them."""


def _links(route: Documented, answer: type, routes: list[Documented]) -> dict[str, Any]:
    """OpenAPI links from this answer to the operations that take the ids it holds.

    Derived, not declared: a target qualifies when each of its path ids is a field
    of the answer (``session_id``, ``turn_id``) or an id of this path, at least one
    from the answer. A client (and schemathesis's stateful phase) follows them:
    ``POST /sessions`` to every route of the session, ``POST …/turns`` to its cancel.
    """
    fields = {f.name for f in msgspec.structs.fields(answer)}
    own = set(_PARAMETER.findall(route.path))
    links: dict[str, Any] = {}
    for target in routes:
        wanted = _PARAMETER.findall(target.path)
        if target is route or not wanted or not set(wanted) <= fields | own:
            continue
        if not set(wanted) & fields:
            continue
        parameters = {
            name: f"$response.body#/{name}" if name in fields else f"$request.path.{name}"
            for name in wanted
        }
        for q in target.operation.query:
            source = _QUERY_SOURCES.get(q.name)
            if source in fields:
                parameters[q.name] = f"$response.body#/{source}"
        links[target.operation_id] = {
            "operationId": target.operation_id,
            "parameters": parameters,
        }
    return links


def _errors(route: Documented, auth: bool) -> dict[int, list[str]]:
    """Status to error codes of one operation: derived (module docstring), then its own."""
    op = route.operation
    errors: dict[int, list[str]] = {
        400: [
            "malformed_request",
            "conflicting_framing",
            "unsupported_transfer_encoding",
            "duplicate_query_parameter",
        ],
        403: ["origin_not_allowed"],
        408: ["request_timeout"],
        413: ["body_too_large"],
        421: ["misdirected_request"],
        422: ["invalid_query"],
        431: ["headers_too_large"],
    }

    def add(status: int, *codes: str) -> None:
        listed = errors.setdefault(status, [])
        listed.extend(c for c in codes if c not in listed)

    if auth and op.auth != "none":
        add(401, "unauthorized")
        add(403, "forbidden")
    if route.method == "POST":
        add(415, "unsupported_media_type")
    if op.body is not None:
        add(400, "invalid_json")
        add(422, "invalid_body")
    if any(q.schema.get("type") == "integer" for q in op.query):
        add(400, "invalid_query")
    names = _PARAMETER.findall(route.path)
    if names:
        add(404, "not_found")
    if route.path.startswith(("/sessions", "/agui")):
        add(503, "store_unavailable")
    if "session_id" in names:
        add(404, "session_not_found")
        add(503, "store_unavailable", "session_owner_unreachable")
    for status, codes in op.errors.items():
        add(status, *codes)
    return errors


SSE_EVENT: dict[str, Any] = {
    "description": "One server-sent event (OpenAPI 3.1 has no itemSchema: per the OpenAPI "
    "specification's generic text/event-stream schema, this describes each event of the "
    "stream); its data is one JSON event.",
    "type": "object",
    "required": ["data"],
    "properties": {
        "data": {"type": "string", "contentMediaType": "application/json"},
        "event": {"type": "string"},
        "id": {"type": "string"},
        "retry": {"type": "integer", "minimum": 0},
    },
}
"""The schema of each event of a ``text/event-stream`` answer (``POST /agui``)."""


def _error_response(status: int, codes: list[str], error_ref: Any) -> dict[str, Any]:
    listed = ", ".join(f"`{c}`" for c in codes)
    # The codes are ErrorBody's ``error.code``, narrowed for this operation and status.
    narrowed = {
        "properties": {"error": {"properties": {"code": {"enum": codes}}, "required": ["code"]}},
    }
    return {
        "description": f"{HTTPStatus(status).phrase}: {listed}.",
        "content": {"application/json": {"schema": {"allOf": [error_ref, narrowed]}}},
    }


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("gateway")
    except PackageNotFoundError:  # running from a source tree that was not installed
        return "0+unknown"

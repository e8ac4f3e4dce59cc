"""A2A's JSON-RPC 2.0 envelope: reading a request, answering a result or an error.

docs/doors/a2a.md "Errors". A request that is not JSON is -32700; not a
JSON-RPC 2.0 request object (a batch, ``jsonrpc`` not ``"2.0"``, no string
``method``, an ``id`` that is neither a string, an integer nor null) is
-32600, and so is a notification (no ``id``: it is not run, since every A2A
method answers); an unknown method -32601; params out of their schema -32602. The
gateway's own refusals (:class:`~gateway.errors.ApiError`) are answered as
JSON-RPC errors too, by :func:`rpc_error` (their code in ``data``), except a
429 or 503: those stay HTTP answers, with their ``Retry-After``, as on every
route (the request was not taken; a client retries it as it is). Every
JSON-RPC answer, an error included, is HTTP 200, as A2A's JSON-RPC binding
says.
"""

from __future__ import annotations

from typing import Any, TypeVar

import msgspec

from gateway.doors.a2a import shapes as a2
from gateway.doors.a2a.stream import error_info
from gateway.errors import ApiError
from gateway.http.server import Response

T = TypeVar("T")

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
TASK_NOT_FOUND = -32001
TASK_NOT_CANCELABLE = -32002
PUSH_NOT_SUPPORTED = -32003
UNSUPPORTED_OPERATION = -32004
CONTENT_TYPE_NOT_SUPPORTED = -32005
EXTENDED_CARD_NOT_CONFIGURED = -32007
VERSION_NOT_SUPPORTED = -32009

_BY_CODE = {
    "task_not_found": TASK_NOT_FOUND,
    "session_not_found": TASK_NOT_FOUND,  # another key's context: as an unknown task
    "task_not_cancelable": TASK_NOT_CANCELABLE,
    "unsupported_media_type": CONTENT_TYPE_NOT_SUPPORTED,
    "unsupported_content": CONTENT_TYPE_NOT_SUPPORTED,
}
_BY_STATUS = {400: INVALID_PARAMS, 404: TASK_NOT_FOUND, 413: INVALID_PARAMS, 422: INVALID_PARAMS}


class RpcFailure(Exception):
    """A JSON-RPC error to answer (its ``code``, ``message`` and the gateway's ``reason``)."""

    def __init__(self, code: int, message: str, reason: str = "", status: int = 400) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.reason = reason
        self.status = status


def rpc_error(exc: ApiError) -> RpcFailure:
    """A gateway refusal as a JSON-RPC error (module docstring)."""
    code = _BY_CODE.get(exc.code) or _BY_STATUS.get(exc.status, UNSUPPORTED_OPERATION)
    return RpcFailure(code, str(exc), exc.code, exc.status)


def error_response(request_id: a2.RequestId, failure: RpcFailure) -> Response:
    data = error_info(failure.reason, failure.status) if failure.reason else None
    error = a2.RpcError(failure.code, failure.message, data)
    return Response(200, a2.encoder.encode(a2.RpcErrorResponse(request_id, error)))


def result_response(request_id: a2.RequestId, result: object) -> Response:
    return Response(200, a2.encoder.encode(a2.RpcResult(request_id, result)))


_request = msgspec.json.Decoder(a2.RpcRequest)


def read_request(body: bytes) -> tuple[a2.RequestId, str, msgspec.Raw]:
    """The request's id, method and raw params.

    Raises:
        RpcFailure: -32700, -32600 (module docstring); its id is then null.
    """
    try:
        request = _request.decode(body)
    except msgspec.ValidationError:  # JSON, but no object (a batch is an array)
        raise RpcFailure(
            INVALID_REQUEST, "a JSON-RPC 2.0 request object is expected (no batches)"
        ) from None
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise RpcFailure(PARSE_ERROR, f"the body is not JSON: {exc}") from None
    if request.jsonrpc != "2.0":
        raise RpcFailure(INVALID_REQUEST, "'jsonrpc' must be exactly \"2.0\"")
    if not isinstance(request.method, str) or not request.method:
        raise RpcFailure(INVALID_REQUEST, "'method' must be a non-empty string")
    request_id = request.id
    if request_id is msgspec.UNSET:
        raise RpcFailure(
            INVALID_REQUEST,
            "no 'id': a notification is not run (every A2A method answers; send an id)",
        )
    if isinstance(request_id, bool) or not isinstance(request_id, str | int | None):
        raise RpcFailure(INVALID_REQUEST, "'id' must be a string, an integer or null")
    return request_id, request.method, request.params


def request_id_of(body: bytes) -> a2.RequestId:
    """The id of a request refused as a whole, when it has a usable one (else null)."""
    try:
        request = _request.decode(body)
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError):
        return None
    rid: Any = request.id
    return rid if isinstance(rid, str | int) and not isinstance(rid, bool) else None


def params(raw: msgspec.Raw, type_: type[T]) -> T:
    """A method's params in its Struct (-32602 otherwise)."""
    try:
        return msgspec.json.decode(raw, type=type_)
    except (msgspec.DecodeError, RecursionError) as exc:
        raise RpcFailure(INVALID_PARAMS, f"invalid params: {exc}", "invalid_params") from None

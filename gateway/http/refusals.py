"""The one table from a domain refusal to what a client sees (docs/protocol.md §2).

Below the server, the gateway refuses with :class:`gateway.errors.Refused`:
a ``code``, a message, and maybe a ``Retry-After``. Only here does a code
become an HTTP status: the node, the sessions and the cluster link never
name one. A refusal that closes a stream (a replica's subscribe whose owner
did not answer) closes it with ``relay_gap`` (gateway.session.seam); a
refusal of a ``cancel`` frame is an ``error`` frame of the same code
(gateway.doors.websocket.connection).
"""

from __future__ import annotations

from gateway.errors import ApiError, Refused

STATUS: dict[str, int] = {
    # attach tokens (docs/protocol.md §2)
    "attach_token_required": 403,
    "attach_token_invalid": 403,
    "attach_token_expired": 403,
    # what the request names
    "session_not_found": 404,
    "turn_not_found": 404,
    "message_not_found": 404,
    "permission_not_found": 404,
    # the session's state
    "turn_in_progress": 409,
    "turn_not_in_flight": 409,
    "queue_full": 409,
    "nothing_to_compact": 409,
    "session_too_large": 409,
    "permission_resolved": 409,
    # a fork (docs/protocol.md §2, "Forks")
    "not_a_fork_point": 409,
    "worker_session": 409,
    "workspace_too_large": 409,
    "transcript_unavailable": 409,
    "too_many_sessions": 429,
    # an edit of the history (docs/protocol.md §2 "Edit and regenerate")
    "message_rewound": 409,
    "not_a_user_message": 409,
    # what a new session or a decision carries
    "unknown_agent": 422,
    "invalid_model": 422,
    "invalid_workspace": 422,
    "invalid_content": 422,
    # come back later
    "store_unavailable": 503,
    "session_owner_unreachable": 503,
    "session_elsewhere": 503,
    "shutting_down": 503,
    "over_capacity": 503,
}
"""Each refusal's HTTP status, by code."""


def http_error(refused: Refused) -> ApiError:
    """The HTTP answer of a refusal: its status by the table, ``Retry-After`` if it has one."""
    headers: tuple[tuple[str, str], ...] = ()
    if refused.retry_after_s is not None:
        headers = (("Retry-After", str(refused.retry_after_s)),)
    return ApiError(STATUS[refused.code], refused.code, refused.message, headers)


def as_http(exc: ApiError | Refused) -> ApiError:
    """An HTTP error as it is; a refusal as :func:`http_error` answers it."""
    return exc if isinstance(exc, ApiError) else http_error(exc)


__all__ = ["STATUS", "as_http", "http_error"]

"""The native stream's door as server-sent events: ``GET /sessions/{id}/events``.

docs/doors/sse.md; the stream itself: gateway.doors.sse.events.
"""

from __future__ import annotations

from gateway.doors.context import ATTACH, ATTACH_REFUSALS, SESSION, DoorContext
from gateway.doors.sse import events
from gateway.http.openapi import Operation, Query
from gateway.http.router import route
from gateway.http.server import Request, Response, StreamingResponse

FILTER = Query(
    "filter",
    {"type": "string", "default": "preset:chat"},
    "A preset name (`preset:chat`, `preset:full`) or a filter object's JSON "
    "(docs/protocol.md §3); 400 `invalid_query` if it is neither.",
)
SNAPSHOT = Query(
    "snapshot",
    {"type": "string", "enum": ["true", "false"], "default": "false"},
    "Start with a snapshot of the session, as a subscribe's `snapshot`.",
)
SINCE = Query(
    "since",
    {"type": "string"},
    "An event id: replay what came after it, as a subscribe's `since` "
    "(the `Last-Event-ID` header stands for it when absent).",
)

COALESCE = Query(
    "coalesce_ms",
    {"type": "integer", "minimum": 0, "maximum": 250},
    "The delta rollup window, as a subscribe's `coalesce_ms` (docs/protocol.md §3 "
    '"Delta rollup"); absent: the server\'s `[stream] coalesce_ms`.',
)

EVENTS = Operation(
    "The session's stream as server-sent events",
    None,
    query=(ATTACH, FILTER, SNAPSHOT, SINCE, COALESCE),
    auth="optional",
    media_type="text/event-stream",
    errors={
        400: ("invalid_query",),
        403: ATTACH_REFUSALS,
        422: ("invalid_query",),
        503: ("over_capacity",),
    },
    description="docs/doors/sse.md: the WebSocket stream's frames "
    "(`subscribe_ack`, `snapshot`, `event`, `subscribe_error`), each one "
    "`data:` line of the same JSON, an event frame with `id:` = its event "
    "id; `Last-Event-ID` resumes as `since` does. A `: ping` comment after "
    "`ping_interval_s` idle. A close (`client_too_slow`, `session_deleted`, "
    '`shutdown`...) is a last `{"type": "close", "code", "ws_code", '
    '"message", "reconnect"}` frame, then the end of the body. The same '
    "credential (the single-use attach token), ownership and stream "
    "limits as the WebSocket.",
)
"""``GET /sessions/{session_id}/events`` in the API document."""


class Door:
    """The native stream as server-sent events (module docstring).

    Args:
        ctx: the doors' context (gateway.doors.context).
    """

    def __init__(self, ctx: DoorContext) -> None:
        self.ctx = ctx
        self.routes = (route(f"{SESSION}/events", "events", GET=(self.events, EVENTS)),)

    async def events(self, req: Request, session_id: str) -> StreamingResponse | Response:
        """The stream (:func:`gateway.doors.sse.events.events`)."""
        return await events.events(self.ctx, req, session_id)

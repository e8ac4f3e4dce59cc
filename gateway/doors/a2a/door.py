"""The A2A door (docs/doors/a2a.md): the agent card, and JSON-RPC at ``POST /a2a``."""

from __future__ import annotations

from gateway.doors.a2a.routes import A2aRoutes
from gateway.doors.a2a.shapes import RpcErrorResponse
from gateway.doors.context import DoorContext
from gateway.http.openapi import Operation
from gateway.http.router import route

CARD = Operation(
    "The A2A agent card",
    None,
    description="A2A 1.0's agent card (docs/doors/a2a.md): one skill per agent of the "
    "config, the JSON-RPC interface (`POST /a2a`), the key scheme where keys are "
    "configured, `streaming: true`, `pushNotifications` true where `[a2a] "
    "push_url_prefixes` is set.",
)
"""``GET /.well-known/agent-card.json`` in the API document."""

RPC = Operation(
    "A2A JSON-RPC (SendMessage, SendStreamingMessage, GetTask, CancelTask, SubscribeToTask, "
    "ListTasks)",
    RpcErrorResponse,
    body=None,
    errors={
        429: ("rate_limited", "too_many_sessions", "quota_exceeded"),
        503: (
            "over_capacity",
            "shutting_down",
            "store_unavailable",
            "session_elsewhere",
            "session_owner_unreachable",
        ),
    },
    description="A JSON-RPC 2.0 request of A2A 1.0 (docs/doors/a2a.md). Answered 200: "
    "the JSON-RPC response, or, for `SendStreamingMessage` and `SubscribeToTask`, "
    "`text/event-stream` of JSON-RPC responses whose `result` is a `StreamResponse`, "
    "each with its cursor as `id:` (resume with `Last-Event-ID`). Errors are JSON-RPC "
    "errors (the gateway's code in `data`), but for a 429 or a 503, which stay HTTP "
    "answers with `Retry-After`.",
)
"""``POST /a2a`` in the API document."""


class Door:
    """A2A's routes (:class:`A2aRoutes`).

    Args:
        ctx: the doors' context (gateway.doors.context).
    """

    def __init__(self, ctx: DoorContext) -> None:
        self.a2a = A2aRoutes(ctx)
        self.routes = (
            route("/.well-known/agent-card.json", "a2a_card", GET=(self.a2a.card, CARD)),
            route("/a2a", "a2a", POST=(self.a2a.rpc, RPC)),
        )

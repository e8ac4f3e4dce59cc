"""The native stream's door: ``GET /sessions/{id}/stream``, the WebSocket handshake.

``GET /sessions/{id}`` (gateway.doors.rest) issues a single-use attach token;
``GET /sessions/{id}/stream?attach=TOKEN`` redeems it and upgrades (PROTOCOL
section 2). Browsers cannot set headers on a WebSocket, so the token is the
handshake's credential; a Bearer key that is sent is checked as anywhere. The
connection past the upgrade: gateway.doors.websocket.connection.
"""

from __future__ import annotations

from gateway.doors.context import ATTACH, ATTACH_REFUSALS, SESSION, DoorContext
from gateway.doors.websocket.connection import StreamConnection
from gateway.http.openapi import Operation
from gateway.http.router import route
from gateway.http.server import Request, WebSocketAccept
from gateway.http.websocket import WebSocket

STREAM = Operation(
    "The session's WebSocket (the handshake)",
    None,
    101,
    query=(ATTACH,),
    auth="optional",
    errors={
        400: ("invalid_websocket_handshake",),
        403: ATTACH_REFUSALS,
        426: ("upgrade_required", "unsupported_websocket_version"),
        503: ("over_capacity",),
    },
    description="A WebSocket handshake (RFC 6455: `Upgrade: websocket`, "
    "`Connection: Upgrade`, `Sec-WebSocket-Version: 13`, a "
    "`Sec-WebSocket-Key`), refused with a status before any upgrade: an "
    "unknown session first (404), then the attach token (403). Its "
    "credential is the attach token, not the API key.",
)
"""``GET /sessions/{session_id}/stream`` in the API document."""


class Door:
    """The native stream over a WebSocket (module docstring).

    Args:
        ctx: the doors' context (gateway.doors.context).
    """

    def __init__(self, ctx: DoorContext) -> None:
        self.ctx = ctx
        self.routes = (route(f"{SESSION}/stream", "stream", GET=(self.stream, STREAM)),)

    async def stream(self, req: Request, session_id: str) -> WebSocketAccept:
        """The handshake, refused before any upgrade (docs/protocol.md §2).

        Its Host and Origin were checked as every request's
        (:meth:`gateway.http.router.Router.__call__`).
        """
        node = self.ctx.node
        # A browser cannot send Authorization: the token is then the only credential.
        # A client that does send a Bearer key is held to it (another key's session: 404).
        bearer = req.headers.get("authorization", "").partition(" ")[0].lower() == "bearer"
        caller = self.ctx.authenticate(req) if bearer else None
        session = await self.ctx.session(session_id, caller)
        await node.redeem_token(req.query.get("attach"), session.id)
        # The stream counts against its session's owner, released however it ends.
        release = await node.limits.open_stream(session.record.owner, "websocket")  # 503

        async def run(ws: WebSocket) -> None:
            conn = StreamConnection(session, ws, req.client)
            node.connections.add(conn)
            try:
                await conn.run()
            finally:
                release()
                node.connections.discard(conn)
                node.notify()  # shutdown waits for the connections to close

        return WebSocketAccept(run, abandon=release)  # abandon: the upgrade did not happen

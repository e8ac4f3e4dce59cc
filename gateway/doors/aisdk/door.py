"""The AI SDK's door (docs/doors/aisdk.md): a chat is a session, a response one turn's message.

Over HTTP (``DefaultChatTransport``: gateway.doors.aisdk.routes) and over one
WebSocket (``WebSocketChatTransport``: gateway.doors.aisdk.ws), both starting
their responses with one :class:`~gateway.doors.aisdk.routes.Responses`.
"""

from __future__ import annotations

from gateway.doors.aisdk import ws
from gateway.doors.aisdk.routes import CHAT, RESUME, STOP, Responses
from gateway.doors.context import DoorContext
from gateway.http.router import route
from gateway.http.server import Request, WebSocketAccept


class Door:
    """The AI SDK's routes, over one :class:`Responses` (module docstring).

    Args:
        ctx: the doors' context (gateway.doors.context).
    """

    def __init__(self, ctx: DoorContext) -> None:
        self.ctx = ctx
        self.responses = responses = Responses(ctx)
        self.routes = (
            route("/ai-sdk/chat", "aisdk_chat", POST=(responses.chat, CHAT)),
            route(
                "/ai-sdk/chat/{chat_id}/stream",
                "aisdk_chat_stream",
                GET=(responses.chat_stream, RESUME),
            ),
            route(
                "/ai-sdk/chat/{chat_id}/stop", "aisdk_chat_stop", POST=(responses.chat_stop, STOP)
            ),
            route("/ai-sdk/ws", "aisdk_ws", GET=(self.chat_socket, ws.WS)),
        )

    async def chat_socket(self, req: Request) -> WebSocketAccept:
        """``GET /ai-sdk/ws`` (:func:`gateway.doors.aisdk.ws.chat_socket`)."""
        return await ws.chat_socket(self.ctx, self.responses, req)

"""Attaching to a session's stream: the attach token, then the WebSocket handshake.

``GET /sessions/{id}`` issues a single-use attach token and the stream's URL;
``GET /sessions/{id}/stream?attach=TOKEN`` redeems it and upgrades (PROTOCOL
section 2). Browsers cannot set headers on a WebSocket, so the token is the
handshake's credential; a Bearer key that is sent is checked as anywhere.
"""

from __future__ import annotations

from gateway.config import Config
from gateway.doors.websocket.connection import StreamConnection
from gateway.http.router import Api
from gateway.http.server import Request, Response, WebSocketAccept, json_response
from gateway.http.websocket import WebSocket
from gateway.protocol.http import SessionAttach


async def get_session(api: Api, req: Request, session_id: str) -> Response:
    """``GET /sessions/{id}``: the session, a fresh attach token, its stream's URL."""
    session = await api._session(session_id, api._authenticate(req))
    token = await api.node.issue_token(session.id)
    url = f"{_ws_base(api.config, req)}/sessions/{session.id}/stream?attach={token}"
    record = session.record
    return json_response(
        200, SessionAttach(session.id, record.active_model, token, url, record.agent)
    )


def _ws_base(config: Config, req: Request) -> str:
    """Where ``ws_url`` points (docs/protocol.md §2): the public URL, else this request's Host.

    Without ``public_url``, the scheme follows the request's: ``wss://``
    when a trusted proxy says the client came over https
    (``X-Forwarded-Proto``, see :func:`gateway.server.http.forwarded_client`).
    """
    public: str = config.server.public_url.rstrip("/")
    if public:
        return "ws" + public.removeprefix("http")  # http -> ws, https -> wss
    server = config.server
    host = req.headers.get("host") or f"{server.host}:{server.port}"
    return f"{'wss' if req.scheme == 'https' else 'ws'}://{host}"


async def stream(api: Api, req: Request, session_id: str) -> WebSocketAccept:
    """The handshake of ``/sessions/{id}/stream``, refused before any upgrade (docs/protocol.md §2).

    Its Host and Origin were checked as every request's (:meth:`Api.__call__`).
    """
    node = api.node
    # A browser cannot send Authorization: the token is then the only credential.
    # A client that does send a Bearer key is held to it (another key's session: 404).
    bearer = req.headers.get("authorization", "").partition(" ")[0].lower() == "bearer"
    caller = api._authenticate(req) if bearer else None
    session = await api._session(session_id, caller)
    await node.redeem_token(req.query.get("attach"), session.id)
    # The stream counts against its session's owner, released however it ends.
    release = await node.limits.open_stream(session.record.owner, "websocket")  # 503 over_capacity

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

"""The close policy: every way the gateway closes a stream, in one table (docs/protocol.md §3).

Each close has a name (the ``code`` of the JSON close reason), and the table
says everything about it that any part of the gateway or of a client needs::

    name               code  drains  reconnect  when
    normal             1000  yes     no         the server ends the stream on purpose
    session_deleted    1000  yes     no         DELETE /sessions/{id}: the session is gone
                                                (its turn.cancelled is sent first, §13)
    shutdown           1001  yes     yes        the gateway is stopping (turns cancelled first)
    heartbeat_timeout  1001  no      yes        ping_max_missed pings went unanswered
    relay_gap          1001  no      yes        several nodes: this node lost some of the
                                                session's live events, or its lease
    client_too_slow    1008  no      yes        the outbound queue overflowed (slow-client rule)
    subscribe_timeout  1008  no      yes        no subscribe within subscribe_timeout_s
    frame_too_large    1009  no      no         a client frame over max_client_frame_bytes
    internal_error     1011  no      yes        a gateway bug on this connection

*Drains*: what was queued for the client is sent before the close frame (a
shutdown's ``turn.cancelled`` must reach the client before its 1001);
otherwise the queue is dropped and the client resumes with ``since`` replay.
*Reconnect*: a client should come back (with ``since``, or a snapshot) rather
than give up. Whatever drains or not, the writing left gets at most
``close_grace_s`` before the close frame (:mod:`gateway.doors.websocket.outbound`).
"""

from __future__ import annotations

import json
from typing import NamedTuple


class Close(NamedTuple):
    """One row of :data:`CLOSES`."""

    ws_code: int
    message: str
    drains: bool
    reconnect: bool


CLOSES: dict[str, Close] = {
    "normal": Close(1000, "Closing.", drains=True, reconnect=False),
    "session_deleted": Close(1000, "The session was deleted.", drains=True, reconnect=False),
    "shutdown": Close(1001, "The gateway is shutting down.", drains=True, reconnect=True),
    "heartbeat_timeout": Close(1001, "No pong to the last pings.", drains=False, reconnect=True),
    "relay_gap": Close(
        1001,
        "This node lost the session's live feed; reconnect with since.",
        drains=False,
        reconnect=True,
    ),
    "client_too_slow": Close(
        1008, "Outbound queue overflowed; reconnect with replay.", drains=False, reconnect=True
    ),
    "subscribe_timeout": Close(1008, "No subscribe frame in time.", drains=False, reconnect=True),
    "frame_too_large": Close(
        1009, "Client frame exceeds max_client_frame_bytes.", drains=False, reconnect=False
    ),
    "internal_error": Close(1011, "Internal error.", drains=False, reconnect=True),
}


def close_reason(code: str, message: str | None = None) -> tuple[int, str]:
    """The WebSocket close code and JSON reason ``{"code", "message"}`` of the close ``code``."""
    close = CLOSES[code]
    return close.ws_code, json.dumps({"code": code, "message": message or close.message})

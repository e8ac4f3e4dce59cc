"""The native stream over a WebSocket: ``GET /sessions/{id}/stream`` (docs/protocol.md §3).

- :mod:`gateway.doors.websocket.door`: the handshake (its :class:`Door`);
- :mod:`gateway.doors.websocket.connection`: one client's connection (the
  reader, the subscribe deadline, the heartbeat);
- :mod:`gateway.doors.websocket.outbound`: its writer, direct writes and close.
"""

from gateway.doors.websocket.door import Door

__all__ = ["Door"]

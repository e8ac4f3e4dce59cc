"""The AI SDK's ``useChat`` beside the native protocol (docs/doors/aisdk.md).

- :mod:`gateway.doors.aisdk.chunks`: the UI message stream's chunks;
- :mod:`gateway.doors.aisdk.mapping`: one turn as one UI message (sans-IO);
- :mod:`gateway.doors.aisdk.edits`: ``useChat``'s edits and regenerations as
  ``rewind_to`` (sans-IO);
- :mod:`gateway.doors.aisdk.stream`: a response's pump from the session's hub;
- :mod:`gateway.doors.aisdk.routes`: the HTTP transport's handlers;
- :mod:`gateway.doors.aisdk.ws`: the WebSocket transport;
- :mod:`gateway.doors.aisdk.door`: the door (its :class:`Door`).
"""

from gateway.doors.aisdk.door import Door

__all__ = ["Door"]

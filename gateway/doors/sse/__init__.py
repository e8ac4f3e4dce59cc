"""The native stream as server-sent events: ``GET /sessions/{id}/events`` (docs/doors/sse.md).

- :mod:`gateway.doors.sse.door`: the route (its :class:`Door`);
- :mod:`gateway.doors.sse.events`: the stream, its delivery queue and encoding.
"""

from gateway.doors.sse.door import Door

__all__ = ["Door"]

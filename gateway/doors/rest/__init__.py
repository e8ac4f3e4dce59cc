"""The REST door: the HTTP API's plain routes (docs/protocol.md §2).

Each handler is ``async def name(self, req, *ids)``, a method of its
resource's class, built over the doors' context (gateway.doors.context:
the caller's key, the sessions that key may see, the node); a handler's name
is its ``operationId``. Which path and method reach which handler, with what
the API document says of them, is the table of gateway.doors.rest.door.

- ``sessions``: create, list and page sessions; a session's attach token and
  stream URL; its messages.
- ``turns``: a turn, its cancel, a permission's decision, a compaction, feedback.
- ``admin``: the probes, the metrics, the API document, the agents.
- ``page``: the web page and its files (gateway.ui).
- ``idempotency``: ``Idempotency-Key``, at most once per key.
"""

from gateway.doors.rest.door import Door

__all__ = ["Door"]

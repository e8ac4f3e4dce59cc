"""A2A (Agent2Agent, 1.0) beside the native protocol: ``POST /a2a`` speaks JSON-RPC.

- :mod:`gateway.doors.a2a.shapes`: the A2A 1.0 JSON and JSON-RPC 2.0 shapes,
  as msgspec Structs.
- :mod:`gateway.doors.a2a.card`: the agent card.
- :mod:`gateway.doors.a2a.rpc`: the JSON-RPC envelope and its errors.
- :mod:`gateway.doors.a2a.tasks`: task ids (a task is a turn, a context a
  session), found with the caller's ownership.
- :mod:`gateway.doors.a2a.feed`: a task's A2A events made of its turn's events,
  after a cursor (sans-IO).
- :mod:`gateway.doors.a2a.stream`: a task's SSE stream, fed from the hub.
- :mod:`gateway.doors.a2a.parts`: a message's parts as a turn's content, or as
  an approval's answer.
- :mod:`gateway.doors.a2a.messages`: ``SendMessage`` and ``SendStreamingMessage``.
- :mod:`gateway.doors.a2a.push`: push notifications, on the webhook outbox.
- :mod:`gateway.doors.a2a.history`: a task's history (its turn's messages).
- :mod:`gateway.doors.a2a.routes`: the handlers; :mod:`gateway.doors.a2a.door`: the door.

The decisions are in docs/doors/a2a.md.
"""

from gateway.doors.a2a.door import Door

__all__ = ["Door"]

"""AG-UI beside the native protocol: ``POST /agui`` answers AG-UI events (SSE).

- :mod:`gateway.doors.agui.shapes`: the AG-UI wire shapes this gateway emits and
  accepts, as msgspec Structs (checked against the ``ag-ui-protocol`` models
  in tests/unit/doors/agui/test_agui_mapping.py).
- :mod:`gateway.doors.agui.mapping`: the sans-IO mapping from the gateway's events
  (docs/protocol.md sections 5, 7, 8) to AG-UI's; the decisions are in
  docs/doors/agui.md.
- :mod:`gateway.doors.agui.sse`: one run's SSE stream, fed from the session's hub
  through the seam like any client, through the same bounded delivery queue
  (:mod:`gateway.session.delivery`), with heartbeats.
- :mod:`gateway.doors.agui.resume`: re-attaching to a run: each SSE event's id, the
  run's record, and the resumed stream (sans-IO).
- :mod:`gateway.doors.agui.runs`: the runs answered, found again (from the store,
  for a run that started a turn) to re-attach to them.
- :mod:`gateway.doors.agui.routes`: the handlers (``POST /agui``, its cancel,
  and ``GET /agui/{session_id}/runs/{run_id}/stream``), and what they keep;
- :mod:`gateway.doors.agui.door`: the door (its :class:`Door`): those routes.
"""

from gateway.doors.agui.door import Door

__all__ = ["Door"]

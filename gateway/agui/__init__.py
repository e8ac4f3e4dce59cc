"""AG-UI beside the native protocol (issue 14): ``POST /agui`` answers AG-UI events (SSE).

- :mod:`gateway.agui.shapes`: the AG-UI wire shapes this gateway emits and
  accepts, as msgspec Structs (checked against the ``ag-ui-protocol`` models
  in tests/test_agui_mapping.py).
- :mod:`gateway.agui.mapping`: the sans-IO mapping from the gateway's events
  (PROTOCOL sections 5, 7, 8) to AG-UI's; the decisions are in
  docs/protocol.md "AG-UI".
- :mod:`gateway.agui.sse`: one run's SSE stream, fed from the session's hub
  through the seam like any client, with a bounded queue and heartbeats.
"""

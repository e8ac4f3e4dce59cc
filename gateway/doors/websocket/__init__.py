"""The native stream over a WebSocket: ``GET /sessions/{id}/stream`` (docs/protocol.md §3)."""

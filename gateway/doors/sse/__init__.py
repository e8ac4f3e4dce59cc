"""The native stream as server-sent events: ``GET /sessions/{id}/events`` (docs/protocol.md §14)."""

"""The wire contract, sans-IO: shapes, events, frames and filters (docs/protocol.md)."""

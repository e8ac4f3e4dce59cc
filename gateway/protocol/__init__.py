"""The wire contract, sans-IO: shapes, events, frames and filters (PROTOCOL.md)."""

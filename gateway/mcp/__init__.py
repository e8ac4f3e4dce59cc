"""MCP servers: their tools as gateway tools (docs/protocol.md §11, docs/reference.md)."""

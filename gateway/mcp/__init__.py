"""MCP servers: their tools as gateway tools (PROTOCOL section 11, RUNNING.md "MCP servers")."""

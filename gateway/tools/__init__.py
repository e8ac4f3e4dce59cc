"""Tools: the registry and dispatcher, and the built-in tools (RUNNING.md "Built-in tools")."""

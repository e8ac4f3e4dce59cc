"""Tools: the registry, the dispatcher, the built-in tools (docs/reference.md "Built-in tools")."""

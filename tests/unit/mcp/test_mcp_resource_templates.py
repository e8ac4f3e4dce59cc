"""A server's resource templates as ``GET /agents`` lists them: bounded whatever the server
sends (gateway.mcp.resources; docs/protocol.md §11 "MCP tools")."""

from __future__ import annotations

import json
from typing import Any

import mcp_types as types
import msgspec

from gateway.mcp.resources import MAX_TEMPLATES, list_templates


class Lister:
    """A server session answering ``resources/templates/list`` with huge templates."""

    def __init__(self, **huge: str) -> None:
        self.huge = huge

    async def list_resource_templates(
        self, params: Any = None
    ) -> types.ListResourceTemplatesResult:
        fields = {"uri_template": "mem://{x}", "name": "n", "mime_type": "text/plain"}
        template = types.ResourceTemplate(**{**fields, **self.huge})
        return types.ListResourceTemplatesResult(resource_templates=[template] * 1000)


async def test_every_field_of_a_template_is_bounded() -> None:
    megabyte = "x" * 1_000_000
    for field in ("uri_template", "name", "description", "mime_type", "title"):
        got = await list_templates("ha", Lister(**{field: megabyte}))  # type: ignore[arg-type]
        assert len(got) == MAX_TEMPLATES
        size = len(json.dumps(msgspec.to_builtins(got)))
        assert size < MAX_TEMPLATES * 3000, (field, size)

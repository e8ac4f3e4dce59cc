"""An MCP server's resources: the ``mcp_read_resource`` tool and the resource templates
(docs/protocol.md §11 "MCP tools").

A tool's result may hold a resource link (``[resource link: URI]`` in its
text): the model reads it with the tool ``mcp_read_resource {server, uri}``,
which is a ``resources/read`` of ``uri`` through ``server``'s own connection.
The gateway never opens a URI itself (a ``file:///etc/passwd`` is sent to the
server, which answers or refuses); only the servers of the session's agent
whose ``initialize`` declared the ``resources`` capability can be read, and the
tool is offered to a session only when there is one (its ``server`` argument is
an ``enum`` of them; another name is ``invalid_input``).

What the server answers maps as a tool result does (gateway.mcp.tools): each
text content's text (several are each headed by their URI), cut at
``MAX_RESULT_BYTES``; a blob of an image or audio type is a file of the
session (the result's ``files``, within the same bounds), a blob of a text
type (``text/...``, JSON, XML, YAML) that is UTF-8 its text, any other blob
one line naming it. A server's error is a ``tool.failed`` ``error`` with its
message; the read waits at most the server's ``tool_timeout_s``.

Once it is up (beside its first calls), a server with ``resources`` is asked
for its resource templates (``resources/templates/list``, at most
:data:`MAX_TEMPLATES` kept):
``GET /agents`` lists them per agent (``resource_templates``), so a client can
show what a server offers.
"""

from __future__ import annotations

import base64
import binascii
import logging
from typing import Any, Protocol

import mcp_types as types
import trio
from mcp.client.session import ClientSession

from gateway.agents import READ_RESOURCE
from gateway.errors import ToolError
from gateway.logs import event
from gateway.mcp.tools import _cut, _file
from gateway.protocol.shapes import ResourceTemplateInfo
from gateway.tools.registry import ToolContext, ToolOutput

log = logging.getLogger("gateway.mcp")


MAX_URI_CHARS = 8192
"""The longest ``uri`` the tool sends; a longer one is ``invalid_input``."""

MAX_TEMPLATES = 100
"""The most resource templates kept of one server (the rest dropped)."""

MAX_TEMPLATE_PAGES = 10

LIST_TEMPLATES_S = 5.0
"""How long a server has to list its templates at its start (else it is started without)."""

_TEXT_TYPES = frozenset({"application/json", "application/xml", "application/yaml"})
"""Blob types read as text when they are UTF-8 (with every ``text/...`` type)."""

_DESCRIPTION = (
    "Read a resource of an MCP server: a resource link (a URI) that one of its tools gave"
    " you. The server reads it and answers with its content."
)


class Reader(Protocol):
    """A server's connection, as the tool uses it (gateway.mcp.connection)."""

    name: str

    async def read_resource(self, uri: str, ctx: ToolContext) -> ToolOutput: ...


class ReadResourceTool:
    """``mcp_read_resource`` over a session's servers that have resources (module docstring)."""

    name = READ_RESOURCE
    description = _DESCRIPTION
    source = "builtin"

    def __init__(self, servers: dict[str, Reader]) -> None:
        self._servers = servers

    @property
    def input_schema(self) -> dict[str, Any]:
        return {
            "type": "object",
            "properties": {
                "server": {"type": "string", "enum": sorted(self._servers)},
                "uri": {"type": "string", "description": "the resource's URI"},
            },
            "required": ["server", "uri"],
        }

    def parse(self, raw_input: dict[str, Any]) -> tuple[Reader, str]:
        server, uri = raw_input.get("server"), raw_input.get("uri")
        if not isinstance(server, str) or server not in self._servers:
            known = ", ".join(sorted(self._servers))
            shown = repr(server)[:80]  # the model's, of any size
            raise ToolError(
                "invalid_input",
                f"invalid input for {READ_RESOURCE!r}: server {shown} is not one of this"
                f" session's MCP servers with resources ({known})",
            )
        if not isinstance(uri, str) or not uri or len(uri) > MAX_URI_CHARS:
            raise ToolError(
                "invalid_input",
                f"invalid input for {READ_RESOURCE!r}: uri must be a string of 1 to"
                f" {MAX_URI_CHARS} characters",
            )
        return self._servers[server], uri

    async def run(self, args: tuple[Reader, str], ctx: ToolContext) -> ToolOutput:
        reader, uri = args
        return await reader.read_resource(uri, ctx)


def map_resource(result: types.ReadResourceResult) -> ToolOutput:
    """A ``resources/read`` answer as a tool's output (module docstring)."""
    parts: list[str] = []
    files: list[tuple[str, bytes]] = []
    several = len(result.contents) > 1
    for content in result.contents:
        uri = str(content.uri)[:500]
        if isinstance(content, types.TextResourceContents):
            parts.append(f"[resource {uri}]\n{content.text}" if several else content.text)
            continue
        mime = content.mime_type or ""
        said = _text_blob(content.blob, mime)
        if said is not None:
            parts.append(f"[resource {uri}]\n{said}" if several else said)
            continue
        block: types.ImageContent | types.AudioContent | None = None
        if mime.startswith("image/"):
            block = types.ImageContent(type="image", data=content.blob, mime_type=mime)
        elif mime.startswith("audio/"):
            block = types.AudioContent(type="audio", data=content.blob, mime_type=mime)
        kept = _file(block, files) if block is not None else None
        if isinstance(kept, tuple):
            files.append(kept)
        elif isinstance(kept, str):
            parts.append(kept)
        else:
            size = len(content.blob) * 3 // 4
            parts.append(f"[resource: {uri}, {mime[:100] or 'binary'}, {size} bytes, not shown]")
    text, notes = _cut("\n".join(parts))
    if notes:
        text += f"\n[gateway: {'; '.join(notes)}]"
    return ToolOutput(text, None, files)


def _text_blob(blob: str, mime: str) -> str | None:
    """A blob of a text type that is UTF-8 as its text; else None."""
    if not (mime.startswith("text/") or mime in _TEXT_TYPES):
        return None
    try:
        return base64.b64decode(blob, validate=True).decode()
    except (binascii.Error, ValueError):
        return None


async def list_templates(server: str, session: ClientSession) -> list[ResourceTemplateInfo]:
    """A server's resource templates (module docstring); none when it fails (logged)."""
    out: list[ResourceTemplateInfo] = []
    try:
        with trio.fail_after(LIST_TEMPLATES_S):
            await _pages(server, session, out)
    except Exception as exc:
        event(
            log, logging.INFO, "mcp_list_failed",
            f"MCP server {server}: listing its resource templates failed: {exc!r}",
            server=server, error=repr(exc),
        )  # fmt: skip
    return out[:MAX_TEMPLATES]


async def _pages(server: str, session: ClientSession, out: list[ResourceTemplateInfo]) -> None:
    cursor: str | None = None
    for _ in range(MAX_TEMPLATE_PAGES):
        params = types.PaginatedRequestParams(cursor=cursor) if cursor else None
        listed = await session.list_resource_templates(params=params)
        for t in listed.resource_templates:
            description = (t.description or "")[:1000] or None
            mime = (t.mime_type or "")[:100] or None  # every field bounded: GET /agents
            out.append(
                ResourceTemplateInfo(server, t.uri_template[:1000], t.name[:200], description, mime)
            )
        cursor = listed.next_cursor
        if not cursor or len(out) >= MAX_TEMPLATES:
            break

"""An MCP server's tools as gateway tools, and the result mapping of PROTOCOL section 11.

A server's tool ``T`` is the gateway tool ``mcp__<server>__T``, with the
server's description and ``inputSchema``. The model is shown the schema as the
server gave it; input is checked against it here with ``jsonschema`` before
anything is sent (``invalid_input``). A tool a model cannot use (its schema
not an object schema, not a valid JSON schema, or missing; its name not
``[A-Za-z0-9_-]``, or its full name over 64 characters) is dropped with a
warning (``mcp_tool_dropped``); the rest of the server's tools are kept.

A result maps as PROTOCOL section 11 says: the text content, joined with
newlines, is the ``result``; ``structuredContent`` is the structured result;
``isError`` is a ``tool.failed`` (``error``) with the text. Content the model
cannot read as text (an image, audio, a resource) becomes a one-line
placeholder naming it. A result is cut at :data:`MAX_RESULT_BYTES` (its text,
with a note saying so; a structured result over the bound is dropped, with a
note), so one tool call cannot blow the session's store.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, field
from typing import Any, Protocol

import jsonschema  # type: ignore[import-untyped]
import jsonschema.exceptions  # type: ignore[import-untyped]
import mcp_types as types

from gateway.errors import ToolError
from gateway.logs import event
from gateway.tools.registry import ToolContext, ToolOutput

log = logging.getLogger("gateway.mcp")

MAX_RESULT_BYTES = 1024 * 1024
"""The most of a tool result's text (UTF-8) kept, and of its structured result (as JSON): 1 MiB."""

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
"""A tool name the model APIs take (Anthropic's and OpenAI's rule), checked on the full name."""


class Caller(Protocol):
    """What runs a call: one server's connection (gateway.mcp.servers)."""

    async def call(self, tool: str, arguments: dict[str, Any], ctx: ToolContext) -> ToolOutput: ...


@dataclass(frozen=True, slots=True, eq=False)
class McpTool:
    """One tool of one MCP server, as the gateway's tool registry sees it."""

    name: str  # mcp__<server>__<tool>
    description: str
    input_schema: dict[str, Any]
    server: str
    remote_name: str  # the tool's name on its server
    caller: Caller = field(repr=False)
    validator: Any = field(repr=False)

    @property
    def source(self) -> str:
        return f"mcp:{self.server}"

    def parse(self, raw_input: dict[str, Any]) -> dict[str, Any]:
        error = jsonschema.exceptions.best_match(self.validator.iter_errors(raw_input))
        if error is not None:
            where = "/".join(str(p) for p in error.absolute_path)
            at = f" at {where!r}" if where else ""
            raise ToolError(
                "invalid_input", f"invalid input for {self.name!r}{at}: {error.message}"
            )
        return raw_input

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        return await self.caller.call(self.remote_name, args, ctx)


def tool_name(server: str, tool: str) -> str:
    return f"mcp__{server}__{tool}"


def adapt_tools(server: str, listed: list[Any], caller: Caller) -> dict[str, McpTool]:
    """The usable tools of a raw ``tools/list`` answer, by gateway name; the others dropped."""
    tools: dict[str, McpTool] = {}
    for raw in listed:
        name = raw.get("name") if isinstance(raw, dict) else None
        try:
            tool = _adapt(server, raw, caller)
        except ValueError as exc:
            event(
                log, logging.WARNING, "mcp_tool_dropped",
                f"MCP server {server}: tool {name!r} dropped: {exc}",
                server=server, tool=str(name), error=str(exc),
            )  # fmt: skip
            continue
        tools[tool.name] = tool
    return tools


def _adapt(server: str, raw: Any, caller: Caller) -> McpTool:
    if not isinstance(raw, dict):
        raise ValueError("not a tool object")
    remote = raw.get("name")
    if not isinstance(remote, str) or not _NAME.match(tool_name(server, remote)):
        raise ValueError("mcp__<server>__<name> is not 1-64 letters, digits, _ and -")
    schema = raw.get("inputSchema")
    if not isinstance(schema, dict):
        raise ValueError("no inputSchema object")
    if schema.get("type") != "object":
        raise ValueError(f"its inputSchema is not an object schema (type {schema.get('type')!r})")
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        cls.check_schema(schema)
    except jsonschema.exceptions.SchemaError as exc:
        raise ValueError(f"its inputSchema is not a valid JSON schema: {exc.message}") from None
    description = raw.get("description")
    return McpTool(
        tool_name(server, remote),
        description if isinstance(description, str) else "",
        schema,
        server,
        remote,
        caller,
        cls(schema),
    )


def map_result(server: str, tool: str, result: types.CallToolResult) -> ToolOutput:
    """A ``tools/call`` result as a tool's output (module docstring).

    Raises:
        ToolError: ``error`` for an ``isError`` result, with its text.
    """
    parts: list[str] = []
    for block in result.content:
        if isinstance(block, types.TextContent):
            parts.append(block.text)
        else:
            parts.append(_placeholder(block))
    text, notes = _cut("\n".join(parts))
    structured = result.structured_content
    if structured is not None and len(json.dumps(structured)) > MAX_RESULT_BYTES:
        structured = None
        notes.append(f"its structured result was over {MAX_RESULT_BYTES} bytes and was dropped")
    if notes:
        text += f"\n[gateway: {'; '.join(notes)}]"
    if result.is_error:
        raise ToolError("error", text or f"MCP server {server}: tool {tool} failed")
    return ToolOutput(text, structured)


def _cut(text: str) -> tuple[str, list[str]]:
    data = text.encode()
    if len(data) <= MAX_RESULT_BYTES:
        return text, []
    kept = data[:MAX_RESULT_BYTES].decode(errors="ignore")
    return kept, [f"result cut at {MAX_RESULT_BYTES} of its {len(data)} bytes"]


def _placeholder(block: Any) -> str:
    if isinstance(block, types.ImageContent):
        return f"[image: {block.mime_type}, {len(block.data) * 3 // 4} bytes, not shown]"
    if isinstance(block, types.AudioContent):
        return f"[audio: {block.mime_type}, not shown]"
    if isinstance(block, types.ResourceLink):
        return f"[resource link: {block.uri}]"
    if isinstance(block, types.EmbeddedResource):
        resource = block.resource
        if isinstance(resource, types.TextResourceContents):
            return f"[resource {resource.uri}]\n{resource.text}"
        return f"[resource: {resource.uri}, binary, not shown]"
    return f"[{getattr(block, 'type', 'unknown')} content, not shown]"

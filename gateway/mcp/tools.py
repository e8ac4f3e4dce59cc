"""An MCP server's tools as gateway tools, and the result mapping of docs/protocol.md §11.

A server's tool ``T`` is the gateway tool ``mcp__<server>__T``, with the
server's description and ``inputSchema``. The model is shown the schema as the
server gave it; input is checked against it here with ``jsonschema`` before
anything is sent (``invalid_input``), but for its ``pattern`` regexes, left to
the server (:func:`_without_regexes`). A tool a model cannot use (its schema
not an object schema, not a valid JSON schema, missing, or over
:data:`MAX_SCHEMA_BYTES`; its name not ``[A-Za-z0-9_-]``, starting with ``_``,
or its full name over 64 characters) is dropped with a warning
(``mcp_tool_dropped``); the rest of the server's tools are kept, up to
:data:`MAX_TOOLS` of them and :data:`MAX_LIST_BYTES` in all, each
description cut at :data:`MAX_DESCRIPTION_CHARS`.

A result maps as docs/protocol.md §11 says: the text content, joined with
newlines, is the ``result``; ``structuredContent`` is the structured result;
``isError`` is a ``tool.failed`` (``error``) with the text. An image or audio
content is the output's ``files`` (its bytes, base64-decoded; the session keeps
each as a file of its own and names it in the result: gateway.session.tool_round),
at most :data:`MAX_RESULT_FILES` of them; audio only of an ``audio/...`` type, an
image of none (the session keeps ``audio/...`` unchecked).
Other content the model cannot read as text (a resource link, a binary
resource; any image or audio of a failed result, or one not kept) becomes a
one-line placeholder naming it. A result is cut at :data:`MAX_RESULT_BYTES` (its text,
with a note saying so; a structured result over the bound is dropped, with a
note), so one tool call cannot blow the session's store.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import re
from collections.abc import Iterator
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

MAX_RESULT_FILES = 16
"""The most images and audio of one result kept as files; the rest are placeholder lines."""

MAX_RESULT_FILE_BYTES = 64 * 1024 * 1024
"""The most bytes of one result's files decoded (by their base64's length, before it is
decoded): past it, the rest are placeholder lines, and the session's own limits
(``[files] max_bytes``) still apply to each one kept."""

_AUDIO_TYPE = re.compile(r"audio/[a-z0-9][a-z0-9.+-]{0,62}")
"""An audio content's ``mimeType`` kept as a file's (it is served back as its ``Content-Type``)."""

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
"""A tool name the model APIs take (Anthropic's and OpenAI's rule), checked on the full name."""

MAX_TOOLS = 512
"""The most tools one server may list; the rest are dropped, with a warning.

Checking a schema costs about a millisecond: a server listing 100,000 tools
(a bug, or a hostile server) would otherwise hold the daemon for minutes and
send the model a tool list no API takes."""

MAX_SCHEMA_BYTES = 256 * 1024
"""The largest ``inputSchema`` (as JSON) of a tool kept; a bigger one drops its tool."""

MAX_DESCRIPTION_CHARS = 8192
"""A tool's description is cut there (with "..."): it goes to the model on every call."""

MAX_LIST_BYTES = 2 * 1024 * 1024
"""The most one server's kept tools weigh (schemas and descriptions); the rest are dropped.

The list goes to the model on every call and into ``GET /agents`` and every
session summary: 512 tools of 256 KiB each would be 128 MiB a call."""

MAX_ELICITATION_BYTES = 64 * 1024
"""The largest elicitation (its message and ``requestedSchema``, as JSON) asked of a user."""

_REGEX_KEYWORDS = frozenset({"pattern", "patternProperties"})
_REF_KEYWORDS = frozenset({"$ref", "$dynamicRef", "$recursiveRef"})
_NAMED_SCHEMAS = frozenset({"properties", "$defs", "definitions", "dependentSchemas"})
_DATA_KEYWORDS = frozenset({"enum", "const", "default", "examples", "enumNames", "required"})


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
    if len(listed) > MAX_TOOLS:
        event(
            log, logging.WARNING, "mcp_tools_truncated",
            f"MCP server {server} listed {len(listed)} tools: only its first {MAX_TOOLS} are kept",
            server=server, count=len(listed), kept=MAX_TOOLS,
        )  # fmt: skip
        listed = listed[:MAX_TOOLS]
    weight = 0
    for raw in listed:
        name = raw.get("name") if isinstance(raw, dict) else None
        try:
            tool = _adapt(server, raw, caller)
            weight += len(json.dumps(tool.input_schema)) + len(tool.description)
            if weight > MAX_LIST_BYTES:
                raise ValueError(f"the server's tools are over {MAX_LIST_BYTES} bytes with it")
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
    if remote.startswith("_"):
        # Server names hold no "__" but may end in "_": server "a"'s tool "_x" and
        # server "a_"'s tool "x" would both be mcp__a___x, one shadowing the other.
        raise ValueError("a name starting with _ would make mcp__<server>__<name> ambiguous")
    schema = raw.get("inputSchema")
    if not isinstance(schema, dict):
        raise ValueError("no inputSchema object")
    if len(json.dumps(schema)) > MAX_SCHEMA_BYTES:
        raise ValueError(f"its inputSchema is over {MAX_SCHEMA_BYTES} bytes")
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
        _cut_description(description if isinstance(description, str) else ""),
        schema,
        server,
        remote,
        caller,
        _without_regexes(cls)(schema),
    )


def _cut_description(text: str) -> str:
    return text if len(text) <= MAX_DESCRIPTION_CHARS else text[:MAX_DESCRIPTION_CHARS] + "..."


def _no_check(validator: Any, value: Any, instance: Any, schema: Any) -> Iterator[Any]:
    return iter(())


def _without_regexes(cls: Any) -> Any:
    """``cls`` with ``pattern`` left to the server: the model's input never meets a server's regex.

    The input is checked in the daemon's Trio thread, and ``re`` cannot be
    interrupted and keeps the GIL: a backtracking ``pattern`` (``^(a+)+$``) and
    a 30-character argument a prompt injection put in the model's mouth held
    the whole daemon for minutes. The server, which wrote the regex, checks it
    in its own process. (``patternProperties`` still runs: its regexes meet
    property names, which a tool's schema rarely leaves open.)
    """
    return jsonschema.validators.extend(cls, {"pattern": _no_check})


def elicitation_problem(message: str, schema: Any) -> str | None:
    """Why a server's elicitation cannot be asked of a user, or None (docs/protocol.md §11).

    The ``requestedSchema`` comes from the server and the answer from a
    client, and the answer is checked against the schema in the daemon's
    Trio thread (``POST .../permissions/{perm_id}``): a schema outside MCP's
    restricted form must not make that check hang or fail. Refused: a
    question over :data:`MAX_ELICITATION_BYTES`; a schema that is not an
    object schema or not a valid JSON schema (an unknown type, a regex that
    does not compile: the check would raise, a 500); one with ``pattern`` or
    ``patternProperties`` (MCP's restricted form has none, and a backtracking
    regex such as ``^(a+)+$`` against a 30-character answer holds the
    daemon for minutes: ``re`` cannot be interrupted and keeps the GIL); one
    with a ``$ref`` that is not local to the schema (never fetched, but
    unresolvable: the check would raise).
    """
    if not isinstance(schema, dict) or schema.get("type") != "object":
        return "its requestedSchema is not an object schema"
    try:
        size = len(json.dumps(schema)) + len(message.encode())
    except (TypeError, ValueError):
        return "its requestedSchema is not JSON"
    if size > MAX_ELICITATION_BYTES:
        return f"it is over {MAX_ELICITATION_BYTES} bytes"
    stack: list[Any] = [schema]  # schemas only: names and data are not walked as keywords
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
            continue
        if not isinstance(node, dict):
            continue
        for key, value in node.items():
            if key in _REGEX_KEYWORDS:
                return f"its requestedSchema uses {key} (a regex), outside MCP's restricted form"
            if key in _REF_KEYWORDS and not (isinstance(value, str) and value.startswith("#")):
                return f"its requestedSchema has a {key} outside itself ({value!r})"
            if key in _NAMED_SCHEMAS and isinstance(value, dict):
                stack.extend(value.values())
            elif key not in _DATA_KEYWORDS:
                stack.append(value)
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        cls.check_schema(schema)
    except jsonschema.exceptions.SchemaError as exc:
        return f"its requestedSchema is not a valid JSON schema: {exc.message}"
    return None


def map_result(server: str, tool: str, result: types.CallToolResult) -> ToolOutput:
    """A ``tools/call`` result as a tool's output (module docstring).

    Raises:
        ToolError: ``error`` for an ``isError`` result, with its text.
    """
    parts: list[str] = []
    files: list[tuple[str, bytes]] = []
    for block in result.content:
        if isinstance(block, types.TextContent):
            parts.append(block.text)
        elif result.is_error or (kept := _file(block, files)) is None:
            parts.append(_placeholder(block))
        elif isinstance(kept, str):
            parts.append(kept)
        else:
            files.append(kept)
    text, notes = _cut("\n".join(parts))
    structured = result.structured_content
    if structured is not None and len(json.dumps(structured)) > MAX_RESULT_BYTES:
        structured = None
        notes.append(f"its structured result was over {MAX_RESULT_BYTES} bytes and was dropped")
    if notes:
        text += f"\n[gateway: {'; '.join(notes)}]"
    if result.is_error:
        raise ToolError("error", text or f"MCP server {server}: tool {tool} failed")
    return ToolOutput(text, structured, files)


def _file(block: Any, files: list[tuple[str, bytes]]) -> tuple[str, bytes] | str | None:
    """An image's or audio's media type and bytes; a line saying why it is not kept; or
    ``None`` for content that is neither (its placeholder)."""
    if isinstance(block, types.ImageContent):
        kind = "image"
        if block.mime_type.startswith("audio/"):  # kept unchecked as audio by the session
            return f"[image: {block.mime_type[:100]!r} is not an image type, not kept]"
    elif isinstance(block, types.AudioContent):
        kind = "audio"
        if not _AUDIO_TYPE.fullmatch(block.mime_type):
            return f"[audio: {block.mime_type[:100]!r} is not an audio type, not kept]"
    else:
        return None
    shown = block.mime_type[:100]
    if len(files) >= MAX_RESULT_FILES:
        return f"[{kind}: {shown}, past the {MAX_RESULT_FILES} files a result keeps, not kept]"
    size = len(block.data) * 3 // 4  # what it decodes to, within 2 bytes
    if sum(len(data) for _, data in files) + size > MAX_RESULT_FILE_BYTES:
        most = MAX_RESULT_FILE_BYTES
        return f"[{kind}: {shown}, {size} bytes, past the {most} a result's files keep, not kept]"
    try:
        return block.mime_type, base64.b64decode(block.data, validate=True)
    except (binascii.Error, ValueError):
        return f"[{kind}: {shown}, not base64, not kept]"


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

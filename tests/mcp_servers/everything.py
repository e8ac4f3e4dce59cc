"""A test MCP server with one tool per behaviour the gateway's MCP adapter must handle.

Written with the ``mcp`` SDK's low-level server, so that a tool can carry a
schema the model cannot use. Run as ``python tests/mcp_servers/everything.py``
(stdio) or ``... --http`` (streamable HTTP on 127.0.0.1, a free port, printed
as ``PORT <n>`` on stdout once it listens).

Tools:

- ``echo {text}``: the text.
- ``slow {seconds, marker?}``: sleeps; if cancelled (``notifications/cancelled``),
  writes ``cancelled`` to ``marker`` first.
- ``fail``: an ``isError`` result, ``boom``.
- ``crash``: raises (a JSON-RPC error).
- ``die``: the server exits at once (``os._exit``).
- ``elicit {question}``: asks the client (``elicitation/create``), answers
  ``<action> <content as JSON>``.
- ``huge {mb}``: a text result of ``mb`` MiB.
- ``structured``: a text and a ``structuredContent``.
- ``image``: a text and an image that is not one (a PNG's first bytes only).
- ``picture``: a text, a real 2x2 PNG (:data:`PICTURE`), a WAV's worth of audio,
  and a resource link.
- ``where``: the working directory, ``HOME`` and ``MCP_TEST_ENV``.
- ``headers``: the HTTP request's ``authorization`` and ``x-test`` headers.
- ``grow``: adds the tool ``extra`` and sends ``notifications/tools/list_changed``.
- ``overflow``: for the call's progress token, a ``notifications/progress`` whose
  ``progress`` is ``10**400`` (a JSON integer no float holds), then one of ``1``;
  answers ``done``.

With ``MCP_PID_FILE`` in its environment, the server appends its pid to that
file when it starts (the tests that check no server outlives its daemon); with
``MCP_STUBBORN`` it ignores SIGTERM and lingers after its stdin ends, so only
a SIGKILL (the daemon's escalation, or its watchdog's) ends it.

The SDK's server refuses to send a tool schema a model cannot use: that case is
``raw_schemas.py``, written without the SDK.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time
from typing import Any

import anyio
import mcp_types as types
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server

_OBJECT = {"type": "object", "properties": {}}
PICTURE = (
    "iVBORw0KGgoAAAANSUhEUgAAAAIAAAACCAIAAAD91JpzAAAAFklEQVR4nGM8"
    "ISfHwMDAxMDAwMDAAAANBAEIfXHKZgAAAABJRU5ErkJggg=="
)
"""A 2x2 PNG, base64 (tests.files_support.png(2, 2))."""
AUDIO = "UklGRiQAAABXQVZF"
"""A few bytes called audio (a WAV header's start): audio is kept unchecked."""

TOOLS = [
    types.Tool(
        name="echo",
        description="Echo a text.",
        input_schema={
            "type": "object",
            "properties": {"text": {"type": "string"}},
            "required": ["text"],
        },
    ),
    types.Tool(
        name="slow",
        description="Sleep, cancellably.",
        input_schema={
            "type": "object",
            "properties": {"seconds": {"type": "number"}, "marker": {"type": "string"}},
            "required": ["seconds"],
        },
    ),
    types.Tool(name="fail", description="An error result.", input_schema=_OBJECT),
    types.Tool(name="crash", description="Raises.", input_schema=_OBJECT),
    types.Tool(name="die", description="Kills the server.", input_schema=_OBJECT),
    types.Tool(
        name="elicit",
        description="Ask the user.",
        input_schema={"type": "object", "properties": {"question": {"type": "string"}}},
    ),
    types.Tool(
        name="huge",
        description="A big result.",
        input_schema={"type": "object", "properties": {"mb": {"type": "number"}}},
    ),
    types.Tool(name="structured", description="Structured content.", input_schema=_OBJECT),
    types.Tool(name="image", description="An image.", input_schema=_OBJECT),
    types.Tool(name="picture", description="A picture and a sound.", input_schema=_OBJECT),
    types.Tool(name="where", description="Where the server runs.", input_schema=_OBJECT),
    types.Tool(name="headers", description="The HTTP headers.", input_schema=_OBJECT),
    types.Tool(name="grow", description="Add a tool.", input_schema=_OBJECT),
    types.Tool(name="overflow", description="A progress no float holds.", input_schema=_OBJECT),
]
EXTRA = types.Tool(name="extra", description="Added by grow.", input_schema=_OBJECT)
grown = False


def text(value: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(text=value)])


async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
    return types.ListToolsResult(tools=[*TOOLS, EXTRA] if grown else TOOLS)


async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
    global grown
    args: dict[str, Any] = params.arguments or {}
    name = params.name
    if name == "echo":
        return text(str(args["text"]))
    if name == "slow":
        try:
            await anyio.sleep(float(args["seconds"]))
        except anyio.get_cancelled_exc_class():
            if args.get("marker"):
                with anyio.CancelScope(shield=True):
                    await anyio.Path(args["marker"]).write_text("cancelled")
            raise
        return text(f"slept {args['seconds']}")
    if name == "fail":
        return types.CallToolResult(content=[types.TextContent(text="boom")], is_error=True)
    if name == "crash":
        raise RuntimeError("crashed on purpose")
    if name == "die":
        os._exit(3)
    if name == "elicit":
        result = await ctx.session.elicit_form(
            args.get("question", "Proceed?"),
            {
                "type": "object",
                "properties": {"ok": {"type": "boolean"}, "note": {"type": "string"}},
                "required": ["ok"],
            },
            related_request_id=ctx.request_id,
        )
        return text(f"{result.action} {json.dumps(result.content, sort_keys=True)}")
    if name == "huge":
        return text("x" * int(float(args.get("mb", 2)) * 1024 * 1024))
    if name == "structured":
        return types.CallToolResult(
            content=[types.TextContent(text="two items")],
            structured_content={"items": [1, 2]},
        )
    if name == "image":
        return types.CallToolResult(
            content=[
                types.TextContent(text="a picture:"),
                types.ImageContent(data="iVBORw0KGgo=", mime_type="image/png"),
            ]
        )
    if name == "picture":
        return types.CallToolResult(
            content=[
                types.TextContent(text="a picture and a sound:"),
                types.ImageContent(data=PICTURE, mime_type="image/png"),
                types.AudioContent(data=AUDIO, mime_type="audio/wav"),
                types.ResourceLink(name="more", uri="file:///more.png"),
            ]
        )
    if name == "where":
        return text(
            json.dumps(
                {
                    "cwd": os.getcwd(),
                    "home": os.environ.get("HOME"),
                    "env": os.environ.get("MCP_TEST_ENV"),
                    "keys": sorted(os.environ),
                }
            )
        )
    if name == "headers":
        request = ctx.request
        got = {} if request is None else dict(request.headers)
        return text(json.dumps({k: got.get(k) for k in ("authorization", "x-test")}))
    if name == "grow":
        grown = True
        await ctx.session.send_tool_list_changed()
        return text("grown")
    if name == "overflow":
        token = (params.meta or {}).get("progress_token")
        outbound = ctx.session._request_outbound  # raw: the SDK's own API takes a float
        for progress in (10**400, 1):
            await outbound.notify(
                "notifications/progress", {"progressToken": token, "progress": progress}
            )
        return text("done")
    if name == "extra":
        return text("extra works")
    return types.CallToolResult(content=[types.TextContent(text=f"no {name}")], is_error=True)


server = Server("everything", on_list_tools=list_tools, on_call_tool=call_tool)


async def run_stdio() -> None:
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


def run_http() -> None:
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    port = sock.getsockname()[1]
    app = server.streamable_http_app()
    config = uvicorn.Config(app, log_level="warning", lifespan="on")
    print(f"PORT {port}", flush=True)
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    if pid_file := os.environ.get("MCP_PID_FILE"):
        with open(pid_file, "a") as f:
            f.write(f"{os.getpid()}\n")
    stubborn = bool(os.environ.get("MCP_STUBBORN"))
    if stubborn:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if "--http" in sys.argv:
        run_http()
    else:
        anyio.run(run_stdio)
    while stubborn:
        time.sleep(3600)

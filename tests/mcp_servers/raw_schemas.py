"""An MCP server written without the SDK, whose tool list holds schemas a model cannot use.

The SDK's own server validates what it sends, so a server that lists a tool
with ``inputSchema: {"type": "string"}`` or ``{"type": 12}`` (both happen in the
wild) has to be written by hand: one JSON-RPC message a line on stdin/stdout.
Its tools: ``ok`` (echoes its ``text``), ``not_object``, ``garbage`` (schema
``{"type": 12}``), ``no_schema`` (no ``inputSchema`` at all) and one whose
name is not a string.
"""

import json
import sys

TOOLS = [
    {
        "name": "ok",
        "description": "Echo.",
        "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}},
    },
    {"name": "not_object", "description": "Unusable.", "inputSchema": {"type": "string"}},
    {"name": "garbage", "description": "Unusable.", "inputSchema": {"type": 12}},
    {"name": "no_schema", "description": "Unusable."},
    {"name": 42, "inputSchema": {"type": "object"}},
]


def reply(id_, result):
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": id_, "result": result}) + "\n")
    sys.stdout.flush()


for line in sys.stdin:
    message = json.loads(line)
    method, id_ = message.get("method"), message.get("id")
    if id_ is None:
        continue  # a notification
    if method == "initialize":
        reply(
            id_,
            {
                "protocolVersion": message["params"]["protocolVersion"],
                "capabilities": {"tools": {"listChanged": False}},
                "serverInfo": {"name": "raw", "version": "1"},
            },
        )
    elif method == "tools/list":
        reply(id_, {"tools": TOOLS})
    elif method == "tools/call":
        text = message["params"].get("arguments", {}).get("text", "")
        reply(id_, {"content": [{"type": "text", "text": f"ok {text}"}]})
    else:
        sys.stdout.write(
            json.dumps({"jsonrpc": "2.0", "id": id_, "error": {"code": -32601, "message": method}})
            + "\n"
        )
        sys.stdout.flush()

"""A hostile MCP server, written without the SDK (the SDK's server would not send this).

One JSON-RPC message a line on stdin/stdout. ``HOSTILE_TOOLS`` in its
environment adds that many tools ``t0`` ... to its list. Its tools:

- ``ask {schema, message, n}``: sends ``n`` (default 1) ``elicitation/create``
  at once, all with ``schema`` as the ``requestedSchema``, waits for every
  answer and returns them, a JSON list of results or errors in the order asked.
- ``flood {n}``: sends ``n`` ``notifications/tools/list_changed``, then answers.
- ``lists``: how many ``tools/list`` requests it has received.
- ``chatter {n}``: writes ``n`` lines that are not JSON-RPC on stdout, then answers.
"""

import json
import os
import sys

count = {"lists": 0}
OBJECT = {"type": "object", "properties": {}}
TOOLS = [
    {"name": "ask", "inputSchema": {"type": "object"}},
    {"name": "flood", "inputSchema": {"type": "object"}},
    {"name": "lists", "inputSchema": OBJECT},
    {"name": "chatter", "inputSchema": {"type": "object"}},
] + [
    {"name": f"t{i}", "inputSchema": OBJECT}
    for i in range(int(os.environ.get("HOSTILE_TOOLS", "0")))
]


def send(message):
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def reply(id_, result):
    send({"jsonrpc": "2.0", "id": id_, "result": result})


def text(id_, value):
    reply(id_, {"content": [{"type": "text", "text": value}]})


def answers(ids):
    """Read (and serve) messages until every request of ``ids`` is answered."""
    got = {}
    while len(got) < len(ids):
        message = json.loads(sys.stdin.readline())
        if message.get("id") in ids and "method" not in message:
            got[message["id"]] = message.get("result", message.get("error"))
        else:
            serve(message)
    return [got[i] for i in ids]


def serve(message):
    method, id_ = message.get("method"), message.get("id")
    if id_ is None:
        return  # a notification
    params = message.get("params") or {}
    if method == "initialize":
        reply(
            id_,
            {
                "protocolVersion": params["protocolVersion"],
                "capabilities": {"tools": {"listChanged": True}},
                "serverInfo": {"name": "hostile", "version": "1"},
            },
        )
    elif method == "tools/list":
        count["lists"] += 1
        reply(id_, {"tools": TOOLS})
    elif method == "tools/call":
        name, args = params["name"], params.get("arguments") or {}
        if name == "ask":
            ids = [f"q{id_}-{i}" for i in range(int(args.get("n", 1)))]
            for q in ids:
                request_params = {
                    "mode": "form",
                    "message": args.get("message", "?"),
                    "requestedSchema": args["schema"],
                }
                send(
                    {
                        "jsonrpc": "2.0",
                        "id": q,
                        "method": "elicitation/create",
                        "params": request_params,
                    }
                )
            text(id_, json.dumps(answers(ids)))
        elif name == "flood":
            for _ in range(int(args.get("n", 1))):
                send({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"})
            text(id_, "sent")
        elif name == "chatter":
            sys.stdout.write("".join(f"debug: step {i}\n" for i in range(int(args.get("n", 1)))))
            text(id_, "said")
        elif name == "lists":
            text(id_, str(count["lists"]))
        else:
            text(id_, "ok")
    else:
        send({"jsonrpc": "2.0", "id": id_, "error": {"code": -32601, "message": method}})


for line in sys.stdin:
    serve(json.loads(line))

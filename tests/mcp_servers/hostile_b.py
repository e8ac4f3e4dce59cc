"""An MCP server that asks its client for sampling and URL-mode elicitations, without the SDK.

One JSON-RPC message a line on stdin/stdout (the SDK's server would not send
a flood, a 1M-token request, or a ``javascript:`` URL). Its tools:

- ``sample {text, n, max_tokens, system, image}``: sends ``n`` (default 1)
  ``sampling/createMessage`` at once, each one user message ``text`` (an
  image instead with ``image``), waits for every answer and returns them, a
  JSON list of results or errors in the order asked.
- ``visit {url, message, complete}``: sends one URL-mode ``elicitation/create``
  (``elicitationId`` ``el-<id>``); with ``complete``, its
  ``notifications/elicitation/complete`` right after; returns the answer.
- ``gate {url}``: fails ``-32042`` (URL elicitation required, ``url`` in its
  data); called again with the same ``url`` (the retry), answers ``passed``.
"""

import json
import sys

TOOLS = [
    {"name": "sample", "inputSchema": {"type": "object"}},
    {"name": "visit", "inputSchema": {"type": "object"}},
    {"name": "gate", "inputSchema": {"type": "object"}},
]
gates = set()  # the URLs whose gate failed once


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


def sample(id_, args):
    ids = [f"s{id_}-{i}" for i in range(int(args.get("n", 1)))]
    if args.get("image"):
        content = {"type": "image", "data": "iVBORw0KGgo=", "mimeType": "image/png"}
    else:
        content = {"type": "text", "text": args.get("text", "hello")}
    params = {
        "messages": [{"role": "user", "content": content}],
        "maxTokens": int(args.get("max_tokens", 100)),
    }
    if "system" in args:
        params["systemPrompt"] = args["system"]
    for q in ids:
        send({"jsonrpc": "2.0", "id": q, "method": "sampling/createMessage", "params": params})
    text(id_, json.dumps(answers(ids)))


def visit(id_, args):
    q = f"v{id_}"
    params = {
        "mode": "url",
        "message": args.get("message", "Sign in, please"),
        "url": args["url"],
        "elicitationId": f"el-{id_}",
    }
    send({"jsonrpc": "2.0", "id": q, "method": "elicitation/create", "params": params})
    if args.get("complete"):
        send(
            {
                "jsonrpc": "2.0",
                "method": "notifications/elicitation/complete",
                "params": {"elicitationId": f"el-{id_}"},
            }
        )
    text(id_, json.dumps(answers([q])[0]))


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
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "hostile_b", "version": "1"},
            },
        )
    elif method == "tools/list":
        reply(id_, {"tools": TOOLS})
    elif method == "tools/call":
        name, args = params["name"], params.get("arguments") or {}
        if name == "sample":
            sample(id_, args)
        elif name == "visit":
            visit(id_, args)
        elif name == "gate":
            if args["url"] in gates:
                gates.discard(args["url"])
                text(id_, "passed")
                return
            gates.add(args["url"])
            needed = {"mode": "url", "url": args["url"], "message": "Authorize first",
                      "elicitationId": f"gate-{id_}"}  # fmt: skip
            error = {"code": -32042, "message": "authorization required",
                     "data": {"elicitations": [needed]}}  # fmt: skip
            send({"jsonrpc": "2.0", "id": id_, "error": error})
        else:
            text(id_, "ok")
    else:
        send({"jsonrpc": "2.0", "id": id_, "error": {"code": -32601, "message": method}})


for line in sys.stdin:
    serve(json.loads(line))

"""A hostile MCP server for progress, logging, roots and resources, written without the SDK.

One JSON-RPC message a line on stdin/stdout. It declares ``tools``,
``resources`` and ``logging``. ``HOSTILE_A_LOG`` in its environment names a file
where it appends one JSON line per request it receives (method and params), so a
test can see what the gateway sent it. Its tools:

- ``progress {n, gap_ms, total, late}``: sends ``n`` ``notifications/progress``
  for the call's token (progress 1 ... n, ``message`` "step i"), ``gap_ms``
  apart (default 0), then answers ``done`` (first, with ``raw``, one progress per string
  of it, that string the ``progress`` value's JSON text, e.g. ``1e999``); with ``late``,
  sends one more progress for that token after its answer, and one for a token it never had.
- ``log {n, level}``: sends ``n`` ``notifications/message`` (``data`` "line i"),
  then answers.
- ``storm {n}``: sends ``n`` of each ``list_changed`` (tools, resources,
  prompts, and roots: a client's notice, sent the wrong way) and
  ``resources/updated``, then answers.
- ``roots {wait_ms}``: asks the client ``roots/list`` (after ``wait_ms``) and answers with
  what it got (JSON).
- ``link {uri}``: answers a ``resource_link`` to ``uri``.
- ``level``: the level the last ``logging/setLevel`` asked for (with
  ``HOSTILE_A_REFUSE_LEVEL`` in its environment, it refuses every one; with
  ``HOSTILE_A_HANG_START``, it answers neither that nor ``resources/templates/list``).

Its resources (``resources/read``): ``mem://text`` (a line of text),
``mem://big?mb=N`` (N MiB of text), ``mem://image`` (a PNG blob), ``mem://bin``
(an ``application/octet-stream`` blob), ``mem://textblob`` (a ``text/plain``
blob), ``mem://two`` (two text contents), ``mem://die`` (it exits),
``mem://hang`` (never answered); any
other URI, ``file://`` ones included, is refused (-32002, "not found"): it reads
no file. One resource template, ``mem://{name}``.
"""

import base64
import json
import os
import sys

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n").decode()
state = {"level": None, "next": 0}
OBJECT = {"type": "object"}
TOOLS = [
    {"name": n, "inputSchema": OBJECT}
    for n in ("progress", "log", "storm", "roots", "link", "level")
]


def send(message):
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def reply(id_, result):
    send({"jsonrpc": "2.0", "id": id_, "result": result})


def error(id_, code, message):
    send({"jsonrpc": "2.0", "id": id_, "error": {"code": code, "message": message}})


def text(id_, value):
    reply(id_, {"content": [{"type": "text", "text": value}]})


def notify(method, params=None):
    send({"jsonrpc": "2.0", "method": method, **({"params": params} if params else {})})


def record(message):
    path = os.environ.get("HOSTILE_A_LOG")
    if path and "method" in message:
        with open(path, "a") as f:
            f.write(
                json.dumps({"method": message["method"], "params": message.get("params")}) + "\n"
            )


def answer_of(request_id):
    """Read (and serve) messages until the answer to ``request_id`` comes."""
    while True:
        message = json.loads(sys.stdin.readline())
        if message.get("id") == request_id and "method" not in message:
            return message.get("result", message.get("error"))
        serve(message)


def read(id_, uri):
    if uri == "mem://text":
        contents = [{"uri": uri, "mimeType": "text/plain", "text": "hello from mem"}]
    elif uri.startswith("mem://big"):
        mb = int(uri.partition("mb=")[2] or "2")
        contents = [{"uri": uri, "mimeType": "text/plain", "text": "x" * (mb * 1024 * 1024)}]
    elif uri == "mem://image":
        contents = [{"uri": uri, "mimeType": "image/png", "blob": PNG}]
    elif uri == "mem://bin":
        contents = [{"uri": uri, "mimeType": "application/octet-stream", "blob": PNG}]
    elif uri == "mem://die":
        os._exit(3)
    elif uri == "mem://hang":
        sys.stdin.readline()  # never answers this one (serves nothing until its next line)
        return
    elif uri == "mem://textblob":
        blob = base64.b64encode("a text blob: é".encode()).decode()
        contents = [{"uri": uri, "mimeType": "text/plain", "blob": blob}]
    elif uri == "mem://two":
        contents = [{"uri": "mem://a", "text": "first"}, {"uri": "mem://b", "text": "second"}]
    else:
        error(id_, -32002, f"Resource not found: {uri}")
        return
    reply(id_, {"contents": contents})


def call(id_, name, args, token):
    if name == "progress":
        import time

        n, gap = int(args.get("n", 1)), float(args.get("gap_ms", 0)) / 1000
        for raw in args.get("raw", []):  # a value as its JSON text, whatever it is
            sys.stdout.write(
                '{"jsonrpc": "2.0", "method": "notifications/progress", "params":'
                f' {{"progressToken": {json.dumps(token)}, "progress": {raw}}}}}\n'
            )
            sys.stdout.flush()
        for i in range(1, n + 1):
            params = {"progressToken": token, "progress": i, "message": f"step {i}"}
            if "total" in args:
                params["total"] = args["total"]
            notify("notifications/progress", params)
            if gap:
                time.sleep(gap)
        text(id_, "done")
        if args.get("late"):
            notify("notifications/progress", {"progressToken": token, "progress": n + 1})
            notify("notifications/progress", {"progressToken": "never-mine", "progress": 1})
    elif name == "log":
        level = args.get("level", "info")
        for i in range(int(args.get("n", 1))):
            notify(
                "notifications/message", {"level": level, "logger": "hostile", "data": f"line {i}"}
            )
        text(id_, "logged")
    elif name == "storm":
        for _ in range(int(args.get("n", 1))):
            notify("notifications/tools/list_changed")
            notify("notifications/resources/list_changed")
            notify("notifications/prompts/list_changed")
            notify("notifications/roots/list_changed")  # a client's notice, sent the wrong way
            notify("notifications/resources/updated", {"uri": "mem://text"})
        text(id_, "stormed")
    elif name == "roots":
        if args.get("wait_ms"):
            import time

            time.sleep(float(args["wait_ms"]) / 1000)
        state["next"] += 1
        request_id = f"roots-{state['next']}"
        send({"jsonrpc": "2.0", "id": request_id, "method": "roots/list"})
        text(id_, json.dumps(answer_of(request_id)))
    elif name == "link":
        link = {"type": "resource_link", "uri": args.get("uri", "mem://text"), "name": "a link"}
        reply(id_, {"content": [{"type": "text", "text": "see:"}, link]})
    elif name == "level":
        text(id_, str(state["level"]))
    else:
        error(id_, -32602, f"unknown tool {name}")


def serve(message):
    record(message)
    method, id_ = message.get("method"), message.get("id")
    if id_ is None:
        return  # a notification
    params = message.get("params") or {}
    if method == "initialize":
        capabilities = {"tools": {"listChanged": True}, "resources": {}, "logging": {}}
        reply(
            id_,
            {
                "protocolVersion": params["protocolVersion"],
                "capabilities": capabilities,
                "serverInfo": {"name": "hostile_a", "version": "1"},
            },
        )
    elif method == "tools/list":
        reply(id_, {"tools": TOOLS})
    elif method in ("resources/templates/list", "logging/setLevel") and os.environ.get(
        "HOSTILE_A_HANG_START"
    ):
        return  # never answered
    elif method == "resources/templates/list":
        template = {"uriTemplate": "mem://{name}", "name": "memory", "mimeType": "text/plain"}
        reply(id_, {"resourceTemplates": [template]})
    elif method == "resources/read":
        read(id_, params.get("uri", ""))
    elif method == "logging/setLevel":
        if os.environ.get("HOSTILE_A_REFUSE_LEVEL"):
            error(id_, -32601, "no setLevel here")
            return
        state["level"] = params.get("level")
        reply(id_, {})
    elif method == "tools/call":
        token = (params.get("_meta") or {}).get("progressToken")
        call(id_, params["name"], params.get("arguments") or {}, token)
    else:
        error(id_, -32601, method)


for line in sys.stdin:
    serve(json.loads(line))

"""The handlers of the HTTP API (docs/protocol.md §2), one module per resource.

Each handler is ``async def name(api, req, *ids)``: the
:class:`~gateway.server.routes.Api` that routed the request (its node, the
caller's key, the sessions that key may see), the request, and the path's ids
in order. Which path and method reach which handler, with what the API
document says of them, is the table of gateway.server.route_table; a
handler's name is its ``operationId``.

- ``sessions``: create, list and page sessions; a session's messages.
- ``turns``: a turn, its cancel, a permission's decision, a compaction, feedback.
- ``attach``: a session's attach token and the stream's WebSocket handshake.
- ``admin``: the probes, the metrics, the API document, the agents.
- ``page``: the web page and its files (gateway.ui).
"""

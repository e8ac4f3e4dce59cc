"""A task's SSE stream, fed from the session's hub like any client (docs/doors/a2a.md).

The task's :class:`TaskSubscriber` (a :class:`~gateway.doors.oneway.OneWayQueue`)
joins the session's hub through the seam before anything it streams happens
(live, before a turn is submitted or an approval decided; or replayed from
the turn's start, for ``SubscribeToTask``), with the same bounded delivery
queue and slow-client rule as every stream (docs/protocol.md §3, §14).
:class:`TaskReader` gives each gateway event to the task's
:class:`~gateway.doors.a2a.feed.TaskFeed` and writes what it makes as
server-sent events: ``id:`` the event's cursor, ``data:`` the JSON-RPC
response whose ``result`` is the A2A ``StreamResponse``. The stream ending
(the client gone) never cancels the turn.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from gateway.doors.a2a import shapes as a2
from gateway.doors.a2a.feed import Out, TaskFeed
from gateway.doors.oneway import OneWayQueue, TypedReader, close_named
from gateway.protocol.events import Envelope


class TaskSubscriber(OneWayQueue):
    """A task stream's side of the hub and the seam: its delivery queue (module docstring)."""

    queue_name = "A2A task queue"
    closes_how = "closing the stream"
    prefix = "a2a"  # its subscription's name: a2a-N
    left_as = "task_streamed"


class TaskReader(TypedReader):
    """The task's part of the pump: the events through its feed, as SSE events.

    A queue closed for another reason than slowness (the session deleted, this
    node's relay of it lost) ends the stream with a JSON-RPC error event
    (``event: error``, -32603, the close's name in its data).
    """

    def __init__(self, feed: TaskFeed, request_id: a2.RequestId) -> None:
        self.feed = feed
        self.request_id = request_id

    @property
    def finished(self) -> bool:
        return self.feed.finished

    def events(self, events: list[Envelope[Any]], replayed: bool) -> bytes:
        del replayed  # the feed reads a replay's whole messages and the live deltas alike
        return self.sse([out for event in events for out in self.feed.receive(event)])

    def pause(self) -> bytes:
        return self.sse(self.feed.pause())

    def closed(self, code: str | None) -> bytes:
        name, message = close_named(code)
        error = a2.RpcError(-32603, message, error_info(name, 503))
        body = a2.encoder.encode(a2.RpcErrorResponse(self.request_id, error))
        return b"event: error\ndata: " + body + b"\n\n"

    def sse(self, outs: Iterable[Out]) -> bytes:
        """Each event with its cursor as its ``id:``, its JSON-RPC response as its data."""
        return b"".join(
            b"id: "
            + str(at).encode()
            + b"\ndata: "
            + a2.encoder.encode(a2.RpcResult(self.request_id, event))
            + b"\n\n"
            for at, event in outs
        )


ERROR_INFO = "type.googleapis.com/google.rpc.ErrorInfo"


def error_info(code: str, status: int) -> list[dict[str, Any]]:
    """A JSON-RPC error's ``data``: the gateway's error code, as A2A 1.0 carries details
    (a ``google.rpc.ErrorInfo``; the official client reads its ``metadata``)."""
    return [
        {
            "@type": ERROR_INFO,
            "reason": code.upper(),
            "domain": "gateway",
            "metadata": {"code": code, "status": str(status)},
        }
    ]

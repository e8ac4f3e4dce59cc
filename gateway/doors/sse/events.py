"""The native stream over server-sent events: ``GET /sessions/{id}/events`` (docs/doors/sse.md).

For networks that refuse WebSockets. The same stream as ``/sessions/{id}/stream``
(docs/protocol.md §3), one-way: the subscribe is the query
(``filter``, ``snapshot``, ``since``; ``Last-Event-ID`` stands for ``since``),
and each server frame is one SSE event whose ``data:`` is the frame's JSON, as
the WebSocket would carry it (``subscribe_ack``, ``snapshot``, ``event``,
``subscribe_error``); an event frame carries ``id:`` = the event's id, so a
reconnecting ``EventSource`` resumes where it left off.

The same rules as the WebSocket: the single-use attach token (a Bearer key that
is sent is checked, another key's session is 404), the stream counted against
``max_connections`` and ``max_connections_per_key``, the seam
(:func:`gateway.session.seam.subscribe`), the one bounded delivery queue and
its slow-client rule (:class:`~gateway.session.delivery.DeliveryQueue`). A
``: ping`` comment after ``ping_interval_s`` without a write keeps proxies
from closing an idle stream (there is no pong: a client gone is noticed when
a write fails). A close of the table of :mod:`gateway.protocol.closes`
(``client_too_slow``, ``session_deleted``, ``shutdown``, ``relay_gap``) is a
last frame ``{"type": "close", "code", "ws_code", "message", "reconnect"}``,
then the end of the body; a ``subscribe_error`` also ends it.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Awaitable, Callable, Sequence

import msgspec

from gateway.config import StreamConfig
from gateway.doors.context import SSE_HEADERS, DoorContext
from gateway.doors.oneway import EVENT_FRAME_HEAD, OneWayQueue, frame_payloads, pump
from gateway.errors import ApiError, SubscribeRejected
from gateway.http.body import StreamBody, chunk
from gateway.http.parsing import int_query
from gateway.http.server import Request, Response, StreamingResponse
from gateway.ids import format_event_id
from gateway.logs import event
from gateway.metrics import Metrics
from gateway.protocol.closes import CLOSES
from gateway.protocol.filters import Filter, resolve_filter
from gateway.protocol.frames import MAX_COALESCE_MS, Subscribe, SubscribeError, encode
from gateway.session import seam
from gateway.session.hub import Emitted, FrameBatch, encoded
from gateway.session.session import Session

log = logging.getLogger("gateway.stream")


class CloseFrame(msgspec.Struct, tag="close", tag_field="type"):
    """The last frame of a stream the gateway closes (the WebSocket's close, as data)."""

    code: str  # the close's name (gateway.protocol.closes)
    ws_code: int  # the WebSocket close code it stands for
    message: str
    reconnect: bool


class SseClient(OneWayQueue):
    """One SSE stream's side of the hub and the seam: its delivery queue (module docstring).

    Also one of the node's open connections (``node.connections``): shutdown
    and a deletion close it as they close a WebSocket. Its consumer is the
    one-way streams' :func:`~gateway.doors.oneway.pump`, reading with
    :class:`_Frames`; too slow, it writes the close frame as any other close.

    Args:
        session: the session it streams.
        config: ``[stream]``.
        metrics: where queue depths and slow clients are counted.
        address: the client's address, for the log (``host:port``; empty if unknown).
    """

    queue_name = "SSE stream queue"
    closes_how = "ending the SSE stream"
    prefix = "sse"
    slow_cuts = False  # a close frame, then the end of the body
    _names = itertools.count(1)

    def __init__(
        self, session: Session, config: StreamConfig, metrics: Metrics, address: str = ""
    ) -> None:
        super().__init__(session, config, metrics, address)
        self.config = config

    async def run(self, request: Subscribe, send: Callable[[bytes], Awaitable[None]]) -> None:
        """Subscribe through the seam, then write until a close or a ``subscribe_error``."""
        try:
            resolved, key = resolve_filter(request.filter)
        except SubscribeRejected as exc:
            await send(_sse(encode(SubscribeError(exc.code, exc.message))))  # type: ignore[arg-type]
            return
        if self.session.node.shutting_down:
            self.request_close("shutdown")
        elif self.session.deleted:
            self.request_close("session_deleted")
        else:
            done = await seam.subscribe(self.session, self, request, resolved, key, self.config)
            if done.error is not None:
                self.end_queue()
            event(
                log, logging.INFO, "client_subscribed",
                f"{self.client} subscribed to {self.session.id} ({done.mode}, SSE)",
                session_id=self.session.id, client=self.client, mode=done.mode,
                since=request.since,
            )  # fmt: skip
        if isinstance(send, StreamBody):  # the direct path (gateway.doors.oneway)
            self.direct_through(send, _live, _live_chunked if send.chunked else _live)
        await pump(self, _Frames(), send, self.config.ping_interval_s)


def _live(batch: FrameBatch) -> bytes:
    """A live batch as SSE, the same for every client of its filter (made once per batch)."""
    return b"".join([_sse(EVENT_FRAME_HEAD + e.data + b"}", e.seq) for e in batch.events])


def _live_chunked(batch: FrameBatch) -> bytes:
    """:func:`_live` as one HTTP/1.1 chunk: what the fan-out writes to an idle stream."""
    return chunk(encoded(batch, _live))


class _Frames:
    """The native stream's :class:`~gateway.doors.oneway.Reader`: each frame as it is, as SSE."""

    finished = False  # until the queue ends

    def live(self, events: Sequence[Emitted]) -> bytes:
        return b"".join(_sse(EVENT_FRAME_HEAD + e.data + b"}", e.seq) for e in events)

    def replay(self, frames: bytes) -> bytes:
        return b"".join(_sse(p) for p in frame_payloads(frames))

    def pause(self) -> bytes:
        return b""

    def closed(self, code: str | None) -> bytes | None:
        if code is None:  # a subscribe_error ended it: no close frame
            return None
        close = CLOSES[code]
        return _sse(encode(CloseFrame(code, close.ws_code, close.message, close.reconnect)))


async def events(ctx: DoorContext, req: Request, session_id: str) -> StreamingResponse | Response:
    """``GET /sessions/{id}/events``: the session's stream as SSE (module docstring).

    Refused before the stream starts, as the WebSocket handshake is: an
    unknown session (404), a bad query (400), the attach token (403), the
    stream limits (503).
    """
    node = ctx.node
    bearer = req.headers.get("authorization", "").partition(" ")[0].lower() == "bearer"
    caller = ctx.authenticate(req) if bearer else None
    session = await ctx.session(session_id, caller)
    request = subscribe_of(req)  # before the token: a bad query does not use it up
    if req.method == "HEAD":  # the head of a stream, with no token used up
        return Response(200, content_type="text/event-stream", headers=list(SSE_HEADERS))
    await node.redeem_token(req.query.get("attach"), session.id)
    release = await node.limits.open_stream(session.record.owner, "sse")  # 503 over_capacity
    client = SseClient(session, ctx.config.stream, node.metrics, req.client)
    node.connections.add(client)

    def over(reason: str) -> None:
        release()
        node.connections.discard(client)
        client.subscribed = False
        session.unregistered(client, reason)
        node.notify()  # shutdown waits for the connections to close

    async def run(send: Callable[[bytes], Awaitable[None]]) -> None:
        reason = "client_closed"
        try:
            await client.run(request, send)
            reason = client.closing or "subscribe_error"
        finally:
            over(reason)

    return StreamingResponse(run, headers=SSE_HEADERS, abandon=lambda: over("client_closed"))


def subscribe_of(req: Request) -> Subscribe:
    """The subscribe the query stands for; ``Last-Event-ID`` is ``since`` when that is absent.

    Raises:
        ApiError: 400 ``invalid_query``: ``snapshot`` not ``true``/``false``,
            a ``filter`` that is neither a preset name nor a filter object's JSON,
            or a ``coalesce_ms`` that is not an integer (422 out of 0..250).
    """
    raw_filter = req.query.get("filter", "preset:chat")
    filter_: Filter | str = raw_filter
    if raw_filter.lstrip().startswith("{"):
        try:
            filter_ = msgspec.json.decode(raw_filter, type=Filter)
        except msgspec.ValidationError as exc:
            raise ApiError(400, "invalid_query", f"filter: {exc}") from None
        except msgspec.DecodeError:
            raise ApiError(400, "invalid_query", "filter is not JSON") from None
    snapshot = req.query.get("snapshot", "false")
    if snapshot not in ("true", "false"):
        raise ApiError(400, "invalid_query", f"snapshot must be true or false, got {snapshot!r}")
    since = req.query.get("since") or req.headers.get("last-event-id") or None
    return Subscribe(filter_, since, snapshot == "true", _coalesce_ms(req))


def _coalesce_ms(req: Request) -> int | None:
    """``?coalesce_ms=``: the delta rollup window (docs/protocol.md §3 "Delta rollup");
    absent: the server's ``[stream] coalesce_ms``.

    Raises:
        ApiError: ``invalid_query``: 400 not an integer, 422 out of 0..250.
    """
    if "coalesce_ms" not in req.query:
        return None
    return int_query(req, "coalesce_ms", default=0, low=0, high=MAX_COALESCE_MS)


# --- SSE encoding ----------------------------------------------------------------------


class _EventId(msgspec.Struct):
    id: str


class _Head(msgspec.Struct):
    type: str
    event: _EventId | None = None


_head = msgspec.json.Decoder(_Head)


def _sse(data: bytes, seq: int | None = None) -> bytes:
    """One SSE event: ``id:`` (an event frame's id) and ``data:`` (one line: compact JSON)."""
    if seq is None and data.startswith(EVENT_FRAME_HEAD):
        head = _head.decode(data)
        if head.event is not None:
            return b"id: " + head.event.id.encode() + b"\ndata: " + data + b"\n\n"
    if seq is not None:
        return b"id: " + format_event_id(seq).encode() + b"\ndata: " + data + b"\n\n"
    return b"data: " + data + b"\n\n"

"""The AI SDK's WebSocket door: ``GET /ai-sdk/ws``, ``WebSocketChatTransport``'s frames.

One socket carries any number of requests, each named by the client's
``requestId`` (docs/doors/aisdk.md):

- ``send`` (the ``DefaultChatTransport`` body's fields: ``id``, ``messages``,
  ``trigger``) starts a response as ``POST /ai-sdk/chat`` does
  (:meth:`gateway.doors.aisdk.routes.Responses.send`); ``resume`` answers the chat's
  turn in flight from its start, its chunks after ``lastSequence`` when given,
  or ``no-active``.
- Each response is ``start``, then its chunks as ``chunk`` frames numbered from
  0 (``sequence``), then ``end``; a request refused is one ``error`` frame
  (``errorText``: the refusal's code and message, as the HTTP door's JSON error).
- ``abort`` of a ``send`` cancels the turn it streams (docs/protocol.md §8; a
  queued one never starts) and ends its response; ``abort`` of a ``resume`` ends
  that response only (useChat aborts a resume it replaces). The socket closing
  never cancels a turn.
- Each response counts as a stream of the key (``max_connections``,
  ``max_connections_per_key``), besides the socket itself: one refused is an
  ``error`` frame ``over_capacity``.

Each response has its own bounded queue; one that overflows closes the socket
with 1008 ``client_too_slow`` (docs/protocol.md §3), and the transport resumes.
A frame that is not one of these is answered with an ``error`` frame when it
names a request, and closes the socket with 1003 otherwise.

Browsers cannot send headers on a WebSocket: where API keys are configured the
key is taken from ``Authorization: Bearer`` or the ``key`` query parameter.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from typing import Any

import msgspec
import trio

from gateway.doors.aisdk import chunks as ui
from gateway.doors.aisdk.routes import Opened, Responses, UiMessage
from gateway.doors.aisdk.stream import respond
from gateway.doors.context import DoorContext
from gateway.doors.oneway import SlowClient
from gateway.errors import ApiError, Refused
from gateway.http.openapi import Operation, Query
from gateway.http.refusals import as_http
from gateway.http.server import Request, WebSocketAccept
from gateway.http.websocket import ConnectionClosed, WebSocket
from gateway.logs import event
from gateway.protocol.closes import close_reason
from gateway.protocol.framing import text_frame
from gateway.tenancy import NO_OWNER

log = logging.getLogger("gateway.aisdk")

KEY = Query(
    "key",
    {"type": "string"},
    "An API key, where keys are configured and the client cannot send a header (a browser).",
)

WS = Operation(
    "The AI SDK's WebSocketChatTransport (upgrade)",
    None,
    101,
    query=(KEY,),
    auth="optional",
    errors={
        426: ("upgrade_required",),
        503: ("over_capacity",),
    },
    description="`send`, `resume` (`lastSequence`), `abort` in; `start`, `chunk` "
    "(`sequence`), `end`, `error`, `no-active` out, each with its `requestId` "
    "(docs/doors/aisdk.md). `abort` cancels the turn; closing the socket does "
    "not. The API key, where keys are configured: `Authorization: Bearer` or "
    "the `key` query parameter.",
)


class _Frame(msgspec.Struct):
    type: str
    id: str | None = None
    messages: list[Any] | None = None
    trigger: str = "submit-message"
    last_sequence: int | None = msgspec.field(default=None, name="lastSequence")


_json = msgspec.json.Decoder()
_encode = msgspec.json.Encoder().encode


@dataclass
class _Request:
    """One request of the socket: its task's scope, and what it streams once opened."""

    scope: trio.CancelScope
    kind: str  # "send" or "resume"
    opened: Opened | None = None
    aborted: bool = False  # its response is to end (and a send's turn to be cancelled)


class ChatSocket:
    """One ``/ai-sdk/ws`` connection (module docstring)."""

    def __init__(self, responses: Responses, ws: WebSocket, caller: str | None, client: str):
        self.responses = responses
        self.ws = ws
        self.caller = caller
        self.client = client
        self.requests: dict[str, _Request] = {}
        self._slow = False
        self._reading = trio.CancelScope()

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            with self._reading:
                await self._read(nursery)
            nursery.cancel_scope.cancel()
        if self._slow:
            await self._close(*close_reason("client_too_slow"))

    async def _read(self, nursery: trio.Nursery) -> None:
        """Client frames until the socket closes (module docstring)."""
        while True:
            message = await self.ws.receive()
            if message is None:
                break
            if not isinstance(message, str):
                continue  # (an Idle never comes without a deadline)
            try:
                raw = _json.decode(message)
            except (msgspec.DecodeError, RecursionError):  # (deep nesting: not JSON here)
                raw = None
            rid = raw.get("requestId") if isinstance(raw, dict) else None
            if not isinstance(rid, str):
                await self._close(
                    1003, "invalid_frame", "a frame is a JSON object with a requestId"
                )
                break
            try:
                frame = msgspec.convert(raw, _Frame)
            except msgspec.ValidationError as exc:  # that request's error, not the socket's end
                await self._send(_error(rid, exc))
                continue
            await self._dispatch(rid, frame, nursery)

    async def _dispatch(self, rid: str, frame: _Frame, nursery: trio.Nursery) -> None:
        if frame.type == "abort":
            await self._abort(rid)
        elif frame.type in ("send", "resume") and rid not in self.requests:
            request = self.requests[rid] = _Request(trio.CancelScope(), frame.type)
            nursery.start_soon(self._serve, rid, frame, request, name=f"ai-sdk-request {rid[:40]}")
        else:
            why = "a requestId in use" if rid in self.requests else f"type {frame.type[:40]!r}"
            await self._send(
                {"type": "error", "requestId": rid, "errorText": f"invalid_frame: {why}"}
            )

    async def _serve(self, rid: str, frame: _Frame, request: _Request) -> None:
        """One request: its response, or its refusal (module docstring)."""
        release = None
        try:
            with request.scope:
                try:  # each response is a stream of the key, besides the socket
                    release = await self.responses.node.limits.open_stream(
                        self.caller or NO_OWNER, "ai_sdk_ws"
                    )
                except (ApiError, Refused) as exc:
                    await self._send(_error(rid, exc))
                    return
                opened = await self._open(rid, frame)
                if opened is None:
                    return
                request.opened = opened
                if request.aborted:  # aborted while it was being opened
                    if request.kind == "send":
                        await self._cancel(opened)
                    return
                await self._stream(rid, opened, frame.last_sequence)
        except SlowClient:  # the socket is closed 1008 once its reader has stopped
            self._slow = True
            self._reading.cancel()
        except (ConnectionClosed, trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the socket went: the turn goes on
        finally:
            del self.requests[rid]
            if request.opened is not None and request.opened.sub.subscribed:
                request.opened.sub.leave("client_closed")
            if release is not None:
                release()

    async def _open(self, rid: str, frame: _Frame) -> Opened | None:
        """The request's response, opened; None after an ``error`` or ``no-active`` frame."""
        r = self.responses
        try:
            if frame.id is None:
                raise ApiError(422, "invalid_body", "a request names its chat: id")
            if frame.type == "resume":
                opened = await r.resume(self.caller, frame.id, self.client)
                if opened is None:
                    await self._send({"type": "no-active", "requestId": rid})
                return opened
            messages = msgspec.convert(frame.messages or [], list[UiMessage])
            return await r.send(self.caller, frame.id, messages, frame.trigger, self.client)
        except (ApiError, Refused, msgspec.ValidationError) as exc:
            await self._send(_error(rid, exc))
            return None

    async def _stream(self, rid: str, opened: Opened, last_sequence: int | None) -> None:
        sequence = -1
        skip = -1 if last_sequence is None else last_sequence

        def encode(chunks: list[ui.Chunk]) -> bytes:
            nonlocal sequence
            frames = []
            for chunk in chunks:
                sequence += 1
                if sequence > skip:
                    frames.append(
                        b'{"type":"chunk","requestId":%s,"sequence":%d,"chunk":%s}'
                        % (_encode(rid), sequence, ui.encode(chunk))
                    )
            return b"".join(text_frame(f) for f in frames)

        async def send(data: bytes) -> None:
            if data:  # (every chunk at or below lastSequence: nothing to send)
                await self.ws.send_all(data)

        await self._send({"type": "start", "requestId": rid})
        await respond(opened.sub, opened.mapper, encode, send, error=opened.error)
        await self._send({"type": "end", "requestId": rid})

    async def _abort(self, rid: str) -> None:
        """``abort``: the request's response ended; a ``send``'s turn cancelled (module docstring).

        A ``resume``'s abort cancels nothing: ``useChat`` aborts the resume it
        replaces with another (as it drops an HTTP resume), so a stop of a
        resumed answer is the stop route, as over HTTP.
        """
        request = self.requests.get(rid)
        if request is None:
            return  # over already, or never made: nothing to abort
        request.aborted = True
        if request.opened is not None:  # else its task sees the flag once it has opened
            if request.kind == "send":  # a resume's abort ends its response only
                await self._cancel(request.opened)
            request.scope.cancel()

    async def _cancel(self, opened: Opened) -> None:
        """Cancel the turn a ``send`` streams: in flight, or still queued ([turns] if_busy
        "queue": then it never starts, docs/protocol.md §2 "A busy session")."""
        node = self.responses.node
        turn_id = opened.mapper.turn_id
        try:
            await node.cancel_turn(opened.session, turn_id, "user", f"ai-sdk:{self.client}")
        except (ApiError, Refused) as exc:  # ended meanwhile: nothing to cancel
            event(log, logging.DEBUG, "aisdk_abort_late", f"abort of {turn_id}: {exc}")

    async def _send(self, frame: dict[str, Any]) -> None:
        await self.ws.send_all(text_frame(_encode(frame)))

    async def _close(self, code: int, reason: str, message: str | None = None) -> None:
        """Close the socket: ``reason`` is a close's JSON, or its code with ``message``."""
        if message is not None:
            reason = msgspec.json.encode({"code": reason, "message": message}).decode()
        with trio.CancelScope(shield=True), contextlib.suppress(ConnectionClosed):
            await self.ws.close(code, reason)


def _error(rid: str, exc: ApiError | Refused | msgspec.ValidationError) -> dict[str, Any]:
    """The ``error`` frame of a refused request: the HTTP door's ``code: message``."""
    if isinstance(exc, msgspec.ValidationError):
        text = f"invalid_body: {exc}"
    else:
        error = as_http(exc) if isinstance(exc, Refused) else exc
        text = f"{error.code}: {error.message}"
    return {"type": "error", "requestId": rid, "errorText": text}


async def chat_socket(ctx: DoorContext, responses: Responses, req: Request) -> WebSocketAccept:
    """``GET /ai-sdk/ws``: the caller checked, then the upgrade."""
    caller = _caller(ctx, req)
    release = await ctx.node.limits.open_stream(
        caller or NO_OWNER, "ai_sdk_ws"
    )  # 503 over_capacity

    async def run(ws: WebSocket) -> None:
        try:
            await ChatSocket(responses, ws, caller, req.client).run()
        finally:
            release()
            ctx.node.notify()  # (what waits for streams to close)

    return WebSocketAccept(run, abandon=release)


def _caller(ctx: DoorContext, req: Request) -> str | None:
    """The key's id: from ``Authorization: Bearer``, else the ``key`` query parameter.

    Another scheme (a proxy's ``Basic``) is not the gateway's: it is ignored,
    as on the native stream (docs/protocol.md §2).
    """
    bearer = req.headers.get("authorization", "")[:7].lower() == "bearer "
    if bearer or not ctx.keys.enabled:
        return ctx.authenticate(req)
    key = req.query.get("key")
    if not key:
        raise ApiError(401, "unauthorized", "send Authorization: Bearer <api key> or ?key=")
    caller = ctx.keys.identify(key)
    if caller is None:
        raise ApiError(403, "forbidden", "the API key is not valid")
    return caller

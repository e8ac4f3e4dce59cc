"""HTTP/1.1 transport: the whole life of one accepted connection, h11 over a trio stream.

The routes and sessions live above this module; they see a :data:`Handler`
that turns a :class:`Request` into a :class:`Response`, or into a
:class:`WebSocketAccept` to take the connection over as a WebSocket on the same
port (docs/protocol.md sections 2 and 3).

What the transport answers by itself, always as the JSON error body of
docs/protocol.md §2 (``{"error": {"code", "message"}}``), then closing the
connection:

====  =======================  ============================================
400   ``malformed_request``    h11 could not parse the request
400   ``conflicting_framing``  both ``Content-Length`` and ``Transfer-Encoding``
                               (RFC 9112 section 6.1: a request smuggling vector)
400   ``unsupported_transfer_encoding``  a ``Transfer-Encoding`` other than
                               ``chunked`` (RFC 9112 would allow a 501; a 4xx
                               keeps "never a 5xx for any input", docs/protocol.md §2)
408   ``request_timeout``      the request was not in within ``read_timeout_s``
413   ``body_too_large``       the body is over ``max_body_bytes``
431   ``headers_too_large``    the head is over ``max_header_bytes``
503   ``store_unavailable``    the handler's store read failed (a StoreError;
                               with ``Retry-After``)
500   ``internal_error``       the handler raised something else, not an ApiError
====  =======================  ============================================

(a HEAD gets each of these, as every answer, without its body: RFC 9110
section 9.3.2), and, keeping the connection open, the refused WebSocket handshakes: 426
``upgrade_required`` (a WebSocket route asked without upgrade headers), 426
``unsupported_websocket_version`` and 400 ``invalid_websocket_handshake``.

Timeouts (PROTOCOL is silent; decided here): a fresh connection must
deliver its first request within ``read_timeout_s`` of being accepted; between
requests the connection may idle for ``keepalive_timeout_s``, and the next
request must be complete within ``read_timeout_s`` of its first byte. A
connection that never sent a byte of the pending request is closed silently;
one that sent part of it gets a 408.

Behind a reverse proxy (docs/reference.md ``[server] trusted_proxies``; PROTOCOL is
silent, decided here): when the TCP peer is one of the trusted proxies, the
client's address is taken from ``X-Forwarded-For`` and its scheme from
``X-Forwarded-Proto`` (:func:`forwarded_client`); from any other peer those
headers are ignored, so a client cannot choose the address the gateway logs.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import logging
import re
import urllib.parse
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from http import HTTPStatus

import h11
import msgspec
import trio
from wsproto.utilities import generate_accept_token

from gateway.errors import ApiError, Refused, StoreError, unavailable
from gateway.http.body import StreamBody
from gateway.http.refusals import as_http
from gateway.http.websocket import ConnectionClosed, WebSocket
from gateway.protocol.closes import close_reason

_log = logging.getLogger("gateway.http")

_RECEIVE_BYTES = 65536
_SEND_BYTES = 256 * 1024
"""A piece of an answer the client must take within ``body_timeout_s`` (``_send_taken``)."""
_LINGER_S = 2.0
"""How long an erroring connection keeps draining the client's bytes before closing."""


@dataclass(slots=True)
class Request:
    """One parsed HTTP request, body included.

    ``path`` is the target without the query, not percent-decoded (ids are
    URL-safe). ``query`` has one value per key, percent-decoded;
    ``repeated_query`` names the keys that came more than once (the routes
    refuse them: which one wins is not for the transport to guess).
    ``headers`` has lower-cased names, latin-1 values, repeats joined with ``", "``.
    ``client`` is who sent the request, as logged and counted: the TCP peer's
    ``host:port``, or, when the peer is a trusted proxy, the address it
    forwarded (no port: ``X-Forwarded-For`` carries none); see
    :func:`forwarded_client`. ``peer`` is always the TCP peer's ``host:port``
    ("" when unknown), and ``scheme`` the scheme the client used: ``"http"``,
    or ``"https"`` when a trusted proxy says so.
    """

    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: bytes
    client: str
    peer: str = ""
    scheme: str = "http"
    repeated_query: tuple[str, ...] = ()


@dataclass(slots=True)
class Response:
    """An HTTP answer. The transport adds Content-Length (and Connection: close when closing).

    ``headers`` are extra headers; they must not repeat Content-Type or Content-Length.
    """

    status: int
    body: bytes = b""
    content_type: str = "application/json"
    headers: list[tuple[str, str]] = field(default_factory=list)


class ErrorDetail(msgspec.Struct):
    code: str
    message: str


class ErrorBody(msgspec.Struct):
    """Every HTTP error body (docs/protocol.md §2)."""

    error: ErrorDetail


def json_response(status: int, obj: object) -> Response:
    """A JSON response; ``obj`` is anything msgspec encodes (Structs, dicts, lists)."""
    return Response(status, msgspec.json.encode(obj))


def error_response(status: int, code: str, message: str) -> Response:
    """The error body ``{"error": {"code", "message"}}`` of docs/protocol.md §2."""
    return json_response(status, ErrorBody(ErrorDetail(code, message)))


@dataclass(slots=True)
class WebSocketAccept:
    """Returned by a handler to accept a WebSocket upgrade.

    The transport completes the handshake (101) and calls ``run``.

    ``run`` owns the connection until it returns; the transport then closes it
    with 1000 if ``run`` has not closed it, or with 1011 ``internal_error`` if
    ``run`` raised. On cancellation (shutdown) the stream is simply dropped:
    closing with 1001 first is ``run``'s job (docs/reference.md, command line).

    ``abandon`` is called instead of ``run`` when the upgrade does not happen
    (the transport refuses the handshake, or the client is gone before the 101
    is sent): what the handler took for the connection (a slot of
    ``[limits] max_connections``) is given back either way.
    """

    run: Callable[[WebSocket], Awaitable[None]]
    abandon: Callable[[], None] = lambda: None


@dataclass(slots=True)
class StreamingResponse:
    """An answer whose body is written as it is made (``text/event-stream``: AG-UI, protocol §14).

    The transport sends the head (no Content-Length: chunked to an HTTP/1.1
    client), then calls ``run`` with a ``send`` that writes one piece of the
    body (a :class:`~gateway.http.body.StreamBody`, whose socket the fan-out
    may write to while it is idle); when ``run`` returns the body ends and
    the connection may be reused.
    A client gone mid-stream makes ``send`` raise ``trio.BrokenResourceError``
    (or ``trio.ClosedResourceError``); the connection is then closed.
    ``abandon`` is called instead of ``run`` when the head could not be sent,
    so what the handler took for the stream is given back either way.
    """

    run: Callable[[Callable[[bytes], Awaitable[None]]], Awaitable[None]]
    status: int = 200
    content_type: str = "text/event-stream"
    headers: list[tuple[str, str]] = field(default_factory=list)
    abandon: Callable[[], None] = lambda: None


Handler = Callable[[Request], Awaitable[Response | WebSocketAccept | StreamingResponse]]


IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True, slots=True)
class TrustedProxies:
    """The peers whose ``X-Forwarded-For`` and ``X-Forwarded-Proto`` are believed.

    ``[server] trusted_proxies`` (docs/reference.md): addresses or CIDR networks, IPv4
    or IPv6. Empty (the default): nobody is, and the headers are always ignored.
    """

    networks: tuple[IPNetwork, ...] = ()

    @classmethod
    def parse(cls, entries: Iterable[str]) -> TrustedProxies:
        """Parse the config's entries, each with ``ipaddress.ip_network(strict=False)``.

        Raises:
            ValueError: an entry is neither an address nor a network (the
                config has already refused it: gateway.config).
        """
        return cls(tuple(ipaddress.ip_network(entry, strict=False) for entry in entries))

    def trusts(self, address: IPAddress) -> bool:
        """Whether ``address`` is in one of the networks (an IPv4 one never is in an IPv6 one)."""
        return any(address in network for network in self.networks)


@dataclass(frozen=True, slots=True)
class LargeBody:
    """A route that takes a body over ``max_body_bytes`` (docs/protocol.md §2 "Files"):
    ``POST`` to a path ``pattern`` matches, up to ``max_bytes``; over it, 413 ``code``."""

    pattern: re.Pattern[str]
    max_bytes: int
    code: str


@dataclass(frozen=True, slots=True)
class HttpLimits:
    """Per-connection limits and trust (docs/reference.md, ``[server]`` and ``[stream]``).

    ``large_bodies``: the routes whose bodies may be larger; such a body has
    ``body_timeout_s`` from the end of its head, where others have what is left
    of ``read_timeout_s``. Before one is read, ``admit_large`` checks the
    request's head, a :class:`Request` with no body (its Host, Origin and API
    key: gateway.app), and one of ``large_reads`` is
    taken once it passes ``max_body_bytes`` (503 ``over_capacity`` when none
    is free), held until its handler has answered, so what large bodies hold
    in memory at once is bounded whoever sends them.
    """

    max_body_bytes: int = 1_048_576
    large_bodies: tuple[LargeBody, ...] = ()
    body_timeout_s: float = 60.0
    admit_large: Callable[[Request], None] | None = None
    large_reads: trio.Semaphore = field(default_factory=lambda: trio.Semaphore(8))
    max_header_bytes: int = 16_384
    read_timeout_s: float = 10.0
    keepalive_timeout_s: float = 60.0
    max_client_frame_bytes: int = 65_536
    trusted_proxies: TrustedProxies = TrustedProxies()


async def serve_connection(
    stream: trio.abc.Stream, handler: Handler, limits: HttpLimits, *, client: str = ""
) -> None:
    """Serve one accepted connection until it closes: keep-alive requests, or one WebSocket.

    Never raises except for cancellation: whatever goes wrong is answered,
    logged, or both, and the stream is closed on the way out.

    Args:
        stream: the accepted connection; closed when this returns.
        handler: the routes.
        limits: sizes and timeouts.
        client: the peer ``host:port``, copied into every :class:`Request`.
    """
    try:
        await _HttpConnection(stream, handler, limits, client).run()
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass  # the client went away mid-answer: nobody is left to tell
    except Exception:
        _log.exception(
            "HTTP connection from %s failed", client or "unknown peer",
            extra={"event": "http_connection_failed", "fields": {"client": client}},
        )  # fmt: skip
    finally:
        await trio.aclose_forcefully(stream)


class _HttpConnection:
    """The request loop of one connection over one h11 state machine."""

    def __init__(
        self, stream: trio.abc.Stream, handler: Handler, limits: HttpLimits, client: str
    ) -> None:
        self._stream = stream
        self._handler = handler
        self._limits = limits
        self._client = client
        self._h11 = h11.Connection(h11.SERVER, max_incomplete_event_size=limits.max_header_bytes)
        self._head = False  # the request being answered is a HEAD: its answer has no body
        self._slot = _LargeRead(limits)  # the request's, if its body is a large one

    async def run(self) -> None:
        # The first request's clock starts at accept, for both the idle wait and the read.
        idle_deadline = trio.current_time() + self._limits.read_timeout_s
        read_deadline: float | None = idle_deadline
        while True:
            try:
                request = await self._next_request(idle_deadline, read_deadline)
            except ApiError as exc:
                await self._refuse(exc)
                return
            if request is None:
                return
            try:
                answer = await self._call_handler(request)
            finally:
                self._slot.release()  # a large body's, held while its handler used it
            if isinstance(answer, StreamingResponse):
                head_only = request.method == "HEAD"
                del request  # a stream lives long: it keeps none of the request (its body)
                await self._stream_body(answer, head_only=head_only)
            elif isinstance(answer, WebSocketAccept):
                refusal = _handshake_refusal(request)
                if refusal is None:
                    # A WebSocket lives long: this frame keeps none of the request.
                    key, path = request.headers["sec-websocket-key"], request.path
                    del request
                    await self._upgrade(key, path, answer)
                    return
                answer.abandon()
                await self._send(refusal)
            else:
                await self._send(answer)
            if self._h11.our_state is not h11.DONE or self._h11.their_state is not h11.DONE:
                return
            self._h11.start_next_cycle()
            self._head = False
            idle_deadline = trio.current_time() + self._limits.keepalive_timeout_s
            read_deadline = None

    # --- reading -----------------------------------------------------------------

    async def _next_request(
        self, idle_deadline: float, read_deadline: float | None
    ) -> Request | None:
        """The next request, or None when the connection should just close.

        ``read_deadline`` None: the request has ``read_timeout_s`` from its first byte.

        Raises:
            ApiError: 400, 408, 413 or 431, to be answered before closing.
        """
        with trio.CancelScope(deadline=idle_deadline) as idle:
            await self._await_first_byte()
        if idle.cancelled_caught:
            return None
        if read_deadline is None:
            read_deadline = trio.current_time() + self._limits.read_timeout_s
        with trio.CancelScope(deadline=read_deadline) as reading:
            try:
                return await self._read_request(reading)
            except h11.RemoteProtocolError as exc:
                raise _protocol_error(exc) from None
        raise ApiError(408, "request_timeout", "The request did not arrive in time.")

    async def _await_first_byte(self) -> None:
        buffered, eof = self._h11.trailing_data  # pipelined bytes of the next request, if any
        if not buffered and not eof:
            self._h11.receive_data(await self._receive())

    async def _read_request(self, reading: trio.CancelScope) -> Request | None:
        event = await self._next_event()
        if not isinstance(event, h11.Request):
            return None  # ConnectionClosed: the client left between requests
        self._head = event.method == b"HEAD"  # before any refusal: a 413 to a HEAD has no body
        if _head_size(event) > self._limits.max_header_bytes:
            raise _headers_too_large()
        declared = _header(event.headers, b"content-length")
        if declared is not None and _header(event.headers, b"transfer-encoding") is not None:
            # h11 would take the chunks and ignore the length; a proxy in front may
            # have read it the other way round (RFC 9112 section 6.1): refuse, close.
            raise ApiError(
                400,
                "conflicting_framing",
                "a request may carry Content-Length or Transfer-Encoding, not both",
            )
        limit, code = self._limits.max_body_bytes, "body_too_large"
        large = _large_body(self._limits, event)
        may_be_large = large is not None and (declared is None or int(declared) > limit)
        if large is not None:
            limit, code = max(limit, large.max_bytes), large.code
        if may_be_large:  # a small body keeps read_timeout_s: its key is not checked first
            if self._limits.admit_large is not None:  # 421, 403, 401: before a byte of it
                self._limits.admit_large(
                    _request(event, b"", self._client, self._limits.trusted_proxies)
                )
            reading.deadline = trio.current_time() + self._limits.body_timeout_s
        if declared is not None and int(declared) > limit:
            raise _body_too_large(limit, code)
        slot = self._slot = _LargeRead(self._limits)  # held until the handler has answered
        try:
            body = await self._read_body(limit, code, slot)
            return _request(event, body, self._client, self._limits.trusted_proxies)
        except BaseException:
            slot.release()
            raise

    async def _read_body(self, limit: int, code: str, slot: _LargeRead) -> bytes:
        """The body, up to ``limit`` (413 ``code``); past ``max_body_bytes``, in a slot."""
        if self._h11.client_is_waiting_for_100_continue:
            await self._stream.send_all(
                self._h11.send(
                    h11.InformationalResponse(status_code=100, reason=b"Continue", headers=[])
                )
            )
        body = bytearray()
        while not isinstance(part := await self._next_event(), h11.EndOfMessage):
            if isinstance(part, h11.Data):
                body += part.data
                if len(body) > limit:
                    raise _body_too_large(limit, code)
                if len(body) > self._limits.max_body_bytes:
                    slot.take()
        return bytes(body)

    async def _next_event(self) -> h11.Event:
        while (event := self._h11.next_event()) is h11.NEED_DATA:
            self._h11.receive_data(await self._receive())
        assert isinstance(event, h11.Event)  # PAUSED only comes after EndOfMessage
        return event

    async def _receive(self) -> bytes:
        try:
            return bytes(await self._stream.receive_some(_RECEIVE_BYTES))
        except trio.BrokenResourceError:
            return b""

    # --- answering ---------------------------------------------------------------

    async def _call_handler(
        self, request: Request
    ) -> Response | WebSocketAccept | StreamingResponse:
        try:
            return await self._handler(request)
        except (ApiError, Refused, StoreError) as exc:
            # A store read that was not answered is no bug: a 503 (the refusals' table).
            error = as_http(unavailable(exc) if isinstance(exc, StoreError) else exc)
            response = error_response(error.status, error.code, error.message)
            response.headers.extend(error.headers)
            return response
        except Exception:
            _log.exception(
                "handler failed on %s %s", request.method, request.path,
                extra={
                    "event": "http_handler_failed",
                    "fields": {"client": request.client, "code": 500, "path": request.path},
                },
            )  # fmt: skip
            return _closing(error_response(500, "internal_error", "Internal server error."))

    async def _send(self, response: Response) -> None:
        """Send a response; a HEAD's has the GET's headers and no body (RFC 9110 9.3.2)."""
        # A 204 has no body, hence no Content-Length or Content-Type (RFC 9110 8.6, 15.3.5).
        framing = (
            []
            if response.status == 204
            else [
                ("content-type", response.content_type),
                ("content-length", str(len(response.body))),
            ]
        )
        head = h11.Response(
            status_code=response.status,
            reason=_reason_phrase(response.status),
            headers=[*framing, *response.headers],
        )
        pieces = [self._h11.send(head)]
        if response.body and not self._head:  # the body as it is, not a copy of it
            pieces += self._h11.send_with_data_passthrough(h11.Data(data=response.body)) or []
        pieces.append(self._h11.send(h11.EndOfMessage()))
        if sum(map(len, pieces)) <= _SEND_BYTES:
            pieces = [b"".join(pieces)]  # one write, as small answers always were
        for piece in pieces:
            await self._send_taken(piece)

    async def _send_taken(self, data: bytes) -> None:
        """Send ``data``; each :data:`_SEND_BYTES` of it must be taken by the client within
        ``body_timeout_s`` (else ``trio.BrokenResourceError``: the connection is closed).

        An answer may be a file of 20 MiB: a client that asks and never reads would
        keep it in memory for as long as its connection lives (docs/protocol.md §2).
        """
        view = memoryview(data)
        for at in range(0, len(view), _SEND_BYTES):
            with trio.move_on_after(self._limits.body_timeout_s):
                await self._stream.send_all(view[at : at + _SEND_BYTES])
                continue
            raise trio.BrokenResourceError("the client took none of the answer in time")

    async def _stream_body(self, answer: StreamingResponse, *, head_only: bool = False) -> None:
        """Send the head, then each piece ``answer.run`` makes, then the end of the body.

        A HEAD gets the head only (RFC 9110 9.3.2): ``run`` is never called,
        ``abandon`` gives back what the handler took for the stream.
        """
        head = h11.Response(
            status_code=answer.status,
            reason=_reason_phrase(answer.status),
            headers=[("content-type", answer.content_type), *answer.headers],
        )
        head_bytes = self._h11.send(head) or b""
        try:
            await self._stream.send_all(head_bytes)
        except BaseException:
            answer.abandon()  # run will never be called
            raise
        stream = self._stream
        fd = stream.socket.fileno() if isinstance(stream, trio.SocketStream) else -1
        if head_only:
            answer.abandon()
            await self._stream.send_all(self._h11.send(h11.EndOfMessage()))
            return

        # The body's pieces are framed by StreamBody as h11 would (chunks, or the
        # raw bytes of an HTTP/1.0 body), so that the fan-out may write them too.
        body = StreamBody(self._stream, b"transfer-encoding: chunked" in head_bytes.lower(), fd)
        try:
            await answer.run(body)
            if body.owes:  # the rest of a direct write
                await body(b"")
        finally:
            body.finish()
        await self._stream.send_all(self._h11.send(h11.EndOfMessage()))

    async def _refuse(self, exc: ApiError) -> None:
        """Answer a request we could not read, then drain before closing.

        Closing a socket with unread input makes the kernel reset the connection,
        which can destroy the error answer before the client reads it (RFC 9112
        section 9.6): so half-close, and read and discard for up to ``_LINGER_S``.
        """
        if self._h11.our_state in (h11.IDLE, h11.SEND_RESPONSE):
            answer = error_response(exc.status, exc.code, exc.message)
            answer.headers.extend(exc.headers)  # a 503's Retry-After
            await self._send(_closing(answer))
        if isinstance(self._stream, trio.abc.HalfCloseableStream):
            await self._stream.send_eof()
        with trio.move_on_after(_LINGER_S):
            while await self._receive():
                pass

    async def _upgrade(self, key_text: str, path: str, accept: WebSocketAccept) -> None:
        """Complete the handshake (RFC 6455 section 4.2.2) and hand the stream to ``accept.run``.

        No extension is negotiated: frames are built once per event for every
        client (see gateway.http.websocket), which permessage-deflate would forbid.
        """
        key = key_text.encode()
        switch = h11.InformationalResponse(
            status_code=101,
            reason=b"Switching Protocols",
            headers=[
                ("upgrade", "websocket"),
                ("connection", "Upgrade"),
                ("sec-websocket-accept", generate_accept_token(key).decode()),
            ],
        )
        try:
            await self._stream.send_all(self._h11.send(switch))
        except BaseException:
            accept.abandon()  # run will never be called
            raise
        trailing, _ = self._h11.trailing_data
        del self._h11  # a WebSocket lives long: keep none of the HTTP state
        ws = WebSocket(
            self._stream, trailing, max_message_bytes=self._limits.max_client_frame_bytes
        )
        try:
            await accept.run(ws)
        except ConnectionClosed:
            pass  # the client left while run was writing: nothing more to say
        except Exception:
            _log.exception(
                "WebSocket handler failed on %s", path,
                extra={"event": "ws_handler_failed", "fields": {"code": 1011, "path": path}},
            )  # fmt: skip
            await ws.close(*close_reason("internal_error"))
        await ws.close(*close_reason("normal"))  # a no-op if run closed it


def _headers(event: h11.Request) -> dict[str, str]:
    """A request's headers, names in lower case (h11's), repeated ones joined with ", "."""
    headers: dict[str, str] = {}
    for raw_name, raw_value in event.headers:
        name, value = raw_name.decode("latin-1"), raw_value.decode("latin-1")
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    return headers


def _request(event: h11.Request, body: bytes, peer: str, trusted: TrustedProxies) -> Request:
    headers = _headers(event)
    path, _, query_string = event.target.decode("latin-1").partition("?")
    query: dict[str, str] = {}
    repeated: dict[str, None] = {}
    for key, value in urllib.parse.parse_qsl(query_string, keep_blank_values=True):
        if key in query:
            repeated[key] = None
        query.setdefault(key, value)
    client, scheme = forwarded_client(peer, headers, trusted)
    method = event.method.decode("latin-1")
    return Request(method, path, query, headers, body, client, peer, scheme, tuple(repeated))


# --- who the client is, behind a proxy ------------------------------------------------


def forwarded_client(
    peer: str, headers: Mapping[str, str], trusted: TrustedProxies
) -> tuple[str, str]:
    """The client's address and scheme, believing the proxy headers only from a trusted peer.

    The right-most-untrusted rule (as MDN's X-Forwarded-For page and uvicorn's
    ``--forwarded-allow-ips`` apply it): each proxy appends the address it got
    the request from, so ``X-Forwarded-For`` reads ``client, proxy1, proxy2``
    and only the entries added by trusted proxies can be believed. Walking
    from the right, starting at the TCP peer: while the current hop is
    trusted, the entry to its left is the address that hop saw; the first
    entry that is not itself a trusted proxy is the client. Entries further
    left came from that client and may be anything (a spoof), so they are
    never read. If every entry is a trusted proxy, the left-most one is the
    client. An entry that is not an IP address (``unknown``, a hostname,
    garbage, a zone index) stops the walk: the client is then the last hop
    that could be vouched for, so nothing the gateway logs is text a client
    chose. An entry may carry a port (``203.0.113.7:4711``,
    ``[2001:db8::7]:4711``); it is dropped. IPv4-mapped IPv6 addresses count
    as their IPv4 address.

    ``X-Forwarded-Proto``: the right-most value (the one the trusted peer
    set), if it is ``http`` or ``https``; anything else leaves ``"http"``.

    Args:
        peer: the TCP peer, ``host:port`` (an IPv6 host unbracketed or
            bracketed), or "" when unknown (then nothing is trusted).
        headers: lower-cased names, repeats joined with ``", "`` (which is
            how RFC 9110 section 5.3 says repeats combine).
        trusted: the configured trusted proxies.

    Returns:
        ``(client, scheme)``: ``client`` is ``peer`` unchanged when the headers
        are not believed or name nobody usable, else the forwarded address in
        its canonical spelling (no port).
    """
    if not trusted.networks:  # the default: no parsing at all
        return peer, "http"
    hop = _peer_address(peer)
    if hop is None or not trusted.trusts(hop):
        return peer, "http"
    client = peer
    entries = [e.strip() for e in headers.get("x-forwarded-for", "").split(",")]
    for entry in reversed([e for e in entries if e]):
        address = _forwarded_address(entry)
        if address is None:
            break
        client = str(address)
        if not trusted.trusts(address):
            break
    proto = headers.get("x-forwarded-proto", "").rpartition(",")[2].strip().lower()
    return client, proto if proto in ("http", "https") else "http"


def _peer_address(peer: str) -> IPAddress | None:
    """The address part of the peer's ``host:port``."""
    host = peer.rpartition(":")[0].removeprefix("[").removesuffix("]")
    return _ip(host)


_PORT = re.compile(r":[0-9]{1,5}")


def _forwarded_address(entry: str) -> IPAddress | None:
    """One ``X-Forwarded-For`` entry as an address: ``v4``, ``v4:port``, ``v6``, ``[v6]:port``."""
    if entry.startswith("["):
        host, bracket, rest = entry[1:].partition("]")
        if not bracket or (rest and not _PORT.fullmatch(rest)):
            return None
        return _ip(host) if ":" in host else None  # brackets are for IPv6 only
    if entry.count(":") == 1:  # v4:port (an IPv6 address has at least two colons)
        host, port = entry.split(":")
        return _ip(host) if _PORT.fullmatch(":" + port) else None
    return _ip(entry)


def _ip(text: str) -> IPAddress | None:
    """``text`` as an IP address, IPv4-mapped IPv6 as IPv4; None for anything else.

    A zone index (``fe80::1%eth0``) is refused: it means nothing off the host
    that wrote it, and its text is free-form.
    """
    if "%" in text:
        return None
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def _head_size(event: h11.Request) -> int:
    """The request head's size as sent, near enough: h11 only bounds heads that arrive in pieces."""
    request_line = len(event.method) + len(event.target) + 11  # "M T HTTP/1.1\r\n"
    return request_line + sum(len(name) + len(value) + 4 for name, value in event.headers)


def _header(headers: Sequence[tuple[bytes, bytes]], name: bytes) -> bytes | None:
    return next((value for key, value in headers if key == name), None)


def _reason_phrase(status: int) -> bytes:
    try:
        return HTTPStatus(status).phrase.encode()
    except ValueError:
        return b""  # a status http.HTTPStatus does not know: the phrase is optional


class _LargeRead:
    """One of ``HttpLimits.large_reads``, taken once a body passes ``max_body_bytes``."""

    def __init__(self, limits: HttpLimits) -> None:
        self._slots = limits.large_reads
        self._held = False

    def take(self) -> None:
        if self._held:
            return
        try:
            self._slots.acquire_nowait()
        except trio.WouldBlock:
            raise ApiError(
                503,
                "over_capacity",
                "too many large request bodies are being read at once; try again",
                headers=(("Retry-After", "1"),),
            ) from None
        self._held = True

    def release(self) -> None:
        if self._held:
            self._held = False
            self._slots.release()


def _body_too_large(limit: int, code: str = "body_too_large") -> ApiError:
    what = "file" if code == "file_too_large" else "request body"
    return ApiError(413, code, f"The {what} is over {limit} bytes.")


def _large_body(limits: HttpLimits, event: h11.Request) -> LargeBody | None:
    """The :class:`LargeBody` rule of this request, if any (only ``POST`` has one)."""
    if event.method != b"POST" or not limits.large_bodies:
        return None
    path = event.target.decode("ascii", "replace").partition("?")[0]
    return next((rule for rule in limits.large_bodies if rule.pattern.fullmatch(path)), None)


def _headers_too_large() -> ApiError:
    return ApiError(431, "headers_too_large", "The request head is too large.")


def _protocol_error(exc: h11.RemoteProtocolError) -> ApiError:
    if exc.error_status_hint == 431:
        return _headers_too_large()
    if exc.error_status_hint == 501:  # h11 only knows chunked (and one such header)
        return ApiError(
            400,
            "unsupported_transfer_encoding",
            f"Transfer-Encoding must be exactly chunked: {exc}",
        )
    return ApiError(400, "malformed_request", f"Malformed HTTP request: {exc}")


def _closing(response: Response) -> Response:
    """``response`` with ``Connection: close``; h11 then ends the connection after it."""
    response.headers.append(("connection", "close"))
    return response


def _tokens(value: str) -> set[str]:
    return {token.strip().lower() for token in value.split(",")}


def _handshake_refusal(request: Request) -> Response | None:
    """Why this request cannot become a WebSocket (RFC 6455 section 4.2.1), or None if it can."""
    headers = request.headers
    if "websocket" not in _tokens(headers.get("upgrade", "")) or "upgrade" not in _tokens(
        headers.get("connection", "")
    ):
        refusal = error_response(426, "upgrade_required", "This route only speaks WebSocket.")
        refusal.headers += [("upgrade", "websocket"), ("sec-websocket-version", "13")]
        return refusal
    if request.method != "GET":
        return error_response(
            400, "invalid_websocket_handshake", "A WebSocket upgrade must be a GET."
        )
    if headers.get("sec-websocket-version") != "13":
        refusal = error_response(
            426, "unsupported_websocket_version", "Only WebSocket version 13 is supported."
        )
        refusal.headers.append(("sec-websocket-version", "13"))
        return refusal
    if not _is_websocket_key(headers.get("sec-websocket-key", "")):
        return error_response(
            400,
            "invalid_websocket_handshake",
            "Sec-WebSocket-Key must be 16 bytes in base64.",
        )
    return None


def _is_websocket_key(key: str) -> bool:
    try:
        return len(base64.b64decode(key, validate=True)) == 16
    except binascii.Error:
        return False

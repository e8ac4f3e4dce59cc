"""The bench's own minimal wire code: a WebSocket client protocol and an HTTP/1.1 client.

The load clients must not be what limits a figure (the issue's "Clients ...
must not be what limits the figure"), so they do not use a general WebSocket
library: :class:`WsClient` is an ``asyncio.Protocol`` (no task per
connection) that does the opening handshake (RFC 6455 section 4.1), sends
masked frames (section 5.3), and parses the server's unmasked frames in place.
The server's first text message is the answer to the client's first one
(``subscribe_ack`` or ``subscribe_error`` to a ``subscribe``, docs/protocol.md
§3): it goes to :meth:`WsClient.on_answer` and resolves :attr:`WsClient.answered`;
every later one goes to :meth:`WsClient.on_text`. Subclasses decide what to
decode. Close frames are echoed (section 5.5.1) and their code kept, so the
bench can check that a slow client got 1008 (docs/protocol.md §3).

:class:`HttpClient` is just enough HTTP/1.1 for the handful of JSON calls the
bench makes (create a session, fetch an attach token, submit a turn): one
keep-alive connection, ``Content-Length`` bodies only, which is what the
gateway always sends.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os
import socket
import struct
import time
from typing import Any

import msgspec

WS_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"  # RFC 6455 section 1.3
ABNORMAL = 1006  # closed without a close frame (RFC 6455 section 7.1.5)

_OP_CONTINUATION, _OP_TEXT, _OP_BINARY = 0x0, 0x1, 0x2
_OP_CLOSE, _OP_PING, _OP_PONG = 0x8, 0x9, 0xA


def accept_token(key: bytes) -> bytes:
    """``Sec-WebSocket-Accept`` for a ``Sec-WebSocket-Key`` (RFC 6455 section 4.2.2)."""
    return base64.b64encode(hashlib.sha1(key + WS_GUID).digest())


def server_frame(payload: bytes, opcode: int = _OP_TEXT) -> bytes:
    """An unmasked server-to-client frame (the peers' frames; RFC 6455 section 5.2)."""
    size = len(payload)
    if size < 126:
        return struct.pack("!BB", 0x80 | opcode, size) + payload
    if size < 65536:
        return struct.pack("!BBH", 0x80 | opcode, 126, size) + payload
    return struct.pack("!BBQ", 0x80 | opcode, 127, size) + payload


def client_frame(payload: bytes, opcode: int = _OP_TEXT) -> bytes:
    """A masked client-to-server frame (RFC 6455 section 5.3)."""
    mask = os.urandom(4)
    size = len(payload)
    if size < 126:
        header = struct.pack("!BB", 0x80 | opcode, 0x80 | size)
    elif size < 65536:
        header = struct.pack("!BBH", 0x80 | opcode, 0x80 | 126, size)
    else:
        header = struct.pack("!BBQ", 0x80 | opcode, 0x80 | 127, size)
    repeated = (mask * (size // 4 + 1))[:size]
    masked = (int.from_bytes(payload, "big") ^ int.from_bytes(repeated, "big")).to_bytes(
        size, "big"
    )
    return header + mask + masked


def now_ms() -> float:
    """Wall-clock milliseconds, comparable with an event's ``ts`` (docs/protocol.md §4)."""
    return time.time() * 1000.0


class WsClient(asyncio.Protocol):
    """One client WebSocket: handshake, frame parsing, close echo.

    Args:
        host, port, path: where to connect and the request target.
        first_message: a text message sent as soon as the handshake completes
            (the ``subscribe`` frame), or ``b""`` for none.
    """

    def __init__(self, host: str, port: int, path: str, first_message: bytes = b"") -> None:
        self.host, self.port, self.path = host, port, path
        self.first_message = first_message
        self.transport: asyncio.Transport | None = None
        self.open = False
        self.close_code: int | None = None
        self.close_reason = b""
        loop = asyncio.get_running_loop()
        self.answered: asyncio.Future[bytes] = loop.create_future()
        self.answered.add_done_callback(_retrieved)  # a refusal nobody awaits is not an error
        self.closed: asyncio.Future[int] = loop.create_future()
        self._buf = b""
        self._key = base64.b64encode(os.urandom(16))
        self._fragments: list[bytes] = []
        self._refused = ""  # the status line of a refused handshake

    # --- asyncio.Protocol ------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        transport.write(
            b"GET %s HTTP/1.1\r\nHost: %s:%d\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            b"Sec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\n\r\n"
            % (self.path.encode(), self.host.encode(), self.port, self._key)
        )

    def data_received(self, data: bytes) -> None:
        if self._buf:
            data = self._buf + data
        if not self.open:
            end = data.find(b"\r\n\r\n")
            if end < 0:
                self._buf = data
                return
            head, data = data[:end], data[end + 4 :]
            if not head.startswith(b"HTTP/1.1 101"):
                status = head.split(b"\r\n", 1)[0].decode("latin-1")
                self._refused = f"handshake refused: {status} {data[:200].decode('latin-1')}"
                transport = self.transport
                assert transport is not None
                transport.abort()
                return
            self.open = True
            self.on_open()
        self._buf = self._parse(data) if data else b""

    def connection_lost(self, exc: Exception | None) -> None:
        self.open = False
        if self.close_code is None:
            self.close_code = ABNORMAL
        if not self.answered.done():
            why = self._refused or f"closed before an answer (close code {self.close_code})"
            self.answered.set_exception(ConnectionError(why))
        if not self.closed.done():
            self.closed.set_result(self.close_code)

    # --- frames --------------------------------------------------------------------

    def _parse(self, data: bytes) -> bytes:
        """Consume every complete frame of ``data``; return the incomplete rest."""
        now = now_ms()
        pos, size = 0, len(data)
        while size - pos >= 2:
            b0, length = data[pos], data[pos + 1] & 0x7F
            head = 2
            if length == 126:
                if size - pos < 4:
                    break
                length = int.from_bytes(data[pos + 2 : pos + 4], "big")
                head = 4
            elif length == 127:
                if size - pos < 10:
                    break
                length = int.from_bytes(data[pos + 2 : pos + 10], "big")
                head = 10
            end = pos + head + length
            if end > size:
                break
            opcode = b0 & 0x0F
            payload = data[pos + head : end]
            pos = end
            if b0 & 0x80 and opcode == _OP_TEXT:
                self._message(payload, now)
            elif opcode >= _OP_CLOSE:
                self._control(opcode, payload)
                if not self.open:
                    return b""
            else:  # a fragment (servers under test do not fragment; kept correct anyway)
                self._fragments.append(payload)
                if b0 & 0x80:
                    self._message(b"".join(self._fragments), now)
                    self._fragments.clear()
        return data[pos:]

    def _message(self, payload: bytes, now: float) -> None:
        if self.answered.done():
            self.on_text(payload, now)
        else:
            self.on_answer(payload, now)

    def _control(self, opcode: int, payload: bytes) -> None:
        transport = self.transport
        assert transport is not None
        if opcode == _OP_PING:
            transport.write(client_frame(payload, _OP_PONG))
        elif opcode == _OP_CLOSE:
            self.close_code = int.from_bytes(payload[:2], "big") if len(payload) >= 2 else 1005
            self.close_reason = payload[2:]
            transport.write(client_frame(payload[:2], _OP_CLOSE))  # echo the code
            self.open = False
            transport.close()

    def send_text(self, payload: bytes) -> None:
        if self.transport is not None and self.open:
            self.transport.write(client_frame(payload))

    def abort(self) -> None:
        """Drop the connection at once (RST): the fastest way to end a phase."""
        if self.transport is not None:
            self.transport.abort()

    # --- for subclasses -----------------------------------------------------------

    def on_open(self) -> None:
        if self.first_message:
            self.send_text(self.first_message)

    def on_answer(self, payload: bytes, now: float) -> None:
        """The server's first text message, at ``now`` (ms); resolves :attr:`answered`.

        An answer that is not a ``subscribe_ack`` fails :attr:`answered` and
        drops the connection.
        """
        if payload.startswith(b'{"type":"subscribe_ack"'):
            self.answered.set_result(payload)
        else:
            self.answered.set_exception(ConnectionError(payload[:300].decode()))
            self.abort()

    def on_text(self, payload: bytes, now: float) -> None:
        """A later text message, at ``now`` (ms)."""


def _retrieved(future: asyncio.Future[bytes]) -> None:
    if not future.cancelled():
        future.exception()


async def open_ws(client: WsClient, *, rcvbuf: int = 0, timeout_s: float = 30.0) -> WsClient:
    """Connect ``client`` (a fresh :class:`WsClient`); return it once the handshake is sent.

    Await ``client.answered`` for the server's answer to ``first_message``.

    Args:
        rcvbuf: if > 0, ``SO_RCVBUF`` set before connecting, so the TCP window
            stays small (a stalled client then backs up into the server's queue).
    """
    loop = asyncio.get_running_loop()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setblocking(False)
    if rcvbuf:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    try:
        await asyncio.wait_for(loop.sock_connect(sock, (client.host, client.port)), timeout_s)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        await loop.create_connection(lambda: client, sock=sock)
    except BaseException:
        sock.close()
        raise
    return client


class HttpError(Exception):
    """A non-2xx answer: ``status`` and the body."""

    def __init__(self, status: int, body: bytes) -> None:
        super().__init__(f"HTTP {status}: {body[:200]!r}")
        self.status = status
        self.body = body


class HttpClient:
    """One keep-alive HTTP/1.1 connection for small JSON calls."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._lock = asyncio.Lock()

    async def request(self, method: str, path: str, body: Any = None) -> Any:
        """Send ``body`` as JSON (if not None); return the decoded JSON answer.

        Raises:
            HttpError: a status outside 200..299.
        """
        answer = await self.request_bytes(
            method, path, b"" if body is None else msgspec.json.encode(body)
        )
        return msgspec.json.decode(answer) if answer else None

    async def request_bytes(self, method: str, path: str, data: bytes = b"") -> bytes:
        """Send ``data`` as the JSON body; return the answer's body as it came (``/metrics``).

        Raises:
            HttpError: a status outside 200..299.
        """
        head = (
            f"{method} {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
        ).encode()
        async with self._lock:
            for attempt in (1, 2):  # a keep-alive connection the server closed: retry once
                try:
                    status, answer = await self._exchange(head + data)
                    break
                except (ConnectionError, asyncio.IncompleteReadError):
                    await self.aclose()
                    if attempt == 2:
                        raise
        if not 200 <= status < 300:
            raise HttpError(status, answer)
        return answer

    async def _exchange(self, request: bytes) -> tuple[int, bytes]:
        if self._writer is None:
            self._reader, self._writer = await asyncio.open_connection(self.host, self.port)
        assert self._reader is not None
        self._writer.write(request)
        head = await self._reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        length = 0
        close = False
        for line in lines[1:]:
            name, _, value = line.partition(":")
            if name.lower() == "content-length":
                length = int(value)
            elif name.lower() == "connection" and value.strip().lower() == "close":
                close = True
        body = await self._reader.readexactly(length) if length else b""
        if close:
            await self.aclose()
        return status, body

    async def aclose(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = self._reader = None

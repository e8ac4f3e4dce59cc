"""One server-side WebSocket over a trio stream, after the HTTP upgrade (docs/protocol.md §3).

wsproto parses what the client sends and frames our control frames (pong,
close). Data frames go the other way round: :mod:`gateway.protocol.framing`
builds a frame once per event and the same bytes are written to every
subscriber, so the hot path never frames per client. That is also why no
extension is negotiated: with permessage-deflate each connection would need its
own compressor state and its own copy of every frame.

**The socket's bytes belong to this object.** Whatever writes (the hub's
direct write, the writer task, the reader's pong, a close), nothing is written
between the bytes of one frame: the hub writes only while :attr:`direct`
lends it the socket's :class:`SocketWriter` (no write in progress, nothing
owed, no close sent), and the rest of a frame it wrote only in part is
handed back with :meth:`WebSocket.owe`; until
it is sent, ``direct`` is None and every write under the send lock (data,
pong, close) sends it first. A close never follows half a frame: the owed
bytes go first, or the stream is dropped without a close frame.

**The reader never waits for the socket.** A pong is kept with the owed
bytes (after them: they end the frame in progress; only the latest ping's,
RFC 6455 section 5.5.3, so a ping flood holds one) and handed to whoever
writes next; :attr:`WebSocket.on_control` asks the connection for that write
(its writer task). A client that pings and reads nothing then costs the
reader nothing: its heartbeat and subscribe clocks keep running. Only the
echo of the peer's close frame is written by the reader, within a grace.
The reader's clock applies only while it waits for bytes
(:meth:`WebSocket.receive`'s ``deadline``): what it has read is always
handled whole, never cut off halfway (a lost pong, client frames left
unread in the parser until more bytes come).

Two tasks may use one :class:`WebSocket` at a time: a reader calling
:meth:`WebSocket.receive` and a writer calling :meth:`WebSocket.send_all` or
:meth:`WebSocket.close`. Two locks keep them apart on the stream (trio streams
refuse concurrent sends or concurrent receives): the send lock serializes the
writer's frames with the close replies the reader sends (and its pongs, when
no writer is there to take them), and the read lock lets
:meth:`WebSocket.close` wait for the peer's close reply even when no reader
is running.

The close handshake (RFC 6455 section 7):

- we close: send a close frame, read (dropping data) until the peer's reply or
  ``grace_s``, then close the stream;
- the peer closes: echo its code at once and close the stream (the server closes
  TCP first, RFC 6455 section 7.1.1);
- the client breaks the protocol (bad UTF-8, bad control frame): close with
  wsproto's code and drop the stream, since the parser cannot go on;
- a client message over ``max_message_bytes``: close 1009 ``frame_too_large``;
- EOF or a broken stream: nothing to send; ``close_code`` is 1006.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
from collections.abc import AsyncIterator, Callable
from typing import Final

import trio
from wsproto.connection import Connection, ConnectionState, ConnectionType
from wsproto.events import BytesMessage, CloseConnection, Event, Ping, TextMessage

from gateway.errors import GatewayError
from gateway.protocol.closes import close_reason

RECEIVE_BYTES = 65536
"""How much one ``receive_some`` may read: bounds what one read can buffer."""

_ABNORMAL_CLOSURE = 1006  # RFC 6455 section 7.1.5: closed without a close frame
_CLOSE_GRACE_S = 5.0  # how long a 1009 close or the echo of the peer's close may take


class Idle:
    """What :meth:`WebSocket.receive` returns when its deadline passed while it waited."""


IDLE: Final = Idle()


class ConnectionClosed(GatewayError):
    """Raised by :meth:`WebSocket.send_all` when the connection can no longer carry frames.

    Either side has started the close handshake, or the stream is broken. The
    writer stops; :attr:`WebSocket.close_code` says what happened.
    """


class SocketWriter:
    """A socket written to without blocking: a :class:`~gateway.session.hub.DirectWriter`.

    The :class:`WebSocket` that owns the socket makes it, writes through it
    while the kernel has room, and lends it to the fan-out (:attr:`WebSocket.direct`)
    while nothing else writes; the hub never sees the descriptor.

    Args:
        fd: the socket's descriptor, non-blocking (trio's sockets are).
        write: how a write is made (``os.write``; tests pass their own).
    """

    __slots__ = ("fd", "try_write")

    def __init__(self, fd: int, write: Callable[[int, bytes], int] = os.write) -> None:
        self.fd = fd
        # ``os.write`` bound to the descriptor: a call in C, with no Python frame
        # of its own, on the fan-out's hottest line (docs/performance.md).
        self.try_write: Callable[[bytes], int] = functools.partial(write, fd)


class WebSocket:
    """A server WebSocket connection: one reader task and one writer task may share it.

    Args:
        stream: the upgraded stream; this object owns it from now on.
        trailing_data: bytes the HTTP parser read past the upgrade request.
        max_message_bytes: the largest client message accepted
            (``max_client_frame_bytes``, docs/protocol.md §3); fragments count together.
        fd: the descriptor written to straight from the fan-out and by
            :meth:`send_all` while the kernel has room; by default the
            socket's for a :class:`trio.SocketStream`, none (-1) otherwise.
        write: how such a write is made (``os.write``; tests pass their own).
    """

    def __init__(
        self,
        stream: trio.abc.Stream,
        trailing_data: bytes = b"",
        *,
        max_message_bytes: int = 65536,
        fd: int | None = None,
        write: Callable[[int, bytes], int] = os.write,
    ) -> None:
        self._stream = stream
        self._max_message_bytes = max_message_bytes
        self._ws = Connection(ConnectionType.SERVER, extensions=[])
        self._unread = trailing_data  # served as the first read, so its events are not missed
        self._send_lock = trio.Lock()
        self._read_lock = trio.Lock()
        # Complete client messages not yet received. A list, not a deque: a
        # deque's first block costs ~600 bytes on every idle connection.
        self._inbox: list[str | bytes] = []
        self._partial = bytearray()  # the message being reassembled, as UTF-8 for text
        self._oversized = False
        self._close_sent = False
        self._gone = False
        # The unsent rest of a frame a direct write left half-written: it goes
        # out before any other byte, whoever writes next (module docstring).
        self._owed = b""
        # The pong not yet written (the latest ping's): it goes right after the owed bytes.
        self._control = b""
        self._close_code: int | None = None
        self._close_reason: str | None = None
        # The socket's descriptor, for writes that go straight to the kernel
        # when it has room; -1 for other streams, and once the stream is gone.
        if fd is None:
            fd = stream.socket.fileno() if isinstance(stream, trio.SocketStream) else -1
        self._writer = None if fd < 0 else SocketWriter(fd, write)
        # The socket's writer while a frame may be written to it straight from
        # the fan-out, with no task switch (StreamConnection.deliver): no write
        # in progress under the send lock, no close frame sent, the stream not
        # gone. None otherwise. ``on_direct_change`` is called, synchronously,
        # each time it changes (before the socket is closed, for None).
        self.direct: SocketWriter | None = self._writer
        self.on_direct_change: Callable[[], None] | None = None
        # Called, synchronously, when a pong waits for a write: whoever owns
        # the writing makes one soon (send_all, even of nothing, sends it).
        # Without it, the reader writes its pongs itself.
        self.on_control: Callable[[], None] | None = None

    @property
    def closed(self) -> bool:
        """True once a close frame was sent (ours or our echo) or the stream is gone."""
        return self._close_sent or self._gone

    @property
    def close_code(self) -> int | None:
        """The code of the first close frame sent or received.

        1006 when the stream ended, broke or was dropped before any close frame
        went either way; None while the connection is open.
        """
        return self._close_code

    @property
    def close_reason(self) -> str | None:
        """The reason that went with :attr:`close_code`."""
        return self._close_reason

    async def receive(self, deadline: float = math.inf) -> str | bytes | Idle | None:
        """The next complete client message, or None once the connection is closing or closed.

        Answers WebSocket-level pings with pongs and the peer's close frame with
        its echo. Never raises on a closed connection.

        Args:
            deadline: trio time after which waiting for bytes stops; bytes
                read are always handled whole (module docstring).

        Returns:
            a text message as ``str``, a binary message as ``bytes``,
            :data:`IDLE` when ``deadline`` passed first, or None.
        """
        with trio.move_on_at(deadline) as waiting:
            await self._read_lock.acquire()  # (a close may be reading its reply)
        if waiting.cancelled_caught:  # (then the lock was not taken)
            return IDLE
        try:
            while not self._inbox:
                if self.closed:
                    return None
                if not await self._read_more(deadline):
                    return IDLE
                if self._oversized:
                    code, reason = close_reason("frame_too_large")
                    await self._close_handshake(code, reason, _CLOSE_GRACE_S, read_lock_held=True)
                    return None
            return self._inbox.pop(0)
        finally:
            self._read_lock.release()

    def owe(self, rest: bytes) -> None:
        """The rest of a frame that a direct write sent only in part: it goes out first.

        Called synchronously by the fan-out, right after its short write;
        ``direct`` is None until the rest is sent (by the next write
        under the send lock, whatever it carries).
        """
        self._owed += rest
        self._set_direct(None)

    @property
    def owes(self) -> bool:
        """True while bytes wait to be sent: the rest of a half-written frame, or pongs."""
        return bool(self._owed or self._control)

    def _pending(self, data: bytes | memoryview) -> bytes | memoryview:
        """``data`` behind everything owed (a frame's rest, then pongs). Under the send lock."""
        if not (self._owed or self._control):
            return data
        data, self._owed, self._control = self._owed + self._control + data, b"", b""
        return data

    async def send_all(self, data: bytes) -> None:
        """Write already-framed bytes (one or many text frames joined) in one write.

        Raises:
            ConnectionClosed: a close frame was already sent or received, or the
                stream broke while writing.
        """
        # The hot path: an uncontended lock is taken without a trip through the
        # scheduler (``trio.Lock.acquire`` always yields); the write checkpoints.
        lock = self._send_lock
        try:
            lock.acquire_nowait()
        except trio.WouldBlock:
            await lock.acquire()
        self._set_direct(None)
        try:
            if self.closed:
                raise ConnectionClosed("the WebSocket is closed")
            if self._owed or self._control:  # what is owed goes first
                data, self._owed, self._control = self._owed + self._control + data, b"", b""
            if not data:
                return
            if self._writer is not None:
                # Straight to the kernel while it has room: no trip through
                # trio's socket machinery; only the rest (if any) waits.
                try:
                    sent = self._writer.try_write(data)
                except BlockingIOError:
                    sent = 0
                except OSError as exc:
                    self._record_close(_ABNORMAL_CLOSURE, "")
                    await self._drop()
                    raise ConnectionClosed("the WebSocket stream is broken") from exc
                if sent == len(data):
                    return
                await self._write(memoryview(data)[sent:])
            else:
                await self._write(data)
        finally:
            lock.release()
            self._sync_direct()

    async def close(self, code: int, reason: str = "", *, grace_s: float = 5.0) -> None:
        """Close the connection with ``code`` and ``reason`` (docs/protocol.md §3, close codes).

        Sends a close frame unless one was already sent, waits up to ``grace_s``
        for the peer's reply, then closes the stream. Shielded from outer
        cancellation for at most ``grace_s``, so a cancelled session still says
        goodbye. Idempotent; safe on a broken stream. No frame is sent when a
        cancelled :meth:`send_all` may have left half a frame on the wire, or
        when the send lock stays held (a stuck write) for the whole grace.

        Args:
            code: the close code (docs/protocol.md §3: 1000, 1001, 1008, 1009, 1011).
            reason: at most 123 UTF-8 bytes (RFC 6455 section 5.5); wsproto cuts longer ones.
            grace_s: how long the whole close may take.
        """
        await self._close_handshake(code, reason, grace_s, read_lock_held=False)

    async def aclose(self) -> None:
        """Drop the stream without a close handshake."""
        self._record_close(_ABNORMAL_CLOSURE, "")
        await self._drop()

    # --- reading -----------------------------------------------------------------

    async def _read_more(self, deadline: float = math.inf) -> bool:
        """Read once from the stream and act on every event it completes. Needs the read lock.

        Returns:
            False when ``deadline`` passed before any byte came (nothing was
            read: a cancelled ``receive_some`` consumes nothing).
        """
        data, self._unread = self._unread, b""
        if not data:
            with trio.move_on_at(deadline) as waiting:
                try:
                    data = bytes(await self._stream.receive_some(RECEIVE_BYTES))
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    data = b""
            if waiting.cancelled_caught:
                return False
        if not data:
            self._record_close(_ABNORMAL_CLOSURE, "")
            await self._drop()
            return True
        self._ws.receive_data(data)
        for event in self._ws.events():
            await self._on_event(event)
            if self._gone:
                break
        return True

    async def _on_event(self, event: Event) -> None:
        if isinstance(event, TextMessage | BytesMessage):
            self._on_data(event)
        elif isinstance(event, Ping):
            if self.closed:
                return
            first = not self._control
            # Only the latest ping's pong is owed (RFC 6455 section 5.5.3): a
            # client that pings and reads nothing makes us hold one pong, not one
            # a ping.
            self._control = self._ws.send(event.response())
            if self.on_control is not None:
                if first:  # (a ping flood asks for one write)
                    self.on_control()  # the connection's writer sends it (module docstring)
                return
            async with self._sending():
                if not self.closed:
                    await self._write_quietly(b"")
        elif isinstance(event, CloseConnection):
            await self._on_close_frame(event)

    def _on_data(self, event: TextMessage | BytesMessage) -> None:
        """Reassemble fragments; data after our close frame is dropped (RFC 6455 section 1.4)."""
        if self._close_sent or self._oversized:
            return
        chunk = event.data
        self._partial += chunk.encode() if isinstance(chunk, str) else chunk
        if len(self._partial) > self._max_message_bytes:
            self._oversized = True
            self._partial.clear()
            return
        if event.message_finished:
            message = bytes(self._partial)
            self._partial.clear()
            self._inbox.append(message.decode() if isinstance(event, TextMessage) else message)

    async def _on_close_frame(self, event: CloseConnection) -> None:
        """A close frame from the peer, or wsproto reporting a protocol violation."""
        self._record_close(event.code, event.reason or "")
        state = self._ws.state
        # Within a grace: a peer that closes may well read nothing more.
        with trio.move_on_after(_CLOSE_GRACE_S):
            if state is ConnectionState.REMOTE_CLOSING:
                await self._send_close(event.code, "")  # echo the code (RFC 6455 section 5.5.1)
            elif state is ConnectionState.OPEN:
                # wsproto could not parse the stream: fail the connection with its code.
                await self._send_close(event.code, event.reason or "")
        # Handshake complete (or parser dead): the server closes TCP first.
        await self._drop()

    # --- writing and closing -------------------------------------------------------

    async def _close_handshake(
        self, code: int, reason: str, grace_s: float, *, read_lock_held: bool
    ) -> None:
        with trio.CancelScope(deadline=trio.current_time() + grace_s, shield=True):
            await self._send_close(code, reason)
            if read_lock_held:
                await self._read_until_gone()
            else:
                async with self._read_lock:
                    await self._read_until_gone()
        await self._drop()

    async def _read_until_gone(self) -> None:
        """Read (dropping data) until the peer's close reply or EOF. Needs the read lock."""
        while not self._gone:
            await self._read_more()

    @contextlib.asynccontextmanager
    async def _sending(self) -> AsyncIterator[None]:
        """Hold the send lock; no direct write starts until it is released."""
        await self._send_lock.acquire()
        self._set_direct(None)
        try:
            yield
        finally:
            self._send_lock.release()
            self._sync_direct()

    def _sync_direct(self) -> None:
        locked = self._close_sent or self._gone or self._send_lock.locked() or bool(self._owed)
        self._set_direct(None if locked else self._writer)

    def _set_direct(self, writer: SocketWriter | None) -> None:
        if writer is not self.direct:
            self.direct = writer
            if self.on_direct_change is not None:
                self.on_direct_change()

    async def _send_close(self, code: int, reason: str) -> None:
        async with self._sending():
            if self.closed:
                return
            self._record_close(code, reason)
            frame = self._ws.send(CloseConnection(code=code, reason=reason))
            self._close_sent = True
            await self._write_quietly(frame)

    async def _write_quietly(self, data: bytes) -> None:
        """:meth:`_write` for the reader's and closer's frames: a dead peer is no error there."""
        with contextlib.suppress(ConnectionClosed):
            await self._write(data)

    async def _write(self, data: bytes | memoryview) -> None:
        """Write under the send lock; a broken stream becomes :class:`ConnectionClosed`.

        Whatever is owed goes first: the rest of a half-written frame, then pongs.
        """
        data = self._pending(data)
        if not data:
            return
        try:
            await self._stream.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            self._record_close(_ABNORMAL_CLOSURE, "")
            await self._drop()
            raise ConnectionClosed("the WebSocket stream is broken") from exc
        except trio.Cancelled:
            # A cancelled send_all may leave half a frame on the wire: nothing more can
            # be framed on this stream. Whoever owns it closes it (serve_connection).
            self._gone = True
            raise

    def _record_close(self, code: int, reason: str) -> None:
        if self._close_code is None:
            self._close_code = int(code)
            self._close_reason = reason

    async def _drop(self) -> None:
        self._gone = True
        self._writer = None
        self._set_direct(None)
        await trio.aclose_forcefully(self._stream)

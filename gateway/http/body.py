"""A streaming response's body, written by its handler and, while idle, straight from the fan-out.

What a :class:`~gateway.http.server.StreamingResponse`'s ``run`` is given as
its ``send`` (docs/protocol.md §3, §14; docs/performance.md "Doors"): a
callable that writes one piece of the body, framed as the response is
(HTTP/1.1 chunks, or the raw bytes of an HTTP/1.0 body that ends with the
connection). Like a WebSocket (:class:`gateway.http.websocket.WebSocket`), it
lends its socket's :class:`~gateway.http.websocket.SocketWriter` to the
session's hub (:attr:`StreamBody.direct`) while nothing else writes: no
``send`` in progress, nothing owed, the body not over. The hub then writes
a batch's bytes, framed once for every client that shares them
(:func:`chunk`), with one non-blocking write and no task switch. A write the
kernel takes only in part leaves the rest owed (:meth:`StreamBody.owe`): it
goes out first, with the next ``send``, and until then nothing is lent.
``on_direct_change`` is called, synchronously, each time :attr:`direct`
changes (before the socket can be closed, for None).
"""

from __future__ import annotations

import os
from collections.abc import Callable

import trio

from gateway.http.websocket import SocketWriter


def chunk(data: bytes) -> bytes:
    """``data`` as one HTTP/1.1 chunk (RFC 9112 section 7.1), as h11 frames it."""
    return b"%x\r\n%b\r\n" % (len(data), data)


class StreamBody:
    """The body of one streaming response (module docstring).

    Args:
        stream: the connection's stream, with the head already sent.
        chunked: the body is chunked (HTTP/1.1); False: raw bytes (HTTP/1.0).
        fd: the socket's descriptor for direct writes; -1 (another stream, TLS): none.
        write: how a direct write is made (``os.write``; tests pass their own).
    """

    def __init__(
        self,
        stream: trio.abc.Stream,
        chunked: bool,
        fd: int = -1,
        write: Callable[[int, bytes], int] = os.write,
    ) -> None:
        self._stream = stream
        self.chunked = chunked
        self._writer = SocketWriter(fd, write) if fd >= 0 else None
        self._owed = b""
        self._sending = False
        self._over = False
        self.direct: SocketWriter | None = self._writer
        self.on_direct_change: Callable[[], None] | None = None

    def frame(self, data: bytes) -> bytes:
        """``data`` framed as this body's pieces are."""
        return chunk(data) if self.chunked and data else data

    @property
    def owes(self) -> bool:
        """The rest of a direct write waits for the next ``send``."""
        return bool(self._owed)

    def owe(self, rest: bytes) -> None:
        """The rest of a direct write the kernel took only in part (already framed)."""
        self._owed += rest
        self._set_direct(None)

    async def __call__(self, data: bytes) -> None:
        """Write ``data`` (unframed; empty: only what is owed).

        Raises:
            trio.BrokenResourceError: the client went away.
            trio.ClosedResourceError: the body is over.
        """
        if self._over:
            raise trio.ClosedResourceError("the body is over")
        self._sending = True
        self._set_direct(None)
        try:
            out = self._owed + self.frame(data) if self._owed else self.frame(data)
            self._owed = b""
            if out:
                await self._stream.send_all(out)
        except BaseException:
            self._over = True  # half a piece may be on the wire: nothing more is written
            raise
        finally:
            self._sending = False
            self._sync()

    def finish(self) -> None:
        """The body ends (the transport writes its end): nothing is lent from now on."""
        self._over = True
        self._set_direct(None)

    def _sync(self) -> None:
        idle = not (self._sending or self._over or self._owed)
        self._set_direct(self._writer if idle else None)

    def _set_direct(self, writer: SocketWriter | None) -> None:
        if writer is not self.direct:
            self.direct = writer
            if self.on_direct_change is not None:
                self.on_direct_change()

"""What an MCP server sends, made safe before the SDK reads it (docs/protocol.md §11).

The SDK's dispatcher reads a ``notifications/progress``'s ``progress`` and
``total`` with ``float()`` in its receive loop, whatever the transport: a
server's ``10**400`` (a JSON integer no float can hold) raised
``OverflowError`` there, which ended the connection and every call in flight
on it. :func:`finite_progress` makes such a value infinite, and an infinite
value is dropped as any value JSON cannot carry (gateway.mcp.progress).

The stdio transport (gateway.mcp.stdio) parses each line itself and applies it
there; a transport whose parsing is the SDK's (streamable HTTP) has its read
stream passed through :func:`guarded`.

One message is at most :data:`MAX_MESSAGE_BYTES` on either transport (a stdio
line; a streamable HTTP server-sent event, whose SDK default of 1 MiB failed a
tool result that stdio takes and cuts at 1 MiB, and the connection with it).
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import anyio
import httpx2
import mcp_types as types
import trio
from mcp.client._transport import TransportStreams
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.message import SessionMessage

_PROGRESS = "notifications/progress"

MAX_MESSAGE_BYTES = 64 * 1024 * 1024
"""The most one message of a server may hold, on any transport (module docstring)."""


def streamable_http(
    url: str, http: httpx2.AsyncClient
) -> AbstractAsyncContextManager[TransportStreams]:
    """The SDK's streamable HTTP transport to ``url`` on ``http``, its events bounded as a
    stdio line is (:data:`MAX_MESSAGE_BYTES`, module docstring)."""
    return streamable_http_client(url, http_client=http, max_sse_event_size=MAX_MESSAGE_BYTES)


def finite_progress(message: Any) -> None:
    """A progress notification's integer past a float's range, as infinite (module docstring)."""
    if not isinstance(message, types.JSONRPCNotification) or message.method != _PROGRESS:
        return
    params: dict[str, Any] | None = message.params
    if params is None:
        return
    for key in ("progress", "total"):
        value = params.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            try:
                float(value)
            except OverflowError:
                params[key] = math.inf if value > 0 else -math.inf


@asynccontextmanager
async def guarded(streams: TransportStreams) -> AsyncIterator[TransportStreams]:
    """``streams`` with every message read passed through :func:`finite_progress` first.

    One task (``mcp-inbound``) forwards the transport's read stream; its end (or
    an error item) reaches the session as the transport's would.
    """
    read, write = streams
    to_session, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)

    async def forward() -> None:
        try:
            async with to_session:
                async for item in read:
                    if isinstance(item, SessionMessage):
                        finite_progress(item.message)
                    await to_session.send(item)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            pass  # the session is gone: nothing to forward to

    async with trio.open_nursery() as nursery:
        nursery.start_soon(forward, name="mcp-inbound")
        try:
            yield read_stream, write
        finally:
            nursery.cancel_scope.cancel()
            read_stream.close()

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
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import mcp_types as types
import trio
from mcp.client._transport import TransportStreams
from mcp.shared.message import SessionMessage

_PROGRESS = "notifications/progress"


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

"""The stream over server-sent events, the client's side (docs/doors/sse.md).

Where a WebSocket cannot be opened (a proxy refuses the upgrade), the
subscription (:class:`gateway.client.stream.Subscription`) reads the same
frames from ``GET /sessions/{id}/events``: each SSE event's ``data`` is one
server frame's JSON, as the WebSocket would carry it. Sans-IO here: the
parser, the query a subscribe becomes, which refusals mean "no WebSocket
here", and the last ``close`` frame as the WebSocket close it stands for.
"""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import AsyncIterator
from typing import Any

import httpx
import trio

# The gateway's own refusals of a handshake that reached it without its
# upgrade (a proxy dropped the headers): a WebSocket cannot pass this way.
UPGRADE_LOST = frozenset(
    {"upgrade_required", "unsupported_websocket_version", "invalid_websocket_handshake"}
)


def no_websocket_here(status: int, body: bytes | None) -> bool:
    """Whether a refused handshake means the WebSocket cannot pass (then SSE is tried).

    A body that is not the gateway's error (a proxy answered: 4xx or 5xx), or
    the gateway's own refusal of a request that lost its upgrade on the way.
    The gateway's other refusals (403 attach token, 404, 503 over capacity)
    are its word on the stream, whatever the transport.
    """
    try:
        code = json.loads(body or b"{}")["error"]["code"]
    except (ValueError, KeyError, TypeError):
        return status >= 400
    return code in UPGRADE_LOST


def attach_token(ws_url: str) -> str:
    """The single-use attach token in a ``ws_url`` (its ``attach`` query parameter)."""
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(ws_url).query)
    return query.get("attach", [""])[0]


def events_query(
    token: str, filter: Any, since: str | None, snapshot: bool, coalesce_ms: int | None = None
) -> dict[str, str]:
    """The query of ``GET /sessions/{id}/events`` for a subscribe of these arguments."""
    query = {
        "attach": token,
        "filter": filter if isinstance(filter, str) else json.dumps(filter),
        "snapshot": "true" if snapshot else "false",
    }
    if since is not None and not snapshot:
        query["since"] = since
    if coalesce_ms is not None:
        query["coalesce_ms"] = str(coalesce_ms)
    return query


class SseParser:
    """Server-sent events, as far as the gateway uses them: ``data`` lines and comments.

    :meth:`feed` takes bytes as they come and answers each complete event's
    data (several ``data`` lines joined with newlines); comments (the
    ``: ping`` heartbeat), ``id`` and ``retry`` fields are skipped (the
    frames carry the event ids themselves).
    """

    def __init__(self) -> None:
        self._buffer = b""
        self._data: list[bytes] = []

    def feed(self, chunk: bytes) -> list[str]:
        self._buffer += chunk
        out: list[str] = []
        while True:
            line, sep, rest = self._buffer.partition(b"\n")
            if not sep:
                return out
            self._buffer = rest
            line = line.removesuffix(b"\r")
            if not line:
                if self._data:
                    out.append(b"\n".join(self._data).decode())
                    self._data = []
                continue
            name, _, value = line.partition(b":")
            if name == b"data":
                self._data.append(value.removeprefix(b" "))


def close_frame(text: str) -> dict[str, Any] | None:
    """The gateway's last frame ``{"type": "close", "code", "ws_code", ...}``, if ``text`` is it."""
    if not text.startswith('{"type":"close"'):
        return None
    try:
        frame = json.loads(text)
    except ValueError:
        return None
    return frame if isinstance(frame, dict) else None


async def abandon(response: httpx.Response, chunks: AsyncIterator[bytes]) -> None:
    """Leave a body that is still streaming, its iterators run out rather than left hanging.

    httpx's body iterators are a chain of async generators; one left suspended
    is finalized by the garbage collector, with a ``ResourceWarning``. Closing
    the response first makes the next read end or fail at once, which ends
    every generator of the chain.
    """
    await response.aclose()
    with trio.move_on_after(1):
        try:
            async for _ in chunks:
                pass
        except Exception:
            pass  # a read of a closed connection: the chain is over either way

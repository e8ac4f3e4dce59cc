"""``gateway attach``: the reference terminal client of a session stream.

It does what PROTOCOL section 3 asks of every client: fetch a single-use
attach token, subscribe with a filter, print every frame as one JSON line,
answer the server's pings, and, when the server closes with a code that says
"reconnect" (1001 shutdown or heartbeat, 1008 too slow), fetch a fresh token
and resume with ``since`` = the last event id it printed, so nothing is lost
and nothing is printed twice.
"""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, TextIO

import httpx
import trio
from trio_websocket import ConnectionClosed, WebSocketConnection, open_websocket_url

from gateway.protocol.frames import CLOSES, EventFrame, Ping, Pong, encode

RESUMABLE = {code for code, (_, _, reconnect) in CLOSES.items() if reconnect}


@asynccontextmanager
async def open_websocket(url: str, **kw: Any) -> AsyncIterator[WebSocketConnection]:
    """``trio_websocket.open_websocket_url`` that also closes its socket.

    trio-websocket 0.12 leaves its TCP stream open when the server closes the
    connection first (a 1008, a 1009, a shutdown); a long-lived client that
    reconnects would leak one socket per reconnect.
    """
    opened: WebSocketConnection | None = None
    try:
        async with open_websocket_url(url, **kw) as ws:
            opened = ws
            yield ws
    finally:
        if opened is not None:
            await trio.aclose_forcefully(opened._stream)


async def attach(
    base_url: str,
    session_id: str,
    *,
    filter: Any = "preset:chat",
    since: str | None = None,
    snapshot: bool = False,
    api_key: str | None = None,
    out: TextIO = sys.stdout,
    max_reconnects: int = 10,
) -> int:
    """Print the session's stream until the server ends it; the exit status."""
    from gateway.client.codec import decode_server_frame

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    cursor = since
    async with httpx.AsyncClient(base_url=base_url, headers=headers) as http:
        for _ in range(max_reconnects + 1):
            r = await http.get(f"/sessions/{session_id}")
            if r.status_code != 200:
                print(f"attach: {r.status_code} {r.text}", file=sys.stderr)
                return 1
            subscribe = {
                "type": "subscribe",
                "filter": filter,
                "since": cursor,
                "snapshot": snapshot,
            }
            try:
                async with open_websocket(r.json()["ws_url"]) as ws:
                    await ws.send_message(json.dumps(subscribe))
                    while True:
                        raw = await ws.get_message()
                        frame = decode_server_frame(raw)
                        if isinstance(frame, Ping):
                            await ws.send_message(encode(Pong(frame.nonce)).decode())
                        elif isinstance(frame, EventFrame):
                            cursor = frame.event.id
                        print(raw if isinstance(raw, str) else raw.decode(), file=out, flush=True)
            except ConnectionClosed as closed:
                code = closed.reason.code if closed.reason else 1006
                reason = _close_code(closed.reason.reason if closed.reason else None)
                print(f"attach: closed {code} {reason}", file=sys.stderr)
                if reason not in RESUMABLE:
                    return 0 if code == 1000 else 1
                snapshot = cursor is None and snapshot  # resume by cursor once we have one
    return 1


def _close_code(reason: str | None) -> str:
    try:
        return str(json.loads(reason or "{}").get("code", ""))
    except ValueError:
        return ""


def run(args: Any) -> int:
    filter_: Any = args.filter
    if filter_.startswith("{"):
        filter_ = json.loads(filter_)
    return trio.run(
        lambda: attach(
            args.url,
            args.session_id,
            filter=filter_,
            since=args.since,
            snapshot=args.snapshot,
            api_key=args.api_key,
        )
    )

"""A one-way stream whose client reads nothing gives its slot back (docs/doors/sse.md).

Found by an adversarial review: native SSE, an AG-UI run and an AI SDK
response each wrote through a send with no deadline, so a client that
stopped reading once the socket's buffers were full was marked too slow
(``slow_client_closed``) but its pump stayed blocked in the write: the
stream stayed open (``gateway_streams_open``), holding its key's stream slot
and its session, for as long as the client kept the socket. Now, once a
close is decided, every write of the stream must finish within
``close_grace_s``, or the connection is closed.

Real sockets on 127.0.0.1 with small buffers on both sides; a turn far
larger than the queue's bound.
"""

from __future__ import annotations

import json
import re
import socket
from pathlib import Path

import pytest
import trio

from tests.conftest import Harness, make_config, running_gateway
from tests.named_race import agui_body, aisdk_body

SCRIPT = json.dumps({"script": {"rounds": [[{"lorem": 3000}]], "chunk_chars": 4, "delay_ms": 1}})
DOORS = {"sse": "sse", "agui": "agui", "aisdk": "ai_sdk", "a2a": "a2a"}


def stalled_socket(port: int, request: bytes) -> socket.socket:
    """A client socket with a tiny receive buffer that sends ``request`` and never reads."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)
    s.connect(("127.0.0.1", port))
    s.sendall(request)
    return s


def post(path: str, body: dict[str, object]) -> bytes:
    data = json.dumps(body).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\n\r\n"
    ).encode()
    return head + data


def a2a_body(sid: str, text: str) -> dict[str, object]:
    """A2A's ``SendStreamingMessage`` of ``text`` on the session ``sid`` (its context)."""
    message = {"messageId": "m-1", "role": "ROLE_USER", "contextId": sid, "parts": [{"text": text}]}
    return {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "SendStreamingMessage",
        "params": {"message": message},
    }


async def open_streams(gw: Harness, door: str) -> float:
    text = (await gw.http.get("/metrics")).text
    found = re.search(rf'gateway_streams_open{{door="{DOORS[door]}"}} (\S+)', text)
    return float(found.group(1)) if found else 0.0


async def until_open(gw: Harness, door: str, count: int) -> None:
    """Poll ``/metrics`` until the door has ``count`` streams open."""
    for _ in range(600):
        if await open_streams(gw, door) == count:
            return
        await trio.sleep(0.05)
    raise AssertionError(f"{door}: never {count} streams open")


@pytest.mark.slow  # a real turn of some thousands of deltas, and the close's grace
@pytest.mark.parametrize("door", sorted(DOORS))
async def test_a_client_that_reads_nothing_is_closed_within_the_grace(
    tmp_path: Path, door: str
) -> None:
    config = make_config(
        tmp_path,
        **{
            "stream.queue_max_events": 50,
            "stream.close_grace_s": 1.0,
            "server.send_buffer_bytes": 4096,
        },
    )
    with trio.fail_after(60):
        async with running_gateway(config) as gw:
            port = int(gw.base.rsplit(":", 1)[1])
            sid = await gw.create_session()
            if door == "sse":
                token = (await gw.http.get(f"/sessions/{sid}")).json()["attach_token"]
                request = (
                    f"GET /sessions/{sid}/events?attach={token}&filter=preset:full HTTP/1.1\r\n"
                    "Host: 127.0.0.1\r\n\r\n"
                ).encode()
                client = stalled_socket(port, request)
                await until_open(gw, door, 1)
                await gw.submit(sid, SCRIPT)
            elif door == "agui":
                client = stalled_socket(port, post("/agui", agui_body(sid, SCRIPT)))
            elif door == "a2a":
                client = stalled_socket(port, post("/a2a", a2a_body(sid, SCRIPT)))
            else:
                client = stalled_socket(port, post("/ai-sdk/chat", aisdk_body(sid, SCRIPT)))
            try:
                await until_open(gw, door, 1)
                # The turn overflows the queue; the close's grace runs out on the stalled
                # write: the stream is gone while the client still holds its socket.
                await until_open(gw, door, 0)
            finally:
                client.close()

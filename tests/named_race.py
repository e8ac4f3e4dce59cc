"""Two tenants naming one session through two doors at once (docs/protocol.md §14).

The adversary's trial of issue 38: tenant A sends ``POST /agui`` with
``threadId`` X and tenant B ``POST /ai-sdk/chat`` with ``id`` X at the same
moment. Each request goes out whole but for the last byte of its body; then
both last bytes, back to back, so the two creations race inside the gateway
(the same node, or two nodes on one store). :func:`race` runs such pairs and
:func:`check_one_owner` checks what must hold after: of each pair at most one
request made a session (the other 404), and each name is one tenant's, its
messages that tenant's only, as both keys see them.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

import httpx
import trio

from tests.aisdk_support import request, user
from tests.integration.doors.agui.test_agui_http import run_input

KEYS = ("key-a", "key-b")
"""Tenant A's key and tenant B's (``[auth] api_keys``)."""


def agui_body(name: str, text: str) -> dict[str, Any]:
    """AG-UI's ``RunAgentInput`` naming ``name`` (the AG-UI tests' own)."""
    return run_input(name, text)


def aisdk_body(name: str, text: str) -> dict[str, Any]:
    """The AI SDK's chat request naming ``name`` (the AI SDK tests' own)."""
    return request(name, user(text))


DOORS = {"agui": ("/agui", agui_body), "aisdk": ("/ai-sdk/chat", aisdk_body)}
"""Every door that names its session: path, and its body for (name, text)."""


@dataclass(frozen=True)
class Sent:
    """One request of a race: which door, as which tenant, on which port; its status."""

    door: str
    key: str
    port: int
    text: str
    status: int


async def _held(port: int, door: str, key: str, name: str, text: str) -> trio.SocketStream:
    """A connection that has sent one request whole but for its body's last byte."""
    path, body_of = DOORS[door]
    body = json.dumps(body_of(name, text)).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {key}\r\n"
        f"Content-Type: application/json\r\nAccept: text/event-stream\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    await stream.send_all(head + body[:-1])
    return stream


async def _status(stream: trio.SocketStream, last: bytes, into: list[int]) -> None:
    """Send the last byte, read the status line, hang up (a dropped stream cancels nothing)."""
    got = b""
    async with stream:
        await stream.send_all(last)
        while b"\r\n" not in got:
            chunk = await stream.receive_some(4096)
            if not chunk:
                break
            got += chunk
    into.append(int(got.split(b" ", 2)[1]) if got.startswith(b"HTTP/1.1 ") else 0)


async def race_one(name: str, a: tuple[str, int], b: tuple[str, int]) -> tuple[Sent, Sent]:
    """Tenant A through door ``a[0]`` on port ``a[1]``, tenant B through ``b``, both naming
    ``name``, released together."""
    texts = (f"from A about {name}", f"from B about {name}")
    streams = [
        await _held(port, door, key, name, text)
        for (door, port), key, text in zip((a, b), KEYS, texts, strict=True)
    ]
    statuses: list[list[int]] = [[], []]
    async with trio.open_nursery() as nursery:
        for stream, into in zip(streams, statuses, strict=True):
            nursery.start_soon(_status, stream, b"}", into)
    return (
        Sent(a[0], KEYS[0], a[1], texts[0], statuses[0][0]),
        Sent(b[0], KEYS[1], b[1], texts[1], statuses[1][0]),
    )


async def race(
    pairs: int, a: tuple[str, int], b: tuple[str, int], at_once: int = 10
) -> dict[str, tuple[Sent, Sent]]:
    """``pairs`` races, ``at_once`` at a time; each name's two requests."""
    results: dict[str, tuple[Sent, Sent]] = {}

    async def one(name: str) -> None:
        results[name] = await race_one(name, a, b)

    for start in range(0, pairs, at_once):
        async with trio.open_nursery() as nursery:
            for i in range(start, min(pairs, start + at_once)):
                nursery.start_soon(one, f"race-{uuid.uuid4().hex[:12]}-{i}")
    return results


async def check_one_owner(
    results: dict[str, tuple[Sent, Sent]], bases: list[str], settle_s: float = 30
) -> dict[str, int]:
    """What must hold after :func:`race` (module docstring), asked of every node in ``bases``.

    Returns how many names each tenant got, for the caller's report.
    """
    won = {key: 0 for key in KEYS}
    async with httpx.AsyncClient(timeout=30) as http:
        for name, sent in results.items():
            made = [s for s in sent if s.status == 200]
            assert all(s.status in (200, 404) for s in sent), (name, sent)
            assert len(made) == 1, f"not one tenant alone got 200 for {name}: {sent}"
            for base in bases:
                seen = {}
                for key in KEYS:
                    r = await _messages(http, f"{base}/sessions/{name}/messages", key, settle_s)
                    seen[key] = r
                owners = [key for key, r in seen.items() if r is not None]
                assert len(owners) == 1, f"{name} is seen by {owners or 'nobody'} on {base}"
                (owner,) = owners
                if made:
                    assert made[0].key == owner, (name, sent, owner)
                texts = json.dumps(seen[owner])
                other = next(s for s in sent if s.key != owner)
                assert other.text not in texts, f"{name}: {owner} reads {other.key}'s message"
            won[owner] += 1
    return won


async def _messages(
    http: httpx.AsyncClient, url: str, key: str, settle_s: float
) -> list[dict[str, Any]] | None:
    """The session's messages as ``key`` sees them; ``None``: 404 to that key."""
    with trio.fail_after(settle_s):
        while True:
            r = await http.get(url, headers={"Authorization": f"Bearer {key}"})
            if r.status_code == 404:
                return None
            if r.status_code == 200:
                messages: list[dict[str, Any]] = r.json()["messages"]
                return messages
            await trio.sleep(0.05)  # 503 while the store catches up; anything else fails below
            assert r.status_code == 503, (url, r.status_code, r.text)

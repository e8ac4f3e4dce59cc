"""A local stand-in for a model API: replays recorded SSE bytes, records what it was sent.

The providers' tests and ``bench/ttft.py`` point the real clients (the
``anthropic`` SDK, httpx) at it, so that everything from the socket up is the
code that talks to the real service. It is an HTTP/1.1 server on h11 and Trio,
on 127.0.0.1 with port 0, started in the caller's nursery::

    server = FakeServer(Replay(transcript("anthropic/text.sse")))
    base_url = await nursery.start(server.serve)

Each request, whatever its path, is answered with the next queued reply (a 500
once there is none) and recorded in :attr:`FakeServer.requests` (method, path,
headers, JSON body) for the test to assert on. Replies:

- :class:`Replay`: ``200 text/event-stream``, the transcript's bytes exactly,
  in one write or in writes of ``chunk_bytes`` (to exercise the SSE parser),
  optionally cut short at ``cut.at`` bytes by dropping the connection or by
  stalling (to exercise network errors and timeouts), optionally after
  ``delay_s`` (a call that takes a while to answer).
- :class:`Json`: a status and a JSON body, e.g. a 529 ``overloaded_error``;
  :func:`prompt_too_long` and :func:`context_length_exceeded` are the two
  refusals of a call longer than the model's context (Anthropic's, OpenAI's),
  which the gateway answers with a compaction (docs/protocol.md §12).

What reached the model is in :attr:`FakeServer.requests`: each request's
decoded JSON body (the system prompt, the tools, the messages: after a
compaction, the summary then the kept messages), in the order received.
"""

from __future__ import annotations

import json
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import h11
import trio

TRANSCRIPTS = Path(__file__).parent / "transcripts"


def transcript(name: str) -> bytes:
    """A recorded stream under ``bench/fake_api/transcripts``, e.g. ``"anthropic/text.sse"``."""
    return (TRANSCRIPTS / name).read_bytes()


@dataclass(frozen=True)
class Cut:
    """End a replay early, after ``at`` bytes: drop the connection, or stall forever."""

    at: int
    how: Literal["drop", "stall"] = "drop"


@dataclass(frozen=True)
class Replay:
    """``200 text/event-stream`` with these bytes as the body, chunked as HTTP/1.1 allows."""

    body: bytes
    chunk_bytes: int = 0  # 0: the whole body in one write
    cut: Cut | None = None
    delay_s: float = 0.0  # how long the answer waits before its head is sent


@dataclass(frozen=True)
class Json:
    """``status`` with ``body`` as JSON: an error, or a server that ignored ``stream``."""

    status: int
    body: Any
    headers: tuple[tuple[str, str], ...] = ()


Reply = Replay | Json


def prompt_too_long(tokens: int = 200_001, limit: int = 200_000) -> Json:
    """The Messages API's refusal of a call longer than the model's context (400)."""
    return Json(
        400,
        {
            "type": "error",
            "error": {
                "type": "invalid_request_error",
                "message": f"prompt is too long: {tokens} tokens > {limit} maximum",
            },
        },
    )


def context_length_exceeded(tokens: int = 200_001, limit: int = 128_000) -> Json:
    """An OpenAI-compatible server's refusal of a call longer than the model's context (400)."""
    return Json(
        400,
        {
            "error": {
                "message": f"This model's maximum context length is {limit} tokens. However,"
                f" your messages resulted in {tokens} tokens. Please reduce the length of the"
                " messages.",
                "type": "invalid_request_error",
                "param": "messages",
                "code": "context_length_exceeded",
            }
        },
    )


@dataclass(frozen=True)
class Recorded:
    """One request as the server received it."""

    method: str
    path: str
    headers: dict[str, str]  # names in lower case
    body: Any  # the decoded JSON body, None when empty


class FakeServer:
    """Answers each request with the next reply; see the module docstring.

    Args:
        replies: the answers to the first requests, in order (:meth:`enqueue` adds more).
    """

    def __init__(self, *replies: Reply) -> None:
        self.replies: deque[Reply] = deque(replies)
        self.requests: list[Recorded] = []
        self.base_url = ""

    def enqueue(self, *replies: Reply) -> None:
        self.replies.extend(replies)

    async def serve(self, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
        """Listen until cancelled; ``task_status`` receives the base URL."""
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        port = listeners[0].socket.getsockname()[1]
        self.base_url = f"http://127.0.0.1:{port}"
        task_status.started(self.base_url)
        await trio.serve_listeners(self._serve_connection, listeners)

    async def _serve_connection(self, stream: trio.SocketStream) -> None:
        """Answer requests on one keep-alive connection until the client leaves."""
        async with stream:
            conn = h11.Connection(h11.SERVER)
            try:
                while True:
                    request = await _read_request(conn, stream)
                    if request is None:
                        return
                    self.requests.append(request)
                    if not await self._answer(conn, stream, self._next_reply()):
                        return
                    if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                        return
                    conn.start_next_cycle()
            except (trio.BrokenResourceError, h11.RemoteProtocolError):
                return  # the client hung up (a timeout, a cancelled call): its choice

    def _next_reply(self) -> Reply:
        if self.replies:
            return self.replies.popleft()
        return Json(500, {"error": {"type": "api_error", "message": "no reply queued"}})

    async def _answer(self, conn: h11.Connection, stream: trio.SocketStream, reply: Reply) -> bool:
        """Send the reply; False when the connection must not be reused."""
        if isinstance(reply, Json):
            body = json.dumps(reply.body).encode()
            headers = [
                ("content-type", "application/json"),
                ("content-length", str(len(body))),
                *reply.headers,
            ]
            await _send(conn, stream, h11.Response(status_code=reply.status, headers=headers))
            await _send(conn, stream, h11.Data(data=body))
            await _send(conn, stream, h11.EndOfMessage())
            return True
        headers = [("content-type", "text/event-stream"), ("cache-control", "no-cache")]
        await trio.sleep(reply.delay_s)
        await _send(conn, stream, h11.Response(status_code=200, headers=headers))
        body = reply.body if reply.cut is None else reply.body[: reply.cut.at]
        step = reply.chunk_bytes or max(len(body), 1)
        for at in range(0, len(body), step):
            await _send(conn, stream, h11.Data(data=body[at : at + step]))
        if reply.cut is not None:
            if reply.cut.how == "stall":
                await trio.sleep_forever()
            return False  # dropped: the body never ends
        await _send(conn, stream, h11.EndOfMessage())
        return True


async def _read_request(conn: h11.Connection, stream: trio.SocketStream) -> Recorded | None:
    """The next whole request on the connection, or None once the client has gone."""
    head: h11.Request | None = None
    body = bytearray()
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            conn.receive_data(await stream.receive_some())
        elif isinstance(event, h11.Request):
            head = event
        elif isinstance(event, h11.Data):
            body += event.data
        elif isinstance(event, h11.EndOfMessage):
            assert head is not None
            return Recorded(
                method=head.method.decode(),
                path=head.target.decode(),
                headers={k.decode().lower(): v.decode() for k, v in head.headers},
                body=json.loads(body) if body else None,
            )
        else:  # ConnectionClosed, or PAUSED after a client that closed
            return None


async def _send(conn: h11.Connection, stream: trio.SocketStream, event: h11.Event) -> None:
    data = conn.send(event)
    if data:
        await stream.send_all(data)

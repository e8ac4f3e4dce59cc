"""A webhook receiver on loopback for the tests (h11 over trio), and a config with webhooks.

Also what a test reads of a Redis store's outbox, straight from redis-server
(:func:`redis_command`, :func:`redis_outbox_size`).

Every request is recorded and checked as a receiver would check it: the
``standardwebhooks`` package verifies its signature with the secret. The
receiver answers from a script, one answer a request in order (a status,
``"hang"``: no answer until the client gives up, or ``"endless"``: 200 and a
chunked body that never ends, 64 KiB a millisecond, until the client closes
the connection), then 200 to everything.
"""

from __future__ import annotations

import json
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import h11
import trio
from standardwebhooks.webhooks import Webhook

from gateway.config import Config, load_config

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


@dataclass
class Received:
    headers: dict[str, str]
    body: bytes
    status: int | str  # what the receiver answered
    url_path: str = ""  # the request's target

    @property
    def event(self) -> dict[str, Any]:
        decoded: dict[str, Any] = json.loads(self.body)
        return decoded


@dataclass
class Receiver:
    """Records every POST; :attr:`accepted` are those it answered 2xx."""

    script: list[int | str] = field(default_factory=list)
    secret: str = SECRET
    received: list[Received] = field(default_factory=list)
    port: int = 0
    endless_sent: int = 0  # bytes of "endless" bodies sent, every one together
    endless_cut: trio.Event = field(default_factory=trio.Event)  # the client closed one
    _changed: trio.Event = field(default_factory=trio.Event)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hooks"

    @property
    def accepted(self) -> list[Received]:
        return [r for r in self.received if isinstance(r.status, int) and r.status < 300]

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(self.port, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        task_status.started()
        await trio.serve_listeners(self._connection, listeners)

    async def wait_accepted(self, count: int, seconds: float = 20) -> list[Received]:
        with trio.fail_after(seconds):
            while len(self.accepted) < count:
                await self._changed.wait()
        return self.accepted

    async def wait_received(self, count: int, seconds: float = 20) -> list[Received]:
        with trio.fail_after(seconds):
            while len(self.received) < count:
                await self._changed.wait()
        return self.received

    async def _connection(self, stream: trio.SocketStream) -> None:
        conn = h11.Connection(h11.SERVER)
        try:
            while True:
                request = await _next(conn, stream, h11.Request)
                if request is None:
                    return
                body = b""
                while True:
                    part = await _next(conn, stream, (h11.Data, h11.EndOfMessage))
                    if part is None:
                        return
                    if isinstance(part, h11.EndOfMessage):
                        break
                    body += part.data
                answer = self.script.pop(0) if self.script else 200
                headers = {k.decode().lower(): v.decode() for k, v in request.headers}
                if answer == 200:  # only what a receiver accepts must verify
                    Webhook(self.secret).verify(body, headers)
                self.received.append(Received(headers, body, answer, request.target.decode()))
                self._changed.set()
                self._changed = trio.Event()
                if answer == "hang":
                    await trio.sleep(60)  # the client gives up first
                    return
                if answer == "endless":
                    await self._endless(conn, stream)
                    return
                assert isinstance(answer, int)
                reply = h11.Response(status_code=answer, headers=[("content-length", "0")])
                await stream.send_all(conn.send(reply) + conn.send(h11.EndOfMessage()))
                conn.start_next_cycle()
        except (trio.BrokenResourceError, trio.ClosedResourceError, h11.ProtocolError):
            return
        finally:
            await stream.aclose()

    async def _endless(self, conn: h11.Connection, stream: trio.SocketStream) -> None:
        """200 with a chunked body that ends only when the client closes the connection."""
        head = h11.Response(status_code=200, headers=[("transfer-encoding", "chunked")])
        await stream.send_all(conn.send(head))
        chunk = conn.send(h11.Data(data=b"x" * 65536))
        try:
            while True:
                await stream.send_all(chunk)
                self.endless_sent += 65536
                await trio.sleep(0.001)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self.endless_cut.set()


async def _next(conn: h11.Connection, stream: trio.SocketStream, kind: Any) -> Any:
    while True:
        got = conn.next_event()
        if got is h11.NEED_DATA:
            data = await stream.receive_some(65536)
            conn.receive_data(data)
            continue
        if isinstance(got, kind):
            return got
        return None  # the connection closed (or a request we do not expect)


def webhook_toml(name: str, url: str, events: list[str], **keys: Any) -> str:
    """A ``[webhooks.NAME]`` table (the receiver's secret, fast retries unless overridden)."""
    table = {"secret": SECRET, "timeout_s": 2, "retry_first_s": 0.05, "retry_max_s": 0.2, **keys}
    lines = [f"[webhooks.{name}]", f"url = {json.dumps(url)}", f"events = {json.dumps(events)}"]
    lines += [f"{key} = {json.dumps(value)}" for key, value in table.items()]
    return "\n".join(lines) + "\n"


def config_with_webhooks(tmp_path: Path, tables: str, **overrides: Any) -> Config:
    """``tests.conftest.make_config``'s config, plus the ``tables`` (TOML) in a file."""
    path = tmp_path / "webhooks.toml"
    path.write_text(tables)
    flat = {
        "server.port": 0,
        "store.path": str(tmp_path / "gateway.db"),
        "sessions.workspace_root": str(tmp_path / "workspaces"),
        **overrides,
    }
    return load_config(str(path), {}, flat)


def redis_command(port: int, *args: str) -> Any:
    """One command to a redis-server on loopback (RESP over a socket): its answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        parts = [f"*{len(args)}\r\n".encode()]
        parts += [f"${len(a.encode())}\r\n{a}\r\n".encode() for a in args]
        s.sendall(b"".join(parts))
        return _reply(s.makefile("rb"))


def _reply(f: BinaryIO) -> Any:
    line = f.readline()
    kind, rest = line[:1], line[1:-2]
    if kind == b":":
        return int(rest)
    if kind == b"$":
        return None if int(rest) < 0 else f.read(int(rest) + 2)[:-2]
    if kind == b"*":
        return [_reply(f) for _ in range(int(rest))]
    if kind == b"+":
        return rest
    raise AssertionError(f"redis: {line!r}")


def redis_outbox_size(port: int, prefix: str = "gw:") -> int:
    """The deliveries in a Redis store's outbox (gateway.store.redis.outbox's keys)."""
    total = 0
    for lane in redis_command(port, "SMEMBERS", f"{prefix}oblanes"):
        hook, sid = lane.decode().split(":", 1)
        total += int(redis_command(port, "ZCARD", f"{prefix}ob:{hook}:{{{sid}}}"))
    return total

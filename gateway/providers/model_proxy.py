"""The model API behind a loopback door: a Claude Code CLI never holds the provider key.

docs/protocol.md §11, "The key": each session's CLI is given
``ANTHROPIC_BASE_URL`` pointing here (``http://127.0.0.1:<port>``, a listener
of its own, never the gateway's public one) and a credential of its own as
its ``ANTHROPIC_API_KEY``. This door:

- **checks the credential** (``x-api-key``, or ``Authorization: Bearer``):
  the SHA-256 of what is presented is looked up, then compared with
  :func:`hmac.compare_digest` (the lookup sees only a digest, which tells an
  attacker nothing of a token); a credential is revoked when its session's
  CLI ends (:meth:`ModelProxy.revoke`), and the calls it has in flight are
  cut then. Anything else is 401 ``authentication_error``, answered before
  the body is read;
- **takes only model calls**: ``POST /v1/messages`` and
  ``POST /v1/messages/count_tokens``, as origin-form targets (``/`` then the
  path, no ``//``, no dot segment, no percent-encoding, no backslash), with
  a query of plain ``name=value`` pairs (Claude Code's ``?beta=true``); any
  other target or method is 404 ``not_found_error``. A body past
  :data:`MAX_REQUEST_BYTES` is 413;
- **forwards** the request to the agent's ``base_url`` (else the provider's
  own, :data:`DEFAULT_UPSTREAM`; the path appended to the URL's own path,
  the host never taken from the request) with the real key as ``x-api-key`` (the
  credential and any ``Authorization`` removed, hop-by-hop headers and those
  ``Connection`` names dropped; a request framed both ways is 400),
  from the daemon, with the daemon's proxy settings as the native runtime's
  calls; and **streams the answer back as it comes**, byte for byte (no
  decoding, each chunk written when read). A CLI that hangs up cuts the
  upstream call; an upstream that cannot be reached is 502 ``api_error``;
  one that breaks mid-answer breaks the CLI's connection (a network error
  for the CLI, as it would have seen).

**No request reaches another.** A connection's failure of any kind ends that
connection only (logged, ``claude_code_proxy_connection_failed``), never
the listener nor the node; a connection must send its first request's head
within :data:`HEAD_TIMEOUT_S` and its body within :data:`BODY_TIMEOUT_S`,
and at most :data:`MAX_CONNECTIONS` are open at once (one more is closed
unanswered): a local process that opens connections and sends nothing
cannot hold the daemon's descriptors.

The listener is started on the first CLI that needs it, in the node's
``sessions`` nursery (:meth:`~ModelProxy.attach`,
:meth:`~ModelProxy.ensure_running`), and lives until the node stops; a node
with no Claude Code session opens no port. It listens on 127.0.0.1 only:
reaching it needs a credential, and a credential reaches only the model API,
only while its session's CLI lives.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field

import h11
import httpx
import trio

from gateway.logs import event

log = logging.getLogger("gateway.claude_code")

DEFAULT_UPSTREAM = "https://api.anthropic.com"
"""Where model calls go when the agent names no ``base_url``."""

MAX_REQUEST_BYTES = 64 * 1024 * 1024
"""The largest request body forwarded (the Messages API's own limit is 32 MB)."""

MAX_HEAD_BYTES = 64 * 1024
"""The largest request head read."""

IDLE_TIMEOUT_S = 600.0
"""How long a connection that was answered may wait for its next request (the CLI keeps it)."""

HEAD_TIMEOUT_S = 10.0
"""How long a new connection may take to send its first request's head."""

BODY_TIMEOUT_S = 120.0
"""How long a request's body may take to arrive, once its credential was checked."""

MAX_CONNECTIONS = 256
"""The most connections open at once (every CLI of the node shares them)."""

MODEL_PATHS = frozenset({"/v1/messages", "/v1/messages/count_tokens"})
"""The targets' paths this door forwards."""

_QUERY = re.compile(r"[A-Za-z0-9_.-]+=[A-Za-z0-9_.-]*(&[A-Za-z0-9_.-]+=[A-Za-z0-9_.-]*)*")

CREDENTIAL_PREFIX = "gwcc-"
"""What a session's credential starts with (so that one is told from a provider key)."""

TIMEOUT = httpx.Timeout(connect=30.0, read=600.0, write=600.0, pool=30.0)
"""The upstream call's bounds: a read waits as long as Claude Code's own ``API_TIMEOUT_MS``."""

_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    }
)
_CREDENTIALS = frozenset({"x-api-key", "authorization"})


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


def model_call(method: str, target: str) -> tuple[str, str] | None:
    """The path and query of a call this door forwards; None for any other (module docstring).

    Pure string checks, nothing parsed that could raise: a target is an
    origin-form path of :data:`MODEL_PATHS`, optionally ``?`` and plain
    ``name=value`` pairs.
    """
    if method != "POST":
        return None
    path, _, query = target.partition("?")
    if path not in MODEL_PATHS:
        return None
    if query and not _QUERY.fullmatch(query):
        return None
    return path, query


def upstream_url(upstream: str, path: str, query: str) -> httpx.URL:
    """Where a call goes: ``upstream``'s scheme, host and port, its path then ``path``."""
    base = httpx.URL(upstream)
    return base.copy_with(path=base.path.rstrip("/") + path, query=query.encode() or None)


@dataclass(eq=False)
class Grant:
    """One session's credential: whose it is, and where its calls go with which key."""

    session_id: str
    upstream: str
    key: str
    digest: bytes
    calls: set[trio.CancelScope] = field(default_factory=set)  # in flight: cut on revoke


class ModelProxy:
    """The loopback door of a node's Claude Code CLIs to the model API (module docstring)."""

    def __init__(self) -> None:
        self._grants: dict[bytes, Grant] = {}
        self._lock = trio.Lock()
        self._client: httpx.AsyncClient | None = None
        self._nursery: trio.Nursery | None = None
        self._open = 0  # connections open now (MAX_CONNECTIONS)
        self.base_url = ""  # http://127.0.0.1:<port> once running

    def attach(self, nursery: trio.Nursery) -> None:
        """Where the listener will run once needed: the node's ``sessions`` nursery."""
        self._nursery = nursery

    # --- credentials ---------------------------------------------------------------------

    def issue(self, session_id: str, upstream: str, key: str) -> str:
        """A new credential of ``session_id``, good until :meth:`revoke`."""
        token = CREDENTIAL_PREFIX + secrets.token_urlsafe(32)
        digest = _digest(token)
        self._grants[digest] = Grant(session_id, upstream or DEFAULT_UPSTREAM, key, digest)
        return token

    def revoke(self, token: str) -> None:
        """The credential's CLI ended: it is refused from now on, its calls in flight cut."""
        grant = self._grants.pop(_digest(token), None)
        if grant is not None:
            for scope in grant.calls:
                scope.cancel()

    def check(self, presented: str) -> Grant | None:
        """The grant of a presented credential, or None (module docstring: constant time)."""
        digest = _digest(presented)
        grant = self._grants.get(digest)
        if grant is None or not hmac.compare_digest(grant.digest, digest):
            return None
        return grant

    @property
    def live(self) -> int:
        """How many credentials are good now."""
        return len(self._grants)

    # --- the listener --------------------------------------------------------------------

    async def ensure_running(self) -> str:
        """Start the listener (in the :meth:`attach` ed nursery) if it is not running; its URL."""
        async with self._lock:
            if not self.base_url:
                if self._nursery is None:
                    raise RuntimeError("the model API door has no nursery: its node is not running")
                await self._nursery.start(self.run, name="claude-code-model-proxy")
            return self.base_url

    async def run(self, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
        """Listen on 127.0.0.1 until cancelled; ``task_status`` receives the base URL."""
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        port = listeners[0].socket.getsockname()[1]
        self._client = httpx.AsyncClient(timeout=TIMEOUT)
        self.base_url = f"http://127.0.0.1:{port}"
        try:
            event(
                log, logging.INFO, "claude_code_proxy_started",
                f"the model API door of Claude Code listens on 127.0.0.1:{port}", port=port,
            )  # fmt: skip
            task_status.started(self.base_url)
            await trio.serve_listeners(self._connection, listeners)
        finally:
            self.base_url = ""
            client, self._client = self._client, None
            with trio.CancelScope(shield=True):
                for listener in listeners:
                    await listener.aclose()
                await client.aclose()

    async def _connection(self, stream: trio.SocketStream) -> None:
        """Answer requests on one keep-alive connection until the CLI leaves.

        Whatever goes wrong ends this connection only (module docstring).
        """
        async with stream:
            if self._open >= MAX_CONNECTIONS:
                return
            self._open += 1
            try:
                await self._requests(stream)
            except (trio.BrokenResourceError, trio.ClosedResourceError, h11.ProtocolError):
                return  # the CLI hung up, or spoke something else: the connection ends
            except Exception as exc:
                event(
                    log, logging.ERROR, "claude_code_proxy_connection_failed",
                    f"a connection to the model API door failed: {exc!r}", error=repr(exc),
                )  # fmt: skip
            finally:
                self._open -= 1

    async def _requests(self, stream: trio.SocketStream) -> None:
        """The requests of one connection; the first within :data:`HEAD_TIMEOUT_S`."""
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD_BYTES)
        wait = HEAD_TIMEOUT_S
        while True:
            head: h11.Event | None = None
            with trio.move_on_after(wait):
                head = await _next_head(conn, stream)
            if not isinstance(head, h11.Request):
                return  # closed, or nothing came in time
            if not await self._answer(conn, stream, head):
                return
            if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                return
            conn.start_next_cycle()
            wait = IDLE_TIMEOUT_S  # answered: a CLI keeps its connection between calls

    async def _answer(
        self, conn: h11.Connection, stream: trio.SocketStream, head: h11.Request
    ) -> bool:
        """One request: refused, or forwarded; False when the connection must end."""
        method, target = head.method.decode(), head.target.decode("latin-1")
        headers = [(k.decode().lower(), v.decode("latin-1")) for k, v in head.headers]
        call = model_call(method, target)
        if call is None:
            await _error(conn, stream, 404, "not_found_error", "only model calls pass here")
            return False
        grant = self.check(_presented(headers))
        if grant is None:
            await _error(conn, stream, 401, "authentication_error", "invalid credential")
            return False
        names = {name for name, _ in headers}
        if "transfer-encoding" in names and "content-length" in names:
            await _error(conn, stream, 400, "invalid_request_error", "conflicting framing")
            return False
        body: bytes | None = None
        with trio.move_on_after(BODY_TIMEOUT_S) as reading:
            body = await _read_body(conn, stream)
        if reading.cancelled_caught:
            return False  # the body did not come: the connection ends
        if body is None:
            await _error(conn, stream, 413, "request_too_large", "the request is too large")
            return False
        return await self._call(conn, stream, grant, call, method, headers, body)

    async def _call(
        self,
        conn: h11.Connection,
        stream: trio.SocketStream,
        grant: Grant,
        call: tuple[str, str],
        method: str,
        headers: list[tuple[str, str]],
        body: bytes,
    ) -> bool:
        """The checked call, forwarded under the grant's scope (cut when it is revoked)."""
        done = False  # stays so when the call is cut: revoked, or the CLI hung up
        cut = trio.Event()  # the watcher cut the call: what it read is not the connection's
        with trio.CancelScope() as scope:
            grant.calls.add(scope)
            try:
                async with trio.open_nursery() as nursery:
                    watch = trio.CancelScope()  # cancelled as the answer's end is sent
                    nursery.start_soon(
                        _watch_hangup, conn, stream, nursery.cancel_scope, watch, cut
                    )
                    url = upstream_url(grant.upstream, *call)
                    done = await self._forward(
                        conn, stream, grant, method, url, headers, body, watch.cancel
                    )
                    nursery.cancel_scope.cancel()
            finally:
                grant.calls.discard(scope)
        return done and not cut.is_set()

    async def _forward(
        self,
        conn: h11.Connection,
        stream: trio.SocketStream,
        grant: Grant,
        method: str,
        url: httpx.URL,
        headers: list[tuple[str, str]],
        body: bytes,
        answered: Callable[[], None],
    ) -> bool:
        """The call, upstream with the real key; its answer streamed back as it comes.

        ``answered`` is called just before the answer's end is sent: the CLI may send
        its next request on the connection as soon as it has that end, and that one is
        the connection's to read, not the hangup watcher's (:func:`_watch_hangup`).
        """
        client = self._client
        assert client is not None
        named = {  # the headers Connection names are this hop's too (RFC 9110 §7.6.1)
            token.strip().lower()
            for name, value in headers
            if name == "connection"
            for token in value.split(",")
        }
        dropped = _HOP_BY_HOP | _CREDENTIALS | named
        sent = [(k, v) for k, v in headers if k not in dropped]
        sent.append(("x-api-key", grant.key))
        request = client.build_request(method, url, headers=sent, content=body)
        try:
            response = await client.send(request, stream=True)
        except httpx.HTTPError as exc:
            event(
                log, logging.WARNING, "claude_code_proxy_upstream_failed",
                f"session {grant.session_id}: the model API could not be reached: {exc!r}",
                session_id=grant.session_id, error=repr(exc),
            )  # fmt: skip
            await _error(conn, stream, 502, "api_error", "the model API could not be reached")
            return False
        try:
            back = [
                (k, v) for k, v in response.headers.raw if k.decode().lower() not in _HOP_BY_HOP
            ]
            await _send(conn, stream, h11.Response(status_code=response.status_code, headers=back))
            async for chunk in response.aiter_raw():
                await _send(conn, stream, h11.Data(data=chunk))
            answered()
            await _send(conn, stream, h11.EndOfMessage())
            return True
        except httpx.HTTPError:
            return False  # broken mid-answer: the CLI sees its connection break
        finally:
            with trio.CancelScope(shield=True):
                await response.aclose()


def _presented(headers: list[tuple[str, str]]) -> str:
    """The credential a request carries: ``x-api-key``, else a Bearer ``Authorization``."""
    for name, value in headers:
        if name == "x-api-key":
            return value
    for name, value in headers:
        if name == "authorization" and value[:7].lower() == "bearer ":
            return value[7:].strip()
    return ""


async def _next_head(conn: h11.Connection, stream: trio.SocketStream) -> h11.Event:
    """The next request's head, or ``ConnectionClosed`` once the CLI has gone."""
    while True:
        event_ = conn.next_event()
        if event_ is h11.NEED_DATA:
            conn.receive_data(await stream.receive_some(65536))
            continue
        if event_ is h11.PAUSED:
            return h11.ConnectionClosed()
        assert isinstance(event_, h11.Event)
        return event_


async def _read_body(conn: h11.Connection, stream: trio.SocketStream) -> bytes | None:
    """The request's whole body; None past :data:`MAX_REQUEST_BYTES`."""
    body = bytearray()
    while True:
        event_ = conn.next_event()
        if event_ is h11.NEED_DATA:
            conn.receive_data(await stream.receive_some(65536))
        elif isinstance(event_, h11.Data):
            body += event_.data
            if len(body) > MAX_REQUEST_BYTES:
                return None
        elif isinstance(event_, h11.EndOfMessage):
            return bytes(body)
        else:
            raise trio.BrokenResourceError("the request ended early")


async def _watch_hangup(
    conn: h11.Connection,
    stream: trio.SocketStream,
    scope: trio.CancelScope,
    watch: trio.CancelScope,
    cut: trio.Event,
) -> None:
    """While a call is forwarded: the CLI hanging up cuts it.

    What it sends meanwhile (its next request, pipelined) is kept, up to
    :data:`MAX_HEAD_BYTES`; past that the call and the connection end: the
    door never buffers without a bound. The watch ends (``watch`` is
    cancelled) before the answer's end is sent: a request sent once the
    answer is whole, however large, is the connection's to read, never cut
    nor dropped. A cut (``cut`` set) always ends the connection, even when
    the answer went out whole meanwhile: what the watcher read past the
    bound is not kept, so the connection cannot go on reading after it.
    """
    kept = 0
    with watch:
        while True:
            try:
                data = await stream.receive_some(65536)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                data = b""
            kept += len(data)
            if not data or kept > MAX_HEAD_BYTES:
                cut.set()
                scope.cancel()
                return
            conn.receive_data(data)


async def _error(
    conn: h11.Connection, stream: trio.SocketStream, status: int, kind: str, message: str
) -> None:
    """An answer in the Messages API's error shape; the connection then closes."""
    body = json.dumps({"type": "error", "error": {"type": kind, "message": message}}).encode()
    headers = [
        ("content-type", "application/json"),
        ("content-length", str(len(body))),
        ("connection", "close"),
    ]
    await _send(conn, stream, h11.Response(status_code=status, headers=headers))
    await _send(conn, stream, h11.Data(data=body))
    await _send(conn, stream, h11.EndOfMessage())


async def _send(conn: h11.Connection, stream: trio.SocketStream, event_: h11.Event) -> None:
    data = conn.send(event_)
    if data:
        await stream.send_all(data)

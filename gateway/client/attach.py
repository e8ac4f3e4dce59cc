"""``gateway attach``: the reference terminal client of a session stream.

It does what PROTOCOL section 3 asks of every client: fetch a single-use
attach token, subscribe with a filter, print every frame as one JSON line on
stdout, answer the server's pings, and, when the connection ends for a reason
that may pass (a close that says "reconnect": 1001 shutdown or heartbeat,
1008 too slow, 1011; a connection lost without a close frame; the daemon
restarting), fetch a fresh token and resume with ``since`` = the last event id
it printed, so nothing is lost and nothing is printed twice. Everything else
it has to say is one line on stderr, never a traceback.

Where the contract leaves the client to decide:

- **Backoff.** Reconnect attempt *n* waits :func:`backoff_delay`: up to
  ``base_s * 2**(n-1)``, capped at ``cap_s``, of which the upper half is
  random (so clients dropped together by a restart do not come back in
  step). An attempt that *made progress* (printed an event, or stayed
  subscribed ``stable_s``) starts the count again; ``max_reconnects``
  attempts in a row without progress, and attach gives up (exit 1).
- **What retrying cannot fix** ends attach at once, with one line: an unknown
  session (404, ``session_not_found``), a refused API key (401, 403), a
  subscribe the server refuses (``invalid_filter``, ``invalid_request``, an
  ``error`` frame), a close that says not to reconnect (1009), and, on the
  very first connection, a server that cannot be reached (a wrong URL).
  After attach was connected once, an unreachable server is the daemon
  restarting, and is retried.
- **A cursor the server no longer has** (``cursor_expired``, and
  ``replay_too_large``) falls back to a snapshot on the same connection: the
  state is whole again, only the events in between are not printed one by one.
- **No cursor yet.** A reconnect before any event was printed asks for a
  snapshot, so nothing that happened meanwhile is lost; after a snapshot the
  cursor is its ``snapshot_at_event_id``.
- **A peer that vanishes** (no close, no RST) is found by attach's own
  keepalive: after ``keepalive_s`` with no frame it sends ``ping``, and after
  as long again with still nothing, it drops the connection and reconnects.
- **Exit status**: 0 the server closed the stream normally (1000), or the
  reader of stdout went away (``| head``); 1 a failure (above); 2 a usage
  error (a filter that is not JSON, or that the server refuses); 130
  interrupted (Ctrl-C: one line, no traceback).
"""

from __future__ import annotations

import json
import os
import random
import secrets
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, TextIO

import httpx
import trio
from trio_websocket import (
    ConnectionClosed,
    ConnectionRejected,
    HandshakeError,
    WebSocketConnection,
    open_websocket_url,
)

from gateway.errors import FrameRejected
from gateway.protocol.closes import CLOSES
from gateway.protocol.frames import (
    ErrorFrame,
    EventFrame,
    Ping,
    Pong,
    Snapshot,
    SubscribeAck,
    SubscribeError,
    encode,
)

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report it

RESUMABLE = {name for name, close in CLOSES.items() if close.reconnect}
# Close codes that say "try again" when the reason names no code of CLOSES:
# going away, closed without a close frame, internal error, restart, try later.
_RESUMABLE_WS_CODES = frozenset({1001, 1006, 1011, 1012, 1013, 1014})
# subscribe_error codes a snapshot answers: the server has the state, not the replay.
_SNAPSHOT_INSTEAD = frozenset({"cursor_expired", "replay_too_large"})
_USAGE_ERRORS = frozenset({"invalid_filter", "invalid_request"})
MAX_FRAME_BYTES = 64 * 2**20  # a snapshot of 50 long messages is well over 1 MiB
CLOSE_TIMEOUT_S = 2.0  # for the close handshake of a connection attach is done with


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


# --- when to reconnect ------------------------------------------------------------


def backoff_delay(attempt: int, rand: float, *, base_s: float, cap_s: float) -> float:
    """The wait before reconnect attempt ``attempt`` (1 for the first after a drop).

    Exponential with a cap and "equal jitter": the ceiling is
    ``min(cap_s, base_s * 2**(attempt - 1))`` and the wait is uniform in its
    upper half, so it is never shorter than half the ceiling (no reconnect
    storm at once) and clients dropped together spread out.

    Args:
        attempt: 1, 2, ... (any size: the exponent saturates at the cap).
        rand: a number in [0, 1), e.g. ``random.random()``.
        base_s: the ceiling of the first attempt, in seconds.
        cap_s: the largest ceiling, in seconds.

    Returns:
        Seconds to wait, in ``[ceiling / 2, ceiling)``.

    Raises:
        ValueError: ``attempt`` < 1, ``rand`` outside [0, 1), or a negative time.
    """
    if attempt < 1 or not 0.0 <= rand < 1.0 or base_s < 0 or cap_s < 0:
        raise ValueError(f"backoff_delay({attempt}, {rand}, {base_s}, {cap_s})")
    ceiling = min(cap_s, base_s * 2.0 ** min(attempt - 1, 1000))  # 2.0**1024 overflows
    return ceiling * (0.5 + 0.5 * rand)


@dataclass(frozen=True)
class Backoff:
    """The reconnect policy (module docstring): :func:`backoff_delay`'s ``base_s``
    and ``cap_s``, and how long a subscription must last to count as progress."""

    base_s: float = 0.5
    cap_s: float = 30.0
    stable_s: float = 10.0

    def delay(self, attempt: int, rand: float) -> float:
        return backoff_delay(attempt, rand, base_s=self.base_s, cap_s=self.cap_s)


@dataclass(frozen=True)
class Ended:
    """How one connection attempt ended.

    ``status`` is the exit status when attach must stop, ``None`` when a later
    attempt may succeed; ``why`` is the line to print; ``progressed`` says the
    attempt got somewhere (module docstring), so the backoff starts again.
    """

    status: int | None
    why: str
    progressed: bool = False


async def reconnecting(
    connect: Callable[[], Awaitable[Ended]],
    *,
    backoff: Backoff,
    max_reconnects: int,
    say: Callable[[str], None],
    rand: Callable[[], float] = random.random,
) -> int:
    """Run ``connect`` until it ends for good, waiting out the backoff in between.

    Args:
        connect: one connection attempt, from fetching a token to the close.
        backoff: the delays.
        max_reconnects: attempts in a row without progress before giving up.
        say: prints one line on stderr.
        rand: the jitter's source of numbers in [0, 1).

    Returns:
        The exit status.
    """
    failures = 0  # attempts in a row that made no progress
    while True:
        ended = await connect()
        if ended.status is not None:
            if ended.why:
                say(ended.why)
            return ended.status
        failures = 0 if ended.progressed else failures + 1
        if failures > max_reconnects:
            say(f"{ended.why}; giving up after {max_reconnects} reconnects")
            return EXIT_FAILED
        delay = backoff.delay(failures + 1, rand())
        say(f"{ended.why}; reconnecting in {delay:.1f} s")
        await trio.sleep(delay)


# --- one connection ------------------------------------------------------------------


class _Attach:
    """The state that outlives a connection: the cursor, and whether one ever worked."""

    def __init__(
        self,
        http: httpx.AsyncClient,
        session_id: str,
        filter: Any,
        since: str | None,
        snapshot: bool,
        out: TextIO,
        say: Callable[[str], None],
        backoff: Backoff,
        keepalive_s: float,
    ) -> None:
        self.http = http
        self.session_id = session_id
        self.filter = filter
        self.cursor = since
        self.snapshot = snapshot
        self.out = out
        self.say = say
        self.backoff = backoff
        self.keepalive_s = keepalive_s
        self.reached = False  # the server answered once: unreachable now means restarting

    async def connect(self) -> Ended:
        """One attempt: a token, the WebSocket, the subscribe, the stream until it ends."""
        url = await self._ws_url()
        if isinstance(url, Ended):
            return url
        if not url.startswith(("ws://", "wss://")):
            return Ended(EXIT_FAILED, f"the gateway gave a ws_url that is not ws(s)://: {url}")
        ended: Ended | None = None
        try:
            async with open_websocket(
                url, max_message_size=MAX_FRAME_BYTES, disconnect_timeout=CLOSE_TIMEOUT_S
            ) as ws:
                ended = await self._stream(ws)
        except ConnectionRejected as exc:
            return _rejected_handshake(exc)
        except HandshakeError as exc:  # a network error or a timeout, opening or closing
            if ended is None:
                return Ended(None, f"the stream did not open: {_describe(exc)}")
        return ended

    async def _ws_url(self) -> str | Ended:
        """``GET /sessions/{id}``: a fresh attach token in ``ws_url`` (PROTOCOL section 2)."""
        try:
            r = await self.http.get(f"/sessions/{self.session_id}")
        except httpx.TransportError as exc:
            why = f"cannot reach {self.http.base_url}: {_describe(exc)}"
            return Ended(None if self.reached else EXIT_FAILED, why)
        self.reached = True
        if r.status_code >= 500:
            return Ended(None, f"the gateway answered {_http_error(r)}")
        if r.status_code != 200:
            if r.status_code == 404:
                return Ended(EXIT_FAILED, f"session {self.session_id} not found ({_http_error(r)})")
            hint = " (pass --api-key)" if r.status_code in (401, 403) else ""
            return Ended(EXIT_FAILED, f"the gateway refused: {_http_error(r)}{hint}")
        try:
            return str(r.json()["ws_url"])
        except (ValueError, KeyError, TypeError):
            return Ended(EXIT_FAILED, f"{self.http.base_url} is not a gateway: {r.text[:200]!r}")

    def _subscribe(self) -> str:
        return json.dumps(
            {
                "type": "subscribe",
                "filter": self.filter,
                "since": self.cursor,
                "snapshot": self.snapshot,
            }
        )

    async def _stream(self, ws: WebSocketConnection) -> Ended:
        """Subscribe, print every frame, answer pings, until the connection ends."""
        subscribed_at: float | None = None
        printed_event = False
        pinged = False

        def progressed() -> bool:
            lasted = subscribed_at is not None and (
                trio.current_time() - subscribed_at >= self.backoff.stable_s
            )
            return printed_event or lasted

        try:
            await ws.send_message(self._subscribe())
        except ConnectionClosed as closed:
            return _closed(closed, False)
        while True:
            try:
                with trio.move_on_after(self.keepalive_s) as idle:
                    raw = await ws.get_message()
                if idle.cancelled_caught:
                    if pinged:
                        why = f"no frame from the gateway in {2 * self.keepalive_s:g} s"
                        await trio.aclose_forcefully(ws._stream)
                        return Ended(None, why, progressed())
                    await ws.send_message(encode(Ping(secrets.token_hex(8))).decode())
                    pinged = True
                    continue
                pinged = False
                text = raw if isinstance(raw, str) else raw.decode(errors="replace")
                print(text, file=self.out, flush=True)
                frame = _decode(text)
                if isinstance(frame, Ping):
                    await ws.send_message(encode(Pong(frame.nonce)).decode())
                elif isinstance(frame, EventFrame):
                    self.cursor = frame.event.id
                    self.snapshot = False
                    printed_event = True
                elif isinstance(frame, Snapshot):
                    if frame.snapshot_at_event_id is not None:
                        self.cursor = frame.snapshot_at_event_id
                        self.snapshot = False
                elif isinstance(frame, SubscribeAck):
                    subscribed_at = trio.current_time()
                    # Until the first event, a reconnect takes a snapshot: nothing is lost.
                    self.snapshot = self.snapshot or self.cursor is None
                elif isinstance(frame, SubscribeError):
                    if frame.code not in _SNAPSHOT_INSTEAD:
                        status = EXIT_USAGE if frame.code in _USAGE_ERRORS else EXIT_FAILED
                        return Ended(status, f"subscribe refused: {frame.code}: {frame.message}")
                    self.say(f"{frame.code} (since {self.cursor}); starting from a snapshot")
                    self.cursor, self.snapshot = None, True
                    await ws.send_message(self._subscribe())
                elif isinstance(frame, ErrorFrame) and subscribed_at is None:
                    return Ended(EXIT_USAGE, f"subscribe refused: {frame.code}: {frame.message}")
            except ConnectionClosed as closed:
                return _closed(closed, progressed())


def _decode(text: str) -> object:
    """The frame; a frame this client cannot read is printed and otherwise skipped,
    except a ``subscribe_error`` of a code it does not know, which still ends attach."""
    from gateway.client.codec import decode_server_frame

    try:
        return decode_server_frame(text)
    except FrameRejected:
        try:
            loose = json.loads(text)
        except ValueError:
            return None
        if isinstance(loose, dict) and loose.get("type") == "subscribe_error":
            return ErrorFrame(str(loose.get("code")), str(loose.get("message")))
        return None


def _closed(closed: ConnectionClosed, progressed: bool) -> Ended:
    """A close frame (or its absence, 1006) as an end: reconnect, or stop with a status."""
    code = closed.reason.code if closed.reason else 1006
    name = _close_code(closed.reason.reason if closed.reason else None)
    why = f"closed {code}" + (f" {name}" if name else "")
    if code == 1000:
        return Ended(EXIT_OK, why)
    reconnect = name in RESUMABLE if name in CLOSES else code in _RESUMABLE_WS_CODES
    return Ended(None if reconnect else EXIT_FAILED, why, progressed)


def _close_code(reason: str | None) -> str:
    try:
        decoded = json.loads(reason or "{}")
    except ValueError:
        return ""
    return str(decoded.get("code", "")) if isinstance(decoded, dict) else ""


def _rejected_handshake(exc: ConnectionRejected) -> Ended:
    """A WebSocket handshake refused with an HTTP status (PROTOCOL section 2)."""
    try:
        code = str(json.loads(exc.body or b"{}")["error"]["code"])
    except (ValueError, KeyError, TypeError):
        code = ""
    why = f"the stream was refused: {exc.status_code} {code}".rstrip()
    if exc.status_code >= 500 or code.startswith("attach_token"):
        return Ended(None, why)  # the daemon is busy, or the token raced its TTL: a fresh one
    return Ended(EXIT_FAILED, why)


def _http_error(r: httpx.Response) -> str:
    try:
        error = r.json()["error"]
        return f"{r.status_code} {error['code']}: {error['message']}"
    except (ValueError, KeyError, TypeError):
        return f"{r.status_code} {r.reason_phrase}"


def _describe(exc: BaseException) -> str:
    """An I/O error in a few words (the cause of a trio-websocket wrapper, if any)."""
    while not str(exc) and exc.__cause__ is not None:
        exc = exc.__cause__
    return str(exc) or type(exc).__name__


# --- the command -----------------------------------------------------------------------


async def attach(
    base_url: str,
    session_id: str,
    *,
    filter: Any = "preset:chat",
    since: str | None = None,
    snapshot: bool = False,
    api_key: str | None = None,
    out: TextIO | None = None,
    err: TextIO | None = None,
    max_reconnects: int = 10,
    backoff: Backoff | None = None,
    keepalive_s: float = 30.0,
) -> int:
    """Print the session's stream until it ends for good (module docstring).

    Args:
        base_url: the gateway's ``http://HOST:PORT``.
        session_id: the session to attach to.
        filter: a preset name or a Filter as a dict (PROTOCOL section 3).
        since: resume after this event id.
        snapshot: start with a snapshot.
        api_key: the Bearer key, when the gateway has ``api_keys``.
        out: where frames go, one JSON line each (stdout).
        err: where the one-line reports go (stderr).
        max_reconnects: attempts in a row without progress before giving up.
        backoff: the reconnect delays.
        keepalive_s: silence before attach pings, and again before it reconnects.

    Returns:
        The exit status (module docstring).
    """
    errors = err if err is not None else sys.stderr

    def say(line: str) -> None:
        print(f"attach: {line}", file=errors, flush=True)

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        http = httpx.AsyncClient(base_url=base_url, headers=headers)
    except httpx.InvalidURL as exc:
        say(f"--url {base_url!r} is not a URL: {exc}")
        return EXIT_USAGE
    async with http:
        client = _Attach(
            http,
            session_id,
            filter,
            since,
            snapshot,
            out if out is not None else sys.stdout,
            say,
            backoff or Backoff(),
            keepalive_s,
        )
        return await reconnecting(
            client.connect, backoff=client.backoff, max_reconnects=max_reconnects, say=say
        )


def run(args: Any) -> int:
    """``gateway attach`` (the ``attach`` arguments of :mod:`gateway.cli`); the exit status."""
    filter_: Any = args.filter
    if filter_.startswith("{"):
        try:
            filter_ = json.loads(filter_)
        except ValueError as exc:
            print(f"attach: --filter is not JSON: {exc}", file=sys.stderr)
            return EXIT_USAGE
    interrupted = False

    async def main() -> int:
        nonlocal interrupted
        status = EXIT_INTERRUPTED
        with trio.open_signal_receiver(signal.SIGINT) as signals:
            async with trio.open_nursery() as nursery:

                async def on_interrupt() -> None:
                    nonlocal interrupted
                    async for _ in signals:
                        interrupted = True
                        nursery.cancel_scope.cancel()

                nursery.start_soon(on_interrupt, name="sigint")
                status = await attach(
                    args.url,
                    args.session_id,
                    filter=filter_,
                    since=args.since,
                    snapshot=args.snapshot,
                    api_key=args.api_key,
                )
                nursery.cancel_scope.cancel()
        return status

    status = EXIT_INTERRUPTED
    try:
        status = trio.run(main)
    except* KeyboardInterrupt:  # before the signal receiver was in place
        interrupted = True
    except* BrokenPipeError:  # the reader went away (``gateway attach ... | head``)
        # Nothing to say, and nobody to say it to: stdout is pointed at /dev/null
        # so that the interpreter's last flush does not report the pipe either.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        status = EXIT_OK
    if interrupted:
        print("attach: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    return status

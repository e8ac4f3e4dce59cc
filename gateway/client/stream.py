"""One session's stream that survives everything the server does (docs/protocol.md §2, §3).

A :class:`Subscription` is an async iterator of what arrives: every server
frame as :class:`Received` (its text and its decoded struct) and, between
them, a :class:`Notice` for each thing a person watching would want to know
(a drop and the wait before the next attempt, a fall back to a snapshot, the
end). Behind it one Trio task owns the connection and does what section 3
asks of a client, and decides what the contract leaves to the client:

- **Resume.** When the connection ends for a reason that may pass (a close
  whose :data:`~gateway.protocol.closes.CLOSES` row says *reconnect*: 1001
  shutdown or heartbeat, 1008 ``client_too_slow`` or ``subscribe_timeout``,
  1011; a connection lost without a close frame; the daemon restarting), it
  fetches a fresh single-use attach token (``GET /sessions/{id}``, section 2)
  and subscribes again with ``since`` = the id of the last event it received,
  so nothing is lost and, since events at or below the cursor are dropped
  (counted in :attr:`Subscription.duplicates_dropped`), nothing arrives twice.
- **Backoff.** Attempt *n* waits :func:`backoff_delay`: up to
  ``base_s * 2**(n-1)``, capped at ``cap_s``, the upper half of it random
  (clients dropped together by a restart do not come back in step). An
  attempt that *made progress* (delivered an event, or stayed subscribed
  ``stable_s``) starts the count again; ``max_reconnects`` attempts in a row
  without progress, and the subscription gives up
  (:class:`~gateway.errors.ClientError` ``gave_up``).
- **A cursor the server no longer has** (``cursor_expired``, and
  ``replay_too_large``) falls back to a snapshot on the same connection: the
  state is whole again, only the events in between are not delivered one by
  one. Before any event was received, a reconnect asks for a snapshot, so
  nothing that happened meanwhile is lost; after a snapshot the cursor is its
  ``snapshot_at_event_id``.
- **Heartbeat.** The server's ``ping`` frames are answered with ``pong``. A
  dead server (a path that stops carrying bytes: no close, no FIN, no RST) is
  noticed by the client's own pings: after :attr:`Heartbeat.interval_s`
  without a frame it sends ``ping``; each further interval without any frame
  is a missed pong, and after :attr:`Heartbeat.max_missed` of them the
  connection is dropped and the stream resumes as after any drop. Any frame
  proves the server alive (a pong can queue behind events on a busy server).
- **What retrying cannot fix** ends the iteration with one error of the
  family in :mod:`gateway.errors`, raised by ``__anext__``: an HTTP refusal
  (:class:`~gateway.errors.ApiError`: 404 unknown session, 401/403 key), a
  subscribe the server refuses (:class:`~gateway.errors.SubscribeRejected`:
  ``invalid_filter``, ``invalid_request``, ``session_not_found``), an
  ``error`` frame before the subscription was acknowledged
  (:class:`~gateway.errors.FrameRejected`), a close that says not to
  reconnect (1009) or a handshake refused for good, a gateway that cannot be
  reached at the very first attempt (a wrong URL) (those three are
  :class:`~gateway.errors.ClientError`). Once the gateway answered, an
  unreachable gateway is a restart, and is retried.
- **A normal close** (1000) ends the iteration after a last :class:`Notice`.
  A 1000 ``session_deleted`` (``DELETE /sessions/{id}``, docs/protocol.md §13)
  ends it with :class:`~gateway.errors.ClientError` ``session_deleted``, after
  the events sent before it (its ``turn.cancelled``): never reconnected, and
  told apart from a normal end.

- **No WebSocket.** A handshake refused by something that is not the
  gateway (a proxy's 4xx or 5xx page), or by the gateway for an upgrade that
  lost its headers on the way (426 ``upgrade_required``), makes the
  subscription read the same frames as server-sent events
  (``GET /sessions/{id}/events``, docs/doors/sse.md;
  :mod:`gateway.client.sse`) from then on, after one :class:`Notice`: the
  same items, cursor, resume and errors; the server's ``: ping`` comments
  are the heartbeat there (no pings of the client's own).

The feeding task hands items over a bounded channel: a consumer that stops
reading stops the task reading the socket, the server's bound fills, and the
server closes with 1008 ``client_too_slow``; the stream comes back with
replay when the consumer reads again (section 3, "Backpressure").
"""

from __future__ import annotations

import inspect
import json
import random
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import trio
from trio_websocket import (
    ConnectionClosed,
    ConnectionRejected,
    HandshakeError,
    WebSocketConnection,
    open_websocket_url,
)

from gateway.client import sse
from gateway.errors import (
    ApiError,
    ClientError,
    FrameRejected,
    GatewayError,
    SubscribeRejected,
)
from gateway.protocol.closes import CLOSES
from gateway.protocol.frames import (
    ErrorFrame,
    EventFrame,
    Ping,
    Pong,
    ServerFrame,
    Snapshot,
    SubscribeAck,
    SubscribeError,
    encode,
)

GAVE_UP = 1  # what :func:`reconnecting` returns when it gives up
RESUMABLE = frozenset(name for name, close in CLOSES.items() if close.reconnect)
# Close codes that say "try again" when the reason names no code of CLOSES:
# going away, closed without a close frame, internal error, restart, try later.
_RESUMABLE_WS_CODES = frozenset({1001, 1006, 1011, 1012, 1013, 1014})
# subscribe_error codes a snapshot answers: the server has the state, not the replay.
SNAPSHOT_INSTEAD = frozenset({"cursor_expired", "replay_too_large"})
# The largest frame the client takes (trio-websocket's own default, 1 MiB, is far
# too small: a message.complete carries a whole reply). A snapshot or a replay's
# message.snapshot never exceeds the server's [stream] snapshot_max_bytes
# (docs/protocol.md §15; 8 MiB by default), so with any cap up to this one they
# always fit; live events carry whole messages and tool results, as produced.
MAX_FRAME_BYTES = 64 * 2**20
CLOSE_TIMEOUT_S = 2.0  # for the close handshake of a connection the client is done with
CONNECT_TIMEOUT_S = 10.0  # TCP connect and WebSocket handshake

WebSocketConnector = Callable[[str], AbstractAsyncContextManager[WebSocketConnection]]


# --- what a subscription delivers ---------------------------------------------------------


@dataclass(frozen=True)
class Received:
    """One server frame: its text as received, and the frame decoded.

    ``frame`` is ``None`` for a frame this client cannot decode (a newer
    server's frame type): it is delivered, for a client that prints frames,
    and otherwise skipped. An event of a type this client does not know is
    decoded with its payload as a plain ``dict`` (docs/protocol.md §4).
    """

    raw: str
    frame: ServerFrame | None


@dataclass(frozen=True)
class Notice:
    """A line for a person watching: a drop and the wait before the next attempt,
    a fall back to a snapshot, a normal close. The stream goes on after it (or ends).

    ``connected`` says whether the stream is still subscribed after it: false
    from a drop until the next ``subscribe_ack``.
    """

    message: str
    connected: bool = False


Item = Received | Notice


# --- when to reconnect ---------------------------------------------------------------------


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
class Heartbeat:
    """The client's own liveness check (module docstring): a ``ping`` after
    ``interval_s`` without a frame, and the connection dropped after
    ``max_missed`` further intervals without one, ``interval_s * (max_missed + 1)``
    after the last frame in all. Keep the total under the server's
    ``ping_interval_s``-based close (120 s by default) only if you need to
    notice a dead server sooner than it would notice you."""

    interval_s: float = 15.0
    max_missed: int = 2

    def __post_init__(self) -> None:
        if self.interval_s <= 0 or self.max_missed < 1:
            raise ValueError(f"{self}: interval_s must be > 0 and max_missed >= 1")

    @property
    def dead_after_s(self) -> float:
        """Silence after which the server is taken for dead."""
        return self.interval_s * (self.max_missed + 1)


@dataclass(frozen=True)
class Ended:
    """How one connection attempt ended.

    ``status`` is set when the attempt ended for good (a value the caller
    gives it meaning: :class:`Subscription` uses 0 for a normal close, ``gateway
    attach`` its exit statuses), ``None`` when a later attempt may succeed;
    ``why`` is the line to say; ``progressed`` says the attempt got somewhere
    (module docstring), so the backoff starts again.
    """

    status: int | None
    why: str
    progressed: bool = False


async def reconnecting(
    connect: Callable[[], Awaitable[Ended]],
    *,
    backoff: Backoff,
    max_reconnects: int,
    say: Callable[[str], object],
    rand: Callable[[], float] = random.random,
) -> int:
    """Run ``connect`` until it ends for good, waiting out the backoff in between.

    Errors ``connect`` raises pass through: they are ends for good too.

    Args:
        connect: one connection attempt, from fetching a token to the close.
        backoff: the delays.
        max_reconnects: attempts in a row without progress before giving up.
        say: takes one line for a person (a drop and the wait, the end); if it
            returns an awaitable, that is awaited before going on.
        rand: the jitter's source of numbers in [0, 1).

    Returns:
        The ``status`` of the attempt that ended for good, or :data:`GAVE_UP`
        after ``max_reconnects`` attempts in a row without progress.
    """

    async def tell(line: str) -> None:
        told = say(line)
        if inspect.isawaitable(told):
            await told

    failures = 0  # attempts in a row that made no progress
    while True:
        ended = await connect()
        if ended.status is not None:
            if ended.why:
                await tell(ended.why)
            return ended.status
        failures = 0 if ended.progressed else failures + 1
        if failures > max_reconnects:
            await tell(f"{ended.why}; giving up after {max_reconnects} reconnects")
            return GAVE_UP
        delay = backoff.delay(failures + 1, rand())
        await tell(f"{ended.why}; reconnecting in {delay:.1f} s")
        await trio.sleep(delay)


# --- the WebSocket ---------------------------------------------------------------------------


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
            await _drop(opened)


def default_connector(url: str) -> AbstractAsyncContextManager[WebSocketConnection]:
    """The stream's WebSocket: frames up to :data:`MAX_FRAME_BYTES`, short timeouts."""
    return open_websocket(
        url,
        max_message_size=MAX_FRAME_BYTES,
        connect_timeout=CONNECT_TIMEOUT_S,
        disconnect_timeout=CLOSE_TIMEOUT_S,
    )


async def _drop(ws: WebSocketConnection) -> None:
    """Close the TCP stream under ``ws`` at once (trio-websocket keeps it as ``_stream``)."""
    await trio.aclose_forcefully(ws._stream)


# --- the subscription ------------------------------------------------------------------------


@dataclass(frozen=True)
class _Failed:
    """The end of the stream for good: ``__anext__`` raises it."""

    error: GatewayError


class Subscription:
    """A session's stream that resumes after every drop (module docstring).

    Made by :meth:`gateway.client.GatewayClient.subscribe`, which runs its
    feeding task; iterate it for :class:`Received` and :class:`Notice` items.

    Attributes:
        cursor: the id of the last event received (``since`` of the next
            resume), or ``None``.
        duplicates_dropped: events at or below the cursor, dropped (the server
            promises none; this counts what it would take to prove it).
        connections: how many connections were subscribed so far.
        transport: ``"websocket"``, or ``"sse"`` once a WebSocket upgrade was
            refused on the way (module docstring, "No WebSocket").
    """

    def __init__(
        self,
        http: httpx.AsyncClient,
        session_id: str,
        *,
        filter: Any = "preset:full",
        since: str | None = None,
        snapshot: bool = False,
        coalesce_ms: int | None = None,
        backoff: Backoff | None = None,
        heartbeat: Heartbeat | None = None,
        max_reconnects: int = 10,
        connector: WebSocketConnector = default_connector,
        buffer: int = 64,
        rand: Callable[[], float] = random.random,
    ) -> None:
        self.session_id = session_id
        self.filter = filter
        self.cursor = since
        self.snapshot = snapshot
        self.coalesce_ms = coalesce_ms  # the delta rollup window (docs/protocol.md §3)
        self.backoff = backoff or Backoff()
        self.heartbeat = heartbeat or Heartbeat()
        self.max_reconnects = max_reconnects
        self.duplicates_dropped = 0
        self.connections = 0
        self._http = http
        self._connector = connector
        self._rand = rand
        self._reached = False  # the gateway answered once: unreachable now means restarting
        self._last_said = ""
        self._send, self._receive = trio.open_memory_channel[Item | _Failed](buffer)
        self._ended: GatewayError | None = None
        self.transport = "websocket"  # "sse" once a WebSocket could not pass (_connect)

    # --- the consumer's side

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> Item:
        """The next frame or notice.

        Raises:
            StopAsyncIteration: the server closed the stream normally (1000),
                or the subscription was closed.
            GatewayError: what retrying cannot fix (module docstring), raised
                again on every later call.
        """
        if self._ended is not None:
            raise self._ended
        try:
            item = await self._receive.receive()
        except (trio.EndOfChannel, trio.ClosedResourceError):
            raise StopAsyncIteration from None
        if isinstance(item, _Failed):
            self._ended = item.error
            raise item.error
        return item

    # --- the feeding task

    async def run(self) -> None:
        """Connect, resubscribe after each drop, until the stream ends for good."""
        async with self._send:
            try:
                status = await reconnecting(
                    self._connect,
                    backoff=self.backoff,
                    max_reconnects=self.max_reconnects,
                    say=self._say,
                    rand=self._rand,
                )
                if status == GAVE_UP:
                    raise ClientError("gave_up", self._last_said)
            except GatewayError as exc:
                await self._send.send(_Failed(exc))
            except trio.BrokenResourceError:
                pass  # the consumer is gone

    async def _say(self, line: str) -> None:
        self._last_said = line
        await self._send.send(Notice(line))

    async def _connect(self) -> Ended:
        """One attempt: a token, the WebSocket, the subscribe, the stream until it ends.

        A WebSocket that cannot pass (its upgrade refused by a proxy) makes
        this subscription read server-sent events from then on (gateway.client.sse).
        """
        url = await self._ws_url()
        if isinstance(url, Ended):
            return url
        if self.transport == "sse":
            return await self._connect_sse(url)
        ended: Ended | None = None
        try:
            async with self._connector(url) as ws:
                ended = await self._stream(ws)
        except ConnectionRejected as exc:
            await _close_rejected(exc)
            if not sse.no_websocket_here(exc.status_code, exc.body):
                return _rejected_handshake(exc)
            self.transport = "sse"
            why = f"the WebSocket upgrade was refused ({exc.status_code}): using server-sent events"
            await self._send.send(Notice(why))
            url = await self._ws_url()  # a fresh token: a proxy may have let the first one through
            return url if isinstance(url, Ended) else await self._connect_sse(url)
        except HandshakeError as exc:  # a network error or a timeout, opening or closing
            if ended is None:
                return Ended(None, f"the stream did not open: {describe(exc)}")
        assert ended is not None
        return ended

    async def _ws_url(self) -> str | Ended:
        """``GET /sessions/{id}``: a fresh attach token in ``ws_url`` (docs/protocol.md §2)."""
        try:
            r = await self._http.get(f"/sessions/{self.session_id}")
        except httpx.TransportError as exc:
            why = f"cannot reach {self._http.base_url}: {describe(exc)}"
            if not self._reached:
                raise ClientError("unreachable", why) from exc
            return Ended(None, why)
        self._reached = True
        if r.status_code >= 500:
            return Ended(None, f"the gateway answered {error_line(api_error(r))}")
        if r.status_code != 200:
            raise api_error(r)
        try:
            url = str(r.json()["ws_url"])
        except (ValueError, KeyError, TypeError):
            raise ClientError(
                "not_a_gateway", f"{self._http.base_url} is not a gateway: {r.text[:200]!r}"
            ) from None
        if not url.startswith(("ws://", "wss://")):
            raise ClientError(
                "not_a_gateway", f"the gateway gave a ws_url that is not ws(s)://: {url}"
            )
        return url

    def _subscribe_frame(self) -> str:
        frame = {
            "type": "subscribe",
            "filter": self.filter,
            "since": self.cursor,
            "snapshot": self.snapshot,
        }
        if self.coalesce_ms is not None:  # only when asked: an older gateway refuses the field
            frame["coalesce_ms"] = self.coalesce_ms
        return json.dumps(frame)

    async def _stream(self, ws: WebSocketConnection) -> Ended:
        """Subscribe, deliver every frame, answer pings, ping when idle, until the end."""
        progress = _Progress(self.backoff.stable_s)
        missed = 0  # intervals in a row without any frame, each after a ping of ours
        beat = self.heartbeat
        try:
            await ws.send_message(self._subscribe_frame())
            while True:
                with trio.move_on_after(beat.interval_s) as idle:
                    raw = await ws.get_message()
                if idle.cancelled_caught:
                    if missed >= beat.max_missed:
                        await _drop(ws)
                        why = f"no frame from the gateway in {beat.dead_after_s:g} s"
                        return Ended(None, why, progress())
                    missed += 1
                    await ws.send_message(encode(Ping(secrets.token_hex(8))).decode())
                    continue
                missed = 0
                text = raw if isinstance(raw, str) else raw.decode(errors="replace")
                frame = decode_frame(text)
                again = await self._deliver(text, frame, progress)
                if again is not None:  # from a snapshot, on the same connection
                    await self._send.send(Notice(again, connected=True))
                    await ws.send_message(self._subscribe_frame())
                elif isinstance(frame, Ping):
                    await ws.send_message(encode(Pong(frame.nonce)).decode())
                elif isinstance(frame, ErrorFrame) and progress.subscribed_at is None:
                    raise FrameRejected(frame.code, frame.message)
        except ConnectionClosed as closed:
            return _closed(closed, progress())

    async def _deliver(
        self, text: str, frame: ServerFrame | None, progress: _Progress
    ) -> str | None:
        """One frame of either transport: followed, counted and handed on.

        Returns:
            why the subscription starts again from a snapshot (a
            ``subscribe_error`` whose code asks for one), or None.

        Raises:
            SubscribeRejected: any other ``subscribe_error``.
        """
        if not self._track(frame):
            return None
        progress.saw(frame)
        await self._send.send(Received(text, frame))
        if not isinstance(frame, SubscribeError):
            return None
        if frame.code not in SNAPSHOT_INSTEAD:
            raise SubscribeRejected(frame.code, frame.message)
        why = f"{frame.code} (since {self.cursor}); starting from a snapshot"
        self.cursor, self.snapshot = None, True
        return why

    def _track(self, frame: ServerFrame | None) -> bool:
        """Follow the cursor through a frame; ``False``: an event at or below it (dropped)."""
        if isinstance(frame, EventFrame):
            if self.cursor is not None and frame.event.id <= self.cursor:
                self.duplicates_dropped += 1
                return False
            self.cursor = frame.event.id
            self.snapshot = False
        elif isinstance(frame, Snapshot) and frame.snapshot_at_event_id is not None:
            self.cursor = frame.snapshot_at_event_id
            self.snapshot = False
        elif isinstance(frame, SubscribeAck):
            self.connections += 1
            # Until the first event, a reconnect takes a snapshot: nothing is lost.
            self.snapshot = self.snapshot or self.cursor is None
        return True

    # --- server-sent events (docs/doors/sse.md)

    async def _connect_sse(self, ws_url: str) -> Ended:
        """One attempt over ``GET /sessions/{id}/events``, the token of ``ws_url``."""
        query = sse.events_query(
            sse.attach_token(ws_url), self.filter, self.cursor, self.snapshot, self.coalesce_ms
        )
        timeout = httpx.Timeout(CONNECT_TIMEOUT_S, read=None)
        url = f"/sessions/{self.session_id}/events"
        try:
            async with self._http.stream("GET", url, params=query, timeout=timeout) as r:
                if r.status_code == 200:
                    chunks = r.aiter_raw()
                    try:
                        return await self._stream_sse(chunks)
                    finally:
                        with trio.CancelScope(shield=True):
                            await sse.abandon(r, chunks)
                await r.aread()
        except httpx.TransportError as exc:
            return Ended(None, f"the stream did not open: {describe(exc)}")
        error = api_error(r)
        if r.status_code >= 500 or error.code.startswith("attach_token"):
            return Ended(None, f"the stream was refused: {error_line(error)}")
        raise error

    async def _stream_sse(self, chunks: AsyncIterator[bytes]) -> Ended:
        """Deliver every frame of an SSE answer until its end (the WebSocket loop's twin).

        The server's ``: ping`` comments are the heartbeat: nothing for
        :attr:`Heartbeat.dead_after_s`, and the stream is dropped and resumed.
        """
        progress = _Progress(self.backoff.stable_s)
        parser = sse.SseParser()
        while True:
            with trio.move_on_after(self.heartbeat.dead_after_s) as idle:
                try:
                    chunk = await anext(chunks, b"")
                except httpx.TransportError:
                    chunk = b""
            if idle.cancelled_caught:
                why = f"no frame from the gateway in {self.heartbeat.dead_after_s:g} s"
                return Ended(None, why, progress())
            if not chunk:
                return Ended(None, "the stream ended without a close", progress())
            for text in parser.feed(chunk):
                close = sse.close_frame(text)
                if close is not None:
                    code, name = int(close.get("ws_code", 1006)), str(close.get("code", ""))
                    return ended_by_close(code, name, progress())
                again = await self._deliver(text, decode_frame(text), progress)
                if again is not None:  # a one-way stream: asked again, from a snapshot
                    return Ended(None, again, progressed=True)


@dataclass
class _Progress:
    """Whether a connection got somewhere: an event, or a subscription that lasted.

    A reconnect after progress starts the backoff over (:class:`Backoff`).
    """

    stable_s: float
    subscribed_at: float | None = None
    delivered_event: bool = False

    def saw(self, frame: ServerFrame | None) -> None:
        self.delivered_event = self.delivered_event or isinstance(frame, EventFrame)
        if isinstance(frame, SubscribeAck):
            self.subscribed_at = trio.current_time()

    def __call__(self) -> bool:
        lasted = self.subscribed_at is not None and (
            trio.current_time() - self.subscribed_at >= self.stable_s
        )
        return self.delivered_event or lasted


def decode_frame(text: str) -> ServerFrame | None:
    """The frame, or ``None`` for one this client cannot read.

    Raises:
        SubscribeRejected: a ``subscribe_error`` of a code this client does
            not know: whatever it is, the subscription was refused.
    """
    from gateway.client.codec import decode_server_frame

    try:
        return decode_server_frame(text)
    except FrameRejected:
        try:
            loose = json.loads(text)
        except ValueError:
            return None
        if isinstance(loose, dict) and loose.get("type") == "subscribe_error":
            raise SubscribeRejected(str(loose.get("code")), str(loose.get("message"))) from None
        return None


def _closed(closed: ConnectionClosed, progressed: bool) -> Ended:
    """A close frame (or its absence, 1006) as an end: 0 for a normal close, ``None``
    to reconnect; a close that says not to reconnect raises."""
    code = closed.reason.code if closed.reason else 1006
    name = _close_code(closed.reason.reason if closed.reason else None)
    return ended_by_close(code, name, progressed)


def ended_by_close(code: int, name: str, progressed: bool) -> Ended:
    """A close, WebSocket code and name (gateway.protocol.closes), as an end (:func:`_closed`)."""
    why = f"closed {code}" + (f" {name}" if name else "")
    if name == "session_deleted":  # docs/protocol.md §13: nothing to come back to
        raise ClientError("session_deleted", "the session was deleted")
    if code == 1000:
        return Ended(0, why)
    resumable = name in RESUMABLE if name in CLOSES else code in _RESUMABLE_WS_CODES
    if resumable:
        return Ended(None, why, progressed)
    raise ClientError("closed", why)


def _close_code(reason: str | None) -> str:
    try:
        decoded = json.loads(reason or "{}")
    except ValueError:
        return ""
    return str(decoded.get("code", "")) if isinstance(decoded, dict) else ""


async def _close_rejected(exc: ConnectionRejected) -> None:
    """Close the TCP stream of a refused handshake, which trio-websocket 0.12 leaves open.

    Its reader raises the refusal before anything closes the stream; the
    connection is found in the traceback's frames (``self`` of its methods).
    """
    tb = exc.__traceback__
    while tb is not None:
        owner = tb.tb_frame.f_locals.get("self")
        if isinstance(owner, WebSocketConnection):
            await trio.aclose_forcefully(owner._stream)
            return
        tb = tb.tb_next


def _rejected_handshake(exc: ConnectionRejected) -> Ended:
    """A WebSocket handshake refused with an HTTP status (docs/protocol.md §2)."""
    try:
        code = str(json.loads(exc.body or b"{}")["error"]["code"])
    except (ValueError, KeyError, TypeError):
        code = ""
    why = f"the stream was refused: {exc.status_code} {code}".rstrip()
    if exc.status_code >= 500 or code.startswith("attach_token"):
        return Ended(None, why)  # the daemon is busy, or the token raced its TTL: a fresh one
    raise ClientError("stream_refused", why)


def api_error(r: httpx.Response) -> ApiError:
    """An HTTP error answer as :class:`ApiError`; a body that is not the gateway's
    ``{"error": {"code", "message"}}`` (a proxy's page) gets code ``http_error``."""
    try:
        error = r.json()["error"]
        return ApiError(r.status_code, str(error["code"]), str(error["message"]))
    except (ValueError, KeyError, TypeError):
        return ApiError(r.status_code, "http_error", r.reason_phrase)


def error_line(error: ApiError) -> str:
    """``404 session_not_found: ...``, or ``502 Bad Gateway`` for a body that was not ours."""
    if error.code == "http_error":
        return f"{error.status} {error.message}"
    return f"{error.status} {error.code}: {error.message}"


def describe(exc: BaseException) -> str:
    """An I/O error in a few words (the cause of a wrapper, if any)."""
    while not str(exc) and exc.__cause__ is not None:
        exc = exc.__cause__
    return str(exc) or type(exc).__name__

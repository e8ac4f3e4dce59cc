"""The gateway's load: one turn of a ``lorem`` script in flight on every loaded session.

A turn is ``{"script": {"delay_ms": 1000/R, "rounds": [[{"lorem": W}]]}}``
(docs/reference.md "The scripted model"): W words, one ``text.delta`` every
``1000/R`` ms, so R tokens per second on the session. When a turn ends, the
next one is submitted in the session's time slot: session i of n starts its
turns i/n of a delta interval after the others, so the sessions' deltas are
evenly spread in time, as the peers' channels are (bench.peers) and the
servers are compared under the same load. A rate change cancels the turns in flight
(``POST .../cancel``, docs/protocol.md §2) so that the new rate applies now,
not a turn later.

The driver learns that a turn ended from a watcher connection per session,
subscribed to ``turn.completed``, ``turn.cancelled`` and
``bus.handler_warning`` only; the warnings with reason ``client_too_slow``
are how the bench knows the slow-client rule fired (docs/protocol.md §3).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from urllib.parse import urlsplit

import msgspec

from bench.wire import HttpClient, HttpError, WsClient, open_ws

WATCH = json.dumps(
    {
        "type": "subscribe",
        "filter": {
            "event_types": ["turn.completed", "turn.cancelled", "bus.handler_warning"],
            "actors": None,
            "include_worker_sessions": False,
        },
        "since": None,
        "snapshot": False,
    }
).encode()


class _Payload(msgspec.Struct):
    reason: str = ""


class _Event(msgspec.Struct):
    type: str
    turn_id: str | None = None
    payload: _Payload = msgspec.field(default_factory=_Payload)


class _Frame(msgspec.Struct):
    type: str
    event: _Event | None = None


_decode = msgspec.json.Decoder(_Frame).decode


def lorem_script(rate: float, words: int) -> str:
    """The user message of one load turn: ``words`` words at ``rate`` words per second."""
    script = {"delay_ms": round(1000.0 / rate, 3), "rounds": [[{"lorem": words}]]}
    return json.dumps({"script": script})


async def attach_path(http: HttpClient, session: str) -> str:
    """The stream path with a fresh attach token (docs/protocol.md §2, ``GET /sessions/{id}``)."""
    answer = await http.request("GET", f"/sessions/{session}")
    url = urlsplit(answer["ws_url"])
    return f"{url.path}?{url.query}"


class _Watcher(WsClient):
    def __init__(self, driver: GatewayDriver, session: str, host: str, port: int, path: str):
        super().__init__(host, port, path, WATCH)
        self.driver = driver
        self.session = session

    def on_text(self, payload: bytes, now: float) -> None:
        event = _decode(payload).event
        if event is None:
            return
        if event.type in ("turn.completed", "turn.cancelled") and event.turn_id:
            self.driver.turn_ended(self.session, event.turn_id)
        elif event.type == "bus.handler_warning" and event.payload.reason == "client_too_slow":
            self.driver.slow_client_warnings += 1


class GatewayDriver:
    """Keeps one load turn in flight per session (module docstring)."""

    def __init__(self, http: HttpClient, host: str, port: int, *, words: int) -> None:
        self.http = http
        self.host, self.port = host, port
        self.words = words
        self.rate = 0.0
        self.running = False
        self.slow_client_warnings = 0
        self._sessions: list[str] = []
        self._spread: list[str] = []  # the sessions whose slots share the interval
        self._watchers: dict[str, _Watcher] = {}
        self._in_flight: dict[str, str] = {}  # session -> turn id
        self._ended_early: set[str] = set()  # turns that ended before their POST answered
        self._submitting: set[str] = set()  # sessions whose next turn is waiting for its slot
        self._idle = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._epoch = 0.0  # the time base of the sessions' slots

    async def run(
        self, sessions: list[str], rate: float, *, spread: list[str] | None = None
    ) -> None:
        """Load ``sessions`` at ``rate`` (replacing any earlier load).

        ``spread``: the sessions whose time slots share a delta interval, when
        other drivers load the rest of them (one driver per node of
        :mod:`bench.nodes`); by default ``sessions``.
        """
        self.rate, self.running = rate, True
        self._sessions = list(sessions)
        self._spread = list(sessions if spread is None else spread)
        self._epoch = asyncio.get_running_loop().time()
        for session in sessions:
            if session not in self._watchers:
                path = await attach_path(self.http, session)
                watcher = _Watcher(self, session, self.host, self.port, path)
                await open_ws(watcher)
                await watcher.answered  # subscribed before any turn starts
                self._watchers[session] = watcher
        for session in sessions:
            turn_id = self._in_flight.get(session)
            if session in self._submitting:
                continue  # its pending turn takes the new rate (its script is made after the wait)
            if turn_id is None:
                await self._submit(session)
            else:
                await self._cancel(session, turn_id)  # its end submits the next turn

    async def stop(self) -> None:
        """Stop submitting, cancel the turns in flight, wait until they have ended."""
        self.running = False
        for session, turn_id in list(self._in_flight.items()):
            await self._cancel(session, turn_id)
        if self._in_flight:
            self._idle.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._idle.wait(), 30)

    async def close(self) -> None:
        self.running = False
        for watcher in self._watchers.values():
            watcher.abort()
        self._watchers.clear()

    def turn_ended(self, session: str, turn_id: str) -> None:
        if self._in_flight.get(session) != turn_id:
            self._ended_early.add(turn_id)
            return
        del self._in_flight[session]
        if self.running and session in self._sessions:
            task = asyncio.create_task(self._submit(session))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        elif not self._in_flight:
            self._idle.set()

    async def _submit(self, session: str) -> None:
        self._submitting.add(session)
        try:
            await asyncio.sleep(self._until_slot(session))
            if not self.running:  # stopped while it waited for its slot
                if not self._in_flight:
                    self._idle.set()
                return
            content = lorem_script(self.rate, self.words)
            path = f"/sessions/{session}/turns"
            answer = await self.http.request("POST", path, {"content": content})
        finally:
            self._submitting.discard(session)
        turn_id = str(answer["turn_id"])
        self._in_flight[session] = turn_id
        if turn_id in self._ended_early:
            self._ended_early.discard(turn_id)
            self.turn_ended(session, turn_id)

    def _until_slot(self, session: str) -> float:
        """Seconds until ``session``'s next time slot (module docstring)."""
        if not self.rate or session not in self._sessions:
            return 0.0
        interval = 1.0 / self.rate
        slot = interval * self._spread.index(session) / len(self._spread)
        elapsed = asyncio.get_running_loop().time() - self._epoch
        return (slot - elapsed) % interval

    async def _cancel(self, session: str, turn_id: str) -> None:
        try:
            await self.http.request("POST", f"/sessions/{session}/turns/{turn_id}/cancel", {})
        except HttpError as exc:
            if exc.status not in (404, 409):  # it ended meanwhile
                raise

"""What the kill -9 torture test (tests/system/store/test_torture.py) drives and reads.

A real ``gateway serve`` process (:class:`Daemon`), its database file read
directly while no process runs on it (:class:`StoreFile`), a client that keeps
the bytes of every event it received (:class:`RawClient`), and the ledger of
everything clients were shown or told over the whole run (:class:`Ledger`),
checked against the file after every kill (docs/protocol.md §9).
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from gateway.client import decode_server_frame
from gateway.protocol.events import CATALOG_TYPES
from gateway.protocol.frames import EventFrame
from tests.conftest import Client

READY = re.compile(rb"gateway listening on http://127\.0\.0\.1:(\d+)\n")
EVENT_HEAD = '{"type":"event","event":'  # the splice of gateway.protocol.framing.event_frame
# GATEWAY_TORTURE_NICE=19: the daemon runs niced, as on a busy machine (with other load).
NICE = (
    ["nice", "-n", os.environ["GATEWAY_TORTURE_NICE"]]
    if "GATEWAY_TORTURE_NICE" in os.environ
    else []
)
# A line of the daemon's log that says something went wrong while it ran. A
# slow commit (store_flush_slow, a warning for the operator) is not a failure:
# a machine under load makes them.
TROUBLE = re.compile(r" (ERROR|CRITICAL|WARNING) |Traceback")
NOT_TROUBLE = ("store_flush_slow",)


def seq_of(event_id: str) -> int:
    """The sequence number of an id the gateway issued (``evt_`` + 20 digits)."""
    assert re.fullmatch(r"evt_\d{20}", event_id), event_id
    return int(event_id[4:])


def text_of(path: Path) -> str:
    return path.read_text()


class Daemon:
    """One ``gateway serve`` process on the test's store; its log goes to a file."""

    def __init__(self, proc: trio.Process, port: int, log: Path) -> None:
        self.proc = proc
        self.port = port
        self.base = f"http://127.0.0.1:{port}"
        self.log = log

    @classmethod
    async def start(cls, workdir: Path, config: Path, life: int) -> Daemon:
        proc, log = await cls._spawn(workdir, config, life)
        return cls(proc, await cls._ready(proc, log), log)

    @classmethod
    async def start_and_kill_in_recovery(
        cls, workdir: Path, config: Path, life: int
    ) -> tuple[bool, list[str]]:
        """Start one, and SIGKILL it once it logs the turns it closed (their commit is due).

        Returns whether that line came before the readiness line (else it is
        killed then), and the troubles in its log.
        """
        proc, log = await cls._spawn(workdir, config, life)
        seen = False
        async with trio.open_nursery() as nursery:

            async def watch_log() -> None:
                nonlocal seen
                # A file has no event to wait on: poll it.
                while "left in flight" not in text_of(log):  # noqa: ASYNC110
                    await trio.sleep(0.001)
                seen = True
                nursery.cancel_scope.cancel()

            nursery.start_soon(watch_log)
            await cls._ready(proc, log)
            nursery.cancel_scope.cancel()
        daemon = cls(proc, 0, log)
        await daemon.kill()
        return seen, daemon.trouble()

    @staticmethod
    async def _spawn(workdir: Path, config: Path, life: int) -> tuple[trio.Process, Path]:
        log = workdir / f"life-{life:03d}.log"
        # The shell's GATEWAY_* variables would override the test's config.
        env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
        with log.open("wb") as stderr:
            command = [*NICE, sys.executable, "-m", "gateway", "serve", "--config", str(config)]
            proc = await trio.lowlevel.open_process(
                [*command, "--port", "0"],
                cwd=workdir,
                env=env,
                stdout=subprocess.PIPE,
                stderr=stderr,
            )
        return proc, log

    @staticmethod
    async def _ready(proc: trio.Process, log: Path) -> int:
        """Read the readiness line; the port."""
        assert proc.stdout is not None
        line = b""
        with trio.fail_after(30):
            while not line.endswith(b"\n"):
                chunk = await proc.stdout.receive_some(1)
                assert chunk, f"the gateway exited before its readiness line: {text_of(log)}"
                line += chunk
        match = READY.fullmatch(line)
        assert match, line
        return int(match.group(1))

    async def kill(self) -> None:
        """SIGKILL, and wait until the process is gone (its locks with it)."""
        self.proc.kill()
        await self.proc.wait()
        if self.proc.stdout is not None:
            await self.proc.stdout.aclose()

    def trouble(self) -> list[str]:
        """The log lines of this life that report a failure (a failed write, a crash)."""
        return [
            line
            for line in text_of(self.log).splitlines()
            if TROUBLE.search(line) and not any(ok in line for ok in NOT_TROUBLE)
        ]

    def redid_recovery(self) -> bool:
        """Whether this life closed turns left in flight (its log says so)."""
        return "left in flight" in text_of(self.log)


class RawClient(Client):
    """A :class:`Client` that also keeps each catalog event's bytes as received."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.raw: dict[str, bytes] = {}  # event id -> the event's JSON, as on the wire

    async def recv(self) -> Any:
        text = await self.ws.get_message()
        frame = decode_server_frame(text)
        if isinstance(frame, EventFrame):
            self.events.append(frame.event)
            if frame.event.type in CATALOG_TYPES:
                assert isinstance(text, str) and text.startswith(EVENT_HEAD), text[:80]
                self.raw[frame.event.id] = text[len(EVENT_HEAD) : -1].encode()
        self.reducer.apply(frame)
        return frame

    def catalog(self) -> list[tuple[str, str]]:
        """(id, session id) of every catalog event received, in order."""
        return [(e.id, e.session_id) for e in self.events if e.type in CATALOG_TYPES]


@dataclass
class StoredEvent:
    seq: int
    session_id: str
    type: str
    data: bytes

    @property
    def event(self) -> dict[str, Any]:
        decoded: dict[str, Any] = json.loads(self.data)
        return decoded


@dataclass
class StoreFile:
    """Everything in the database file, read once (read-only) while no daemon runs."""

    sessions: dict[str, dict[str, Any]] = field(default_factory=dict)
    events: list[StoredEvent] = field(default_factory=list)
    messages: list[tuple[str, str, str]] = field(default_factory=list)  # session, id, status
    ceiling: int = 0

    @classmethod
    def read(cls, path: Path) -> StoreFile:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            view = cls()
            rows = conn.execute(
                "SELECT id, parent_session_id, current_turn_id, turn_count FROM sessions"
            ).fetchall()
            for sid, parent, turn, turns in rows:
                view.sessions[sid] = {"parent": parent, "current_turn_id": turn, "turns": turns}
            events = conn.execute("SELECT seq, session_id, type, data FROM events ORDER BY seq")
            view.events = [StoredEvent(s, sid, t, bytes(d)) for s, sid, t, d in events]
            messages = conn.execute("SELECT session_id, id, data FROM messages ORDER BY ord")
            view.messages = [(sid, mid, json.loads(d)["status"]) for sid, mid, d in messages]
            row = conn.execute("SELECT value FROM meta WHERE key = 'event_ceiling'").fetchone()
            view.ceiling = 0 if row is None else int(row[0])
            return view
        finally:
            conn.close()

    def of(self, session_id: str) -> list[StoredEvent]:
        return [e for e in self.events if e.session_id == session_id]

    def by_seq(self) -> dict[int, StoredEvent]:
        return {e.seq: e for e in self.events}

    def high_water(self) -> int:
        return max([self.ceiling, *(e.seq for e in self.events)])


def interrupted_phase(turn_events: list[dict[str, Any]]) -> str:
    """The phase (docs/protocol.md §8) a turn stood in, from its stored events.

    Written here from the contract, independently of gateway/session/recovery.py:
    a model call started and not ended is ``llm`` (an MCP server's sampling
    call is its tool's: ``tools``); a tool called, not ended and not waiting
    for its own approval (``kind: "tool"``; a server's question is asked while
    its tool runs) is ``tools``; anything else is ``seam``.
    """
    open_calls: set[str] = set()
    tools: set[str] = set()
    waiting: dict[str, str] = {}  # perm_id -> tool_use_id
    for e in turn_events:
        p = e["payload"]
        match e["type"]:
            case "llm.call_started" if p.get("purpose") != "sampling":
                open_calls.add(p["call_id"])
            case "llm.call_completed" | "llm.call_failed":
                open_calls.discard(p["call_id"])
            case "tool.called":
                tools.add(p["tool_use_id"])
            case "tool.completed" | "tool.failed":
                tools.discard(p["tool_use_id"])
            case "permission.requested" if p.get("kind", "tool") == "tool":
                waiting[p["perm_id"]] = p["tool_use_id"]
            case "permission.resolved":
                waiting.pop(p["perm_id"], None)
    if open_calls:
        return "llm"
    if tools - set(waiting.values()):
        return "tools"
    return "seam"


@dataclass
class Turn:
    """One turn of a session, as stored: its events in order."""

    turn_id: str
    events: list[dict[str, Any]] = field(default_factory=list)

    @property
    def end(self) -> dict[str, Any] | None:
        last = self.events[-1]
        return last if last["type"] in ("turn.completed", "turn.cancelled") else None


def turns_of(events: list[StoredEvent]) -> tuple[list[Turn], list[str]]:
    """A session's stored turns, and what breaks the rule "one turn at a time, each ends once"."""
    turns: list[Turn] = []
    problems: list[str] = []
    current: Turn | None = None
    for stored in events:
        e = stored.event
        tid = e["turn_id"]
        if e["type"] == "turn.started":
            if current is not None and current.end is None:
                problems.append(f"turn {tid} started while {current.turn_id} had not ended")
            current = Turn(tid, [e])
            turns.append(current)
        elif tid is not None:
            if current is None or tid != current.turn_id:
                problems.append(f"{e['id']} {e['type']} of turn {tid}: not the current turn")
            elif current.end is not None:
                problems.append(f"{e['id']} {e['type']} after turn {tid} ended")
            else:
                current.events.append(e)
    return turns, problems


def unended(turn: Turn) -> list[str]:
    """What a turn began and never ended: calls, tools, delegates (section 8's sequences)."""
    begun: dict[str, str] = {}
    for e in turn.events:
        p = e["payload"]
        match e["type"]:
            case "llm.call_started":
                begun[p["call_id"]] = "llm call"
            case "llm.call_completed" | "llm.call_failed":
                begun.pop(p["call_id"], None)
            case "tool.called":
                begun[p["tool_use_id"]] = "tool"
            case "tool.completed" | "tool.failed":
                begun.pop(p["tool_use_id"], None)
            case "delegate.started":
                begun["delegate " + p["tool_use_id"]] = "delegate"
            case "delegate.completed" | "delegate.failed":
                begun.pop("delegate " + p["tool_use_id"], None)
    return [f"{kind} {key}" for key, kind in begun.items()]


@dataclass
class Ledger:
    """What clients were shown or told over the whole run, checked after every kill."""

    created: dict[str, int] = field(default_factory=dict)  # session id -> the life it was made in
    delivered: dict[str, bytes] = field(default_factory=dict)  # event id -> bytes received
    violations: list[str] = field(default_factory=list)
    _keys: set[str] = field(default_factory=set)

    def check(self, ok: bool, what: str, key: str | None = None) -> None:
        """Record a violation once (per ``key``: the same fact found again at a later kill)."""
        key = what if key is None else key
        if not ok and key not in self._keys:
            self._keys.add(key)
            self.violations.append(what)

    def received(self, client: RawClient) -> None:
        for event_id, data in client.raw.items():
            seen = self.delivered.setdefault(event_id, data)
            self.check(seen == data, f"{event_id} was delivered twice with different bytes")

    def check_file(self, view: StoreFile, where: str) -> int:
        """Every session answered 201 and every catalog event delivered are in the file."""
        for sid, life in self.created.items():
            self.check(
                sid in view.sessions,
                f"{where}: session {sid} (created in life {life}) is not in the store",
                key=f"session {sid}",
            )
        stored = view.by_seq()
        for event_id, data in self.delivered.items():
            row = stored.get(seq_of(event_id))
            if row is None:
                what = f"{where}: delivered {event_id} is not in the store"
            elif row.data != data:
                what = f"{where}: {event_id} stored is not what was sent: {row.data!r} {data!r}"
            else:
                continue
            self.check(False, what, key=f"event {event_id}")
        return len(self.delivered)

"""Visitors: sessions that go in and out of memory all through the soak (docs/protocol.md §13).

The soak's daemon unloads a session unused for ``[sessions] idle_unload_s``
(short in the soak profiles). Each visitor owns a session no other client
attaches to and keeps coming back to it:

1. it stays away for ``away_s`` (longer than ``idle_unload_s``: the daemon
   unloads the session meanwhile; ``gateway_sessions_unloaded_total`` counts
   it);
2. it attaches with ``since`` = the last event id it received (the session is
   loaded again for it), runs one short turn, and reads until the turn ends.

What must hold across every unload: the subscribe is accepted (the cursor is
still valid), the first event after it is the visitor's own ``turn.started``
(nothing happened while it was away but the bus's notes, such as its own
last connection leaving; nothing is sent twice), every id is
above the one before, and the turn completes. At the end, the session's
stored messages hold one user message per visit, each once (:func:`verify`).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import httpx
import trio

from bench.soak.clients import CONNECT_ERRORS, TURN_ENDS, connect, subscribe_frame
from gateway.protocol.frames import EventFrame, SubscribeAck, SubscribeError

VISIT_TIMEOUT_S = 60.0


@dataclass
class Visitor:
    """One visitor's session and what it saw (module docstring)."""

    session_id: str
    cursor: str | None = None  # the last event id received
    visits: int = 0
    problems: list[str] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)  # each visit's user message

    def problem(self, what: str) -> None:
        if len(self.problems) < 20:
            self.problems.append(f"{self.session_id}: {what}")


async def visit_loop(
    http: httpx.AsyncClient,
    visitor: Visitor,
    away_s: float,
    rng: random.Random,
    stop: trio.Event,
) -> None:
    """Come back to the session after ``away_s`` (and a little), until ``stop``.

    A visit is never cut short (its turn would be left half read, and the next
    visit's first events would be its end): ``stop`` is heeded between visits.
    """
    while True:
        with trio.move_on_after(away_s * rng.uniform(1.0, 1.5)):
            await stop.wait()
        if stop.is_set():
            return
        try:
            with trio.CancelScope(shield=True), trio.fail_after(VISIT_TIMEOUT_S):
                await visit(http, visitor)
        except trio.TooSlowError:
            visitor.problem(f"visit {visitor.visits + 1} took over {VISIT_TIMEOUT_S:g} s")
        except CONNECT_ERRORS as exc:
            visitor.problem(f"visit {visitor.visits + 1}: {exc!r}"[:300])


async def visit(http: httpx.AsyncClient, visitor: Visitor) -> None:
    """One visit: attach from the cursor, one turn, read to its end (module docstring)."""
    number = visitor.visits + 1
    text = f"visit {number} of {visitor.session_id}"
    async with connect(http, visitor.session_id) as conn:
        await conn.ws.send_message(subscribe_frame(visitor.cursor))
        ack = await conn.recv()
        if isinstance(ack, SubscribeError):
            visitor.problem(f"visit {number}: subscribe refused: {ack.code} {ack.message}")
            return
        if not isinstance(ack, SubscribeAck):
            visitor.problem(f"visit {number}: {type(ack).__name__} before the subscribe_ack")
            return
        answer = await http.post(f"/sessions/{visitor.session_id}/turns", json={"content": text})
        answer.raise_for_status()
        turn_id = str(answer.json()["turn_id"])
        visitor.texts.append(text)
        first = True
        while True:
            frame = await conn.recv()
            if not isinstance(frame, EventFrame):
                continue
            event = frame.event
            if visitor.cursor is not None and event.id <= visitor.cursor:
                visitor.problem(f"visit {number}: {event.id} again (cursor {visitor.cursor})")
            visitor.cursor = event.id
            if event.type.startswith("bus."):  # its own last connection leaving, say
                continue
            if first and (event.type != "turn.started" or event.turn_id != turn_id):
                visitor.problem(f"visit {number}: {event.type} {event.id} while away")
            first = False
            if event.type in TURN_ENDS and event.turn_id == turn_id:
                if event.type != "turn.completed":
                    visitor.problem(f"visit {number}: the turn ended {event.type}")
                break
    visitor.visits = number


async def verify(http: httpx.AsyncClient, visitor: Visitor) -> None:
    """The session's stored user messages are the visits' texts, each once, in order."""
    texts: list[str] = []
    before: str | None = None
    while True:
        params = {"limit": "200", **({"before": before} if before else {})}
        answer = await http.get(f"/sessions/{visitor.session_id}/messages", params=params)
        answer.raise_for_status()
        page = answer.json()
        texts = [
            block["text"]
            for m in page["messages"]
            if m["role"] == "user"
            for block in m["content"]
            if block.get("type") == "text"
        ] + texts
        if not page["has_more"] or not page["messages"]:
            break
        before = page["messages"][0]["id"]
    if texts != visitor.texts:
        visitor.problem(f"stored {len(texts)} visits, made {len(visitor.texts)}: they differ")

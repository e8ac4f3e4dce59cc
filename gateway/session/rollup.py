"""The per-client delta rollup (docs/protocol.md §3 "Delta rollup").

A subscription's ``coalesce_ms`` (0..250; default ``[stream] coalesce_ms``)
is a window within which consecutive deltas of one block (``text.delta``,
``thinking.delta``, ``tool.use_input_delta``: the same type, session,
message and block) go out as one delta: their text joined, the envelope
(id, ``ts``) the last one's, so a client that saw it with id N has
everything up to N and ``since: N`` resumes exactly. Any other event (and a
delta of another block) flushes what is held first, so order holds. The
window opens with the first delta held and lasts ``coalesce_ms``; the first
event that comes at or after its end closes it: a delta of the block joins
the rolled-up delta (it waits for nothing: sent as it comes), anything else
goes out right behind it. When nothing comes, the clock sends what is held
half a window later (:attr:`Rollup.deadline`: a stalled model costs a held
delta at most 1.5 x ``coalesce_ms``). So a model at 50 tokens/s under a 40 ms
window sends one delta every third token (0, 20 and 40 ms), not every second.

:class:`Rollup` is the sans-IO core (one per hub group: a filter and a
window, so every client of the group shares the rolled-up bytes); the hub
feeds it each batch and asks it for what is due (:mod:`gateway.session.hub`).
:class:`RollupClock` is the node's one task that wakes the hubs whose
windows end (structured: it runs in the node's ``sessions`` nursery).

A rolled-up event keeps its parts (:attr:`gateway.session.hub.Emitted.parts`):
the seam cuts one that straddles a cut down to the parts above it
(:func:`gateway.session.seam.past_cut`), so a snapshot or a replay then live
still has no gap and no duplicate.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
from collections.abc import Callable, Sequence
from typing import Any

import msgspec
import trio

from gateway.protocol.framing import event_frame
from gateway.session.hub import Emitted

log = logging.getLogger("gateway.hub")

ROLLED: dict[str, str] = {
    "text.delta": "text",
    "thinking.delta": "text",
    "tool.use_input_delta": "partial_json",
}
"""The delta types a rollup joins, and the payload field it joins."""


def _block(em: Emitted, payload: dict[str, Any]) -> tuple[str, str, Any, Any]:
    return em.type, em.session_id, payload.get("message_id"), payload.get("content_block_index")


def join(parts: Sequence[Emitted]) -> Emitted:
    """One delta for ``parts`` (consecutive deltas of one block): the text joined, the
    last one's envelope. One part is returned as it is (the same bytes)."""
    if len(parts) == 1:
        return parts[0]
    last = parts[-1]
    field = ROLLED[last.type]
    envelope = msgspec.json.decode(last.data)
    payloads = [msgspec.json.decode(p.data)["payload"] for p in parts]
    payload = envelope["payload"]
    payload[field] = "".join(p[field] for p in payloads)
    if last.type == "thinking.delta":  # the last signature given, if any
        payload["signature"] = next(
            (p["signature"] for p in reversed(payloads) if p.get("signature")), None
        )
    data = msgspec.json.encode(envelope)
    return Emitted(
        last.seq, last.type, last.actor, last.session_id, last.turn_id, last.ts,
        data, event_frame(data), tuple(parts),
    )  # fmt: skip


class Rollup:
    """One group's window, sans-IO (module docstring).

    Args:
        window_s: the window, in seconds (``coalesce_ms / 1000``), > 0.
    """

    __slots__ = ("_block", "closes_at", "deadline", "held", "window_s")

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self.held: list[Emitted] = []
        self._block: tuple[str, str, Any, Any] | None = None
        self.closes_at = math.inf  # the window's end: what comes then closes it
        self.deadline = math.inf  # when the clock sends what is held (nothing came)

    def feed(self, events: Sequence[Emitted], now: float) -> list[Emitted]:
        """What goes out now of ``events`` (one batch, in id order) and what was held.

        Deltas are held (joined to what is held when of the same block);
        anything else goes out behind what was held. A batch that comes at or
        after the window's end closes it: what is held then (this batch's
        deltas of the block included) goes out.
        """
        out: list[Emitted] = []
        for em in events:
            if em.type in ROLLED:
                block = _block(em, msgspec.json.decode(em.data)["payload"])
                if self.held and block != self._block:
                    out.append(self._flush())
                if not self.held:
                    self._block = block
                    self.closes_at = now + self.window_s
                    self.deadline = now + 1.5 * self.window_s
                self.held.append(em)
            else:
                if self.held:
                    out.append(self._flush())
                out.append(em)
        if self.held and now >= self.closes_at:
            out.append(self._flush())
        return out

    def due(self, now: float) -> Emitted | None:
        """What is held, if its window ended by ``now`` (the clock's call)."""
        if self.held and now >= self.closes_at:
            return self._flush()
        return None

    def flush(self) -> Emitted | None:
        """What is held, now (None: nothing)."""
        return self._flush() if self.held else None

    def _flush(self) -> Emitted:
        rolled = join(self.held)
        self.held = []
        self._block = None
        self.closes_at = self.deadline = math.inf
        return rolled


class RollupClock:
    """The node's timer of the rollup windows: one task, a heap of deadlines.

    A hub whose group starts holding deltas asks :meth:`at` for its
    deadline, and cancels it (:meth:`cancel`) when an event closes the
    window first; the task calls the given function at (or just after) it.
    Cheap when idle, and never woken for nothing: it sleeps in a cancel
    scope whose deadline is the earliest live one, moved (not woken) when an
    earlier deadline comes or the earliest is cancelled, so a window closed
    by its model's next token costs the node no wake-up.
    """

    def __init__(self) -> None:
        self._heap: list[list[Any]] = []  # [deadline, order, call or None: cancelled]
        self._order = itertools.count()
        self._sleep: trio.CancelScope | None = None  # the task's, while it sleeps

    def at(self, deadline: float, call: Callable[[float], None], /) -> object:
        """Call ``call(now)`` once ``deadline`` (trio time) has passed; a handle for
        :meth:`cancel`."""
        entry = [deadline, next(self._order), call]
        heapq.heappush(self._heap, entry)
        sleep = self._sleep
        if sleep is not None and deadline < sleep.deadline:
            sleep.deadline = deadline
        return entry

    def cancel(self, handle: object, /) -> None:
        """The call of ``handle`` (:meth:`at`'s) will not be made (done already: nothing)."""
        if not isinstance(handle, list) or handle[2] is None:
            return
        handle[2] = None
        heap = self._heap
        while heap and heap[0][2] is None:
            heapq.heappop(heap)
        sleep = self._sleep
        if sleep is not None:
            sleep.deadline = heap[0][0] if heap else math.inf

    def fire(self, now: float) -> None:
        """Every call whose deadline has passed by ``now`` (a failing one is logged)."""
        heap = self._heap
        while heap and heap[0][0] <= now:
            entry = heapq.heappop(heap)
            call, entry[2] = entry[2], None
            if call is None:
                continue
            try:
                call(now)
            except Exception:
                log.exception("rollup: a window's flush failed", extra={"event": "rollup_failed"})

    async def run(self) -> None:
        """Wake at each deadline, forever (the node cancels it)."""
        heap = self._heap
        while True:
            while heap and heap[0][2] is None:  # cancelled while not the earliest
                heapq.heappop(heap)
            deadline = heap[0][0] if heap else math.inf
            with trio.CancelScope(deadline=deadline) as sleep:
                self._sleep = sleep
                try:
                    await trio.sleep_forever()
                finally:
                    self._sleep = None
            self.fire(trio.current_time())

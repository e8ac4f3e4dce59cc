"""A server's refused requests in the daemon's log: at most a line a second (docs/operating.md).

A server may send a flood of ``sampling/createMessage`` or
``elicitation/create`` that are each refused at once (gateway.mcp.sampling,
gateway.mcp.questions, docs/protocol.md §11): a line each would fill the
log's queue and drop every other line (``[log] queue_lines``). One line of
a kind per :data:`REFUSAL_LOG_INTERVAL_S`, the next one saying how many were
left out; the refusals themselves are never left out (the server gets its
error every time).
"""

from __future__ import annotations

import math

import trio

REFUSAL_LOG_INTERVAL_S = 1.0
"""The least time between two lines of one kind of refusal from one server."""


class Quiet:
    """When the next line of one kind may be written, and how many were left out meanwhile."""

    def __init__(self, interval_s: float = REFUSAL_LOG_INTERVAL_S) -> None:
        self._interval_s = interval_s
        self._at = -math.inf
        self._left_out = 0

    def due(self) -> int | None:
        """None: leave this line out (counted); else write it, saying the count left out before."""
        now = trio.current_time()
        if now - self._at < self._interval_s:
            self._left_out += 1
            return None
        left_out, self._left_out, self._at = self._left_out, 0, now
        return left_out


def more(left_out: int) -> str:
    """The tail of a line after ``left_out`` such lines were left out."""
    return f" ({left_out} more such before it, not logged)" if left_out else ""

"""Idle timers on a shared grain (docs/protocol.md §3 "Heartbeat").

Every stream pings after ``ping_interval_s`` without a write. A thousand
streams, each waiting for its own deadline, would wake an idle daemon some
33 times a second (30 s apart each, spread out), and a wake-up of an idle
process costs some hundreds of microseconds of CPU on its own
(docs/performance.md "Heartbeats on one clock"). :func:`coarse` rounds a
deadline up to the next multiple of a grain on the Trio clock (a tenth of
the period, at most :data:`MAX_GRAIN_S`), so every stream due within the
same grain wakes in the same step: at most one wake-up a grain, whatever
the number of streams. A timer fires at most a grain late; whether a ping
is due is still decided on the true times.
"""

from __future__ import annotations

import math

MAX_GRAIN_S = 1.0


def coarse(deadline: float, period: float) -> float:
    """``deadline`` rounded up to the grain of ``period`` (module docstring)."""
    grain = min(MAX_GRAIN_S, period / 10)
    if not math.isfinite(deadline) or not grain > 0:
        return deadline
    return math.ceil(deadline / grain) * grain

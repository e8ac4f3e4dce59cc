"""``gateway attach``'s reconnect policy, without a network.

:func:`backoff_delay` is a pure function, tested synchronously (a table, then
properties with hypothesis: ``GATEWAY_HYPOTHESIS_EXAMPLES`` asks for more
examples than the suite's default). :func:`reconnecting`, the loop that waits
out the backoff between connection attempts, runs on Trio's MockClock
(``autojump_clock``) with fake attempts, so a 30-second cap takes no real
time and the waits are asserted to the millisecond.
"""

from __future__ import annotations

import os

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.client.attach import Backoff, Ended, backoff_delay, reconnecting

EXAMPLES = int(os.environ.get("GATEWAY_HYPOTHESIS_EXAMPLES", "200"))
HIGH = 0.999  # a rand near the top of [0, 1)


# --- the delay ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("attempt", "rand", "expected"),
    [
        (1, 0.0, 0.25),  # the first wait is never 0: half of base_s at least
        (1, 0.5, 0.375),
        (2, 0.0, 0.5),
        (3, 0.0, 1.0),
        (7, 0.0, 15.0),  # 0.5 * 2**6 = 32, capped at 30
        (8, 0.0, 15.0),
        (10**9, 0.0, 15.0),  # no overflow, however long it went on
    ],
)
def test_backoff_doubles_up_to_the_cap_with_the_upper_half_random(
    attempt: int, rand: float, expected: float
) -> None:
    assert backoff_delay(attempt, rand, base_s=0.5, cap_s=30.0) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("attempt", "rand", "base_s", "cap_s"),
    [(0, 0.5, 0.5, 30.0), (1, 1.0, 0.5, 30.0), (1, -0.1, 0.5, 30.0), (1, 0.5, -1.0, 30.0)],
)
def test_backoff_refuses_what_cannot_be_a_delay(
    attempt: int, rand: float, base_s: float, cap_s: float
) -> None:
    with pytest.raises(ValueError):
        backoff_delay(attempt, rand, base_s=base_s, cap_s=cap_s)


@settings(max_examples=EXAMPLES, deadline=None)
@given(
    attempt=st.integers(1, 10_000),
    rand=st.floats(0.0, 1.0, exclude_max=True),
    base_s=st.floats(0.001, 10.0),
    cap_s=st.floats(0.001, 600.0),
)
def test_backoff_stays_in_the_upper_half_of_a_capped_doubling_ceiling(
    attempt: int, rand: float, base_s: float, cap_s: float
) -> None:
    ceiling = min(cap_s, base_s * 2.0 ** min(attempt - 1, 1000))
    delay = backoff_delay(attempt, rand, base_s=base_s, cap_s=cap_s)
    assert ceiling / 2 <= delay <= ceiling <= cap_s
    # a later attempt never waits less, for the same draw
    assert backoff_delay(attempt + 1, rand, base_s=base_s, cap_s=cap_s) >= delay


# --- the loop, on the MockClock ------------------------------------------------------


class Attempts:
    """Fake connection attempts: each returns the next scripted end, and the time it began."""

    def __init__(self, *ends: Ended) -> None:
        self.ends = list(ends)
        self.started: list[float] = []

    async def __call__(self) -> Ended:
        self.started.append(trio.current_time())
        await trio.sleep(1.0)  # every attempt lasts a second
        return self.ends.pop(0)

    def waits(self) -> list[float]:
        """The time between the end of each attempt and the start of the next."""
        return [round(b - a - 1.0, 6) for a, b in zip(self.started, self.started[1:], strict=False)]


DROPPED = Ended(None, "closed 1001 shutdown", progressed=True)
REFUSED = Ended(None, "cannot reach http://127.0.0.1:1")


async def test_reconnects_back_off_with_jitter_up_to_the_cap(autojump_clock: object) -> None:
    attempts = Attempts(DROPPED, *[REFUSED] * 7, Ended(0, "closed 1000"))
    lines: list[str] = []
    status = await reconnecting(
        attempts, backoff=Backoff(), max_reconnects=10, say=lines.append, rand=lambda: 0.0
    )
    assert status == 0
    # a drop after progress waits [0.25, 0.5) s, then each failure doubles, capped at 30 s
    assert attempts.waits() == [0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 15.0]
    assert lines[0] == "closed 1001 shutdown; reconnecting in 0.2 s"
    assert lines[-1] == "closed 1000"
    assert len(lines) == 9


async def test_the_jitter_spreads_clients_dropped_together(autojump_clock: object) -> None:
    draws = iter([0.0, HIGH, 0.5])
    attempts = Attempts(DROPPED, REFUSED, REFUSED, Ended(0, ""))
    await reconnecting(
        attempts, backoff=Backoff(), max_reconnects=10, say=lambda _: None, rand=lambda: next(draws)
    )
    assert attempts.waits() == pytest.approx([0.25, 1.0 * (0.5 + 0.5 * HIGH), 2.0 * 0.75])


async def test_progress_starts_the_backoff_again(autojump_clock: object) -> None:
    attempts = Attempts(REFUSED, REFUSED, REFUSED, DROPPED, REFUSED, Ended(0, ""))
    await reconnecting(
        attempts, backoff=Backoff(), max_reconnects=10, say=lambda _: None, rand=lambda: 0.0
    )
    assert attempts.waits() == [0.5, 1.0, 2.0, 0.25, 0.5]


async def test_gives_up_after_max_reconnects_without_progress(autojump_clock: object) -> None:
    attempts = Attempts(DROPPED, *[REFUSED] * 4)
    lines: list[str] = []
    status = await reconnecting(
        attempts, backoff=Backoff(), max_reconnects=3, say=lines.append, rand=lambda: 0.0
    )
    assert status == 1
    assert len(attempts.started) == 5  # the drop, then 3 reconnects, and one more refused
    assert lines[-1] == "cannot reach http://127.0.0.1:1; giving up after 3 reconnects"
    assert trio.current_time() == pytest.approx(5 * 1.0 + 0.25 + 0.5 + 1.0 + 2.0)


async def test_an_end_that_retrying_cannot_fix_stops_at_once(autojump_clock: object) -> None:
    attempts = Attempts(DROPPED, Ended(1, "session sess_x not found"))
    lines: list[str] = []
    status = await reconnecting(
        attempts, backoff=Backoff(), max_reconnects=10, say=lines.append, rand=lambda: 0.0
    )
    assert status == 1
    assert lines == ["closed 1001 shutdown; reconnecting in 0.2 s", "session sess_x not found"]
    assert trio.current_time() == pytest.approx(2.25)

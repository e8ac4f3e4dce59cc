"""The soak's 30-second smoke (bench/churn.py): churn, slow clients, cancels, failing tools.

A real ``gateway serve`` process under reconnect churn, slow clients,
cancelled turns, failing tools and clients killed mid-frame: the daemon
stays up, the clients that stayed got every event once and in order with
every move valid, and open descriptors and tasks come back to where they
started. ``python -m bench.churn --minutes 10`` is the long run (README).
"""

from __future__ import annotations

from bench.churn import Soak


async def test_thirty_seconds_of_churn_lose_nothing_and_leak_nothing() -> None:
    soak = Soak(30, sessions=3, seed=7)
    result = await soak.run()
    assert result["checks"] == {name: True for name in result["checks"]}, result["checks"]
    tally = result["tally"]
    assert tally["turns"] and tally["cancels"] and tally["reconnects"]
    assert tally["slow_closed"] and tally["killed_mid_frame"]

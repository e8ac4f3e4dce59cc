"""``python -m bench.wakeups``: what one timed wake-up costs this machine, by event loop.

At the lightest load (3 tokens/s per session) every token is a wake-up of
the server from idle: its CPU per event is mostly what waking costs, then
one write per client (docs/performance.md, "The lightest load"). This
measures the first part alone, with no socket and no work: ``--tasks``
tasks, each woken ``--rate`` times a second on the loop's own timer, the
tasks' ticks spread evenly (as the bench's sessions are), for ``--seconds``;
the process's CPU time (``/proc/self/schedstat``: every thread, user and
system) over the wake-ups. Three loops, one after the other: a bare
``epoll.poll(timeout)`` (the kernel's part), asyncio (the ``websockets``
peers' loop) and Trio (the gateway's).
"""

from __future__ import annotations

import argparse
import asyncio
import select
import time

import trio


def _cpu_ns() -> int:
    with open("/proc/self/schedstat") as f:
        return int(f.read().split()[0])


def bare(tasks: int, rate: float, seconds: float) -> float:
    """CPU µs per wake of ``epoll.poll`` with a timeout (nothing else)."""
    ep = select.epoll()
    wakes = int(tasks * rate * seconds)
    start = _cpu_ns()
    for _ in range(wakes):
        ep.poll(1 / (tasks * rate))
    return (_cpu_ns() - start) / 1e3 / wakes


async def _asyncio(tasks: int, rate: float, seconds: float) -> float:
    loop = asyncio.get_running_loop()

    async def tick(i: int) -> None:
        due = loop.time() + i / tasks / rate
        while True:
            due += 1 / rate
            await asyncio.sleep(due - loop.time())

    ticking = [asyncio.create_task(tick(i)) for i in range(tasks)]
    await asyncio.sleep(1)
    start = _cpu_ns()
    await asyncio.sleep(seconds)
    spent = _cpu_ns() - start
    for task in ticking:
        task.cancel()
    return spent / 1e3 / (tasks * rate * seconds)


async def _trio(tasks: int, rate: float, seconds: float) -> float:
    async def tick(i: int) -> None:
        due = trio.current_time() + i / tasks / rate
        while True:
            due += 1 / rate
            await trio.sleep_until(due)

    async with trio.open_nursery() as nursery:
        for i in range(tasks):
            nursery.start_soon(tick, i, name=f"tick-{i}")
        await trio.sleep(1)
        start = _cpu_ns()
        await trio.sleep(seconds)
        spent = _cpu_ns() - start
        nursery.cancel_scope.cancel()
    return spent / 1e3 / (tasks * rate * seconds)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.wakeups", description=__doc__)
    ap.add_argument("--tasks", type=int, default=10, help="ticking tasks (the bench's sessions)")
    ap.add_argument("--rate", type=float, default=3.0, help="wake-ups per second per task")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args(argv)
    print(f"CPU per timed wake-up (us): {args.tasks} tasks x {args.rate:g}/s, {args.seconds:g} s")
    for run in range(args.runs):
        figures = {
            "epoll": bare(args.tasks, args.rate, args.seconds),
            "asyncio": asyncio.run(_asyncio(args.tasks, args.rate, args.seconds)),
            "trio": trio.run(_trio, args.tasks, args.rate, args.seconds),
        }
        print(f"run {run + 1}: " + ", ".join(f"{k} {v:.1f}" for k, v in figures.items()),
              f"({time.strftime('%H:%M:%S')})", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

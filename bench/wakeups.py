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

``--tick`` measures instead what one tick of the node's checkpoint is made of
(docs/performance.md "Issue 36 on a quiet machine"), each part added to the
last, one cycle every ``1/--rate`` s: a Trio timed wake-up alone; plus a hop
to a worker thread and back (``trio.to_thread``, as the store's writer does);
plus a SQLite transaction in that thread (WAL, ``synchronous = NORMAL``, 10
rows of 1.5 KB upserted: ten sessions' streaming messages); and, beside them,
the same transaction run on the Trio thread (what the hop costs, not what the
store may do: blocking work runs in a thread).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import select
import sqlite3
import tempfile
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


async def _tick_parts(rate: float, cycles: int) -> dict[str, float]:
    """CPU µs per cycle of each part of a checkpoint tick (module docstring)."""
    with tempfile.TemporaryDirectory() as where:
        db = sqlite3.connect(os.path.join(where, "tick.db"), check_same_thread=False,
                             isolation_level=None)  # fmt: skip
        db.execute("PRAGMA journal_mode = WAL")
        db.execute("PRAGMA synchronous = NORMAL")
        db.execute("CREATE TABLE messages (id TEXT PRIMARY KEY, data BLOB)")
        blob = b"x" * 1500

        def transaction() -> None:
            db.execute("BEGIN")
            for i in range(10):
                db.execute("INSERT OR REPLACE INTO messages VALUES (?, ?)", (f"m{i}", blob))
            db.execute("COMMIT")

        async def wake() -> None:
            pass

        async def hop() -> None:
            await trio.to_thread.run_sync(lambda: None)

        async def hop_and_transaction() -> None:
            await trio.to_thread.run_sync(transaction)

        async def inline() -> None:
            transaction()

        parts = {"wake": wake, "wake+hop": hop, "wake+hop+transaction": hop_and_transaction,
                 "wake+transaction inline": inline}  # fmt: skip
        figures = {}
        for name, part in parts.items():
            await part()  # warm: the worker thread exists, the table has its rows
            start = _cpu_ns()
            for _ in range(cycles):
                await trio.sleep(1 / rate)
                await part()
            figures[name] = (_cpu_ns() - start) / 1e3 / cycles
        db.close()
        return figures


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.wakeups", description=__doc__)
    ap.add_argument("--tasks", type=int, default=10, help="ticking tasks (the bench's sessions)")
    ap.add_argument("--rate", type=float, default=3.0, help="wake-ups per second per task")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--tick", action="store_true", help="a checkpoint tick's parts instead")
    args = ap.parse_args(argv)
    if args.tick:
        cycles = max(1, int(args.rate * args.seconds))
        print(f"CPU per checkpoint tick (us), by part: {args.rate:g}/s, {cycles} cycles each")
        for run in range(args.runs):
            figures = trio.run(_tick_parts, args.rate, cycles)
            print(f"run {run + 1}: " + ", ".join(f"{k} {v:.0f}" for k, v in figures.items()),
                  flush=True)  # fmt: skip
        return 0
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

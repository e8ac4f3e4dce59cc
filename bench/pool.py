"""The parent's side of the client workers: start them, spread connections, read windows.

Every call goes to all workers at once and waits for all of them, so that a
phase (connect 1,000 clients, mark a window) starts and ends together in
every process.
"""

from __future__ import annotations

import asyncio
import multiprocessing
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

from bench.stats import GroupCounts, Window
from bench.worker import Target, worker_main

CHUNK = 1000  # connections prepared and opened together by :meth:`WorkerPool.open`


class WorkerError(RuntimeError):
    """A worker could not carry out a command (the message says which and why)."""


class WorkerPool:
    """``size`` client worker processes (spawned, so they share nothing with the parent)."""

    def __init__(self, size: int) -> None:
        context = multiprocessing.get_context("spawn")
        self.pipes: list[Connection] = []
        self.processes: list[BaseProcess] = []
        for index in range(size):
            parent_end, child_end = context.Pipe()
            process = context.Process(
                target=worker_main, args=(child_end,), name=f"bench-client-{index}", daemon=True
            )
            process.start()
            child_end.close()
            self.pipes.append(parent_end)
            self.processes.append(process)

    @property
    def size(self) -> int:
        return len(self.pipes)

    async def call(
        self, op: str, per_worker: list[dict[str, Any]] | None = None, **args: Any
    ) -> list[dict[str, Any]]:
        """Send ``op`` to every worker (with its own ``per_worker`` arguments, if given).

        Returns:
            The replies, in worker order.

        Raises:
            WorkerError: a worker answered with an error, or died.
        """
        for index, pipe in enumerate(self.pipes):
            extra = per_worker[index] if per_worker is not None else {}
            pipe.send({"op": op, **args, **extra})
        replies = await asyncio.gather(
            *(
                self._reply(pipe, process)
                for pipe, process in zip(self.pipes, self.processes, strict=True)
            )
        )
        for reply in replies:
            if "error" in reply:
                raise WorkerError(reply["error"])
        return replies

    async def _reply(self, pipe: Connection, process: BaseProcess) -> dict[str, Any]:
        """The worker's answer, read when its pipe is readable; an error if it dies first."""
        loop = asyncio.get_running_loop()
        ready: asyncio.Future[bool] = loop.create_future()

        def settle(answered: bool) -> None:
            if not ready.done():
                ready.set_result(answered)

        loop.add_reader(pipe.fileno(), settle, True)
        loop.add_reader(process.sentinel, settle, False)
        try:
            answered = await ready
        finally:
            loop.remove_reader(pipe.fileno())
            loop.remove_reader(process.sentinel)
        if not answered and not pipe.poll():
            raise WorkerError(f"{process.name} died (exit code {process.exitcode})")
        reply: dict[str, Any] = pipe.recv()
        return reply

    async def open(self, group: str, targets: list[Target]) -> int:
        """Prepare and connect ``targets`` as ``group``, spread round-robin over the workers.

        In chunks of :data:`CHUNK`, as clients arriving over time would: each
        fetches its attach token just before connecting, so that few tokens
        are outstanding at once.

        Returns:
            How many connected and were acknowledged.

        Raises:
            WorkerError: some connections failed (the first errors are quoted).
        """
        connected = 0
        for start in range(0, len(targets), CHUNK):
            await self.prepare(group, targets[start : start + CHUNK])
            connected += await self.connect(group)
        return connected

    async def prepare(self, group: str, targets: list[Target]) -> None:
        shares = [{"targets": targets[i :: self.size]} for i in range(self.size)]
        await self.call("prepare", shares, group=group)

    async def connect(self, group: str, *, all_at_once: bool = False) -> int:
        concurrency = 1_000_000 if all_at_once else 256
        replies = await self.call("connect", group=group, concurrency=concurrency)
        failed = sum(r["failed"] for r in replies)
        if failed:
            errors = [e for r in replies for e in r["errors"]]
            raise WorkerError(f"{failed} connections of {group!r} failed: {errors[:3]}")
        return sum(int(r["connected"]) for r in replies)

    async def mark(self) -> Window:
        """Close the current window in every worker and open the next; return the closed one."""
        replies = await self.call("mark")
        groups: dict[str, GroupCounts] = {}
        for reply in replies:
            for name, part in reply["groups"].items():
                groups.setdefault(name, GroupCounts()).merge(part)
        return Window(groups, [r["cpu_s"] for r in replies])

    async def close(self, group: str) -> None:
        await self.call("close", group=group)

    async def shutdown(self) -> None:
        for pipe in self.pipes:
            pipe.send({"op": "exit"})
        for process in self.processes:
            await asyncio.get_running_loop().run_in_executor(None, process.join, 10)
            if process.is_alive():
                process.kill()

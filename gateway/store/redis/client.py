"""The Redis store's client: held open by a task of its own, and what its failures say.

A coredis client must be held open by one task for as long as it is used (its
connection pool runs its connections' tasks in a task group of its own), and
the store's lifecycle (``open`` ... ``aclose``, possibly from different tasks,
with reads before ``run`` starts) has no task of its own; so a
:class:`Connection` starts one Trio system task that holds the client until
it is let go (and reopens it should the pool fail).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar
from urllib.parse import urlsplit, urlunsplit

import anyio
import coredis
import trio
from coredis.exceptions import RedisError

from gateway.errors import StoreError, first_leaf
from gateway.store.group_commit import CLOSE_RETRY_S, RETRY_FIRST_S, RETRY_MAX_S

CONNECT_TIMEOUT_S = 2.0
COMMAND_TIMEOUT_S = 10.0  # a hung Redis fails a command (the writer retries) rather than hangs

_T = TypeVar("_T")
# Failures of a whole transaction or of the connection: the batch is held and retried.
TRANSIENT: tuple[type[BaseException], ...] = (
    RedisError,
    OSError,
    TimeoutError,
    anyio.BrokenResourceError,
    anyio.ClosedResourceError,
    anyio.EndOfStream,
)


class Read(Protocol):
    """The store's read: a query on its client, Redis's failures raised as :class:`StoreError`."""

    async def __call__(self, query: Callable[[coredis.Redis[bytes]], Awaitable[_T]]) -> _T: ...


class Connection:
    """The store's coredis client and the system task that holds it (module docstring).

    Args:
        url: the store's URL.
        where: the URL without its password, for messages.
        report: told when the client's pool failed and a new client is opened.
    """

    def __init__(self, url: str, where: str, report: Callable[[StoreError], None]) -> None:
        self.client: coredis.Redis[bytes] | None = None  # None: not open, or reconnecting
        self._url = url
        self._where = where
        self._report = report
        self._holding = False  # the holder task was started
        self._release = trio.Event()  # set: the holder task lets the client go
        self._released = trio.Event()  # set: it has

    async def hold(self) -> None:
        """Start the task that holds the client; return once it holds one."""
        # The store reports Redis's failures itself (on_write_error: the
        # node's store_write_failed line; a StoreError at start-up: one
        # line); coredis's own lines would repeat them with tracebacks,
        # at info level and, for a handshake that gets no answer, at
        # error level ("Connection attempt failed unexpectedly!").
        logging.getLogger("coredis").setLevel(logging.CRITICAL)
        ready = trio.Event()
        trio.lowlevel.spawn_system_task(self._hold, ready, name="redis-client")
        self._holding = True
        await ready.wait()

    async def _hold(self, ready: trio.Event) -> None:
        """The task that holds the coredis client open (module docstring).

        A system task: it must never raise. Should the client's pool fail, a
        new client is opened (commands meanwhile fail and are retried).
        """
        try:
            delay = RETRY_FIRST_S
            while not self._release.is_set():
                client: coredis.Redis[bytes] = coredis.Redis.from_url(
                    self._url,
                    connect_timeout=CONNECT_TIMEOUT_S,
                    stream_timeout=COMMAND_TIMEOUT_S,
                )
                try:
                    async with client:
                        self.client = client
                        ready.set()
                        await self._release.wait()
                        return
                except Exception as exc:
                    self._report(StoreError(f"store {self._where}: {reason(exc)}; reconnecting"))
                self.client = None
                with trio.move_on_after(delay):
                    await self._release.wait()
                delay = min(delay * 2, RETRY_MAX_S)
        finally:
            self.client = None
            self._released.set()

    async def let_go(self) -> None:
        """Stop the holder task (if it started) and wait for it."""
        self._release.set()
        if self._holding:
            with trio.CancelScope(shield=True), trio.move_on_after(CLOSE_RETRY_S):
                await self._released.wait()


def redacted(url: str) -> str:
    """``url`` without its password, for messages and logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    user = f"{parts.username}:***@" if parts.username else ":***@"
    return urlunsplit(parts._replace(netloc=user + host))


def reason(exc: BaseException) -> str:
    """One line for an error that may come wrapped in exception groups.

    coredis says "Unable to establish a connection to host:port" whatever the
    cause: the system's reason (connection refused, name or service not
    known, ...) from the chain of causes is added to it.
    """
    exc = first_leaf(exc)
    line = str(exc) or type(exc).__name__
    why = None
    cause = exc.__cause__
    while cause is not None:
        cause = first_leaf(cause)
        if isinstance(cause, OSError) and cause.errno:
            why = os.strerror(cause.errno) if cause.errno > 0 else cause.strerror
        cause = cause.__cause__
    if why and why.lower() not in line.lower():
        line = f"{line}: {why.lower()}"
    return line

"""``gateway attach``: the reference terminal client of a session stream.

It does what docs/protocol.md §3 asks of every client: fetch a single-use
attach token, subscribe with a filter, print every frame as one JSON line on
stdout, answer the server's pings, and, when the connection ends for a reason
that may pass (a close that says "reconnect": 1001 shutdown or heartbeat,
1008 too slow, 1011; a connection lost without a close frame; the daemon
restarting), fetch a fresh token and resume with ``since`` = the last event id
it printed, so nothing is lost and nothing is printed twice. Everything else
it has to say is one line on stderr, never a traceback.

All of that is the client library's :class:`~gateway.client.stream.Subscription`
(its module docstring says what it decides where the contract is silent:
backoff, snapshot fallback, heartbeat); attach prints what it delivers, a
:class:`~gateway.client.stream.Notice` as a line on stderr, and turns the
error that ends it into an exit status. Its own choices:

- **Keepalive.** After ``keepalive_s`` without a frame attach pings, and
  after as long again with still nothing it drops the connection and resumes
  (``Heartbeat(keepalive_s, max_missed=1)``).
- **No snapshot unless asked.** Attach starts live (or from ``--since``);
  a reconnect before any event was printed asks for a snapshot, so nothing
  that happened meanwhile is lost.
- **Exit status**: 0 the server closed the stream normally (1000), or the
  reader of stdout went away (``| head``); 1 a failure (above); 2 a usage
  error (a filter that is not JSON, or that the server refuses); 130
  interrupted (Ctrl-C: one line, no traceback).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from typing import Any, TextIO

import trio

from gateway.client.api import GatewayClient
from gateway.client.stream import (
    Backoff,
    Ended,
    Heartbeat,
    Notice,
    backoff_delay,
    error_line,
    open_websocket,
    reconnecting,
)
from gateway.errors import ApiError, ClientError, FrameRejected, GatewayError, SubscribeRejected

__all__ = [
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_USAGE",
    "Backoff",
    "Ended",
    "attach",
    "backoff_delay",
    "open_websocket",
    "reconnecting",
    "run",
]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report it

_USAGE_ERRORS = frozenset({"invalid_filter", "invalid_request"})


def _exit_status(error: GatewayError, session_id: str) -> tuple[int, str]:
    """The exit status and the line for what retrying cannot fix (module docstring)."""
    match error:
        case ApiError(status=404):
            return EXIT_FAILED, f"session {session_id} not found ({error_line(error)})"
        case ApiError(status=401 | 403):
            return EXIT_FAILED, f"the gateway refused: {error_line(error)} (pass --api-key)"
        case ApiError():
            return EXIT_FAILED, f"the gateway refused: {error_line(error)}"
        case SubscribeRejected(code=code) if code == "session_not_found":
            return EXIT_FAILED, f"subscribe refused: {code}: {error.message}"
        case SubscribeRejected(code=code) | FrameRejected(code=code):
            return EXIT_USAGE, f"subscribe refused: {code}: {error.message}"
        case ClientError(code="gave_up"):
            return EXIT_FAILED, ""  # its line was said as it happened
    return EXIT_FAILED, error.message


# --- the command -----------------------------------------------------------------------


async def attach(
    base_url: str,
    session_id: str,
    *,
    filter: Any = "preset:chat",
    since: str | None = None,
    snapshot: bool = False,
    coalesce_ms: int | None = None,
    api_key: str | None = None,
    out: TextIO | None = None,
    err: TextIO | None = None,
    max_reconnects: int = 10,
    backoff: Backoff | None = None,
    keepalive_s: float = 30.0,
) -> int:
    """Print the session's stream until it ends for good (module docstring).

    Args:
        base_url: the gateway's ``http://HOST:PORT``.
        session_id: the session to attach to.
        filter: a preset name or a Filter as a dict (docs/protocol.md §3).
        since: resume after this event id.
        snapshot: start with a snapshot.
        coalesce_ms: the delta rollup window (docs/protocol.md §3 "Delta rollup");
            None: the gateway's ``[stream] coalesce_ms``.
        api_key: the Bearer key, when the gateway has ``api_keys``.
        out: where frames go, one JSON line each (stdout).
        err: where the one-line reports go (stderr).
        max_reconnects: attempts in a row without progress before giving up.
        backoff: the reconnect delays.
        keepalive_s: silence before attach pings, and again before it reconnects.

    Returns:
        The exit status (module docstring).
    """
    errors = err if err is not None else sys.stderr
    output = out if out is not None else sys.stdout

    def say(line: str) -> None:
        print(f"attach: {line}", file=errors, flush=True)

    try:
        client = GatewayClient(base_url, api_key=api_key)
    except ClientError as exc:
        say(f"--url {exc.message}")
        return EXIT_USAGE
    async with (
        client,
        client.subscribe(
            session_id,
            filter=filter,
            since=since,
            snapshot=snapshot,
            coalesce_ms=coalesce_ms,
            backoff=backoff or Backoff(),
            heartbeat=Heartbeat(keepalive_s, max_missed=1),
            max_reconnects=max_reconnects,
        ) as stream,
    ):
        try:
            async for item in stream:
                if isinstance(item, Notice):
                    say(item.message)
                else:
                    print(item.raw, file=output, flush=True)
        except GatewayError as exc:
            status, line = _exit_status(exc, session_id)
            if line:
                say(line)
            return status
    return EXIT_OK


def run(args: Any) -> int:
    """``gateway attach`` (the ``attach`` arguments of :mod:`gateway.cli`); the exit status."""
    filter_: Any = args.filter
    if filter_.startswith("{"):
        try:
            filter_ = json.loads(filter_)
        except ValueError as exc:
            print(f"attach: --filter is not JSON: {exc}", file=sys.stderr)
            return EXIT_USAGE
    interrupted = False

    async def main() -> int:
        nonlocal interrupted
        status = EXIT_INTERRUPTED
        with trio.open_signal_receiver(signal.SIGINT) as signals:
            async with trio.open_nursery() as nursery:

                async def on_interrupt() -> None:
                    nonlocal interrupted
                    async for _ in signals:
                        interrupted = True
                        nursery.cancel_scope.cancel()

                nursery.start_soon(on_interrupt, name="sigint")
                status = await attach(
                    args.url,
                    args.session_id,
                    filter=filter_,
                    since=args.since,
                    snapshot=args.snapshot,
                    coalesce_ms=args.coalesce_ms,
                    api_key=args.api_key,
                )
                nursery.cancel_scope.cancel()
        return status

    status = EXIT_INTERRUPTED
    try:
        status = trio.run(main)
    except* KeyboardInterrupt:  # before the signal receiver was in place
        interrupted = True
    except* BrokenPipeError:  # the reader went away (``gateway attach ... | head``)
        # Nothing to say, and nobody to say it to: stdout is pointed at /dev/null
        # so that the interpreter's last flush does not report the pipe either.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        status = EXIT_OK
    if interrupted:
        print("attach: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    return status

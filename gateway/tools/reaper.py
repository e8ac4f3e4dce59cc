"""The watchdog of a daemon's tool processes: it kills them when the daemon dies, kill -9 included.

docs/protocol.md §15 "What tools inherit": a tool process dies with the daemon.
One of these runs per daemon (gateway.tools.process), in a session of its own
(so a signal to a tool's group, or a terminal's Ctrl-C, never reaches it), as
``python -I -S reaper.py``: standard library only, nothing of the gateway
imported, so it starts in milliseconds and cannot be steered by the daemon's
environment or working directory.

It reads lines on stdin, whose other end only the daemon holds:

- ``+PGID``: a tool process group started; answered with the same line on
  stdout once registered (the daemon lets the group's command run only then);
- ``-PGID``: that group is gone (the daemon sends it only once every process
  of the group is dead, so a group id the kernel hands out again is never
  killed by mistake).

At end-of-file, which the kernel delivers whenever the daemon exits, however
it exits, it sends SIGKILL to every group still registered and exits 0.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys


def main() -> int:
    # The daemon's shutdown is end-of-file, not a signal; a terminal's signals are not for us.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    groups: set[int] = set()
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    for line in stdin:
        sign, digits = line[:1], line[1:].strip()
        if not digits.isdigit() or int(digits) <= 1:
            continue
        if sign == b"+":
            groups.add(int(digits))
            with contextlib.suppress(OSError):  # the daemon gone: end-of-file comes next
                stdout.write(b"+%d\n" % int(digits))
                stdout.flush()
        elif sign == b"-":
            groups.discard(int(digits))
    for pgid in groups:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
    return 0


if __name__ == "__main__":
    sys.exit(main())

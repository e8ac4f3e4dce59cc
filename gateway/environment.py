"""The daemon's environment: read once at start, then its secrets taken out (docs/protocol.md §15).

``gateway serve`` reads its config (``GATEWAY_*``), its provider keys
(``ANTHROPIC_API_KEY``, ``OPENAI_API_KEY``) and its tracing settings
(``OTEL_*``) from the environment it started with. A tool process gets a
minimal environment of its own (gateway.tools.process), but the daemon's
stays readable in ``/proc/<pid>/environ`` to whoever may read the daemon's
memory: ``PR_SET_DUMPABLE`` keeps other processes of its user out, never
root (``CAP_SYS_PTRACE``), and a daemon running as root runs its tools as
root. So, once everything is read (:func:`capture`, then :func:`scrub`):

- A copy of the whole environment as it started is kept in memory
  (:func:`daemon_env`): what reads a variable later (a Claude Code agent's
  ``ANTHROPIC_API_KEY``, a provider built at its first use, the OTLP
  exporter's headers) reads it there.
- Every *secret* variable (:func:`is_secret`) is taken out of the process's
  environment (``os.environ``, hence ``unsetenv``: nothing started later
  inherits it), and its bytes in the environment block the process started
  with, which is what ``/proc/<pid>/environ`` shows and ``unsetenv`` never
  touches, are overwritten with NULs (found from ``env_start`` and
  ``env_end`` of ``/proc/self/stat``, Linux only). ``ps e`` and a tool
  reading ``/proc/$PPID/environ`` then find none.

A secret is any ``GATEWAY_*`` variable (the config overrides: API keys, a
Redis URL's password), any whose name holds ``KEY``, ``TOKEN``, ``SECRET``,
``PASSWORD``, ``PASSWD``, ``CREDENTIAL``, ``AUTH`` or ends in ``HEADERS``
(``OTEL_EXPORTER_OTLP_HEADERS``), any with ``PAT``, ``PASS``, ``PWD``, ``DSN``
or ``WEBHOOK`` as a whole ``_``-separated part (``GITHUB_PAT``,
``SLACK_WEBHOOK_URL``; not ``PATH``), and any whose value is a URL with a
password (``scheme://user:pass@``), but a proxy's (``*_PROXY``: the HTTP
clients the daemon makes later read it).
"""

from __future__ import annotations

import ctypes
import logging
import os
import re
import sys
from collections.abc import Mapping

from gateway.logs import event

log = logging.getLogger("gateway")

_WORDS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "AUTH")
_SHORT_WORDS = frozenset({"PAT", "PASS", "PWD", "DSN", "WEBHOOK", "WEBHOOKS"})
"""Words that name a secret as a whole part of a name (``GITHUB_PAT``, ``SMTP_PASS``,
``MYSQL_PWD``, ``SENTRY_DSN``, ``SLACK_WEBHOOK_URL``), never inside one (``PATH``)."""
_NOT_SECRETS = frozenset({"PWD", "OLDPWD"})  # the shell's working directories
_URL_PASSWORD = re.compile(r"://[^/@\s]*:[^/@\s]*@")

_captured: dict[str, str] | None = None


def is_secret(name: str, value: str) -> bool:
    """Whether the variable is one :func:`scrub` takes out (module docstring)."""
    upper = name.upper()
    if upper.startswith("GATEWAY_") or upper.endswith("HEADERS"):
        return True
    if any(word in upper for word in _WORDS):
        return True
    if upper not in _NOT_SECRETS and _SHORT_WORDS.intersection(upper.split("_")):
        return True
    return not upper.endswith("_PROXY") and _URL_PASSWORD.search(value) is not None


def capture() -> dict[str, str]:
    """Keep a copy of the environment as the daemon started with it; that copy."""
    global _captured
    if _captured is None:
        _captured = dict(os.environ)
    return _captured


def daemon_env() -> Mapping[str, str]:
    """The daemon's environment as it started (:func:`capture`), else the process's own."""
    return os.environ if _captured is None else _captured


def scrub() -> list[str]:
    """Take every secret out of the process's environment (module docstring); their names.

    Call :func:`capture` first. Where the start's environment block cannot
    be overwritten (not Linux, no ``/proc``), ``tool_environment_readable``
    is logged: ``/proc/<pid>/environ`` still shows what the daemon started with.
    """
    names = sorted(name for name, value in os.environ.items() if is_secret(name, value))
    for name in names:
        del os.environ[name]  # unsetenv: out of the C environment too
    if names and sys.platform.startswith("linux"):
        try:
            _blank_start_block(names)
        except (OSError, ValueError, IndexError) as exc:
            event(
                log, logging.WARNING, "tool_environment_readable",
                f"the environment the daemon started with could not be overwritten ({exc}):"
                f" /proc/{os.getpid()}/environ still shows {', '.join(names)}",
            )  # fmt: skip
    return names


def _blank_start_block(names: list[str]) -> None:
    """Overwrite each ``NAME=value`` of ``names`` in the start's environment block with NULs.

    No pointer of the C environment points there any more (``unsetenv`` took
    them out); the block is the top of the main thread's stack, writable.
    """
    with open("/proc/self/stat", "rb") as f:
        stat = f.read()
    fields = stat[stat.rindex(b")") + 2 :].split()  # from field 3, the state (proc(5))
    start, end = int(fields[47]), int(fields[48])  # fields 50 and 51: env_start, env_end
    with open("/proc/self/environ", "rb") as f:
        block = f.read()
    if len(block) != end - start:
        raise ValueError(f"/proc/self/environ holds {len(block)} bytes, not {end - start}")
    wanted = {name.encode() for name in names}
    offset = 0
    for entry in block.split(b"\0"):
        if entry.partition(b"=")[0] in wanted:
            ctypes.memset(start + offset, 0, len(entry))
        offset += len(entry) + 1

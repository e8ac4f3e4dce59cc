"""The daemon's log: one line per lifecycle event, as text or JSON (docs/reference.md ``[log]``).

Everything logs through the standard library's :mod:`logging` (loggers under
``gateway``); this module decides what a line looks like and gives the
gateway one way to log an *event*:

    event(log, logging.INFO, "turn_ended", "turn ended",
          session_id=sid, turn_id=tid, duration_ms=812, stop_reason="end_turn")

The event's name is a short, stable snake_case word (``session_created``,
``turn_started``, ``turn_ended``, ``client_attached``, ``client_subscribed``,
``client_closed``, ``slow_client_closed``, ``provider_error``, ``tool_failed``,
``store_flush_slow``, ``session_failed``, ...: docs/operating.md "Logs" lists them
all); its fields travel in ``extra={"event": ..., "fields": {...}}`` (one key,
so that no field name can collide with a ``LogRecord`` attribute).

Two formats, chosen by ``[log] format``:

- ``text`` (the default, for a terminal): ``TIME LEVEL LOGGER: message``, then
  in brackets the event's name and its fields as ``key=value``, then a
  traceback if there is one;
- ``json``: one JSON object a line (encoded by msgspec) with ``ts`` (RFC 3339,
  UTC, milliseconds), ``level``, ``event``, ``logger``, ``message``, the
  event's fields (``session_id``, ``turn_id``, ``client``, ``code``, ...) and,
  for a failure, ``exc`` (the traceback). A line from a library that knows
  nothing of events gets ``event: "log"``.

:func:`configure` installs the one handler (on stderr) and the root level,
once, where the daemon starts (:func:`gateway.app.serve`), and
:func:`stop` ends it when the daemon does.

The daemon's handler never blocks (:class:`QueuedHandler`): it formats the
line and puts it on a bounded queue (``[log] queue_lines``) that one thread,
``log-writer``, writes to stderr. A reader of stderr that stalls (a full pipe)
then blocks that thread only; once the queue is full, lines are dropped and
counted (``gateway_log_lines_dropped_total``), and the first line the writer
gets out after drops is a ``log_lines_dropped`` record saying how many. Lines
are formatted when logged, on the logging thread, not by the writer: a record
holds live objects (the event's fields, an exception and its frames) that the
writer would otherwise read later and from another thread, while a string is
immutable and is what the bound counts; with one interpreter lock, formatting
on the writer would save the Trio thread nothing. A line dropped because the
queue is full is not formatted at all.
"""

from __future__ import annotations

import logging
import os
import queue
import sys
import threading
import time
from collections.abc import Callable
from typing import IO, Any, Final

import msgspec

from gateway.config import LogConfig
from gateway.metrics import LOG_LINES_DROPPED

GENERIC_EVENT: Final = "log"
"""The ``event`` of a line that did not name one (a library's, or a stray call)."""

SLOW_FLUSH_S: Final = 0.1
"""A store flush slower than this is logged (``store_flush_slow``)."""

STOP_TIMEOUT_S: Final = 2.0
"""How long :func:`stop` waits for the writer to get the queued lines out."""

_BATCH_LINES: Final = 64  # lines the writer joins into one write

_LEVELS: Final = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}

# The keys a JSON line starts with; an event field of the same name is dropped
# rather than allowed to overwrite them.
_RESERVED: Final = frozenset({"ts", "level", "event", "logger", "message", "exc"})


def event(
    logger: logging.Logger,
    level: int,
    name: str,
    message: str,
    /,
    *,
    exc_info: BaseException | None = None,
    **fields: Any,
) -> None:
    """Log the event ``name`` as one line, with its fields (module docstring).

    Args:
        logger: a ``gateway.*`` logger.
        level: a :mod:`logging` level.
        name: the event's stable snake_case name.
        message: a short human sentence (the text format's body).
        exc_info: the exception whose traceback goes with the line (``exc``).
        fields: the event's fields; ``None`` values are left out. (The four
            arguments above are positional-only, so a field may be called
            ``level`` or ``name``; the JSON line's own keys win over a field.)
    """
    if logger.isEnabledFor(level):
        logger.log(
            level,
            message,
            exc_info=exc_info,
            extra={"event": name, "fields": {k: v for k, v in fields.items() if v is not None}},
        )


def client_label(name: str, address: str = "") -> str:
    """The ``client`` field: the connection's name and, where known, its address."""
    return f"{name} {address}" if address else name


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    fields: dict[str, Any] | None = getattr(record, "fields", None)
    return fields or {}


def rfc3339(created: float) -> str:
    """``created`` (a Unix time) as RFC 3339 in UTC, to the millisecond."""
    seconds = int(created)
    millis = int((created - seconds) * 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{millis:03d}Z"


class JsonFormatter(logging.Formatter):
    """One JSON object a line (module docstring); never raises on an odd field value."""

    def __init__(self) -> None:
        super().__init__()
        self._encoder = msgspec.json.Encoder(enc_hook=repr)

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": rfc3339(record.created),
            "level": record.levelname.lower(),
            "event": getattr(record, "event", GENERIC_EVENT),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in _fields(record).items():
            if key not in _RESERVED:
                line[key] = value
        if record.exc_info and record.exc_info[0] is not None:
            line["exc"] = self.formatException(record.exc_info)
        elif record.stack_info:
            line["exc"] = self.formatStack(record.stack_info)
        return self._encoder.encode(line).decode()


class TextFormatter(logging.Formatter):
    """A readable line for a terminal: the message, then the event's fields as ``key=value``."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def formatMessage(self, record: logging.LogRecord) -> str:
        line = super().formatMessage(record)
        name: str | None = getattr(record, "event", None)
        fields = _fields(record)
        if name is not None or fields:
            parts = [name] if name is not None else []
            parts += [f"{k}={_text(v)}" for k, v in fields.items()]
            line += " [" + " ".join(parts) + "]"
        return line


def _text(value: Any) -> str:
    text = value if isinstance(value, str) else repr(value)
    return repr(text) if (not text or " " in text or "=" in text) else text


def json_line(level: int, name: str, message: str, /, **fields: Any) -> str:
    """The JSON line the log would write for the event ``name``, without logging it.

    For what the daemon writes outside the log, so that under ``[log] format =
    "json"`` every line it writes is JSON (docs/reference.md ``[log]``): the
    listening line (then the ``gateway_started`` record, on stdout) and a
    start-up failure (``startup_failed``, on stderr).
    """
    record = logging.getLogger("gateway").makeRecord(
        "gateway", level, "", 0, message, (), None, extra={"event": name, "fields": fields}
    )
    return JsonFormatter().format(record)


class QueuedHandler(logging.Handler):
    """A handler that never blocks: a bounded queue of lines and one writer thread.

    :meth:`emit` formats the record and puts the line on the queue without
    waiting; a full queue drops it and counts it (``gateway_log_lines_dropped_total``
    and the next ``log_lines_dropped`` record, module docstring). The
    ``log-writer`` thread runs from :meth:`start` to :meth:`stop`. (The
    standard library's QueueListener would wait without bound, on a full queue
    and in its join, for a reader that never comes back.)

    Args:
        write: writes one chunk of whole lines, blocking as long as the reader
            makes it; an OSError drops the chunk's lines (counted).
        capacity: the queue's bound, in lines.
    """

    def __init__(self, write: Callable[[str], None], capacity: int) -> None:
        super().__init__()
        self._write = write
        self._queue: queue.Queue[str | None] = queue.Queue(capacity)
        self._lock_drops = threading.Lock()
        self._unreported = 0  # dropped since the last log_lines_dropped record
        self._thread = threading.Thread(target=self._run, name="log-writer", daemon=True)

    def emit(self, record: logging.LogRecord) -> None:
        if self._queue.full():  # cheap: no formatting for a line that cannot be kept
            self._dropped(1)
            return
        try:
            line = self.format(record)
        except Exception:
            self.handleError(record)
            return
        try:
            self._queue.put_nowait(line)
        except queue.Full:  # another thread filled the last slot meanwhile
            self._dropped(1)

    def _dropped(self, n: int) -> None:
        LOG_LINES_DROPPED.add(n)
        with self._lock_drops:
            self._unreported += n

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> bool:
        """Stop taking lines, let the writer write what is queued, for at most ``timeout``.

        Returns:
            Whether the writer finished; if not (the reader still stalls), it is
            left behind, a daemon thread that does not hold the process up.
        """
        deadline = time.monotonic() + timeout
        try:  # the end mark needs a slot: a writer that is moving frees one
            self._queue.put(None, timeout=timeout)
        except queue.Full:
            return False
        self._thread.join(max(0.0, deadline - time.monotonic()))
        return not self._thread.is_alive()

    def _run(self) -> None:
        while True:
            lines: list[str] = []
            item = self._queue.get()
            while item is not None:
                lines.append(item)
                if len(lines) == _BATCH_LINES:
                    break
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
            if lines:
                self._out(lines)
            if item is None:
                return

    def _out(self, lines: list[str]) -> None:
        with self._lock_drops:
            n, self._unreported = self._unreported, 0
        if n:  # the reader took what was waiting: say first what it lost
            lines = [self._report(n), *lines]
        try:
            self._write("".join(line + "\n" for line in lines))
        except OSError:  # stderr closed under the daemon: nothing to tell, only to count
            LOG_LINES_DROPPED.add(len(lines) - (1 if n else 0))

    def _report(self, n: int) -> str:
        record = logging.getLogger(__name__).makeRecord(
            __name__, logging.WARNING, "", 0,
            f"{n} log lines dropped: the log's reader fell behind", (), None,
            extra={"event": "log_lines_dropped",
                   "fields": {"dropped": n, "dropped_total": LOG_LINES_DROPPED.total}},
        )  # fmt: skip
        return self.format(record)


def _stream_writer(stream: IO[str]) -> Callable[[str], None]:
    """Where the writer's lines go: stderr's descriptor itself where it has one.

    Writing to the descriptor keeps the text stream's lock out of it: a daemon
    thread left blocked in ``sys.stderr.write`` would hold that lock at exit.
    """
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):
        fd = -1
    if fd < 0:

        def write_stream(text: str) -> None:
            stream.write(text)
            stream.flush()

        return write_stream

    def write_fd(text: str) -> None:
        data = memoryview(text.encode("utf-8", "backslashreplace"))
        while data:
            data = data[os.write(fd, data) :]

    return write_fd


_handler: logging.Handler | None = None


def configure(
    config: LogConfig, stream: IO[str] | None = None, *, queued: bool | None = None
) -> logging.Handler:
    """Install the log's one handler on the root logger, for ``[log] format`` and ``level``.

    Called once where the daemon starts; calling it again replaces the handler
    it installed before (the tests configure several formats in one process).

    Args:
        config: ``[log]``.
        stream: where lines go (default: stderr).
        queued: a :class:`QueuedHandler` and its writer thread (the daemon's
            log, to be ended by :func:`stop`) or a plain synchronous handler;
            by default queued for stderr and synchronous for a given stream
            (the tests read theirs at once).

    Returns:
        The installed handler.

    Raises:
        ValueError: a format or level that ``[log]`` does not allow (the config
            loader already refuses those; this names them for a direct caller).
    """
    global _handler
    if config.format not in ("text", "json"):
        raise ValueError(f"[log] format must be 'text' or 'json', not {config.format!r}")
    if config.level not in _LEVELS:
        raise ValueError(f"[log] level must be one of {', '.join(_LEVELS)}, not {config.level!r}")
    out = stream if stream is not None else sys.stderr
    handler: logging.Handler
    if queued if queued is not None else stream is None:
        handler = QueuedHandler(_stream_writer(out), config.queue_lines)
    else:
        handler = logging.StreamHandler(out)
    handler.setFormatter(JsonFormatter() if config.format == "json" else TextFormatter())
    stop()
    if isinstance(handler, QueuedHandler):
        handler.start()
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(_LEVELS[config.level])
    _handler = handler
    return handler


def stop(timeout: float = STOP_TIMEOUT_S) -> None:
    """Remove the handler :func:`configure` installed; a queued one's lines are written first.

    The writer gets ``timeout`` to write what is queued (a reader that still
    stalls loses the rest). Where the daemon ends (:func:`gateway.app.serve`),
    on a start-up failure too.
    """
    global _handler
    handler, _handler = _handler, None
    if handler is None:
        return
    logging.getLogger().removeHandler(handler)
    if isinstance(handler, QueuedHandler):
        handler.stop(timeout)


__all__ = [
    "GENERIC_EVENT",
    "SLOW_FLUSH_S",
    "STOP_TIMEOUT_S",
    "JsonFormatter",
    "QueuedHandler",
    "TextFormatter",
    "client_label",
    "configure",
    "event",
    "json_line",
    "rfc3339",
    "stop",
]

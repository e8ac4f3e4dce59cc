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
once, where the daemon starts (:func:`gateway.server.app.serve`).
"""

from __future__ import annotations

import logging
import sys
import time
from typing import IO, Any, Final

import msgspec

from gateway.config import LogConfig

GENERIC_EVENT: Final = "log"
"""The ``event`` of a line that did not name one (a library's, or a stray call)."""

SLOW_FLUSH_S: Final = 0.1
"""A store flush slower than this is logged (``store_flush_slow``)."""

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


_handler: logging.Handler | None = None


def configure(config: LogConfig, stream: IO[str] | None = None) -> logging.Handler:
    """Install the log's one handler on the root logger, for ``[log] format`` and ``level``.

    Called once where the daemon starts; calling it again replaces the handler
    it installed before (the tests configure several formats in one process).

    Args:
        config: ``[log]``.
        stream: where lines go (default: stderr).

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
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonFormatter() if config.format == "json" else TextFormatter())
    root = logging.getLogger()
    if _handler is not None:
        root.removeHandler(_handler)
    root.addHandler(handler)
    root.setLevel(_LEVELS[config.level])
    _handler = handler
    return handler


__all__ = [
    "GENERIC_EVENT",
    "SLOW_FLUSH_S",
    "JsonFormatter",
    "TextFormatter",
    "client_label",
    "configure",
    "event",
    "json_line",
    "rfc3339",
]

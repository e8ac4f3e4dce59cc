"""Identifiers (docs/protocol.md §1).

Session, turn, message and tool-use ids are random and opaque. Event ids are
``evt_`` plus a fixed-width zero-padded decimal sequence, so that they compare
correctly as plain strings; the sequence itself lives in
:class:`gateway.session.sequencer.EventSequencer`.
"""

from __future__ import annotations

import secrets
import time

EVENT_ID_PREFIX = "evt_"
EVENT_ID_DIGITS = 20  # wide enough for any 64-bit sequence number


def _random_id(prefix: str) -> str:
    return f"{prefix}{secrets.token_hex(10)}"


def new_session_id() -> str:
    return _random_id("sess_")


def new_turn_id() -> str:
    return _random_id("turn_")


def new_message_id() -> str:
    return _random_id("msg_")


def new_tool_use_id() -> str:
    return _random_id("tu_")


def new_call_id() -> str:
    return _random_id("call_")


def new_perm_id() -> str:
    return _random_id("perm_")


def new_attach_token() -> str:
    return f"atk_{secrets.token_urlsafe(24)}"


def format_event_id(seq: int) -> str:
    """``42`` -> ``evt_00000000000000000042``."""
    return f"{EVENT_ID_PREFIX}{seq:0{EVENT_ID_DIGITS}d}"


def parse_event_id(event_id: str) -> int | None:
    """The sequence number of a well-formed event id, else ``None``."""
    digits = event_id[len(EVENT_ID_PREFIX) :]
    if (
        not event_id.startswith(EVENT_ID_PREFIX)
        or len(digits) != EVENT_ID_DIGITS
        or not digits.isascii()
        or not digits.isdigit()
    ):
        return None
    return int(digits)


def now_ms() -> int:
    """Wall-clock milliseconds since the epoch (the envelope's ``ts``)."""
    return time.time_ns() // 1_000_000

"""Identifiers (docs/protocol.md §1).

Session, turn, message and tool-use ids are random and opaque. Event ids are
``evt_`` plus a fixed-width zero-padded decimal sequence, so that they compare
correctly as plain strings; the sequence itself lives in
:class:`gateway.session.sequencer.EventSequencer`.
"""

from __future__ import annotations

import hashlib
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


def message_id_of(turn_id: str) -> str:
    """The id of the user message a turn was submitted with: ``msg_`` and the turn id's
    suffix, so a retry of its request finds it whether it started, was queued or was
    steered into another turn (docs/protocol.md §2 "A busy session")."""
    return "msg_" + turn_id.removeprefix("turn_")


def new_tool_use_id() -> str:
    return _random_id("tu_")


def new_call_id() -> str:
    return _random_id("call_")


def new_perm_id(tool_use_id: str) -> str:
    """A permission request's id: ``perm_``, 8 hex digits of its tool use's id, 12 random.

    The tool use's part lets a session loaded afresh (after an unload or a
    restart), which holds only the requests still pending, tell an answer to
    a request it asked before from an id it never issued (docs/protocol.md §13).
    """
    return f"perm_{_tool_part(tool_use_id)}{secrets.token_hex(6)}"


def asked_for(perm_id: str, tool_use_id: str) -> bool:
    """Whether ``perm_id`` could be a request of the tool use ``tool_use_id``."""
    return len(perm_id) == 25 and perm_id.startswith("perm_" + _tool_part(tool_use_id))


def _tool_part(tool_use_id: str) -> str:
    return hashlib.blake2b(tool_use_id.encode(), digest_size=4).hexdigest()


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


def file_id_of(sha256: str) -> str:
    """A file's id: ``file_`` and the first 32 hex digits of its SHA-256, so the same bytes
    are one file of a session however often they are sent (docs/protocol.md §2 "Files")."""
    return "file_" + sha256[:32]

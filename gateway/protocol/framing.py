"""WebSocket text frames, built once and shared by every client (docs/protocol.md §3).

The gateway frames each event once, at emission, and every connection writes
those same bytes: the fan-out never frames per client. This is the sans-IO
half of the server's WebSocket (:mod:`gateway.http.websocket` owns the
socket and the rest of RFC 6455 through wsproto).
"""

from __future__ import annotations

import struct

_LENGTH_7 = struct.Struct("!BB")
_LENGTH_16 = struct.Struct("!BBH")
_LENGTH_64 = struct.Struct("!BBQ")
_FIN_TEXT = 0x81  # FIN bit | opcode 1 (text)


def text_frame(payload: bytes) -> bytes:
    """A complete unmasked server-to-client text frame around ``payload`` (RFC 6455 section 5.2).

    Built once per event and shared by every connection (no per-client framing).

    Args:
        payload: UTF-8 text, typically one JSON server frame (docs/protocol.md §3).

    Returns:
        FIN + opcode 1, the 7, 16 or 64-bit length, then ``payload``.
    """
    size = len(payload)
    if size < 126:
        header = _LENGTH_7.pack(_FIN_TEXT, size)
    elif size < 65536:
        header = _LENGTH_16.pack(_FIN_TEXT, 126, size)
    else:
        header = _LENGTH_64.pack(_FIN_TEXT, 127, size)
    return header + payload


_EVENT_FRAME_HEAD = b'{"type":"event","event":'


def event_frame(data: bytes) -> bytes:
    """The WebSocket frame of ``EventFrame(event)`` around the event's encoded JSON.

    Spliced rather than re-encoded: the event's bytes are the ones the store
    keeps, and a replay wraps them the same way (tests/unit/session/test_fanout.py checks
    the splice decodes to the ``EventFrame`` it stands for).
    """
    return text_frame(_EVENT_FRAME_HEAD + data + b"}")

"""WebSocket frames, both directions, and the close codes (docs/protocol.md §3).

Client frames are decoded in two steps so that the error names the problem:
a frame that is not a JSON object with a string ``type`` is ``invalid_frame``;
an unknown ``type`` is ``unknown_frame_type``; a known frame that fails its
schema is ``invalid_frame`` with msgspec's description of the field at fault.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from gateway.errors import FrameRejected
from gateway.protocol.events import Event
from gateway.protocol.filters import Filter
from gateway.protocol.shapes import PROTOCOL_VERSION, Message, SessionSummary

# --- client -> server --------------------------------------------------------

MAX_COALESCE_MS = 250
"""The longest delta rollup window a subscription may ask for (docs/protocol.md §3)."""


class Subscribe(msgspec.Struct, tag="subscribe", tag_field="type", forbid_unknown_fields=True):
    filter: Filter | str
    since: str | None = None
    snapshot: bool = False
    # docs/protocol.md §3 "Delta rollup": None = the server's [stream] coalesce_ms.
    coalesce_ms: Annotated[int, msgspec.Meta(ge=0, le=MAX_COALESCE_MS)] | None = None


class Cancel(msgspec.Struct, tag="cancel", tag_field="type", forbid_unknown_fields=True):
    turn_id: str
    reason: str | None = None


class Ping(msgspec.Struct, tag="ping", tag_field="type", forbid_unknown_fields=True):
    nonce: str


class Pong(msgspec.Struct, tag="pong", tag_field="type", forbid_unknown_fields=True):
    nonce: str


ClientFrame = Subscribe | Cancel | Ping | Pong

# --- server -> client --------------------------------------------------------


class SubscribeAck(msgspec.Struct, tag="subscribe_ack", tag_field="type"):
    resolved_filter: Filter
    since: str | None
    snapshot: bool
    replay_event_count: int
    # docs/protocol.md §4: 1; it changes only with a change that could break a client.
    protocol_version: int = PROTOCOL_VERSION


SubscribeErrorCode = Literal[
    "session_not_found", "cursor_expired", "replay_too_large", "invalid_filter", "invalid_request"
]


class SubscribeError(msgspec.Struct, tag="subscribe_error", tag_field="type"):
    code: SubscribeErrorCode
    message: str


class Snapshot(msgspec.Struct, tag="snapshot", tag_field="type"):
    session: SessionSummary
    messages: list[Message]
    snapshot_at_event_id: str | None
    # True when the session has messages older than the first one sent, left
    # out by ``snapshot_messages`` or by ``snapshot_max_bytes`` alike: page
    # them with ``GET .../messages?before=<messages[0].id>`` (docs/protocol.md §15).
    has_more: bool = False


class EventFrame(msgspec.Struct, tag="event", tag_field="type"):
    event: Event


ErrorCode = Literal[
    "invalid_frame",
    "unknown_frame_type",
    "already_subscribed",
    "subscribe_required",
    "turn_not_found",
    "turn_not_in_flight",
]


class ErrorFrame(msgspec.Struct, tag="error", tag_field="type"):
    code: str
    message: str


ServerFrame = SubscribeAck | SubscribeError | Snapshot | EventFrame | Ping | Pong | ErrorFrame


# --- codec -------------------------------------------------------------------

_encoder = msgspec.json.Encoder()
encode = _encoder.encode


class _Typed(msgspec.Struct):
    type: str


_type_decoder = msgspec.json.Decoder(_Typed)
_frame_decoders: dict[str, msgspec.json.Decoder[Any]] = {
    "subscribe": msgspec.json.Decoder(Subscribe),
    "cancel": msgspec.json.Decoder(Cancel),
    "ping": msgspec.json.Decoder(Ping),
    "pong": msgspec.json.Decoder(Pong),
}


def decode_client_frame(data: bytes | str) -> ClientFrame:
    """Decode one client frame.

    Raises:
        FrameRejected: ``invalid_frame`` (not JSON, nested too deeply to
            decode, not an object with a string ``type``, or a known frame
            failing its schema, unknown fields included; the message names the
            field) or ``unknown_frame_type``. Never anything else, whatever
            ``data`` is (docs/protocol.md §3: the socket stays open).
    """
    try:
        kind = _type_decoder.decode(data).type
    except msgspec.ValidationError as exc:
        raise FrameRejected(
            "invalid_frame", f"frame must be a JSON object with a string 'type': {exc}"
        ) from None
    except msgspec.DecodeError as exc:
        raise FrameRejected("invalid_frame", f"frame is not valid JSON: {exc}") from None
    except RecursionError:
        raise FrameRejected("invalid_frame", _TOO_DEEP) from None
    decoder = _frame_decoders.get(kind)
    if decoder is None:
        raise FrameRejected(
            "unknown_frame_type",
            f"unknown frame type {kind!r}; expected one of {', '.join(_frame_decoders)}",
        )
    try:
        frame: ClientFrame = decoder.decode(data)
    except msgspec.ValidationError as exc:
        raise FrameRejected("invalid_frame", f"invalid {kind!r} frame: {exc}") from None
    except RecursionError:
        raise FrameRejected("invalid_frame", _TOO_DEEP) from None
    return frame


_TOO_DEEP = "frame is nested too deeply to decode"

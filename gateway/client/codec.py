"""Decoding server frames into typed objects, on the client side (docs/protocol.md sections 3-5).

An ``event`` frame is decoded in two steps: the envelope first, with its
``payload`` kept as :class:`msgspec.Raw`, then the payload with the decoder of
its type's payload struct (:data:`gateway.protocol.events.EVENT_TYPES`), built
once per type. An event type this client does not know (a newer server) is not
an error: its payload stays a plain ``dict`` so the caller can skip it, as
docs/protocol.md §4 asks ("clients skip event types they do not know").
"""

from __future__ import annotations

from typing import Any, get_args

import msgspec

from gateway.errors import FrameRejected
from gateway.protocol.events import EVENT_TYPES, Envelope, Event
from gateway.protocol.frames import (
    ErrorFrame,
    EventFrame,
    Ping,
    Pong,
    ServerFrame,
    Snapshot,
    SubscribeAck,
    SubscribeError,
)


class _WireEventFrame(msgspec.Struct, tag="event", tag_field="type"):
    event: Envelope[msgspec.Raw]  # the payload not yet decoded


class _Typed(msgspec.Struct):
    type: str


_WireFrame = SubscribeAck | SubscribeError | Snapshot | _WireEventFrame | Ping | Pong | ErrorFrame

_frame_decoder: msgspec.json.Decoder[_WireFrame] = msgspec.json.Decoder(_WireFrame)
_type_decoder = msgspec.json.Decoder(_Typed)
_payload_decoders: dict[str, msgspec.json.Decoder[Any]] = {
    type_: msgspec.json.Decoder(spec.payload) for type_, spec in EVENT_TYPES.items()
}
_unknown_payload_decoder = msgspec.json.Decoder(dict[str, Any])
_FRAME_TYPES = tuple(str(cls.__struct_config__.tag) for cls in get_args(_WireFrame))


def decode_server_frame(data: bytes | str) -> ServerFrame:
    """Decode one server frame; an ``event`` frame's payload is its type's struct.

    Args:
        data: the text of one WebSocket frame.

    Returns:
        The frame struct of :data:`gateway.protocol.frames.ServerFrame`. For an
        event of an unknown type, ``event.payload`` is a ``dict``.

    Raises:
        FrameRejected: ``invalid_frame`` (not JSON, or a frame or a known
            event's payload failing its schema; the message names the field),
            or ``unknown_frame_type`` for a frame ``type`` this client does not
            know, the same split as the server makes for client frames.
    """
    try:
        frame = _frame_decoder.decode(data)
    except msgspec.ValidationError as exc:
        raise _rejection(data, exc) from None
    except msgspec.DecodeError as exc:
        raise FrameRejected("invalid_frame", f"frame is not valid JSON: {exc}") from None
    if isinstance(frame, _WireEventFrame):
        return EventFrame(_decode_event(frame.event))
    return frame


def _decode_event(wire: Envelope[msgspec.Raw]) -> Event:
    decoder = _payload_decoders.get(wire.type, _unknown_payload_decoder)
    try:
        payload = decoder.decode(wire.payload)
    except msgspec.ValidationError as exc:
        raise FrameRejected(
            "invalid_frame", f"invalid payload for event {wire.type!r} ({wire.id}): {exc}"
        ) from None
    return Event(
        id=wire.id,
        type=wire.type,
        session_id=wire.session_id,
        turn_id=wire.turn_id,
        ts=wire.ts,
        actor=wire.actor,
        payload=payload,
    )


def _rejection(data: bytes | str, exc: msgspec.ValidationError) -> FrameRejected:
    """Name a schema failure: an unknown frame ``type``, or the field at fault."""
    try:
        kind = _type_decoder.decode(data).type
    except msgspec.ValidationError:
        return FrameRejected(
            "invalid_frame", f"frame must be a JSON object with a string 'type': {exc}"
        )
    if kind not in _FRAME_TYPES:
        return FrameRejected(
            "unknown_frame_type",
            f"unknown frame type {kind!r}; expected one of {', '.join(_FRAME_TYPES)}",
        )
    return FrameRejected("invalid_frame", f"invalid {kind!r} frame: {exc}")

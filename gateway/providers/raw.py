"""Anthropic-shaped raw stream events: the translator's one input language.

These mirror the Messages API streaming events (``message_start``,
``content_block_start``/``_delta``/``_stop``, ``message_delta``,
``message_stop``, ``ping``, ``error``) field for field, so that the Anthropic
provider converts the SDK's events with ``msgspec.convert(event.model_dump(),
RawEvent)`` and every other provider (the scripted model, the OpenAI-compatible
adapter) produces exactly what the API would have sent.
"""

from __future__ import annotations

from typing import Any

import msgspec

# --- content blocks as they open (content_block_start.content_block) ---------


class RawTextBlock(msgspec.Struct, tag="text", tag_field="type"):
    text: str = ""


class RawThinkingBlock(msgspec.Struct, tag="thinking", tag_field="type"):
    thinking: str = ""
    signature: str | None = None


class RawRedactedThinkingBlock(msgspec.Struct, tag="redacted_thinking", tag_field="type"):
    data: str


class RawToolUseBlock(msgspec.Struct, tag="tool_use", tag_field="type"):
    id: str
    name: str
    input: dict[str, Any] = {}


RawContentBlock = RawTextBlock | RawThinkingBlock | RawRedactedThinkingBlock | RawToolUseBlock

# --- deltas (content_block_delta.delta) ---------------------------------------


class RawTextDelta(msgspec.Struct, tag="text_delta", tag_field="type"):
    text: str


class RawThinkingDelta(msgspec.Struct, tag="thinking_delta", tag_field="type"):
    thinking: str


class RawSignatureDelta(msgspec.Struct, tag="signature_delta", tag_field="type"):
    signature: str


class RawInputJsonDelta(msgspec.Struct, tag="input_json_delta", tag_field="type"):
    partial_json: str


RawDelta = RawTextDelta | RawThinkingDelta | RawSignatureDelta | RawInputJsonDelta

# --- events -------------------------------------------------------------------


class RawUsage(msgspec.Struct):
    input_tokens: int | None = None
    output_tokens: int | None = None
    cache_read_input_tokens: int | None = None
    cache_creation_input_tokens: int | None = None


class RawMessage(msgspec.Struct):
    """``message_start.message``: the id, the model and the opening usage."""

    id: str
    model: str
    role: str = "assistant"
    usage: RawUsage = msgspec.field(default_factory=RawUsage)


class RawMessageStart(msgspec.Struct, tag="message_start", tag_field="type"):
    message: RawMessage


class RawContentBlockStart(msgspec.Struct, tag="content_block_start", tag_field="type"):
    index: int
    content_block: RawContentBlock


class RawContentBlockDelta(msgspec.Struct, tag="content_block_delta", tag_field="type"):
    index: int
    delta: RawDelta


class RawContentBlockStop(msgspec.Struct, tag="content_block_stop", tag_field="type"):
    index: int


class RawMessageDeltaBody(msgspec.Struct):
    stop_reason: str | None = None
    stop_sequence: str | None = None


class RawMessageDelta(msgspec.Struct, tag="message_delta", tag_field="type"):
    delta: RawMessageDeltaBody
    usage: RawUsage = msgspec.field(default_factory=RawUsage)


class RawMessageStop(msgspec.Struct, tag="message_stop", tag_field="type"):
    pass


class RawPing(msgspec.Struct, tag="ping", tag_field="type"):
    pass


class RawErrorBody(msgspec.Struct):
    type: str
    message: str


class RawError(msgspec.Struct, tag="error", tag_field="type"):
    """An ``error`` event mid-stream, e.g. ``{"type": "overloaded_error", ...}``."""

    error: RawErrorBody


RawEvent = (
    RawMessageStart
    | RawContentBlockStart
    | RawContentBlockDelta
    | RawContentBlockStop
    | RawMessageDelta
    | RawMessageStop
    | RawPing
    | RawError
)

# --- a message's frame, for the providers that write these events themselves ------
#
# The scripted model and the OpenAI-compatible adapter open, end and fail a
# message the same way (and the Anthropic provider fails one as they do): these
# say it once.


def message_start(message_id: str, model: str, input_tokens: int | None = None) -> RawMessageStart:
    """``message_start``, naming the message and the model, with the input usage if known."""
    return RawMessageStart(RawMessage(message_id, model, usage=RawUsage(input_tokens=input_tokens)))


def message_end(stop_reason: str | None, usage: RawUsage) -> list[RawEvent]:
    """``message_delta`` with the stop reason and the usage, then ``message_stop``."""
    return [RawMessageDelta(RawMessageDeltaBody(stop_reason), usage), RawMessageStop()]


def error_event(error_type: str, message: str) -> RawError:
    """An ``error`` event of this Anthropic error type (a key of :data:`ERROR_CLASSES`)."""
    return RawError(RawErrorBody(error_type, message))


# Anthropic error type -> llm.call_failed.error_class (docs/protocol.md §5)
ERROR_CLASSES: dict[str, str] = {
    "overloaded_error": "overloaded",
    "rate_limit_error": "rate_limited",
    "api_error": "api_error",
    "invalid_request_error": "invalid_request",
    "authentication_error": "invalid_request",
    "permission_error": "invalid_request",
    "not_found_error": "invalid_request",
    "request_too_large": "invalid_request",
    "timeout_error": "timeout",
}

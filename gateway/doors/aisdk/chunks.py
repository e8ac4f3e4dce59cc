"""The AI SDK's UI message chunks, as the gateway sends them (docs/doors/aisdk.md).

The wire shapes of the ``ai`` npm package's UI message stream (version 7,
``uiMessageChunkSchema``), one Struct per chunk type the gateway makes, encoded
with the field names the package reads (camelCase) and without the optional
fields left unset (a tool chunk's ``providerExecuted`` and ``dynamic`` are
always sent: their defaults are the point, the SDK reads them absent as false).
tests/system/doors/aisdk/test_aisdk_js.py checks every chunk the mapping
makes of the recorded traces against the package's own schema.
"""

from __future__ import annotations

from typing import Any

import msgspec

ProviderMetadata = dict[str, dict[str, Any]]


class Chunk(msgspec.Struct, tag_field="type", rename="camel", omit_defaults=True):
    """One UI message chunk; its ``type`` is the Struct's tag."""


class Start(Chunk, tag="start"):
    message_id: str
    message_metadata: dict[str, Any] | None = None


class StartStep(Chunk, tag="start-step"):
    pass


class FinishStep(Chunk, tag="finish-step"):
    pass


class Finish(Chunk, tag="finish"):
    finish_reason: str
    message_metadata: dict[str, Any] | None = None


class Abort(Chunk, tag="abort"):
    reason: str | None = None


class Error(Chunk, tag="error"):
    error_text: str


class TextStart(Chunk, tag="text-start"):
    id: str


class TextDelta(Chunk, tag="text-delta"):
    id: str
    delta: str


class TextEnd(Chunk, tag="text-end"):
    id: str


class ReasoningStart(Chunk, tag="reasoning-start"):
    id: str


class ReasoningDelta(Chunk, tag="reasoning-delta"):
    id: str
    delta: str


class ReasoningEnd(Chunk, tag="reasoning-end"):
    id: str
    provider_metadata: ProviderMetadata | None = None


class ToolInputStart(Chunk, tag="tool-input-start", omit_defaults=False):
    tool_call_id: str
    tool_name: str
    provider_executed: bool = True
    dynamic: bool = True


class ToolInputDelta(Chunk, tag="tool-input-delta"):
    tool_call_id: str
    input_text_delta: str


class ToolInputAvailable(Chunk, tag="tool-input-available", omit_defaults=False):
    tool_call_id: str
    tool_name: str
    input: Any
    provider_executed: bool = True
    dynamic: bool = True


class ToolOutputAvailable(Chunk, tag="tool-output-available", omit_defaults=False):
    tool_call_id: str
    output: Any
    provider_executed: bool = True
    dynamic: bool = True


class ToolOutputError(Chunk, tag="tool-output-error", omit_defaults=False):
    tool_call_id: str
    error_text: str
    provider_executed: bool = True
    dynamic: bool = True


class ToolOutputDenied(Chunk, tag="tool-output-denied"):
    tool_call_id: str


class ToolApprovalRequest(Chunk, tag="tool-approval-request"):
    approval_id: str
    tool_call_id: str
    reason: str | None = None


class ToolApprovalResponse(Chunk, tag="tool-approval-response"):
    approval_id: str
    approved: bool
    provider_executed: bool | None = None  # set: left out as a default would be
    reason: str | None = None


class File(Chunk, tag="file"):
    """A file part: ``url`` the file route's (docs/doors/aisdk.md "Files"), never the bytes."""

    url: str
    media_type: str
    provider_metadata: ProviderMetadata | None = None


class Data(Chunk, tag="data"):
    """A data part: encoded as ``data-{name}`` (:func:`encode`), replaced in place by its id."""

    name: str
    id: str
    data: dict[str, Any]
    transient: bool = False  # delivered to the client's onData, never kept in its message


_encoder = msgspec.json.Encoder()


def encode(chunk: Chunk) -> bytes:
    """The chunk's JSON; a data part's ``type`` is ``data-{name}``."""
    if isinstance(chunk, Data):
        part: dict[str, Any] = {"type": f"data-{chunk.name}", "id": chunk.id, "data": chunk.data}
        if chunk.transient:
            part["transient"] = True
        return _encoder.encode(part)
    return _encoder.encode(chunk)

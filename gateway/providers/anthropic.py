"""``provider = "anthropic"``: the Messages API through the official SDK, under Trio.

One call is ``AsyncAnthropic.messages.create(stream=True)``: the SDK's raw
stream events, one per SSE event, each converted field for field into a
:mod:`raw event <gateway.providers.raw>` (``msgspec.convert(event.model_dump(),
RawEvent)``), so the same translator as the scripted model's turns them into
canonical events (docs/protocol.md §5). The message id is the API's own
(``message_start.message.id``, docs/protocol.md §1). The SDK's HTTP client runs
on AnyIO, which runs on Trio.

Each call sends the conversation rebuilt from the message store
(:func:`gateway.providers.history.rebuild`), whose blocks already have the
API's shape: thinking blocks with their signatures, redacted thinking, tool
uses and their tool results (``is_error`` kept). Tool definitions are the
registry's (``ModelRequest.tools``); ``thinking_budget_tokens`` > 0 turns on
extended thinking.

Files (docs/protocol.md §2 "Files"): the messages name them, the request
holds their bytes (``ModelRequest.files``). An image is an ``image`` block,
a PDF a ``document`` block, each with a ``base64`` source; a text document
(plain, Markdown, CSV) is a ``document`` block with a ``text`` source of
``media_type`` ``text/plain``, the only one the API takes. A tool result
with images has a list as its ``content``: its text (when not empty), then
the images. A file whose bytes are gone is the text block
``[file FILE_ID is no longer stored]``, and an image over the 5 MiB of
base64 the API takes (a tool's: a turn's is refused when posted) a text
block saying so, never a request the API refuses on every call.

Failures (docs/protocol.md §5, ``llm.call_failed.error_class``):

- Before the stream starts, the SDK retries what its policy retries (429,
  5xx and 529, connection errors) up to ``max_retries`` times, honouring
  ``retry-after``; what is left raises :class:`~gateway.errors.ProviderError`:
  the body's error type by :data:`~gateway.providers.raw.ERROR_CLASSES`, else
  by status (:func:`~gateway.providers.errors.status_class`: 529 ``overloaded``,
  429 ``rate_limited``, 5xx ``api_error``, other 4xx ``invalid_request``);
  ``network`` for a connection that failed, ``timeout`` for one that timed out.
- A 400 ``invalid_request_error`` whose message says "prompt is too long" (the
  input is longer than the model's context) is ``invalid_request`` with
  ``context_overflow`` set: the agent loop compacts and retries the call
  once (docs/protocol.md §12).
- Once the response has begun, nothing is retried. An ``error`` event in the
  stream (which the SDK raises as ``APIStatusError``) is passed on as the
  ``RawError`` it was, for the translator to close the open blocks; a
  connection that breaks or stalls past ``timeout_s`` raises ``ProviderError``
  (``network`` or ``timeout``).

Where the contract is silent:

- ``ping`` events never reach the translator: the SDK consumes them.
- ``message_start.message.model`` becomes ``anthropic:`` + the API's model, so
  that a message names its model the way the gateway names models everywhere
  (``route.decided``, ``llm.call_started``), yet keeps the exact version the API
  reported.
- ``timeout_s`` is the SDK's timeout: it bounds each network wait (connecting,
  each read of the stream), not the whole call; a whole turn is bounded by
  ``[turns] timeout_s``.
- A stream event this gateway has no raw event for (a server tool's block, a
  citation) fails the call with ``api_error`` naming it: the gateway sends no
  server tools, and its documents ask for no citations, so it means the API
  changed under us.
"""

from __future__ import annotations

import base64
from collections.abc import AsyncGenerator
from typing import Any, cast

import anthropic
import httpx2
import msgspec
from anthropic.types import MessageParam, RawMessageStreamEvent, ToolParam

from gateway.errors import ProviderError
from gateway.protocol.shapes import ContentBlock, DocumentBlock, FileBlock, ToolResultBlock
from gateway.providers.attachments import (
    ANTHROPIC_IMAGE_MAX_BYTES,
    document_text,
    missing,
    too_large,
)
from gateway.providers.base import ModelRequest
from gateway.providers.errors import status_class
from gateway.providers.history import rebuild
from gateway.providers.raw import (
    ERROR_CLASSES,
    RawEvent,
    RawMessageStart,
    error_event,
)

_MODEL_PREFIX = "anthropic:"


class AnthropicProvider:
    """Streams Messages API calls (module docstring).

    Args:
        api_key: the API key (``ANTHROPIC_API_KEY``; the factory checks it is set).
        base_url: the API's address, e.g. a proxy or a local server; None for the SDK's.
        thinking_budget_tokens: the extended thinking budget; 0 turns thinking off.
        max_retries: the SDK's retries of a call that failed before streaming.
        timeout_s: the SDK's timeout of each network wait.
    """

    name = "anthropic"

    def __init__(
        self,
        *,
        api_key: str,
        base_url: str | None = None,
        thinking_budget_tokens: int = 0,
        max_retries: int = 2,
        timeout_s: float = 600.0,
    ) -> None:
        self._client = anthropic.AsyncAnthropic(
            api_key=api_key, base_url=base_url, max_retries=max_retries, timeout=timeout_s
        )
        self._thinking_budget_tokens = thinking_budget_tokens

    async def stream(self, request: ModelRequest) -> AsyncGenerator[RawEvent, None]:
        """Stream the raw events of one call.

        Raises:
            ProviderError: the call failed before streaming, or the connection
                broke or stalled during it (module docstring).
        """
        # The agent's budget, else the provider's (a provider built for one agent).
        budget = request.thinking_budget_tokens or self._thinking_budget_tokens
        try:
            events = await self._client.messages.create(
                model=request.model.removeprefix(_MODEL_PREFIX),
                max_tokens=request.max_tokens,
                messages=messages_param(request),
                system=request.system if request.system is not None else anthropic.omit,
                tools=tools_param(request) or anthropic.omit,
                # Not a parameter of this SDK's signature; the API takes it, but
                # never together with extended thinking.
                extra_body=(
                    {"temperature": request.temperature}
                    if request.temperature is not None and not budget
                    else None
                ),
                thinking=(
                    {"type": "enabled", "budget_tokens": budget} if budget else anthropic.omit
                ),
                stream=True,
            )
        except anthropic.APIError as exc:
            raise _provider_error(exc) from exc
        try:
            async for event in events:
                yield _raw_event(event)
        except anthropic.APIStatusError as exc:  # an ``error`` event in the stream
            yield error_event(exc.type or "api_error", exc.api_message or exc.message)
        except httpx2.TimeoutException as exc:
            raise ProviderError("timeout", f"the model stream stalled: {exc!r}") from exc
        except httpx2.TransportError as exc:
            raise ProviderError("network", f"the model stream broke: {exc!r}") from exc
        finally:
            await events.close()

    async def aclose(self) -> None:
        """Close the SDK's HTTP client and its connections."""
        await self._client.close()


def messages_param(request: ModelRequest) -> list[MessageParam]:
    """The request's conversation as the API's ``messages``.

    The content blocks of :mod:`gateway.protocol.shapes` have the API's own
    fields and ``type`` tags, so each block is sent as it encodes; a file
    block gets its bytes from ``request.files`` (module docstring).
    """
    return [
        cast(
            MessageParam,
            {"role": m.role, "content": [_block_param(b, request.files) for b in m.content]},
        )
        for m in rebuild(request.messages)
    ]


Files = dict[str, tuple[str, bytes]]


def _block_param(block: ContentBlock, files: Files) -> Any:
    """One block as the API takes it: a file's bytes put in (module docstring)."""
    if isinstance(block, ToolResultBlock) and block.files:
        param = msgspec.to_builtins(msgspec.structs.replace(block, files=msgspec.UNSET))
        text = [{"type": "text", "text": block.content}] if block.content else []
        param["content"] = [*text, *(file_param(f, files) for f in block.files)]
        return param
    if isinstance(block, FileBlock):
        return file_param(block, files)
    return msgspec.to_builtins(block)


def file_param(block: FileBlock, files: Files) -> dict[str, Any]:
    """An image or document block with its bytes, or the text saying they are gone."""
    found = files.get(block.file_id)
    if found is None:
        return {"type": "text", "text": missing(block.file_id)}
    media_type, data = found
    kind = "document" if isinstance(block, DocumentBlock) else "image"
    if kind == "image" and len(data) > ANTHROPIC_IMAGE_MAX_BYTES:  # a tool's: never taken
        return {"type": "text", "text": too_large(block, ANTHROPIC_IMAGE_MAX_BYTES)}
    if media_type.startswith("text/"):
        source = {"type": "text", "media_type": "text/plain", "data": document_text(data)}
    else:
        encoded = base64.b64encode(data).decode("ascii")
        source = {"type": "base64", "media_type": media_type, "data": encoded}
    return {"type": kind, "source": source}


def tools_param(request: ModelRequest) -> list[ToolParam]:
    """The tool registry's definitions as the API's ``tools`` (the same three fields)."""
    return cast(list[ToolParam], msgspec.to_builtins(request.tools))


def _raw_event(event: RawMessageStreamEvent) -> RawEvent:
    try:
        raw: RawEvent = msgspec.convert(event.model_dump(), RawEvent)
    except msgspec.ValidationError as exc:
        raise ProviderError(
            "api_error", f"unsupported {event.type} event from the API: {exc}"
        ) from exc
    if isinstance(raw, RawMessageStart) and raw.message.model:
        raw.message.model = _MODEL_PREFIX + raw.message.model
    return raw


def _provider_error(exc: anthropic.APIError) -> ProviderError:
    """How a call that failed before streaming is reported (module docstring)."""
    if isinstance(exc, anthropic.APITimeoutError):
        return ProviderError("timeout", "the model API timed out")
    if isinstance(exc, anthropic.APIConnectionError):
        return ProviderError("network", f"cannot reach the model API: {exc.__cause__ or exc}")
    if isinstance(exc, anthropic.APIStatusError):
        error_class = ERROR_CLASSES.get(exc.type or "") or status_class(exc.status_code)
        message = exc.api_message or exc.message
        return ProviderError(
            error_class,
            f"the model API answered {exc.status_code}: {message}",
            context_overflow=exc.status_code == 400
            and exc.type == "invalid_request_error"
            and "prompt is too long" in message.lower(),
        )
    return ProviderError("api_error", exc.message)

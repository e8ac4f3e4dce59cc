"""``provider = "openai"``: Chat Completions streaming from any OpenAI-compatible server.

vLLM, Ollama, llama.cpp, LM Studio and OpenAI itself stream ``POST
{base_url}/chat/completions`` with ``stream: true`` as SSE ``data:`` chunks:
``choices[0].delta`` carries ``content`` (reasoning written inline in it
between ``<think>`` and ``</think>`` is thinking, never text: see
:mod:`gateway.providers.think_tags`), the ``reasoning_content`` (or
``reasoning``) some servers use for thinking, and ``tool_calls[]`` whose
``function.arguments`` arrive in fragments; ``finish_reason`` says why it
stopped; a last chunk carries ``usage``; ``data: [DONE]`` ends the stream.
:class:`ChunkAdapter` turns these into the Anthropic-shaped :mod:`raw events
<gateway.providers.raw>` the one translator takes, with block indices as
docs/protocol.md §5 requires: contiguous from 0, one block open at a time, so
a switch from reasoning to text to a tool call closes the previous block.
httpx sends the request and httpx-sse parses the stream.

The conversation is :func:`gateway.providers.history.rebuild`'s, in this API's
roles: ``system``, ``user``, ``assistant`` with ``tool_calls``, and one
``tool`` message per tool result. Reasoning is never sent back.

Files (docs/protocol.md §2 "Files"; the bytes are ``ModelRequest.files``): a
user message with files is a list of content parts, in order: its text as a
``text`` part, an image as an ``image_url`` part whose ``url`` is a ``data:``
URL (``data:image/png;base64,...``), a text document as a ``text`` part
beginning with the line ``[document FILE_ID MEDIA_TYPE]``. A message without
files keeps its plain string ``content``. A ``tool`` message takes text
only, so a tool result's images go in one ``user`` message right after the
``tool`` messages, the line ``[images of tool call ID]`` before each call's
images (the user's own text and files follow in that message). A PDF is
refused when the turn is posted (:func:`gateway.providers.attachments.refusal`);
one that reaches a call all the same (an agent's model changed since) is a
text part saying it cannot be sent, as is a file whose bytes are gone.

Where the contract and the servers are silent:

- The message id is the gateway's own (``msg_...``): the servers' ``chatcmpl-``
  ids are not unique everywhere (Ollama's has three random digits). The model
  is ``openai:`` + the chunk's ``model``, like the Anthropic provider's.
- A tool call's first fragment must carry ``function.name`` (every server
  above sends it there). Fragments of a tool call that resume after another
  block began (interleaved parallel calls) cannot be one block at a time, and
  fail the call with ``api_error``.
- Tool use ids are the gateway's own (``tu_...``, docs/protocol.md §1: "unique
  within the gateway"): the servers' are not (some number their calls
  ``call_0``, ``call_1`` in every response, some send none, Ollama's are
  short). The call's ``index`` says which block a fragment belongs to, so a
  call keeps its one id across its fragments, whatever id the server repeats
  on them. The history sent back carries these ids, on the assistant's
  ``tool_calls`` and on the ``tool`` messages alike (a server only pairs
  them, as rule 4 of :mod:`~gateway.providers.history` does).
- ``finish_reason``: ``stop`` is ``end_turn`` (``tool_use`` if tool calls
  were streamed: some servers say ``stop`` even then), ``length`` is
  ``max_tokens``, ``tool_calls`` is ``tool_use``; any other passes through
  (the translator makes it ``end_turn``). Usage: ``input_tokens`` is
  ``prompt_tokens`` less the cached ones, which are ``cache_read_input_tokens``
  (Anthropic counts them apart, and pricing adds them up).
- Errors: before streaming, a status maps as the Anthropic provider's does
  (429 ``rate_limited``, 529 ``overloaded``, other 4xx ``invalid_request``,
  5xx ``api_error``), except that 503 is ``overloaded`` (local servers answer
  it while loading a model or with a full queue) and 408 is ``timeout``
  (:data:`~gateway.providers.errors.SERVER_STATUS_CLASSES`); 408, 409, 429 and
  5xx are retried up to ``max_retries`` times with the SDKs' backoff
  (``retry-after-ms`` and ``retry-after`` honoured). Once streaming, nothing is
  retried: an error chunk (``{"error": {...}}``, or an ``event: error``) becomes the
  ``RawError`` event it amounts to, a broken or stalled connection raises
  ``ProviderError`` (``network``, ``timeout``), and so does a stream that
  ends without ``finish_reason`` or ``[DONE]``.
- A 400 that refuses the call as longer than the model's context (OpenAI's
  ``code: context_length_exceeded``, llama.cpp's ``exceed_context_size_error``,
  vLLM's "maximum context length" message) is an ``invalid_request``
  ``ProviderError`` with ``context_overflow`` set: the agent loop compacts
  and retries (docs/protocol.md §12).
- A tool result with ``is_error`` is sent as ``Error: `` + its content: the
  ``tool`` role has no error flag.
"""

from __future__ import annotations

import base64
import random
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any, Literal

import httpx
import msgspec
import trio
from httpx_sse import EventSource, ServerSentEvent, SSEError

from gateway.errors import ProviderError
from gateway.ids import new_message_id, new_tool_use_id
from gateway.protocol.shapes import (
    ContentBlock,
    DocumentBlock,
    FileBlock,
    ImageBlock,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from gateway.providers.attachments import document_text, missing
from gateway.providers.base import ModelRequest
from gateway.providers.errors import SERVER_STATUS_CLASSES, status_class
from gateway.providers.history import rebuild
from gateway.providers.raw import (
    RawContentBlock,
    RawContentBlockDelta,
    RawContentBlockStart,
    RawContentBlockStop,
    RawDelta,
    RawError,
    RawEvent,
    RawInputJsonDelta,
    RawTextBlock,
    RawTextDelta,
    RawThinkingBlock,
    RawThinkingDelta,
    RawToolUseBlock,
    RawUsage,
    error_event,
    message_end,
    message_start,
)
from gateway.providers.think_tags import Kind, ThinkTags

_MODEL_PREFIX = "openai:"
_RETRY_STATUSES = frozenset({408, 409, 429})  # and every 5xx
_MAX_RETRY_AFTER_S = 60.0
_STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}

# --- the chunks, as the servers send them ----------------------------------------


class _FunctionDelta(msgspec.Struct):
    name: str | None = None
    arguments: str | None = None


class _ToolCallDelta(msgspec.Struct):
    index: int = 0
    id: str | None = None  # the server's; the gateway gives its own (module docstring)
    function: _FunctionDelta = msgspec.field(default_factory=_FunctionDelta)


class _Delta(msgspec.Struct):
    content: str | None = None
    reasoning_content: str | None = None  # vLLM, llama.cpp
    reasoning: str | None = None  # Ollama, newer vLLM
    tool_calls: list[_ToolCallDelta] | None = None


class _Choice(msgspec.Struct):
    index: int = 0
    delta: _Delta = msgspec.field(default_factory=_Delta)
    finish_reason: str | None = None


class _PromptTokensDetails(msgspec.Struct):
    cached_tokens: int | None = None


class _Usage(msgspec.Struct):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    prompt_tokens_details: _PromptTokensDetails | None = None


class _ErrorBody(msgspec.Struct):
    message: str = ""
    type: str | None = None
    code: int | str | None = None


class Chunk(msgspec.Struct):
    """A ``chat.completion.chunk``, or an error in one of the two shapes servers use."""

    model: str = ""
    choices: list[_Choice] = []
    usage: _Usage | None = None
    error: _ErrorBody | None = None  # OpenAI, llama.cpp, Ollama, vLLM
    object: str = ""  # "error" in older vLLM, with the fields below at the top level
    message: str = ""
    type: str | None = None
    code: int | str | None = None

    def failure(self) -> _ErrorBody | None:
        if self.error is not None:
            return self.error
        if self.object == "error":
            return _ErrorBody(self.message, self.type, self.code)
        return None


_decode_chunk = msgspec.json.Decoder(Chunk).decode


# --- chunks in, raw events out ---------------------------------------------------------


_BlockKind = Literal["thinking", "text", "tool_use"]


@dataclass
class _OpenBlock:
    kind: _BlockKind
    index: int
    tool_call: int | None = None  # the OpenAI tool call index of a tool_use block


class ChunkAdapter:
    """One response's chunks in, Anthropic-shaped raw events out.

    Sans-IO, like the translator it feeds. The one place where blocks are
    numbered: each new kind of content (reasoning, text, a tool call) closes
    the open block and opens the next index.

    Args:
        model: the model asked for, e.g. ``openai:qwen2.5``; a chunk's
            ``model`` replaces the part after the prefix.
    """

    def __init__(self, model: str) -> None:
        self._model = model
        self._started = False
        self.failed = False
        """An error chunk ended the message: nothing more is to be read."""
        self._open: _OpenBlock | None = None
        self._next_index = 0
        self._tool_calls_opened: set[int] = set()
        self._finish_reason: str | None = None
        self._usage = RawUsage()
        self._think = ThinkTags()  # inline <think> reasoning in the content

    def feed(self, chunk: Chunk) -> list[RawEvent]:
        """Translate one chunk.

        Raises:
            ProviderError: ``api_error``, a tool call the blocks cannot carry.
        """
        failure = chunk.failure()
        if failure is not None:
            self.failed = True
            return [_raw_error(failure)]
        events = self._start(chunk.model)
        if chunk.usage is not None:
            self._usage = _raw_usage(chunk.usage)
        for choice in chunk.choices:
            if choice.index == 0:  # the one choice asked for
                events += self._delta(choice.delta)
                if choice.finish_reason is not None:
                    self._finish_reason = choice.finish_reason
                    events += self._content(self._think.flush())
                    events += self._close()
        return events

    def finish(self, *, done: bool) -> list[RawEvent]:
        """End the message: ``[DONE]`` came (``done``), or the body ended.

        Raises:
            ProviderError: ``network``, the body ended before ``finish_reason`` or ``[DONE]``.
        """
        if not done and self._finish_reason is None:
            raise ProviderError("network", "the model stream ended before its finish_reason")
        stop_reason = _STOP_REASONS.get(self._finish_reason or "stop", self._finish_reason)
        if stop_reason == "end_turn" and self._tool_calls_opened:
            stop_reason = "tool_use"
        return [
            *self._start(""),
            *self._content(self._think.flush()),
            *self._close(),
            *message_end(stop_reason, self._usage),
        ]

    # --- the blocks ---

    def _start(self, model: str) -> list[RawEvent]:
        if self._started:
            return []
        self._started = True
        if model:
            self._model = _MODEL_PREFIX + model
        return [message_start(new_message_id(), self._model)]

    def _delta(self, delta: _Delta) -> list[RawEvent]:
        events: list[RawEvent] = []
        reasoning = delta.reasoning_content or delta.reasoning
        if reasoning:
            events += self._into("thinking", RawThinkingBlock())
            events.append(self._piece(RawThinkingDelta(reasoning)))
        if delta.content:
            events += self._content(self._think.feed(delta.content))
        if delta.tool_calls:  # what content held back (a possible tag) goes first
            events += self._content(self._think.flush())
        for call in delta.tool_calls or []:
            events += self._tool_call(call)
        return events

    def _content(self, pieces: list[tuple[Kind, str]]) -> list[RawEvent]:
        """Content split by :class:`ThinkTags`: ``<think>`` reasoning is a thinking block."""
        events: list[RawEvent] = []
        for kind, text in pieces:
            if kind == "thinking":
                events += self._into("thinking", RawThinkingBlock())
                events.append(self._piece(RawThinkingDelta(text)))
            else:
                events += self._into("text", RawTextBlock())
                events.append(self._piece(RawTextDelta(text)))
        return events

    def _tool_call(self, call: _ToolCallDelta) -> list[RawEvent]:
        events: list[RawEvent] = []
        if self._open is None or self._open.tool_call != call.index:
            if call.index in self._tool_calls_opened:
                raise ProviderError(
                    "api_error", f"tool call {call.index} resumed after another block began"
                )
            if not call.function.name:
                raise ProviderError(
                    "api_error", f"tool call {call.index} began without a function name"
                )
            opening = RawToolUseBlock(new_tool_use_id(), call.function.name)
            events += self._into("tool_use", opening, tool_call=call.index)
            self._tool_calls_opened.add(call.index)
        if call.function.arguments:
            events.append(self._piece(RawInputJsonDelta(call.function.arguments)))
        return events

    def _into(
        self, kind: _BlockKind, opening: RawContentBlock, tool_call: int | None = None
    ) -> list[RawEvent]:
        """Make sure a block of this kind is the open one; a tool call always opens a new one."""
        if self._open is not None and self._open.kind == kind and kind != "tool_use":
            return []
        events = self._close()
        self._open = _OpenBlock(kind, self._next_index, tool_call)
        self._next_index += 1
        events.append(RawContentBlockStart(self._open.index, opening))
        return events

    def _piece(self, delta: RawDelta) -> RawEvent:
        assert self._open is not None  # _into came first
        return RawContentBlockDelta(self._open.index, delta)

    def _close(self) -> list[RawEvent]:
        if self._open is None:
            return []
        index, self._open = self._open.index, None
        return [RawContentBlockStop(index)]


def _raw_usage(usage: _Usage) -> RawUsage:
    details = usage.prompt_tokens_details
    cached = details.cached_tokens if details is not None else None
    prompt = usage.prompt_tokens
    return RawUsage(
        input_tokens=prompt - (cached or 0) if prompt is not None else None,
        output_tokens=usage.completion_tokens,
        cache_read_input_tokens=cached,
    )


def _raw_error(body: _ErrorBody) -> RawError:
    """An error chunk as the ``error`` event it amounts to; a numeric ``code`` is a status."""
    status = body.code if isinstance(body.code, int) else None
    error_type = _ERROR_TYPES[_error_class(status, body.type)]
    return error_event(error_type, body.message or str(body.code))


# llm.call_failed.error_class -> the Anthropic error type that ERROR_CLASSES maps back to it
_ERROR_TYPES = {
    "overloaded": "overloaded_error",
    "rate_limited": "rate_limit_error",
    "timeout": "timeout_error",
    "invalid_request": "invalid_request_error",
    "api_error": "api_error",
}


def _error_class(status: int | None, kind: str | None) -> str:
    """The ``error_class`` a failure amounts to (module docstring).

    The first class, in this order, that its status says
    (:func:`~gateway.providers.errors.status_class`) or its kind does: servers
    name their errors each their own way, so a kind is matched loosely.
    """
    kind = (kind or "").lower()
    said = None
    if status is not None and status >= 400:
        said = status_class(status, SERVER_STATUS_CLASSES)
    if said == "overloaded" or "overloaded" in kind:
        return "overloaded"
    if said == "rate_limited" or "rate_limit" in kind:
        return "rate_limited"
    if said == "timeout" or "timeout" in kind:
        return "timeout"
    if said == "invalid_request" or kind in ("invalid_request_error", "badrequesterror"):
        return "invalid_request"
    return "api_error"


def _context_overflow(body: _ErrorBody) -> bool:
    """Whether a 400 refuses the call as longer than the model's context (module docstring).

    OpenAI says so by ``code: context_length_exceeded``, llama.cpp by ``type:
    exceed_context_size_error``, vLLM in its message only ("This model's
    maximum context length is ...").
    """
    return (
        body.code == "context_length_exceeded"
        or body.type == "exceed_context_size_error"
        or "maximum context length" in body.message.lower()
    )


# --- the provider -----------------------------------------------------------------------


@dataclass(frozen=True)
class _Failed:
    """A call that failed before streaming, and whether the retry policy retries it."""

    error: ProviderError
    retryable: bool
    retry_after: float | None = None  # what the server asked for, in seconds


class OpenAIProvider:
    """Streams Chat Completions calls (module docstring).

    Args:
        base_url: the server's API root, ``/v1`` included (``http://localhost:11434/v1``).
        api_key: sent as a bearer token when given (``OPENAI_API_KEY``).
        max_retries: retries of a call that failed before streaming.
        timeout_s: httpx's timeout of each network wait (connecting, each read).
    """

    name = "openai"

    def __init__(
        self,
        *,
        base_url: str,
        api_key: str | None = None,
        max_retries: int = 2,
        timeout_s: float = 600.0,
    ) -> None:
        headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.AsyncClient(
            base_url=base_url.rstrip("/") + "/", headers=headers, timeout=timeout_s
        )
        self._max_retries = max_retries

    async def stream(self, request: ModelRequest) -> AsyncGenerator[RawEvent, None]:
        """Stream the raw events of one call.

        Raises:
            ProviderError: the call failed before streaming, or the stream
                broke, stalled or was cut short (module docstring).
        """
        response = await self._open(chat_body(request))
        adapter = ChunkAdapter(request.model)
        try:
            done = False
            async for sse in EventSource(response).aiter_sse():
                if sse.data == "[DONE]":
                    done = True
                    break
                for raw in adapter.feed(_chunk(sse)):
                    yield raw
                if adapter.failed:
                    return
            for raw in adapter.finish(done=done):
                yield raw
        except SSEError as exc:  # before TransportError, its base class
            raise ProviderError(
                "api_error", f"the model server sent no event stream: {exc}"
            ) from exc
        except httpx.TimeoutException as exc:
            raise ProviderError("timeout", f"the model stream stalled: {exc!r}") from exc
        except httpx.TransportError as exc:
            raise ProviderError("network", f"the model stream broke: {exc!r}") from exc
        finally:
            await response.aclose()

    async def aclose(self) -> None:
        """Close the HTTP client and its connections."""
        await self._client.aclose()

    async def _open(self, body: dict[str, Any]) -> httpx.Response:
        """POST the call, retrying what failed before streaming; the response, status 200."""
        attempt = 0
        while True:
            outcome = await self._attempt(body)
            if isinstance(outcome, httpx.Response):
                return outcome
            attempt += 1
            if not outcome.retryable or attempt > self._max_retries:
                raise outcome.error
            await trio.sleep(
                _backoff(attempt) if outcome.retry_after is None else outcome.retry_after
            )

    async def _attempt(self, body: dict[str, Any]) -> httpx.Response | _Failed:
        """One try: the streaming response (status 200), or how it failed."""
        request = self._client.build_request(
            "POST", "chat/completions", json=body, headers={"accept": "text/event-stream"}
        )
        try:
            response = await self._client.send(request, stream=True)
        except httpx.TimeoutException:
            return _Failed(ProviderError("timeout", "the model server timed out"), retryable=True)
        except httpx.TransportError as exc:
            error = ProviderError("network", f"cannot reach the model server: {exc!r}")
            return _Failed(error, retryable=True)
        if response.status_code == 200:
            return response
        try:
            text = (await response.aread()).decode(errors="replace")
        finally:
            await response.aclose()
        status = response.status_code
        try:
            body_error = _decode_chunk(text).failure() or _ErrorBody(text)
        except msgspec.DecodeError:
            body_error = _ErrorBody(text)
        error = ProviderError(
            _error_class(status, body_error.type),
            f"the model server answered {status}: {body_error.message or text}",
            context_overflow=status == 400 and _context_overflow(body_error),
        )
        retryable = status in _RETRY_STATUSES or status >= 500
        return _Failed(error, retryable, _retry_after(response.headers))


def chat_body(request: ModelRequest) -> dict[str, Any]:
    """The Chat Completions request body of one call."""
    body: dict[str, Any] = {
        "model": request.model.removeprefix(_MODEL_PREFIX),
        "messages": chat_messages(request),
        "max_tokens": request.max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if request.temperature is not None:
        body["temperature"] = request.temperature
    if request.thinking_budget_tokens:
        body["reasoning_effort"] = reasoning_effort(request.thinking_budget_tokens)
    if request.tools:
        body["tools"] = [
            {
                "type": "function",
                "function": {
                    "name": tool.name,
                    "description": tool.description,
                    "parameters": tool.input_schema,
                },
            }
            for tool in request.tools
        ]
    return body


def reasoning_effort(budget_tokens: int) -> str:
    """A thinking budget in the effort levels of servers that have them (docs/protocol.md §11).

    Chat Completions has no token budget, only ``reasoning_effort``; the budget
    picks the level whose usual spend it is nearest: under 4k tokens ``low``,
    under 16k ``medium``, else ``high``. A server without reasoning ignores it.
    """
    if budget_tokens < 4096:
        return "low"
    return "medium" if budget_tokens < 16384 else "high"


def chat_messages(request: ModelRequest) -> list[dict[str, Any]]:
    """The conversation in Chat Completions roles (module docstring)."""
    messages: list[dict[str, Any]] = []
    if request.system:
        messages.append({"role": "system", "content": request.system})
    for message in rebuild(request.messages):
        text = "\n\n".join(b.text for b in message.content if isinstance(b, TextBlock))
        if message.role == "user":
            messages += _user_messages(message.content, text, request.files)
            continue
        calls = [
            {
                "id": b.id,
                "type": "function",
                "function": {"name": b.name, "arguments": msgspec.json.encode(b.input).decode()},
            }
            for b in message.content
            if isinstance(b, ToolUseBlock)
        ]
        assistant: dict[str, Any] = {"role": "assistant", "content": text or None}
        if calls:
            assistant["tool_calls"] = calls
        messages.append(assistant)
    return messages


Files = dict[str, tuple[str, bytes]]


def _user_messages(content: list[ContentBlock], text: str, files: Files) -> list[dict[str, Any]]:
    """A user message's tool results as ``tool`` messages, then what it says (module
    docstring): a plain string without files, else content parts."""
    results = [b for b in content if isinstance(b, ToolResultBlock)]
    out: list[dict[str, Any]] = [
        {"role": "tool", "tool_call_id": b.tool_use_id, "content": _result_text(b)} for b in results
    ]
    parts: list[dict[str, Any]] = []
    for result in results:
        if result.files:
            parts.append(_text_part(f"[images of tool call {result.tool_use_id}]"))
            parts += [file_part(f, files) for f in result.files]
    if not parts and not any(isinstance(b, FileBlock) for b in content):
        return [*out, {"role": "user", "content": text}] if text else out
    for block in content:
        if isinstance(block, TextBlock):
            parts.append(_text_part(block.text))
        elif isinstance(block, FileBlock):
            parts.append(file_part(block, files))
    return [*out, {"role": "user", "content": parts}]


def file_part(block: FileBlock, files: Files) -> dict[str, Any]:
    """A file as a content part (module docstring)."""
    found = files.get(block.file_id)
    if found is None:
        return _text_part(missing(block.file_id))
    media_type, data = found
    if isinstance(block, ImageBlock):
        url = f"data:{media_type};base64,{base64.b64encode(data).decode('ascii')}"
        return {"type": "image_url", "image_url": {"url": url}}
    if isinstance(block, DocumentBlock) and media_type.startswith("text/"):
        return _text_part(f"[document {block.file_id} {media_type}]\n{document_text(data)}")
    return _text_part(f"[file {block.file_id} ({media_type}) cannot be sent to this model]")


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def _result_text(block: ToolResultBlock) -> str:
    return f"Error: {block.content}" if block.is_error else block.content


def _chunk(sse: ServerSentEvent) -> Chunk:
    try:
        chunk = _decode_chunk(sse.data)
    except msgspec.DecodeError as exc:
        if sse.event == "error":
            return Chunk(error=_ErrorBody(sse.data))
        raise ProviderError("api_error", f"undecodable chunk from the model server: {exc}") from exc
    if sse.event == "error" and chunk.failure() is None:
        return Chunk(error=_ErrorBody(sse.data))
    return chunk


def _retry_after(headers: httpx.Headers) -> float | None:
    """The server's ``retry-after-ms`` or ``retry-after`` (seconds), capped; None if neither."""
    for name, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        try:
            return min(max(float(headers[name]) * scale, 0.0), _MAX_RETRY_AFTER_S)
        except (KeyError, ValueError):
            continue
    return None


def _backoff(attempt: int) -> float:
    """The SDKs' backoff: 0.5 s doubling up to 8 s, less up to a quarter of jitter."""
    return min(0.5 * 2.0 ** (attempt - 1), 8.0) * (1 - 0.25 * random.random())

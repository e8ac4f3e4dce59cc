"""The scripted model (docs/reference.md "The scripted model").

A real provider that needs no network and no key: the demo, the bench harness
and the tests drive the gateway with it. It yields raw events exactly as the
Anthropic Messages API would (``message_start``, then ``content_block_start``,
deltas and ``content_block_stop`` per block with indices 0, 1, ..., then
``message_delta`` and ``message_stop``), so everything downstream runs the
same translator path as with a real model.

It answers the turn's user message: the last ``user`` message that is more
than tool results. The round it plays is the number of assistant messages
after that one, so each LLM call of a turn plays the next round.

- Plain text: a one-round script, ``You said: <text>``, streamed a word at a
  time, then one line per file of the last user message (below).
- A JSON object ``{"script": {...}}`` (nothing else beside ``script``): the
  :class:`Script`. A script that does not decode is refused with
  ``ProviderError("invalid_request", "invalid script: ...")`` naming the field,
  before any event.

Where docs/reference.md is silent:

- A round past the last one is an empty message (no block, ``end_turn``).
- ``delay_ms`` is slept before every delta, the first one included; with 0 the
  stream still checkpoints before every delta, so it stays cancellable.
- ``tool_use`` input is streamed as its compact JSON in fragments of 8
  characters (``chunk_chars`` is for text); its id is ``toolu_`` + random hex.
- A thinking block ends with one ``signature_delta``: ``sig_`` + the first 32
  hex digits of the SHA-256 of its text, so the same thinking always has the
  same signature.
- ``fail`` counts every ``content_block_delta`` of its round, signatures
  included: with ``after_deltas: N`` the failure replaces delta N+1, mid-block.
  A round with N deltas or fewer fails after its last block, before
  ``message_delta``. The failure is an in-stream ``error`` event for the
  classes Anthropic reports that way; ``network`` and ``timeout`` are a broken
  connection, raised as ``ProviderError``. ``fail.round`` must name a round
  of the script.
- ``lorem`` is generated as it streams, never built whole ahead, and a script
  asks for at most :data:`LOREM_MAX_WORDS` words, in one block or all of them
  together (more is ``invalid_request`` naming the field): the whole message
  is kept, and sent in ``message.complete``. A script nested too deeply to
  decode is ``invalid_request`` too.
- A summary request (docs/protocol.md §12: its system prompt begins with
  :data:`~gateway.providers.history.SUMMARY_MARKER`) is answered, in one
  text block, with ``Summary of N messages: `` and the first
  :data:`SUMMARY_WORDS` words of each rendered message, ``; `` between two:
  the same messages always get the same summary. A request whose rendered
  messages contain :data:`SUMMARY_FAILS` (a user wrote it in an earlier
  turn) is refused with ``ProviderError("api_error")`` before any event, so
  the compaction falls back to ``truncate``.
- ``overflow: true`` refuses every request whose conversation does not
  begin with a ``context`` message (nothing compacted yet) as too long:
  ``ProviderError("invalid_request", "prompt is too long: ...",
  context_overflow=True)``, before any event, as Anthropic's 400 would; the
  retry after a compaction goes through. ``overflow: "always"`` refuses
  every request so.
- Tokens are ceil(characters / 4). Input: the text, thinking, tool input JSON
  tool result content and summary of every request message (not the system prompt,
  not the tool definitions, not redacted thinking), plus each file a model is
  sent by :func:`~gateway.providers.attachments.file_tokens` (an image 1,600,
  a document its size / 4), as compaction estimates them. Output: the text,
  thinking and tool input JSON streamed (not the signature).
- Files (docs/protocol.md §2 "Files"): the model says back the files of the
  last user message of the request (its images and documents, then its tool
  results' images; audio is sent to no model), one line each, by
  :func:`~gateway.providers.attachments.said_back`: ``[KIND MEDIA_TYPE SIZE
  bytes sha256:HEX8]``, of the bytes it received in ``ModelRequest.files``, so
  a test proves the whole path offline. Plain text gets these lines after
  ``You said: <text>``; in a script the block ``{"files": true}`` is them
  (``""`` when there are none).
"""

from __future__ import annotations

import hashlib
import itertools
import math
import re
import secrets
from collections.abc import AsyncGenerator, Iterable, Iterator
from typing import Annotated, Any, Literal

import msgspec
import trio

from gateway.errors import ProviderError
from gateway.ids import new_message_id
from gateway.protocol.shapes import (
    CompactionBlock,
    ContentBlock,
    DocumentBlock,
    FileBlock,
    ImageBlock,
    Message,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from gateway.providers.attachments import file_tokens, said_back
from gateway.providers.base import ModelRequest
from gateway.providers.history import MESSAGE_SEPARATOR, SUMMARY_MARKER, tool_images
from gateway.providers.raw import (
    RawContentBlock,
    RawContentBlockDelta,
    RawContentBlockStart,
    RawContentBlockStop,
    RawDelta,
    RawEvent,
    RawInputJsonDelta,
    RawMessageDelta,
    RawRedactedThinkingBlock,
    RawSignatureDelta,
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

NonNegative = Annotated[int, msgspec.Meta(ge=0)]

# The error classes Anthropic reports as an in-stream ``error`` event, by type.
_IN_STREAM_ERRORS = {
    "overloaded": "overloaded_error",
    "rate_limited": "rate_limit_error",
    "api_error": "api_error",
    "invalid_request": "invalid_request_error",
}
_TOOL_INPUT_CHUNK_CHARS = 8
SUMMARY_WORDS = 5
"""Words of each message that the scripted summary keeps."""
SUMMARY_FAILS = "#fail-summary"
"""A summary request whose messages contain this fails (module docstring)."""
LOREM_MAX_WORDS = 1_000_000
_LOREM = ("lorem", "ipsum", "dolor", "sit", "amet", "consectetur", "adipiscing", "elit", "sed")
_LOREM_CYCLE = " ".join(_LOREM) + " "
_WORD = re.compile(r"\s*\S+\s*|\s+")  # a word with the spaces around it


# --- the script --------------------------------------------------------------


class ScriptToolUse(msgspec.Struct, forbid_unknown_fields=True):
    name: str
    input: dict[str, Any] = {}


class ScriptBlock(msgspec.Struct, forbid_unknown_fields=True):
    """One block of a round; exactly one field is set."""

    text: str | None = None
    thinking: str | None = None
    redacted_thinking: str | None = None
    tool_use: ScriptToolUse | None = None
    # Generated lazily, as it streams; bounded (here and over the whole script,
    # see Script) so that one script cannot make messages of hundreds of MiB:
    # a message is kept whole, and sent whole in message.complete.
    lorem: Annotated[int, msgspec.Meta(ge=0, le=LOREM_MAX_WORDS)] | None = None
    # What the model was sent, said back as text: the agent's system prompt
    # ("" if none), the names of the tools it was offered, one per line, or
    # the files of the last user message, one line each (module docstring).
    system: Literal[True] | None = None
    tools: Literal[True] | None = None
    files: Literal[True] | None = None

    def __post_init__(self) -> None:
        given = [name for name in self.__struct_fields__ if getattr(self, name) is not None]
        if len(given) != 1:
            raise ValueError(
                f"a block has exactly one of {', '.join(self.__struct_fields__)};"
                f" got {', '.join(given) or 'none'}"
            )


class ScriptFail(msgspec.Struct, forbid_unknown_fields=True):
    error_class: Literal[
        "overloaded", "rate_limited", "api_error", "invalid_request", "network", "timeout"
    ]
    round: NonNegative = 0
    after_deltas: NonNegative = 0


class Script(msgspec.Struct, forbid_unknown_fields=True):
    """What the model says, round by round (docs/reference.md "The scripted model")."""

    rounds: list[list[ScriptBlock]]
    delay_ms: Annotated[float, msgspec.Meta(ge=0)] = 0
    chunk_chars: NonNegative = 0
    fail: ScriptFail | None = None
    overflow: bool | Literal["always"] = False

    def __post_init__(self) -> None:
        words = sum(block.lorem or 0 for blocks in self.rounds for block in blocks)
        if words > LOREM_MAX_WORDS:
            raise ValueError(
                f"the lorem blocks ask for {words} words in all; a script may ask for"
                f" at most {LOREM_MAX_WORDS}"
            )
        if self.fail is not None and self.fail.round >= len(self.rounds):
            raise ValueError(
                f"fail.round {self.fail.round} is past the last round ({len(self.rounds)} rounds)"
            )


class _ScriptMessage(msgspec.Struct, forbid_unknown_fields=True):
    script: Script


# --- the provider ------------------------------------------------------------


class ScriptedProvider:
    """``provider = "scripted"``: replies from the user message itself.

    Args:
        default_model: the model named in ``message_start`` when the request
            names none.
    """

    name = "scripted"

    def __init__(self, default_model: str = "scripted:echo") -> None:
        self.default_model = default_model

    async def stream(self, request: ModelRequest) -> AsyncGenerator[RawEvent, None]:
        """Stream the raw events of the round this request is at.

        Raises:
            ProviderError: ``invalid_request`` for a bad script or no user
                message, before any event; ``network`` or ``timeout`` when the
                script fails that way.
        """
        if request.system is not None and request.system.startswith(SUMMARY_MARKER):
            script, round_index = _summary_script(request.messages), 0
        else:
            text, round_index = _turn_position(request.messages)
            script = _read_script(text) or Script(
                rounds=[[ScriptBlock(text="".join([f"You said: {text}", *_files_said(request)]))]]
            )
            _check_overflow(script, request.messages)
            script = _said_back(script, request)
        fail = script.fail if script.fail is not None and script.fail.round == round_index else None
        events = _round_events(
            script,
            round_index,
            model=request.model or self.default_model,
            input_tokens=_request_tokens(request.messages),
        )
        deltas_sent = 0
        for event in events:
            if fail is not None and (
                isinstance(event, RawMessageDelta)
                or (isinstance(event, RawContentBlockDelta) and deltas_sent == fail.after_deltas)
            ):
                message = f"scripted {fail.error_class} after {deltas_sent} deltas"
                error_type = _IN_STREAM_ERRORS.get(fail.error_class)
                if error_type is None:  # network, timeout: the connection broke
                    raise ProviderError(fail.error_class, message)
                yield error_event(error_type, message)
                return
            if isinstance(event, RawContentBlockDelta):
                if script.delay_ms:
                    await trio.sleep(script.delay_ms / 1000)
                else:
                    await trio.lowlevel.checkpoint()
                deltas_sent += 1
            yield event

    async def aclose(self) -> None:
        """Nothing to release."""


# --- reading the request -------------------------------------------------------


def _said_back(script: Script, request: ModelRequest) -> Script:
    """The ``system``, ``tools`` and ``files`` blocks as the text of what this call was sent."""
    said = {
        "system": request.system or "",
        "tools": "\n".join(tool.name for tool in request.tools),
        "files": "".join(_files_said(request)).removeprefix("\n"),
    }

    def text_of(block: ScriptBlock) -> ScriptBlock:
        for key, text in said.items():
            if getattr(block, key) is not None:
                return ScriptBlock(text=text)
        return block

    rounds = [[text_of(block) for block in blocks] for blocks in script.rounds]
    return msgspec.structs.replace(script, rounds=rounds)


def _files_said(request: ModelRequest) -> list[str]:
    """A line for each file of the last user message, each after a newline."""
    return [
        "\n" + said_back(f, request.files.get(f.file_id)) for f in _last_files(request.messages)
    ]


def _last_files(messages: list[Message]) -> list[FileBlock]:
    """The files of the last user message a model is sent (module docstring)."""
    last = next((m for m in reversed(messages) if m.role == "user"), None)
    if last is None:
        return []
    own: list[FileBlock] = [b for b in last.content if isinstance(b, ImageBlock | DocumentBlock)]
    tools = [f for b in last.content if isinstance(b, ToolResultBlock) for f in _images(b)]
    return own + tools


def _images(block: ToolResultBlock) -> list[FileBlock]:
    return tool_images(block.files) if block.files else []


def _turn_position(messages: list[Message]) -> tuple[str, int]:
    """The turn's user text, and how many assistant messages came after it."""
    for position in range(len(messages) - 1, -1, -1):
        message = messages[position]
        if message.role == "user" and any(
            not isinstance(block, ToolResultBlock) for block in message.content
        ):
            text = "\n".join(
                block.text for block in message.content if isinstance(block, TextBlock)
            )
            later = messages[position + 1 :]
            return text, sum(1 for answer in later if answer.role == "assistant")
    raise ProviderError("invalid_request", "the scripted model found no user message to answer")


def _summary_script(messages: list[Message]) -> Script:
    """The one-round answer to a summary request (module docstring).

    Raises:
        ProviderError: ``api_error`` when the messages contain :data:`SUMMARY_FAILS`.
    """
    text = "\n".join(
        block.text for m in messages for block in m.content if isinstance(block, TextBlock)
    )
    if SUMMARY_FAILS in text:
        raise ProviderError("api_error", f"scripted summary failure ({SUMMARY_FAILS})")
    parts = text.split(MESSAGE_SEPARATOR)
    firsts = ["".join(_WORD.findall(part)[:SUMMARY_WORDS]).strip() for part in parts]
    summary = f"Summary of {len(parts)} messages: " + "; ".join(firsts)
    return Script(rounds=[[ScriptBlock(text=summary)]])


def _check_overflow(script: Script, messages: list[Message]) -> None:
    """Refuse the call as too long when the script says so (module docstring).

    Raises:
        ProviderError: ``invalid_request`` with ``context_overflow``.
    """
    compacted = bool(messages) and messages[0].role == "context"
    if script.overflow == "always" or (script.overflow is True and not compacted):
        raise ProviderError(
            "invalid_request",
            f"prompt is too long: {_request_tokens(messages)} tokens (scripted overflow)",
            context_overflow=True,
        )


def _read_script(text: str) -> Script | None:
    """The script the text carries, or ``None`` when it is plain text."""
    if not text.lstrip().startswith("{"):
        return None
    try:
        value = msgspec.json.decode(text)
    except msgspec.DecodeError:
        return None
    except RecursionError:
        raise ProviderError("invalid_request", "invalid script: nested too deeply") from None
    if not isinstance(value, dict) or "script" not in value:
        return None
    try:
        return msgspec.convert(value, _ScriptMessage).script
    except msgspec.ValidationError as error:
        raise ProviderError("invalid_request", f"invalid script: {error}") from error


def _request_tokens(messages: list[Message]) -> int:
    """The input tokens of a request (module docstring): characters / 4, and its files."""
    chars = sum(_block_chars(block) for message in messages for block in message.content)
    files = sum(
        file_tokens(f)
        for message in messages
        if message.role == "user"
        for block in message.content
        for f in _sent_files(block)
    )
    return _tokens(chars) + files


def _sent_files(block: ContentBlock) -> list[FileBlock]:
    if isinstance(block, ImageBlock | DocumentBlock):
        return [block]
    return _images(block) if isinstance(block, ToolResultBlock) else []


def _block_chars(block: ContentBlock) -> int:
    match block:
        case TextBlock():
            return len(block.text)
        case ThinkingBlock():
            return len(block.thinking)
        case ToolUseBlock():
            return len(msgspec.json.encode(block.input).decode())
        case ToolResultBlock():
            return len(block.content)
        case CompactionBlock():
            return len(block.summary)
    return 0  # redacted thinking: opaque


def _tokens(chars: int) -> int:
    return math.ceil(chars / 4)


# --- writing the reply ---------------------------------------------------------


def _round_events(
    script: Script, round_index: int, *, model: str, input_tokens: int
) -> Iterator[RawEvent]:
    """The raw events of one round, as the Messages API streams them, without pacing."""
    blocks = script.rounds[round_index] if round_index < len(script.rounds) else []
    yield message_start(new_message_id(), model, input_tokens)
    output_chars = 0
    for index, block in enumerate(blocks):
        opening, deltas = _block_stream(block, script.chunk_chars)
        yield RawContentBlockStart(index, opening)
        for delta in deltas:
            output_chars += _delta_chars(delta)
            yield RawContentBlockDelta(index, delta)
        yield RawContentBlockStop(index)
    stop_reason = "end_turn"
    if any(block.tool_use is not None for block in blocks):
        stop_reason = "tool_use"
    yield from message_end(stop_reason, RawUsage(output_tokens=_tokens(output_chars)))


def _block_stream(
    block: ScriptBlock, chunk_chars: int
) -> tuple[RawContentBlock, Iterable[RawDelta]]:
    """How a block opens, and its deltas (lazily: ``lorem`` may be long)."""
    if block.text is not None:
        return RawTextBlock(), map(RawTextDelta, _chunks(block.text, chunk_chars))
    if block.lorem is not None:
        return RawTextBlock(), map(RawTextDelta, _lorem(block.lorem, chunk_chars))
    if block.thinking is not None:
        signature = "sig_" + hashlib.sha256(block.thinking.encode()).hexdigest()[:32]
        deltas: Iterable[RawDelta] = itertools.chain(
            map(RawThinkingDelta, _chunks(block.thinking, chunk_chars)),
            [RawSignatureDelta(signature)],
        )
        return RawThinkingBlock(), deltas
    if block.redacted_thinking is not None:
        return RawRedactedThinkingBlock(block.redacted_thinking), []
    assert block.tool_use is not None  # ScriptBlock.__post_init__: one field is set
    tool_id = "toolu_" + secrets.token_hex(12)
    input_json = msgspec.json.encode(block.tool_use.input).decode()
    fragments = _chunks(input_json, _TOOL_INPUT_CHUNK_CHARS)
    return RawToolUseBlock(tool_id, block.tool_use.name), map(RawInputJsonDelta, fragments)


def _lorem(count: int, chunk_chars: int) -> Iterator[str]:
    """``count`` words of filler, in the pieces :func:`_chunks` would cut, never all at once.

    The text is ``_LOREM`` repeated, so a piece of ``chunk_chars`` characters is
    a slice of the repeated cycle: its cost is that piece's size, whatever ``count``.
    """
    if chunk_chars <= 0:
        last = count - 1
        words = itertools.islice(itertools.cycle(_LOREM), count)
        yield from (word if i == last else word + " " for i, word in enumerate(words))
        return
    cycles, rest = divmod(count, len(_LOREM))
    length = cycles * len(_LOREM_CYCLE) + sum(len(word) + 1 for word in _LOREM[:rest])
    length = max(length - 1, 0)  # no space after the last word
    for at in range(0, length, chunk_chars):
        yield _lorem_slice(at, min(at + chunk_chars, length))


def _lorem_slice(start: int, stop: int) -> str:
    """Characters ``start:stop`` of ``_LOREM_CYCLE`` repeated forever."""
    offset = start % len(_LOREM_CYCLE)
    repeats = (offset + stop - start) // len(_LOREM_CYCLE) + 1
    return (_LOREM_CYCLE * repeats)[offset : offset + stop - start]


def _chunks(text: str, chunk_chars: int) -> Iterator[str]:
    """``text`` in pieces that join back to it: words, or ``chunk_chars`` characters."""
    if chunk_chars > 0:
        return (text[at : at + chunk_chars] for at in range(0, len(text), chunk_chars))
    return (match.group() for match in _WORD.finditer(text))


def _delta_chars(delta: RawDelta) -> int:
    match delta:
        case RawTextDelta():
            return len(delta.text)
        case RawThinkingDelta():
            return len(delta.thinking)
        case RawInputJsonDelta():
            return len(delta.partial_json)
    return 0  # a signature is not output text

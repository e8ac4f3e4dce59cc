"""What each provider takes of a session's files, and how a file reads as text.

docs/protocol.md §2 "Files" ("To the model") and §11 "Providers". The
providers build their API's blocks themselves (:mod:`~gateway.providers.anthropic`,
:mod:`~gateway.providers.openai`); what they share is here:

- :func:`refusal`: what a model cannot take, known when the turn is posted
  (the session's agent names its runtime and provider), so that ``POST
  .../turns`` answers 422 ``unsupported_content`` instead of a call that
  fails later. Anthropic and the scripted model take every image and
  document; an OpenAI-compatible server takes images and text, not a PDF
  (Chat Completions has no portable document part: vLLM, Ollama and
  llama.cpp take none); a ``claude-code`` agent takes images, PDFs and text
  (the CLI's streaming input is Anthropic content blocks). No model takes
  audio. The Anthropic API (a ``claude-code`` agent's too) takes an image
  of at most 5 MiB *in base64*, :data:`ANTHROPIC_IMAGE_MAX_BYTES` (3.75 MiB)
  of bytes: a larger one is refused at the POST, and one that comes another
  way (a tool's) is sent as a line of text saying so
  (:func:`too_large`), never a call the API refuses on every retry.
- :data:`IMAGE_TOKENS` and :func:`file_tokens`: a file's share of an input
  estimate (docs/protocol.md §12). Anthropic counts an image as ``width *
  height / 750`` tokens, about 1,600 at most (it scales larger images down);
  the gateway does not decode an image to estimate it, so every image counts
  as that most, 1,600. A document counts as its size / 4 (a character a
  byte, four to a token, as text is counted).
- :func:`missing`: what a model reads in place of a file whose bytes are no
  longer stored (its session deleted during the turn); :func:`not_sent`, in
  place of one past :data:`REQUEST_FILE_BYTES`.
- :func:`said_back`: the scripted model's line for a file it was sent
  (docs/protocol.md §11 "The scripted model").
"""

from __future__ import annotations

import hashlib
import math

from gateway.protocol.shapes import AudioBlock, DocumentBlock, FileBlock, ImageBlock

IMAGE_TOKENS = 1600
"""An image's tokens in an estimate: Anthropic's most for one image (module docstring)."""

TAKES_PDF = frozenset({"anthropic", "scripted"})
"""The providers whose API takes a PDF document (besides a ``claude-code`` agent)."""

ANTHROPIC_IMAGE_MAX_BYTES = 5 * 1024 * 1024 * 3 // 4
"""The largest image the Anthropic API takes: 5 MiB of base64, 3.75 MiB of bytes."""

REQUEST_FILE_BYTES = 24 * 1024 * 1024
"""The bytes of files one model call carries, the newest first (gateway.providers.history,
rule 8): the Anthropic API takes a request of 32 MB, base64 making a file a third
larger; a session may hold 100 files of 20 MiB, which no call reads whole."""


def image_limit(runtime: str, provider: str) -> int | None:
    """The largest image in bytes a model of this runtime and provider takes; None: no limit
    of its own (the gateway's ``[files] max_bytes``)."""
    if runtime == "claude-code" or provider == "anthropic":
        return ANTHROPIC_IMAGE_MAX_BYTES
    return None


def refusal(runtime: str, provider: str, block: FileBlock) -> str | None:
    """Why a model of this runtime and provider cannot take ``block``; ``None`` if it can.

    Args:
        runtime: the agent's runtime (``native`` or ``claude-code``).
        provider: the name of the agent's provider (``anthropic``, ``openai``, ``scripted``).
    """
    if isinstance(block, AudioBlock):
        return f"{block.media_type}: no model of this gateway takes audio"
    if isinstance(block, ImageBlock):
        most = image_limit(runtime, provider)
        return too_large(block, most) if most is not None and block.size > most else None
    if runtime == "claude-code" or provider in TAKES_PDF:
        return None
    if block.media_type.startswith("text/"):
        return None
    return (
        f"{block.file_id} is {block.media_type}, which an OpenAI-compatible model"
        f" ({provider}) cannot take: send its text, or use an agent on anthropic"
    )


def file_tokens(block: FileBlock) -> int:
    """A file's tokens in an input estimate (module docstring); audio is never sent: 0."""
    if isinstance(block, ImageBlock):
        return IMAGE_TOKENS
    if isinstance(block, DocumentBlock):
        return math.ceil(block.size / 4)
    return 0


def too_large(block: FileBlock, most: int) -> str:
    """Why an image is over what the model takes (a refusal, or the text sent instead)."""
    return (
        f"[image {block.file_id} is {block.size} bytes; this model takes an image"
        f" of at most {most} bytes]"
    )


def not_sent(block: FileBlock, most: int) -> str:
    """What a model reads in place of a file past :data:`REQUEST_FILE_BYTES` of a call."""
    kind = block.__struct_config__.tag
    return (
        f"[{kind} {block.file_id} {block.media_type} {block.size} bytes: not sent, past the"
        f" {most // (1024 * 1024)} MiB of files one request carries (newer files first)]"
    )


def missing(file_id: str) -> str:
    """What a model reads in place of a file whose bytes are gone."""
    return f"[file {file_id} is no longer stored]"


def document_text(data: bytes) -> str:
    """A text document's text (the gateway took it as UTF-8: gateway.media)."""
    return data.decode("utf-8", errors="replace")


def said_back(block: FileBlock, found: tuple[str, bytes] | None) -> str:
    """The scripted model's line for a file it was sent (docs/protocol.md §11).

    ``[KIND MEDIA_TYPE SIZE bytes sha256:HEX8]``: the block's kind, the media
    type and size of the bytes received, and the first 8 hex digits of their
    SHA-256; :func:`missing`'s line when the request held no bytes for it.
    """
    if found is None:
        return missing(block.file_id)
    media_type, data = found
    digest = hashlib.sha256(data).hexdigest()[:8]
    kind = block.__struct_config__.tag
    return f"[{kind} {media_type} {len(data)} bytes sha256:{digest}]"

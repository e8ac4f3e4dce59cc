"""Reasoning written inline between ``<think>`` and ``</think>`` (docs/protocol.md §6).

``<thinking>`` and ``</thinking>`` count the same way (section 6 names both).

Many OpenAI-compatible servers (DeepSeek-R1 or Qwen3 behind vLLM, llama.cpp
or Ollama without a reasoning parser) stream a model's reasoning in the
``content`` itself, between ``<think>`` and ``</think>``. The contract says
such reasoning is a thinking block with its own lifecycle and that the tags
never reach a text block. :class:`ThinkTags` is the sans-IO splitter: content
pieces in, ``("thinking" | "text", str)`` pieces out, in order.

A tag may be split across chunks (``"<th"`` then ``"ink>"``): a piece that
ends with what could be the start of a tag holds that end back until the next
piece says whether it is one (at most ``len("</thinking>") - 1`` characters, so
text is never held longer than one chunk). :meth:`ThinkTags.flush` gives back
what is held when the stream ends: it was not a tag.

Decisions where the contract is silent:

- Only the exact tags ``<think>``, ``</think>``, ``<thinking>`` and
  ``</thinking>`` count (lower case, no attributes, no spaces); anything else
  is text.
- Reasoning opened by one form ends only at that form's closing tag: inside
  ``<think>``, a ``</thinking>`` is reasoning text, not a close (and the other
  way round).
- The whitespace right after ``<think>`` and right after ``</think>``
  (usually a newline, and a blank line between the reasoning and the answer)
  and whitespace before a message's first ``<think>`` are dropped, so no block
  starts with them or is made of them alone.
- A ``</think>`` outside reasoning (a chat template that opened the tag in the
  prompt, so the reasoning streamed as plain content) cannot be told apart
  from the answer while it streams: what came before it stays text, and the
  tag itself is dropped. Serve such models with the server's reasoning parser
  (``reasoning_content``) to get their thinking as thinking.
"""

from __future__ import annotations

from typing import Literal

OPEN = "<think>"
CLOSE = "</think>"
#: Each opening tag with the closing tag that ends what it opened.
PAIRS = {"<think>": "</think>", "<thinking>": "</thinking>"}
TAGS = (*PAIRS, *PAIRS.values())
LONGEST = max(len(tag) for tag in TAGS)

Kind = Literal["thinking", "text"]


class ThinkTags:
    """Splits streamed content into thinking and text pieces (module docstring)."""

    def __init__(self) -> None:
        self._inside = False
        self._close = CLOSE  # the closing tag that ends the reasoning now open
        self._pending = ""  # a possible partial tag at the end of the last piece
        self._strip = False  # drop the whitespace that starts the next text
        # Whitespace-only text before any other content (None once content began).
        self._blank_lead: str | None = ""

    def feed(self, piece: str) -> list[tuple[Kind, str]]:
        """One content piece; the thinking and text it holds, in order."""
        data = self._pending + piece
        self._pending = ""
        out: list[tuple[Kind, str]] = []
        while data:
            kind: Kind = "thinking" if self._inside else "text"
            at, tag = _first_tag(data, close=self._close if self._inside else None)
            if at < 0:
                keep = _partial_tag_suffix(data)
                out += self._emit(kind, data[: len(data) - keep])
                self._pending = data[len(data) - keep :]
                break
            out += self._emit(kind, data[:at])
            if tag in PAIRS:
                self._blank_lead = None  # whitespace before the first <think> is dropped
                self._inside = True
                self._close = PAIRS[tag]
                self._strip = True
            else:  # a closing tag ends reasoning, or is dropped outside it
                self._inside = False
                self._strip = True
            data = data[at + len(tag) :]
        return out

    def flush(self) -> list[tuple[Kind, str]]:
        """The end of the content: whatever was held back is what it looked like."""
        pending, self._pending = self._pending, ""
        out = self._emit("thinking" if self._inside else "text", pending)
        blank, self._blank_lead = self._blank_lead, None
        if blank and not out:
            out.append(("text", blank))  # a message of whitespace only is what it is
        return out

    def _emit(self, kind: Kind, text: str) -> list[tuple[Kind, str]]:
        if self._strip:
            text = text.lstrip()
        if not text:
            return []
        if kind == "thinking":
            self._strip = False
            return [(kind, text)]
        if text.isspace() and self._blank_lead is not None:
            self._blank_lead += text  # perhaps before a <think>: held (module docstring)
            return []
        self._strip = False
        lead, self._blank_lead = self._blank_lead or "", None
        return [("text", lead + text)]


def _first_tag(data: str, *, close: str | None) -> tuple[int, str]:
    """Where the next tag that matters starts, and which (-1 when none).

    Inside reasoning (``close`` given) only that closing tag matters; outside,
    the earliest of every tag (a closing one is then dropped).
    """
    if close is not None:
        return data.find(close), close
    best, found = -1, OPEN
    for tag in TAGS:
        at = data.find(tag)
        if at >= 0 and (best < 0 or at < best):
            best, found = at, tag
    return best, found


def _partial_tag_suffix(data: str) -> int:
    """How many characters at the end of ``data`` could begin a tag."""
    for size in range(min(LONGEST - 1, len(data)), 0, -1):
        end = data[-size:]
        if any(tag.startswith(end) for tag in TAGS):
            return size
    return 0

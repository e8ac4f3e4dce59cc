"""The summary in Claude Code's compact summary message, without the Claude Agent SDK
(gateway.runtimes.claude_code.messages takes it from the stream,
gateway.runtimes.claude_code.forking finds it in a transcript)."""

from __future__ import annotations

_SUMMARY_START = "\nSummary:\n"
_SUMMARY_ENDS = ("\n\nIf you need specific details", "\nContinue the conversation from where")


def compact_summary(text: str) -> str:
    """The summary in the user message Claude Code sends after ``compact_boundary``.

    Claude Code 2.1.332 frames it (``isSynthetic`` on the stream,
    ``isCompactSummary`` in its transcript): a notice that the session goes
    on from a summary, ``Summary:``, the summary, then where its transcript
    is (a host path, never shown to clients) and an instruction to go on.
    The summary alone is kept; without the framing, the text less any line
    naming the transcript.
    """
    start = text.find(_SUMMARY_START)
    body = text[start + len(_SUMMARY_START) :] if start >= 0 else text
    for end in _SUMMARY_ENDS:
        at = body.find(end)
        if at >= 0:
            body = body[:at]
    lines = [line for line in body.split("\n") if "transcript at:" not in line]
    return "\n".join(lines).strip()


__all__ = ["compact_summary"]

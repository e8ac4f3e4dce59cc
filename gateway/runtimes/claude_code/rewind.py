"""A rewound turn of a Claude Code session: where the CLI's conversation resumes.

docs/protocol.md §2 "Edit and regenerate", §11: a turn that rewinds to one of
the session's user messages restarts the session's CLI on the conversation
before that message: ``resume`` with ``resume_session_at`` the transcript
entry right before that message's prompt. The gateway names each prompt it
sends (the streamed user message's ``uuid``: :func:`prompt_uuid`, derived
from the gateway message's id), so the transcript entry of a message is
found by id; its ``parentUuid`` is the entry the CLI resumes at
(:func:`resume_point`). A prompt sent before prompts were named (or by a CLI
that ignored the name) is found by its text, the latest such prompt. A
prompt that was the conversation's first has no entry before it: the CLI
then starts a conversation anew, the transcript set aside
(:func:`set_aside`). A prompt the transcript does not hold (a CLI whose
state was lost: another node's disk) leaves the CLI as it is.

Sans-IO but for :func:`transcript_path` and :func:`set_aside` (blocking file
calls, run in a worker thread).
"""

from __future__ import annotations

import glob
import json
import os
import uuid
from collections.abc import Iterable
from dataclasses import dataclass

_NAMESPACE = uuid.UUID("0d6a5f1e-8c2b-4e7a-9f31-6b2c4d8e7a10")  # of prompt_uuid


def prompt_uuid(message_id: str) -> str:
    """The transcript entry uuid the gateway gives the prompt of a user message."""
    return str(uuid.uuid5(_NAMESPACE, message_id))


@dataclass(frozen=True)
class ResumePoint:
    """Where the CLI's conversation resumes: after the entry ``at``; ``None``: anew."""

    at: str | None


def resume_point(lines: Iterable[str], message_id: str, text: str) -> ResumePoint | None:
    """Where a rewind to the user message ``message_id`` (its prompt ``text``) resumes.

    ``lines``: the transcript (JSON lines). ``None``: the transcript does not
    hold the prompt (module docstring).
    """
    named = prompt_uuid(message_id)
    by_text: dict[str, str | None] | None = None
    for line in lines:
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if not isinstance(entry, dict) or entry.get("type") != "user":
            continue
        parent = entry.get("parentUuid")
        parent = parent if isinstance(parent, str) else None
        if entry.get("uuid") == named:
            return ResumePoint(parent)
        if _prompt_text(entry) == text:
            by_text = {"at": parent}
    return ResumePoint(by_text["at"]) if by_text is not None else None


def _prompt_text(entry: dict[str, object]) -> str | None:
    """A user entry's prompt as text (None: tool results, a command, a summary)."""
    if entry.get("isMeta") or entry.get("isCompactSummary") or entry.get("toolUseResult"):
        return None
    message = entry.get("message")
    content = message.get("content") if isinstance(message, dict) else None
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(
        isinstance(b, dict) and b.get("type") == "text" for b in content
    ):
        return "".join(str(b.get("text", "")) for b in content)
    return None


def transcript_path(home: str, claude_id: str) -> str | None:
    """The transcript of ``claude_id`` under the state directory ``home`` (blocking)."""
    projects = os.path.join(home, ".claude", "projects")
    found = glob.glob(os.path.join(glob.escape(projects), "*", f"{claude_id}.jsonl"))
    return found[0] if found else None


def read_point(home: str, claude_id: str, message_id: str, text: str) -> ResumePoint | None:
    """:func:`resume_point` of the session's transcript (blocking; None: no transcript)."""
    path = transcript_path(home, claude_id)
    if path is None:
        return None
    with open(path, encoding="utf-8", errors="replace") as f:
        return resume_point(f, message_id, text)


def set_aside(home: str, claude_id: str) -> None:
    """Move the transcript aside (``<id>.rewound-N.jsonl``): the CLI starts anew (blocking)."""
    path = transcript_path(home, claude_id)
    if path is None:
        return
    n = 1
    while os.path.exists(f"{path[: -len('.jsonl')]}.rewound-{n}.jsonl"):
        n += 1
    os.replace(path, f"{path[: -len('.jsonl')]}.rewound-{n}.jsonl")

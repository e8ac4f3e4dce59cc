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

A fork that has run no turn yet (docs/protocol.md §11, "Forks") has no
transcript of its own: its first CLI resumes the source's conversation at the
fork point its state directory names (:mod:`gateway.runtimes.claude_code.forking`).
A rewind then moves that fork point back to the entry before the message (or,
at the conversation's first prompt, makes it a new conversation).

Sans-IO but for :func:`rewind_state` and :func:`set_aside` (blocking file
calls, run in a worker thread).
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterable
from dataclasses import dataclass

from gateway.runtimes.claude_code.forking import FORK_FILE, fork_of
from gateway.runtimes.claude_code.paths import transcript_path

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


def rewind_state(home: str, claude_id: str, message_id: str, text: str) -> ResumePoint | None:
    """Make the session's state directory resume before the user message ``message_id``
    (module docstring); where its own transcript resumes (``None``: nothing to resume at
    with ``resume_session_at``: a new conversation, a fork point moved, or the prompt
    not found). Blocking.
    """
    own = transcript_path(home, claude_id)
    origin = fork_of(home)
    source = own or (transcript_path(home, origin[0]) if origin is not None else None)
    if source is None:
        return None
    with open(source, encoding="utf-8", errors="replace") as f:
        point = resume_point(f, message_id, text)
    if point is None:
        return None
    if point.at is None:  # the conversation's first prompt: a new conversation
        set_aside(home, claude_id)
        return None
    if own is None and origin is not None:  # a fork not started: its fork point moves back
        with open(os.path.join(home, FORK_FILE), "w", encoding="utf-8") as f:
            json.dump({"resume": origin[0], "at": point.at}, f)
        return None
    return point


def set_aside(home: str, claude_id: str) -> None:
    """Move the transcript (``<id>.rewound-N.jsonl``) and a fork's fork point aside: the
    CLI starts a new conversation (blocking)."""
    path = transcript_path(home, claude_id)
    if path is not None:
        stem = path[: -len(".jsonl")]
        n = 1
        while os.path.exists(f"{stem}.rewound-{n}.jsonl"):
            n += 1
        os.replace(path, f"{stem}.rewound-{n}.jsonl")
    fork = os.path.join(home, FORK_FILE)
    if os.path.exists(fork):
        os.replace(fork, fork + ".rewound")

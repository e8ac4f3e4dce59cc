"""A fork of a Claude Code session: its CLI resumes the source's conversation at the fork point.

docs/protocol.md §11, "Forks". The fork's gateway history is a copy of the
source's up to the fork point (gateway.session.fork_point); what its model
sees is Claude Code's, from the transcript. So, when the fork is made
(:func:`prepare`, on the node that runs the source):

- the transcript the source's CLI continues is found in the source's state
  directory: its own (``<Claude Code session id>.jsonl``), or, for a fork
  that has run no turn yet, the one it was forked from (its
  :data:`FORK_FILE` names it);
- the fork point is found in it (:func:`resume_point`): the last entry of the
  source's messages the fork keeps, the entries Claude Code wrote after it
  in the same turn (its hooks' attachments) included;
- that transcript is copied, whole lines only, into the fork's own state
  directory, under the project of the fork's workspace, and
  :data:`FORK_FILE` written beside it.

When the fork's first CLI starts (gateway.runtimes.claude_code.process), it has
no transcript of its own but that file: it is started with the SDK's
``resume`` (the source's Claude Code session), ``fork_session``,
``session_id`` (the fork's own, derived as every session's) and
``resume_session_at`` (the fork point), so Claude Code writes the fork's own
transcript, which every later start resumes as usual. A fork with no history
(of an empty session, or at its first user message) starts a new
conversation, as a new session does.

No import of the Claude Agent SDK here: the node makes forks whether or not
the claude-code extra is installed.
"""

from __future__ import annotations

import json
import os
import re
import unicodedata
from collections.abc import Iterable, Sequence
from typing import Any

from gateway.protocol.shapes import CompactionBlock, Message, ToolResultBlock
from gateway.runtimes.claude_code.paths import own_state, transcript_path
from gateway.runtimes.claude_code.summary import compact_summary

FORK_FILE = ".fork.json"
"""In a fork's state directory: ``{"resume": <Claude Code session id>, "at": <entry uuid>}``."""

_PROJECT = re.compile(r"[^a-zA-Z0-9]")
MAX_PROJECT_CHARS = 200
"""The longest project directory name Claude Code uses as is (a longer one gets a hash of
its own, which the gateway cannot compute: a fork there is ``transcript_unavailable``)."""


class TranscriptUnavailable(Exception):
    """The source's Claude Code conversation cannot be resumed at the fork point."""


def project_dir(cwd: str) -> str:
    """The name of the project directory Claude Code keeps a workspace's transcripts in.

    Its working directory, resolved (``realpath``, NFC), every character but
    ``A-Z a-z 0-9`` a ``-``: Claude Code's own rule (and the SDK's
    ``project_key_for_directory``) for names up to :data:`MAX_PROJECT_CHARS`.
    """
    return _PROJECT.sub("-", unicodedata.normalize("NFC", os.path.realpath(cwd)))


def fork_of(home: str) -> tuple[str, str] | None:
    """What a fork's state directory says its first CLI resumes: (session id, entry uuid).

    ``None``: not a fork, or a fork with no history (a new conversation).
    """
    try:
        with open(os.path.join(home, FORK_FILE), encoding="utf-8") as f:
            found = json.load(f)
        return str(found["resume"]), str(found["at"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def resume_point(lines: Iterable[str], last: Message) -> str | None:
    """The uuid of the transcript entry the fork keeps last; ``None`` if it holds no ``last``.

    ``last`` is the last message of the fork's history: an assistant message
    (found by its API id, a split message's ``~n`` left out), a message of
    tool results (by their tool uses) or a compaction's ``context`` message
    (Claude Code's summary). The entries Claude Code wrote after it before
    its next message (a hook's attachments) belong to it. A sub-agent's
    entries (``isSidechain``) are not the main conversation.
    """
    entries = [e for e in _entries(lines) if e.get("uuid") and not e.get("isSidechain")]
    match = _matcher(last, entries)
    found = None
    for i, entry in enumerate(entries):
        if match(entry):
            found = i
    if found is None:
        return None
    for entry in entries[found + 1 :]:
        if entry.get("type") in ("user", "assistant"):
            break
        found += 1
    return str(entries[found]["uuid"])


def prepare(
    source_home: str,
    source_claude_id: str,
    fork_home: str,
    fork_created_at: int,
    fork_cwd: str,
    history: Sequence[Message],
) -> None:
    """Make the fork's state directory resume the source's conversation (module docstring).

    Blocking. Nothing to do for a fork with no history.

    Raises:
        TranscriptUnavailable: the source's transcript is not on this node's
            storage, or holds no entry for the fork's last message.
    """
    if not history:
        return
    origin = fork_of(source_home)
    claude_id = source_claude_id
    if transcript_path(source_home, claude_id) is None and origin is not None:
        claude_id = origin[0]  # a fork that ran no turn: the conversation it resumes
    path = transcript_path(source_home, claude_id)
    if path is None:
        raise TranscriptUnavailable(
            "its Claude Code transcript is not on this node's storage (docs/protocol.md §11,"
            " Resume)"
        )
    with open(path, "rb") as f:
        data = f.read()
    data = data[: data.rfind(b"\n") + 1]  # whole lines: the CLI may be writing its last
    at = resume_point(data.decode("utf-8", errors="replace").splitlines(), history[-1])
    if at is None:
        raise TranscriptUnavailable(
            f"its Claude Code transcript holds no entry of message {history[-1].id!r}"
        )
    project = project_dir(fork_cwd)
    if len(project) > MAX_PROJECT_CHARS:
        raise TranscriptUnavailable(
            f"the fork's workspace path is longer than Claude Code's project names"
            f" ({MAX_PROJECT_CHARS} characters): put [sessions] workspace_root higher"
        )
    own_state(fork_home, fork_created_at)
    projects = os.path.join(fork_home, ".claude", "projects", project)
    os.makedirs(projects, mode=0o700, exist_ok=True)
    with open(os.path.join(projects, f"{claude_id}.jsonl"), "wb") as f:
        f.write(data)
    with open(os.path.join(fork_home, FORK_FILE), "w", encoding="utf-8") as f:
        json.dump({"resume": claude_id, "at": at}, f)


def _entries(lines: Iterable[str]) -> list[dict[str, Any]]:
    out = []
    for line in lines:
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict):
            out.append(entry)
    return out


def _content(entry: dict[str, Any]) -> list[Any]:
    message = entry.get("message")
    content = message.get("content") if isinstance(message, dict) else None
    return content if isinstance(content, list) else []


def _text(entry: dict[str, Any]) -> str:
    """An entry's text: its message's content as a string, or its text blocks."""
    message = entry.get("message")
    content = message.get("content") if isinstance(message, dict) else None
    if isinstance(content, str):
        return content
    return "".join(str(b.get("text", "")) for b in _content(entry) if isinstance(b, dict))


def _summary_matcher(last: Message, entries: Sequence[dict[str, Any]]) -> Any:
    """Which compact summary of the transcript a ``context`` message is: the one whose
    summary is its summary (a transcript may hold several: the last is not the fork
    point's when the fork is at an earlier one); a single summary is it whatever its
    text; else none (the fork point is not found)."""
    summaries = [e for e in entries if e.get("type") == "user" and e.get("isCompactSummary")]
    said = "".join(b.summary for b in last.content if isinstance(b, CompactionBlock)).strip()
    holding = [e for e in summaries if compact_summary(_text(e)) == said]
    chosen = holding or (summaries if len(summaries) == 1 else [])
    ids = {id(e) for e in chosen}
    return lambda e: id(e) in ids


def _matcher(last: Message, entries: Sequence[dict[str, Any]]) -> Any:
    """Whether a transcript entry is (a part of) ``last``."""
    if last.role == "assistant":
        api_id = last.id.partition("~")[0]
        return lambda e: (
            e.get("type") == "assistant"
            and isinstance(e.get("message"), dict)
            and e["message"].get("id") == api_id
        )
    if last.role == "context":
        return _summary_matcher(last, entries)
    uses = {b.tool_use_id for b in last.content if isinstance(b, ToolResultBlock)}
    return lambda e: (
        e.get("type") == "user"
        and any(
            isinstance(b, dict) and b.get("type") == "tool_result" and b.get("tool_use_id") in uses
            for b in _content(e)
        )
    )

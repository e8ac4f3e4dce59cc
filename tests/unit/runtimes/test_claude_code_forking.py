"""A Claude Code fork's state, without a CLI (gateway.runtimes.claude_code.forking).

docs/protocol.md §11, "Forks": the fork point found in a transcript of the
shape Claude Code 2.1.332 writes (the entries of a real run: prompts,
attachments after a reply, one assistant entry per block, tool results); the
source's transcript copied into the fork's state directory, under the
project of the fork's workspace, with the file that says where the first CLI
resumes; a fork of a fork that ran no turn resuming the same conversation;
what cannot be resumed. And the SDK's options of a fork's first CLI (with the
claude-code extra). tests/system/claude_code/test_claude_code_fork.py runs it
with the real CLI.
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path
from typing import Any

import pytest

from gateway.protocol.shapes import CompactionBlock, Message, TextBlock, ToolResultBlock
from gateway.runtimes.claude_code.forking import (
    FORK_FILE,
    TranscriptUnavailable,
    fork_of,
    prepare,
    project_dir,
    resume_point,
)
from gateway.runtimes.claude_code.paths import CREATED, transcript_path


def entry(type_: str, uuid: str, **fields: Any) -> dict[str, Any]:
    return {"type": type_, "uuid": uuid, **fields}


def said(message_id: str, *blocks: str) -> dict[str, Any]:
    return {"id": message_id, "role": "assistant", "content": [{"type": b} for b in blocks]}


TRANSCRIPT = [
    {"type": "queue-operation"},  # no uuid: not a conversation entry
    entry("user", "p1", message={"role": "user", "content": "first APPLE"}),
    entry("attachment", "x1"),
    entry("assistant", "a1", message=said("msg_A", "text")),
    entry("attachment", "x2"),  # after the reply, in its turn
    {"type": "last-prompt"},
    entry("user", "p2", message={"role": "user", "content": "second BANANA"}),
    entry("assistant", "a2t", message=said("msg_B", "text")),
    entry("assistant", "a2u", message=said("msg_B", "tool_use")),
    entry(
        "user",
        "r2",
        message={"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1"}]},
    ),
    entry("assistant", "side", message=said("msg_C", "text"), isSidechain=True),
    entry("assistant", "a3", message=said("msg_C", "text")),
    entry("user", "s1", isCompactSummary=True, message={"role": "user", "content": "Summary"}),
]
LINES = [json.dumps(e) for e in TRANSCRIPT]


def message(id_: str, role: Any, *blocks: Any) -> Message:
    return Message(id_, "sess_1", "turn_1", role, list(blocks) or [TextBlock("x")], "complete", 0)


def test_the_fork_point_is_the_messages_last_entry_and_what_claude_code_wrote_after_it() -> None:
    assert resume_point(LINES, message("msg_A", "assistant")) == "x2"
    assert resume_point(LINES, message("msg_B", "assistant")) == "a2u"  # its last block
    assert resume_point(LINES, message("msg_B~1", "assistant")) == "a2u"  # a split message
    results = message("msg_r", "user", ToolResultBlock("toolu_1", "done"))
    assert resume_point(LINES, results) == "r2"
    assert resume_point(LINES, message("msg_C", "assistant")) == "a3"  # not the sub-agent's
    context = message("msg_s", "context", CompactionBlock("Summary", []))
    assert resume_point(LINES, context) == "s1"


def test_a_message_the_transcript_does_not_hold_has_no_point() -> None:
    assert resume_point(LINES, message("msg_Z", "assistant")) is None
    assert resume_point(["not json", "[1]", ""], message("msg_A", "assistant")) is None


def write(home: Path, claude_id: str, lines: list[str], project: str = "-src") -> Path:
    folder = home / ".claude" / "projects" / project
    folder.mkdir(parents=True)
    path = folder / f"{claude_id}.jsonl"
    path.write_text("".join(f"{line}\n" for line in lines))
    return path


def test_the_transcript_is_copied_under_the_forks_project_with_where_it_resumes(
    tmp_path: Path,
) -> None:
    source, fork, cwd = tmp_path / "src", tmp_path / "fork", tmp_path / "work space"
    cwd.mkdir()
    original = write(source, "cc-src", LINES)
    with original.open("a") as f:
        f.write('{"type": "assistant", "uuid": "half-writ')  # the CLI writing its last line
    history = [message("p1", "user"), message("msg_A", "assistant")]
    prepare(str(source), "cc-src", str(fork), 1234, str(cwd), history)
    copy = fork / ".claude" / "projects" / project_dir(str(cwd)) / "cc-src.jsonl"
    assert copy.read_text() == "".join(f"{line}\n" for line in LINES)  # whole lines only
    assert project_dir(str(cwd)) == re.sub("[^A-Za-z0-9]", "-", str(cwd.resolve()))
    assert fork_of(str(fork)) == ("cc-src", "x2")
    assert (fork / CREATED).read_text() == "1234"  # the fork's own: its first CLI keeps it


def test_a_fork_of_a_fork_that_ran_no_turn_resumes_the_same_conversation(
    tmp_path: Path,
) -> None:
    first, second, cwd = tmp_path / "first", tmp_path / "second", tmp_path / "cwd"
    cwd.mkdir()
    write(first, "cc-origin", LINES)
    (first / FORK_FILE).write_text(json.dumps({"resume": "cc-origin", "at": "x2"}))
    history = [message("p1", "user"), message("msg_A", "assistant")]
    prepare(str(first), "cc-first", str(second), 1, str(cwd), history)  # no cc-first.jsonl
    assert fork_of(str(second)) == ("cc-origin", "x2")
    assert transcript_path(str(second), "cc-origin") is not None


def test_what_cannot_be_resumed(tmp_path: Path) -> None:
    source, fork, cwd = tmp_path / "src", tmp_path / "fork", tmp_path / "cwd"
    cwd.mkdir()
    history = [message("msg_A", "assistant")]
    with pytest.raises(TranscriptUnavailable, match="not on this node's storage"):
        prepare(str(source), "cc-src", str(fork), 1, str(cwd), history)
    write(source, "cc-src", LINES)
    with pytest.raises(TranscriptUnavailable, match="no entry of message 'msg_Z'"):
        prepare(str(source), "cc-src", str(fork), 1, str(cwd), [message("msg_Z", "assistant")])
    deep = cwd / ("d" * 120) / ("e" * 120)
    deep.mkdir(parents=True)
    with pytest.raises(TranscriptUnavailable, match="longer than Claude Code's project names"):
        prepare(str(source), "cc-src", str(fork), 1, str(deep), history)
    assert not fork.exists()
    prepare(str(source), "cc-src", str(fork), 1, str(cwd), [])  # no history: a new conversation
    assert not fork.exists() and fork_of(str(fork)) is None


def test_a_fork_file_that_says_nothing_usable_is_none(tmp_path: Path) -> None:
    (tmp_path / FORK_FILE).write_text("{not json")
    assert fork_of(str(tmp_path)) is None
    (tmp_path / FORK_FILE).write_text(json.dumps({"resume": "x"}))
    assert fork_of(str(tmp_path)) is None


@pytest.mark.skipif(
    importlib.util.find_spec("claude_agent_sdk") is None, reason="needs the claude-code extra"
)
def test_a_forks_first_cli_resumes_the_source_as_a_fork_and_later_ones_its_own(
    tmp_path: Path,
) -> None:
    from bench.fake_api import FakeServer
    from gateway.agents import resolve_agents
    from gateway.runtimes.claude_code import options
    from gateway.runtimes.claude_code.paths import claude_session_id
    from tests.claude_code_support import cc_config

    agent = resolve_agents(cc_config(tmp_path, FakeServer()))["default"]
    mine = claude_session_id("sess_fork")
    first = options.cli_options(agent, "sess_fork", "/w", {}, None, False, fork=("cc-src", "x2"))  # type: ignore[arg-type]
    assert (first.resume, first.session_id, first.fork_session) == ("cc-src", mine, True)
    assert first.resume_session_at == "x2"
    later = options.cli_options(agent, "sess_fork", "/w", {}, None, True, fork=("cc-src", "x2"))  # type: ignore[arg-type]
    assert (later.resume, later.session_id, later.fork_session) == (mine, None, False)
    assert later.resume_session_at is None
    plain = options.cli_options(agent, "sess_fork", "/w", {}, None)  # type: ignore[arg-type]
    assert (plain.resume, plain.session_id, plain.fork_session) == (None, mine, False)


@pytest.mark.skipif(
    importlib.util.find_spec("claude_agent_sdk") is None, reason="needs the claude-code extra"
)
def test_the_project_is_named_as_the_sdk_names_it(tmp_path: Path) -> None:
    from claude_agent_sdk._internal.sessions import project_key_for_directory

    cwd = tmp_path / "a b" / "ünï.cödé"
    cwd.mkdir(parents=True)
    assert project_dir(str(cwd)) == project_key_for_directory(str(cwd))


def test_a_fork_at_an_earlier_compaction_resumes_at_its_summary_not_the_last() -> None:
    """Two compactions in the transcript: a fork whose history ends at the first one's
    ``context`` message resumed at the last summary (any ``isCompactSummary`` matched),
    so its CLI saw the conversation past its fork point."""

    def summary(uuid: str, text: str) -> dict[str, Any]:
        content = (
            "This session is being continued.\n\nSummary:\n"
            f"{text}\nContinue the conversation from where we left it."
        )
        return entry(
            "user", uuid, isCompactSummary=True, message={"role": "user", "content": content}
        )

    lines = [
        json.dumps(e)
        for e in [
            *TRANSCRIPT[:-1],
            summary("s1", "We planned the APPLE"),
            entry("user", "p4", message={"role": "user", "content": "third CHERRY"}),
            entry("assistant", "a4", message=said("msg_D", "text")),
            summary("s2", "We planned the APPLE, then ate a CHERRY"),
        ]
    ]
    first = message("msg_s1", "context", CompactionBlock("We planned the APPLE", []))
    later = message(
        "msg_s2", "context", CompactionBlock("We planned the APPLE, then ate a CHERRY", [])
    )
    assert resume_point(lines, later) == "s2"
    assert resume_point(lines, first) == "s1"
    unknown = message("msg_s3", "context", CompactionBlock("Something else", []))
    assert resume_point(lines, unknown) is None  # two summaries, neither its: not found

"""Where a rewound Claude Code turn resumes its CLI (gateway.runtimes.claude_code.rewind).

Pure: a transcript's lines in, the entry to resume at out (docs/protocol.md §2
"Edit and regenerate", §11); the real CLI is in
tests/system/claude_code/test_claude_code_rewind.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gateway.runtimes.claude_code.forking import FORK_FILE, fork_of
from gateway.runtimes.claude_code.paths import transcript_path
from gateway.runtimes.claude_code.rewind import (
    ResumePoint,
    prompt_uuid,
    resume_point,
    rewind_state,
    set_aside,
)


def entry(uuid: str, parent: str | None, kind: str = "user", **more: Any) -> str:
    return json.dumps({"type": kind, "uuid": uuid, "parentUuid": parent, **more})


def prompt(uuid: str, parent: str | None, text: str) -> str:
    return entry(uuid, parent, message={"role": "user", "content": text})


TRANSCRIPT = [
    prompt(prompt_uuid("msg_a"), None, "first"),
    entry("a1", prompt_uuid("msg_a"), "assistant"),
    prompt(prompt_uuid("msg_b"), "a1", "second"),
    entry("b1", prompt_uuid("msg_b"), "assistant"),
    entry(
        "b2",
        "b1",
        message={"role": "user", "content": [{"type": "tool_result"}]},
        toolUseResult={"stdout": ""},
    ),
    entry("b3", "b2", "assistant"),
    "not json",
]


def test_a_named_prompt_resumes_at_the_entry_before_it() -> None:
    assert resume_point(TRANSCRIPT, "msg_b", "second") == ResumePoint("a1")


def test_the_first_prompt_resumes_anew() -> None:
    assert resume_point(TRANSCRIPT, "msg_a", "first") == ResumePoint(None)


def test_an_unnamed_prompt_is_found_by_its_text_the_latest() -> None:
    lines = [
        prompt("p1", None, "same"),
        entry("x", "p1", "assistant"),
        prompt("p2", "x", "same"),
        entry("y", "p2", "assistant"),
    ]
    assert resume_point(lines, "msg_unnamed", "same") == ResumePoint("x")
    blocks = [entry("p3", "y", message={"content": [{"type": "text", "text": "sa"},
                                                    {"type": "text", "text": "me"}]})]  # fmt: skip
    assert resume_point(lines + blocks, "msg_unnamed", "same") == ResumePoint("y")


def test_a_prompt_it_does_not_hold_is_none() -> None:
    assert resume_point(TRANSCRIPT, "msg_z", "nowhere") is None
    meta = [entry("m", None, isMeta=True, message={"content": "nowhere"})]
    assert resume_point(meta, "msg_z", "nowhere") is None


def write(home: Path, claude_id: str, lines: list[str]) -> Path:
    project = home / ".claude" / "projects" / "-work"
    project.mkdir(parents=True, exist_ok=True)
    path = project / f"{claude_id}.jsonl"
    path.write_text("".join(line + "\n" for line in lines))
    return path


def test_a_transcript_set_aside(tmp_path: Path) -> None:
    home = str(tmp_path)
    assert transcript_path(home, "cid") is None
    path = write(tmp_path, "cid", ["one"])
    assert transcript_path(home, "cid") == str(path)
    set_aside(home, "cid")
    write(tmp_path, "cid", ["two"])
    set_aside(home, "cid")
    assert transcript_path(home, "cid") is None
    assert (path.parent / "cid.rewound-1.jsonl").read_text() == "one\n"
    assert (path.parent / "cid.rewound-2.jsonl").read_text() == "two\n"


def test_the_state_resumes_before_the_message_or_anew(tmp_path: Path) -> None:
    home = str(tmp_path)
    assert rewind_state(home, "cid", "msg_b", "second") is None  # no transcript: as it is
    write(tmp_path, "cid", TRANSCRIPT)
    assert rewind_state(home, "cid", "msg_b", "second") == ResumePoint("a1")
    assert rewind_state(home, "cid", "msg_z", "nowhere") is None
    assert transcript_path(home, "cid") is not None  # untouched
    assert rewind_state(home, "cid", "msg_a", "first") is None  # the first: anew
    assert transcript_path(home, "cid") is None


def test_a_fork_not_started_moves_its_fork_point_back(tmp_path: Path) -> None:
    """A fork that ran no turn has the source's transcript and where to resume it."""
    home = str(tmp_path)
    write(tmp_path, "source", TRANSCRIPT)
    (tmp_path / FORK_FILE).write_text(json.dumps({"resume": "source", "at": "b3"}))
    assert rewind_state(home, "fork", "msg_b", "second") is None
    assert fork_of(home) == ("source", "a1")  # its first CLI resumes the source before B
    assert rewind_state(home, "fork", "msg_a", "first") is None
    assert fork_of(home) is None  # at the first prompt: a new conversation
    assert transcript_path(home, "source") is not None  # the source's copy is left

"""What ``gateway chat`` writes of a server's text (gateway/client/chat.py: ``clean``, ``fold``)."""

from __future__ import annotations

import re

import pytest

from gateway.client.chat import (
    Marks,
    ask_form,
    clean,
    fold,
    question_item,
    shown_json,
    simple_items,
)
from gateway.client.views import PermissionView, SimpleView

_CONTROL_CHAR = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def test_terminal_controls_are_stripped_newlines_and_tabs_kept() -> None:
    assert clean("a\x1b[2Jb\x07c\x9bd\x7fe") == "a[2Jbcde"
    assert clean("one\ttwo\r\nthree\n") == "one    two\nthree\n"


@pytest.mark.parametrize(
    "bidi", ["\u202e", "\u202d", "\u202a", "\u202b", "\u202c", "\u2066", "\u2067", "\u2068",
             "\u2069", "\u200e", "\u200f", "\u061c"],
)  # fmt: skip
def test_bidirectional_controls_are_stripped_so_an_input_reads_as_it_runs(bidi: str) -> None:
    """Trojan Source: ``rm -rf /tmp/x`` shown as something else by an override."""
    command = f'{{"command": "echo safe {bidi}; rm -rf ~ #"}}'
    assert fold(command) == '{"command": "echo safe ; rm -rf ~ #"}'


def test_text_of_any_script_and_emoji_sequences_are_kept() -> None:
    text = "שלום مرحبا 你好 👩\u200d💻 e\u0301"  # RTL scripts, a ZWJ sequence, a combining mark
    assert clean(text) == text


def test_a_tool_input_shows_its_bidirectional_controls_as_escapes() -> None:
    """An approval shows what will run, and that it holds a control: never reordered."""
    shown = fold(shown_json({"command": "echo safe \u202e; rm -rf ~ #", "note": "שלום"}))
    assert shown == '{"command": "echo safe \\u202e; rm -rf ~ #", "note": "שלום"}'


# An MCP server's words reach the terminal too: an elicitation's schema and URL.
SCREEN = "\x1b[2J\x1b]0;owned\x07\u202e"


async def test_an_elicitation_form_writes_no_control_of_the_servers_schema() -> None:
    schema = {
        "type": "object",
        "properties": {
            "pick": {"type": "string", "enum": ["a", f"b{SCREEN}"], "title": f"Pick{SCREEN}"},
            "why": {"type": "string", "description": f"say{SCREEN}"},
        },
        "required": ["pick"],
    }
    asked: PermissionView = {
        "perm_id": "perm_1",
        "session_id": "sess_1",
        "kind": "elicitation",
        "tool_use_id": "toolu_1",
        "tool_name": "mcp__x__ask",
        "input": {},
        "expires_at": 0,
        "message": "Which?",
        "requested_schema": schema,
    }
    said: list[str] = []
    answers = iter(["c", "a", "because"])

    async def read_line() -> str | None:
        return next(answers)

    assert await ask_form(asked, read_line, said.append) == {"pick": "a", "why": "because"}
    shown = "".join(said)
    assert "Pick[2J]0;owned" in shown and "say[2J" in shown  # the words, no control
    assert not _CONTROL_CHAR.search(shown)


def test_an_elicitation_url_question_shows_no_control() -> None:
    asked: PermissionView = {
        "perm_id": "perm_1",
        "session_id": "sess_1",
        "kind": "elicitation_url",
        "tool_use_id": "toolu_1",
        "tool_name": f"mcp__x__login{SCREEN}",
        "input": {"url": f"https://example.test/{SCREEN}\nnext"},
        "expires_at": 0,
        "message": "Log in",
        "requested_schema": None,
    }
    line = question_item(asked, None, 200).lines[0].text
    assert "https://example.test/" in line and "\n" not in line
    assert not _CONTROL_CHAR.search(line)


def test_the_simple_views_status_line_shows_a_tool_name_without_control() -> None:
    view: SimpleView = {
        "thread": [],
        "status": {
            "kind": "tool",
            "state": "running",
            "tool_use_id": "toolu_1",
            "tool_name": f"mcp__x__run{SCREEN}",
        },
        "permissions": [],
    }
    [status] = simple_items(view, hidden_turns=set(), width=100, marks=Marks())
    [line] = status.lines
    assert "mcp__x__run" in line.text and not _CONTROL_CHAR.search(line.text)

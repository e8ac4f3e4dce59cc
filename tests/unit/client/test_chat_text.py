"""What ``gateway chat`` writes of a server's text (gateway/client/chat.py: ``clean``, ``fold``)."""

from __future__ import annotations

import pytest

from gateway.client.chat import clean, fold, shown_json


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

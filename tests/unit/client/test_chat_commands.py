"""``gateway chat``'s ``/edit N TEXT`` and ``/retry`` (gateway.client.chat.rewind_command)."""

from __future__ import annotations

import pytest

from gateway.client.chat import rewind_command

SHOWN = [("msg_1", "The first question"), ("msg_3", "The second question")]


def test_a_plain_line_is_a_turn_without_a_rewind() -> None:
    assert rewind_command("Hello there", SHOWN) == ("Hello there", None)
    assert rewind_command("/editing is a word", SHOWN) == ("/editing is a word", None)


def test_edit_sends_the_text_in_place_of_the_nth_message_shown() -> None:
    assert rewind_command("/edit 1 The first, edited", SHOWN) == ("The first, edited", "msg_1")
    assert rewind_command("  /edit 2   two  words ", SHOWN) == ("two  words", "msg_3")


def test_retry_sends_the_last_message_again() -> None:
    assert rewind_command("/retry", SHOWN) == ("The second question", "msg_3")


@pytest.mark.parametrize(
    ("line", "shown", "why"),
    [
        ("/edit 3 x", SHOWN, "no message 3 of yours: 1 to 2"),
        ("/edit 0 x", SHOWN, "no message 0 of yours: 1 to 2"),
        ("/edit one x", SHOWN, "/edit N TEXT"),
        ("/edit 1", SHOWN, "/edit N TEXT"),
        ("/retry now", SHOWN, "/retry takes nothing after it"),
        ("/retry", [], "no message of yours to retry"),
    ],
)
def test_what_it_cannot_do_says_why(line: str, shown: list[tuple[str, str]], why: str) -> None:
    with pytest.raises(ValueError, match=why):
        rewind_command(line, shown)

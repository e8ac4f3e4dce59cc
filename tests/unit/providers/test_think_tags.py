"""Inline ``<think>`` reasoning becomes thinking, never text (docs/protocol.md §6).

The splitter is sans-IO: every test feeds content pieces and reads what comes
out. The property test cuts the same content at every possible place, so a tag
split across chunks is covered at each of its characters.
"""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from gateway.providers.think_tags import Kind, ThinkTags


def split(*pieces: str) -> list[tuple[Kind, str]]:
    """Feed the pieces, then flush; merge consecutive pieces of one kind."""
    tags = ThinkTags()
    out: list[tuple[Kind, str]] = []
    for piece in pieces:
        out += tags.feed(piece)
    out += tags.flush()
    merged: list[tuple[Kind, str]] = []
    for kind, group in itertools.groupby(out, key=lambda p: p[0]):
        merged.append((kind, "".join(text for _, text in group)))
    return merged


def test_reasoning_then_answer() -> None:
    assert split("<think>Let me see.</think>\n\nIt is 4.") == [
        ("thinking", "Let me see."),
        ("text", "It is 4."),
    ]


def test_plain_text_passes_through_untouched() -> None:
    assert split("  Hello, ", "world <b>!") == [("text", "  Hello, world <b>!")]


def test_a_tag_split_at_every_character() -> None:
    content = "\n<think>a<b</think>\n\nanswer < 3 </thin"
    expected = [("thinking", "a<b"), ("text", "answer < 3 </thin")]
    for cut in range(len(content) + 1):
        assert split(content[:cut], content[cut:]) == expected, cut
    assert split(*content) == expected  # one character a chunk


def test_text_is_held_at_most_a_tag_prefix() -> None:
    tags = ThinkTags()
    assert tags.feed("Hello <th") == [("text", "Hello ")]
    assert tags.feed("at") == [("text", "<that")]


def test_text_before_the_reasoning_stays_text() -> None:
    assert split("Sure. <think>hm</think> Done.") == [
        ("text", "Sure. "),
        ("thinking", "hm"),
        ("text", "Done."),
    ]


def test_a_lone_closing_tag_never_reaches_the_text() -> None:
    assert split("reasoning from the prompt</think>\n\nanswer") == [
        ("text", "reasoning from the promptanswer"),
    ]


def test_an_unclosed_reasoning_is_thinking_to_the_end() -> None:
    assert split("<think>still thinking", " when cut") == [
        ("thinking", "still thinking when cut"),
    ]


def test_whitespace_only_content_is_kept() -> None:
    assert split("  ") == [("text", "  ")]


def test_thinking_tags_count_like_think() -> None:
    content = "\n<thinking>a<b</thinking>\n\nanswer < 3 </thinki"
    expected = [("thinking", "a<b"), ("text", "answer < 3 </thinki")]
    for cut in range(len(content) + 1):
        assert split(content[:cut], content[cut:]) == expected, cut
    assert split(*content) == expected  # one character a chunk


def test_a_mismatched_close_is_reasoning_not_a_close() -> None:
    assert split("<think>a</thinking>b</think>c") == [("thinking", "a</thinking>b"), ("text", "c")]
    assert split("<thinking>a</think>b</thinking>c") == [("thinking", "a</think>b"), ("text", "c")]
    assert split("<thinking>a</th", "ink>b</thinking>c") == [
        ("thinking", "a</think>b"),
        ("text", "c"),
    ]


def test_a_lone_thinking_close_never_reaches_the_text() -> None:
    assert split("from the prompt</thinking>\n\nanswer") == [("text", "from the promptanswer")]


PIECE = st.text(alphabet="ab <>/thinkgT\n", max_size=12)


@given(st.lists(PIECE, max_size=8), st.data())
def test_chunking_never_changes_the_outcome(pieces: list[str], data: st.DataObject) -> None:
    """However the content is cut into chunks, the same blocks come out."""
    content = "".join(pieces)
    cuts = sorted(data.draw(st.sets(st.integers(0, len(content)), max_size=6)))
    chunks = [content[a:b] for a, b in itertools.pairwise([0, *cuts, len(content)])]
    assert split(*chunks) == split(content)

"""``gateway chat`` and a busy session (docs/protocol.md §2 "A busy session").

Without a daemon, as test_chat_forms.py: the screen items from the views of
the recorded traces ``queue`` and ``steer`` (queued turns listed under the
conversation, a steer in its turn), and the command line driven through the
chat's own key handler with a stand-in session that records what is sent
(``/queue`` and ``/steer``, edited, dropped, refused). tests/system/client/
test_chat.py runs the real command against a real gateway.
"""

from __future__ import annotations

import io
from typing import Any

import pytest
import trio
import trio.testing

from gateway.client.chat import (
    Chat,
    Marks,
    accepted_note,
    full_items,
    parse_command,
    simple_items,
)
from gateway.errors import ApiError
from gateway.protocol.http import TurnAccepted
from tests.integration.client.test_conformance import record
from tests.unit.client.test_chat_forms import StandInKeyboard, StandInSession

YOU = Marks().you
QUEUED = TurnAccepted("turn_9", queued=True, position=1)


def lines_of(items: Any) -> list[str]:
    return [line.text for item in items for line in item.lines]


def step_views(trace: str, frame_type: str, count: int = 1) -> tuple[Any, Any]:
    """The trace's expected views right after its ``count``-th event of ``frame_type``."""
    frames = record.load_trace(trace)
    seen = 0
    upto = 0
    for upto, frame in enumerate(frames, start=1):  # noqa: B007 (where it stopped)
        if frame["type"] == "event" and frame["event"]["type"] == frame_type:
            seen += 1
            if seen == count:
                break
    expected = record.expected_views(frames[:upto], False)["final"]
    return expected["full"], expected["simple"]


def test_queued_turns_are_listed_under_the_conversation_in_both_views() -> None:
    full, simple = step_views("queue", "turn.queued", 3)
    marks = Marks()
    for items in (
        full_items(full, {}, hidden_turns=set(), width=100, marks=marks),
        simple_items(simple, hidden_turns=set(), width=100, marks=marks),
    ):
        shown = lines_of(items)
        assert shown[-3:] == [
            "… queued 1: The second question",
            "… queued 2: The third question",
            "… queued 3: The fourth question",
        ]
        assert [item.final for item in items if item.key.startswith("queued:")] == [False] * 3
    # the cancel: the fourth moves up
    full, simple = step_views("queue", "turn.cancelled")
    shown = lines_of(simple_items(simple, hidden_turns=set(), width=100, marks=marks))
    assert shown[-2:] == ["… queued 1: The second question", "… queued 2: The fourth question"]
    ascii_ = lines_of(
        full_items(full, {}, hidden_turns=set(), width=100, marks=Marks.for_encoding("ascii"))
    )
    assert ascii_[-1] == "... queued 2: The fourth question"


def test_a_steer_is_shown_in_its_turn_though_the_turn_was_sent_from_here() -> None:
    """The chat hides the user message of a turn it sent (the prompt line shows it), never
    a steer of that turn."""
    expected = record.load_expected("steer")["final"]
    marks = Marks()
    full = lines_of(
        full_items(expected["full"], {}, hidden_turns={"turn_1"}, width=100, marks=marks)
    )
    simple = lines_of(
        simple_items(expected["simple"], hidden_turns={"turn_1"}, width=100, marks=marks)
    )
    for shown in (full, simple):
        assert not any("Let me look" in line and "script" in line for line in shown)
        at = shown.index(YOU + " Also check the weather.")
        assert shown[at + 1] == "  (steered)"
        assert shown.index("You said: Also check the weather.") > at
    assert full.index("Let me look.") < full.index(YOU + " Also check the weather.")
    assert "Let me look." not in simple  # the simple view's reply moved below the steer


@pytest.mark.parametrize(
    ("line", "parsed"),
    [
        ("/queue do this next", ("queue", "do this next")),
        ("  /steer   and that  ", ("steer", "and that")),
        ("/queue", None),
        ("/queue   ", None),
        ("/queued x", None),
        ("queue x", None),
        ("/cancel 1", None),
    ],
)
def test_a_command_is_queue_or_steer_and_a_text(line: str, parsed: Any) -> None:
    assert parse_command(line) == parsed


def test_what_the_gateway_made_of_it_is_one_line() -> None:
    assert accepted_note(TurnAccepted("turn_1", queued=True, position=2)) == (
        "(queued: position 2)"
    )
    assert "steered" in accepted_note(TurnAccepted("turn_1", steered=True))
    assert "started" in accepted_note(TurnAccepted("turn_1"))


class BusySession(StandInSession):
    """The state of the ``queue`` trace while its first turn runs; records each submit."""

    def __init__(self, answer: TurnAccepted | ApiError) -> None:
        frames = record.load_trace("queue")
        first = next(n for n, f in enumerate(frames) if f["type"] == "event")
        super().__init__("queue", first + 1)  # its turn.started
        self.answer = answer
        self.submitted: list[tuple[str, str | None]] = []

    async def submit(self, content: str, *, if_busy: str | None = None) -> TurnAccepted:
        self.submitted.append((content, if_busy))
        self.done.set()
        if isinstance(self.answer, ApiError):
            raise self.answer
        return self.answer


async def typed(
    keys: list[str],
    answer: TurnAccepted | ApiError = QUEUED,
) -> tuple[BusySession, Chat, str]:
    session = BusySession(answer)
    assert session.state.running_turn_id is not None
    out = io.StringIO()
    chat = Chat(session, StandInKeyboard(keys, []), out, width=lambda: 100)  # type: ignore[arg-type]
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(chat._answer_keys)
            await trio.testing.wait_all_tasks_blocked()  # every key read, the handler idle
            nursery.cancel_scope.cancel()
    return session, chat, out.getvalue()


async def test_slash_opens_a_command_line_that_queues_while_a_turn_runs() -> None:
    keys = [*"/queue the néxt one", "\r"]
    session, chat, shown = await typed(keys)
    assert session.submitted == [("the néxt one", "queue")]
    assert chat.command is None and chat.notice == "(queued: position 1)"
    assert "/queue the néxt one" in shown  # drawn in the region as it was typed
    assert "(queued: position 1)" in shown


async def test_the_command_line_edits_and_steers() -> None:
    keys = [*"/steer yx", "\x7f", *"es", "\n"]
    session, chat, _ = await typed(keys, TurnAccepted("turn_1", steered=True))
    assert session.submitted == [("yes", "steer")]
    assert chat.notice is not None and chat.notice.startswith("(steered")


async def test_esc_drops_the_command_line_and_y_is_text_in_it() -> None:
    session, chat, _ = await typed([*"/queue y", "\x1b", "/", "y"])
    assert session.submitted == []
    assert chat.command == "/y"  # the second one, still open: y went into it
    assert chat.answered == {}


async def test_an_unknown_or_refused_command_says_why() -> None:
    session, chat, _ = await typed([*"/cancel 1", "\r"])
    assert session.submitted == [] and chat.notice is not None and "/queue TEXT" in chat.notice
    refusal = ApiError(409, "queue_full", "session has 8 turns waiting")
    session, chat, _ = await typed([*"/queue more", "\r"], refusal)
    assert chat.notice == "(not sent: session has 8 turns waiting)"


async def test_at_the_prompt_a_queued_turn_is_said_and_no_turn_of_this_chat() -> None:
    session = BusySession(TurnAccepted("turn_9", queued=True, position=1))
    out = io.StringIO()
    chat = Chat(session, StandInKeyboard([], []), out, width=lambda: 100)  # type: ignore[arg-type]
    assert await chat._send_line("/queue later") is None
    assert session.submitted == [("later", "queue")]
    assert "(queued: position 1)" in out.getvalue()
    assert await chat._send_line("/steer") is None  # no text: nothing sent
    assert "need a text" in out.getvalue() and len(session.submitted) == 1
    session.answer = TurnAccepted("turn_8")
    assert await chat._send_line("/steer now") == "turn_8"  # idle: it started


async def test_a_refusal_is_said_on_one_line_without_control() -> None:
    """The gateway's message (or a proxy's) goes into the region: one line, no control."""
    refusal = ApiError(409, "queue_full", "full\x1b[2J\nnow")
    _, chat, shown = await typed([*"/queue more", "\r"], refusal)
    assert chat.notice == "(not sent: full[2J now)"
    assert "\x1b[2J" not in shown

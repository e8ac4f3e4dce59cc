"""Context compaction without I/O (docs/protocol.md §12, gateway.session.compaction).

Properties over generated conversations (turns of tool rounds, cancelled
rounds, earlier compactions), and tables for the edges:

- a plan never parts a tool use from its result, keeps the turn it is told
  to keep (or the latest), and replaces exactly the view's prefix before it;
- once its context message is stored, the model's view is that message and
  then exactly what the plan kept: the replaced messages are still stored;
- a second compaction's context message stands for the first one too;
- the estimate is the last reported input plus chars/4 of what came since,
  and chars/4 of the whole view right after a compaction;
- the history a provider sends renders the summary as a user message merged
  with the next user message, the roles alternating.
"""

from __future__ import annotations

import itertools
import math

import hypothesis.strategies as st
from hypothesis import given, settings

from gateway.doors.agui.mapping import agui_messages
from gateway.protocol.events import ContextCompacted, ContextCompacting, TurnCancelled
from gateway.protocol.shapes import (
    CompactionBlock,
    ContentBlock,
    Message,
    Role,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
    Usage,
)
from gateway.providers.history import MESSAGE_SEPARATOR, SUMMARY_PREFIX, rebuild
from gateway.session import recovery
from gateway.session.compaction import (
    SUMMARY_INPUT_MAX_CHARS,
    SUMMARY_SYSTEM,
    Plan,
    estimate,
    model_view,
    plan,
    render,
    summary_request,
    tokens,
)

_ids = itertools.count()


def msg(
    role: Role, turn: str | None, *content: ContentBlock, usage: Usage | None = None
) -> Message:
    return Message(
        f"msg_{next(_ids)}", "sess_1", turn, role, list(content), "complete", 0, None, usage
    )


def context_of(p: Plan, summary: str = "sum", turn: str | None = None) -> Message:
    return msg("context", turn, CompactionBlock(summary, p.replaces))


@st.composite
def conversations(draw: st.DrawFn) -> list[Message]:
    """Turns: a user message, tool rounds (some cut short: uses without results), an answer."""
    messages: list[Message] = []
    for t in range(draw(st.integers(1, 5))):
        turn = f"turn_{t}"
        messages.append(msg("user", turn, TextBlock(f"question {t}")))
        for r in range(draw(st.integers(0, 3))):
            uses = [
                ToolUseBlock(f"tu_{t}_{r}_{i}", "sleep", {"seconds": i})
                for i in range(draw(st.integers(1, 3)))
            ]
            messages.append(msg("assistant", turn, TextBlock("calling"), *uses))
            if draw(st.booleans()) or r == 0:
                results = draw(st.permutations(uses))
                messages.append(
                    msg("user", turn, *(ToolResultBlock(u.id, "ok", False) for u in results))
                )
            else:  # cancelled before its tools ran: uses without results
                break
        if draw(st.booleans()):
            messages.append(msg("assistant", turn, TextBlock(f"answer {t}")))
    return messages


def assert_no_split(p: Plan, view: list[Message]) -> None:
    cut = len(p.replaced)
    before = {b.id for m in view[:cut] for b in m.content if isinstance(b, ToolUseBlock)}
    before |= {
        b.tool_use_id for m in view[:cut] for b in m.content if isinstance(b, ToolResultBlock)
    }
    after = {b.id for m in view[cut:] for b in m.content if isinstance(b, ToolUseBlock)}
    after |= {
        b.tool_use_id for m in view[cut:] for b in m.content if isinstance(b, ToolResultBlock)
    }
    assert not before & after, "a tool use and its result on both sides of the cut"


@settings(max_examples=150, deadline=None)
@given(conversations(), st.data())
def test_a_plan_keeps_the_turn_whole_and_the_view_is_the_summary_then_the_kept(
    messages: list[Message], data: st.DataObject
) -> None:
    stored = list(messages)
    for _ in range(data.draw(st.integers(1, 3))):  # compactions one after another
        view = model_view(stored)
        # The turn in flight is always in the view (or, between turns, None).
        turns = list(dict.fromkeys(m.turn_id for m in view if m.role != "context"))
        keep = data.draw(st.sampled_from([None, *turns]))
        p = plan(stored, keep)
        keep_turn = keep if keep is not None else view[-1].turn_id
        first = next(
            i for i, m in enumerate(view) if m.role != "context" and m.turn_id == keep_turn
        )
        if p is None:
            assert all(m.role == "context" for m in view[:first])
            continue
        assert p.replaced == view[: len(p.replaced)]  # a prefix of the view
        assert len(p.replaced) <= first  # the kept turn is kept whole
        assert_no_split(p, view)
        previous = view[0] if view[0].role == "context" else None
        old = list(previous.content[0].replaces) if previous else []  # type: ignore[union-attr]
        assert p.replaces == old + [m.id for m in p.replaced if m.role != "context"]
        kept = view[len(p.replaced) :]
        assert p.first_kept == (kept[0] if kept else None)
        ctx = context_of(p)
        stored.append(ctx)
        assert model_view(stored) == [ctx, *kept]
        assert [m for m in stored if m.role != "context"] == messages  # nothing left the store
        # What a provider sends: the summary first, as the user, roles alternating.
        history = rebuild(model_view(stored))
        assert history[0].role == "user"
        assert history[0].content[0] == TextBlock(SUMMARY_PREFIX + "sum")
        assert all(a.role != b.role for a, b in itertools.pairwise(history))


def test_a_cut_that_would_part_a_tool_use_from_its_result_keeps_more() -> None:
    # An older turn whose last tool round straddles nothing; a turn to keep whose
    # first message is (oddly) the results of the previous turn's tool use.
    u1 = msg("user", "t1", TextBlock("go"))
    a1 = msg("assistant", "t1", ToolUseBlock("tu_1", "sleep", {}))
    r1 = msg("user", "t2", ToolResultBlock("tu_1", "ok", False))  # stored under the next turn
    a2 = msg("assistant", "t2", TextBlock("done"))
    p = plan([u1, a1, r1, a2], "t2")
    assert p is not None and p.replaced == [u1] and p.first_kept == a1


def test_nothing_to_compact_with_one_turn_or_only_a_summary_before_it() -> None:
    u1, a1 = msg("user", "t1", TextBlock("hi")), msg("assistant", "t1", TextBlock("hello"))
    assert plan([u1, a1], None) is None
    assert plan([u1, a1], "t1") is None
    u2 = msg("user", "t2", TextBlock("again"))
    p = plan([u1, a1, u2], "t2")
    assert p is not None and p.replaces == [u1.id, a1.id]
    stored = [u1, a1, u2, context_of(p, turn="t2")]
    assert plan(stored, "t2") is None  # only the summary is before the turn
    assert plan(stored, None) is None


def test_messages_in_progress_and_earlier_summaries_never_reach_the_model() -> None:
    u1 = msg("user", "t1", TextBlock("one"))
    a1 = msg("assistant", "t1", TextBlock("two"))
    c1 = msg("context", "t2", CompactionBlock("first", [u1.id]))
    c2 = msg("context", "t2", CompactionBlock("second", [u1.id, a1.id]))
    streaming = Message("msg_s", "sess_1", "t2", "assistant", [TextBlock("par")], "in_progress", 0)
    u2 = msg("user", "t2", TextBlock("three"))
    assert model_view([u1, a1, c1, u2, c2, streaming]) == [c2, u2]
    assert model_view([u1, a1, c1, u2]) == [c1, a1, u2]


def test_the_estimate_is_the_last_reported_input_plus_what_came_since() -> None:
    u1 = msg("user", "t1", TextBlock("x" * 40))  # 10 tokens
    a1 = msg(
        "assistant", "t1", TextBlock("y" * 8), usage=Usage(1000, 2, cache_read_input_tokens=500)
    )
    u2 = msg("user", "t2", TextBlock("z" * 9))  # 3 tokens (ceil)
    assert estimate([u1]) == 10
    assert estimate([u1, a1, u2]) == 1500 + math.ceil(17 / 4)
    # Right after a compaction no call was made on the view: chars/4 of all of it.
    p = plan([u1, a1, u2], "t2")
    assert p is not None
    ctx = context_of(p, summary="s" * 20, turn="t2")
    assert estimate([u1, a1, u2, ctx]) == math.ceil(29 / 4) == tokens([ctx, u2])
    # A call made on the compacted view reports again.
    a2 = msg("assistant", "t2", TextBlock("w" * 4), usage=Usage(7, 1))
    assert estimate([u1, a1, u2, ctx, a2]) == 7 + 1


def test_the_summary_request_renders_the_messages_with_no_tools() -> None:
    prior = msg("context", "t1", CompactionBlock("earlier things", []))
    u1 = msg("user", "t2", TextBlock("read it"))
    a1 = msg("assistant", "t2", TextBlock("ok"), ToolUseBlock("tu_1", "read_file", {"path": "a"}))
    r1 = msg("user", "t2", ToolResultBlock("tu_1", "contents", True))
    request = summary_request("scripted:echo", [prior, u1, a1, r1], "sess_1")
    assert request.system == SUMMARY_SYSTEM and request.tools == [] and request.max_tokens > 0
    [only] = request.messages
    text = only.content[0].text  # type: ignore[union-attr]
    assert text.split(MESSAGE_SEPARATOR) == [
        "context: [summary of what came before] earlier things",
        "user: read it",
        'assistant: ok\n[tool call read_file] {"path":"a"}',
        "user: [tool result (error)] contents",
    ]
    huge = msg("user", "t3", TextBlock("a" * SUMMARY_INPUT_MAX_CHARS + "END"))
    rendered = render([huge])
    assert len(rendered) < SUMMARY_INPUT_MAX_CHARS + 100
    assert rendered.startswith("user: aaa") and rendered.endswith("END")


def test_a_truncation_says_nothing_to_the_model() -> None:
    u1 = msg("user", "t1", TextBlock("old"))
    u2 = msg("user", "t2", TextBlock("new"))
    ctx = msg("context", "t2", CompactionBlock("", [u1.id]))
    history = rebuild(model_view([u1, u2, ctx]))
    assert [(h.role, h.content) for h in history] == [("user", [TextBlock("new")])]


def test_a_crash_during_the_summary_call_is_closed_as_a_cancel_in_the_llm_phase() -> None:
    compacting = ("context.compacting", ContextCompacting("auto", 10))
    state = recovery.plan("t2", [compacting], [])
    assert (state.phase, state.call_id) == ("llm", None)
    assert recovery.closing(state) == [TurnCancelled("t2", recovery.REASON, "llm", False)]
    # Once compacted, the turn was between steps again: the seam, as before.
    compacted = ("context.compacted", ContextCompacted("auto", "summary", 10, 5, "m", "n"))
    assert recovery.plan("t2", [compacting, compacted], []).phase == "seam"


def test_ag_ui_history_leaves_the_context_message_out() -> None:
    u1 = msg("user", "t1", TextBlock("old"))
    ctx = msg("context", "t2", CompactionBlock("summary", [u1.id]))
    assert agui_messages([u1, ctx]) == agui_messages([u1])

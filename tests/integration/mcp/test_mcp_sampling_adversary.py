"""A hostile MCP server's sampling and URL-mode questions: the edges (docs/protocol.md §11).

The MCP side alone (gateway.mcp.questions, gateway.mcp.sampling), with a
recording session in place of a real one: what is refused before anyone is
asked, and what is asked.
"""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

from gateway.mcp.questions import MAX_URL_MESSAGE_CHARS, Questions, url_problem
from gateway.tools.registry import ToolContext


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("https://xn--pple-43d.com/login", None),  # an IDN host in its ASCII form: shown as is
        ("HTTPS://auth.example.com/", None),  # a scheme's case is nothing
        ("https://auth.example.com/\x9b31m", "control"),  # a C1 control (CSI)
        ("https://auth.example.com/\x85", "whitespace"),  # NEL
        ("https://auth.example.com/\u202egnp.exe", "control"),  # right-to-left override
        ("https://auth.example\u200b.com/", "control"),  # a zero-width space in the host
        ("https://auth.example.com/\u2066x\u2069", "control"),  # bidi isolates
        ("https://\u0430pple.com/login", "host"),  # a Cyrillic a: reads as apple.com
        ("https://auth.example.com\\@evil.example/", "user name"),
        ("https://evil.example\\.auth.example.com/", "host"),  # a browser goes to evil.example
        ("https://%65vil.example/", "host"),  # a browser reads evil.example
        ("http://127.0.0.1.evil.example/", "loopback"),
        ("http://localhost.evil.example/", "loopback"),
        ("https:/\\evil.example/", "no host"),
    ],
)
def test_urls_that_read_as_another_are_refused(url: str, problem: str | None) -> None:
    found = url_problem(url)
    if problem is None:
        assert found is None, found
    else:
        assert found is not None and problem in found, (url, found)


class _Asked:
    """A ToolSession whose elicit_url() records what it was asked and allows."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, str]] = []

    async def elicit_url(
        self, ctx: ToolContext, message: str, url: str, completed: trio.Event | None = None
    ) -> str:
        self.asked.append((message, url))
        return "allow"


def _required(message: str, url: str = "https://auth.example.com/grant") -> dict[str, Any]:
    item = {"mode": "url", "url": url, "message": message, "elicitationId": "gate-1"}
    return {"elicitations": [item]}


async def test_a_required_url_elicitation_with_a_huge_message_asks_nobody() -> None:
    """-32042's URLs are checked as a question's are: the message's length too."""
    session = _Asked()
    ctx = ToolContext("ses_a", "turn_a", "toolu_a", "", session=session)  # type: ignore[arg-type]
    questions = Questions("srv", {object(): ctx})
    assert await questions.required(ctx, _required("Authorize first"))
    assert session.asked == [("Authorize first", "https://auth.example.com/grant")]
    session.asked.clear()
    huge = "x" * (MAX_URL_MESSAGE_CHARS + 1)
    assert not await questions.required(ctx, _required(huge))
    assert session.asked == []


# --- the A2A door: a client that reads the question's text only ------------------------


def _a2a_question(kind: str, input: dict[str, Any], message: str) -> str:
    from gateway.doors.a2a.feed import TaskFeed
    from gateway.protocol.events import PermissionRequested
    from tests.integration.mcp.test_mcp_sampling_doors import ev

    feed = TaskFeed("sess_1.turn_1", "sess_1", "turn_1", 0)
    asked = PermissionRequested("perm_1", "toolu_1", "mcp__hb__x", input, 9999, kind, message)  # type: ignore[arg-type]
    outs = feed.receive(ev(1, asked))
    [status] = [e.status_update.status for _, e in outs if e.status_update is not None]
    assert status.state == "TASK_STATE_INPUT_REQUIRED" and status.message is not None
    return "".join(p.text or "" for p in status.message.parts)


def test_the_a2a_question_names_the_url_to_open_and_the_sampling() -> None:
    """Its text, not only its data part: "Allow mcp__hb__x?" hides what a yes allows."""
    url = "https://auth.example.com/login"
    text = _a2a_question("elicitation_url", {"url": url}, "Sign in to Example")
    assert url in text and "Sign in to Example" in text, text
    text = _a2a_question("sampling", {"server": "hb", "messages": []}, "MCP server 'hb' asks")
    assert "MCP server 'hb' asks" in text, text


def test_a_sampling_call_failure_is_not_the_a2a_tasks() -> None:
    """docs/protocol.md §11: a failed sampling call is its server's error, not the turn's."""
    from gateway.doors.a2a.feed import TaskFeed
    from gateway.protocol.events import LlmCallFailed, TurnCompleted
    from gateway.protocol.shapes import Usage
    from tests.integration.mcp.test_mcp_sampling_doors import ev

    feed = TaskFeed("sess_1.turn_1", "sess_1", "turn_1", 0)
    feed.receive(ev(1, LlmCallFailed("call_s", "invalid_request", "temperature", None, "sampling")))
    outs = feed.receive(ev(2, TurnCompleted("turn_1", "error", Usage(), 0.0)))
    [status] = [e.status_update.status for _, e in outs if e.status_update is not None]
    assert status.state == "TASK_STATE_FAILED" and status.message is not None
    said = "".join(p.text or "" for p in status.message.parts)
    assert "temperature" not in said, said


# --- a flood of refusals: the daemon's log stays readable ----------------------------------


async def test_a_flood_of_refused_requests_is_a_few_log_lines(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Each refusal is a line, at most one a REFUSAL_LOG_INTERVAL_S per server and kind:
    a server's 10,000 refused requests would flood (and drop) the daemon's log."""
    import mcp_types as types

    from gateway.mcp.sampling import Samplings

    params = types.CreateMessageRequestParams.model_validate(
        {"messages": [{"role": "user", "content": {"type": "text", "text": "x"}}], "maxTokens": 1}
    )
    samplings = Samplings("srv", {})
    questions = Questions("srv", {})
    bad_url = types.ElicitRequestURLParams.model_validate(
        {"mode": "url", "url": "javascript:alert(1)", "message": "m", "elicitationId": "e"}
    )
    with caplog.at_level("WARNING", logger="gateway.mcp"):
        for _ in range(500):
            out = await samplings.sample(None, params)  # type: ignore[arg-type]
            assert isinstance(out, types.ErrorData)  # each refused, every time
            asked = await questions.ask(None, bad_url)  # type: ignore[arg-type]
            assert isinstance(asked, types.ErrorData)
    kinds = [getattr(r, "event", "") for r in caplog.records]
    assert 1 <= kinds.count("mcp_sampling_refused") <= 2, kinds.count("mcp_sampling_refused")
    assert 1 <= kinds.count("mcp_elicitation_refused") <= 2


async def test_a_flood_while_two_sessions_call_is_a_few_log_lines(
    caplog: pytest.LogCaptureFixture,
) -> None:
    import mcp_types as types

    from gateway.mcp.sampling import Samplings

    params = types.CreateMessageRequestParams.model_validate(
        {"messages": [{"role": "user", "content": {"type": "text", "text": "x"}}], "maxTokens": 1}
    )
    form = types.ElicitRequestFormParams.model_validate(
        {"message": "m", "requestedSchema": {"type": "object", "properties": {}}}
    )
    calls = {
        object(): ToolContext("ses_a", "turn_a", "toolu_a", ""),
        object(): ToolContext("ses_b", "turn_b", "toolu_b", ""),
    }
    samplings, questions = Samplings("srv", calls), Questions("srv", calls)
    with caplog.at_level("WARNING", logger="gateway.mcp"):
        for _ in range(500):
            assert isinstance(await samplings.sample(None, params), types.ErrorData)  # type: ignore[arg-type]
            assert (await questions.ask(None, form)).action == "cancel"  # type: ignore[arg-type, union-attr]
    kinds = [getattr(r, "event", "") for r in caplog.records]
    assert 1 <= kinds.count("mcp_sampling_ambiguous") <= 2
    assert 1 <= kinds.count("mcp_elicitation_ambiguous") <= 2


# --- notifications/elicitation/complete for no question waiting --------------------------


class _Completed:
    """A ToolSession whose elicit_url() allows only what the server said was completed."""

    async def elicit_url(
        self, ctx: ToolContext, message: str, url: str, completed: trio.Event | None = None
    ) -> str:
        return "allow" if completed is not None and completed.is_set() else "deny"


def _url_question(elicitation_id: str) -> Any:
    import mcp_types as types

    return types.ElicitRequestURLParams.model_validate(
        {"mode": "url", "url": "https://auth.example.com/", "message": "Sign in",
         "elicitationId": elicitation_id}
    )  # fmt: skip


async def test_a_stale_completion_answers_no_later_question(autojump_clock: Any) -> None:
    """A completion that came for no question waiting (its question answered on the route,
    the server late) is kept only for the race it is kept for: a new question of the same
    id a minute later (a server with one fixed id) is asked of the user, not allowed."""
    ctx = ToolContext("ses_a", "turn_a", "toolu_a", "", session=_Completed())  # type: ignore[arg-type]
    questions = Questions("srv", {object(): ctx})
    questions.completed("github-auth")
    await trio.sleep(60)
    assert (await questions.ask(None, _url_question("github-auth"))).action == "decline"  # type: ignore[arg-type, union-attr]
    # One that races its own question (the SDK serves them in tasks of their own): allowed.
    questions.completed("el-2")
    assert (await questions.ask(None, _url_question("el-2"))).action == "accept"  # type: ignore[arg-type, union-attr]


# --- a restart with a server's questions open --------------------------------------------


def test_a_restart_resolves_every_open_question_of_a_tool() -> None:
    """docs/protocol.md §8: no permission is left open. A tool asks up to 2 samplings
    (4 questions) at once, each its own permission; and a tool waiting for its server's
    question is running (phase ``tools``), unlike one waiting for its own approval."""
    from gateway.protocol.events import (
        LlmCallCompleted,
        LlmCallStarted,
        PermissionRequested,
        PermissionResolved,
        ToolCalled,
    )
    from gateway.protocol.shapes import Usage
    from gateway.session import recovery

    name = "mcp__hb__sample"
    events: list[tuple[str, Any]] = [
        ("llm.call_started", LlmCallStarted("call_1", "m")),
        ("llm.call_completed", LlmCallCompleted("call_1", "msg_1", "tool_use", Usage())),
        ("tool.called", ToolCalled("toolu_1", name, {})),
        ("permission.requested",
         PermissionRequested("perm_0", "toolu_1", name, {}, 1, "elicitation_url", "?")),
        ("permission.resolved", PermissionResolved("perm_0", "deny")),
        ("permission.requested",
         PermissionRequested("perm_1", "toolu_1", name, {}, 1, "sampling", "?")),
        ("permission.requested",
         PermissionRequested("perm_2", "toolu_1", name, {}, 1, "sampling", "?")),
    ]  # fmt: skip
    state = recovery.plan("turn_1", events, [])
    closing = recovery.closing(state)
    resolved = [p.perm_id for p in closing if isinstance(p, PermissionResolved)]
    assert resolved == ["perm_1", "perm_2"], closing
    assert [type(p).__name__ for p in closing][-2:] == ["ToolFailed", "TurnCancelled"]
    assert closing[-1].phase == "tools", closing[-1]  # type: ignore[attr-defined]


def test_a_restart_ends_a_sampling_call_it_interrupted() -> None:
    """docs/protocol.md §8: every started call gets its end, a sampling call too. A restart
    closes it as a live cancel does: its ``llm.call_failed`` (``cancelled``, ``purpose:
    "sampling"``) before its tool's ``tool.failed``; the phase stays ``tools``."""
    from gateway.protocol.events import (
        LlmCallCompleted,
        LlmCallFailed,
        LlmCallStarted,
        ToolCalled,
    )
    from gateway.protocol.shapes import Usage
    from gateway.session import recovery

    events: list[tuple[str, Any]] = [
        ("llm.call_started", LlmCallStarted("call_1", "m")),
        ("llm.call_completed", LlmCallCompleted("call_1", "msg_1", "tool_use", Usage())),
        ("tool.called", ToolCalled("toolu_1", "mcp__hb__sample", {})),
        ("llm.call_started", LlmCallStarted("call_2", "m", "sampling")),
        ("llm.call_completed",
         LlmCallCompleted("call_2", "msg_x", "end_turn", Usage(), "sampling")),
        ("llm.call_started", LlmCallStarted("call_3", "m", "sampling")),
    ]  # fmt: skip
    state = recovery.plan("turn_1", events, [])
    assert (state.phase, state.call_id) == ("tools", None)
    closing = recovery.closing(state)
    assert [type(p).__name__ for p in closing] == ["LlmCallFailed", "ToolFailed", "TurnCancelled"]
    failed = closing[0]
    assert isinstance(failed, LlmCallFailed)
    assert (failed.call_id, failed.error_class, failed.purpose) == (
        "call_3",
        "cancelled",
        "sampling",
    )


# --- the agent's side: a claude-code agent, deny ------------------------------------------


async def test_a_claude_code_agent_refuses_sampling_asking_nobody() -> None:
    """Its model is its CLI's: no call of the gateway's to make, whatever mcp_sampling says."""
    from types import SimpleNamespace

    from gateway.errors import ToolError
    from gateway.session.sampling_host import sample
    from gateway.tools.sampling import SamplingRequest

    request = SamplingRequest("srv", (("user", "hi"),), 10)
    ctx = ToolContext("ses_a", "turn_a", "toolu_a", "")
    for setting, why in (("allow", "runs a CLI"), ("ask", "runs a CLI"), ("deny", "denies")):
        agent = SimpleNamespace(name="cc", runtime="claude-code", mcp_sampling=setting)
        loop = SimpleNamespace(agent=agent, current=None, node=None)
        with pytest.raises(ToolError) as refused:
            await sample(None, loop, ctx, request)  # type: ignore[arg-type]
        assert refused.value.error_class == "permission_denied" and why in refused.value.message


class _Waits:
    """A ToolSession whose elicit_url() waits for the server's completion, then allows."""

    async def elicit_url(
        self, ctx: ToolContext, message: str, url: str, completed: trio.Event | None = None
    ) -> str:
        assert completed is not None
        await completed.wait()
        return "allow"


async def test_a_second_question_of_a_waiting_id_is_refused() -> None:
    """Two waiting URL questions of one id: a completion could answer only one of them (and
    the first one's end unhooked the second's); the second is refused, the first answered."""
    import mcp_types as types

    ctx = ToolContext("ses_a", "turn_a", "toolu_a", "", session=_Waits())  # type: ignore[arg-type]
    questions = Questions("srv", {object(): ctx})
    got: list[Any] = []

    async def first() -> None:
        got.append(await questions.ask(None, _url_question("dup")))  # type: ignore[arg-type]

    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(first)
            await trio.testing.wait_all_tasks_blocked()
            second = await questions.ask(None, _url_question("dup"))  # type: ignore[arg-type]
            assert isinstance(second, types.ErrorData) and "dup" in second.message, second
            questions.completed("dup")
    assert [g.action for g in got] == ["accept"]


def test_a_restart_resolves_a_question_whose_tool_ended_before() -> None:
    """Two calls of a session in flight on one server: a sampling is the oldest call's
    (gateway.mcp.sampling), which may end while it waits; the other call keeps it going. A
    restart then resolves it too: no permission is left open (docs/protocol.md §8)."""
    from gateway.protocol.events import (
        LlmCallCompleted,
        LlmCallStarted,
        PermissionRequested,
        PermissionResolved,
        ToolCalled,
        ToolCompleted,
    )
    from gateway.protocol.shapes import Usage
    from gateway.session import recovery

    name = "mcp__hb__sample"
    events: list[tuple[str, Any]] = [
        ("llm.call_started", LlmCallStarted("call_1", "m")),
        ("llm.call_completed", LlmCallCompleted("call_1", "msg_1", "tool_use", Usage())),
        ("tool.called", ToolCalled("toolu_1", name, {})),
        ("tool.called", ToolCalled("toolu_2", name, {})),
        ("permission.requested",
         PermissionRequested("perm_1", "toolu_1", name, {}, 1, "sampling", "?")),
        ("tool.completed", ToolCompleted("toolu_1", name, "done", 5)),
    ]  # fmt: skip
    closing = recovery.closing(recovery.plan("turn_1", events, []))
    names = [type(p).__name__ for p in closing]
    assert names == ["PermissionResolved", "ToolFailed", "TurnCancelled"], closing
    assert isinstance(closing[0], PermissionResolved) and closing[0].perm_id == "perm_1"

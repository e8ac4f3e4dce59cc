"""``gateway chat`` and the client library with agents, elicitations and compactions.

docs/protocol.md sections 11 and 12. The gateway of this branch emits neither a
compaction nor an elicitation, so the chat's parts are driven here without a
daemon: the screen items from the views of the hand-written conformance
traces, the elicitation form from scripted answers (through the chat's own
key handler, with a stand-in session that records what is sent), and the
HTTP calls against an ``httpx.MockTransport`` that records each request.
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import trio
import trio.lowlevel

from gateway.client import GatewayClient, Reducer
from gateway.client.chat import (
    Chat,
    FormError,
    Marks,
    ask_form,
    check_content,
    form_fields,
    full_items,
    parse_answer,
    question_item,
    simple_items,
)
from gateway.client.views import PermissionView, full_view, simple_view
from gateway.protocol.events import ContextCompacted
from tests.integration.client.test_conformance import record

SCHEMA = {
    "type": "object",
    "properties": {
        "priority": {"type": "string", "enum": ["low", "normal", "urgent"], "title": "Priority"},
        "hours": {"type": "integer", "minimum": 1, "maximum": 8},
        "ratio": {"type": "number"},
        "notify": {"type": "boolean", "description": "Tell the owner"},
        "note": {"type": "string", "maxLength": 5},
    },
    "required": ["priority", "hours"],
}


def elicitation(schema: dict[str, Any] = SCHEMA) -> PermissionView:
    return {
        "perm_id": "perm_1",
        "session_id": "sess_1",
        "kind": "elicitation",
        "tool_use_id": "toolu_1",
        "tool_name": "mcp__tickets__create",
        "input": {},
        "expires_at": 0,
        "message": "Which priority?",
        "requested_schema": schema,
    }


# --- the form's checks ------------------------------------------------------------------------


def test_each_property_is_one_question_of_its_kind() -> None:
    fields = {f.name: f for f in form_fields(SCHEMA)}
    assert [(f.kind, f.required) for f in fields.values()] == [
        ("enum", True),
        ("integer", True),
        ("number", False),
        ("boolean", False),
        ("string", False),
    ]
    assert fields["priority"].prompt == "Priority (low/normal/urgent, required): "
    assert fields["notify"].prompt == "notify (y/n) - Tell the owner: "
    with pytest.raises(FormError, match="cannot ask"):
        form_fields({"properties": {"deep": {"type": "object"}}})


@pytest.mark.parametrize(
    ("name", "text", "value"),
    [
        ("priority", "urgent", "urgent"),
        ("priority", "URGENT", "urgent"),
        ("hours", "3", 3),
        ("ratio", "2.5", 2.5),
        ("ratio", "2", 2),
        ("notify", "y", True),
        ("notify", "no", False),
        ("note", "hi", "hi"),
    ],
)
def test_an_answer_becomes_a_value_of_its_type(name: str, text: str, value: Any) -> None:
    field = next(f for f in form_fields(SCHEMA) if f.name == name)
    parsed = parse_answer(field, text)
    assert parsed == value and type(parsed) is type(value)


@pytest.mark.parametrize(
    ("name", "text", "why"),
    [
        ("priority", "asap", "one of low, normal, urgent"),
        ("hours", "2.5", "whole number"),
        ("hours", "0", "at least 1"),
        ("hours", "9", "at most 8"),
        ("ratio", "lots", "a number"),
        ("notify", "maybe", "y or n"),
        ("note", "too long", "at most 5 characters"),
    ],
)
def test_an_answer_the_schema_refuses_says_why(name: str, text: str, why: str) -> None:
    field = next(f for f in form_fields(SCHEMA) if f.name == name)
    with pytest.raises(FormError, match=why):
        parse_answer(field, text)


def test_a_whole_answer_is_checked_against_the_schema() -> None:
    check_content(SCHEMA, {"priority": "low", "hours": 2})
    cases: list[tuple[dict[str, Any], str]] = [
        ({"priority": "low"}, "hours is required"),
        ({"priority": "low", "hours": True}, "not a integer"),
        ({"priority": "low", "hours": 2, "extra": 1}, "not asked for"),
        ({"priority": "none", "hours": 2}, "not a enum"),
    ]
    for content, why in cases:
        with pytest.raises(FormError, match=why):
            check_content(SCHEMA, content)


async def answers(
    lines: list[str | None], permission: PermissionView | None = None
) -> tuple[dict[str, Any] | None, str]:
    said: list[str] = []
    queue = iter(lines)

    async def read_line() -> str | None:
        return next(queue)

    content = await ask_form(permission or elicitation(), read_line, said.append)
    assert next(queue, "all read") == "all read", "the form asked fewer questions"
    return content, "".join(said)


async def test_the_form_asks_again_until_the_schema_accepts() -> None:
    content, said = await answers(["asap", "urgent", "", "0", "4", "", "y", ""])
    assert content == {"priority": "urgent", "hours": 4, "notify": True}
    assert said.startswith("mcp__tickets__create asks: Which priority?\n")
    assert "(one of low, normal, urgent)" in said
    assert "(required)" in said and "(at least 1)" in said


@pytest.mark.parametrize("first", ["", "n", "N", None])
async def test_an_empty_or_n_first_answer_declines(first: str | None) -> None:
    content, _ = await answers([first])
    assert content is None


# --- the chat's key handler answers with what the form gathered ------------------------------


class StandInKeyboard:
    tty = False

    def __init__(self, keys: list[str], lines: list[str]) -> None:
        self.keys, self.lines = iter(keys), iter(lines)
        self.modes: list[str] = []

    async def key(self) -> str | None:
        await trio.lowlevel.checkpoint()
        return next(self.keys, None)

    async def line(self) -> str | None:
        return next(self.lines)

    def mode(self, mode: str) -> None:
        self.modes.append(mode)


class StandInSession:
    """What Chat reads of a session (its views and pending requests) and what it sends."""

    def __init__(self, trace: str, upto: int) -> None:
        frames = record.load_trace(trace)
        self.state = Reducer(record.session_of(frames))
        for frame in frames[:upto]:
            self.state.apply(record.decode(frame))
        self.sent: list[tuple[str, str, dict[str, Any] | None]] = []
        self.tools: dict[str, Any] = {}
        self.compactions: dict[str, ContextCompacted] = {}
        self.done = trio.Event()

    @property
    def full(self) -> Any:
        return full_view(self.state)

    @property
    def simple(self) -> Any:
        return simple_view(self.state)

    @property
    def pending_permissions(self) -> Any:
        return self.state.permissions

    async def answer(self, perm_id: str, decision: str, *, content: Any = None) -> None:
        self.sent.append((perm_id, decision, content))
        self.done.set()


async def drive(keys: list[str], lines: list[str]) -> tuple[StandInSession, StandInKeyboard, str]:
    # After frame 3 of elicitation_pending: perm_2 (a worker's tool approval), then
    # perm_3, an elicitation for the assignee; the first asked is the worker's.
    session = StandInSession("elicitation_pending", 4)
    assert [p.perm_id for p in session.state.permissions.values()] == ["perm_2", "perm_3"]
    del session.state.permissions["perm_2"]  # as if answered: the elicitation is asked
    keyboard = StandInKeyboard(keys, lines)
    out = io.StringIO()
    chat = Chat(session, keyboard, out, width=lambda: 100)  # type: ignore[arg-type]
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(chat._answer_keys)
            await session.done.wait()
            nursery.cancel_scope.cancel()
    return session, keyboard, out.getvalue()


async def test_y_opens_the_form_and_sends_allow_with_its_content() -> None:
    session, keyboard, shown = await drive(["y"], ["Ada", "x", "3"])
    assert session.sent == [("perm_3", "allow", {"assignee": "Ada", "hours": 3})]
    assert keyboard.modes == ["line", "keys"]
    assert "Who should be assigned?" in shown and "(a whole number, please)" in shown


async def test_an_empty_first_answer_sends_deny() -> None:
    session, _, _ = await drive(["y"], [""])
    assert session.sent == [("perm_3", "deny", None)]


async def test_n_declines_without_a_form() -> None:
    session, keyboard, _ = await drive(["n"], [])
    assert session.sent == [("perm_3", "deny", None)]
    assert keyboard.modes == []


# --- what the screen shows ----------------------------------------------------------------------


def test_an_elicitation_is_asked_with_its_message() -> None:
    line = question_item(elicitation(), None, 100).lines[0].text
    assert line == "? mcp__tickets__create asks: Which priority?  [y/n]"


def compaction_views() -> Iterator[tuple[Any, Any]]:
    expected = record.load_expected("compaction_between_turns")
    yield expected["final"]["full"], expected["final"]["simple"]


def test_a_compaction_is_one_quiet_line_in_both_views() -> None:
    [(full, simple)] = list(compaction_views())
    event = ContextCompacted("manual", "summary", 52_000, 3_000, "msg_3", None)
    marks = Marks()
    for items in (
        full_items(
            full, {}, hidden_turns=set(), width=100, marks=marks, compactions={"msg_3": event}
        ),
        simple_items(
            simple, hidden_turns=set(), width=100, marks=marks, compactions={"msg_3": event}
        ),
    ):
        lines = [line.text for item in items for line in item.lines]
        assert lines.count("· context compacted: 2 messages summarised (52k → 3k tokens)") == 1
        # the second compaction: its event is not in this client's store (no tokens)
        assert lines.count("· context compacted: 2 messages summarised") == 1
        # the replaced messages stay; no compaction is assistant text
        assert "Hello there, gateway" in " ".join(lines)
        assert not any("The user greeted" in line for line in lines)


def test_the_status_line_says_compacting() -> None:
    expected = record.load_expected("compaction_between_turns")
    step = next(s for s in expected["steps"] if (s.get("simple") or {}).get("status"))
    items = simple_items(step["simple"], hidden_turns=set(), width=100, marks=Marks())
    assert items[-1].lines[0].text == "compacting context…"


# --- the HTTP calls -----------------------------------------------------------------------------


class Recorded:
    def __init__(self, answers: dict[tuple[str, str], tuple[int, Any]]) -> None:
        self.answers = answers
        self.requests: list[tuple[str, str, Any]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else None
        self.requests.append((request.method, request.url.path, body))
        status, answer = self.answers.get((request.method, request.url.path), (404, None))
        if answer is None:
            answer = {"error": {"code": "not_found", "message": "no such route"}}
        return httpx.Response(status, json=answer)


AGENTS = {
    "agents": [
        {"name": "default", "runtime": "native", "model": "scripted:echo", "default": True,
         "tools": []},
        {"name": "helpdesk", "runtime": "native", "model": "scripted:echo", "default": False,
         "tools": [{"name": "shell", "description": "run", "input_schema": {},
                    "requires_approval": True, "source": "builtin"}]},
    ]
}  # fmt: skip


async def test_the_client_library_sends_agent_content_and_lists_agents() -> None:
    recorded = Recorded(
        {
            ("POST", "/sessions"): (
                201,
                {"session_id": "sess_1", "active_model": "m", "created_at": 0},
            ),
            ("POST", "/sessions/sess_1/permissions/perm_1"): (202, {"status": "accepted"}),
            ("GET", "/agents"): (200, AGENTS),
        }
    )
    async with GatewayClient("http://gw", transport=httpx.MockTransport(recorded)) as gw:
        await gw.create_session(agent="helpdesk")
        await gw.create_session()
        await gw.answer_permission("sess_1", "perm_1", "allow", content={"priority": "low"})
        await gw.answer_permission("sess_1", "perm_1", "deny")
        agents = await gw.list_agents()
    assert [body for _, _, body in recorded.requests[:4]] == [
        {"agent": "helpdesk"},
        {},
        {"decision": "allow", "content": {"priority": "low"}},
        {"decision": "deny"},
    ]
    assert [(a.name, a.default) for a in agents.agents] == [("default", True), ("helpdesk", False)]
    assert agents.agents[1].tools[0].requires_approval is True


async def test_chat_with_an_unknown_agent_prints_the_names_and_exits_1(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from gateway.client.chat import chat

    message = "unknown agent 'nope'; known: default, helpdesk"
    recorded = Recorded(
        {("POST", "/sessions"): (422, {"error": {"code": "unknown_agent", "message": message}})}
    )
    read, write = os.pipe()
    try:
        status = await chat(
            "http://gw",
            None,
            agent="nope",
            stdin_fd=read,
            out=io.StringIO(),
            transport=httpx.MockTransport(recorded),
        )
    finally:
        os.close(read)
        os.close(write)
    assert status == 1
    assert recorded.requests == [("POST", "/sessions", {"agent": "nope"})]
    assert capsys.readouterr().err == f"chat: {message}\n"


def test_gateway_chat_takes_agent() -> None:
    from gateway.cli import _parser

    args = _parser().parse_args(["chat", "--agent", "helpdesk"])
    assert args.agent == "helpdesk"

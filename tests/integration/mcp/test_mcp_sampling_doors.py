"""The new permission kinds and a sampling's ``llm.call_*`` on the AG-UI and AI SDK doors.

docs/protocol.md §11: a sampling request (``kind: "sampling"``) and a URL-mode
elicitation (``kind: "elicitation_url"``) are shown as their own interrupt
reason (AG-UI) and data part (AI SDK); a sampling's model call (``purpose:
"sampling"``) is no step of the turn, and its failure not the turn's.
"""

from __future__ import annotations

import json
from typing import Any

from gateway.doors.agui import shapes as ag
from gateway.doors.agui.mapping import RunMapper
from gateway.doors.aisdk import chunks as ui
from gateway.doors.aisdk.mapping import ChatMapper
from gateway.ids import format_event_id
from gateway.protocol.events import (
    EVENT_TYPES,
    Event,
    LlmCallCompleted,
    LlmCallFailed,
    LlmCallStarted,
    Payload,
    PermissionRequested,
    TurnCompleted,
)
from gateway.protocol.shapes import Usage

URL_INPUT = {"url": "https://auth.example.com/login"}
SAMPLING_INPUT = {"server": "hb", "system_prompt": "Be brief.", "max_tokens": 10,
                  "messages": [{"role": "user", "text": "hi"}], "messages_left_out": 0}  # fmt: skip


def ev(n: int, payload: Payload) -> Event:
    type_ = next(t for t, spec in EVENT_TYPES.items() if spec.payload is type(payload))
    return Event(
        format_event_id(n), type_, "sess_1", "turn_1", 1000 + n, EVENT_TYPES[type_].actor, payload
    )


def asked(n: int, kind: str, input: dict[str, Any]) -> Event:
    return ev(
        n, PermissionRequested(f"perm_{n}", "toolu_1", "mcp__hb__x", input, 9999, kind, "Go?")
    )  # type: ignore[arg-type]


def test_agui_interrupts_carry_the_new_kinds() -> None:
    for kind, input in (("sampling", SAMPLING_INPUT), ("elicitation_url", URL_INPUT)):
        m = RunMapper("sess_1", "run_1", "turn_1")
        assert m.receive(asked(1, kind, input)) == []
        [finished] = m.pause()
        assert isinstance(finished, ag.RunFinished)
        assert isinstance(finished.outcome, ag.InterruptOutcome)
        [interrupt] = finished.outcome.interrupts
        assert (interrupt.reason, interrupt.message, interrupt.tool_call_id) == (
            kind, "Go?", "toolu_1",
        )  # fmt: skip
        assert interrupt.metadata == {"tool_name": "mcp__hb__x", **input}
        assert interrupt.response_schema is not None
        assert interrupt.response_schema["required"] == ["decision"]


def test_aisdk_data_parts_carry_the_new_kinds() -> None:
    for kind, name in (("sampling", "sampling"), ("elicitation_url", "elicitation-url")):
        m = ChatMapper("sess_1", "turn_1")
        m.start()
        out = m.receive(asked(1, kind, URL_INPUT)) + m.pause()
        [wire] = [w for w in map(json.loads, map(ui.encode, out)) if w["type"].startswith("data-")]
        assert wire["type"] == f"data-{name}" and wire["id"] == "perm_1"
        assert wire["data"]["input"] == URL_INPUT and wire["data"]["message"] == "Go?"
        assert wire["data"]["state"] == "requested"


def test_a_sampling_call_is_no_step_and_its_failure_not_the_turns() -> None:
    usage = Usage(1, 2)
    sampling = [
        ev(1, LlmCallStarted("call_s", "scripted:echo", "sampling")),
        ev(2, LlmCallFailed("call_s", "overloaded", "busy", None, "sampling")),
        ev(3, LlmCallStarted("call_t", "scripted:echo", "sampling")),
        ev(4, LlmCallCompleted("call_t", "msg_x", "end_turn", usage, "sampling")),
    ]
    m = RunMapper("sess_1", "run_1", "turn_1")
    assert [out for e in sampling for out in m.receive(e)] == []
    chat = ChatMapper("sess_1", "turn_1")
    chat.start()
    assert [out for e in sampling for out in chat.receive(e)] == []
    # The turn still ends well: no RUN_ERROR from the sampling's failure.
    end = ev(5, TurnCompleted("turn_1", "end_turn", usage, 0.0, 0.0))
    assert not any(isinstance(x, ag.RunError) for x in m.receive(end))


def test_the_chat_client_shows_the_url_and_the_servers_prompt() -> None:
    from gateway.client.chat import question_item
    from gateway.client.views import PermissionView

    def view(kind: str, input: dict[str, Any], message: str) -> PermissionView:
        return {"perm_id": "perm_1", "session_id": "sess_1", "kind": kind,  # type: ignore[typeddict-item]
                "tool_use_id": "toolu_1", "tool_name": "mcp__hb__x", "input": input,
                "expires_at": 0, "message": message, "requested_schema": None}  # fmt: skip

    url = view("elicitation_url", URL_INPUT, "Sign in")
    line = question_item(url, None, 120).lines[0].text
    assert "open https://auth.example.com/login: Sign in" in line and line.endswith("[y/n]")
    sampling = view("sampling", SAMPLING_INPUT, "MCP server 'hb' asks ...")
    line = question_item(sampling, None, 120).lines[0].text
    assert "asks the model: hi" in line

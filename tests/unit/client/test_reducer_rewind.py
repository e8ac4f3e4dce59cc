"""The reference reducer on ``history.rewound`` (docs/protocol.md §2 "Edit and regenerate").

The recorded trace ``rewind`` (tests/streaming-conformance/) holds both reducers to
the common path; here, what a trace cannot show: a client that does not hold the
message rewound to (a snapshot left it out), and the tool results that leave.
"""

from __future__ import annotations

import json
from typing import Any

from gateway.client import Reducer, decode_server_frame
from gateway.client.views import full_view

SID = "sess_1"


def message(id_: str, turn: str, role: str = "user", content: Any = None) -> dict[str, Any]:
    return {
        "id": id_, "session_id": SID, "turn_id": turn, "role": role,
        "content": content or [{"type": "text", "text": id_}], "status": "complete",
        "created_at": 0,
    }  # fmt: skip


def snapshot(messages: list[dict[str, Any]], has_more: bool) -> str:
    session = {
        "id": SID, "agent": "default", "tools": [], "workspace_path": "w",
        "active_model": "scripted:echo", "routing_policy_version": "static-1",
        "cost_so_far_usd": 0.0, "turn_count": 3, "current_turn_id": None,
        "current_turn_status": None, "parent_session_id": None, "pending_permissions": [],
    }  # fmt: skip
    frame = {
        "type": "snapshot", "session": session, "messages": messages,
        "snapshot_at_event_id": "evt_00000000000000000010", "has_more": has_more,
    }  # fmt: skip
    return json.dumps(frame)


def rewound(before: str, turn: str, seq: int = 11) -> str:
    event = {
        "id": f"evt_{seq:020d}", "type": "history.rewound", "session_id": SID,
        "turn_id": turn, "ts": 0, "actor": "user",
        "payload": {"before_message_id": before, "turn_id": turn},
    }  # fmt: skip
    return json.dumps({"type": "event", "event": event})


def test_the_messages_from_it_on_leave_with_their_tools_results() -> None:
    use = [{"type": "tool_use", "id": "toolu_1", "name": "sleep", "input": {}}]
    result = [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "ok", "is_error": False}]
    held = [
        message("u_1", "t1"), message("a_1", "t1", "assistant"),
        message("u_2", "t2"), message("a_2", "t2", "assistant", use),
        message("r_2", "t2", "user", result), message("b_2", "t2", "assistant"),
    ]  # fmt: skip
    reducer = Reducer(SID)
    reducer.apply(decode_server_frame(snapshot(held, False)))
    assert "toolu_1" in reducer.tool_results
    reducer.apply(decode_server_frame(rewound("u_2", "t3")))
    assert [m.id for m in reducer.messages] == ["u_1", "a_1"]
    assert reducer.tool_results == {}
    assert [m["id"] for m in full_view(reducer)["messages"]] == ["u_1", "a_1"]


def test_a_message_older_than_all_held_takes_them_all_and_paging_goes_on_from_it() -> None:
    reducer = Reducer(SID)
    reducer.apply(decode_server_frame(snapshot([message("u_5", "t5")], True)))
    reducer.apply(decode_server_frame(rewound("u_2", "t6")))
    assert reducer.messages == []
    assert (reducer.has_more, reducer.oldest_message_id) == (True, "u_2")

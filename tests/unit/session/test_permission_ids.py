"""Permission ids name their tool use (gateway/ids.py, gateway/session/permissions.py):
a session loaded afresh tells an answer to a request it asked before (409) from an id
it never issued (404), docs/protocol.md §13."""

from __future__ import annotations

import re

import pytest

from gateway.errors import Refused
from gateway.ids import asked_for, new_perm_id
from gateway.protocol.shapes import Message, TextBlock, ToolUseBlock
from gateway.session.permissions import Permissions, asked_before


def test_an_id_is_perm_and_twenty_hex_digits_unique_per_request() -> None:
    ids = {new_perm_id("toolu_1") for _ in range(100)}
    assert len(ids) == 100
    assert all(re.fullmatch(r"perm_[0-9a-f]{20}", i) for i in ids)
    assert all(asked_for(i, "toolu_1") for i in ids)
    assert not any(asked_for(i, "toolu_2") for i in ids)
    assert len({i[:13] for i in ids}) == 1  # the tool use's part: the same for each
    assert not asked_for("perm_" + "0" * 20, "toolu_1")  # its part is not 00000000


def test_asked_before_looks_at_the_tool_uses_of_the_messages_only() -> None:
    message = Message(
        "msg_1", "sess_1", "turn_1", "assistant",
        [TextBlock("toolu_9"), ToolUseBlock("toolu_1", "sleep", {})], "complete", 0,
    )  # fmt: skip
    asked = new_perm_id("toolu_1")
    assert asked_before(asked, [message])
    assert not asked_before(new_perm_id("toolu_9"), [message])  # a text, not a tool use
    assert not asked_before(asked[:-1], [message]) and not asked_before("perm_x", [message])


def test_a_session_that_holds_the_request_decides_as_before() -> None:
    permissions = Permissions("sess_1")
    request = permissions.open("toolu_1", "sleep", {}, 0)
    assert asked_for(request.perm_id, "toolu_1")
    permissions.decide(request.perm_id, "allow")
    with pytest.raises(Refused) as again:
        permissions.decide(request.perm_id, "deny")
    assert again.value.code == "permission_resolved"
    with pytest.raises(Refused) as never:
        permissions.decide(new_perm_id("toolu_2"), "deny")
    assert never.value.code == "permission_not_found"

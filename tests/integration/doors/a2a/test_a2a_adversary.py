"""``POST /a2a`` against a client that means harm (docs/doors/a2a.md): crafted page
tokens, listings whose cost must not grow with the square of a context's turns, and
JSON-RPC notifications (no ``id``), which A2A never sends and the door does not run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Harness
from tests.integration.doors.a2a.test_a2a_rpc import call, code, message, rpc
from tests.scripts import TEXT


async def test_a_crafted_page_token_is_refused_not_a_crash(gw: Harness) -> None:
    task = (await rpc(gw, call("SendMessage", message(TEXT))))["result"]["task"]
    for token in ("9" * 5000, "-1", "1e3", "x", " 1"):
        params = {"contextId": task["contextId"], "pageToken": token}
        answer = await rpc(gw, call("ListTasks", params))
        assert code(answer) == -32602, (token[:10], answer)
    fine = await rpc(gw, call("ListTasks", {"contextId": task["contextId"], "pageToken": "0"}))
    assert [t["id"] for t in fine["result"]["tasks"]] == [task["id"]]


async def test_listing_a_context_reads_its_messages_once(
    gw: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = (await rpc(gw, call("SendMessage", message(TEXT))))["result"]["task"]
    context = first["contextId"]
    for _ in range(3):
        await rpc(gw, call("SendMessage", message(TEXT, contextId=context)))
    reads: list[str] = []
    real = gw.node.messages_of

    async def counted(session: Any, *args: Any, **kwargs: Any) -> Any:
        reads.append(session.id)
        return await real(session, *args, **kwargs)

    monkeypatch.setattr(gw.node, "messages_of", counted)
    listed = await rpc(gw, call("ListTasks", {"contextId": context}))
    assert len(listed["result"]["tasks"]) == 4
    assert reads == [context]  # not once more per task


async def test_a_notification_is_not_run(gw: Harness, tmp_path: Path) -> None:
    body = {"jsonrpc": "2.0", "method": "SendMessage", "params": message(TEXT)}
    answer = await rpc(gw, body)
    assert code(answer) == -32600 and answer["id"] is None
    assert await gw.node.store.list_sessions(limit=10, before=None) == ([], False)
    null_id = await rpc(gw, {**body, "id": None})  # an id that is null is an id
    assert null_id["id"] is None and "result" in null_id

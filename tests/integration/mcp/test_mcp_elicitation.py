"""An MCP elicitation as a permission request of its session (docs/protocol.md sections 2, 11).

The session's side (``Session.elicit``) and the route's (``content``, checked
against the requested schema), through a real gateway; the MCP side of the
same question is tests/integration/mcp/test_mcp.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import trio

from gateway.tools.registry import ToolContext
from tests.conftest import make_config, running_gateway

SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "note": {"type": "string"}},
    "required": ["ok"],
}


def ctx(sid: str) -> ToolContext:
    return ToolContext(sid, "turn_x", "toolu_1", "", tool_name="mcp__notes__delete")


async def ask(gw: Any, sid: str, answers: list[Any]) -> None:
    session = gw.node.sessions[sid]
    answers.append(await session.elicit(ctx(sid), "Delete it?", SCHEMA))


async def pending(gw: Any, sid: str) -> dict[str, Any]:
    """The session's first pending request, as a snapshot lists it."""
    with trio.fail_after(5):
        while True:
            found = gw.node.sessions[sid].permissions.pending()
            if found:
                return dict(msgspec.to_builtins(found[0]))
            await trio.sleep(0.01)


async def test_allow_with_content_that_fits_the_schema(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with running_gateway(make_config(tmp_path)) as gw:
            sid = await gw.create_session()
            answers: list[Any] = []
            async with gw.client(sid) as client, trio.open_nursery() as nursery:
                await client.subscribe()
                nursery.start_soon(ask, gw, sid, answers)
                asked = await pending(gw, sid)
                assert asked["kind"] == "elicitation" and asked["message"] == "Delete it?"
                assert asked["requested_schema"] == SCHEMA
                assert asked["tool_name"] == "mcp__notes__delete"
                url = f"/sessions/{sid}/permissions/{asked['perm_id']}"
                for bad in ({"ok": "yes"}, {"note": "no ok"}):
                    r = await gw.http.post(url, json={"decision": "allow", "content": bad})
                    assert r.status_code == 422, r.text
                    assert r.json()["error"]["code"] == "invalid_content"
                r = await gw.http.post(url, json={"decision": "deny", "content": {"ok": True}})
                assert r.status_code == 422  # content comes with allow only
                r = await gw.http.post(url, json={"decision": "allow", "content": {"ok": True}})
                assert r.status_code == 202, r.text
                events = await client.until(lambda e: e.type == "permission.resolved")
            requested = next(e.payload for e in events if e.type == "permission.requested")
            assert (requested.kind, requested.message) == ("elicitation", "Delete it?")
            assert requested.requested_schema == SCHEMA
            assert events[-1].payload.decision == "allow"
            assert answers == [("allow", {"ok": True})]
            r = await gw.http.post(url, json={"decision": "allow", "content": {"ok": True}})
            assert r.status_code == 409


async def test_deny_timeout_and_cancel(tmp_path: Path) -> None:
    config = make_config(tmp_path, **{"tools.approval_timeout_s": 0.5})
    with trio.fail_after(30):
        async with running_gateway(config) as gw:
            sid = await gw.create_session()
            answers: list[Any] = []
            async with trio.open_nursery() as nursery:
                nursery.start_soon(ask, gw, sid, answers)
                asked = await pending(gw, sid)
                url = f"/sessions/{sid}/permissions/{asked['perm_id']}"
                r = await gw.http.post(url, json={"decision": "deny"})
                assert r.status_code == 202
            await ask(gw, sid, answers)  # nobody answers
            with trio.move_on_after(0.2):
                await ask(gw, sid, answers)
            assert answers == [("deny", None), ("timeout", None)]
            session = gw.node.sessions[sid]
            assert session.permissions.pending() == []


async def test_content_on_a_tool_permission_is_refused(tmp_path: Path) -> None:
    config = make_config(tmp_path, **{"tools.require_approval": ["sleep"]})
    script = '{"script": {"rounds": [[{"tool_use": {"name": "sleep", "input": {"seconds": 0}}}]]}}'
    with trio.fail_after(30):
        async with running_gateway(config) as gw:
            sid = await gw.create_session()
            await gw.submit(sid, script)
            asked = await pending(gw, sid)
            assert asked["kind"] == "tool"
            url = f"/sessions/{sid}/permissions/{asked['perm_id']}"
            r = await gw.http.post(url, json={"decision": "allow", "content": {"ok": True}})
            assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_content"
            r = await gw.http.post(url, json={"decision": "allow"})
            assert r.status_code == 202

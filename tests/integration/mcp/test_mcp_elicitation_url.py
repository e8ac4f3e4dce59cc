"""An MCP server's URL-mode elicitation: a permission of kind ``elicitation_url`` (§11).

A real gateway, the scripted model and tests/mcp_servers/hostile_b.py (its
``visit`` tool asks the user to open a URL, as told). The URL is checked
before anyone is asked (:func:`gateway.mcp.questions.url_problem`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio

from gateway.mcp.questions import MAX_URL_CHARS, url_problem
from tests.conftest import Harness, running_gateway
from tests.integration.mcp.test_mcp_gateway import seq
from tests.integration.mcp.test_mcp_sampling import DONE, PREFIX, call, config_of, run, script


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("https://auth.example.com/login?x=1", None),
        ("http://127.0.0.1:8080/cb", None),
        ("http://localhost/cb", None),
        ("http://[::1]:9/cb", None),
        ("javascript:alert(1)", "scheme"),
        ("JavaScript:alert(1)", "scheme"),
        ("data:text/html,<script>alert(1)</script>", "scheme"),
        ("file:///etc/passwd", "scheme"),
        ("//evil.example/x", "scheme"),
        ("http://evil.example/login", "loopback"),
        ("https://bank.example@evil.example/", "user name"),
        ("https:///nohost", "no host"),
        ("https://a.example/\nx", "whitespace"),
        ("https://a.example/ x", "whitespace"),
        ("https://a.example/" + "x" * MAX_URL_CHARS, "over"),
        ("https://[::1/", "cannot be read"),
    ],
)
def test_which_urls_may_be_shown(url: str, problem: str | None) -> None:
    found = url_problem(url)
    if problem is None:
        assert found is None
    else:
        assert found is not None and problem in found, found


def answer_of(events: list[Any]) -> Any:
    [done] = [e.payload for e in events if e.type == "tool.completed"]
    return json.loads(done.result)


async def asked(gw: Harness, sid: str, client: Any) -> Any:
    return (await client.until(lambda e: e.type == "permission.requested"))[-1].payload


@pytest.mark.slow  # a server process and several turns
async def test_a_url_elicitation_is_a_permission_answered_on_the_route(tmp_path: Path) -> None:
    config = config_of(tmp_path, auth={"api_keys": ["key-a", "key-b"]})
    headers = {"Authorization": "Bearer key-a"}
    with trio.fail_after(60):
        async with running_gateway(config) as gw:
            gw.http.headers.update(headers)
            sid = await gw.create_session()
            other = await gw.create_session()
            url = "https://auth.example.com/login?state=abc"
            for decision, action in (("allow", "accept"), ("deny", "decline")):
                content = script([call("visit", url=url, message="Sign in to Example")], DONE)
                async with gw.client(sid) as client:
                    await client.subscribe()
                    await gw.submit(sid, content)
                    p = await asked(gw, sid, client)
                    assert (p.kind, p.input, p.message) == (
                        "elicitation_url", {"url": url}, "Sign in to Example",
                    )  # fmt: skip
                    assert p.tool_name == f"{PREFIX}visit"
                    [pending] = gw.node.sessions[sid].permissions.pending()
                    assert pending.kind == "elicitation_url" and pending.input == {"url": url}
                    # Content answers a form only; another session, another key: not theirs.
                    route = f"/sessions/{sid}/permissions/{p.perm_id}"
                    r = await gw.http.post(route, json={"decision": "allow", "content": {}})
                    assert r.status_code == 422, r.text
                    r = await gw.http.post(
                        f"/sessions/{other}/permissions/{p.perm_id}", json={"decision": "allow"}
                    )
                    assert r.status_code == 404, r.text
                    r = await gw.http.post(
                        route,
                        json={"decision": "allow"},
                        headers={"Authorization": "Bearer key-b"},
                    )
                    assert r.status_code == 404, r.text
                    r = await gw.http.post(route, json={"decision": decision})
                    assert r.status_code == 202, r.text
                    events = await client.until_turn_ends()
                assert answer_of(events) == {"action": action}
                assert events[-1].type == "turn.completed"

            # The server's notifications/elicitation/complete answers a waiting one: allow.
            events = await run(gw, sid, script([call("visit", url=url, complete=True)], DONE))
            assert answer_of(events) == {"action": "accept"}
            resolved = [e.payload for e in events if e.type == "permission.resolved"]
            assert [r.decision for r in resolved] == ["allow"]

            # Refused before anyone is asked: the server gets invalid params.
            for bad in ("javascript:alert(document.cookie)", "https://x.example/" + "a" * 5000):
                events = await run(gw, sid, script([call("visit", url=bad)], DONE))
                assert "permission.requested" not in seq(events)
                error = answer_of(events)
                assert error["code"] == -32602 and "refused" in error["message"]
            assert gw.node.sessions[sid].permissions.pending() == []
            await required_first(gw, sid)


async def required_first(gw: Harness, sid: str) -> None:
    """A call failed -32042: its URL asked; allowed, the call is made again (once)."""
    url = "https://auth.example.com/grant"
    content = script([call("gate", url=url)], DONE)
    async with gw.client(sid) as client:
        await client.subscribe()
        await gw.submit(sid, content)
        p = await asked(gw, sid, client)
        assert (p.kind, p.input, p.message) == ("elicitation_url", {"url": url}, "Authorize first")
        r = await gw.http.post(
            f"/sessions/{sid}/permissions/{p.perm_id}", json={"decision": "allow"}
        )
        assert r.status_code == 202
        events = await client.until_turn_ends()
    [done] = [e.payload for e in events if e.type == "tool.completed"]
    assert done.result == "passed"
    # Declined: the call fails with the server's error, and is not made again.
    async with gw.client(sid) as client:
        await client.subscribe()
        await gw.submit(sid, script([call("gate", url=url + "/2")], DONE))
        p = await asked(gw, sid, client)
        r = await gw.http.post(
            f"/sessions/{sid}/permissions/{p.perm_id}", json={"decision": "deny"}
        )
        assert r.status_code == 202
        events = await client.until_turn_ends()
    [failed] = [e.payload for e in events if e.type == "tool.failed"]
    assert "authorization required" in failed.message
    # A URL that may not be shown: nobody is asked, the call fails.
    events = await run(gw, sid, script([call("gate", url="javascript:alert(1)")], DONE))
    assert "permission.requested" not in seq(events)
    [failed] = [e.payload for e in events if e.type == "tool.failed"]
    assert "authorization required" in failed.message

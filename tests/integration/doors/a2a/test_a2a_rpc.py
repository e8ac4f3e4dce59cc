"""``POST /a2a`` on the wire (docs/doors/a2a.md): JSON-RPC's errors, ids, keys, limits, cursors.

Rules as in tests/conftest.py: a real gateway on 127.0.0.1 port 0, httpx as
the client, the scripted model, ``fail_after`` caps and no sleeping. What the
official client does with all this is tests/system/doors/a2a/; here, each
byte a client could send wrong, and each tenant it could reach for.
"""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from tests.conftest import JSON_TYPE, TOOL_SCRIPT, Harness, make_config, running_gateway
from tests.scripts import LONG_NAP, TEXT

KEYS = ["key-a", "key-b"]
A = {"Authorization": "Bearer key-a"}
B = {"Authorization": "Bearer key-b"}
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
)


@asynccontextmanager
async def gateway(tmp_path: Path, **overrides: Any) -> AsyncIterator[Harness]:
    with trio.fail_after(60):
        async with running_gateway(make_config(tmp_path, **overrides)) as h:
            yield h


def call(method: str, params: Any = None, rid: Any = 1) -> dict[str, Any]:
    body: dict[str, Any] = {"jsonrpc": "2.0", "id": rid, "method": method}
    if params is not None:
        body["params"] = params
    return body


def message(content: Any, **fields: Any) -> dict[str, Any]:
    text = content if isinstance(content, str) else json.dumps(content)
    return {
        "message": {"messageId": "m-1", "role": "ROLE_USER", "parts": [{"text": text}], **fields}
    }


async def rpc(h: Harness, body: Any, headers: dict[str, str] | None = None) -> dict[str, Any]:
    r = await h.http.post("/a2a", json=body, headers=headers or {})
    assert r.status_code == 200, r.text
    answer: dict[str, Any] = r.json()
    assert answer["jsonrpc"] == "2.0"
    return answer


def code(answer: dict[str, Any]) -> int:
    return int(answer["error"]["code"])


def reason(answer: dict[str, Any]) -> str:
    return str(answer["error"]["data"][0]["metadata"]["code"])


async def stream(
    h: Harness, body: Any, headers: dict[str, str] | None = None
) -> list[tuple[str, dict[str, Any]]]:
    """Every SSE event of a streaming call: (its id, its JSON-RPC response)."""
    out: list[tuple[str, dict[str, Any]]] = []
    async with h.http.stream("POST", "/a2a", json=body, headers=headers or {}) as r:
        assert r.status_code == 200
        assert r.headers["content-type"] == "text/event-stream", await r.aread()
        event_id = ""
        async for line in r.aiter_lines():
            if line.startswith("id: "):
                event_id = line[4:]
            elif line.startswith("data: "):
                out.append((event_id, json.loads(line[6:])))
    return out


def text_of(events: list[tuple[str, dict[str, Any]]]) -> str:
    return "".join(
        p["text"]
        for _, e in events
        if "artifactUpdate" in e["result"]
        for p in e["result"]["artifactUpdate"]["artifact"]["parts"]
    )


def states(events: list[tuple[str, dict[str, Any]]]) -> list[str]:
    out = []
    for _, e in events:
        result = e["result"]
        if "statusUpdate" in result:
            out.append(result["statusUpdate"]["status"]["state"])
        elif "task" in result:
            out.append("task:" + result["task"]["status"]["state"])
    return out


# --- the envelope ------------------------------------------------------------------------


async def test_json_rpc_envelope_errors(gw: Harness) -> None:
    async def raw(body: bytes) -> dict[str, Any]:
        r = await gw.http.post("/a2a", content=body, headers=JSON_TYPE)
        assert r.status_code == 200, r.text
        return dict(r.json())

    parse = await raw(b'{"jsonrpc": "2.0", "id": 7, "method": "GetTask"')
    assert (code(parse), parse["id"]) == (-32700, None)
    batch = await raw(json.dumps([call("GetTask", {"id": "x"})]).encode())
    assert (code(batch), batch["id"]) == (-32600, None)
    assert code(await raw(b"null")) == -32600
    old = await raw(json.dumps({**call("GetTask", {"id": "x"}, "r-9"), "jsonrpc": "1.0"}).encode())
    assert (code(old), old["id"]) == (-32600, "r-9")
    assert code(await raw(json.dumps(call("", {})).encode())) == -32600
    assert code(await raw(json.dumps({"jsonrpc": "2.0", "id": 1, "method": 5}).encode())) == -32600
    assert code(await raw(json.dumps(call("GetTask", {"id": "x"}, True)).encode())) == -32600
    assert code(await raw(json.dumps(call("GetTask", {"id": "x"}, {"a": 1})).encode())) == -32600
    deep = b'{"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": ' + b"[" * 100_000
    assert code(await raw(deep)) == -32700  # a 4xx however deep the input, never a 500


async def test_methods_unknown_legacy_and_not_offered(gw: Harness) -> None:
    unknown = await rpc(gw, call("Nope", {}, "x-1"))
    assert (code(unknown), unknown["id"]) == (-32601, "x-1")
    legacy = await rpc(gw, call("message/send", message("hi")))
    assert code(legacy) == -32601 and "A2A 1.0" in legacy["error"]["message"]
    for method in ("CreateTaskPushNotificationConfig", "ListTaskPushNotificationConfigs"):
        answer = await rpc(gw, call(method, {"taskId": "x"}))
        assert code(answer) == -32003
    assert code(await rpc(gw, call("GetExtendedAgentCard", {}))) == -32007
    v03 = await rpc(gw, call("GetTask", {"id": "x"}), {"A2A-Version": "0.3"})
    assert code(v03) == -32009
    ok = await rpc(gw, call("GetTask", {"id": "x"}), {"A2A-Version": "1.0"})
    assert code(ok) == -32001


async def test_bad_params(gw: Harness) -> None:
    assert code(await rpc(gw, call("SendMessage"))) == -32602  # no message
    assert code(await rpc(gw, call("SendMessage", {"message": "hi"}))) == -32602
    agent = message("hi")
    agent["message"]["role"] = "ROLE_AGENT"
    assert code(await rpc(gw, call("SendMessage", agent))) == -32602
    empty = message("")
    empty["message"]["parts"] = []
    answer = await rpc(gw, call("SendMessage", empty))
    assert (code(answer), reason(answer)) == (-32602, "invalid_body")
    fetch = message("look")
    fetch["message"]["parts"].append(
        {"url": "http://169.254.169.254/latest", "mediaType": "image/png"}
    )
    answer = await rpc(gw, call("SendMessage", fetch))
    assert (code(answer), reason(answer)) == (-32602, "unsupported_file_url")  # nothing fetched
    bad_context = message("hi", contextId="no spaces allowed")
    answer = await rpc(gw, call("SendMessage", bad_context))
    assert (code(answer), reason(answer)) == (-32602, "invalid_context_id")
    assert (
        code(await rpc(gw, call("SendMessage", {**message("x"), "metadata": {"agent": "ghost"}})))
        == -32602
    )
    assert code(await rpc(gw, call("ListTasks", {}))) == -32602  # contextId required
    assert gw.node.sessions == {}  # none of them made a session


async def test_forged_task_ids_are_not_found_alike(gw: Harness) -> None:
    done = await rpc(gw, call("SendMessage", message(TEXT)))
    task = done["result"]["task"]
    session, _, turn = task["id"].partition(".")
    forged = [
        "nope",
        "",
        f"{session}.turn_{'0' * 20}",  # a turn of no such session
        f"sess_unknown.{turn}",
        f"{session}.{turn}.x",
        f"../{session}.{turn}",
    ]
    for method in ("GetTask", "CancelTask", "SubscribeToTask"):
        for task_id in forged:
            answer = await rpc(gw, call(method, {"id": task_id}))
            assert code(answer) == -32001, (method, task_id)
            assert answer["error"]["message"] == f"no task {task_id!r}"
    answer = await rpc(gw, call("SendMessage", message("yes", taskId=forged[2])))
    assert code(answer) == -32001


async def test_another_keys_task_and_context(tmp_path: Path) -> None:
    async with gateway(tmp_path, **{"auth.api_keys": KEYS}) as h:
        mine = (await rpc(h, call("SendMessage", message(TEXT)), A))["result"]["task"]
        for method in ("GetTask", "CancelTask", "SubscribeToTask"):
            answer = await rpc(h, call(method, {"id": mine["id"]}), B)
            assert code(answer) == -32001
            assert answer["error"]["message"] == f"no task {mine['id']!r}"  # as unknown
        into = await rpc(h, call("SendMessage", message("hi", contextId=mine["contextId"])), B)
        assert (code(into), reason(into)) == (-32001, "session_not_found")
        answer = await rpc(h, call("SendMessage", message("yes", taskId=mine["id"])), B)
        assert code(answer) == -32001
        listed = await rpc(h, call("ListTasks", {"contextId": mine["contextId"]}), B)
        assert listed["result"]["tasks"] == []
        own = await rpc(h, call("ListTasks", {"contextId": mine["contextId"]}), A)
        assert [t["id"] for t in own["result"]["tasks"]] == [mine["id"]]
        assert len(await h.node.messages_of(h.node.sessions[mine["contextId"]])) == 2


async def test_the_boundary_keys_origin_content_type(tmp_path: Path) -> None:
    async with gateway(tmp_path, **{"auth.api_keys": KEYS}) as h:
        assert (await h.http.get("/.well-known/agent-card.json")).status_code == 401
        assert (await h.http.post("/a2a", json=call("GetTask", {"id": "x"}))).status_code == 401
        wrong = {"Authorization": "Bearer nope"}
        assert (
            await h.http.post("/a2a", json=call("GetTask", {}), headers=wrong)
        ).status_code == 403
        evil = {**A, "Origin": "https://evil.example"}
        r = await h.http.post("/a2a", json=call("SendMessage", message("hi")), headers=evil)
        assert (r.status_code, r.json()["error"]["code"]) == (403, "origin_not_allowed")
        r = await h.http.get("/.well-known/agent-card.json", headers=evil)
        assert r.status_code == 403
        plain = {**A, "Content-Type": "text/plain"}
        r = await h.http.post(
            "/a2a", content=json.dumps(call("SendMessage", message("hi"))), headers=plain
        )
        assert r.status_code == 415  # a page's simple request never reaches the method
        assert h.node.sessions == {}
        card = (await h.http.get("/.well-known/agent-card.json", headers=A)).json()
    assert card["securitySchemes"]["bearer"]["httpAuthSecurityScheme"]["scheme"] == "Bearer"
    assert card["supportedInterfaces"][0]["url"] == f"{h.base}/a2a"


async def test_the_card_says_the_public_url(tmp_path: Path) -> None:
    async with gateway(tmp_path, **{"server.public_url": "https://agents.example/gw/"}) as h:
        card = (await h.http.get("/.well-known/agent-card.json")).json()
    assert card["supportedInterfaces"] == [
        {
            "url": "https://agents.example/gw/a2a",
            "protocolBinding": "JSONRPC",
            "protocolVersion": "1.0",
        }
    ]
    assert "securitySchemes" not in card  # no keys configured: none asked
    assert [s["id"] for s in card["skills"]] == ["default"]


async def test_limits_stay_http_with_retry_after(tmp_path: Path) -> None:
    limits = {"auth.api_keys": KEYS, "limits.turns_per_minute_per_key": 1}
    async with gateway(tmp_path, **limits) as h:
        assert "result" in await rpc(h, call("SendMessage", message(TEXT)), A)
        r = await h.http.post("/a2a", json=call("SendMessage", message(TEXT)), headers=A)
        assert (r.status_code, r.json()["error"]["code"]) == (429, "rate_limited")
        assert "retry-after" in r.headers
        assert len(h.node.sessions) == 1  # the refused one made no session
    streams = {"auth.api_keys": KEYS, "limits.max_connections_per_key": 1}
    async with gateway(tmp_path / "2", **streams) as h:
        body = call("SendStreamingMessage", message(LONG_NAP))
        async with h.http.stream("POST", "/a2a", json=body, headers=A) as first:
            assert first.status_code == 200
            r = await h.http.post(
                "/a2a", json=call("SendStreamingMessage", message(TEXT)), headers=A
            )
            assert (r.status_code, r.json()["error"]["code"]) == (503, "over_capacity")
            other = await h.http.post("/a2a", json=call("SendMessage", message(TEXT)), headers=B)
            assert other.status_code == 200  # another key's count


# --- tasks --------------------------------------------------------------------------------


async def test_return_immediately_then_get_task(gw: Harness) -> None:
    body = call("SendMessage", {**message(TEXT), "configuration": {"returnImmediately": True}})
    task = (await rpc(gw, body))["result"]["task"]
    assert task["status"]["state"] == "TASK_STATE_SUBMITTED"
    assert task["history"][0]["taskId"] == task["id"]
    followed = await stream(gw, call("SubscribeToTask", {"id": task["id"]}))  # to its end
    assert states(followed)[-1] == "TASK_STATE_COMPLETED"
    got = (await rpc(gw, call("GetTask", {"id": task["id"]})))["result"]
    assert got["artifacts"][0]["parts"] == [{"text": "Hello there, friend."}]


async def test_cancel_an_ended_task_and_answer_a_working_one(gw: Harness) -> None:
    task = (await rpc(gw, call("SendMessage", message(TEXT))))["result"]["task"]
    answer = await rpc(gw, call("CancelTask", {"id": task["id"]}))
    assert (code(answer), reason(answer)) == (-32002, "task_not_cancelable")
    answer = await rpc(gw, call("SendMessage", message("yes", taskId=task["id"])))
    assert (code(answer), reason(answer)) == (-32004, "task_not_waiting")
    at_once = {**message(LONG_NAP), "configuration": {"returnImmediately": True}}
    busy = (await rpc(gw, call("SendMessage", at_once)))["result"]["task"]["id"]
    answer = await rpc(gw, call("SendMessage", message("yes", taskId=busy)))
    assert (code(answer), reason(answer)) == (-32004, "task_not_waiting")
    context = busy.partition(".")[0]
    answer = await rpc(gw, call("SendMessage", message("more", contextId=context)))
    assert (code(answer), reason(answer)) == (-32004, "turn_in_progress")  # [turns] if_busy
    cancelled = await rpc(gw, call("CancelTask", {"id": busy, "metadata": {"reason": "enough"}}))
    assert cancelled["result"]["status"]["state"] == "TASK_STATE_CANCELED"
    assert cancelled["result"]["status"]["message"]["parts"] == [{"text": "enough"}]


async def test_an_answer_that_is_none_and_a_text_no(tmp_path: Path) -> None:
    async with gateway(tmp_path, **{"tools.require_approval": ["sleep"]}) as h:
        asked = await stream(h, call("SendStreamingMessage", message(TOOL_SCRIPT)))
        assert states(asked)[-1] == "TASK_STATE_INPUT_REQUIRED"
        task_id = asked[0][1]["result"]["task"]["id"]
        answer = await rpc(h, call("SendMessage", message("perhaps", taskId=task_id)))
        assert (code(answer), reason(answer)) == (-32602, "invalid_answer")
        wrong = message("", taskId=task_id)
        wrong["message"]["parts"] = [{"data": {"decision": "allow", "permId": "perm_nope"}}]
        answer = await rpc(h, call("SendMessage", wrong))
        assert (code(answer), reason(answer)) == (-32602, "invalid_answer")
        elsewhere = message("No thanks.", taskId=task_id, contextId="sess_other")
        assert code(await rpc(h, call("SendMessage", elsewhere))) == -32602
        done = (await rpc(h, call("SendMessage", message("No thanks.", taskId=task_id))))["result"]
    assert done["task"]["status"]["state"] == "TASK_STATE_COMPLETED"
    assert done["task"]["artifacts"][0]["parts"][0]["text"] == "Running it now.\n\nAll done."


async def test_a_file_in_and_its_refusals(gw: Harness) -> None:
    msg = message("what is this?")
    msg["message"]["parts"].append(
        {"raw": base64.b64encode(PNG).decode(), "mediaType": "image/png"}
    )
    task = (await rpc(gw, call("SendMessage", msg)))["result"]["task"]
    assert "[image image/png" in task["artifacts"][0]["parts"][0]["text"]  # the model got it
    svg = message("and this?")
    svg["message"]["parts"].append(
        {"raw": base64.b64encode(b"<svg/>").decode(), "mediaType": "image/svg+xml"}
    )
    answer = await rpc(gw, call("SendMessage", svg))
    assert code(answer) == -32005
    bad = message("broken")
    bad["message"]["parts"].append({"raw": "%%%", "mediaType": "image/png"})
    assert code(await rpc(gw, call("SendMessage", bad))) == -32602


# --- the cursor ----------------------------------------------------------------------------


async def test_resubscribing_at_every_cursor_gives_exactly_the_rest(gw: Harness) -> None:
    """Each event of a whole task is a place a client may have dropped: from each, the
    resubscription's text is what the client lacked, and its statuses those after it."""
    full = await stream(gw, call("SendStreamingMessage", message(TOOL_SCRIPT)))
    task_id = full[0][1]["result"]["task"]["id"]
    assert states(full)[-1] == "TASK_STATE_COMPLETED"
    whole = text_of(full)
    assert whole == "Running it now.\n\nAll done."
    for i, (cursor, event) in enumerate(full):
        inner = next(iter(event["result"].values()))
        assert inner["metadata"]["cursor"] == cursor
        rest = await stream(gw, call("SubscribeToTask", {"id": task_id}), {"Last-Event-ID": cursor})
        assert text_of(full[: i + 1]) + text_of(rest) == whole, i
        assert states(rest)[1:] == [s for s in states(full[i + 1 :]) if not s.startswith("task:")]
        assert all(c.split(".")[0] > cursor.split(".")[0] for c, _ in rest[1:])  # none again
    again = await stream(gw, call("SubscribeToTask", {"id": task_id}))
    assert text_of(again) == whole and states(again) == states(full)
    bad = await rpc(gw, call("SubscribeToTask", {"id": task_id}), {"Last-Event-ID": "evt_1"})
    assert (code(bad), reason(bad)) == (-32602, "invalid_cursor")


async def test_resubscribing_mid_reply_joins_the_live_stream(tmp_path: Path) -> None:
    async with gateway(tmp_path) as h:
        script = {"script": {"delay_ms": 5, "rounds": [[{"lorem": 200}]]}}
        first: list[tuple[str, dict[str, Any]]] = []
        rest: list[tuple[str, dict[str, Any]]] = []
        body = call("SendStreamingMessage", message(script))
        async with h.http.stream("POST", "/a2a", json=body) as r:
            event_id = ""
            async for line in r.aiter_lines():
                if line.startswith("id: "):
                    event_id = line[4:]
                elif line.startswith("data: "):
                    first.append((event_id, json.loads(line[6:])))
                    if len(text_of(first).split()) == 20 and not rest:
                        # The client "dropped" here: it resubscribes from its cursor
                        # while the reply streams on (the replay, the seam, then live).
                        task_id = first[0][1]["result"]["task"]["id"]
                        resume = call("SubscribeToTask", {"id": task_id})
                        rest = await stream(h, resume, {"Last-Event-ID": event_id})
                        held = list(first)
        got = (await rpc(h, call("GetTask", {"id": task_id})))["result"]
    whole = got["artifacts"][0]["parts"][0]["text"]
    assert len(whole.split()) == 200
    assert text_of(held) + text_of(rest) == whole
    assert text_of(first) == whole  # the first stream, read to its end, had it all too
    assert states(rest) == ["task:TASK_STATE_WORKING", "TASK_STATE_COMPLETED"]


async def test_a_queued_task_is_submitted_then_cancelled(tmp_path: Path) -> None:
    async with gateway(tmp_path, **{"turns.if_busy": "queue"}) as h:
        at_once = {"configuration": {"returnImmediately": True}}
        busy = (await rpc(h, call("SendMessage", {**message(LONG_NAP), **at_once})))["result"]
        context = busy["task"]["contextId"]
        queued = await rpc(h, call("SendMessage", {**message(TEXT, contextId=context), **at_once}))
        task_id = queued["result"]["task"]["id"]
        got = (await rpc(h, call("GetTask", {"id": task_id})))["result"]
        assert got["status"]["state"] == "TASK_STATE_SUBMITTED"
        with trio.fail_after(10):  # answered once turn.cancelled (phase queued) is out
            cancelled = (await rpc(h, call("CancelTask", {"id": task_id})))["result"]
        assert cancelled["status"]["state"] == "TASK_STATE_CANCELED"
        again = await rpc(h, call("GetTask", {"id": task_id}))
        assert code(again) == -32001  # it never was a turn of the session: gone
        running = (await rpc(h, call("CancelTask", {"id": busy["task"]["id"]})))["result"]
        assert running["status"]["state"] == "TASK_STATE_CANCELED"


async def test_two_keys_racing_for_one_new_context_get_one_each_way(tmp_path: Path) -> None:
    async with gateway(tmp_path, **{"auth.api_keys": KEYS}) as h:
        for n in range(10):
            context = f"race-{n}"
            answers: dict[str, dict[str, Any]] = {}

            async def send(
                who: str, headers: dict[str, str], into: dict[str, dict[str, Any]], context: str
            ) -> None:
                body = call("SendMessage", message(TEXT, contextId=context))
                into[who] = await rpc(h, body, headers)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(send, "a", A, answers, context)
                nursery.start_soon(send, "b", B, answers, context)
            won = sorted(who for who, answer in answers.items() if "result" in answer)
            lost = [answer for answer in answers.values() if "error" in answer]
            assert len(won) == 1 and len(lost) == 1, answers
            assert code(lost[0]) == -32001
            winner, loser = (A, B) if won == ["a"] else (B, A)
            listed = await rpc(h, call("ListTasks", {"contextId": context}), loser)
            assert listed["result"]["tasks"] == []  # nothing of it is the loser's
            listed = await rpc(h, call("ListTasks", {"contextId": context}), winner)
            assert len(listed["result"]["tasks"]) == 1


async def test_a_body_over_the_limit_is_413(tmp_path: Path) -> None:
    limits = {"server.max_body_bytes": 4096, "files.max_bytes": 1024}
    async with gateway(tmp_path, **limits) as h:
        huge = call("SendMessage", message("x" * 20_000))
        r = await h.http.post("/a2a", json=huge)
        assert (r.status_code, r.json()["error"]["code"]) == (413, "body_too_large")
        assert h.node.sessions == {}


WORKER_ASKS = json.dumps(
    {
        "script": {
            "rounds": [
                [{"tool_use": {"name": "sleep", "input": {"seconds": 0.01}}}],
                [{"text": "worked"}],
            ]
        }
    }
)
DELEGATES = {
    "script": {
        "rounds": [
            [{"tool_use": {"name": "delegate", "input": {"task": WORKER_ASKS}}}],
            [{"text": "delegated"}],
        ]
    }
}


async def test_a_delegated_workers_approval_is_the_tasks(tmp_path: Path) -> None:
    async with gateway(tmp_path, **{"tools.require_approval": ["sleep"]}) as h:
        asked = await stream(h, call("SendStreamingMessage", message(DELEGATES)))
        assert states(asked)[-1] == "TASK_STATE_INPUT_REQUIRED"
        question = asked[-1][1]["result"]["statusUpdate"]["status"]["message"]
        assert question["parts"][1]["data"]["toolName"] == "sleep"
        task_id = asked[0][1]["result"]["task"]["id"]
        rest = await stream(h, call("SendStreamingMessage", message("yes", taskId=task_id)))
    assert states(rest) == [
        "task:TASK_STATE_INPUT_REQUIRED",
        "TASK_STATE_WORKING",
        "TASK_STATE_COMPLETED",
    ]
    assert text_of(rest) == "delegated"


async def test_a_context_deleted_mid_task_ends_its_stream_canceled(gw: Harness) -> None:
    events: list[tuple[str, dict[str, Any]]] = []
    body = call("SendStreamingMessage", message(LONG_NAP))
    async with gw.http.stream("POST", "/a2a", json=body) as r:
        async for line in r.aiter_lines():
            if line.startswith("data: "):
                events.append(("", json.loads(line[6:])))
                if text_of(events) == "Napping." and len(events) == 3:
                    context = events[0][1]["result"]["task"]["contextId"]
                    assert (await gw.http.delete(f"/sessions/{context}")).status_code == 204
    # The deletion cancels the turn first (docs/protocol.md §13): the task ends canceled.
    assert states(events)[-1] == "TASK_STATE_CANCELED"
    task_id = events[0][1]["result"]["task"]["id"]
    assert code(await rpc(gw, call("GetTask", {"id": task_id}))) == -32001

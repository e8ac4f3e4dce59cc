"""``POST /a2a`` against a client that means harm (docs/doors/a2a.md): crafted page
tokens, listings whose cost must not grow with the square of a context's turns, and
JSON-RPC notifications (no ``id``), which A2A never sends and the door does not run;
and a task's ``history``, bounded.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio

from gateway.session import turn_start
from tests.conftest import TOOL_SCRIPT, Harness
from tests.integration.doors.a2a.test_a2a_rpc import (
    call,
    code,
    gateway,
    message,
    reason,
    rpc,
    states,
    stream,
    text_of,
)
from tests.integration.mcp.test_mcp_elicitation import ask, pending
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


async def test_get_task_gives_the_turns_messages_as_its_history_bounded(tmp_path: Path) -> None:
    """docs/doors/a2a.md "Tasks and contexts": ``history`` is the turn's user message and
    replies (a tool call and its result left out), the most recent ``historyLength``."""
    async with gateway(tmp_path, **{"tools.require_approval": ["sleep"]}) as h:
        asked = await stream(h, call("SendStreamingMessage", message(TOOL_SCRIPT)))
        task = asked[0][1]["result"]["task"]["id"]
        await rpc(h, call("SendMessage", message("yes", taskId=task)))
        other = await rpc(h, call("SendMessage", message(TEXT, contextId=task.split(".")[0])))

        async def get(**more: Any) -> dict[str, Any]:
            return await rpc(h, call("GetTask", {"id": task, **more}))

        whole = (await get())["result"]["history"]
        assert [(m["role"], m["parts"][0]["text"]) for m in whole] == [
            ("ROLE_USER", json.dumps(TOOL_SCRIPT)),
            ("ROLE_AGENT", "Running it now."),
            ("ROLE_AGENT", "All done."),
        ]
        assert {m["taskId"] for m in whole} == {task}  # not the next task's messages
        last = (await get(historyLength=1))["result"]["history"]
        assert [m["parts"][0]["text"] for m in last] == ["All done."]
        assert "history" not in (await get(historyLength=0))["result"]
        assert code(await get(historyLength=-1)) == -32602
        listed = await rpc(h, call("ListTasks", {"contextId": task.split(".")[0]}))
        assert all("history" not in t for t in listed["result"]["tasks"])  # unless asked
        asked_for = {"contextId": task.split(".")[0], "historyLength": 1}
        listed = await rpc(h, call("ListTasks", asked_for))
        texts = [t["history"][0]["parts"][0]["text"] for t in listed["result"]["tasks"]]
        assert texts == ["All done.", "Hello there, friend."]
        assert other["result"]["task"]["status"]["state"] == "TASK_STATE_COMPLETED"


async def test_listing_finds_its_tasks_starts_in_one_read_of_the_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Turns no longer in the session's memory: their starts come from the store, read
    once for the page (not once per task: a page of 100 was 100 reads of the session)."""
    async with gateway(tmp_path, **{"stream.tail_max_bytes": 1}) as h:
        first = (await rpc(h, call("SendMessage", message(TEXT))))["result"]["task"]
        context = first["contextId"]
        for _ in range(3):
            await rpc(h, call("SendMessage", message(TEXT, contextId=context)))
        reads: list[int] = []
        real = turn_start.each_event_after

        async def counted(*args: Any) -> Any:
            reads.append(1)
            return await real(*args)

        monkeypatch.setattr(turn_start, "each_event_after", counted)
        listed = await rpc(h, call("ListTasks", {"contextId": context}))
    tasks = listed["result"]["tasks"]
    assert [t["status"]["state"] for t in tasks] == ["TASK_STATE_COMPLETED"] * 4
    assert len(reads) == 1


async def test_a_streaming_message_asking_to_return_at_once_is_still_a_stream(
    gw: Harness,
) -> None:
    """``returnImmediately`` is ``SendMessage``'s: a ``SendStreamingMessage`` answers its
    stream whatever the flag says (a stream's client reads ``text/event-stream`` only), and
    the stream is the whole task, as without it."""
    body = {**message(TEXT), "configuration": {"returnImmediately": True}}
    events = await stream(gw, call("SendStreamingMessage", body))
    assert text_of(events) == "Hello there, friend."
    assert states(events)[-1] == "TASK_STATE_COMPLETED"


async def test_an_answer_naming_its_approval_wrongly_allows_nothing(tmp_path: Path) -> None:
    """``permId`` names one approval of several: one that is no string is a wrong answer
    (-32602 ``invalid_answer``), never every open approval of the task."""
    async with gateway(tmp_path, **{"tools.require_approval": ["sleep"]}) as h:
        asked = await stream(h, call("SendStreamingMessage", message(TOOL_SCRIPT)))
        task = asked[0][1]["result"]["task"]["id"]
        for perm in (7, ["perm_x"], {"id": "perm_x"}, True):
            wrong = message("", taskId=task)
            wrong["message"]["parts"] = [{"data": {"decision": "allow", "permId": perm}}]
            answer = await rpc(h, call("SendMessage", wrong))
            assert (code(answer), reason(answer)) == (-32602, "invalid_answer"), perm
        got = (await rpc(h, call("GetTask", {"id": task})))["result"]
        assert got["status"]["state"] == "TASK_STATE_INPUT_REQUIRED"  # nothing allowed


async def test_resubscribing_to_a_queued_task_that_starts_meanwhile_misses_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``SubscribeToTask`` of a task read queued: should its turn start (here: run to its
    end) before the stream joins the session, the stream is still the whole task, through
    the seam, never a live stream that waits for what has happened already."""
    config = {"turns.if_busy": "queue", "tools.require_approval": ["sleep"]}
    async with gateway(tmp_path, **config) as h:
        asked = await stream(h, call("SendStreamingMessage", message(TOOL_SCRIPT)))
        first = asked[0][1]["result"]["task"]["id"]
        context = first.partition(".")[0]
        at_once = {**message(TEXT, contextId=context), "configuration": {"returnImmediately": True}}
        queued = (await rpc(h, call("SendMessage", at_once)))["result"]["task"]
        assert queued["status"]["state"] == "TASK_STATE_SUBMITTED"
        real = h.node.limits.open_stream
        calls: list[str] = []

        async def meanwhile(key: str, door: str) -> Any:
            calls.append(door)
            if len(calls) == 1:  # the resubscription, once it has read the task queued
                await rpc(h, call("SendMessage", message("yes", taskId=first)))
                state = ""
                while state != "TASK_STATE_COMPLETED":  # the queued task runs to its end
                    got = await rpc(h, call("GetTask", {"id": queued["id"]}))
                    state = got["result"]["status"]["state"]
            return await real(key, door)

        monkeypatch.setattr(h.node.limits, "open_stream", meanwhile)
        with trio.fail_after(10):
            events = await stream(h, call("SubscribeToTask", {"id": queued["id"]}))
    assert text_of(events) == "Hello there, friend."
    assert states(events)[-1] == "TASK_STATE_COMPLETED"


async def test_listing_tasks_of_one_state_and_without_artifacts_unless_asked(
    tmp_path: Path,
) -> None:
    """A2A 1.0's ``ListTasks``: ``status`` lists the tasks in that state only (an unknown
    state is -32602), and ``includeArtifacts`` defaults to false."""
    async with gateway(tmp_path, **{"tools.require_approval": ["sleep"]}) as h:
        done = (await rpc(h, call("SendMessage", message(TEXT))))["result"]["task"]
        context = done["contextId"]
        asked = await stream(
            h, call("SendStreamingMessage", message(TOOL_SCRIPT, contextId=context))
        )
        waiting = asked[0][1]["result"]["task"]["id"]

        async def listed(**more: Any) -> dict[str, Any]:
            return await rpc(h, call("ListTasks", {"contextId": context, **more}))

        every = (await listed())["result"]["tasks"]
        assert [t["id"] for t in every] == [done["id"], waiting]
        assert all("artifacts" not in t for t in every)  # not asked for
        full = (await listed(includeArtifacts=True))["result"]["tasks"]
        assert full[0]["artifacts"][0]["parts"] == [{"text": "Hello there, friend."}]
        for state, ids in (
            ("TASK_STATE_INPUT_REQUIRED", [waiting]),
            ("TASK_STATE_COMPLETED", [done["id"]]),
            ("TASK_STATE_FAILED", []),
            (3, [done["id"]]),  # protobuf's JSON takes an enum's number too
            ("TASK_STATE_UNSPECIFIED", [done["id"], waiting]),  # no filter
        ):
            tasks = (await listed(status=state))["result"]["tasks"]
            assert [t["id"] for t in tasks] == ids, state
        for bad in ("WORKING", "TASK_STATE_NOPE", 42, -1):
            assert code(await listed(status=bad)) == -32602, bad


async def test_a_messages_history_length_bounds_the_answers_history(gw: Harness) -> None:
    """``configuration.historyLength`` of ``SendMessage``: the answer's task holds at most
    that many messages (A2A 1.0: MUST NOT more; 0: none), and below 0 is -32602 before
    anything is made, as ``GetTask``'s."""

    def sent(length: int) -> dict[str, Any]:
        return call("SendMessage", {**message(TEXT), "configuration": {"historyLength": length}})

    none = (await rpc(gw, sent(0)))["result"]["task"]
    assert none["status"]["state"] == "TASK_STATE_COMPLETED" and "history" not in none
    one = (await rpc(gw, sent(1)))["result"]["task"]
    assert [m["role"] for m in one["history"]] == ["ROLE_USER"]
    streamed = await stream(gw, {**sent(0), "method": "SendStreamingMessage"})
    assert "history" not in streamed[0][1]["result"]["task"]
    made = len((await gw.http.get("/sessions")).json()["sessions"])
    assert code(await rpc(gw, sent(-1))) == -32602
    assert len((await gw.http.get("/sessions")).json()["sessions"]) == made  # none made


async def test_content_for_several_open_approvals_decides_none_of_them(tmp_path: Path) -> None:
    """An answer's ``content`` answers one elicitation: with several approvals open and no
    ``permId``, it is -32602 ``invalid_answer`` and decides nothing (it accepted the
    elicitation, then was refused at the tool's permission: an error that allowed)."""
    async with gateway(tmp_path, **{"tools.require_approval": ["sleep"]}) as h:
        sid = await h.create_session()
        answers: list[Any] = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(ask, h, sid, answers)  # an MCP server's question, first
            await pending(h, sid)
            asked = await stream(
                h, call("SendStreamingMessage", message(TOOL_SCRIPT, contextId=sid))
            )
            task = asked[0][1]["result"]["task"]["id"]
            assert len(h.node.sessions[sid].pending_permissions()) == 2  # and the tool's
            both = message("", taskId=task)
            both["message"]["parts"] = [{"data": {"decision": "allow", "content": {"ok": True}}}]
            answer = await rpc(h, call("SendMessage", both))
            assert len(h.node.sessions[sid].pending_permissions()) == 2  # nothing decided
            assert answers == []
            assert (code(answer), reason(answer)) == (-32602, "invalid_answer")
            nursery.cancel_scope.cancel()

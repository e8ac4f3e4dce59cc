"""The AI SDK's ``ai`` npm package (v7) reads the gateway's chunk streams (docs/doors/aisdk.md).

The test installs ``ai@7`` and ``ws`` into a temporary directory (``npm
install --prefix``, quiet, once per test run: tests/npm_support.py) and runs tests/aisdk_js/*.mjs:

- chunks.mjs: every response the mapping makes of every recorded trace
  (tests/unit/doors/aisdk/test_aisdk_mapping.py's :func:`dump`), each chunk
  validated by the package's own ``uiMessageChunkSchema`` and each response
  assembled by ``readUIMessageStream``;
- socket.mjs: ``WebSocketChatTransport`` over the ``ws`` package: a turn, a
  resume of a turn in flight (the whole message, then live), none with
  nothing in flight, and an abort of a send that cancels its turn;
- live.mjs: ``DefaultChatTransport`` against a running gateway: a text turn,
  a tool turn, ``reconnectToStream`` on a turn in flight (the whole message,
  then live, never a part twice) and with none (``null``: the 204), a stop;
  the package's chat dropping its stream (``stop()``) and resuming it;
- approval.mjs: the package's own chat (``AbstractChat``, what ``useChat``
  wraps) through a tool approval: ``addToolApprovalResponse`` sends the
  message back and the turn continues in the same message; allowed, denied,
  and a delegated worker's request (on the parent's ``delegate`` call);
- rewind.mjs: the package's own chat's ``regenerate()`` and an edited message
  (``sendMessage`` with a ``messageId``): one answer in place of the old one,
  the gateway's conversation the chat's (docs/protocol.md §2 "Edit and regenerate");
- files.mjs: the package's own chat sends a picture (``sendMessage({text,
  files})``: a ``file`` part, a data URL), which becomes the turn's image
  block, and the reply comes back; then the same picture by the URL the
  gateway serves it at (docs/doors/aisdk.md "Files"). chunks.mjs reads a
  tool's files as ``file`` parts.

Skipped, saying why, where node or npm is missing or the registry cannot be
reached (.ci/run installs node and npm).
"""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import uuid
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.conftest import make_config, running_gateway
from tests.files_support import png, said_back
from tests.npm_support import npm_prefix as npm_prefix
from tests.paths import TESTS
from tests.unit.doors.aisdk.test_aisdk_mapping import dump

# slow: node runs the AI SDK's own code
pytestmark = pytest.mark.slow

SCRIPTS = TESTS / "aisdk_js"


@pytest.fixture
def node_modules(npm_prefix: Path) -> Path:
    return npm_prefix / "node_modules"


async def node(script: str, *args: str) -> Any:
    done = await trio.run_process(
        [shutil.which("node") or "node", str(SCRIPTS / script), *args],
        capture_stdout=True,
        capture_stderr=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    return json.loads(done.stdout)


def parts(message: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [p for p in message["parts"] if p["type"] == kind]


def text(message: dict[str, Any]) -> str:
    return "".join(p["text"] for p in parts(message, "text"))


def tool(message: dict[str, Any]) -> dict[str, Any]:
    [found] = parts(message, "dynamic-tool")  # the gateway's tools: dynamic, run by it
    return found


async def test_every_chunk_of_every_trace_is_one_the_package_reads(
    tmp_path: Path, node_modules: Path
) -> None:
    dump(tmp_path / "chunks.json")
    with trio.fail_after(60):
        out = await node("chunks.mjs", str(node_modules), str(tmp_path / "chunks.json"))
    assert len(out) > 25
    for key, response in out.items():
        assert response["invalid"] == [], key
        expected = ["overloaded: scripted overloaded after 5 deltas"] * key.startswith("provider_")
        assert response["errors"] == expected, key
        turn = key.split("/")[1]
        assert response["message"]["id"] == f"msg_{turn if turn.startswith('turn') else 'turn_1'}"
    m = {key: r["message"] for key, r in out.items()}
    assert text(m["plain_text/turn_1/0"]) == "You said: Hello there, gateway"
    [signed, redacted] = parts(m["thinking_then_text/turn_1/0"], "reasoning")
    assert signed["providerMetadata"]["gateway"]["signature"].startswith("sig_")
    assert redacted["providerMetadata"]["gateway"]["redactedData"] == "opaque-data"
    naps = parts(m["parallel_tools/turn_1/0"], "dynamic-tool")
    assert [(t["state"], t["output"]) for t in naps] == [
        ("output-available", "slept 0.01 s"),
        ("output-available", "slept 0.25 s"),
    ]
    assert all(t["providerExecuted"] is True for t in naps)
    asked = tool(m["cancel_seam/turn_1/0"])
    assert asked["state"] == "approval-requested" and asked["approval"]["id"] == "perm_1"
    assert tool(m["cancel_tools/turn_1/0"])["state"] == "output-error"
    answered = tool(m["claude_code_tool/answered"])
    assert answered["state"] == "output-available" and answered["approval"]["approved"] is True
    assert tool(m["claude_code_tool/denied"])["state"] == "output-denied"
    [elicitation] = parts(m["elicitation_pending/answered"], "data-elicitation")
    assert elicitation["data"]["state"] == "resolved"
    assert text(m["since_mid_message/turn_1/1"]) == "Seven words make up this reply here."
    assert tool(m["delegate_workers/turn_1/0"])["output"] == {"worker_session_id": "sess_2"}
    [image, audio] = parts(m["tool_files/turn_1/0"], "file")  # a tool's files, by URL
    assert image["mediaType"] == "image/png" and audio["mediaType"] == "audio/wav"
    assert image["url"].startswith("/sessions/sess_1/files/file_")


def types(chunks: list[dict[str, Any]]) -> list[str]:
    return [c["type"] for c in chunks]


def once_each(chunks: list[dict[str, Any]]) -> None:
    """No part started twice in one response, one start and one finish."""
    starts = [(c["type"], c.get("id") or c.get("toolCallId")) for c in chunks
              if c["type"] in ("text-start", "reasoning-start", "tool-input-start")]  # fmt: skip
    assert len(starts) == len(set(starts)), starts
    assert types(chunks)[0] == "start" and types(chunks).count("start") == 1
    assert types(chunks)[-1] == "finish" and types(chunks).count("finish") == 1


async def test_the_transport_streams_resumes_and_stops_turns(
    tmp_path: Path, node_modules: Path
) -> None:
    with trio.fail_after(90):
        async with running_gateway(make_config(tmp_path)) as h:
            out = await node("live.mjs", str(node_modules), h.base)

    said = out["text"]
    assert said["errors"] == [] and text(said["message"]) == "Hello from the gateway."
    assert [p["text"] for p in parts(said["message"], "reasoning")] == ["Greet them."]
    once_each(said["chunks"])
    assert said["chunks"][-1]["finishReason"] == "stop"
    assert said["message"]["metadata"]["gateway"]["turnId"]

    ran = out["tool"]
    assert ran["errors"] == [] and text(ran["message"]) == "Running it now.All done."
    nap = tool(ran["message"])
    assert (nap["toolName"], nap["input"], nap["state"]) == (
        "sleep", {"seconds": 0.01}, "output-available"
    )  # fmt: skip
    once_each(ran["chunks"])

    # A resume of the turn in flight: the message so far, then live, each part once.
    resumed = out["resume"]
    assert types(resumed["dropped"]).count("text-delta") >= 3
    assert resumed["errors"] == []
    once_each(resumed["chunks"])
    whole = resumed["message"]
    assert text(whole) == "One two three four five six.Seven eight nine ten."
    assert tool(whole)["state"] == "output-available" and tool(whole)["output"] == "slept 2 s"
    assert resumed["chunks"][-1]["finishReason"] == "stop"
    assert out["none"] is None  # nothing in flight: 204

    stopped = out["stop"]
    assert stopped["status"] == 202 and stopped["body"]["turn_id"]
    assert types(stopped["chunks"])[-2:] == ["abort", "finish"]
    assert stopped["chunks"][-2]["reason"] == "user"
    assert stopped["chunks"][-1]["finishReason"] == "other" and stopped["errors"] == []
    assert all(p["state"] == "done" for p in parts(stopped["message"], "text"))

    # The chat's own stop drops the stream only; its resume replaces the message whole.
    chat = out["chat"]
    assert chat["errors"] == [] and chat["status"] == "ready"
    [_, cut] = chat["dropped"]
    assert 0 < len(text(cut)) < len("One two three four five six.")
    [_, resumed_message] = chat["messages"]
    assert resumed_message["id"] == cut["id"]
    assert [p["text"] for p in parts(resumed_message, "text")] == [
        "One two three four five six.",
        "Seven eight nine ten.",
    ]
    assert tool(resumed_message)["state"] == "output-available"


async def test_the_packages_chat_answers_an_approval_and_the_turn_goes_on(
    tmp_path: Path, node_modules: Path
) -> None:
    config = make_config(tmp_path, **{"tools.require_approval": ["sleep"]})
    with trio.fail_after(60):
        async with running_gateway(config) as h:
            both = await node("approval.mjs", str(node_modules), h.base)
    out = both["allowed"]
    assert out["errors"] == [] and out["status"] == "ready"
    [_, asked] = out["asked"]
    part = tool(asked)
    assert part["state"] == "approval-requested" and part["approval"]["id"].startswith("perm_")
    assert asked["metadata"]["gateway"]["lastEventId"]
    [_, done] = out["done"]  # the same message, continued
    assert done["id"] == asked["id"]
    part = tool(done)
    assert part["state"] == "output-available" and part["approval"]["approved"] is True
    assert [p["text"] for p in parts(done, "text")] == ["Running it now.", "All done."]
    # Denied: the tool part ends output-denied, and the turn goes on without it.
    out = both["denied"]
    assert out["errors"] == [] and out["status"] == "ready"
    [_, done] = out["done"]
    part = tool(done)
    assert part["state"] == "output-denied" and part["approval"]["approved"] is False
    assert text(done) == "Running it now.All done."
    # A worker's request: on the delegate call that runs it, answered the same way.
    out = both["worker"]
    assert out["errors"] == [] and out["status"] == "ready"
    [_, asked] = out["asked"]
    part = tool(asked)
    assert (part["toolName"], part["state"]) == ("delegate", "approval-requested")
    [_, done] = out["done"]
    part = tool(done)
    assert part["state"] == "output-available" and part["approval"]["approved"] is True
    [worker] = parts(done, "data-delegate")
    assert worker["data"]["state"] == "completed" and worker["data"]["result"] == "Worker awake."
    assert text(done) == "Asking a worker.All done."


async def test_the_websocket_transport_streams_resumes_and_aborts(
    tmp_path: Path, node_modules: Path
) -> None:
    """``WebSocketChatTransport`` over the ``ws`` package: send, resume, abort (§14)."""
    with trio.fail_after(90):
        async with running_gateway(make_config(tmp_path)) as h:
            out = await node("socket.mjs", str(node_modules), h.base)
            said = out["text"]
            assert said["errors"] == [] and text(said["message"]) == "Hello over the socket."
            assert [p["text"] for p in parts(said["message"], "reasoning")] == ["Greet them."]
            once_each(said["chunks"])
            resumed = out["resume"]
            assert resumed["errors"] == []
            once_each(resumed["chunks"])
            assert text(resumed["message"]) == "One two three.Four five six."
            assert tool(resumed["message"])["state"] == "output-available"
            assert out["none"] is None  # nothing in flight: no-active
            # The abort of a send cancelled its turn.
            session = h.node.sessions[out["abort"]["chat"]]
            with trio.fail_after(10):
                while session.turn is not None:
                    await h.node.changed()


async def test_the_packages_chat_regenerates_and_edits_in_place(
    tmp_path: Path, node_modules: Path
) -> None:
    with trio.fail_after(60):
        async with running_gateway(make_config(tmp_path)) as h:
            out = await node("rewind.mjs", str(node_modules), h.base)
            r = await h.http.get(f"/sessions/{out['id']}/messages")
            conversation = r.json()["messages"]
            r = await h.http.get(f"/sessions/{out['id']}/messages?include_rewound=true")
            every = r.json()["messages"]
    assert out["errors"] == [] and out["status"] == "ready"

    def shown(messages: list[dict[str, Any]]) -> list[tuple[str, str]]:
        return [(m["role"], text(m)) for m in messages]

    asked = out["asked"]
    assert shown(asked)[-1] == ("assistant", "You said: The second question")
    regenerated = out["regenerated"]
    assert shown(regenerated) == shown(asked)  # the same text, once: no duplicate
    assert [m["id"] for m in regenerated[:3]] == [m["id"] for m in asked[:3]]
    assert regenerated[3]["id"] != asked[3]["id"]  # a new answer in place of the old
    assert shown(out["edited"]) == [
        ("user", "The first question, edited"),
        ("assistant", "You said: The first question, edited"),
    ]
    again = out["again"]
    assert shown(again) == shown(out["edited"]) and again[1]["id"] != out["edited"][1]["id"]
    # The gateway's conversation is the chat's; every old answer is kept, rewound.
    assert [(m["role"], m["content"][0]["text"]) for m in conversation] == shown(again)
    assert again[1]["id"] == f"msg_{conversation[1]['turn_id']}"  # the turn's answer
    assert len(every) == 10 and sum(bool(m.get("rewound")) for m in every) == 8


async def test_the_packages_chat_sends_a_picture_and_gets_the_reply(
    tmp_path: Path, node_modules: Path
) -> None:
    image = png(9, 7)
    chat_id = f"js-files-{uuid.uuid4()}"
    with trio.fail_after(90):
        async with running_gateway(make_config(tmp_path)) as h:
            b64 = base64.b64encode(image).decode()
            out = await node("files.mjs", str(node_modules), h.base, chat_id, b64)
            stored = (await h.http.get(f"/sessions/{chat_id}/messages")).json()["messages"]
    assert out["errors"] == [] and out["first"] == out["status"] == "ready"
    asked, answer, again, answer2 = out["messages"]
    assert [p["type"] for p in asked["parts"]] == ["file", "text"]
    # The model got the picture's very bytes (the scripted model says them back).
    got = said_back("image", "image/png", image)
    assert text(answer) == "You said: What is in this picture?" + got
    assert text(answer2) == "You said: And now?" + got
    # The model's turn held the picture: its image block, its size, the same bytes' id.
    block = {"type": "image", "file_id": "file_" + hashlib.sha256(image).hexdigest()[:32],
             "media_type": "image/png", "size": len(image)}  # fmt: skip
    assert stored[0]["content"] == [block, {"type": "text", "text": "What is in this picture?"}]
    assert stored[2]["content"] == [block, {"type": "text", "text": "And now?"}]
    assert again["parts"][0]["url"] == f"/sessions/{chat_id}/files/{block['file_id']}"

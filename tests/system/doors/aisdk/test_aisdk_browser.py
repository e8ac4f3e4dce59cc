"""The AI SDK's ``useChat`` core in Chromium, on the gateway's own origin (docs/doors/aisdk.md).

The ``ai`` package (version 7) and ``esbuild`` are installed with npm into a
temporary directory, once per test run (tests/npm_support.py); tests/aisdk_browser/chat.mjs (the
package's ``AbstractChat`` with a minimal state: what ``@ai-sdk/react``'s
``useChat`` wraps) is bundled for the browser and injected into the page the
gateway serves at ``/``, so every request is the page's own origin:
``DefaultChatTransport({api: "/ai-sdk/chat"})`` (the key as a Bearer header)
or ``WebSocketChatTransport({url: "/ai-sdk/ws", params: {key}})`` (a browser's
WebSocket sends no header; the page's Content-Security-Policy is bypassed for
the injected bundle, which stands for a front end on the same origin). One
``gateway serve`` on the scripted model, with an API key and ``sleep`` behind
approval, and one tab serve the module (each test its own chats). On both
transports:

- a text turn: the user message and one assistant message, its text done;
- a tool behind approval, answered with ``addToolApprovalResponse`` and sent
  by ``sendAutomaticallyWhen: lastAssistantMessageIsCompleteWithApprovalResponses``
  (approved, and denied): the same assistant message continues;
- a reload mid-turn: the tab saves its messages, reloads, and
  ``resumeStream()`` builds the whole message (the one it held, replaced),
  no part ever shown twice, not even while it streams; a reload while an
  approval waits, answered after the resume;
- two tabs on one chat: the second resumes what the first streams, and both
  end with the same message;
- the stop route racing the turn's end: whichever wins, the chat ends ready
  and agrees with the gateway's record (cancelled, or complete and whole);
- the stop route cancelling a turn (``abort``, then ``finish``), and the
  WebSocket's ``abort`` (``useChat``'s ``stop()``) doing the same; over HTTP
  ``stop()`` only drops the fetch, and a WebSocket closed under the chat
  cancels nothing either: the turn goes on to be resumed;
- a model call that fails: ``useChat``'s error, the text so far kept;
- a wrong key on the WebSocket: the chat's error, no session made.

The UI messages are read back with ``page.evaluate``; an uncaught error in the
page fails the test. Skipped, saying why, where node, npm or the registry is
missing, or where Chromium cannot be had (tests/ui_support.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.npm_support import npm_prefix as npm_prefix
from tests.paths import TESTS
from tests.ui_support import Daemon, launched_chromium, serving

# slow: npm, esbuild and chromium
pytestmark = pytest.mark.slow

ENTRY = TESTS / "aisdk_browser" / "chat.mjs"
KEY = "aisdk-browser-key"
CONFIG = f"""
[auth]
api_keys = ["{KEY}"]

[tools]
enabled = ["sleep"]
require_approval = ["sleep"]
"""
WAIT_MS = 15_000
TRANSPORTS = ["http", "ws"]

# A reply long enough to reload or stop in the middle of (50 ms a word).
WORDS = " ".join(f"word{i}" for i in range(60))


def script(rounds: list[Any], delay_ms: int = 0) -> str:
    return json.dumps({"script": {"delay_ms": delay_ms, "rounds": rounds}})


TOOL = script(
    [
        [{"text": "Sleeping first."}, {"tool_use": {"name": "sleep", "input": {"seconds": 0.01}}}],
        [{"text": "All done."}],
    ]
)
RACE_TEXT = "one two three four five six seven eight"
RACE = script([[{"text": RACE_TEXT}]], delay_ms=60)
SLOW = script([[{"thinking": "Let me think."}, {"text": WORDS}]], delay_ms=50)


# --- fixtures ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def bundle(npm_prefix: Path, tmp_path_factory: pytest.TempPathFactory) -> str:
    """chat.mjs and the ``ai`` package bundled for the browser (one iife script)."""
    prefix = npm_prefix
    out = tmp_path_factory.mktemp("aisdk-bundle") / "chat.js"
    esbuild = prefix / "node_modules" / ".bin" / "esbuild"
    flags = ["--bundle", "--minify", "--format=iife", "--platform=browser", "--target=chrome110"]
    built = subprocess.run(
        [str(esbuild), str(ENTRY), *flags, "--log-level=warning", f"--outfile={out}"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "NODE_PATH": str(prefix / "node_modules")},
    )
    assert built.returncode == 0, built.stderr
    return out.read_text()


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    with serving(tmp_path_factory.mktemp("aisdk-gateway"), CONFIG) as gateway:
        yield gateway


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with launched_chromium() as launched:
        yield launched


class Tab:
    """The gateway's page in one browser tab, with the bundle injected: chats driven by id."""

    def __init__(self, browser: Any, daemon: Daemon, bundle: str) -> None:
        self.daemon = daemon
        self.bundle = bundle
        # The page's Content-Security-Policy allows its own scripts only: the bundle
        # stands for a front end served from the same origin, so it is let in.
        self.context = browser.new_context(bypass_csp=True)
        # The page's own UI asks for the key on its first 401: it has it already.
        self.context.add_init_script(
            f"sessionStorage.setItem('gateway.apiKey', {json.dumps(KEY)});"
        )
        self.page = self.context.new_page()
        self.page.set_default_timeout(WAIT_MS)
        self.errors: list[str] = []
        self.page.on("pageerror", lambda exc: self.errors.append(str(exc)))
        self.page.goto(daemon.base + "/")
        self.inject()

    def inject(self) -> None:
        self.page.add_script_tag(content=self.bundle)
        assert self.page.evaluate("typeof window.aisdkTest") == "object"

    def reload(self) -> None:
        self.page.reload()
        self.inject()

    def call(self, method: str, *args: Any) -> Any:
        """``window.aisdkTest[method](...args)``, awaited in the page."""
        return self.page.evaluate(
            "([method, args]) => window.aisdkTest[method](...args)", [method, list(args)]
        )

    def open(self, kind: str, chat_id: str | None = None, restore: bool = False) -> str:
        chat_id = chat_id or f"browser-{uuid.uuid4().hex[:12]}"
        self.call("open", chat_id, kind, KEY, restore)
        return chat_id

    def close(self) -> None:
        self.context.close()


@pytest.fixture(scope="module")
def shared_tab(browser: Any, daemon: Daemon, bundle: str) -> Iterator[Tab]:
    """One tab for the module (each test its own chats): a page load per test is slow."""
    opened = Tab(browser, daemon, bundle)
    try:
        yield opened
    finally:
        opened.close()


@pytest.fixture
def tab(shared_tab: Tab) -> Iterator[Tab]:
    """The module's tab; an uncaught error in the page during the test fails it."""
    shared_tab.errors.clear()
    yield shared_tab
    assert shared_tab.errors == [], shared_tab.errors


def gateway(daemon: Daemon, method: str, path: str) -> httpx.Response:
    headers = {"Authorization": f"Bearer {KEY}"}
    return httpx.request(method, daemon.base + path, headers=headers, timeout=10)


# --- reading UI messages ----------------------------------------------------------------


def kinds(message: dict[str, Any]) -> list[str]:
    return [str(part["type"]) for part in message["parts"]]


def texts(message: dict[str, Any]) -> list[str]:
    return [str(part["text"]) for part in message["parts"] if part["type"] == "text"]


def tools(message: dict[str, Any]) -> list[dict[str, Any]]:
    """The tool parts, whatever their type (see test_a_gateway_tool_is_a_dynamic_part)."""
    return [part for part in message["parts"] if "toolCallId" in part]


def tool_name(part: dict[str, Any]) -> str:
    """A dynamic tool part's ``toolName``; a static one's is in its type (``tool-NAME``)."""
    return str(part.get("toolName") or part["type"].removeprefix("tool-"))


def assistant(view: dict[str, Any]) -> dict[str, Any]:
    """The one assistant message of a one-turn chat (after its user message)."""
    roles = [m["role"] for m in view["messages"]]
    assert roles == ["user", "assistant"], roles
    return dict(view["messages"][1])


def never_twice(view: dict[str, Any], final: dict[str, Any]) -> None:
    """Every state the chat showed: each text or reasoning part a prefix of its final
    text (a part never repeated, nor grown twice), and never more parts than at the end."""
    finals = [(p["type"], p.get("text", "")) for p in final["parts"]]
    for parts in view["writes"]:
        shown = [(p["type"], p.get("text", "")) for p in parts if p["type"] != "step-start"]
        ended = [f for f in finals if f[0] != "step-start"]
        assert len(shown) <= len(ended), shown
        for (kind, text), (final_kind, final_text) in zip(shown, ended, strict=False):
            assert kind == final_kind, (shown, ended)
            assert final_text.startswith(text), (text, final_text)


# --- the tests --------------------------------------------------------------------------


@pytest.mark.parametrize("kind", TRANSPORTS)
def test_a_text_turn(tab: Tab, kind: str) -> None:
    chat_id = tab.open(kind)
    tab.call("send", chat_id, "Hello from the browser")
    assert tab.call("sent", chat_id) == "resolved"
    view = tab.call("settled", chat_id, 1)
    assert view["status"] == "ready" and view["error"] is None, view
    message = assistant(view)
    assert message["id"].startswith("msg_turn_")
    assert kinds(message) == ["step-start", "text"]
    assert texts(message) == ["You said: Hello from the browser"]
    assert message["parts"][1]["state"] == "done"
    assert message["metadata"]["gateway"]["turnId"] == message["id"].removeprefix("msg_")
    assert view["finishes"] == [
        {
            "messageId": message["id"],
            "isAbort": False,
            "isDisconnect": False,
            "isError": False,
            "finishReason": "stop",
        }
    ]
    never_twice(view, message)
    # The chat is the session, owned by the page's key.
    assert gateway(tab.daemon, "GET", f"/sessions/{chat_id}").status_code == 200


@pytest.mark.parametrize("kind", TRANSPORTS)
def test_a_failed_turn_is_the_chat_error(tab: Tab, kind: str) -> None:
    """A model call that fails: its ``error`` chunk is ``useChat``'s error, the text kept."""
    chat_id = tab.open(kind)
    failing = json.dumps(
        {
            "script": {
                "rounds": [[{"text": "Half of a reply that never ends"}]],
                "fail": {"round": 0, "after_deltas": 2, "error_class": "invalid_request"},
            }
        }
    )
    tab.call("send", chat_id, failing)
    view = tab.call("settled", chat_id, 1)
    assert view["status"] == "error", view
    assert "invalid_request" in view["error"], view
    assert view["errors"] and view["finishes"][0]["isError"] is True, view
    message = assistant(view)
    assert texts(message) == ["Half of "]
    # The chat takes the next turn.
    tab.call("send", chat_id, "again")
    view = tab.call("settled", chat_id, 2)
    assert view["status"] == "ready" and texts(view["messages"][-1]) == ["You said: again"]


@pytest.mark.parametrize("approved", [True, False], ids=["approved", "denied"])
@pytest.mark.parametrize("kind", TRANSPORTS)
def test_a_tool_behind_approval(tab: Tab, kind: str, approved: bool) -> None:
    chat_id = tab.open(kind)
    tab.call("send", chat_id, TOOL)
    view = tab.call("settled", chat_id, 1)
    assert view["status"] == "ready", view
    asked = assistant(view)
    [tool] = tools(asked)
    assert tool_name(tool) == "sleep" and tool["input"] == {"seconds": 0.01}
    assert tool["state"] == "approval-requested"
    assert view["finishes"][0]["finishReason"] == "tool-calls"

    tab.call("approve", chat_id, tool["approval"]["id"], approved)
    view = tab.call("settled", chat_id, 2)
    assert view["status"] == "ready" and view["error"] is None, view
    message = assistant(view)  # the same message, continued
    assert message["id"] == asked["id"]
    assert kinds(message) == ["step-start", "text", tool["type"], "step-start", "text"]
    assert texts(message) == ["Sleeping first.", "All done."]
    [tool] = tools(message)
    assert tool["approval"]["approved"] is approved
    if approved:
        assert tool["state"] == "output-available" and tool["output"] == "slept 0.01 s"
    else:
        assert tool["state"] == "output-denied"
    assert [f["finishReason"] for f in view["finishes"]] == ["tool-calls", "stop"]
    never_twice(view, message)


def test_a_gateway_tool_is_a_dynamic_part(tab: Tab) -> None:
    """The gateway runs its tools: the part is ``dynamic-tool``, ``providerExecuted``."""
    chat_id = tab.open("http")
    tab.call("send", chat_id, TOOL)
    [tool] = tools(assistant(tab.call("settled", chat_id, 1)))
    assert tool["type"] == "dynamic-tool" and tool["toolName"] == "sleep", tool
    assert tool["providerExecuted"] is True, tool


@pytest.mark.parametrize("kind", TRANSPORTS)
def test_a_reload_mid_turn_resumes_the_whole_message(tab: Tab, kind: str) -> None:
    chat_id = tab.open(kind)
    tab.call("send", chat_id, SLOW)
    held = tab.call("streamed", chat_id, 40)
    assert 40 <= len(held) < len(WORDS)
    tab.call("save", chat_id)  # what the app persisted
    tab.reload()  # the request is dropped with the page: the turn goes on

    tab.open(kind, chat_id, restore=True)
    restored = tab.call("view", chat_id)["messages"]
    assert [m["role"] for m in restored] == ["user", "assistant"]
    tab.call("resume", chat_id)
    view = tab.call("settled", chat_id, 1)
    assert view["status"] == "ready" and view["error"] is None, view
    message = assistant(view)  # the message it held, replaced: not a second one
    assert message["id"] == restored[1]["id"]
    assert kinds(message) == ["step-start", "reasoning", "text"]
    assert texts(message) == [WORDS]
    assert message["parts"][1]["text"] == "Let me think."
    assert view["finishes"][0]["finishReason"] == "stop"
    never_twice(view, message)


@pytest.mark.parametrize("kind", TRANSPORTS)
def test_a_reload_while_an_approval_waits(tab: Tab, kind: str) -> None:
    """``resume: true`` after a reload shows the approval again; answering it continues."""
    chat_id = tab.open(kind)
    tab.call("send", chat_id, TOOL)
    tab.call("settled", chat_id, 1)
    tab.reload()  # nothing saved: the tab starts empty, as useChat without storage

    tab.open(kind, chat_id)
    tab.call("resume", chat_id)
    view = tab.call("settled", chat_id, 1)
    assert view["status"] == "ready" and view["error"] is None, view
    [message] = view["messages"]
    [tool] = tools(message)
    assert tool["state"] == "approval-requested"
    assert texts(message) == ["Sleeping first."]
    tab.call("approve", chat_id, tool["approval"]["id"], True)
    view = tab.call("settled", chat_id, 2)
    assert view["status"] == "ready" and view["error"] is None, view
    [answered] = view["messages"]
    assert answered["id"] == message["id"]
    assert texts(answered) == ["Sleeping first.", "All done."]
    [tool] = tools(answered)
    assert tool["state"] == "output-available" and tool["output"] == "slept 0.01 s"
    never_twice(view, answered)


@pytest.mark.parametrize("kind", TRANSPORTS)
def test_two_tabs_on_one_chat(
    tab: Tab, browser: Any, daemon: Daemon, bundle: str, kind: str
) -> None:
    """A second tab resumes the chat the first is streaming: both end with the same message."""
    chat_id = tab.open(kind)
    tab.call("send", chat_id, SLOW)
    tab.call("streamed", chat_id, 20)
    other = Tab(browser, daemon, bundle)
    try:
        other.open(kind, chat_id)
        other.call("resume", chat_id)
        theirs = other.call("settled", chat_id, 1)
        errors = other.errors
    finally:
        other.close()
    assert errors == [], errors
    ours = tab.call("settled", chat_id, 1)
    for view in (ours, theirs):
        assert view["status"] == "ready" and view["error"] is None, view
    message = assistant(ours)
    [resumed] = theirs["messages"]  # the tab had no history: only the turn in flight
    assert resumed["id"] == message["id"]
    assert [(p["type"], p.get("text")) for p in resumed["parts"]] == [
        (p["type"], p.get("text")) for p in message["parts"]
    ]
    assert texts(message) == [WORDS]
    never_twice(ours, message)
    never_twice(theirs, resumed)


@pytest.mark.parametrize("kind", TRANSPORTS)
def test_a_stop_racing_the_end_of_the_turn(tab: Tab, kind: str) -> None:
    """The stop route fired once the page has shown 1, half, all but the last word, or all
    of a short reply (the last two: as the turn ends): whatever wins, the chat ends ready,
    its message whole or cut, and in agreement with the gateway's record of the turn."""
    outcomes = []
    last_word = len(RACE_TEXT) - len("eight")  # shown 60 ms before the turn ends
    for chars in (1, len(RACE_TEXT) // 2, last_word, last_word, len(RACE_TEXT)):
        chat_id = tab.open(kind)
        stopped = tab.page.evaluate(
            """async ([id, key, text, chars]) => {
                window.aisdkTest.send(id, text);
                await window.aisdkTest.streamed(id, chars);
                const r = await fetch(`/ai-sdk/chat/${id}/stop`, {method: "POST",
                    headers: {Authorization: `Bearer ${key}`, "Content-Type": "application/json"}});
                return r.status;
            }""",
            [chat_id, KEY, RACE, chars],
        )
        assert stopped in (202, 409), stopped
        view = tab.call("settled", chat_id, 1)
        assert view["status"] == "ready" and view["error"] is None, view
        message = assistant(view)
        reason = view["finishes"][0]["finishReason"]
        got = gateway(tab.daemon, "GET", f"/sessions/{chat_id}/messages").json()["messages"]
        status = [m["status"] for m in got if m["role"] == "assistant"]
        [text] = texts(message)
        if reason == "other":
            assert stopped == 202 and status == ["cancelled"], (stopped, status)
            assert RACE_TEXT.startswith(text), text
        else:
            assert reason == "stop" and status == ["complete"], (reason, status)
            assert text == RACE_TEXT
        outcomes.append((chars, stopped, reason))
        never_twice(view, message)
    assert outcomes[0] == (1, 202, "other"), outcomes  # 420 ms left: the stop wins


@pytest.mark.parametrize("kind", TRANSPORTS)
def test_the_stop_route_cancels_the_turn(tab: Tab, kind: str) -> None:
    chat_id = tab.open(kind)
    tab.call("send", chat_id, SLOW)
    tab.call("streamed", chat_id, 20)
    stopped = tab.page.evaluate(
        """async ([id, key]) => {
            const r = await fetch(`/ai-sdk/chat/${id}/stop`,
                {method: "POST", headers: {
                    Authorization: `Bearer ${key}`, "Content-Type": "application/json"}});
            return {status: r.status, body: await r.json()};
        }""",
        [chat_id, KEY],
    )
    assert stopped["status"] == 202 and stopped["body"]["session_id"] == chat_id, stopped
    view = tab.call("settled", chat_id, 1)
    assert view["status"] == "ready" and view["error"] is None, view
    message = assistant(view)
    [text] = texts(message)
    assert WORDS.startswith(text) and len(text) < len(WORDS)
    assert message["metadata"]["gateway"]["turnId"] == stopped["body"]["turn_id"]
    assert view["finishes"][0]["finishReason"] == "other"
    cancelled(tab, chat_id)
    # The chat takes the next turn.
    tab.call("send", chat_id, "again")
    view = tab.call("settled", chat_id, 2)
    assert texts(view["messages"][-1]) == ["You said: again"]


def test_the_websocket_abort_cancels_the_turn(tab: Tab) -> None:
    """``useChat``'s ``stop()`` over the WebSocket sends ``abort``: a stop, not a disconnect."""
    chat_id = tab.open("ws")
    tab.call("send", chat_id, SLOW)
    tab.call("streamed", chat_id, 20)
    tab.call("stop", chat_id)
    view = tab.call("settled", chat_id, 1)
    assert view["status"] == "ready", view
    assert view["finishes"][0]["isAbort"] is True
    cancelled(tab, chat_id)


def test_a_dropped_fetch_does_not_cancel(tab: Tab) -> None:
    """Over HTTP ``stop()`` only drops the fetch: the turn goes on, and a resume gets it whole."""
    chat_id = tab.open("http")
    tab.call("send", chat_id, SLOW)
    tab.call("streamed", chat_id, 20)
    tab.call("stop", chat_id)
    assert tab.call("view", chat_id)["finishes"][0]["isAbort"] is True
    tab.call("resume", chat_id)
    view = tab.call("settled", chat_id, 2)
    message = assistant(view)
    assert texts(message) == [WORDS]
    assert view["finishes"][1]["finishReason"] == "stop"


def test_a_closed_websocket_does_not_cancel(tab: Tab) -> None:
    """The socket gone mid-turn: ``useChat`` sees a disconnect, the turn goes on, and a
    resume on a new socket gets the whole message."""
    chat_id = tab.open("ws")
    tab.call("send", chat_id, SLOW)
    tab.call("streamed", chat_id, 20)
    tab.call("drop", chat_id)
    view = tab.call("settled", chat_id, 1)
    assert view["status"] == "error" and view["finishes"][0]["isError"] is True, view
    tab.call("resume", chat_id)
    view = tab.call("settled", chat_id, 2)
    assert view["status"] == "ready" and view["error"] is None, view
    message = assistant(view)
    assert texts(message) == [WORDS]
    assert view["finishes"][1]["finishReason"] == "stop"
    never_twice(view, message)


def test_the_websocket_needs_the_key(tab: Tab) -> None:
    tab.call("open", "browser-nokey", "ws", "wrong-key", False)
    tab.call("send", "browser-nokey", "Hello")
    assert tab.call("sent", "browser-nokey") == "resolved"
    view = tab.call("view", "browser-nokey")
    assert view["status"] == "error" and view["error"], view
    assert gateway(tab.daemon, "GET", "/sessions/browser-nokey").status_code == 404


def cancelled(tab: Tab, chat_id: str) -> None:
    """The gateway's own record: the turn's assistant message ended ``cancelled``."""
    got = gateway(tab.daemon, "GET", f"/sessions/{chat_id}/messages")
    assert got.status_code == 200, got.text
    statuses = [(m["role"], m["status"]) for m in got.json()["messages"]]
    assert statuses == [("user", "complete"), ("assistant", "cancelled")], statuses

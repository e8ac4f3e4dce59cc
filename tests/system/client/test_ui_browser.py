"""The web page (docs/clients.md) in a real browser, against a real gateway.

Debian's chromium, driven by Playwright (pointed at ``/usr/bin/chromium``; no
browser download), loads the page from a ``gateway serve`` process on the
scripted model, with an API key configured and ``read_file`` behind approval.
The page is driven only through the ``data-testid`` elements the issue lists
(``prompt``, ``send``, ``cancel``, ``new-session``, ``view-toggle``,
``status``, ``message`` with ``data-role`` and ``data-status``) and the keys a
person presses; what it shows is read from the DOM, and what it sent is read
from the browser's own record of its requests and WebSocket frames.

- The files: ``/`` and ``/ui/*`` with their types and caching, public where the
  API is not, and nothing outside the page's own files, however the name is
  spelled (``..``, encoded, ``\\``, NUL).
- The key: asked for on the first 401, a refused one asked again, then kept for
  the tab (a reload does not ask again), and never put in a URL.
- A turn with thinking, text and a tool, watched live and at the end in both
  views (section 10): the full view shows every block and the tool's result;
  the simple view shows one status line while the turn runs (the tool), and
  keeps only the last round's text at the end.
- A cancel with Esc while the reply streams (the message ends ``cancelled``,
  its text kept), and with the button while a tool runs.
- A socket cut mid-reply: "reconnecting", a fresh attach token, a subscribe
  with ``since``, and the same rendered text as a page that was never cut; then
  a longer cut, whose replay the gateway refuses (``replay_too_large``), healed
  by a snapshot on the same connection, again to the same text.
- An approval answered from the page (approve in the full view, deny in the
  simple one).
- A busy session (docs/protocol.md §2): while a turn runs, Send is Queue and
  Steer stands beside it; queued messages wait at the end of the thread, one
  of them cancelled from there; a steer stands in the running turn, and the
  queued one runs after it.
- Files: Attach uploads a PNG and a PDF, Send puts them in the turn by file_id,
  and the image is shown from the file route (a blob URL, its natural size).
- Worker sessions on request (``include_worker_sessions``): a ``delegate``
  call's worker, inside the call; the pongs the page owes the gateway's pings
  (it is never closed for missing one); the backoff's jitter and cap.

Screenshots of each state are saved under the test's ``tmp_path``. Everything
the page loads comes from the gateway (no CDN); an uncaught error in the page
fails the test.
"""

from __future__ import annotations

import json
import re
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.tenancy import key_id
from tests.paths import TESTS
from tests.ui_support import Daemon, launched_chromium, playwright_sync_api, serving

# slow: chromium
pytestmark = pytest.mark.slow

KEY = "ui-test-key"
REPLAY_MAX = 40
PING_S = 0.4  # an idle stream is pinged this often, and closed after two unanswered pings
CONFIG = f"""
[auth]
api_keys = ["{KEY}"]

[tools]
enabled = ["sleep", "read_file", "delegate"]
require_approval = ["read_file"]

[stream]
snapshot_max_bytes = 65536
replay_max_events = {REPLAY_MAX}
ping_interval_s = {PING_S}
ping_max_missed = 2
"""
# Fast reconnects for the test (the page's defaults are 0.5 s doubling to 30 s).
OPTIONS = {"backoffBaseMs": 100, "backoffCapMs": 400}
WAIT_MS = 15_000

TOOL_TURN = {
    "script": {
        "delay_ms": 20,
        "rounds": [
            [
                {"thinking": "Let me check how long this takes."},
                {"text": "Running it now."},
                {"tool_use": {"name": "sleep", "input": {"seconds": 1.5}}},
            ],
            [{"text": "All done: the tool slept as asked."}],
        ],
    }
}


def script(rounds: list[Any], delay_ms: int = 0) -> str:
    return json.dumps({"script": {"delay_ms": delay_ms, "rounds": rounds}})


# --- fixtures ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    with serving(tmp_path_factory.mktemp("ui-gateway"), CONFIG) as gateway:
        yield gateway


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with launched_chromium(expect_timeout_ms=WAIT_MS) as launched:
        yield launched


class Page:
    """One tab of the page, with what the test reads from it."""

    def __init__(self, browser: Any, daemon: Daemon, shots: Path, *, key: bool = True) -> None:
        self.api = playwright_sync_api()
        self.daemon = daemon
        self.shots = shots
        self.context = browser.new_context(viewport={"width": 1200, "height": 820})
        init = f"window.gatewayOptions = {json.dumps(OPTIONS)};"
        if key:
            init += f"sessionStorage.setItem('gateway.apiKey', {json.dumps(KEY)});"
        self.context.add_init_script(init)
        self.page = self.context.new_page()
        self.errors: list[str] = []
        self.requests: list[str] = []
        self.sockets: list[dict[str, Any]] = []  # each: url, sent frames, the socket
        self.page.on("pageerror", lambda exc: self.errors.append(str(exc)))
        self.page.on("request", lambda request: self.requests.append(request.url))
        self.page.on("websocket", self._socket)

    def _socket(self, ws: Any) -> None:
        record: dict[str, Any] = {"url": ws.url, "sent": [], "ws": ws}
        self.sockets.append(record)
        self.requests.append(ws.url)
        ws.on("framesent", lambda payload: record["sent"].append(json.loads(payload)))

    def by(self, testid: str) -> Any:
        return self.page.get_by_test_id(testid)

    def open(self, session_id: str | None = None) -> None:
        self.page.goto(self.daemon.base + "/" + (f"#{session_id}" if session_id else ""))
        if session_id:
            self.live()

    def listed(self, session_id: str) -> Any:
        """The session's entry in the sessions list."""
        return self.page.locator(f'[data-testid="session-item"][data-session-id="{session_id}"]')

    def live(self) -> None:
        self.api.expect(self.by("status")).to_have_attribute("data-state", "live")

    def new_session(self) -> str:
        self.by("new-session").click()
        self.live()
        session_id = self.page.evaluate("location.hash.slice(1)")
        assert re.fullmatch(r"sess_[0-9a-f]+", session_id), session_id
        return str(session_id)

    def send(self, text: str) -> None:
        self.by("prompt").fill(text)
        self.by("prompt").press("Enter")
        self.api.expect(self.by("prompt")).to_have_value("")

    def messages(self, role: str | None = None, status: str | None = None) -> Any:
        selector = '[data-testid="message"]'
        if role:
            selector += f'[data-role="{role}"]'
        if status:
            selector += f'[data-status="{status}"]'
        return self.page.locator(selector)

    def turn_over(self) -> None:
        """Wait until no turn is in flight (the cancel button is off) and nothing streams."""
        self.api.expect(self.by("cancel")).to_be_disabled()
        self.api.expect(self.messages(status="in_progress")).to_have_count(0)

    def view(self, view: str) -> None:
        toggle = self.by("view-toggle")
        if toggle.get_attribute("data-view") != view:
            toggle.click()
        self.api.expect(toggle).to_have_attribute("data-view", view)

    def thread_text(self) -> str:
        return str(self.by("thread").inner_text())

    def shot(self, name: str) -> Path:
        path = self.shots / f"{name}.png"
        self.page.screenshot(path=str(path))
        return path

    def close(self) -> None:
        self.context.close()
        assert not self.errors, self.errors
        outside = [u for u in self.requests if not _ours(u, self.daemon.port)]
        assert not outside, f"the page fetched from outside the gateway: {outside}"


def _ours(url: str, port: int) -> bool:
    # blob: URLs are the page's own (a file fetched from the gateway, shown from memory).
    ours = (
        f"http://127.0.0.1:{port}/",
        f"ws://127.0.0.1:{port}/",
        f"blob:http://127.0.0.1:{port}/",
    )
    return url.startswith(ours)


@pytest.fixture
def tab(browser: Any, daemon: Daemon, tmp_path: Path) -> Iterator[Page]:
    page = Page(browser, daemon, tmp_path)
    try:
        yield page
    finally:
        page.close()


# --- the files --------------------------------------------------------------------------


def test_the_page_and_its_files_are_served_and_nothing_else(daemon: Daemon) -> None:
    with httpx.Client(base_url=daemon.base) as http:
        page = http.get("/")  # no key: the page is public, the API is not
        assert page.status_code == 200
        assert page.headers["content-type"] == "text/html; charset=utf-8"
        assert "default-src 'none'" in page.headers["content-security-policy"]
        assert page.headers["x-content-type-options"] == "nosniff"
        assert page.headers["cache-control"] == "no-cache"
        for testid in ("prompt", "send", "cancel", "new-session", "view-toggle", "status"):
            assert f'data-testid="{testid}"' in page.text
        assert http.get("/sessions").status_code == 401

        types = {
            "app.js": "text/javascript",
            "reducer.js": "text/javascript",
            "style.css": "text/css",
            "index.html": "text/html",
            "icon.svg": "image/svg+xml",
        }
        for name, type_ in types.items():
            r = http.get(f"/ui/{name}")
            assert r.status_code == 200, name
            assert r.headers["content-type"].startswith(type_), name
            etag = r.headers["etag"]
            assert re.fullmatch(r'"[0-9a-f]{16}"', etag)
            again = http.get(f"/ui/{name}", headers={"If-None-Match": f'W/{etag}, "other"'})
            assert (again.status_code, again.content) == (304, b"")
            assert again.headers["etag"] == etag
            changed = http.get(f"/ui/{name}", headers={"If-None-Match": '"0000000000000000"'})
            assert changed.status_code == 200
            head = http.head(f"/ui/{name}")
            assert (head.status_code, head.content) == (200, b"")
            assert head.headers["content-length"] == str(len(r.content))

        assert http.post("/", content=b"{}").status_code == 405
        for path in (
            "/ui/",
            "/ui",
            "/ui/missing.js",
            "/ui/__init__.py",
            "/ui/../gateway.toml",
            "/ui/..%2fgateway.toml",
            "/ui/%2e%2e%2fgateway.toml",
            "/ui/%2e%2e/%2e%2e/gateway/ui/__init__.py",
            "/ui/..%5c__init__.py",
            "/ui/..\\__init__.py",
            "/ui/app.js%00.css",
            "/ui/app.js/",
            "/ui/./app.js",
            "/ui//app.js",
            "/ui/APP.JS",
            "/index.html",
            "/gateway.toml",
            "//etc/passwd",
        ):
            status, body = raw_get(daemon.port, path)  # as sent: httpx would normalise the path
            assert status == 404, path
            assert json.loads(body)["error"]["code"] == "not_found", path
            assert b"[auth]" not in body and KEY.encode() not in body, path


def raw_get(port: int, target: str) -> tuple[int, bytes]:
    """GET ``target`` byte for byte (no client-side normalisation); the status and body."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(
            f"GET {target} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode()
        )
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


# --- the key ----------------------------------------------------------------------------


def test_the_page_asks_for_the_key_and_keeps_it_for_the_tab(
    browser: Any, daemon: Daemon, tmp_path: Path
) -> None:
    tab = Page(browser, daemon, tmp_path, key=False)
    expect = tab.api.expect
    try:
        tab.open()
        expect(tab.by("key-dialog")).to_be_visible()
        tab.shot("key-dialog")
        tab.by("api-key").fill("not-the-key")
        tab.by("api-key").press("Enter")
        expect(tab.by("key-error")).to_contain_text("refused")
        tab.by("api-key").fill(KEY)
        tab.by("key-submit").click()
        expect(tab.by("key-dialog")).to_be_hidden()
        session_id = tab.new_session()
        expect(tab.listed(session_id)).to_be_visible()
        assert tab.page.evaluate("sessionStorage.getItem('gateway.apiKey')") == KEY
        tab.page.reload()
        tab.live()  # the same tab: no question this time
        expect(tab.by("key-dialog")).to_be_hidden()
        assert not any(KEY in url for url in tab.requests), "the key went into a URL"
    finally:
        tab.close()


# --- a turn in both views -------------------------------------------------------------------


def test_a_turn_with_thinking_text_and_a_tool_in_both_views(tab: Page) -> None:
    expect = tab.api.expect
    tab.open()
    tab.new_session()
    tab.view("full")
    tab.send(json.dumps(TOOL_TURN))
    expect(tab.messages("user")).to_have_count(1)

    # Live, full view: the tool runs (its call streamed and ended, no result yet).
    tool = tab.by("tool")
    expect(tool).to_have_attribute("data-tool-status", "running")
    expect(tab.by("thinking")).to_contain_text("Let me check how long this takes.")
    expect(tab.by("cancel")).to_be_enabled()
    tab.shot("full-tool-running")

    # Live, simple view: one status line (the running tool), the round's text, no blocks.
    tab.view("simple")
    expect(tab.by("activity-line")).to_contain_text("sleep")
    expect(tab.by("thinking")).to_have_count(0)
    expect(tab.by("tool")).to_have_count(0)
    expect(tab.messages("assistant").last).to_contain_text("Running it now.")
    tab.shot("simple-tool-running")

    tab.turn_over()
    # The end, simple view: only the last round's text is the reply; the line is gone.
    replies = tab.messages("assistant")
    expect(replies).to_have_count(1)
    expect(replies).to_have_attribute("data-status", "complete")
    expect(replies).to_have_text(re.compile(r"All done: the tool slept as asked\.\s*$"))
    expect(replies).not_to_contain_text("Running it now.")
    expect(tab.by("activity")).to_be_hidden()
    tab.shot("simple-done")

    # The end, full view: both rounds, every block, the tool paired with its result.
    tab.view("full")
    expect(tab.messages("assistant", "complete")).to_have_count(2)
    expect(tab.by("thinking")).to_contain_text("Let me check how long this takes.")
    expect(tab.by("tool")).to_have_attribute("data-tool-status", "completed")
    expect(tab.by("tool-result")).to_contain_text("slept")
    expect(tab.messages("assistant").first).to_contain_text("Running it now.")
    expect(tab.messages("assistant").last).to_contain_text("All done")
    tab.shot("full-done")


# --- snapshots that fit (docs/protocol.md §15) -------------------------------------------------


def test_a_long_session_opens_at_its_newest_messages_and_pages_the_rest(tab: Page) -> None:
    """A session grown past ``snapshot_max_bytes`` (64 KiB here): the page opens on the
    newest messages that fit, says earlier ones are not shown and loads them on request;
    a reply too big for a snapshot shows cut, and whole on request."""
    expect = tab.api.expect
    tab.open()
    tab.new_session()
    tab.view("full")
    lorem = {"script": {"chunk_chars": 8000, "rounds": [[{"lorem": 2000}]]}}
    for _ in range(12):
        tab.send(json.dumps(lorem))
        tab.turn_over()
    tab.page.reload()  # from a snapshot
    tab.live()
    expect(tab.by("earlier")).to_be_visible()
    shown = tab.messages().count()
    assert 2 <= shown < 24, shown
    tab.shot("earlier-not-shown")
    tab.by("load-earlier").click()  # a page of 50: all of them
    expect(tab.by("earlier")).to_have_count(0)
    expect(tab.messages()).to_have_count(24)
    # One reply larger than the cap: cut, then whole.
    tab.send(json.dumps({"script": {"chunk_chars": 50_000, "rounds": [[{"lorem": 20_000}]]}}))
    tab.turn_over()
    tab.page.reload()
    tab.live()
    reply = tab.messages("assistant").last
    expect(reply.get_by_test_id("truncated")).to_be_visible()
    cut = len(reply.inner_text())
    reply.get_by_test_id("truncated").get_by_role("button").click()
    expect(reply.get_by_test_id("truncated")).to_have_count(0)
    assert len(tab.messages("assistant").last.inner_text()) > max(cut, 100_000)


# --- cancel -------------------------------------------------------------------------------


def test_cancel_with_escape_mid_reply_and_with_the_button_mid_tool(tab: Page) -> None:
    expect = tab.api.expect
    tab.open()
    tab.new_session()
    tab.view("full")

    tab.send(script([[{"lorem": 400}]], delay_ms=20))
    streaming = tab.messages("assistant", "in_progress")
    expect(streaming).to_contain_text(re.compile(r"\w+ \w+ \w+"))
    tab.page.keyboard.press("Escape")
    cancelled = tab.messages("assistant", "cancelled")
    expect(cancelled).to_have_count(1)
    tab.turn_over()
    kept = cancelled.inner_text()
    assert len(kept.split()) >= 3, kept
    tab.view("simple")
    expect(tab.messages("assistant", "cancelled")).to_have_count(1)  # the text so far, marked
    tab.shot("cancelled-simple")

    tab.view("full")
    tab.send(script([[{"tool_use": {"name": "sleep", "input": {"seconds": 30}}}], [{"text": "x"}]]))
    expect(tab.by("tool")).to_have_attribute("data-tool-status", "running")
    tab.by("cancel").click()
    expect(tab.by("tool").last).to_have_attribute("data-tool-status", "failed")
    expect(tab.by("tool").last).to_contain_text("cancelled")
    tab.turn_over()
    tab.by("prompt").fill("and again")
    expect(tab.by("send")).to_be_enabled()  # the session takes the next turn
    tab.shot("cancelled-tool")


# --- a dropped socket ---------------------------------------------------------------------------


def test_a_socket_cut_mid_reply_ends_in_the_same_text(
    browser: Any, daemon: Daemon, tmp_path: Path
) -> None:
    steady = Page(browser, daemon, tmp_path)
    cut = Page(browser, daemon, tmp_path)
    expect = steady.api.expect
    try:
        steady.open()
        session_id = steady.new_session()
        cut.open(session_id)

        # A short cut: a fresh token, `since`, the replay.
        steady.send(script([[{"thinking": "Plan."}, {"lorem": 120}]], delay_ms=40))
        expect(cut.messages("assistant", "in_progress")).to_contain_text(re.compile(r"\w+ \w+"))
        cut.page.evaluate("gateway.stream.drop()")
        expect(cut.by("status")).to_have_attribute("data-state", "reconnecting")
        cut.shot("reconnecting")
        cut.live()
        steady.turn_over()
        cut.turn_over()
        assert len(cut.sockets) == 2
        first, second = cut.sockets
        assert first["url"] != second["url"]  # a fresh attach token
        resumed = second["sent"][0]
        assert resumed["type"] == "subscribe" and resumed["snapshot"] is False
        assert re.fullmatch(r"evt_\d+", resumed["since"]), resumed
        for view in ("full", "simple"):
            steady.view(view)
            cut.view(view)
            assert cut.thread_text() == steady.thread_text(), view

        # A long cut: more catalog events missed than the gateway replays (two per tool
        # call; streamed deltas are not replayed), so a snapshot instead.
        cut.context.set_offline(True)
        cut.page.evaluate("gateway.stream.drop()")
        expect(cut.by("status")).to_have_attribute("data-state", "reconnecting")
        naps = [{"tool_use": {"name": "sleep", "input": {"seconds": 0}}}] * (REPLAY_MAX // 2)
        steady.send(script([naps, [{"text": "Twenty naps taken."}]]))
        steady.turn_over()
        cut.context.set_offline(False)
        cut.turn_over()
        cut.live()
        expect(cut.messages()).to_have_count(steady.messages().count())
        refused, healed = cut.sockets[-1]["sent"][:2]
        assert refused["snapshot"] is False and refused["since"] is not None
        assert healed["snapshot"] is True and healed["since"] is None
        for view in ("full", "simple"):
            steady.view(view)
            cut.view(view)
            assert cut.thread_text() == steady.thread_text(), view
    finally:
        steady.close()
        cut.close()


# --- no WebSocket: server-sent events -----------------------------------------------------------

# A network that refuses the upgrade, as the page sees it: the socket closes unopened.
NO_WEBSOCKET = """
window.WebSocket = class {
  static OPEN = 1;
  constructor() {
    this.readyState = 3;
    setTimeout(() => this.onclose && this.onclose({ code: 1006, reason: "" }), 0);
  }
  send() {}
  close() {}
};
"""


def test_without_websockets_the_page_streams_over_server_sent_events(
    browser: Any, daemon: Daemon, tmp_path: Path
) -> None:
    """docs/doors/sse.md: the same frames from an EventSource, and a resume with ``since``."""
    steady = Page(browser, daemon, tmp_path)
    blocked = Page(browser, daemon, tmp_path)
    blocked.context.add_init_script(NO_WEBSOCKET)
    expect = steady.api.expect
    try:
        steady.open()
        session_id = steady.new_session()
        blocked.open(session_id)
        events = [u for u in blocked.requests if f"/sessions/{session_id}/events?" in u]
        assert len(events) == 1 and "snapshot=true" in events[0]
        steady.send(script([[{"thinking": "Plan."}, {"lorem": 120}]], delay_ms=40))
        expect(blocked.messages("assistant", "in_progress")).to_contain_text(re.compile(r"\w+ \w+"))
        blocked.page.evaluate("gateway.stream.drop()")
        blocked.live()
        steady.turn_over()
        blocked.turn_over()
        events = [u for u in blocked.requests if f"/sessions/{session_id}/events?" in u]
        assert len(events) == 2 and events[0] != events[1]  # a fresh attach token
        assert "snapshot=false" in events[1] and re.search(r"since=evt_\d+", events[1])
        for view in ("full", "simple"):
            steady.view(view)
            blocked.view(view)
            assert blocked.thread_text() == steady.thread_text(), view
    finally:
        steady.close()
        blocked.close()


# --- approval -----------------------------------------------------------------------------------


def test_an_approval_is_answered_from_the_page(tab: Page, daemon: Daemon) -> None:
    expect = tab.api.expect
    tab.open()
    session_id = tab.new_session()
    # The notes are in the session's own workspace (docs/protocol.md §15), made with it,
    # in the directory of the page's key.
    notes = daemon.workdir / "workspaces" / key_id(KEY) / ".own" / session_id / "notes.txt"
    notes.write_text("Remember: the demo is on Thursday.\n")
    tab.view("full")
    read = {"tool_use": {"name": "read_file", "input": {"path": "notes.txt"}}}
    thinking = {"thinking": "The notes are in the workspace; reading them needs approval."}
    first = [thinking, {"text": "Let me read your notes."}, read]
    tab.send(script([first, [{"text": "Thursday it is."}]]))
    permission = tab.by("tool").get_by_test_id("permission")
    expect(permission).to_contain_text("read_file")
    expect(tab.by("tool")).to_have_attribute("data-tool-status", "awaiting_approval")
    listed = tab.listed(session_id)
    expect(listed).to_contain_text("1 turn")  # the list follows the session's turns
    tab.shot("approval-asked")
    permission.get_by_test_id("approve").click()
    expect(tab.by("tool")).to_have_attribute("data-tool-status", "completed")
    expect(tab.by("tool-result")).to_contain_text("the demo is on Thursday")
    tab.turn_over()
    expect(tab.by("permission")).to_have_count(0)
    tab.shot("approval-done")

    tab.view("simple")
    tab.send(script([[read], [{"text": "Fine, I will not."}]]))
    asked = tab.by("activity").get_by_test_id("permission")
    expect(asked).to_contain_text("notes.txt")
    tab.shot("approval-simple")
    asked.get_by_test_id("deny").click()
    tab.turn_over()
    expect(tab.messages("assistant").last).to_contain_text("Fine, I will not.")
    tab.view("full")
    expect(tab.by("tool").last).to_have_attribute("data-tool-status", "failed")
    expect(tab.by("tool").last).to_contain_text("was denied")

    # An input holding a bidirectional override is shown with it escaped, never reordered.
    spoof = {"tool_use": {"name": "read_file", "input": {"path": "txt.\u202eexe.notes"}}}
    tab.send(script([[spoof], [{"text": "Not that one."}]]))
    asked = tab.by("tool").last.get_by_test_id("permission")
    expect(asked).to_contain_text('"txt.\\u202eexe.notes"')
    assert "\u202e" not in asked.inner_text()
    expect(tab.by("tool").last.locator("pre.input")).to_contain_text("\\u202e")
    asked.get_by_test_id("deny").click()
    tab.turn_over()


# --- a busy session --------------------------------------------------------------------------


def test_a_message_sent_while_a_turn_runs_is_queued_or_steers_it(tab: Page) -> None:
    expect = tab.api.expect
    tab.open()
    tab.new_session()
    tab.view("full")
    expect(tab.by("send")).to_have_attribute("data-mode", "send")
    expect(tab.by("steer")).to_be_hidden()
    nap = {"tool_use": {"name": "sleep", "input": {"seconds": 3}}}
    tab.send(script([[{"text": "Working on it."}, nap]]))
    expect(tab.by("tool")).to_have_attribute("data-tool-status", "running")
    expect(tab.by("send")).to_have_text("Queue")
    expect(tab.by("steer")).to_be_visible()

    tab.send("the next one")  # Enter, while the turn runs: queued
    tab.send("one too many")
    queued = tab.by("queued")
    expect(queued).to_have_count(2)
    expect(queued.first).to_contain_text("the next one")
    expect(queued.first).to_have_attribute("data-position", "1")
    expect(tab.messages("user")).to_have_count(1)  # not in the conversation yet
    tab.shot("queued")
    queued.last.get_by_test_id("cancel-queued").click()
    expect(queued).to_have_count(1)

    tab.by("prompt").fill("also this")
    tab.by("steer").click()
    expect(tab.by("prompt")).to_have_value("")
    steered = tab.page.locator('[data-testid="message"][data-steered="true"]')
    expect(steered).to_have_count(1)  # taken once the tool round ended
    expect(steered).to_contain_text("also this")
    expect(tab.messages("assistant").last).to_contain_text("You said: the next one")
    expect(queued).to_have_count(0)
    tab.turn_over()
    tab.shot("steered-then-queued")
    # the conversation, in order: the turn, the steer in it and its answer, the queued turn
    texts = tab.messages().all_inner_texts()
    roles = tab.page.eval_on_selector_all(
        '[data-testid="message"]', "nodes => nodes.map(n => n.dataset.role)"
    )
    said = ["script", "Working on it.", "also this", "You said: also this", "the next one"]
    said.append("You said: the next one")
    assert roles == ["user", "assistant", "user", "assistant", "user", "assistant"], roles
    assert all(text in shown for text, shown in zip(said, texts, strict=True)), texts
    assert not any("one too many" in t for t in texts)
    tab.view("simple")
    replies = tab.messages("assistant")
    expect(replies).to_have_count(2)  # the steered turn's reply stands below the steer
    expect(replies.first).to_contain_text("You said: also this")
    expect(tab.page.locator('[data-testid="message"][data-steered="true"]')).to_have_count(1)
    expect(tab.by("send")).to_have_attribute("data-mode", "send")


# --- worker sessions -----------------------------------------------------------------------------


def test_worker_sessions_are_shown_on_request(tab: Page) -> None:
    expect = tab.api.expect
    tab.open()
    tab.new_session()
    tab.view("full")
    delegate = {"tool_use": {"name": "delegate", "input": {"task": "summarise the notes"}}}
    turn = script([[delegate], [{"text": "The worker is done."}]])

    tab.send(turn)  # workers off (the default): the delegate call and its result only
    tab.turn_over()
    expect(tab.by("tool")).to_have_attribute("data-tool-status", "completed")
    expect(tab.by("worker")).to_have_count(0)
    assert tab.sockets[-1]["sent"][0]["filter"]["include_worker_sessions"] is False

    tab.by("workers-toggle").check()
    tab.live()
    assert tab.sockets[-1]["sent"][0]["filter"]["include_worker_sessions"] is True
    tab.send(turn)
    tab.turn_over()
    worker = tab.by("tool").last.get_by_test_id("worker")
    expect(worker.get_by_test_id("worker-message")).to_have_count(2)  # its user and assistant
    expect(worker).to_contain_text("You said: summarise the notes")
    expect(tab.messages("assistant").last).to_contain_text("The worker is done.")
    expect(tab.page.locator('li.worker [data-testid="session-item"]')).to_have_count(2)
    tab.shot("workers")


# --- heartbeat ---------------------------------------------------------------------------------


def test_the_page_answers_the_gateways_pings(tab: Page) -> None:
    tab.open()
    tab.new_session()
    ws = tab.sockets[-1]["ws"]
    for _ in range(3):  # three pings: one more than the gateway lets go unanswered
        payload = ws.wait_for_event(
            "framesent", predicate=lambda p: json.loads(p)["type"] == "pong", timeout=WAIT_MS
        )
        assert json.loads(payload)["nonce"]
    assert len(tab.sockets) == 1  # never closed for a missed pong, never reconnected
    tab.live()


def test_reconnects_back_off_with_jitter_up_to_a_cap(tab: Page) -> None:
    tab.open()
    delays = tab.page.evaluate(
        "[1, 2, 3, 10, 1000].map(n => [gateway.backoffDelay(n, 0), gateway.backoffDelay(n, 0.999)])"
    )
    base, cap = OPTIONS["backoffBaseMs"], OPTIONS["backoffCapMs"]
    ceilings = [base, 2 * base, 4 * base, cap, cap]
    for (low, high), ceiling in zip(delays, ceilings, strict=True):
        assert low == ceiling / 2  # never less than half the ceiling: no storm at once
        assert ceiling / 2 < high < ceiling  # the upper half is random


# --- compactions, elicitations and agents (docs/protocol.md §11, §12) ------------------------
# The gateway of this branch emits neither a compaction nor an elicitation, and has no
# GET /agents: the page's socket is served by the test (Playwright's route_web_socket) with
# the hand-written conformance traces, on a real session, and the HTTP calls those paths
# make are answered, and recorded, by the test (page.route).

TRACES = TESTS / "streaming-conformance" / "traces"


class StubStream:
    """The page's WebSocket, answered with a trace's frames (its session id replaced)."""

    def __init__(self, tab: Page, trace: str, session_id: str) -> None:
        text = (TRACES / f"{trace}.jsonl").read_text().replace('"sess_1"', json.dumps(session_id))
        self.frames = [json.loads(line) for line in text.splitlines() if line.strip()]
        self.route: Any = None
        self.subscribed: list[dict[str, Any]] = []
        tab.page.route_web_socket(re.compile(r"^ws://"), self._connected)

    def _connected(self, route: Any) -> None:
        self.route = route

        def received(message: str | bytes) -> None:
            frame = json.loads(message)
            if frame.get("type") == "subscribe":
                self.subscribed.append(frame)

        route.on_message(received)

    def send(self, frames: list[dict[str, Any]]) -> None:
        for frame in frames:
            self.route.send(json.dumps(frame))


def answered(tab: Page) -> list[tuple[str, Any]]:
    """Record each permission answer the page posts, and accept it (202)."""
    posts: list[tuple[str, Any]] = []

    def accept(route: Any) -> None:
        posts.append((route.request.url, json.loads(route.request.post_data or "null")))
        route.fulfill(status=202, json={"status": "accepted"})

    tab.page.route(re.compile(r"/permissions/"), accept)
    return posts


def stub_session(tab: Page, trace: str) -> tuple[StubStream, str]:
    session_id = httpx.post(
        f"{tab.daemon.base}/sessions", json={}, headers={"Authorization": f"Bearer {KEY}"}
    ).json()["session_id"]
    stream = StubStream(tab, trace, session_id)
    tab.page.evaluate(f"location.hash = {json.dumps(session_id)}")
    for _ in range(100):
        if stream.subscribed:
            break
        tab.page.wait_for_timeout(50)
    assert stream.subscribed, "the page never subscribed"
    return stream, session_id


def test_a_compaction_is_one_quiet_line_and_no_history_is_lost(tab: Page) -> None:
    expect = tab.api.expect
    tab.open()
    tab.view("simple")
    stream, _ = stub_session(tab, "compaction_between_turns")
    # The reconnect of the trace: its ack, the snapshot with the context message, turn 2
    # up to its compaction's start.
    second = [n for n, f in enumerate(stream.frames) if f["type"] == "subscribe_ack"][1]
    compacting = next(
        n for n, f in enumerate(stream.frames)
        if n > second and f["type"] == "event" and f["event"]["type"] == "context.compacting"
    )  # fmt: skip
    stream.send(stream.frames[second : compacting + 1])
    expect(tab.by("activity-line")).to_have_text("Compacting the context…")
    expect(tab.by("compaction")).to_have_count(1)
    expect(tab.by("compaction")).to_contain_text("2 messages summarised")
    tab.shot("compacting")
    stream.send(stream.frames[compacting + 1 :])
    tab.turn_over()
    expect(tab.by("compaction")).to_have_count(2)
    expect(tab.by("activity")).to_be_hidden()
    expect(tab.messages("assistant")).to_have_count(2)  # one reply a turn, none a summary
    expect(tab.messages("assistant").first).to_have_text(re.compile("Hello there, gateway"))
    assert "greeted" not in tab.thread_text()
    tab.view("full")
    expect(tab.by("compaction")).to_have_count(2)
    # the replaced messages stay, before the compaction that replaced them
    order = tab.page.eval_on_selector_all(
        '[data-testid="thread"] > [data-key]', "nodes => nodes.map(n => n.dataset.role)"
    )
    assert order == ["user", "assistant", "context", "user", "context", "assistant"], order
    first = tab.by("compaction").first
    first.locator("summary").click()
    expect(first).to_contain_text("The user greeted the gateway")
    tab.shot("compacted")


def test_an_elicitation_is_a_form_that_answers_with_content(tab: Page) -> None:
    expect = tab.api.expect
    tab.open()
    tab.view("full")
    posts = answered(tab)
    stream, session_id = stub_session(tab, "elicitation_pending")
    stream.send(stream.frames[:2])  # the ack and the snapshot: an elicitation, a worker's approval
    form = tab.by("elicitation")
    expect(form).to_have_count(1)
    expect(form.get_by_test_id("elicitation-message")).to_have_text(
        "Which priority should the ticket have?"
    )
    # The worker's request is not a block of this thread: it is asked below it.
    worker = tab.by("activity").get_by_test_id("permission")
    expect(worker).to_contain_text("lpstat")
    tab.shot("elicitation")
    form.locator('select[data-field="priority"]').select_option(label="urgent")
    form.locator('input[data-field="notify"]').check()
    form.get_by_test_id("elicitation-submit").click()
    for _ in range(100):
        if posts:
            break
        tab.page.wait_for_timeout(50)
    assert posts[0][0].endswith(f"/sessions/{session_id}/permissions/perm_1")
    assert posts[0][1] == {"decision": "allow", "content": {"priority": "urgent", "notify": True}}
    # The server resolves it and asks the next question; a wrong answer is not sent.
    stream.send(stream.frames[2:4])
    form = tab.by("elicitation")
    expect(form.get_by_test_id("elicitation-message")).to_have_text("Who should be assigned?")
    form.get_by_test_id("elicitation-submit").click()
    expect(form.get_by_test_id("elicitation-error")).to_have_text("Assignee is required")
    form.locator('input[data-field="assignee"]').fill("Ada")
    form.locator('input[data-field="hours"]').fill("0")
    form.get_by_test_id("elicitation-submit").click()
    expect(form.get_by_test_id("elicitation-error")).to_have_text("hours: at least 1")
    form.locator('input[data-field="hours"]').fill("3")
    form.get_by_test_id("elicitation-submit").click()
    for _ in range(100):
        if len(posts) > 1:
            break
        tab.page.wait_for_timeout(50)
    assert posts[1][1] == {"decision": "allow", "content": {"assignee": "Ada", "hours": 3}}
    # The worker's approval is answered on the worker's session; Decline is a deny.
    tab.by("activity").get_by_test_id("deny").click()
    for _ in range(100):
        if len(posts) > 2:
            break
        tab.page.wait_for_timeout(50)
    assert posts[2] == (
        f"{tab.daemon.base}/sessions/sess_2/permissions/perm_2",
        {"decision": "deny"},
    )
    stream.send(stream.frames[4:])
    tab.turn_over()
    expect(tab.by("elicitation")).to_have_count(0)
    expect(tab.by("permission")).to_have_count(0)


AGENTS = {
    "agents": [
        {"name": "default", "runtime": "native", "model": "scripted:echo", "default": True,
         "tools": []},
        {"name": "helpdesk", "runtime": "native", "model": "scripted:echo", "default": False,
         "tools": []},
    ]
}  # fmt: skip


def created_with(tab: Page) -> list[Any]:
    """Record each POST /sessions body, and pass it on without ``agent`` (this gateway's
    CreateSession does not know it yet)."""
    bodies: list[Any] = []

    def record_create(route: Any) -> None:
        if route.request.method != "POST":
            route.continue_()
            return
        bodies.append(json.loads(route.request.post_data or "null"))
        route.continue_(post_data="{}")

    tab.page.route(re.compile(r"/sessions$"), record_create)
    return bodies


def test_the_agent_picker_names_the_agent_of_a_new_session(tab: Page) -> None:
    expect = tab.api.expect
    tab.page.route(re.compile(r"/agents$"), lambda route: route.fulfill(json=AGENTS))
    bodies = created_with(tab)
    tab.open()
    picker = tab.by("agent-picker")
    expect(picker).to_be_visible()
    expect(picker).to_have_value("default")
    expect(picker.locator("option")).to_have_count(2)
    picker.select_option("helpdesk")
    tab.new_session()
    assert bodies == [{"agent": "helpdesk"}]


def test_without_an_agents_route_the_picker_is_hidden(tab: Page) -> None:
    expect = tab.api.expect
    bodies = created_with(tab)
    tab.page.route(
        re.compile(r"/agents$"),
        lambda route: route.fulfill(
            status=404, json={"error": {"code": "not_found", "message": "no route"}}
        ),
    )
    tab.open()
    expect(tab.by("new-session")).to_be_enabled()
    tab.page.wait_for_timeout(200)
    expect(tab.by("agent-picker")).to_be_hidden()
    tab.new_session()
    assert bodies == [{}]
    expect(tab.by("error")).to_be_hidden()


# --- edit and regenerate (docs/protocol.md §2) -------------------------------------------------


def test_edit_and_retry_a_message_from_the_page(tab: Page, daemon: Daemon) -> None:
    """Edit puts a user message back in the composer and Send replaces it; Retry asks again
    for a new answer in place of the old; the thread shows the edited branch only, in both
    views, and the gateway's conversation is that branch (the old one kept, rewound)."""
    expect = tab.api.expect
    tab.open()
    session_id = tab.new_session()
    tab.view("full")
    for text in ("The first question", "The second question"):
        tab.send(text)
        tab.turn_over()
    expect(tab.messages("assistant")).to_have_count(2)
    first = tab.messages("user").first
    first.get_by_test_id("edit-message").click()
    expect(tab.by("prompt")).to_have_value("The first question")
    expect(tab.by("editing")).to_be_visible()
    tab.shot("editing")
    tab.send("The first question, edited")
    expect(tab.by("editing")).to_have_count(0)
    tab.turn_over()
    expect(tab.messages("user")).to_have_count(1)
    expect(tab.messages("user")).to_contain_text("The first question, edited")
    expect(tab.messages("assistant")).to_have_text(
        re.compile(r"You said: The first question, edited\s*$")
    )
    answered = tab.messages("assistant").get_attribute("data-message-id")
    tab.messages("user").get_by_test_id("retry-message").click()
    expect(tab.messages("assistant")).not_to_have_attribute("data-message-id", answered or "")
    tab.turn_over()
    expect(tab.messages("assistant")).to_have_count(1)
    tab.view("simple")
    expect(tab.messages()).to_have_count(2)
    expect(tab.messages("assistant")).to_contain_text("You said: The first question, edited")
    tab.shot("retried")
    headers = {"Authorization": f"Bearer {KEY}"}
    url = f"{daemon.base}/sessions/{session_id}/messages"
    conversation = httpx.get(url, headers=headers).json()["messages"]
    every = httpx.get(url + "?include_rewound=true", headers=headers).json()["messages"]
    assert [m["role"] for m in conversation] == ["user", "assistant"]
    assert len(every) == 8 and sum(bool(m.get("rewound")) for m in every) == 6


# --- files (docs/protocol.md §2 "Files") ---------------------------------------------------


NATURAL_SIZE = """(img) => img.complete ? [img.naturalWidth, img.naturalHeight] : [0, 0]"""


def test_an_attached_image_is_sent_and_shown_from_the_file_route(
    tab: Page, daemon: Daemon, tmp_path: Path
) -> None:
    """Attach uploads a PNG and a PDF (POST .../files with the key), Send puts them in the
    turn as image and document blocks by file_id, and the user message shows the image,
    fetched from the file route into a blob URL (natural size its own), and the PDF as a
    label; in both views."""
    from tests.files_support import PDF, png

    expect = tab.api.expect
    tab.open()
    session_id = tab.new_session()
    tab.view("full")
    picture, paper = tmp_path / "red.png", tmp_path / "paper.pdf"
    picture.write_bytes(png(40, 30))
    paper.write_bytes(PDF)
    tab.by("attach-input").set_input_files([str(picture), str(paper)])
    attached = tab.page.locator('[data-testid="attachment"][data-file-id^="file_"]')
    expect(attached).to_have_count(2)
    tab.shot("attached")
    tab.send(script([[{"text": "A red picture and a paper."}]]))
    expect(tab.by("attachments")).to_be_hidden()
    tab.turn_over()

    user = tab.messages("user")
    image = user.get_by_test_id("image")
    expect(image).to_have_count(1)
    expect(image).to_have_attribute("src", re.compile(r"^blob:"))
    tab.page.wait_for_function(
        "() => { const i = document.querySelector('[data-role=user] [data-testid=image]');"
        " return i && i.complete && i.naturalWidth > 0; }"
    )
    assert image.evaluate(NATURAL_SIZE) == [40, 30]
    document = user.locator('[data-testid="file"][data-file-type="document"]')
    expect(document).to_contain_text("application/pdf")
    tab.shot("image-full")

    tab.view("simple")
    image = tab.messages("user").get_by_test_id("image")
    expect(image).to_have_attribute("src", re.compile(r"^blob:"))
    tab.page.wait_for_function(
        "() => { const i = document.querySelector('[data-role=user] [data-testid=image]');"
        " return i && i.complete && i.naturalWidth > 0; }"
    )
    assert image.evaluate(NATURAL_SIZE) == [40, 30]
    tab.shot("image-simple")

    headers = {"Authorization": f"Bearer {KEY}"}
    url = f"{daemon.base}/sessions/{session_id}/messages"
    first = httpx.get(url, headers=headers).json()["messages"][0]
    assert [b["type"] for b in first["content"]] == ["image", "document", "text"]
    ids = [b["file_id"] for b in first["content"][:2]]
    assert [b["size"] for b in first["content"][:2]] == [len(picture.read_bytes()), len(PDF)]
    fetched = [u for u in tab.requests if "/files/" in u]
    assert any(u.endswith(f"/sessions/{session_id}/files/{ids[0]}") for u in fetched), fetched


def test_a_running_tools_progress_is_shown_on_its_badge(tab: Page) -> None:
    """``tool.progress`` (docs/protocol.md §5): the running tool's badge says how far it is."""
    expect = tab.api.expect
    tab.open()
    tab.view("full")
    stream, _ = stub_session(tab, "tool_progress")
    first = next(
        n for n, f in enumerate(stream.frames)
        if f["type"] == "event" and f["event"]["type"] == "tool.progress"
    )  # fmt: skip
    stream.send(stream.frames[:first])
    badge = tab.by("tool").nth(1).get_by_test_id("tool-badge")
    expect(badge).to_have_text("running…")  # drawn: the progress must redraw it
    stream.send(stream.frames[first : first + 1])
    expect(badge).to_have_text("running… 50 %: half way")
    tab.shot("tool-progress")
    stream.send(stream.frames[first + 1 : first + 3])  # the other tool ends; 2 of 2
    expect(badge).to_have_text("running… 100 %")
    stream.send(stream.frames[first + 3 :])
    tab.turn_over()
    expect(badge).to_have_text("done")

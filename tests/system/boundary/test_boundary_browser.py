"""The cross-site attack in a real browser (docs/protocol.md §15), and a listed front end.

As reported: a page on another origin sent
``fetch(gateway + "/sessions", {method: "POST", mode: "no-cors", body})`` as
``text/plain``, which a browser sends without a CORS preflight, and the gateway
acted on it. Now a page served from a second origin (a tiny HTTP server on
another port of 127.0.0.1) tries that, and a normal CORS fetch too, and no
session gets created; a page of an origin listed in ``[auth] allowed_origins``
(the same tiny server, reached as ``localhost``) makes a JSON POST whose
answer it can read.

Debian's chromium driven by Playwright, as tests/system/client/test_ui_browser.py does it
(tests/ui_support.py: skipped, saying why, only where neither can be had);
the gateway is a real ``gateway serve`` in its own process.
"""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.ui_support import launched_chromium, serving

# slow: chromium
pytestmark = pytest.mark.slow

PAGE = b"<!doctype html><meta charset=utf-8><title>another site</title><p>hello</p>"

ATTACK = """async (gateway) => {
  const run = {threadId: "t1", runId: "r1", messages: [{id: "m", role: "user", content: "hi"}]};
  const sent = [];
  for (const [path, body] of [["/sessions", "{}"], ["/agui", JSON.stringify(run)]]) {
    for (const headers of [{"content-type": "text/plain"}, {}]) {
      // mode no-cors: the browser sends it without asking; the answer is opaque.
      const r = await fetch(gateway + path, {method: "POST", mode: "no-cors", headers, body});
      sent.push(r.type);
    }
  }
  let cors;
  try {
    const r = await fetch(gateway + "/sessions", {
      method: "POST", headers: {"content-type": "application/json"}, body: "{}"});
    cors = r.status;
  } catch (error) {
    cors = "refused: " + error.name;  // the preflight was answered 403
  }
  return {sent, cors};
}"""

LISTED = """async (gateway) => {
  const r = await fetch(gateway + "/sessions", {
    method: "POST", headers: {"content-type": "application/json"}, body: "{}"});
  const created = await r.json();  // readable: the answer carries Access-Control-Allow-Origin
  const list = await fetch(gateway + "/sessions");
  return {status: r.status, id: created.session_id, listed: (await list.json()).sessions.length};
}"""


class _Page(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(PAGE)))
        self.end_headers()
        self.wfile.write(PAGE)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def other_site() -> Iterator[int]:
    """A page on another origin: a tiny HTTP server on another port of 127.0.0.1."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Page)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def sessions(base: str) -> list[Any]:
    r = httpx.get(f"{base}/sessions", timeout=10)
    assert r.status_code == 200, r.text
    listed: list[Any] = r.json()["sessions"]
    return listed


def test_another_origin_creates_nothing_and_a_listed_one_works(
    tmp_path: Path, other_site: int
) -> None:
    listed = f"http://localhost:{other_site}"
    config = f'[tools]\nenabled = ["shell"]\n[auth]\nallowed_origins = ["{listed}"]\n'
    with serving(tmp_path, config) as daemon, launched_chromium() as browser:
        page = browser.new_page()
        page.goto(f"http://127.0.0.1:{other_site}/")
        outcome = page.evaluate(ATTACK, daemon.base)
        assert outcome["sent"] == ["opaque"] * 4, outcome  # the browser did send them
        assert str(outcome["cors"]).startswith("refused"), outcome
        assert sessions(daemon.base) == []  # none of them was acted on

        page.goto(f"{listed}/")
        outcome = page.evaluate(LISTED, daemon.base)
        assert outcome["status"] == 201 and outcome["listed"] == 1, outcome
        assert [s["session"]["id"] for s in sessions(daemon.base)] == [outcome["id"]]
        # a listed origin's no-cors text/plain POST is still refused (415)
        page.evaluate(ATTACK, daemon.base)
        assert len(sessions(daemon.base)) == 2  # only its CORS POST went through

"""Fuzzing: no input, however malformed, deep or large, gets a 5xx or a crash (PROTOCOL 2, 3).

Two targets:

- the client-frame decoder (:func:`gateway.protocol.frames.decode_client_frame`)
  on arbitrary text, bytes and JSON of any shape and depth: it returns a frame
  or raises :class:`FrameRejected` with ``invalid_frame`` or
  ``unknown_frame_type``, never anything else;
- one real ``gateway serve`` process on 127.0.0.1 port 0, for the whole module,
  sent well-formed requests of any method, target, headers and body (JSON of
  any shape and depth, over Content-Length or chunked, on keep-alive
  connections), and raw bytes of any request line and headers. Every request
  gets an answer, never a 5xx; every well-formed one leaves the connection
  usable unless the answer said ``Connection: close``; the server answers
  ``/healthz`` after every example; and when it stops (SIGTERM, exit 0) its log
  holds no traceback, so no connection died of an exception.

The clients are independent of the gateway's code: h11 over blocking sockets.
The suite runs the short profile (a few seconds); ``GATEWAY_FUZZ=long`` runs
the long one.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import string
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import h11
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.errors import FrameRejected
from gateway.protocol.frames import Cancel, Ping, Pong, Subscribe, decode_client_frame

# slow: fuzzing
pytestmark = pytest.mark.slow

LONG = os.environ.get("GATEWAY_FUZZ") == "long"
PROFILE = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None)
DECODER = settings(PROFILE, max_examples=20_000 if LONG else 200)
HTTP = settings(PROFILE, max_examples=5_000 if LONG else 80)
"""The profiles: a few seconds in the suite, ``GATEWAY_FUZZ=long`` for minutes."""

TIMEOUT_S = 15.0  # any answer slower than this is a hang (read_timeout_s is 10)


# --- inputs -------------------------------------------------------------------------


def nested(depth: int, kind: str = "[") -> str:
    if kind == "[":
        return "[" * depth + "]" * depth
    return '{"a":' * depth + "1" + "}" * depth


JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False)
    | st.text(max_size=20)
    | st.sampled_from(["preset:full", "preset:chat", "turn_x", "msg_x", "allow", "deny"]),
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=10), children, max_size=5)
    ),
    max_leaves=30,
)
DEEP = st.builds(nested, st.integers(1, 50_000), st.sampled_from(["[", "{"]))
"""JSON text nested from 1 to 50,000 levels: past any recursion limit."""


def objects(keys: list[str]) -> st.SearchStrategy[str]:
    """JSON objects with some of ``keys`` (and maybe others), values of any shape or depth."""
    value = JSON.map(json.dumps) | DEEP
    fields = st.dictionaries(st.sampled_from([*keys, "x"]), value, max_size=len(keys) + 1)
    return fields.map(
        lambda d: "{" + ", ".join(f"{json.dumps(k)}: {v}" for k, v in d.items()) + "}"
    )


def typed(kind: str, obj: str) -> str:
    """``obj`` (JSON object text) with ``"type": kind`` first."""
    rest = obj[1:].strip()
    return f'{{"type": {json.dumps(kind)}' + ("}" if rest == "}" else ", " + rest)


FRAME_KEYS = ["type", "filter", "since", "snapshot", "nonce", "turn_id", "reason"]
FILTERS = objects(["event_types", "actors", "turn_ids", "preset"])
FRAMES = st.one_of(
    st.text(max_size=200),
    st.binary(max_size=200),
    JSON.map(json.dumps),
    DEEP,
    objects(FRAME_KEYS),
    st.builds(
        typed,
        st.sampled_from(["subscribe", "cancel", "ping", "pong", "hello", "", "PING"]),
        objects(FRAME_KEYS),
    ),
    st.builds(
        lambda filter_: typed("subscribe", f'{{"filter": {filter_}}}'),
        JSON.map(json.dumps) | DEEP | FILTERS | st.just('"preset:full"'),
    ),
)


# --- the decoder -----------------------------------------------------------------


@DECODER
@given(data=FRAMES)
def test_the_client_frame_decoder_answers_a_frame_or_a_clear_refusal(data: str | bytes) -> None:
    try:
        frame = decode_client_frame(data)
    except FrameRejected as exc:
        assert exc.code in ("invalid_frame", "unknown_frame_type"), exc.code
        assert exc.message
    else:
        assert isinstance(frame, (Subscribe, Cancel, Ping, Pong))


def test_the_decoder_fuzz_reaches_every_outcome() -> None:
    """The strategies above can produce each answer, so the fuzz tests all of them."""
    outcomes = set()
    for data in (
        '{"type": "ping", "nonce": "n"}',
        '{"type": "hello"}',
        "{nope",
        '{"type": "subscribe", "filter": ' + nested(30_000) + "}",
    ):
        try:
            outcomes.add(type(decode_client_frame(data)).__name__)
        except FrameRejected as exc:
            outcomes.add(exc.code + (" deep" if "deep" in exc.message else ""))
    assert outcomes == {"Ping", "unknown_frame_type", "invalid_frame", "invalid_frame deep"}


# --- the HTTP server: one real gateway for the module ----------------------------------------

READY = re.compile(rb"gateway listening on http://127\.0\.0\.1:(\d+)")


@dataclass
class Daemon:
    port: int
    session_id: str
    log: Path


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """``gateway serve --port 0`` in a temporary directory; stopped by SIGTERM at the end."""
    cwd = tmp_path_factory.mktemp("fuzz")
    out, log = cwd / "stdout", cwd / "stderr"
    with out.open("wb") as stdout, log.open("wb") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gateway", "serve", "--port", "0"],
            cwd=cwd,
            # the embedded defaults, whatever GATEWAY_* this shell has (GATEWAY_FUZZ included)
            env={k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")},
            stdout=stdout,
            stderr=stderr,
        )
    try:
        deadline = time.monotonic() + 20
        while not (match := READY.search(out.read_bytes())):
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "no readiness line"
            time.sleep(0.02)
        port = int(match.group(1))
        status, body = exchange(port, "POST", "/sessions", [JSON_TYPE], b"{}")
        assert status == 201, body
        yield Daemon(port, json.loads(body)["session_id"], log)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = log.read_text()
    assert "Traceback" not in text and " ERROR " not in text, text[-5000:]


class Peer:
    """One keep-alive client connection: h11 over a blocking socket."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT_S)
        self.h11 = h11.Connection(h11.CLIENT)

    def close(self) -> None:
        self.sock.close()

    @property
    def reusable(self) -> bool:
        return self.h11.our_state is h11.DONE and self.h11.their_state is h11.DONE

    def request(
        self,
        method: str,
        target: str,
        headers: list[tuple[str, str]],
        body: bytes,
        chunked: bool,
        host: str = "127.0.0.1",
    ) -> tuple[int, bytes] | None:
        """Send one request; its final status and body, or None if h11 would not send it.

        A connection closed without a complete answer fails the test.
        """
        if self.h11.our_state is h11.DONE:
            self.h11.start_next_cycle()
        framing = (
            ("transfer-encoding", "chunked") if chunked else ("content-length", str(len(body)))
        )
        try:
            data = self.h11.send(
                h11.Request(
                    method=method, target=target, headers=[("host", host), framing, *headers]
                )
            )
        except h11.LocalProtocolError:
            return None  # not a request HTTP lets a client send: nothing to ask
        assert data is not None
        if body:
            data += self.h11.send(h11.Data(data=body)) or b""
        data += self.h11.send(h11.EndOfMessage()) or b""
        self.sock.sendall(data)
        status, content = 0, b""
        while True:
            event = self.h11.next_event()
            if event is h11.NEED_DATA:
                self.h11.receive_data(self.sock.recv(65536))
            elif isinstance(event, h11.InformationalResponse):
                if event.status_code == 101:  # a WebSocket: not what this fuzz is about
                    return 101, b""
            elif isinstance(event, h11.Response):
                status = event.status_code
            elif isinstance(event, h11.Data):
                content += event.data
            elif isinstance(event, h11.EndOfMessage):
                return status, content
            else:
                pytest.fail(f"{method} {target}: no answer ({event!r})")


def exchange(
    port: int, method: str, target: str, headers: list[tuple[str, str]], body: bytes
) -> tuple[int, bytes]:
    peer = Peer(port)
    try:
        answer = peer.request(method, target, headers, body, chunked=False)
        assert answer is not None
        return answer
    finally:
        peer.close()


JSON_TYPE = ("content-type", "application/json")
"""What every POST must say (docs/protocol.md §15); drawn mostly, so routes are reached."""
HOSTS = st.sampled_from(
    ["127.0.0.1", "127.0.0.1", "127.0.0.1", "localhost:1", "[::1]", "evil.example",
     "127.0.0.1.evil.example", "", "a, b", "[::1"]
)  # fmt: skip
"""Mostly an answered Host (else every answer is a 421); now and then a rebinding one."""

TOKEN = st.text(string.ascii_letters + string.digits + "!#$%&'*+-.^_`|~", min_size=1, max_size=10)
METHODS = st.sampled_from(["GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"]) | TOKEN
URL_CHARS = string.ascii_letters + string.digits + "-._~%!$&'()*+,;=:@/?#[]"
SEGMENT = st.sampled_from(
    ["sessions", "{sid}", "sess_nope", "messages", "turns", "turn_x", "cancel", "permissions",
     "perm_x", "feedback", "stream", "healthz", "metrics", "", "..", "%00", "%2F", "%2e%2e",
     "..%2f..%2f", "agui", "ui", "app.js"]
) | st.text(URL_CHARS, max_size=12)  # fmt: skip
QUERY = st.dictionaries(
    st.sampled_from(["limit", "before", "attach", "since", "x"]) | st.text(URL_CHARS, max_size=5),
    st.sampled_from(["0", "1", "-1", "200", "201", "99999999999999999999", "msg_x", ""])
    | st.text(URL_CHARS, max_size=8),
    max_size=3,
)
TARGETS = st.builds(
    lambda segments, query: (
        "/"
        + "/".join(segments)
        + ("?" + "&".join(f"{k}={v}" for k, v in query.items()) if query else "")
    ),
    st.lists(SEGMENT, min_size=0, max_size=5),
    QUERY,
) | st.sampled_from(
    ["*", "http://x/healthz", "/healthz", "/sessions?limit=2", "/sessions?limit=1&limit=2",
     "/sessions/{sid}/stream?attach=a&attach=b", "/../../etc/passwd",
     "/ui/%2e%2e/%2e%2e/gateway.toml", "http://evil.example/sessions", "//etc/passwd"]
)  # fmt: skip
HEADER_VALUE = st.text(string.printable.strip(" \t\r\n\x0b\x0c") + " ", max_size=40).map(str.strip)
HEADER = st.tuples(
    st.sampled_from(
        ["content-type", "authorization", "upgrade", "connection", "sec-websocket-key",
         "sec-websocket-version", "origin", "expect", "accept", "x-thing"]
    ) | TOKEN,
    st.sampled_from(["application/json", "websocket", "Upgrade", "close", "keep-alive",
                     "13", "dGhlIHNhbXBsZSBub25jZQ==", "100-continue", "Bearer x",
                     "text/plain", "application/json; charset=utf-8", "https://evil.example",
                     "null", "http://127.0.0.1"])
    | HEADER_VALUE,
).filter(lambda h: h[0].lower() not in ("content-length", "transfer-encoding", "host"))  # fmt: skip
HEADERS = st.lists(HEADER, max_size=4)
SCHEMA_KEYS = ["content", "workspace_path", "model", "metadata", "decision", "message_id",
               "rating", "reason", "comment", "tool_use_id"]  # fmt: skip
BODIES = (
    st.one_of(
        st.just(""),
        st.text(max_size=300),
        JSON.map(json.dumps),
        DEEP,
        objects(SCHEMA_KEYS),
        st.builds(lambda deep: f'{{"metadata": {{"a": {deep}}}}}', DEEP),
    ).map(lambda text: text.encode("utf-8", "surrogatepass"))
    | st.binary(max_size=300)
    | st.builds(
        lambda key, bad: b'{"%s": "a%sb"}' % (key.encode(), bad),  # invalid UTF-8 in a string
        st.sampled_from([*SCHEMA_KEYS, "threadId"]),
        st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x80\x80", b"\xf8"]),
    )
)


@HTTP
@given(
    requests=st.lists(
        st.tuples(METHODS, TARGETS, HEADERS, BODIES, st.booleans(), HOSTS, st.booleans()),
        min_size=1,
        max_size=6,
    )
)
def test_well_formed_requests_are_always_answered_never_with_5xx(
    daemon: Daemon,
    requests: list[tuple[str, str, list[tuple[str, str]], bytes, bool, str, bool]],
) -> None:
    peer = Peer(daemon.port)
    try:
        for method, target, headers, body, chunked, host, json_type in requests:
            if not peer.reusable and peer.h11.our_state is not h11.IDLE:
                peer.close()
                peer = Peer(daemon.port)
            if json_type and not any(name.lower() == "content-type" for name, _ in headers):
                headers = [JSON_TYPE, *headers]
            answer = peer.request(
                method, target.replace("{sid}", daemon.session_id), headers, body, chunked, host
            )
            if answer is not None:
                status, content = answer
                assert status < 500, (method, target, headers, body[:200], status, content)
    finally:
        peer.close()
    assert exchange(daemon.port, "GET", "/healthz", [], b"") == (200, b'{"status":"ok"}')


def request_line(method: bytes, target: bytes, version: bytes) -> bytes:
    return b" ".join([method, target, version])


VERSIONS = st.sampled_from([b"HTTP/1.1", b"HTTP/1.0", b"HTTP/2", b"HTTP/1.1 ", b"http/1.1", b""])
REQUEST_LINES = st.one_of(
    st.builds(request_line, METHODS.map(str.encode), TARGETS.map(str.encode), st.just(b"HTTP/1.1")),
    st.builds(
        request_line,
        METHODS.map(str.encode) | st.binary(max_size=10),
        TARGETS.map(str.encode) | st.binary(max_size=30),
        VERSIONS | st.binary(max_size=10),
    ),
    st.binary(max_size=80),
).map(lambda line: line.replace(b"\r", b"").replace(b"\n", b""))
HEADER_LINES = st.lists(
    st.one_of(
        st.binary(max_size=60),
        HEADER.map(lambda h: f"{h[0]}: {h[1]}".encode()),
        st.integers(-1, 10**8).map(lambda n: b"Content-Length: %d" % n),
        st.sampled_from(
            [b"Transfer-Encoding: chunked", b"Transfer-Encoding: gzip, chunked",
             b"Content-Length: 1, 2", b"Content-Length: x", b"Expect: 100-continue",
             b"Connection: close", b"Host: 127.0.0.1", b"Host: 127.0.0.1", b"Host: evil.example",
             b"Upgrade: websocket", b"Content-Type: application/json", b"Content-Type: text/plain",
             b"Origin: https://evil.example", b"Origin: null"]
        ),
        st.integers(1, 40_000).map(lambda n: b"X-Big: " + b"a" * n),  # over max_header_bytes
    ),
    max_size=5,
).map(lambda lines: [line.replace(b"\r", b"").replace(b"\n", b"") for line in lines])  # fmt: skip
RAW_BODIES = st.binary(max_size=100) | st.sampled_from(
    [b"5\r\nhello\r\n0\r\n\r\n", b"ffffffffffff\r\n", b"0\r\n\r\n", b"{}", b"[" * 5000]
)


def read_answers(data: bytes) -> list[int]:
    """The status codes of the answers in ``data``, 1xx included, read one after another."""
    statuses = []
    while data:
        head, sep, data = data.partition(b"\r\n\r\n")
        assert sep, f"an answer cut short: {head[:200]!r}"
        status_line, *lines = head.split(b"\r\n")
        match = re.fullmatch(rb"HTTP/1\.1 (\d{3}) [^\r\n]*", status_line)
        assert match, status_line
        statuses.append(int(match.group(1)))
        length = 0
        for header in lines:
            name, _, value = header.partition(b": ")
            if name.lower() == b"content-length":
                length = int(value)
        data = data[length:]  # (a HEAD's answer declares a length it does not send)
        if statuses[-1] >= 200:
            break
    return statuses


@HTTP
@given(line=REQUEST_LINES, headers=HEADER_LINES, body=RAW_BODIES)
def test_raw_bytes_are_always_answered_never_with_5xx(
    daemon: Daemon, line: bytes, headers: list[bytes], body: bytes
) -> None:
    raw = b"\r\n".join([line, *headers]) + b"\r\n\r\n" + body
    with socket.create_connection(("127.0.0.1", daemon.port), timeout=TIMEOUT_S) as sock:
        sock.sendall(raw)
        sock.shutdown(socket.SHUT_WR)  # then the server has all there is: answer, or 400
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    if not raw.strip() and not received:
        return  # blank lines, no request: closing without an answer is allowed
    statuses = read_answers(received)
    assert statuses and statuses[-1] >= 200, (raw[:300], received[:300])
    assert all(status < 500 for status in statuses), (raw[:300], received[:300])
    assert exchange(daemon.port, "GET", "/healthz", [], b"") == (200, b'{"status":"ok"}')


def test_the_http_fuzz_reaches_the_answers_it_guards(daemon: Daemon) -> None:
    """Deep JSON, HEAD, a bad request line: each answered as the named tests say."""
    deep = ('{"metadata": {"a": ' + nested(50_000) + "}}").encode()
    assert exchange(daemon.port, "POST", "/sessions", [JSON_TYPE], deep)[0] == 400
    # the boundary's answers (docs/protocol.md §15): each shape the fuzz draws is refused
    bad_utf8 = b'{"model": "\xff"}'
    assert exchange(daemon.port, "POST", "/sessions", [JSON_TYPE], bad_utf8)[0] == 400
    assert (
        exchange(daemon.port, "POST", "/sessions", [("content-type", "text/plain")], b"")[0] == 415
    )
    origin = [JSON_TYPE, ("origin", "https://evil.example")]
    assert exchange(daemon.port, "POST", "/sessions", origin, b"{}")[0] == 403
    assert exchange(daemon.port, "GET", "/sessions?limit=1&limit=2", [], b"")[0] == 400
    peer = Peer(daemon.port)
    try:
        assert peer.request("GET", "/healthz", [], b"", False, host="evil.example")[0] == 421
    finally:
        peer.close()
    peer = Peer(daemon.port)
    try:
        assert peer.request("HEAD", "/healthz", [], b"", chunked=False) == (200, b"")
        assert peer.reusable
        assert peer.request("GET", "/healthz", [], b"", chunked=True) == (200, b'{"status":"ok"}')
    finally:
        peer.close()
    with socket.create_connection(("127.0.0.1", daemon.port), timeout=TIMEOUT_S) as sock:
        sock.sendall(b"\x16\x03\x01 nonsense\r\n\r\n")
        sock.shutdown(socket.SHUT_WR)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    assert read_answers(received) == [400]

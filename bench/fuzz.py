"""``python -m bench --profile fuzz``: hostile HTTP at a real daemon (docs/protocol.md §2, §15).

A real ``gateway serve --port 0`` in a temporary directory (the embedded
defaults, the ``shell`` tool on: what the cross-site attack reached), and
requests drawn, from a seeded generator, out of the shapes the boundary
refuses, mixed with the ordinary ones:

- content types (none, ``text/plain``, a form, ``application/json`` with and
  without a charset, two joined), origins (the gateway's own, another site,
  ``null``, another port, garbage), hosts (loopback in every spelling, a
  rebinding name, none at all, two joined, a broken IPv6 literal);
- paths (every route, ``../``, ``%2e%2e``, absolute-form, ``//``), repeated
  query parameters, a WebSocket handshake now and then;
- framing: ``Content-Length``, chunked, both at once, a ``Transfer-Encoding``
  other than chunked;
- bodies: empty, ``{}``, fields of every route, invalid UTF-8 inside a JSON
  string, raw bytes, JSON nested 10,000 deep.

Each request goes on a connection of its own and must get an answer, never a
5xx; every ``check_every`` requests ``GET /healthz`` must answer 200; at the
end the daemon stops on SIGTERM with exit 0 and a log without a traceback.
The run prints the statuses it saw and writes ``<out>/<stamp>-<profile>.json``;
it exits 0 when every check held, 1 otherwise. ``fuzz-smoke`` is the
seconds-long run the suite makes (tests/system/bench/test_bench_fuzz_smoke.py).
"""

from __future__ import annotations

import collections
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

READY = re.compile(rb"gateway listening on http://127\.0\.0\.1:(\d+)")
TIMEOUT_S = 15.0  # any answer slower than this is a hang (read_timeout_s is 10)
CONFIG = '[tools]\nenabled = ["sleep", "read_file", "shell"]\n'


@dataclass(frozen=True)
class FuzzProfile:
    """How many requests a fuzz run sends, and how often it checks the daemon is alive."""

    name: str
    requests: int
    check_every: int = 100
    seed: int = 1


FUZZ = FuzzProfile(name="fuzz", requests=20_000)
FUZZ_SMOKE = FuzzProfile(name="fuzz-smoke", requests=400, check_every=50)
FUZZ_PROFILES = {p.name: p for p in (FUZZ, FUZZ_SMOKE)}


@dataclass
class Outcome:
    """What a run saw: statuses by count, and every failure in words."""

    statuses: collections.Counter[int] = field(default_factory=collections.Counter)
    failures: list[str] = field(default_factory=list)
    sent: int = 0
    exit_code: int | None = None

    @property
    def ok(self) -> bool:
        return not self.failures and self.exit_code == 0


# --- the shapes -------------------------------------------------------------------


CONTENT_TYPES = [
    None, "text/plain", "text/plain;charset=UTF-8", "application/x-www-form-urlencoded",
    "multipart/form-data; boundary=x", "application/json", "application/json",
    "application/json; charset=utf-8", "APPLICATION/JSON", "application/json, text/plain",
]  # fmt: skip
ORIGINS = [
    None, None, None, "{own}", "https://evil.example", "null", "http://127.0.0.1:1",
    "http://localhost:{port}", "::::", "https://evil.example/path",
]  # fmt: skip
HOSTS = [
    "127.0.0.1:{port}", "127.0.0.1:{port}", "127.0.0.1:{port}", "localhost", "[::1]:{port}",
    "LOCALHOST.", "evil.example", "127.0.0.1.evil.example", "", None, "a, 127.0.0.1", "[::1",
]  # fmt: skip
PATHS = [
    "/sessions", "/sessions/{sid}", "/sessions/{sid}/messages", "/sessions/{sid}/turns",
    "/sessions/{sid}/turns/turn_x/cancel", "/sessions/{sid}/permissions/perm_x",
    "/sessions/{sid}/feedback", "/sessions/{sid}/stream", "/agui", "/agui/{sid}/cancel",
    "/healthz", "/readyz", "/metrics", "/openapi.json", "/", "/ui/app.js",
    "/../../etc/passwd", "/ui/%2e%2e/%2e%2e/gateway.toml", "/ui/..%2f..%2fgateway.toml",
    "http://evil.example/sessions", "//etc/passwd", "/sessions/%2e%2e/sessions", "*",
    "/sessions/sess_nope", "/nowhere",
]  # fmt: skip
QUERIES = [
    "", "", "", "?limit=5", "?limit=5&limit=6", "?attach=a&attach=b", "?before=x&before=y",
    "?limit=%ff", "?x=1", "?attach=atk_nope",
]  # fmt: skip
METHODS = ["GET", "GET", "POST", "POST", "POST", "HEAD", "OPTIONS", "PUT"]
FRAMINGS = ["length", "length", "length", "chunked", "both", "gzip", "chunked, gzip"]
BAD = [b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x80\x80", b"\xf8"]
KEYS = ["content", "model", "metadata", "decision", "message_id", "reason", "threadId"]


def _body(rng: random.Random) -> bytes:
    kind = rng.randrange(7)
    if kind == 0:
        return b""
    if kind == 1:
        return b"{}"
    if kind == 2:  # invalid UTF-8 inside a JSON string of a field some route reads
        return b'{"%s": "a%sb"}' % (rng.choice(KEYS).encode(), rng.choice(BAD))
    if kind == 3:
        return bytes(rng.randrange(256) for _ in range(rng.randrange(1, 60)))
    if kind == 4:
        return b"[" * 10_000 + b"]" * 10_000
    if kind == 5:
        return json.dumps({"content": "hello"}).encode()
    run = {"threadId": "t1", "runId": "r1", "messages": [{"id": "m", "role": "user",
           "content": "hi"}]}  # fmt: skip
    return json.dumps(run).encode()


ROUTES = PATHS[:16]
"""The paths of real routes (the rest of PATHS are traversal and nonsense)."""
DIMENSIONS = ["host", "origin", "content_type", "path", "query", "framing"]


def draw(rng: random.Random, port: int, session_id: str) -> bytes:
    """One request's bytes, as sent.

    A third of the requests are hostile in every dimension; the rest are
    ordinary but for one (or none), so the refusals do not hide the routes
    behind them: most requests still reach a handler.
    """
    everything = rng.random() < 1 / 3
    odd = set(DIMENSIONS) if everything else {rng.choice([*DIMENSIONS, "none"])}

    def pick(dimension: str, hostile: list[Any], ordinary: Any) -> Any:
        return rng.choice(hostile) if dimension in odd else ordinary

    method = rng.choice(METHODS)
    path = pick("path", PATHS, rng.choice(ROUTES)).replace("{sid}", session_id)
    path += pick("query", QUERIES, "")
    host = pick("host", HOSTS, "127.0.0.1:{port}")
    lines = [f"{method} {path} HTTP/1.1" if host is not None else f"{method} {path} HTTP/1.0"]
    if host is not None:
        lines.append("Host: " + host.replace("{port}", str(port)))
    content_type = pick("content_type", CONTENT_TYPES, "application/json")
    if content_type is not None:
        lines.append(f"Content-Type: {content_type}")
    origin = pick("origin", ORIGINS, None)
    if origin is not None:
        own = f"http://127.0.0.1:{port}"
        lines.append("Origin: " + origin.replace("{own}", own).replace("{port}", str(port)))
    if method == "OPTIONS" and rng.random() < 0.7:
        lines.append("Access-Control-Request-Method: POST")
    if rng.random() < 0.1:
        lines += [
            "Upgrade: websocket",
            "Connection: Upgrade",
            "Sec-WebSocket-Version: 13",
            "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==",
        ]
    else:
        lines.append("Connection: close")
    body = _body(rng) if method in ("POST", "PUT") or rng.random() < 0.1 else b""
    framing = pick("framing", FRAMINGS, "length")
    if framing in ("length", "both"):
        lines.append(f"Content-Length: {len(body)}")
    if framing != "length":
        lines.append(f"Transfer-Encoding: {'chunked' if framing == 'both' else framing}")
        body = (b"%x\r\n%s\r\n" % (len(body), body) if body else b"") + b"0\r\n\r\n"
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


# --- talking to the daemon ----------------------------------------------------------


def exchange(port: int, data: bytes) -> bytes:
    """Send ``data`` on a fresh connection, half-close, and read until the server closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT_S) as sock:
        try:
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # refused midway (a 413, a 400): its answer is still to be read
        received = b""
        try:
            while chunk := sock.recv(65536):
                received += chunk
        except ConnectionResetError:
            pass
    return received


def final_status(answer: bytes) -> int | None:
    """The status of the first final (not 1xx) answer in ``answer``, or None."""
    for match in re.finditer(rb"HTTP/1\.1 (\d{3}) ", answer):
        status = int(match.group(1))
        if status >= 200 or status == 101:
            return status
    return None


def healthy(port: int) -> bool:
    answer = exchange(
        port, b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    return final_status(answer) == 200


def run_fuzz(profile: FuzzProfile, workdir: Path) -> Outcome:
    """Start a daemon in ``workdir``, fuzz it as ``profile`` says, stop it; what happened."""
    outcome = Outcome()
    (workdir / "gateway.toml").write_text(CONFIG)
    out, log = workdir / "stdout", workdir / "stderr"
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    with out.open("wb") as stdout, log.open("wb") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gateway", "serve", "--config", "gateway.toml", "--port", "0"],
            cwd=workdir,
            env=env,
            stdout=stdout,
            stderr=stderr,
        )
    try:
        deadline = time.monotonic() + 30
        while not (ready := READY.search(out.read_bytes())):
            if proc.poll() is not None or time.monotonic() > deadline:
                outcome.failures.append(f"the daemon did not start: {log.read_text()[-2000:]}")
                return outcome
            time.sleep(0.02)
        port = int(ready.group(1))
        created = exchange(
            port,
            b"POST /sessions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: 2\r\nConnection: close\r\n\r\n{}",
        )
        session_id = json.loads(created.partition(b"\r\n\r\n")[2])["session_id"]
        rng = random.Random(profile.seed)
        for n in range(1, profile.requests + 1):
            data = draw(rng, port, session_id)
            try:
                status = final_status(exchange(port, data))
            except OSError as exc:
                outcome.failures.append(f"{data[:120]!r}: {exc!r}")
                continue
            outcome.sent += 1
            outcome.statuses[status or 0] += 1
            if status is None:
                outcome.failures.append(f"no answer to {data[:120]!r}")
            elif status >= 500:
                outcome.failures.append(f"{status} to {data[:200]!r}")
            if n % profile.check_every == 0 and not healthy(port):
                outcome.failures.append(f"/healthz did not answer 200 after {n} requests")
                break
        proc.send_signal(signal.SIGTERM)
        outcome.exit_code = proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = log.read_text(errors="replace")
    if "Traceback" in text or " ERROR " in text:
        outcome.failures.append(f"the daemon's log holds an error: {text[-3000:]}")
    return outcome


def main(profile: FuzzProfile, out: Path, command: str) -> int:
    """Run ``profile``, print what it saw, write the JSON; 0 when every check held."""
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gateway-fuzz-") as tmp:
        outcome = run_fuzz(profile, Path(tmp))
    elapsed = round(time.monotonic() - started, 1)
    result: dict[str, Any] = {
        "command": command,
        "profile": profile.name,
        "requests": outcome.sent,
        "statuses": {str(k): v for k, v in sorted(outcome.statuses.items())},
        "exit_code": outcome.exit_code,
        "failures": outcome.failures[:50],
        "ok": outcome.ok,
        "elapsed_s": elapsed,
    }
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{time.strftime('%Y%m%d-%H%M%S')}-{profile.name}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"# bench {profile.name}: {command}")
    print(f"{outcome.sent} requests in {elapsed} s; statuses: {result['statuses']}")
    print(f"daemon exit code {outcome.exit_code}")
    for failure in outcome.failures[:20]:
        print(f"FAIL {failure}")
    print(("PASS" if outcome.ok else "FAIL") + f"; wrote {path}")
    return 0 if outcome.ok else 1

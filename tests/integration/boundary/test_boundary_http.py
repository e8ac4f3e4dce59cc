"""The boundary over HTTP (docs/protocol.md §15), each attack as it was reported, now refused.

- A page on another origin POSTed ``text/plain`` (no CORS preflight) to
  ``/agui`` and ran a shell command: every POST now needs
  ``Content-Type: application/json`` (415), an empty one too.
- Any ``Origin`` was answered: one that is neither the gateway's own nor in
  ``[auth] allowed_origins`` is now 403 on every route and the handshake;
  a listed one gets CORS answers and its preflights.
- Any ``Host`` was answered (DNS rebinding: a page of ``evil.example``
  resolved to 127.0.0.1 is same-origin with it): a Host not allowed is 421.
- Bad input: invalid UTF-8 in a JSON string was a 500; Content-Length with
  Transfer-Encoding was read as chunked; a repeated query parameter silently
  took its first value; an attach token sent on another session's path was
  used up.

Real gateways on 127.0.0.1 port 0, spoken to byte for byte over raw sockets
(httpx would normalise what these tests need to send as is).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from gateway.config import load_config
from gateway.errors import Refused
from gateway.http.boundary import Boundary
from gateway.http.refusals import STATUS
from gateway.node import AttachTokens
from tests.conftest import Harness, make_config, running_gateway

EVIL = "https://evil.example"
LISTED = "https://app.example"
SHELL_SCRIPT = {
    "script": {"rounds": [[{"tool_use": {"name": "shell", "input": {"command": "touch PWNED"}}}]]}
}


@asynccontextmanager
async def gateway(tmp_path: Path, **overrides: Any) -> AsyncIterator[Harness]:
    with trio.fail_after(30):
        async with running_gateway(make_config(tmp_path, **overrides)) as harness:
            yield harness


def port_of(h: Harness) -> int:
    return int(h.base.rsplit(":", 1)[1])


class Answer:
    """One HTTP answer read off a raw socket; ``closed``: the server closed after it."""

    def __init__(self, head: bytes, body: bytes, closed: bool) -> None:
        status_line, *lines = head.decode("latin-1").split("\r\n")
        self.status = int(status_line.split()[1])
        self.headers: dict[str, str] = {}
        for line in lines:
            name, _, value = line.partition(":")
            self.headers[name.strip().lower()] = value.strip()
        self.body = body
        self.closed = closed

    @property
    def code(self) -> str:
        return str(json.loads(self.body)["error"]["code"])


async def send(port: int, data: bytes, *, check_close: bool = False) -> Answer:
    """Send ``data`` as is on a fresh connection; read one answer.

    ``check_close``: find out whether the server closed after it (``Answer.closed``):
    it sends another request, which a connection kept alive answers.
    """
    with trio.fail_after(10):
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        async with stream:
            await stream.send_all(data)
            head, body = await _answer(stream)
            closed = False
            if check_close:
                try:
                    await stream.send_all(request("GET", "/healthz"))
                    closed = await stream.receive_some(65536) == b""
                except trio.BrokenResourceError:
                    closed = True
    return Answer(head, body, closed)


async def _answer(stream: trio.SocketStream) -> tuple[bytes, bytes]:
    received = b""
    while b"\r\n\r\n" not in received:
        chunk = await stream.receive_some(65536)
        assert chunk, received
        received += chunk
    head, _, body = received.partition(b"\r\n\r\n")
    length = int(Answer(head, b"", False).headers.get("content-length", "0"))
    while len(body) < length:
        chunk = await stream.receive_some(65536)
        assert chunk, received
        body += chunk
    return head, body


def request(
    method: str,
    target: str,
    *,
    host: str | None = "127.0.0.1",
    headers: dict[str, str] | None = None,
    body: bytes | None = None,
    json_type: bool = True,
) -> bytes:
    """One HTTP/1.1 request's bytes; a POST says ``application/json`` unless not ``json_type``."""
    lines = [f"{method} {target} HTTP/1.1"]
    if host is not None:
        lines.append(f"Host: {host}")
    if method == "POST" and json_type:
        lines.append("Content-Type: application/json")
    lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
    if body is not None or method == "POST":
        lines.append(f"Content-Length: {len(body or b'')}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (body or b"")


def handshake(target: str, **kw: Any) -> bytes:
    """The bytes of a WebSocket handshake (RFC 6455 section 4.1) for ``target``."""
    headers = {
        "Upgrade": "websocket",
        "Connection": "Upgrade",
        "Sec-WebSocket-Version": "13",
        "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
        **kw.pop("headers", {}),
    }
    return request("GET", target, headers=headers, **kw)


async def post_routes(h: Harness) -> list[str]:
    """A path of every POST route, on a real session (so a body is read, not a 404)."""
    sid = await h.create_session()
    return [
        "/sessions",
        f"/sessions/{sid}/turns",
        f"/sessions/{sid}/turns/turn_nope/cancel",
        f"/sessions/{sid}/permissions/perm_nope",
        f"/sessions/{sid}/feedback",
        "/agui",
        f"/agui/{sid}/cancel",
    ]


async def session_count(h: Harness) -> int:
    r = await h.http.get("/sessions")
    assert r.status_code == 200, r.text
    return len(r.json()["sessions"])


# --- 1. every POST is application/json ------------------------------------------------


async def test_the_reported_attack_a_text_plain_post_runs_nothing(tmp_path: Path) -> None:
    """``fetch(url, {method: "POST", mode: "no-cors", body})`` from any page, as reported."""
    async with gateway(tmp_path, **{"tools.enabled": ["shell"]}) as h:
        port = port_of(h)
        content = json.dumps(SHELL_SCRIPT)
        run = {"threadId": "t1", "runId": "r1", "messages": [{"id": "m", "role": "user",
               "content": content}]}  # fmt: skip
        headers = {"Content-Type": "text/plain;charset=UTF-8", "Origin": EVIL}
        for origin in ({"Origin": EVIL}, {}):  # refused for its type, whoever sends it
            h2 = {**headers, **origin} if origin else {"Content-Type": "text/plain"}
            answer = await send(
                port,
                request(
                    "POST", "/agui", headers=h2, body=json.dumps(run).encode(), json_type=False
                ),
            )
            assert answer.status in (403, 415), answer.body
            answer = await send(
                port, request("POST", "/sessions", headers=h2, body=b"{}", json_type=False)
            )
            assert answer.status in (403, 415), answer.body
        sid = await h.create_session()
        answer = await send(
            port,
            request(
                "POST",
                f"/sessions/{sid}/turns",
                headers={"Content-Type": "text/plain"},
                body=json.dumps({"content": content}).encode(),
                json_type=False,
            ),
        )
        assert (answer.status, answer.code) == (415, "unsupported_media_type")
        assert await session_count(h) == 1  # only the one made here
        assert h.node.sessions[sid].turn is None
        assert not await trio.to_thread.run_sync(lambda: list(tmp_path.rglob("PWNED")))


@pytest.mark.parametrize(
    "content_type",
    [None, "text/plain", "text/plain;charset=UTF-8", "application/x-www-form-urlencoded",
     "multipart/form-data; boundary=x", "application/jsonx", "text/json", ""],
)  # fmt: skip
async def test_a_post_that_is_not_application_json_is_415_on_every_post_route(
    tmp_path: Path, content_type: str | None
) -> None:
    async with gateway(tmp_path) as h:
        routes = await post_routes(h)
        headers = {} if content_type is None else {"Content-Type": content_type}
        for path in routes:
            for body in (b"", b"{}"):  # an empty body too: a browser sends one without asking
                data = request("POST", path, headers=headers, body=body, json_type=False)
                answer = await send(port_of(h), data, check_close=True)
                assert (answer.status, answer.code) == (415, "unsupported_media_type"), path
                assert not answer.closed  # the body was read: the connection goes on
        assert await session_count(h) == 1


async def test_application_json_with_a_charset_in_any_case_is_accepted(tmp_path: Path) -> None:
    async with gateway(tmp_path) as h:
        for content_type in (
            "application/json; charset=utf-8",
            "Application/JSON",
            "APPLICATION/JSON;charset=UTF-8",
        ):
            headers = {"Content-Type": content_type}
            data = request("POST", "/sessions", headers=headers, body=b"", json_type=False)
            answer = await send(port_of(h), data)
            assert answer.status == 201, answer.body
        assert await session_count(h) == 3


# --- 2. Origin ------------------------------------------------------------------------


async def test_a_foreign_origin_is_403_on_get_post_and_the_handshake(tmp_path: Path) -> None:
    async with gateway(tmp_path) as h:
        port = port_of(h)
        sid = await h.create_session()
        token = (await h.http.get(f"/sessions/{sid}")).json()["attach_token"]
        own_other_port = "http://127.0.0.1:1"  # another port is another origin
        for origin in (EVIL, "null", own_other_port, f"http://localhost:{port}", "garbage"):
            for data in (
                request("GET", "/sessions", headers={"Origin": origin}),
                request("GET", "/healthz", headers={"Origin": origin}),
                request("GET", "/nowhere", headers={"Origin": origin}),
                request("POST", "/sessions", headers={"Origin": origin}, body=b"{}"),
                request("POST", "/agui", headers={"Origin": origin}, body=b"{}"),
                request("DELETE", f"/sessions/{sid}", headers={"Origin": origin}),
                request(
                    "OPTIONS",
                    "/sessions",
                    headers={"Origin": origin, "Access-Control-Request-Method": "POST"},
                ),
                handshake(f"/sessions/{sid}/stream?attach={token}", headers={"Origin": origin}),
            ):
                answer = await send(port, data)
                assert (answer.status, answer.code) == (403, "origin_not_allowed"), (origin, data)
                assert "access-control-allow-origin" not in answer.headers
        assert await session_count(h) == 1
        # A file is a "simple" cross-site POST (text/plain needs no preflight): refused
        # all the same, before its body is kept (docs/protocol.md §15 "Cross-site requests").
        for origin in (EVIL, "null"):
            headers = {"Origin": origin, "Content-Type": "text/plain"}
            data = request(
                "POST", f"/sessions/{sid}/files", headers=headers, body=b"hi", json_type=False
            )
            answer = await send(port, data)
            assert (answer.status, answer.code) == (403, "origin_not_allowed"), origin
        assert await h.node.files.records(sid) == {}
        plain = {"Content-Type": "text/plain"}
        data = request("POST", f"/sessions/{sid}/files", headers=plain, body=b"hi", json_type=False)
        assert (await send(port, data)).status == 201  # the same request, sent by no page
        # the token was not used by the refused handshakes
        answer = await send(port, handshake(f"/sessions/{sid}/stream?attach={token}"))
        assert answer.status == 101


async def test_the_own_origin_needs_no_listing_and_gets_no_cors_headers(tmp_path: Path) -> None:
    async with gateway(tmp_path) as h:
        port = port_of(h)
        own = f"http://127.0.0.1:{port}"
        for origin, host in (
            (own, f"127.0.0.1:{port}"),
            (f"HTTP://LOCALHOST:{port}", f"localhost:{port}"),
        ):
            answer = await send(
                port, request("POST", "/sessions", host=host, headers={"Origin": origin}, body=b"")
            )
            assert answer.status == 201, answer.body
            assert "access-control-allow-origin" not in answer.headers
        sid = json.loads(answer.body)["session_id"]
        token = (await h.http.get(f"/sessions/{sid}")).json()["attach_token"]
        target = f"/sessions/{sid}/stream?attach={token}"
        answer = await send(
            port, handshake(target, host=f"127.0.0.1:{port}", headers={"Origin": own})
        )
        assert answer.status == 101


async def test_public_url_is_an_own_origin(tmp_path: Path) -> None:
    async with gateway(tmp_path, **{"server.public_url": "https://gw.example.com"}) as h:
        for origin in ("https://gw.example.com", "https://gw.example.com:443"):
            answer = await send(port_of(h), request("GET", "/sessions", headers={"Origin": origin}))
            assert answer.status == 200, answer.body
        answer = await send(
            port_of(h), request("GET", "/sessions", headers={"Origin": "http://gw.example.com"})
        )
        assert answer.status == 403


async def test_a_listed_origin_gets_its_preflight_and_cors_headers(tmp_path: Path) -> None:
    async with gateway(tmp_path, **{"auth.allowed_origins": [LISTED, "null"]}) as h:
        port = port_of(h)
        preflight = {
            "Origin": LISTED,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "content-type, authorization",
        }
        answer = await send(port, request("OPTIONS", "/sessions", headers=preflight))
        assert answer.status == 204, answer.body
        assert answer.headers["access-control-allow-origin"] == LISTED
        assert answer.headers["vary"] == "Origin"
        assert "POST" in answer.headers["access-control-allow-methods"]
        listed = answer.headers["access-control-allow-headers"].split(",")
        allowed = {name.strip().lower() for name in listed}
        assert allowed == {"authorization", "content-type", "idempotency-key", "last-event-id"}
        assert int(answer.headers["access-control-max-age"]) > 0
        # the actual request, and an error answer, carry the headers too
        listed_origin = {"Origin": LISTED}
        answer = await send(port, request("POST", "/sessions", headers=listed_origin, body=b"{}"))
        assert answer.status == 201
        assert answer.headers["access-control-allow-origin"] == LISTED
        assert answer.headers["vary"] == "Origin"
        assert answer.headers["access-control-expose-headers"] == "Retry-After, Idempotent-Replayed"
        answer = await send(port, request("GET", "/sessions/sess_nope", headers=listed_origin))
        assert answer.status == 404
        assert answer.headers["access-control-allow-origin"] == LISTED
        # the AG-UI stream too
        run = {"threadId": "t1", "runId": "r1", "messages": [{"id": "m", "role": "user",
               "content": "hi"}]}  # fmt: skip
        answer = await send(
            port,
            request("POST", "/agui", headers={"Origin": LISTED, "Connection": "close"},
                    body=json.dumps(run).encode()),
        )  # fmt: skip
        assert answer.status == 200 and answer.headers["access-control-allow-origin"] == LISTED
        # "null" (a sandboxed page, a file://) only because it is listed
        answer = await send(port, request("GET", "/sessions", headers={"Origin": "null"}))
        assert answer.status == 200 and answer.headers["access-control-allow-origin"] == "null"
        # the listed origin's handshake
        sid = (await h.http.post("/sessions", json={})).json()["session_id"]
        token = (await h.http.get(f"/sessions/{sid}")).json()["attach_token"]
        answer = await send(
            port, handshake(f"/sessions/{sid}/stream?attach={token}", headers={"Origin": LISTED})
        )
        assert answer.status == 101
        # and any other origin is still refused, its preflight included
        evil = {**preflight, "Origin": EVIL}
        answer = await send(port, request("OPTIONS", "/sessions", headers=evil))
        assert (answer.status, answer.code) == (403, "origin_not_allowed")


# --- 3. Host ----------------------------------------------------------------------------


async def test_dns_rebinding_a_foreign_host_is_421_on_every_route(tmp_path: Path) -> None:
    async with gateway(tmp_path) as h:
        port = port_of(h)
        sid = await h.create_session()
        token = (await h.http.get(f"/sessions/{sid}")).json()["attach_token"]
        documented = h.gateway.router.documented
        paths = [(d.method, d.path.replace("{session_id}", sid)) for d in documented]
        assert len(paths) >= 14
        for host in (
            "evil.example",
            f"evil.example:{port}",
            "127.0.0.1.evil.example",
            "localhost.evil.example",
            "[::2]",
            "10.0.0.1",
            "",
            "a, 127.0.0.1",
        ):
            sent = [request(m, p, host=host, body=b"{}" if m == "POST" else None) for m, p in paths]
            preflight = {"Origin": f"http://{host}", "Access-Control-Request-Method": "POST"}
            sent += [
                request("GET", "/", host=host),
                request("GET", "/nowhere", host=host),
                request("OPTIONS", "/sessions", host=host, headers=preflight),
                handshake(f"/sessions/{sid}/stream?attach={token}", host=host),
            ]
            for data in sent:
                answer = await send(port, data)
                assert (answer.status, answer.code) == (421, "misdirected_request"), (host, data)
        assert await session_count(h) == 1
        answer = await send(port, handshake(f"/sessions/{sid}/stream?attach={token}"))
        assert answer.status == 101  # the refused handshakes did not use the token


async def test_the_loopback_names_are_answered_in_any_case_and_port(tmp_path: Path) -> None:
    async with gateway(tmp_path) as h:
        port = port_of(h)
        for host in ("127.0.0.1", f"127.0.0.1:{port}", "localhost", "LOCALHOST:1", "localhost.",
                     "[::1]", f"[::1]:{port}"):  # fmt: skip
            answer = await send(port, request("GET", "/healthz", host=host))
            assert answer.status == 200, host
        # HTTP/1.0 may leave Host out: then no name is asked for, and none is answered
        answer = await send(port, b"GET /healthz HTTP/1.0\r\n\r\n")
        assert (answer.status, answer.code) == (421, "misdirected_request")


async def test_allowed_hosts_replaces_the_loopback_names(tmp_path: Path) -> None:
    hosts = {"server.allowed_hosts": ["GW.example.com", "[::1]"]}
    async with gateway(tmp_path, **hosts, **{"server.public_url": "https://pub.example"}) as h:
        port = port_of(h)
        for host, status in (("gw.example.com:8421", 200), ("pub.example", 200), ("[::1]", 200),
                             ("127.0.0.1", 421), ("localhost", 421)):  # fmt: skip
            answer = await send(port, request("GET", "/healthz", host=host))
            assert answer.status == status, host


def boundary(**flat: Any) -> Boundary:
    return Boundary(load_config(None, {}, flat))


def test_bound_beyond_loopback_the_bound_address_is_answered_too() -> None:
    specific = boundary(**{"server.host": "192.0.2.7"})
    assert specific.host_allowed("192.0.2.7:8421") and specific.host_allowed("localhost")
    assert not specific.host_allowed("192.0.2.8") and not specific.host_allowed("evil.example")
    everywhere = boundary(**{"server.host": "0.0.0.0"})  # any IP literal: no DNS to rebind
    for host in ("192.0.2.7:8421", "[2001:db8::1]:80", "10.1.2.3", "localhost"):
        assert everywhere.host_allowed(host), host
    for host in ("evil.example", "myhost", "[evil]", "10.1.2.3.evil.example"):
        assert not everywhere.host_allowed(host), host
    listed = boundary(**{"server.host": "0.0.0.0", "server.allowed_hosts": ["gw.lan"]})
    assert listed.host_allowed("gw.lan") and not listed.host_allowed("10.1.2.3")


def test_a_gateway_bound_beyond_loopback_warns_once_that_allowed_hosts_is_unset(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from gateway.http.boundary import warn_open_hosts

    for host, warned in (("127.0.0.1", False), ("0.0.0.0", True), ("::1", False)):
        caplog.clear()
        warn_open_hosts(load_config(None, {}, {"server.host": host}))
        assert any("allowed_hosts" in r.getMessage() for r in caplog.records) is warned, host
    caplog.clear()
    listed = {"server.host": "0.0.0.0", "server.allowed_hosts": ["x"]}
    warn_open_hosts(load_config(None, {}, listed))
    assert not caplog.records


# --- 4. bad input ---------------------------------------------------------------------------


async def test_content_length_with_transfer_encoding_is_400_and_closes(tmp_path: Path) -> None:
    """RFC 9112 section 6.1: a smuggling vector; the body that follows is never a request."""
    async with gateway(tmp_path) as h:
        port = port_of(h)
        smuggled = request("GET", "/sessions")
        body = b"0\r\n\r\n" + smuggled
        for te in ("chunked", "Chunked", "identity, chunked"):
            data = (
                b"POST /sessions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\nTransfer-Encoding: %s\r\n\r\n" % (len(body), te.encode())
            ) + body
            answer = await send(port, data, check_close=True)
            assert answer.status == 400, te
            assert answer.code in ("conflicting_framing", "unsupported_transfer_encoding"), te
            assert answer.closed and answer.headers.get("connection") == "close"
        for te in ("gzip", "gzip, chunked", "chunked, gzip"):
            data = (
                b"POST /sessions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                b"Transfer-Encoding: %s\r\n\r\n0\r\n\r\n" % te.encode()
            )
            answer = await send(port, data, check_close=True)
            assert (answer.status, answer.code) == (400, "unsupported_transfer_encoding"), te
            assert answer.closed
        assert await session_count(h) == 0


async def test_invalid_utf8_in_a_json_string_is_400_on_every_post_route(tmp_path: Path) -> None:
    async with gateway(tmp_path) as h:
        routes = await post_routes(h)
        bodies = [  # in a field each route reads (an unknown one is a 422 before its value)
            [b'{"model": "\xff"}', b'{"metadata": {"k": "a\xc3"}}'],
            [b'{"content": "\xff\xfe"}'],
            [b'{"reason": "\xed\xa0\x80"}'],  # a UTF-8-encoded surrogate
            [b'{"decision": "allow\xf8"}'],
            [b'{"message_id": "m\x80", "rating": 1}'],
            [b'{"threadId": "t\x80", "runId": "r", "messages": []}'],
            [b'{"reason": "\xff"}'],
        ]
        for path, route_bodies in zip(routes, bodies, strict=True):
            for body in route_bodies:
                answer = await send(port_of(h), request("POST", path, body=body))
                assert (answer.status, answer.code) == (400, "invalid_json"), (path, body)
        assert await session_count(h) == 1


async def test_a_repeated_query_parameter_is_400_naming_it(tmp_path: Path) -> None:
    async with gateway(tmp_path) as h:
        port = port_of(h)
        sid = await h.create_session()
        token = (await h.http.get(f"/sessions/{sid}")).json()["attach_token"]
        for target in ("/sessions?limit=5&limit=6", "/sessions?limit=5&limit=5",
                       f"/sessions/{sid}/messages?before=a&limit=1&before=b",
                       "/healthz?x=1&x=2"):  # fmt: skip
            answer = await send(port, request("GET", target))
            assert (answer.status, answer.code) == (400, "duplicate_query_parameter"), target
            name = target.split("&")[-1].partition("=")[0]
            assert repr(name) in json.loads(answer.body)["error"]["message"]
        target = f"/sessions/{sid}/stream?attach=atk_other&attach={token}"
        answer = await send(port, handshake(target))
        assert (answer.status, answer.code) == (400, "duplicate_query_parameter")
        assert "'attach'" in json.loads(answer.body)["error"]["message"]
        answer = await send(port, handshake(f"/sessions/{sid}/stream?attach={token}"))
        assert answer.status == 101  # the token is still good


async def test_an_attach_token_is_not_used_up_on_another_sessions_path(tmp_path: Path) -> None:
    async with gateway(tmp_path) as h:
        port = port_of(h)
        a, b = await h.create_session(), await h.create_session()
        token_a = (await h.http.get(f"/sessions/{a}")).json()["attach_token"]
        answer = await send(port, handshake(f"/sessions/{b}/stream?attach={token_a}"))
        assert (answer.status, answer.code) == (403, "attach_token_invalid")
        answer = await send(port, handshake(f"/sessions/{a}/stream?attach={token_a}"))
        assert answer.status == 101  # still good for its own session
        answer = await send(port, handshake(f"/sessions/{a}/stream?attach={token_a}"))
        assert (answer.status, answer.code) == (403, "attach_token_invalid")  # and single-use


async def test_attach_tokens_are_looked_up_under_their_session() -> None:
    tokens = AttachTokens(60)
    token = tokens.issue("sess_a")
    with pytest.raises(Refused) as refused:
        tokens.redeem(token, "sess_b")
    assert (STATUS[refused.value.code], refused.value.code) == (403, "attach_token_invalid")
    tokens.redeem(token, "sess_a")
    with pytest.raises(Refused):
        tokens.redeem(token, "sess_a")


# --- 6. the API document ----------------------------------------------------------------


async def test_the_document_lists_the_boundarys_answers(tmp_path: Path) -> None:
    """Every operation: 421 and 403 ``origin_not_allowed``, the new 400s; every POST: 415."""
    async with gateway(tmp_path) as h:
        document = (await h.http.get("/openapi.json")).json()
    operations = [(m, op) for item in document["paths"].values() for m, op in item.items()]
    assert len(operations) >= 14
    for method, op in operations:

        def codes(status: int, op: dict[str, Any] = op) -> list[str]:
            schema = op["responses"][str(status)]["content"]["application/json"]["schema"]
            return list(schema["allOf"][1]["properties"]["error"]["properties"]["code"]["enum"])

        assert codes(421) == ["misdirected_request"], op["operationId"]
        assert "origin_not_allowed" in codes(403), op["operationId"]
        for code in ("duplicate_query_parameter", "conflicting_framing",
                     "unsupported_transfer_encoding"):  # fmt: skip
            assert code in codes(400), (op["operationId"], code)
        if method == "post":
            assert codes(415) == ["unsupported_media_type"], op["operationId"]
        else:
            assert "415" not in op["responses"], op["operationId"]

"""The model API door of Claude Code CLIs, on loopback (gateway.providers.model_proxy;
docs/protocol.md §11, "The key").

A real door on 127.0.0.1, the fake Anthropic API behind it, raw sockets and httpx in
front: a bad credential is 401 before the body is read, another path 404, a body over
the limit 413, an upstream that cannot be reached 502; a credential revoked while its
call streams cuts the call; the real key is added upstream and never comes back.
"""

from __future__ import annotations

import json

import httpx
import pytest
import trio

from bench.fake_api import FakeServer, Replay, transcript
from bench.fake_api.server import Cut
from gateway.providers import model_proxy
from gateway.providers.model_proxy import ModelProxy

REAL_KEY = "sk-ant-real-key-of-the-operator-0123456789"
TEXT = transcript("anthropic/text.sse")
MESSAGES = "/v1/messages?beta=true"
NOT_MODEL_CALLS = [
    ("GET", "/v1/messages"),
    ("POST", "/v1/complete"),
    ("GET", "/v1/models"),
    ("POST", "/v1/messagesX"),
    ("POST", "/"),
]
BODY = json.dumps({"model": "claude-sonnet-4-6", "max_tokens": 16, "messages": []}).encode()


async def door(nursery: trio.Nursery) -> ModelProxy:
    proxy = ModelProxy()
    proxy.attach(nursery)
    await proxy.ensure_running()
    return proxy


async def upstream(nursery: trio.Nursery, *replies: Replay) -> FakeServer:
    fake = FakeServer(*replies)
    await nursery.start(fake.serve)
    return fake


async def raw_exchange(base_url: str, head: bytes, body: bytes = b"") -> bytes:
    """Send ``head`` (and ``body``) on a new connection; all the door answers until it closes."""
    host, port = base_url.removeprefix("http://").split(":")
    stream = await trio.open_tcp_stream(host, int(port))
    async with stream:
        await stream.send_all(head + body)
        answer = b""
        with trio.fail_after(5):
            while chunk := await stream.receive_some(65536):
                answer += chunk
    return answer


async def test_a_bad_credential_is_401_before_the_body_is_read(nursery: trio.Nursery) -> None:
    """The head announces a megabyte and none of it is sent: the 401 comes at once."""
    proxy = await door(nursery)
    proxy.issue("sess_a", "http://127.0.0.1:9", REAL_KEY)  # a good one exists, not this one
    head = (
        b"POST /v1/messages HTTP/1.1\r\nHost: 127.0.0.1\r\nx-api-key: gwcc-not-issued\r\n"
        b"Content-Type: application/json\r\nContent-Length: 1000000\r\n\r\n"
    )
    for credential in (
        b"x-api-key: gwcc-not-issued",
        b"Authorization: Bearer " + REAL_KEY.encode(),
    ):
        answer = await raw_exchange(
            proxy.base_url, head.replace(b"x-api-key: gwcc-not-issued", credential)
        )
        status, _, body = answer.partition(b"\r\n\r\n")
        assert status.startswith(b"HTTP/1.1 401"), answer
        assert json.loads(body)["error"]["type"] == "authentication_error"
        assert REAL_KEY.encode() not in answer


async def test_anything_but_a_model_call_is_404(nursery: trio.Nursery) -> None:
    proxy = await door(nursery)
    fake = await upstream(nursery)
    credential = proxy.issue("sess_a", fake.base_url, REAL_KEY)
    async with httpx.AsyncClient(base_url=proxy.base_url) as http:
        for method, path in NOT_MODEL_CALLS:
            r = await http.request(method, path, headers={"x-api-key": credential}, content=BODY)
            assert r.status_code == 404, (method, path, r.text)
            assert r.json()["error"]["type"] == "not_found_error"
    assert fake.requests == []  # nothing went upstream


async def test_a_body_over_the_limit_is_413(
    nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(model_proxy, "MAX_REQUEST_BYTES", 4096)
    proxy = await door(nursery)
    fake = await upstream(nursery, Replay(TEXT))
    credential = proxy.issue("sess_a", fake.base_url, REAL_KEY)
    async with httpx.AsyncClient(base_url=proxy.base_url) as http:
        r = await http.post(MESSAGES, headers={"x-api-key": credential}, content=b"x" * 5000)
        assert r.status_code == 413, r.text
        assert r.json()["error"]["type"] == "request_too_large"
        ok = await http.post(MESSAGES, headers={"x-api-key": credential}, content=BODY)
        assert ok.status_code == 200  # under it: forwarded
    assert len(fake.requests) == 1


async def test_an_upstream_that_cannot_be_reached_is_502(nursery: trio.Nursery) -> None:
    listener = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
    port = listener.socket.getsockname()[1]
    await listener.aclose()  # nothing listens there now
    proxy = await door(nursery)
    credential = proxy.issue("sess_a", f"http://127.0.0.1:{port}", REAL_KEY)
    async with httpx.AsyncClient(base_url=proxy.base_url) as http:
        r = await http.post(MESSAGES, headers={"x-api-key": credential}, content=BODY)
    assert r.status_code == 502, r.text
    assert r.json()["error"]["type"] == "api_error"
    assert REAL_KEY not in r.text and credential not in r.text


async def test_a_credential_revoked_while_its_call_streams_cuts_the_call(
    nursery: trio.Nursery,
) -> None:
    """The upstream sends part of the answer, then stalls: revoked, the CLI's connection
    ends at once (a broken answer), and the credential is refused from then on."""
    proxy = await door(nursery)
    fake = await upstream(nursery, Replay(TEXT, cut=Cut(300, "stall")))
    credential = proxy.issue("sess_a", fake.base_url, REAL_KEY)
    got = b""
    async with httpx.AsyncClient(base_url=proxy.base_url) as http:
        async with http.stream(
            "POST", MESSAGES, headers={"x-api-key": credential}, content=BODY
        ) as r:
            assert r.status_code == 200
            with trio.fail_after(5), pytest.raises(httpx.HTTPError):
                async for chunk in r.aiter_raw():
                    got += chunk
                    if len(got) >= 300:
                        proxy.revoke(credential)
        assert len(got) == 300  # what came before the cut, and nothing after
        again = await http.post(MESSAGES, headers={"x-api-key": credential}, content=BODY)
    assert again.status_code == 401
    assert proxy.live == 0


async def test_the_real_key_is_added_upstream_and_never_comes_back(nursery: trio.Nursery) -> None:
    """Upstream gets the real key as ``x-api-key`` and nothing of the credential (nor the
    ``Authorization`` the CLI may send); the CLI's answer holds the stream, byte for byte,
    and not the key."""
    proxy = await door(nursery)
    fake = await upstream(nursery, Replay(TEXT), Replay(TEXT))
    credential = proxy.issue("sess_a", fake.base_url, REAL_KEY)
    answers = []
    async with httpx.AsyncClient(base_url=proxy.base_url) as http:
        for headers in (
            {"x-api-key": credential, "anthropic-version": "2023-06-01"},
            {"authorization": f"Bearer {credential}", "anthropic-version": "2023-06-01"},
        ):
            r = await http.post(MESSAGES, headers=headers, content=BODY)
            assert r.status_code == 200, r.text
            answers.append(r)
    for request in fake.requests:
        assert request.path == MESSAGES and request.body == json.loads(BODY)
        assert request.headers["x-api-key"] == REAL_KEY
        assert "authorization" not in request.headers
        assert request.headers["anthropic-version"] == "2023-06-01"
        assert credential not in json.dumps(request.headers)
    for r in answers:
        assert r.content == TEXT
        assert REAL_KEY not in r.text and REAL_KEY not in json.dumps(dict(r.headers))

"""Every bad input is a clear error (PROTOCOL sections 2, 3): never a 500, never a dropped socket.

Named cases first (each failed on the previous main), then fuzzing with
hypothesis: the client-frame decoder on arbitrary text and JSON, and the HTTP
server on arbitrary request lines, headers and bodies. The suite runs a few
seconds of each; ``FUZZ=long`` runs the long profile (the README has
its figures).
"""

from __future__ import annotations

import json
import os
import string
from pathlib import Path
from typing import Any

import h11
import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.errors import FrameRejected
from gateway.protocol.frames import ErrorFrame, decode_client_frame
from tests.conftest import Harness, make_config, running_gateway

LONG = os.environ.get("FUZZ") == "long"
EXAMPLES = 3000 if LONG else 150
HTTP_EXAMPLES = 2000 if LONG else 60
DEEP = "[" * 100_000 + "]" * 100_000


# --- named cases -------------------------------------------------------------


async def test_deeply_nested_json_is_400_invalid_json(gw: Harness) -> None:
    # metadata is any JSON object: only its depth can refuse it
    for body in (
        '{"metadata":{"a":' + DEEP + "}}",
        '{"metadata":' + '{"a":' * 50_000 + "1" + "}" * 50_001,
    ):
        r = await gw.http.post("/sessions", content=body)
        assert r.status_code == 400, r.text
        assert r.json()["error"]["code"] == "invalid_json"
    assert (await gw.http.get("/healthz")).status_code == 200


async def test_deeply_nested_json_over_the_websocket_is_invalid_frame(gw: Harness) -> None:
    sid = await gw.create_session()
    async with gw.client(sid) as client:
        deep_subscribe = '{"type":"subscribe","filter":' + "[" * 100_000 + "]" * 100_000 + "}"
        await client.send(deep_subscribe[:60_000])  # under max_client_frame_bytes, and deep
        frame = await client.recv()
        assert isinstance(frame, ErrorFrame) and frame.code == "invalid_frame", frame
        await client.send("[" * 30_000 + "]" * 30_000)
        frame = await client.recv()
        assert isinstance(frame, ErrorFrame) and frame.code == "invalid_frame", frame
        ack = await client.subscribe()  # the connection stayed open
        assert type(ack).__name__ == "SubscribeAck"


@pytest.mark.parametrize(
    "frame", ['{"type":"ping","nonce":"n","x":1}', '{"type":"pong","nonce":"n","x":1}']
)
def test_ping_and_pong_with_unknown_fields_are_invalid_frame(frame: str) -> None:
    with pytest.raises(FrameRejected) as info:
        decode_client_frame(frame)
    assert info.value.code == "invalid_frame" and "x" in info.value.message


@pytest.mark.parametrize("path", ["/healthz", "/sessions", "/metrics", "/nowhere"])
async def test_head_is_get_without_the_body_and_keeps_the_connection(
    gw: Harness, path: str
) -> None:
    get = await gw.http.get(path)
    head = await gw.http.head(path)
    assert head.status_code == get.status_code
    assert head.content == b""
    if path != "/metrics":  # (its counters moved between the two)
        assert head.headers["content-length"] == str(len(get.content))
    again = await gw.http.get("/healthz")  # the same keep-alive connection goes on
    assert again.status_code == 200


async def test_head_where_only_post_is_allowed_is_405(gw: Harness) -> None:
    sid = await gw.create_session()
    r = await gw.http.head(f"/sessions/{sid}/turns")
    assert r.status_code == 405 and "POST" in r.headers["allow"]


async def test_a_huge_lorem_is_refused_naming_the_field(gw: Harness) -> None:
    sid = await gw.create_session()
    async with gw.client(sid) as client:
        await client.subscribe()
        await gw.submit(sid, {"script": {"rounds": [[{"lorem": 30_000_000}]]}})
        with trio.fail_after(10):
            events = await client.until_turn_ends()
    failed = next(e for e in events if e.type == "llm.call_failed")
    assert failed.payload.error_class == "invalid_request" and "lorem" in failed.payload.message


# --- fuzz: the client-frame decoder ---------------------------------------------

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=10), children, max_size=5)
    ),
    max_leaves=30,
)
FRAME_KEYS = st.sampled_from(
    ["type", "filter", "since", "snapshot", "nonce", "turn_id", "reason", "event_types"]
)
FRAME_LIKE = st.fixed_dictionaries(
    {"type": st.sampled_from(["subscribe", "cancel", "ping", "pong", "nope", ""])}
).flatmap(lambda base: st.dictionaries(FRAME_KEYS, JSON, max_size=5).map(lambda d: {**d, **base}))


@settings(max_examples=EXAMPLES, deadline=None)
@given(
    data=st.one_of(
        st.text(max_size=200),
        st.binary(max_size=200),
        JSON.map(json.dumps),
        FRAME_LIKE.map(json.dumps),
        st.integers(1, 5000).map(lambda n: "[" * n + "]" * n),
        st.integers(1, 5000).map(
            lambda n: '{"type":"subscribe","filter":' + "[" * n + "]" * n + "}"
        ),
    )
)
def test_the_client_frame_decoder_answers_a_frame_or_a_clear_refusal(data: str | bytes) -> None:
    try:
        decode_client_frame(data)
    except FrameRejected as exc:
        assert exc.code in ("invalid_frame", "unknown_frame_type")
        assert exc.message


# --- fuzz: the HTTP server --------------------------------------------------------

TOKEN = st.text(string.ascii_letters + string.digits + "-_.~!$&'*+^`|", min_size=1, max_size=12)
METHODS = st.sampled_from(["GET", "POST", "HEAD", "PUT", "DELETE", "PATCH", "OPTIONS"]) | TOKEN
PATHS = st.sampled_from(
    ["/sessions", "/sessions/{sid}", "/sessions/{sid}/messages", "/sessions/{sid}/turns",
     "/sessions/{sid}/turns/turn_x/cancel", "/sessions/{sid}/permissions/perm_x",
     "/sessions/{sid}/feedback", "/sessions/{sid}/stream", "/healthz", "/metrics",
     "/sessions/sess_nope", "/", "/%00", "/sessions/{sid}/messages?limit=-1&before=x"]
)  # fmt: skip
QUERY = st.dictionaries(st.sampled_from(["limit", "before", "attach", "x"]), st.text(max_size=8))
BODIES = st.one_of(
    st.just(b""),
    st.binary(max_size=300),
    JSON.map(lambda v: json.dumps(v).encode()),
    st.fixed_dictionaries({}, optional={
        "content": JSON, "workspace_path": JSON, "model": JSON, "metadata": JSON,
        "decision": JSON, "message_id": JSON, "rating": JSON, "reason": JSON,
    }).map(lambda v: json.dumps(v).encode()),
    st.integers(1, 3000).map(lambda n: ("[" * n + "]" * n).encode()),
)  # fmt: skip
HEADERS = st.lists(
    st.tuples(
        st.sampled_from(["content-type", "authorization", "x-thing", "upgrade", "connection",
                         "sec-websocket-key", "sec-websocket-version", "origin", "expect"]),
        st.text(string.printable.strip() + " ", max_size=30).map(str.strip),
    ),
    max_size=4,
)  # fmt: skip


async def exchange(port: int, method: str, target: str, headers: list[Any], body: bytes) -> Any:
    """One request on a fresh connection; the parsed response, or None if the server closed."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    client = h11.Connection(h11.CLIENT)
    try:
        head = h11.Request(
            method=method,
            target=target,
            headers=[("host", "127.0.0.1"), ("content-length", str(len(body))), *headers],
        )
        await stream.send_all(client.send(head) + client.send(h11.Data(data=body)) if body
                              else client.send(head))  # fmt: skip
        await stream.send_all(client.send(h11.EndOfMessage()))
        while True:
            event = client.next_event()
            if event is h11.NEED_DATA:
                client.receive_data(await stream.receive_some(65536))
                continue
            if isinstance(event, h11.InformationalResponse):
                continue
            return event
    finally:
        await stream.aclose()


@pytest.fixture(scope="module")
def fuzz_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


@settings(
    max_examples=HTTP_EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(cases=st.lists(st.tuples(METHODS, PATHS, QUERY, HEADERS, BODIES), min_size=1, max_size=8))
def test_the_http_server_never_answers_5xx_and_keeps_serving(
    fuzz_dir: Path, cases: list[tuple[str, str, dict[str, str], list[Any], bytes]]
) -> None:
    async def run() -> None:
        async with running_gateway(
            make_config(fuzz_dir, **{"store.path": str(fuzz_dir / "f.db")})
        ) as gw:
            sid = await gw.create_session()
            port = gw.gateway.port
            for method, path, query, headers, body in cases:
                target = path.format(sid=sid)
                if query:
                    sep = "&" if "?" in target else "?"
                    target += sep + "&".join(f"{k}={v}" for k, v in query.items())
                target = "".join(c if 32 < ord(c) < 127 else "%20" for c in target)
                try:
                    with trio.fail_after(10):
                        response = await exchange(port, method, target, headers, body)
                except h11.LocalProtocolError:
                    continue  # not a request h11 would send: nothing to ask
                if isinstance(response, h11.Response):
                    assert response.status_code < 500 or response.status_code == 503, (
                        method, target, headers, body[:80], response.status_code,
                    )  # fmt: skip
            assert (await gw.http.get("/healthz")).status_code == 200

    trio.run(run)


def test_lorem_is_generated_lazily_in_the_pieces_the_text_would_be_cut_into() -> None:
    import itertools

    from gateway.providers.scripted import _LOREM, LOREM_MAX_WORDS, _chunks, _lorem

    for n in (0, 1, 2, 9, 10, 37):
        for c in (0, 1, 3, 7):
            text = " ".join(itertools.islice(itertools.cycle(_LOREM), n))
            assert list(_lorem(n, c)) == list(_chunks(text, c))
    pieces = _lorem(LOREM_MAX_WORDS, 0)
    assert next(pieces) == "lorem "  # nothing built ahead

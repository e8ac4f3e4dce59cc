"""Who the client is behind a reverse proxy (docs/reference.md ``[server] trusted_proxies``).

The gateway believes ``X-Forwarded-For`` and ``X-Forwarded-Proto`` only from a
TCP peer in ``trusted_proxies``, and then takes the right-most address that is
not itself a trusted proxy (:func:`gateway.http.server.forwarded_client`).
The rule is tested synchronously (several hops, spoofed left-most entries,
garbage, ports, IPv6, no header), then over real sockets on 127.0.0.1 and
127.0.0.2 (a trusted and an untrusted peer of the same listener), then through
``ws_url`` (``wss://`` when a trusted proxy says https), then the config's
refusal of an entry that is not an address. tests/system/deploy/test_nginx.py runs the same
through a real nginx.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path

import httpx
import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from gateway.config import load_config
from gateway.errors import ConfigError
from gateway.http.server import (
    HttpLimits,
    Request,
    Response,
    TrustedProxies,
    forwarded_client,
    json_response,
    serve_connection,
)
from tests.conftest import make_config, running_gateway
from tests.system.cli.test_cli_config import run_gateway

PROXY = "127.0.0.1:40000"  # the TCP peer as gateway.app formats it: host:port
LOCAL = TrustedProxies.parse(["127.0.0.1"])
CHAIN = TrustedProxies.parse(["127.0.0.1", "10.0.0.0/8"])


def client_of(xff: str | None, *, peer: str = PROXY, trusted: TrustedProxies = LOCAL) -> str:
    headers = {} if xff is None else {"x-forwarded-for": xff}
    return forwarded_client(peer, headers, trusted)[0]


# --- the rule, without sockets -------------------------------------------------------


def test_nothing_is_believed_when_no_proxy_is_trusted() -> None:
    headers = {"x-forwarded-for": "203.0.113.7", "x-forwarded-proto": "https"}
    assert forwarded_client(PROXY, headers, TrustedProxies()) == (PROXY, "http")


def test_nothing_is_believed_from_a_peer_that_is_not_trusted() -> None:
    headers = {"x-forwarded-for": "203.0.113.7", "x-forwarded-proto": "https"}
    peer = "198.51.100.1:5000"
    assert forwarded_client(peer, headers, LOCAL) == (peer, "http")
    assert forwarded_client(peer, headers, CHAIN) == (peer, "http")


def test_one_trusted_hop_gives_the_address_it_forwarded_and_its_scheme() -> None:
    headers = {"x-forwarded-for": "203.0.113.7", "x-forwarded-proto": "https"}
    assert forwarded_client(PROXY, headers, LOCAL) == ("203.0.113.7", "https")


def test_several_hops_give_the_right_most_untrusted_address() -> None:
    # client 203.0.113.7 -> 10.0.0.2 -> 10.0.0.3 -> nginx on 127.0.0.1 -> gateway
    assert client_of("203.0.113.7, 10.0.0.2, 10.0.0.3", trusted=CHAIN) == "203.0.113.7"
    # the same chain, but only the last hop is trusted: 10.0.0.3 is the client
    assert client_of("203.0.113.7, 10.0.0.2, 10.0.0.3", trusted=LOCAL) == "10.0.0.3"


@pytest.mark.parametrize(
    "xff",
    [
        "1.1.1.1, 203.0.113.7",  # the client sent "X-Forwarded-For: 1.1.1.1"
        "10.0.0.9, 203.0.113.7",  # ... claiming to be a trusted proxy's client
        "127.0.0.1, 203.0.113.7",  # ... or the trusted proxy itself
        "garbage, <script>, 203.0.113.7",  # ... or anything at all
        "1.1.1.1, 2.2.2.2, 3.3.3.3, 203.0.113.7, 10.0.0.2",
    ],
)
def test_entries_left_of_the_client_are_never_read(xff: str) -> None:
    """What the client put in the header itself cannot change who it is."""
    assert client_of(xff, trusted=CHAIN) == "203.0.113.7"


def test_when_every_entry_is_a_trusted_proxy_the_left_most_is_the_client() -> None:
    assert client_of("10.0.0.1, 10.0.0.2", trusted=CHAIN) == "10.0.0.1"


def test_no_header_or_an_empty_one_leaves_the_peer() -> None:
    assert client_of(None) == PROXY
    assert client_of("") == PROXY
    assert client_of(" , ,") == PROXY
    assert forwarded_client(PROXY, {}, LOCAL) == (PROXY, "http")


@pytest.mark.parametrize(
    "garbage",
    [
        "unknown",
        "gateway.example.com",
        "1.2.3",
        "1.2.3.4.5",
        "256.1.1.1",
        "1.2.3.4:http",
        "1.2.3.4:123456",
        "1.2.3.4:\u00b2",  # a latin-1 superscript two: a digit to str.isdigit, not a port
        "[::1",
        "[::1]x",
        "[::1]:",
        "[1.2.3.4]",
        "fe80::1%eth0",
        "fe80::1%a b",
        "<script>alert(1)</script>",
        "203.0.113.7 198.51.100.2",
        "_hidden",
    ],
)
def test_garbage_stops_the_walk_at_the_last_hop_vouched_for(garbage: str) -> None:
    # the trusted peer forwarded garbage: the client is that peer
    assert client_of(f"203.0.113.7, {garbage}") == PROXY
    # a trusted hop further in forwarded garbage: the client is that hop
    assert client_of(f"203.0.113.7, {garbage}, 10.0.0.2", trusted=CHAIN) == "10.0.0.2"
    # garbage the client sent itself is left of the client: never read
    assert client_of(f"{garbage}, 203.0.113.7") == "203.0.113.7"


def test_ports_are_dropped() -> None:
    assert client_of("203.0.113.7:4711") == "203.0.113.7"
    assert client_of("[2001:db8::7]:4711") == "2001:db8::7"
    assert client_of("[2001:db8::7]") == "2001:db8::7"
    assert client_of("203.0.113.7:4711, 10.0.0.2:80", trusted=CHAIN) == "203.0.113.7"


def test_ipv6_peers_and_entries() -> None:
    v6 = TrustedProxies.parse(["::1", "fd00::/8"])
    # gateway.app writes an IPv6 peer unbracketed; a bracketed one works too
    for peer in ("::1:40000", "[::1]:40000"):
        assert client_of("2001:DB8:0:0::7", peer=peer, trusted=v6) == "2001:db8::7"
    assert client_of("2001:db8::7, fd00::2, fd00::3", peer="::1:40000", trusted=v6) == (
        "2001:db8::7"
    )
    assert client_of("2001:db8::7", peer="2001:db8::1:40000", trusted=v6) == "2001:db8::1:40000"
    # an IPv4 peer is never in an IPv6 network, and the other way round
    assert client_of("203.0.113.7", trusted=v6) == PROXY
    assert client_of("2001:db8::7", peer="::1:40000", trusted=LOCAL) == "::1:40000"


def test_ipv4_mapped_addresses_count_as_ipv4() -> None:
    """A dual-stack listener sees an IPv4 proxy as ``::ffff:127.0.0.1``."""
    assert client_of("::ffff:203.0.113.7", peer="::ffff:127.0.0.1:40000") == "203.0.113.7"


def test_repeated_header_lines_read_as_one_list() -> None:
    """h11 gives repeats joined with ", " (gateway.http.server._request), RFC 9110 section 5.3."""
    assert client_of("1.1.1.1, 203.0.113.7") == client_of("203.0.113.7")


@pytest.mark.parametrize(
    ("proto", "scheme"),
    [
        ("https", "https"),
        ("HTTPS", "https"),
        (" https ", "https"),
        ("http", "http"),
        ("https, http", "http"),  # the right-most: what the trusted peer set
        ("http, https", "https"),
        ("ftp", "http"),
        ("wss", "http"),
        ("", "http"),
    ],
)
def test_the_scheme_is_the_trusted_peers_x_forwarded_proto(proto: str, scheme: str) -> None:
    headers = {"x-forwarded-proto": proto}
    assert forwarded_client(PROXY, headers, LOCAL) == (PROXY, scheme)
    assert forwarded_client("198.51.100.1:5000", headers, LOCAL)[1] == "http"


def test_an_unknown_peer_trusts_nothing() -> None:
    headers = {"x-forwarded-for": "203.0.113.7", "x-forwarded-proto": "https"}
    everyone = TrustedProxies.parse(["0.0.0.0/0", "::/0"])
    assert forwarded_client("", headers, everyone) == ("", "http")
    assert forwarded_client("not-an-address:1", headers, everyone)[0] == "not-an-address:1"


def test_trusted_proxies_parse_like_the_config() -> None:
    proxies = TrustedProxies.parse(["10.1.2.3/8", "::1"])
    assert proxies.networks == (
        ipaddress.ip_network("10.0.0.0/8"),
        ipaddress.ip_network("::1/128"),
    )
    assert proxies.trusts(ipaddress.ip_address("10.200.0.1"))
    assert not proxies.trusts(ipaddress.ip_address("11.0.0.1"))


_header_text = st.text(st.characters(min_codepoint=0x20, max_codepoint=0xFF), max_size=80)
_entry = st.one_of(
    st.ip_addresses().map(str),
    st.sampled_from(["127.0.0.1", "10.0.0.2", "::1", "unknown", "", " "]),
    _header_text,
)


@given(entries=st.lists(_entry, max_size=8), trusted_peer=st.booleans())
def test_the_client_is_the_peer_or_a_canonical_address(
    entries: list[str], trusted_peer: bool
) -> None:
    """Whatever the header holds, nothing but an address (or the peer) comes out."""
    peer = PROXY if trusted_peer else "198.51.100.1:5000"
    client = client_of(", ".join(entries), peer=peer, trusted=CHAIN)
    if client != peer:
        assert trusted_peer
        assert str(ipaddress.ip_address(client)) == client


# --- over real sockets ----------------------------------------------------------------


async def echo_client(req: Request) -> Response:
    return json_response(200, {"client": req.client, "peer": req.peer, "scheme": req.scheme})


@asynccontextmanager
async def echo_server(trusted: list[str]) -> AsyncIterator[int]:
    """``serve_connection`` on 127.0.0.1 port 0 with a handler that answers what it was told."""
    limits = HttpLimits(trusted_proxies=TrustedProxies.parse(trusted))

    async def serve(stream: trio.SocketStream) -> None:
        host, port = stream.socket.getpeername()[:2]
        await serve_connection(stream, echo_client, limits, client=f"{host}:{port}")

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, serve, 0, host="127.0.0.1"))
        yield listeners[0].socket.getsockname()[1]
        nursery.cancel_scope.cancel()


async def ask(port: int, source: str, headers: dict[str, str]) -> dict[str, str]:
    transport = httpx.AsyncHTTPTransport(local_address=source)
    async with httpx.AsyncClient(transport=transport) as http:
        r = await http.get(f"http://127.0.0.1:{port}/", headers=headers)
    assert r.status_code == 200, r.text
    answer: dict[str, str] = r.json()
    return answer


async def test_over_a_socket_only_the_trusted_peer_is_believed() -> None:
    """127.0.0.1 is the proxy; 127.0.0.2 is a client that tries to spoof its address."""
    spoof = {"X-Forwarded-For": "203.0.113.7", "X-Forwarded-Proto": "https"}
    with trio.fail_after(10):
        async with echo_server(["127.0.0.1"]) as port:
            via_proxy = await ask(port, "127.0.0.1", spoof)
            assert via_proxy["client"] == "203.0.113.7"
            assert via_proxy["scheme"] == "https"
            assert via_proxy["peer"].startswith("127.0.0.1:")
            direct = await ask(port, "127.0.0.2", spoof)
            assert direct["client"] == direct["peer"]
            assert direct["peer"].startswith("127.0.0.2:")
            assert direct["scheme"] == "http"
            # one keep-alive connection from the proxy carries many clients' requests:
            # each request is read on its own
            transport = httpx.AsyncHTTPTransport(local_address="127.0.0.1")
            async with httpx.AsyncClient(transport=transport) as http:
                answers = [
                    (await http.get(f"http://127.0.0.1:{port}/", headers=h)).json()
                    for h in ({"X-Forwarded-For": "203.0.113.7"}, {"X-Forwarded-For": "::1"}, {})
                ]
            assert [a["client"] for a in answers[:2]] == ["203.0.113.7", "::1"]
            assert answers[2]["client"] == answers[0]["peer"] == answers[2]["peer"]
        async with echo_server([]) as port:  # the default: nobody is trusted
            assert (await ask(port, "127.0.0.1", spoof))["client"].startswith("127.0.0.1:")


async def test_ws_url_is_wss_when_a_trusted_proxy_says_https(tmp_path: Path) -> None:
    """docs/protocol.md §2: ``ws_url`` behind a reverse proxy is ``wss://``, from the Host."""
    https = {"X-Forwarded-Proto": "https", "Host": "gw.example.com"}
    hosts = {"server.allowed_hosts": ["127.0.0.1", "gw.example.com"]}  # docs/protocol.md §15
    config = make_config(tmp_path, **{"server.trusted_proxies": ["127.0.0.1"]}, **hosts)
    with trio.fail_after(20):
        async with running_gateway(config) as gw:
            sid = await gw.create_session()
            r = await gw.http.get(f"/sessions/{sid}", headers=https)
            assert r.json()["ws_url"].startswith(f"wss://gw.example.com/sessions/{sid}/stream?")
            r = await gw.http.get(
                f"/sessions/{sid}", headers={**https, "X-Forwarded-Proto": "http"}
            )
            assert r.json()["ws_url"].startswith("ws://gw.example.com/")
        # the same request from a peer that is not trusted: the header is ignored
        async with running_gateway(make_config(tmp_path, **hosts)) as gw:
            r = await gw.http.get(f"/sessions/{sid}", headers=https)
            assert r.json()["ws_url"].startswith("ws://gw.example.com/")
        # a public_url wins over both
        public = {
            "server.public_url": "https://public.example.com/",
            "server.trusted_proxies": ["127.0.0.1"],
            **hosts,
        }
        async with running_gateway(make_config(tmp_path, **public)) as gw:
            r = await gw.http.get(
                f"/sessions/{sid}", headers={**https, "X-Forwarded-Proto": "http"}
            )
            assert r.json()["ws_url"].startswith("wss://public.example.com/sessions/")


# --- the config ------------------------------------------------------------------------


@pytest.mark.parametrize("bad", ["nope", "10.0.0.0/33", "127.0.0.1 ", "localhost", "::1::2"])
def test_an_entry_that_is_not_an_address_is_a_config_error(bad: str) -> None:
    with pytest.raises(ConfigError) as error:
        load_config(None, {}, {"server.trusted_proxies": ["::1", bad]})
    assert str(error.value) == (
        "config error: command line: server.trusted_proxies[1]: "
        f"expected an IP address or network (CIDR), got {json.dumps(bad)}"
    )


def test_the_environment_is_checked_the_same_way() -> None:
    env = {"GATEWAY_SERVER_TRUSTED_PROXIES": '["127.0.0.1", "10.0.0.0/8", "::1", "x"]'}
    with pytest.raises(ConfigError, match=r"server\.trusted_proxies\[3\].*got \"x\""):
        load_config(None, env, {})
    del env["GATEWAY_SERVER_TRUSTED_PROXIES"]
    ok = load_config(None, {"GATEWAY_SERVER_TRUSTED_PROXIES": '["10.1.2.3/8", "::1"]'}, {})
    assert ok.server.trusted_proxies == ("10.1.2.3/8", "::1")


@pytest.mark.slow  # over a second on two cores (measured with --durations)
def test_a_bad_entry_in_the_file_exits_2_naming_the_key_and_the_value(tmp_path: Path) -> None:
    (tmp_path / "gw.toml").write_text('[server]\ntrusted_proxies = ["10.0.0.0/8", "nginx"]\n')
    result = run_gateway("serve", "--config", "gw.toml", cwd=tmp_path)
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == (
        "config error: gw.toml: server.trusted_proxies[1]: "
        'expected an IP address or network (CIDR), got "nginx"\n'
    )

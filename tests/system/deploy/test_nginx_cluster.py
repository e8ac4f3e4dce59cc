"""Three nodes on one Redis behind nginx (deploy/nginx/gateway-nodes.conf, docs/scale-out.md).

docs/reference.md "Command line": any number of ``gateway serve`` processes on one
Redis form one deployment, any node serves any session, and when the node
running a turn dies another closes it (docs/protocol.md §9) and takes the next.
Here every request goes through nginx, which spreads them round-robin over
three nodes (``[store] lease_s = 1``): a session, streams on all three nodes,
a tool turn sent to a node that does not run the session (forwarded to the one
that does), the whole turn on every stream, a ``since`` resume; then the node
running the session is killed with ``kill -9`` mid-turn, and through nginx:
GETs that reach the dead node are retried on another (``proxy_next_upstream``),
the survivors' clients see the turn closed with ``server_restart``, the dead
node's client resumes on a survivor, and the next turn, a new session and its
turn all work. A second test pins what the file's ``proxy_next_upstream``
re-sends: a POST that reached no node goes to the next one, a POST that
reached a node that then died is never sent to another.

The nodes and their redis-server are tests/cluster_support.py's, behind nginx
(``public_url``, ``trusted_proxies``). nginx and redis-server are Debian's,
installed by the tests if missing (tests/debian.py); a test skips, saying
why, only where they cannot be. Which node answered comes from a header the
tests add to the file's server block (``$upstream_addr``: every node nginx
tried, in order).
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import httpx
import pytest
import trio
from trio_websocket import ConnectionClosed

from gateway.protocol.events import CATALOG_TYPES, Event
from gateway.protocol.frames import SubscribeAck
from tests.cluster_support import CONFIG, Node, running_cluster
from tests.conftest import TOOL_SCRIPT, Client, free_port, types
from tests.nginx_support import (
    Nginx,
    PortTaken,
    ensure_nginx,
    nginx_serving,
    nodes_site_config,
    open_ws_from,
)
from tests.redis_support import ensure_redis_server

# slow: nginx, redis-server and gateway serve processes
pytestmark = pytest.mark.slow

NODES = 3
CLIENT_ADDRESS = "127.0.0.2"  # the clients' own address, as nginx sees them
# The test's own addition to the server block: which node(s) nginx tried, on
# every answer (the WebSocket's 101 included).
NODE_HEADER = "x-gateway-node"
SERVER_EXTRA = f"    add_header {NODE_HEADER} $upstream_addr always;"
# A turn that stays in its tool for as long as the test needs it to.
LONG_TOOL = {"script": {"rounds": [[{"tool_use": {"name": "sleep", "input": {"seconds": 60}}}]]}}


def tried(header: str) -> list[int]:
    """The ports of the nodes nginx tried, in order (``$upstream_addr``: "a:1, b:2")."""
    return [int(addr.rsplit(":", 1)[1]) for addr in header.split(", ")]


@dataclass
class Stream:
    """A stream client through nginx, and the node its upgrade reached."""

    client: Client
    node: int


@dataclass
class Cluster:
    """Three nodes on one Redis, nginx in front, an HTTP client of nginx."""

    nodes: dict[int, Node]  # the live ones, by port
    nginx: Nginx
    http: httpx.AsyncClient

    async def post(self, path: str, body: object) -> tuple[httpx.Response, list[int]]:
        r = await self.http.post(path, json=body)
        return r, tried(r.headers[NODE_HEADER])

    async def create_session(self) -> tuple[str, int]:
        """A new session and the node that created it (which runs it: it holds the lease)."""
        r, nodes = await self.post("/sessions", {})
        assert r.status_code == 201, r.text
        return str(r.json()["session_id"]), nodes[-1]

    async def submit(self, session_id: str, content: object) -> tuple[str, int]:
        """A turn sent through nginx: its id and the node nginx sent it to."""
        text = content if isinstance(content, str) else json.dumps(content)
        r, nodes = await self.post(f"/sessions/{session_id}/turns", {"content": text})
        assert r.status_code == 202, r.text
        assert len(nodes) == 1  # a POST that reached a node is never sent to another
        return str(r.json()["turn_id"]), nodes[0]

    @asynccontextmanager
    async def stream(self, session_id: str) -> AsyncIterator[Stream]:
        """GET /sessions/{id} for a ws_url (its token is valid on any node), then the upgrade."""
        r = await self.http.get(f"/sessions/{session_id}")
        assert r.status_code == 200, r.text
        url = str(r.json()["ws_url"])
        # public_url is nginx on every node: the stream comes back through it
        assert url.startswith(f"ws://127.0.0.1:{self.nginx.port}/sessions/{session_id}/stream?")
        async with open_ws_from(url, CLIENT_ADDRESS) as ws:
            headers = {k.decode().lower(): v.decode() for k, v in ws.handshake_headers}
            yield Stream(Client(ws, session_id), tried(headers[NODE_HEADER])[-1])

    def kill(self, port: int) -> None:
        """``kill -9`` of one node: no shutdown, its leases left to lapse."""
        self.nodes.pop(port).kill()


def node_config(nginx_port: int) -> str:
    """tests/cluster_support.py's node config (lease_s = 1), behind nginx on ``nginx_port``.

    ``public_url`` is nginx (every ws_url points at it), and nginx the trusted proxy.
    """
    server = '[server]\nhost = "127.0.0.1"\n'
    assert CONFIG.count(server) == 1, "cluster_support.CONFIG changed shape"
    behind = (
        f'{server}public_url = "http://127.0.0.1:{nginx_port}"\ntrusted_proxies = ["127.0.0.1"]\n'
    )
    return CONFIG.replace(server, behind)


@asynccontextmanager
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    """NODES nodes on a redis-server of their own (tests/cluster_support.py), nginx in front."""
    ensure_nginx()  # first: a skip must come before anything starts
    redis = ensure_redis_server()
    for attempt in range(3):  # free_port() is free when asked, not necessarily later
        async with AsyncExitStack() as stack:
            nginx_port = free_port()
            where = tmp_path / f"try{attempt}"
            # started (and at the end stopped with SIGTERM, exit 0 checked) in parallel
            running = stack.enter_context(
                running_cluster(redis, where, NODES, node_config(nginx_port))
            )
            nodes = {node.port: node for node in running.nodes}
            listen = f"127.0.0.1:{nginx_port}"
            site = nodes_site_config(listen, sorted(nodes), server_extra=SERVER_EXTRA)
            try:
                nginx = await stack.enter_async_context(
                    nginx_serving(where / "nginx", nginx_port, site)
                )
            except PortTaken:
                continue  # the stack stops these nodes; try another port
            http = await stack.enter_async_context(
                httpx.AsyncClient(
                    base_url=nginx.base,
                    transport=httpx.AsyncHTTPTransport(local_address=CLIENT_ADDRESS),
                )
            )
            yield Cluster(nodes, nginx, http)
            return
    raise AssertionError("three ports in a row were taken before nginx could listen")


def of_turn(events: list[Event], turn_id: str) -> list[tuple[str, str]]:
    return [(e.id, e.type) for e in events if e.turn_id == turn_id]


async def test_three_nodes_behind_nginx_and_one_killed(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with cluster(tmp_path) as c, AsyncExitStack() as streams:
            sid, owner = await c.create_session()

            # Three streams. Round-robin (one nginx worker, every node up) sends
            # each client's two requests (the GET for its token, the upgrade)
            # to the next two nodes, so the three upgrades reach three nodes.
            watchers = [await streams.enter_async_context(c.stream(sid)) for _ in range(NODES)]
            assert sorted(w.node for w in watchers) == sorted(c.nodes)
            for w in watchers:
                assert isinstance(await w.client.subscribe(), SubscribeAck)

            # A tool turn; round-robin sends it to the node after the last
            # upgrade's, which is not the owner: that node forwards it.
            turn_id, via = await c.submit(sid, TOOL_SCRIPT)
            assert via != owner
            turns = [await w.client.until_turn_ends() for w in watchers]
            turn = [e for e in turns[0] if e.turn_id == turn_id]
            assert types(turn)[:3] == ["turn.started", "route.decided", "llm.call_started"]
            assert "tool.completed" in types(turn)
            assert turn[-1].type == "turn.completed"
            # the same events, ids and order on every node (the seam rule across nodes)
            assert all(of_turn(t, turn_id) == of_turn(turn, turn_id) for t in turns)
            for w in watchers:
                assert w.client.reducer.state()["messages"][-1]["content"] == [
                    {"type": "text", "text": "All done."}
                ]

            # A `since` resume from the turn's first event, on whichever node nginx picks.
            cursor = turn[0].id
            async with c.stream(sid) as resumed:
                ack = await resumed.client.subscribe(since=cursor)
                assert isinstance(ack, SubscribeAck) and ack.replay_event_count > 0
                replay = [
                    (await resumed.client.recv()).event for _ in range(ack.replay_event_count)
                ]
            stored = [e for e in turn if e.type in CATALOG_TYPES or e.type == "message.complete"]
            assert of_turn(replay, turn_id) == of_turn(stored, turn_id)[1:]

            # A turn that waits in its tool, then kill -9 of the node running it.
            long_turn, _ = await c.submit(sid, LONG_TOOL)
            for w in watchers:
                await w.client.until(lambda e: e.type == "tool.called")
            c.kill(owner)
            survivors = [w for w in watchers if w.node != owner]
            (orphan,) = [w for w in watchers if w.node == owner]
            assert set(c.nodes) == {w.node for w in survivors}

            # GETs keep working: the one round-robin sends to the dead node is
            # retried on the next (connection refused), then the dead node is
            # left out for fail_timeout.
            seen: list[list[int]] = []
            for _ in range(NODES):
                r = await c.http.get(f"/sessions/{sid}")
                assert r.status_code == 200, r.text
                seen.append(tried(r.headers[NODE_HEADER]))
            (retried,) = [nodes for nodes in seen if owner in nodes]
            assert retried[0] == owner and retried[1] in c.nodes and len(retried) == 2

            # The survivors' clients see the interrupted turn closed (docs/protocol.md §9).
            closed = [(await w.client.until_turn_ends())[-1] for w in survivors]
            for end in closed:
                assert end.turn_id == long_turn and end.type == "turn.cancelled"
                assert end.payload.reason == "server_restart"
            assert closed[0].id == closed[1].id  # one closing, fanned out to both nodes
            # The dead node's client lost its stream; it resumes through nginx on a survivor.
            with pytest.raises(ConnectionClosed):
                while True:
                    await orphan.client.recv()
            async with c.stream(sid) as back:
                assert back.node != owner
                ack = await back.client.subscribe(since=orphan.client.events[-1].id)
                assert isinstance(ack, SubscribeAck)
                replay = [(await back.client.recv()).event for _ in range(ack.replay_event_count)]
            resumed_end = [e for e in replay if e.turn_id == long_turn]
            assert resumed_end[-1].type == "turn.cancelled"
            assert resumed_end[-1].payload.reason == "server_restart"
            assert resumed_end[-1].id == closed[0].id

            # The session's next turn runs on a survivor, sent through nginx.
            next_turn, _ = await c.submit(sid, "after the kill")
            for w in survivors:
                events = await w.client.until_turn_ends()
                assert events[-1].type == "turn.completed" and events[-1].turn_id == next_turn
                assert events[-1].id > closed[0].id  # ids increase across the failover
                assert w.client.reducer.state()["messages"][-1]["content"] == [
                    {"type": "text", "text": "You said: after the kill"}
                ]

            # A new session and its turn.
            fresh, fresh_owner = await c.create_session()
            assert fresh_owner != owner
            async with c.stream(fresh) as watcher:
                await watcher.client.subscribe()
                fresh_turn, _ = await c.submit(fresh, "hello again")
                events = await watcher.client.until_turn_ends()
            assert events[-1].type == "turn.completed" and events[-1].turn_id == fresh_turn
            assert watcher.client.reducer.state()["messages"][-1]["content"] == [
                {"type": "text", "text": "You said: hello again"}
            ]


# --- what nginx re-sends, and what it does not ------------------------------------------


async def read_request(stream: trio.SocketStream) -> bytes:
    """One whole HTTP/1.1 request from nginx (headers, then Content-Length bytes of body)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = await stream.receive_some()
        assert chunk, data
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    length = re.search(rb"(?im)^content-length:\s*(\d+)", head)
    while length and len(body) < int(length[1]):
        body += await stream.receive_some()
    return head


async def answers(stream: trio.SocketStream) -> None:
    """A node that answers: 201, then closes (it says so)."""
    await read_request(stream)
    await stream.send_all(
        b"HTTP/1.1 201 Created\r\ncontent-type: application/json\r\n"
        b"content-length: 2\r\nconnection: close\r\n\r\n{}"
    )
    await stream.aclose()


async def dies(stream: trio.SocketStream) -> None:
    """A node that dies after it received the request, before answering."""
    await read_request(stream)
    await trio.aclose_forcefully(stream)


@asynccontextmanager
async def fake_node(handler: Callable[[trio.SocketStream], Awaitable[None]]) -> AsyncIterator[int]:
    async with trio.open_nursery() as nursery:
        serve = partial(trio.serve_tcp, handler, 0, host="127.0.0.1")
        (listener,) = await nursery.start(serve)
        yield listener.socket.getsockname()[1]
        nursery.cancel_scope.cancel()


async def test_a_post_is_resent_only_when_it_reached_no_node(tmp_path: Path) -> None:
    """gateway-nodes.conf's proxy_next_upstream: a POST goes to the next node only
    if it reached none (connection refused); one that reached a node which then
    died is answered 502, never re-sent (a turn sent twice would run twice).

    The three upstreams stand for nodes caught at those moments, which a real
    node cannot be made to reproduce on demand: a port nobody listens on (a
    dead process), one that reads the request and closes, one that answers.
    """
    ensure_nginx()
    with trio.fail_after(10):
        async with fake_node(dies) as dying, fake_node(answers) as answering:
            refused = free_port()
            port = free_port()
            site = nodes_site_config(
                f"127.0.0.1:{port}", [refused, answering, dying], server_extra=SERVER_EXTRA
            )
            async with (
                nginx_serving(tmp_path / "nginx", port, site) as nginx,
                httpx.AsyncClient(base_url=nginx.base) as http,
            ):
                outcomes: list[tuple[int, list[int]]] = []
                # round-robin: within NODES + 1 POSTs both failing nodes were tried
                for _ in range(NODES + 1):
                    r = await http.post("/sessions/s/turns", json={"content": "once"})
                    outcomes.append((r.status_code, tried(r.headers[NODE_HEADER])))
            # refused: sent on to the next node, whose answer the client gets
            (resent,) = [(code, nodes) for code, nodes in outcomes if nodes[0] == refused]
            assert len(resent[1]) == 2 and resent[0] == {dying: 502, answering: 201}[resent[1][1]]
            # reached a node that died: 502, and no other node tried after it
            died = [(code, nodes) for code, nodes in outcomes if dying in nodes]
            assert died and all(code == 502 and nodes[-1] == dying for code, nodes in died)
            assert all(code == 201 for code, nodes in outcomes if nodes[-1] == answering)

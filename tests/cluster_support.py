"""Several ``gateway serve`` nodes on one Redis, for the cluster tests.

docs/reference.md "Command line": with ``[store] backend = "redis"`` any number of
``gateway serve`` processes naming the same Redis form one deployment. This
harness runs exactly that, for real:

- one redis-server of the test module's own (:class:`tests.redis_support.RedisServer`);
- N ``gateway serve`` SUBPROCESSES on it (:class:`Cluster`), started in
  parallel, each on a port of its own (``tests.conftest.free_port``), each
  with its own working directory and log file, every ``GATEWAY_*`` variable
  of the shell stripped (each is a config key). A node is ready when its
  ``GET /readyz`` answers 200. Config: the scripted model, ``lease_s`` = 1 s
  (a dead node's sessions are free within a second: failover is quick),
  ``read_file`` waits for approval (a turn can stop at the seam), JSON logs;
- a node can be killed (``kill -9``: what a crash leaves) or stopped
  (``SIGTERM``: docs/reference.md's graceful shutdown), and more started;
- a client side per test (:func:`peers`): an httpx client per node
  (:class:`Peer`) and trio-websocket streams (:meth:`Peer.watch`) that attach
  through the node's own ``GET /sessions/{id}`` (``ws_url`` with the token),
  subscribe (live, ``since`` or snapshot: docs/protocol.md §3) and collect the
  event frames in the background (:class:`Watch`).

The processes are started by synchronous fixtures (outside any Trio run), so
one cluster serves every test of a module; each test brings its own clients.
Every wait here is on the real clock (processes, Redis's TTLs, real sockets:
nothing Trio's clock can drive), so the modules that use it are marked slow.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import msgspec
import trio
from trio_websocket import ConnectionClosed

from gateway.client import Reducer
from gateway.client.attach import open_websocket as open_ws
from gateway.ids import format_event_id
from gateway.protocol.events import CATALOG_TYPES, Event
from gateway.protocol.frames import Ping, Snapshot, SubscribeAck
from tests.conftest import Client, free_port
from tests.redis_support import RedisServer

LEASE_S = 1.0
START_TIMEOUT_S = 30.0  # 2 cores, N Python processes importing at once
FIRST_ID = format_event_id(0)  # ``since`` this: every event of the session, replayed
ENDS = ("turn.completed", "turn.cancelled")

CONFIG = """\
[server]
host = "127.0.0.1"
port = {port}
shutdown_grace_s = 2.0
[store]
backend = "redis"
url = "{url}"
lease_s = {lease_s}
[model]
provider = "scripted"
[sessions]
workspace_root = "{workdir}/workspaces"
allowed_workspaces = ["{workdir}"]
[tools]
enabled = ["sleep", "read_file", "delegate"]
require_approval = ["read_file"]
[log]
format = "json"
"""


# --- the processes -------------------------------------------------------------------


@dataclass
class Node:
    """One ``gateway serve`` process of the cluster."""

    name: str
    workdir: Path
    port: int
    proc: subprocess.Popen[bytes]

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log(self) -> Path:
        return self.workdir / "gateway.log"

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def log_events(self) -> list[dict[str, Any]]:
        """Its JSON log lines (``[log] format = "json"``)."""
        lines = self.log_text().splitlines()
        return [json.loads(line) for line in lines if line.startswith("{")]

    def kill(self) -> None:
        """``kill -9``: no shutdown, no lease released, nothing flushed that was not."""
        if self.alive:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def terminate(self) -> None:
        """Send ``SIGTERM`` once (a second one, during the shutdown, kills the process)."""
        if self.alive:
            self.proc.send_signal(signal.SIGTERM)

    def wait(self, timeout: float = 10.0) -> int:
        """Its exit status, once it exited (killed if it takes longer than ``timeout``)."""
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"{self.name} did not exit within {timeout} s") from None

    def stop(self, timeout: float = 10.0) -> int:
        """``SIGTERM`` (docs/reference.md "Command line"): returns the exit status (0)."""
        self.terminate()
        return self.wait(timeout)

    def __repr__(self) -> str:
        return f"<node {self.name} :{self.port} {'alive' if self.alive else 'dead'}>"


class Cluster:
    """``gateway serve`` nodes on one redis-server (module docstring)."""

    def __init__(self, redis: RedisServer, workdir: Path, config: str = CONFIG) -> None:
        self.redis = redis
        self.workdir = workdir
        self.config = config
        self.nodes: list[Node] = []  # every node started, in order, dead ones included
        self._booting: dict[str, Node] = {}  # started, not yet ready
        self._names = iter(f"n{i}" for i in range(1000))

    @property
    def live(self) -> list[Node]:
        return [n for n in self.nodes if n.alive]

    def ensure(self, count: int) -> list[Node]:
        """At least ``count`` live nodes: the first ``count``.

        Nodes still booting (:meth:`boot`) are waited for; missing ones are
        started, in parallel.
        """
        self.boot(max(count - len(self.live) - len(self._booting), 0))
        self._wait_booted()
        return self.live[:count]

    def start(self, count: int) -> list[Node]:
        """Start ``count`` nodes at once; return them once each answers ``/readyz``."""
        names = self.boot(count)
        self._wait_booted()
        return [n for n in self.nodes if n.name in names]

    def boot(self, count: int) -> list[str]:
        """Start ``count`` nodes without waiting: they boot while a test goes on."""
        names = [next(self._names) for _ in range(count)]
        for name in names:
            self._booting[name] = self._spawn(name)
        return names

    def _wait_booted(self) -> None:
        """Until every booting node answers; on a failure no node is left running.

        The nodes that came up join :attr:`nodes` whatever happens (the
        cluster's teardown stops them); the ones still booting are killed.
        """
        pending = self._booting
        ready: list[Node] = []
        deadline = time.monotonic() + START_TIMEOUT_S
        try:
            with httpx.Client(timeout=1.0) as http:
                while pending:
                    if time.monotonic() > deadline:
                        logs = "\n".join(f"{n.name}:\n{n.log_text()}" for n in pending.values())
                        raise AssertionError(f"nodes not ready in {START_TIMEOUT_S} s:\n{logs}")
                    for name, node in list(pending.items()):
                        if not node.alive:
                            text = node.log_text()
                            if "address already in use" not in text:
                                del pending[name]
                                raise AssertionError(f"{name} exited at start:\n{text}")
                            pending[name] = self._spawn(name)  # free_port raced: another port
                        elif _ready(http, node):
                            ready.append(pending.pop(name))
                    time.sleep(0.02)  # real clock: the nodes are processes booting in real time
        finally:
            for node in pending.values():
                node.kill()
            pending.clear()
            self.nodes += sorted(ready, key=lambda n: int(n.name[1:]))  # in the order booted

    def _spawn(self, name: str) -> Node:
        workdir = self.workdir / name
        workdir.mkdir(parents=True, exist_ok=True)
        port = free_port()
        config = self.config.format(
            port=port, url=self.redis.url, lease_s=LEASE_S, workdir=self.workdir
        )
        (workdir / "gateway.toml").write_text(config)
        # Every GATEWAY_* variable is a config key: the shell's must not reach the node.
        env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
        with (workdir / "gateway.log").open("wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "gateway", "serve", "--config", "gateway.toml"],
                cwd=workdir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,  # its one line (the readiness line); /readyz says it
                stderr=log,
            )
        return Node(name, workdir, port, proc)

    def close(self) -> dict[str, int]:
        """SIGTERM every live node at once, then wait for each (kill what hangs).

        Returns the exit status of each node it stopped (docs/reference.md: 0). A
        node still booting is killed (SIGTERM before its handlers would say
        nothing of the gateway).
        """
        for node in self._booting.values():
            node.kill()
        self._booting.clear()
        stopping = self.live
        for node in stopping:
            node.proc.send_signal(signal.SIGTERM)
        statuses = {}
        for node in stopping:
            try:
                statuses[node.name] = node.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                node.kill()
                statuses[node.name] = -signal.SIGKILL
        return statuses

    def logs(self) -> str:
        """Every node's log, for a failure message."""
        return "\n".join(f"--- {n!r}\n{n.log_text()}" for n in self.nodes)


def _ready(http: httpx.Client, node: Node) -> bool:
    try:
        return http.get(f"{node.base}/readyz").status_code == 200
    except httpx.TransportError:
        return False


@contextmanager
def running_cluster(
    redis_binary: str, workdir: Path, nodes: int, config: str = CONFIG
) -> Iterator[Cluster]:
    """A redis-server of its own and ``nodes`` gateways on it; everything stopped after."""
    redis = RedisServer(redis_binary, workdir / "redis")
    redis.start()
    cluster = Cluster(redis, workdir, config)
    try:
        cluster.start(nodes)
        yield cluster
        statuses = cluster.close()
        failed = {name: status for name, status in statuses.items() if status != 0}
        assert not failed, f"SIGTERM did not stop these with 0: {failed}\n{cluster.logs()}"
    finally:
        cluster.close()
        redis.stop()


# --- the clients ---------------------------------------------------------------------


class Watch:
    """One WebSocket client of one node, receiving every frame in the background.

    ``events`` grows as frames arrive (the reference reducer folds them too:
    ``client.reducer``); :meth:`until` waits for one. ``closed`` is the close
    the server sent, once it did.
    """

    def __init__(self, node: Node, client: Client, ack: SubscribeAck) -> None:
        self.node = node
        self.client = client
        self.ack = ack
        self.snapshot: Snapshot | None = None
        self.closed: ConnectionClosed | None = None
        self._cursor = 0  # :meth:`until` looks at events from here on
        self._arrived = trio.Event()

    @property
    def events(self) -> list[Event]:
        return self.client.events

    @property
    def ids(self) -> list[str]:
        return [e.id for e in self.events]

    async def receive(self) -> None:
        """Collect frames until the connection closes (answering the server's pings)."""
        try:
            while True:
                frame = await self.client.recv()
                if isinstance(frame, Ping):
                    await self.client.send({"type": "pong", "nonce": frame.nonce})
                self._wake()
        except ConnectionClosed as closed:
            self.closed = closed
            self._wake()

    def _wake(self) -> None:
        self._arrived.set()
        self._arrived = trio.Event()

    async def until(self, done: Callable[[Event], bool]) -> list[Event]:
        """The events from the last :meth:`until` on, up to the first that satisfies ``done``."""
        while True:
            for i in range(self._cursor, len(self.events)):
                if done(self.events[i]):
                    got, self._cursor = self.events[self._cursor : i + 1], i + 1
                    return got
            self._cursor = len(self.events)
            if self.closed is not None:
                raise AssertionError(
                    f"{self.node.name} closed the stream ({self.closed.reason}) before the"
                    f" event waited for; got {[e.type for e in self.events]}"
                )
            await self._arrived.wait()

    async def seen(self, done: Callable[[Event], bool]) -> Event:
        """The first event, received already or not yet, that satisfies ``done``."""
        for e in self.events:
            if done(e):
                return e
        return (await self.until(done))[-1]

    async def until_type(self, *kinds: str) -> list[Event]:
        return await self.until(lambda e: e.type in kinds)

    async def until_turn_ends(self, turn_id: str | None = None) -> list[Event]:
        return await self.until(
            lambda e: e.type in ENDS and (turn_id is None or e.turn_id == turn_id)
        )

    async def turn(self, turn_id: str) -> list[Event]:
        """Once the turn has ended: its events, from ``turn.started`` to its end."""
        await self.until_turn_ends(turn_id)
        return of_turn(self.events, turn_id)

    async def until_closed(self) -> ConnectionClosed:
        while self.closed is None:
            await self._arrived.wait()
        return self.closed


@dataclass
class Peer:
    """A client's view of one node: its HTTP API (one httpx client) and its streams."""

    node: Node
    http: httpx.AsyncClient

    @property
    def name(self) -> str:
        return self.node.name

    async def create_session(self, **body: Any) -> str:
        r = await self.http.post("/sessions", json=body)
        assert r.status_code == 201, f"{self.name}: {r.status_code} {r.text}"
        return str(r.json()["session_id"])

    async def ws_url(self, session_id: str) -> str:
        """``GET /sessions/{id}`` on this node: the ``ws_url`` with a fresh attach token."""
        r = await self.http.get(f"/sessions/{session_id}")
        assert r.status_code == 200, f"{self.name}: {r.status_code} {r.text}"
        return str(r.json()["ws_url"])

    async def post_turn(self, session_id: str, content: Any) -> httpx.Response:
        text = content if isinstance(content, str) else json.dumps(content)
        return await self.http.post(f"/sessions/{session_id}/turns", json={"content": text})

    async def submit(self, session_id: str, content: Any) -> str:
        """Submit a turn here; it must be accepted (202): its turn id."""
        r = await self.post_turn(session_id, content)
        assert r.status_code == 202, f"{self.name}: {r.status_code} {r.text}"
        return str(r.json()["turn_id"])

    async def cancel(self, session_id: str, turn_id: str, reason: str = "enough") -> httpx.Response:
        return await self.http.post(
            f"/sessions/{session_id}/turns/{turn_id}/cancel", json={"reason": reason}
        )

    async def decide(self, session_id: str, perm_id: str, decision: str) -> httpx.Response:
        return await self.http.post(
            f"/sessions/{session_id}/permissions/{perm_id}", json={"decision": decision}
        )

    @asynccontextmanager
    async def watch(
        self,
        session_id: str,
        *,
        since: str | None = None,
        snapshot: bool = False,
        filter: Any = "preset:full",
        reducer: Reducer | None = None,
    ) -> AsyncIterator[Watch]:
        """Attach to the session through this node, subscribe, and collect in the background.

        The ack (and the snapshot, when asked) are read before this yields:
        what comes after is the replay, then live events (docs/protocol.md §3).
        Leaving the block closes the connection (a client that goes away).
        ``reducer``: the one a reconnecting client had (its view carries on).
        """
        url = await self.ws_url(session_id)
        assert url.startswith(f"ws://127.0.0.1:{self.node.port}/"), url
        async with open_ws(url) as ws:
            client = Client(ws, session_id)
            if reducer is not None:
                client.reducer = reducer
            ack = await client.subscribe(filter=filter, since=since, snapshot=snapshot)
            assert isinstance(ack, SubscribeAck), f"{self.name}: {ack}"
            watch = Watch(self.node, client, ack)
            if snapshot:
                frame = await client.recv()
                assert isinstance(frame, Snapshot), frame
                watch.snapshot = frame
            async with trio.open_nursery() as nursery:
                nursery.start_soon(watch.receive, name=f"watch {self.name}")
                try:
                    yield watch
                finally:
                    nursery.cancel_scope.cancel()

    async def replay(
        self, session_id: str, since: str = FIRST_ID, filter: Any = "preset:full"
    ) -> list[Event]:
        """Every event a ``since`` subscribe on this node replays (then the client leaves)."""
        async with self.watch(session_id, since=since, filter=filter) as w:
            count = w.ack.replay_event_count
            with trio.fail_after(10):  # real clock: the node is a process on a real socket
                while len(w.events) < count:
                    await w.until(lambda e: True)
            return w.events[:count]


@asynccontextmanager
async def peers(nodes: Sequence[Node]) -> AsyncIterator[list[Peer]]:
    """A :class:`Peer` of each node for one test (its httpx clients closed after)."""
    async with AsyncExitStack() as stack:
        out = []
        for node in nodes:
            http = await stack.enter_async_context(
                httpx.AsyncClient(base_url=node.base, timeout=10.0)
            )
            out.append(Peer(node, http))
        yield out


# --- checks ------------------------------------------------------------------------


def leaf(error: BaseException) -> BaseException:
    """The first error inside nested exception groups (a dozen open streams nest that deep)."""
    while isinstance(error, BaseExceptionGroup):
        error = error.exceptions[0]
    return error


def assert_increasing(events: Sequence[Event], what: str = "events") -> None:
    """Ids strictly increasing: no event twice, none out of order (docs/protocol.md §3)."""
    for i in range(1, len(events)):
        if not events[i - 1].id < events[i].id:
            around = [
                (e.id, e.type, e.session_id, str(msgspec.to_builtins(e.payload))[:120])
                for e in events[max(i - 3, 0) : i + 3]
            ]
            raise AssertionError(f"{what}: ids not strictly increasing at {i}: {around}")


def catalog(events: Sequence[Event]) -> list[Event]:
    return [e for e in events if e.type in CATALOG_TYPES]


def of_turn(events: Sequence[Event], turn_id: str) -> list[Event]:
    """The slice of a stream from the turn's ``turn.started`` to its end, inclusive."""
    starts = [i for i, e in enumerate(events) if e.type == "turn.started" and e.turn_id == turn_id]
    assert starts, f"no turn.started of {turn_id} in {[(e.type, e.turn_id) for e in events]}"
    ends = [
        i
        for i, e in enumerate(events)
        if i >= starts[0] and e.type in ENDS and e.turn_id == turn_id
    ]
    return list(events[starts[0] : (ends[0] if ends else len(events) - 1) + 1])


def wire(events: Sequence[Event]) -> list[tuple[str, str, str | None, str, Any]]:
    """What a client compares of each event: id, type, turn, actor, payload."""
    return [(e.id, e.type, e.turn_id, e.actor, msgspec.to_builtins(e.payload)) for e in events]

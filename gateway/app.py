"""The daemon: one listener, the node, and graceful shutdown (docs/reference.md "Command line").

Task tree::

    gateway               Gateway.run
    ├── tool-reaper       keeps the watchdog of tool processes (gateway.tools.process)
    ├── node              gateway.node.Node.run (store writer, retention, sessions)
    └── http              the listener's accept loop
        └── conn <peer>   one per accepted socket: keep-alive HTTP or one WebSocket

At start-up the workspace root (``[sessions] workspace_root``) is made if
missing, mode 0700 (gateway.tools.workspace); a root that cannot be made is a
one-line start-up failure. The ``tool-reaper`` task outlives the node: it is
stopped once the sessions (and the tool processes they ran) are.

Shutdown, on SIGTERM/SIGINT or :meth:`Gateway.shutdown`: stop being ready
(``GET /readyz`` answers 503 ``draining``) and refuse new turns, cancel
in-flight turns with ``reason: "shutdown"`` (each emits its cancellation
sequence, which clients still receive), then stop accepting, close every
WebSocket with 1001, stop the sessions, flush and close the store. All within
``shutdown_grace_s`` per step; the process then exits 0. The listener stays
open while the turns are drained, so a load balancer's probe gets the 503
rather than a refused connection; a stream attached meanwhile is closed with
1001 at once (gateway.doors.websocket.connection).

Logging is set up once, here (:func:`serve`), from ``[log]`` (gateway.logs):
its writer thread lives as long as :func:`serve`, which stops it (what is
queued written, for at most ``gateway.logs.STOP_TIMEOUT_S``) when it returns or
raises, a start-up failure included.

SIGHUP re-reads ``[auth] api_keys_file`` (gateway.tenancy): keys added
are accepted and keys removed refused from the next request on; a file that
became unreadable keeps the keys loaded before and logs an error. It also
re-reads every agent's ``system_file`` (gateway.agents, docs/protocol.md §11): the
next model call of every session of that agent sends the new prompt.
"""

from __future__ import annotations

import gc
import logging
import os
import re
import signal
import socket
import sys
from typing import Any

import trio

from gateway.config import Config
from gateway.doors import a2a, agui, aisdk, rest, sse, websocket
from gateway.doors.context import DoorContext, DoorType
from gateway.errors import StartupError, StoreError
from gateway.http.boundary import Boundary, caller_of, warn_open_hosts
from gateway.http.router import Router
from gateway.http.server import HttpLimits, LargeBody, Request, TrustedProxies, serve_connection
from gateway.logs import configure, event, json_line
from gateway.logs import stop as stop_log
from gateway.mcp.servers import McpServers
from gateway.metrics import GC_PAUSES
from gateway.node import Node
from gateway.node.registry import pinning
from gateway.node.unloading import limit_allocator_arenas
from gateway.providers.base import Provider
from gateway.providers.factory import Providers, make_providers
from gateway.store import open_store
from gateway.tenancy import ApiKeys
from gateway.tools.builtin import build_registry
from gateway.tools.process import ToolProcesses
from gateway.tools.workspace import Workspaces

log = logging.getLogger("gateway")

DOORS: tuple[DoorType, ...] = (
    rest.Door,
    websocket.Door,
    sse.Door,
    agui.Door,
    aisdk.Door,
    a2a.Door,
)
"""The doors, registered: each its routes and state, built from one
:class:`~gateway.doors.context.DoorContext`; their order is the API document's
(docs/architecture.md, "Adding a door")."""


class Gateway:
    """A running daemon: :meth:`run` under a nursery, :meth:`shutdown` to stop it."""

    def __init__(self, config: Config, provider: Provider | Providers | None = None) -> None:
        self.config = config
        workspaces = Workspaces.from_config(config.sessions)
        try:
            workspaces.ensure_root()  # at start-up, once (docs/protocol.md §15)
        except OSError as exc:
            raise StartupError(
                f"[sessions] workspace_root {workspaces.root!r} cannot be made: {exc.strerror}"
            ) from None
        self.processes = ToolProcesses(config.tools)
        self.node = Node(
            config,
            open_store(config.store),
            provider or make_providers(config),
            build_registry(config.tools.enabled, workspaces=workspaces, processes=self.processes),
        )
        self.node.processes = self.processes  # a claude-code agent's CLI (gateway.runtimes)
        self.mcp = self.node.mcp = McpServers(config, self.processes, self.node.metrics)
        s = config.server
        self.keys = ApiKeys(config.auth)  # StartupError: an unreadable api_keys_file
        self.limits = HttpLimits(
            max_body_bytes=s.max_body_bytes,
            large_bodies=large_bodies(config),
            body_timeout_s=s.body_timeout_s,
            admit_large=self._admit_large,
            max_header_bytes=s.max_header_bytes,
            read_timeout_s=s.read_timeout_s,
            keepalive_timeout_s=s.keepalive_timeout_s,
            max_client_frame_bytes=config.stream.max_client_frame_bytes,
            trusted_proxies=TrustedProxies.parse(s.trusted_proxies),
        )
        self.port = 0
        self._accepting = trio.CancelScope()
        self._connections = trio.CancelScope()
        self._stopped = trio.Event()

    def _admit_large(self, head: Request) -> None:
        """A large body's Host, Origin and key, checked from its head before it is read
        (HttpLimits; docs/protocol.md §2 "Files"), in the router's order (§15): a page of
        another site is refused before its upload is read, as a keyless client is."""
        boundary = self.router.boundary
        boundary.check_host(head.headers.get("host"))  # 421
        boundary.check_origin(head.headers.get("origin"), head.scheme, head.headers.get("host"))
        caller_of(self.keys, head.headers)  # 401, 403

    async def run(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until :meth:`shutdown`; ``task_status`` receives the bound port."""
        s = self.config.server
        async with trio.open_nursery() as outer:
            await outer.start(self.processes.run, name="tool-reaper")
            # MCP servers: stdio ones are tool processes; stopped after the sessions are.
            await outer.start(self.mcp.run, name="mcp-servers")
            async with trio.open_nursery() as nursery:
                _ = self.router  # the doors, before the node's first event (A2A's push)
                await nursery.start(self.node.run, name="node")
                listeners = await trio.open_tcp_listeners(s.port, host=s.host)
                self.port = listeners[0].socket.getsockname()[1]
                async with trio.open_nursery() as conns:
                    conns.start_soon(self._accept, listeners, conns, name="http")
                    task_status.started(self.port)
                    await self._stopped.wait()
                    await self._close_everything(conns)
                self.node.stop()
            outer.cancel_scope.cancel()  # the sessions and their tool processes are stopped

    async def _accept(self, listeners: list[Any], conns: trio.Nursery) -> None:
        with self._accepting:
            await trio.serve_listeners(self._serve_one, listeners, handler_nursery=conns)

    async def _serve_one(self, stream: trio.SocketStream) -> None:
        sock = stream.socket
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.config.server.send_buffer_bytes:
            sock.setsockopt(
                socket.SOL_SOCKET, socket.SO_SNDBUF, self.config.server.send_buffer_bytes
            )
        try:
            host, port = sock.getpeername()[:2]
            peer = f"{host}:{port}"
        except OSError:
            peer = ""
        await serve_connection(stream, self.router, self.limits, client=peer)

    @property
    def router(self) -> Router:
        """The HTTP API: the registered doors' routes (:data:`DOORS`), built on first use."""
        router: Router | None = getattr(self, "_router", None)
        if router is None:
            router = self._router = open_doors(self.node, self.keys, DOORS)
        return router

    def shutdown(self) -> None:
        """Begin a graceful shutdown; :meth:`run` returns when it is done."""
        self._stopped.set()

    async def _close_everything(self, conns: trio.Nursery) -> None:
        grace = self.config.server.shutdown_grace_s
        # Not ready from now on (/readyz 503, no new turns); still listening
        # while the turns in flight are closed (module docstring).
        self.node.shutting_down = True
        await self.node.drain_turns()
        self._accepting.cancel()
        for conn in list(self.node.connections):
            conn.request_close("shutdown")
        with trio.move_on_after(grace):
            while self.node.connections:
                await self.node.changed()
        conns.cancel_scope.cancel()


def large_bodies(config: Config) -> tuple[LargeBody, ...]:
    """The routes that take bodies over ``[server] max_body_bytes`` (docs/protocol.md §2
    "Files"): a file, up to ``[files] max_bytes``; a turn of the REST, AG-UI and AI SDK
    doors, whose files may come inline as base64, up to one such file more."""
    inline = config.server.max_body_bytes + -(-config.files.max_bytes * 4 // 3)
    return (
        LargeBody(re.compile(r"/sessions/[^/]+/files"), config.files.max_bytes, "file_too_large"),
        *(
            LargeBody(re.compile(path), inline, "body_too_large")
            for path in (r"/sessions/[^/]+/turns", r"/agui", r"/ai-sdk/chat", r"/a2a")
        ),
    )


def open_doors(node: Node, keys: ApiKeys, doors: tuple[DoorType, ...] = DOORS) -> Router:
    """The router over ``doors``, each built from one context over ``node`` and ``keys``."""
    ctx = DoorContext(node, keys)
    built = [door(ctx) for door in doors]
    router = Router(
        [route for door in built for route in door.routes],
        boundary=Boundary(node.config),
        keys=keys,
        metrics=node.metrics,
        hold=pinning,
    )
    ctx.documented = router.documented
    return router


async def serve(config: Config, provider: Provider | Providers | None = None) -> None:
    """``gateway serve``: run until SIGTERM or SIGINT, print the readiness line.

    SIGHUP re-reads the API keys file and the agents' system files (module docstring).

    Raises:
        StartupError: the daemon could not start (possibly inside an exception group).
    """
    limit_allocator_arenas()  # before the first thread (gateway.node.unloading)
    configure(config.log)  # the log's writer thread: until serve returns (module docstring)
    try:
        with GC_PAUSES.installed():  # gateway_gc_pause_seconds
            await _serve(config, provider)
    finally:
        stop_log()


async def _serve(config: Config, provider: Provider | Providers | None) -> None:
    try:
        gateway = Gateway(config, provider)
    except StoreError as exc:
        raise StartupError(exc.message) from None
    async with trio.open_nursery() as nursery:
        stops = (signal.SIGTERM, signal.SIGINT)
        with trio.open_signal_receiver(*stops, signal.SIGHUP) as signals:
            try:
                port = await nursery.start(gateway.run, name="gateway")
            except Exception as exc:  # nothing is serving yet: say why in one line
                line = startup_failure(exc, config.server.host, config.server.port)
                if line is None:
                    raise
                raise StartupError(line) from None
            # Everything the daemon imported and built to start (some 52,000 objects)
            # lives as long as it does: out of the collector's reach, so that a full
            # collection (a connection storm makes them) scans only what came since
            # (docs/operating.md "Garbage collection").
            gc.freeze()
            url = f"http://{config.server.host}:{port}"
            if config.log.format == "json":  # the listening line is the gateway_started record
                started = json_line(
                    logging.INFO, "gateway_started", f"listening on {url}",
                    host=config.server.host, port=port,
                )  # fmt: skip
                print(started, flush=True)
            else:
                print(f"gateway listening on {url}", flush=True)
            warn_open_hosts(config)  # bound beyond loopback, allowed_hosts empty
            event(
                log, logging.INFO, "gateway_started", f"listening on {url}",
                host=config.server.host, port=port,
            )  # fmt: skip
            async for signum in signals:
                if signum not in stops:  # SIGHUP: re-read api_keys_file and system_file
                    await gateway.keys.reload()
                    gateway.node.agents.reload()
                    continue
                name = signal.Signals(signum).name
                event(
                    log, logging.INFO, "shutdown_started", f"received {name}: shutting down",
                    signal=name,
                )  # fmt: skip
                gateway.shutdown()
                break
    event(log, logging.INFO, "gateway_stopped", "stopped")
    sys.stdout.flush()


def startup_failure(exc: BaseException, host: str, port: int) -> str | None:
    """The one line for a start-up failure an operator fixes, or None for anything else.

    Nurseries wrap what failed in exception groups: the line is the first
    leaf's, provided every leaf is such a failure (a store that cannot be
    opened, an address that cannot be listened on).
    """
    leaves: list[BaseException] = []
    stack = [exc]
    while stack:
        error = stack.pop()
        if isinstance(error, BaseExceptionGroup):
            stack.extend(reversed(error.exceptions))
        else:
            leaves.append(error)
    lines: list[str] = []
    where = f"cannot listen on {host}:{port}"
    for leaf in leaves:
        if isinstance(leaf, StoreError):
            lines.append(leaf.message)
        elif isinstance(leaf, socket.gaierror):
            lines.append(f"{where}: {host!r} is not a usable address ({leaf.strerror})")
        elif isinstance(leaf, OSError) and leaf.errno is not None:
            reason = os.strerror(leaf.errno).lower()
            lines.append(f"{where}: {reason}")
        else:
            return None
    return lines[0] if lines else None

"""MCP server connections, supervised (docs/protocol.md §11, docs/reference.md "MCP servers").

:class:`McpServers` is the node's: its ``mcp-servers`` task owns one
:class:`McpConnection` per ``scope = "node"`` server (shared by every session)
and, between :meth:`McpServers.open_session` and
:meth:`McpServers.close_session`, one per ``scope = "session"`` server and
session, run in that session's workspace. Each connection is the ``mcp``
SDK's ``ClientSession`` over one of two transports:

- **stdio**: the server is a tool process (gateway.tools.process): spawned by
  ``ToolProcesses.spawn`` (minimal environment plus the server's ``env``, its
  own process group, the rlimits, registered with the watchdog, so it dies
  with the daemon, kill -9 included) and stopped by ``ToolProcesses.stop``
  after its stdin is closed (MCP's shutdown order). The framing is
  gateway.mcp.stdio, on the process's pipes; the SDK's own spawn is not used.
- **streamable HTTP**: the SDK's ``streamable_http_client`` with an HTTP
  client carrying the server's ``headers``.

Connections start eagerly (node servers when the task starts, session servers
at ``open_session``), so their tools are listed before a turn needs them. A
server that cannot start (a wrong command, an unreachable URL, no answer
within ``startup_timeout_s``), dies, or whose transport breaks, is logged
(``mcp_server_failed``, with ``server`` and ``error``) and counted
(``gateway_mcp_server_failures_total{server}``); its calls fail meanwhile
(``tool.failed`` ``error``), nothing else does. It is started again on its next
use (a call, or a listing of the session's tools), with backoff: at once after
a connection that had come up, else after 1, 2, 4 ... 30 s while it keeps
failing to start. Its tools stay listed (the last list it gave) while it is down.

A call (:meth:`McpConnection.call`) waits at most ``tool_timeout_s``
(``timeout``); a trio cancel of it (the turn's cancel, or the timeout) makes
the SDK send ``notifications/cancelled`` with the request's id before the
cancel goes on (checked by the tests: the server sees it). A server's
question during a call (``elicitation/create``) is gateway.mcp.questions's.
"""

from __future__ import annotations

import logging
import math
import os
import subprocess
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import AsyncExitStack, asynccontextmanager, suppress
from typing import Any

import httpx2
import mcp_types as types
import pydantic
import trio
from mcp.client._transport import TransportStreams
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from gateway.agents import AgentProfile
from gateway.config import Config, McpServerConfig
from gateway.errors import ToolError
from gateway.logs import event
from gateway.mcp.questions import Questions
from gateway.mcp.stdio import stdio_streams
from gateway.mcp.tools import MAX_TOOLS, McpTool, adapt_tools, map_result
from gateway.metrics import Metrics
from gateway.tools.process import ToolProcesses
from gateway.tools.registry import SessionTools, ToolContext, ToolOutput, ToolRegistry

log = logging.getLogger("gateway.mcp")

BACKOFF_S = (1.0, 2.0, 4.0, 8.0, 16.0, 30.0)
"""The wait before the next start, by consecutive failures (the last repeats).

None after a connection that had come up and was lost: its next use starts it at once."""

STDIN_CLOSE_GRACE_S = 1.0
"""After its stdin closes, how long a stdio server has to exit before SIGTERM (MCP's order)."""

MAX_TOOL_PAGES = 100
"""``tools/list`` pages followed at most (a server that pages forever cannot hang a start)."""

RELIST_INTERVAL_S = 1.0
"""The least time between two ``tools/list`` of one server after ``list_changed`` notices.

A server that sends ``notifications/tools/list_changed`` in a loop got one
listing task per notice, all at once (thousands of requests, each list adapted
in the daemon's thread); now one listing runs at a time, notices meanwhile
coalesce into one more, at most once a second."""


GARBAGE_LOG_INTERVAL_S = 10.0
"""The least time between two warnings of one server's stdout lines that are not JSON-RPC.

A server that prints its own chatter on stdout (a stray ``print``) sent one
warning, three lines long, per line: 20,000 lines took 4 s of the daemon's
thread and flooded its log. The first is logged; then one line per interval
says how many more there were."""

_STDERR_TAIL = 2000


class ConnectionLost(Exception):
    """The server went away (its process exited, its transport broke)."""


class McpConnection:
    """One supervised connection to one MCP server (module docstring)."""

    def __init__(
        self,
        name: str,
        config: McpServerConfig,
        owner: McpServers,
        *,
        session_id: str | None = None,
        cwd: str = "",
    ) -> None:
        self.name = name
        self.config = config
        self.session_id = session_id  # a session-scope server's session
        self.cwd = cwd or config.cwd or os.getcwd()
        self.tools: dict[str, McpTool] = {}  # the last list it gave, by gateway name
        self.pid: int | None = None  # a stdio server's process, while it runs
        self._owner = owner
        self._session: ClientSession | None = None
        self._starting: trio.Event | None = None  # set once the start in progress is over
        self._scope: trio.CancelScope | None = None
        self._dead: trio.Event | None = None  # set when the live connection is lost
        self._closed = False
        self._failures = 0  # consecutive, since it last came up
        self._retry_at = -math.inf
        self._last_error = ""
        self._calls: dict[object, ToolContext] = {}  # in flight, oldest first
        self._questions = Questions(name, self._calls)  # a server's questions during calls
        self._stderr = b""
        self._nursery: trio.Nursery | None = None  # the live connection's helper tasks
        self._relisting = False  # a listing task runs (RELIST_INTERVAL_S)
        self._relist_again = False  # a list_changed came while it ran
        self._garbage = 0  # lines not JSON-RPC since the last warning (GARBAGE_LOG_INTERVAL_S)
        self._garbage_logged_at = -math.inf

    @property
    def live(self) -> bool:
        return self._session is not None

    @property
    def starting(self) -> trio.Event | None:
        return self._starting

    def busy(self, session_id: str) -> bool:
        """Whether it is starting, or a call of the session is in flight on it."""
        starting = self._starting is not None and self._session is None
        return starting or any(c.session_id == session_id for c in self._calls.values())

    # --- starting and stopping ------------------------------------------------------

    def start_soon(self) -> None:
        """Start the connection if it is down and its backoff is over; never waits."""
        if self._closed or self._session is not None or self._starting is not None:
            return
        if trio.current_time() < self._retry_at:
            return
        nursery = self._owner.nursery
        if nursery is None:
            return
        self._starting = trio.Event()
        nursery.start_soon(self._serve, self._starting, name=f"mcp-server {self.name}")

    async def ensure(self) -> ClientSession:
        """The live session, started if need be.

        Raises:
            ToolError: ``error``, the server is down (and why) or failed to start.
        """
        if self._session is None:
            self.start_soon()
            if self._starting is not None:
                await self._starting.wait()
        if self._session is None:
            raise ToolError("error", self.unavailable())
        return self._session

    def unavailable(self) -> str:
        """Why the server is down, and when it is started again (a ``tool.failed`` message)."""
        wait = self._retry_at - trio.current_time()
        retry = f"; it is started again in {wait:.0f} s" if wait > 0 else ""
        state = "is stopped" if self._closed else f"is unavailable: {self._last_error}"
        return f"MCP server {self.name!r} {state}{retry}"

    def stop(self) -> None:
        """Stop the connection for good (its session closed, or the daemon stops)."""
        self._closed = True
        if self._scope is not None:
            self._scope.cancel()

    async def _serve(self, starting: trio.Event) -> None:
        """The connection's task: connect, list, then hold the connection until it is lost."""
        self._scope = scope = trio.CancelScope()
        if self._closed:
            scope.cancel()
        dead = self._dead = trio.Event()
        came_up = False
        try:
            with scope:
                async with self._connect(dead) as session:
                    with trio.fail_after(self.config.startup_timeout_s):
                        await session.initialize()
                        await self._list(session)
                    self._session = session
                    self._failures = 0
                    came_up = True
                    starting.set()
                    event(
                        log, logging.INFO, "mcp_server_started",
                        f"MCP server {self.name} is up with {len(self.tools)} tools",
                        server=self.name, session_id=self.session_id, pid=self.pid,
                    )  # fmt: skip
                    await dead.wait()
                    raise ConnectionLost(self._lost_reason())
        except Exception as exc:
            self._failed(exc, came_up)
        finally:
            self._session = None
            self._scope = None
            self.pid = None
            self._starting = None
            starting.set()

    @asynccontextmanager
    async def _connect(self, dead: trio.Event) -> AsyncIterator[ClientSession]:
        async with AsyncExitStack() as stack:
            nursery = await stack.enter_async_context(trio.open_nursery())
            stack.callback(nursery.cancel_scope.cancel)  # runs first: the helpers stop
            self._nursery = nursery
            if self.config.command:
                proc = await self._owner.processes.spawn(
                    self.config.command,
                    workspace=self.cwd,
                    env=self.config.env,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                )
                self.pid = proc.pid
                self._stderr = b""
                stack.push_async_callback(self._stop_process, proc)
                nursery.start_soon(self._read_stderr, proc, name=f"mcp-stderr {self.name}")
                streams: TransportStreams = await stack.enter_async_context(
                    stdio_streams(proc, dead)
                )
            else:
                http = await stack.enter_async_context(
                    httpx2.AsyncClient(
                        headers=dict(self.config.headers),
                        timeout=httpx2.Timeout(self.config.startup_timeout_s, read=None),
                    )
                )
                streams = await stack.enter_async_context(
                    streamable_http_client(self.config.url, http_client=http)
                )
            session = ClientSession(
                *streams,
                elicitation_callback=self._questions.ask,
                message_handler=self._on_message,
            )
            yield await stack.enter_async_context(session)

    async def _stop_process(self, proc: trio.Process) -> None:
        """Close its stdin, give it a moment, then the tool-process stop; shielded."""
        with trio.CancelScope(shield=True):
            if proc.stdin is not None:
                with suppress(trio.ClosedResourceError, trio.BrokenResourceError, OSError):
                    await proc.stdin.aclose()
            with trio.move_on_after(STDIN_CLOSE_GRACE_S):
                await proc.wait()
            await self._owner.processes.stop(proc, self._owner.kill_grace_s)

    async def _read_stderr(self, proc: trio.Process) -> None:
        """Keep the last lines of its stderr (for ``mcp_server_failed``), and log them at debug."""
        assert proc.stderr is not None
        try:
            while chunk := await proc.stderr.receive_some(65536):
                self._stderr = (self._stderr + chunk)[-_STDERR_TAIL:]
                log.debug("mcp server %s: %s", self.name, chunk.decode(errors="replace").rstrip())
        except (trio.ClosedResourceError, trio.BrokenResourceError, OSError):
            pass

    def _lost_reason(self) -> str:
        tail = (
            self._stderr.decode(errors="replace").strip().splitlines()[-1:] if self._stderr else []
        )
        said = f" (stderr: {tail[0]})" if tail else ""
        return f"the connection was lost{said}"

    def _failed(self, exc: BaseException, came_up: bool) -> None:
        error = _describe(exc, self.config.startup_timeout_s)
        if isinstance(exc, ConnectionLost) or not self._stderr:
            pass
        else:
            tail = self._stderr.decode(errors="replace").strip().splitlines()[-1:]
            if tail:
                error += f" (stderr: {tail[0]})"
        self._last_error = error
        self._failures += 1
        delay = 0.0 if came_up else BACKOFF_S[min(self._failures, len(BACKOFF_S)) - 1]
        self._retry_at = trio.current_time() + delay
        self._owner.metrics.mcp_server_failures.labels(self.name).inc()
        event(
            log, logging.ERROR, "mcp_server_failed",
            f"MCP server {self.name} failed: {error}; started again on its next use"
            f" (not before {delay:.0f} s)",
            server=self.name, session_id=self.session_id, error=error,
            failures=self._failures,
        )  # fmt: skip

    # --- tools ------------------------------------------------------------------------

    async def _list(self, session: ClientSession) -> None:
        """List the server's tools, raw: one unusable tool must not fail the whole list.

        The SDK validates a ``tools/list`` answer as a whole (a single tool
        whose schema is not an object schema fails it); docs/protocol.md §11
        drops that tool only, so the answer is read as plain JSON here.
        """
        listed: list[Any] = []
        cursor: str | None = None
        for _ in range(MAX_TOOL_PAGES):
            params = {"cursor": cursor} if cursor else None
            raw = await session._dispatcher.send_raw_request("tools/list", params, {})
            tools = raw.get("tools")
            if not isinstance(tools, list):
                raise ValueError("tools/list answered without a tools list")
            listed += tools
            cursor = raw.get("nextCursor")
            if not isinstance(cursor, str) or not cursor or len(listed) > MAX_TOOLS:
                break
        # About a millisecond a schema: off the Trio thread (adapt_tools bounds the count).
        self.tools = await trio.to_thread.run_sync(adapt_tools, self.name, listed, self)

    async def _on_message(self, message: Any) -> None:
        """Server notifications: a new tool list; a transport failure ends the connection."""
        if isinstance(message, ValueError):  # a line that is not JSON-RPC: logged, rate-limited
            self._garbage += 1
            now = trio.current_time()
            if now - self._garbage_logged_at < GARBAGE_LOG_INTERVAL_S:
                return
            more = f" ({self._garbage - 1} more such lines before it)" if self._garbage > 1 else ""
            event(
                log, logging.WARNING, "mcp_transport_error",
                f"MCP server {self.name}: a message from it is not JSON-RPC{more}:"
                f" {str(message)[:300]}",
                server=self.name, error=str(message)[:300], lines=self._garbage,
            )  # fmt: skip
            self._garbage, self._garbage_logged_at = 0, now
            return
        if isinstance(message, Exception):
            event(
                log, logging.WARNING, "mcp_transport_error",
                f"MCP server {self.name}: transport error: {message}",
                server=self.name, error=str(message),
            )  # fmt: skip
            if self._dead is not None:
                self._dead.set()
            return
        notification = getattr(message, "root", message)
        if isinstance(notification, types.ToolListChangedNotification) and self._nursery:
            if self._relisting:
                self._relist_again = True  # coalesced (RELIST_INTERVAL_S)
            else:
                self._relisting = True
                self._nursery.start_soon(self._relists, name=f"mcp-relist {self.name}")

    async def _relists(self) -> None:
        """List again, then again once a second while notices keep coming (RELIST_INTERVAL_S)."""
        try:
            while True:
                self._relist_again = False
                await self._relist()
                await trio.sleep(RELIST_INTERVAL_S)
                if not self._relist_again:
                    return
        finally:
            self._relisting = False

    async def _relist(self) -> None:
        session = self._session
        if session is None:
            return
        try:
            with trio.fail_after(self.config.startup_timeout_s):
                await self._list(session)
        except Exception as exc:
            event(
                log, logging.WARNING, "mcp_list_failed",
                f"MCP server {self.name}: listing its tools again failed: {exc!r}",
                server=self.name, error=repr(exc),
            )  # fmt: skip
        else:
            event(
                log, logging.INFO, "mcp_tools_changed",
                f"MCP server {self.name} now has {len(self.tools)} tools",
                server=self.name, count=len(self.tools),
            )  # fmt: skip

    # --- calls ------------------------------------------------------------------------

    async def call(self, tool: str, arguments: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        """Call one tool (module docstring).

        Raises:
            ToolError: ``error`` (the server failed, is down, or died during
                the call) or ``timeout`` (``tool_timeout_s``).
            trio.Cancelled: after the SDK told the server (``notifications/cancelled``).
        """
        session = await self.ensure()
        token = object()
        self._calls[token] = ctx
        timeout = self.config.tool_timeout_s
        request = types.CallToolRequest(
            params=types.CallToolRequestParams(name=tool, arguments=arguments)
        )
        try:
            with trio.move_on_after(timeout) as scope:
                result = await session.send_request(request, types.CallToolResult)
        except MCPError as exc:
            if exc.code == types.CONNECTION_CLOSED:
                if self._dead is not None:
                    self._dead.set()
                raise ToolError(
                    "error", f"MCP server {self.name!r} went away during the call ({exc.message})"
                ) from None
            raise ToolError("error", f"MCP server {self.name!r}: {exc.message}") from None
        except pydantic.ValidationError as exc:
            raise ToolError(
                "error", f"MCP server {self.name!r} answered with a malformed result: {exc}"
            ) from None
        finally:
            del self._calls[token]
            if not any(c.session_id == ctx.session_id for c in self._calls.values()):
                await self._questions.end(ctx.session_id)
        if scope.cancelled_caught:
            raise ToolError(
                "timeout",
                f"MCP server {self.name!r}: {tool} did not answer within {timeout:g} s"
                " (tool_timeout_s)",
            )
        return map_result(self.name, tool, result)


class McpServers:
    """The node's MCP servers: the ``mcp-servers`` task and its connections (module docstring)."""

    def __init__(self, config: Config, processes: ToolProcesses, metrics: Metrics) -> None:
        self.config = config
        self.processes = processes
        self.metrics = metrics
        self.kill_grace_s = config.tools.kill_grace_s
        self.nursery: trio.Nursery | None = None
        self._node: dict[str, McpConnection] = {
            name: McpConnection(name, server, self)
            for name, server in config.mcp_servers.items()
            if server.scope == "node"
        }
        self._sessions: dict[str, dict[str, McpConnection]] = {}
        self._used: dict[str, float] = {}  # session -> when its tools were last asked for

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The ``mcp-servers`` task: start the node's servers; at its cancel, stop them all."""
        try:
            async with trio.open_nursery() as nursery:
                self.nursery = nursery
                for connection in self._node.values():
                    connection.start_soon()
                task_status.started()
                await self._stop_idle_sessions(self.config.sessions.idle_unload_s)
        finally:
            self.nursery = None
            for connection in self.connections():
                connection.stop()

    def connections(self) -> list[McpConnection]:
        """Every connection: the node's, then each open session's."""
        out = list(self._node.values())
        for by_name in self._sessions.values():
            out += by_name.values()
        return out

    def connection(self, server: str, session_id: str | None = None) -> McpConnection | None:
        """A node server's connection, or a session server's for ``session_id``."""
        if server in self._node:
            return self._node[server]
        return self._sessions.get(session_id or "", {}).get(server)

    def open_session(
        self,
        session_id: str,
        workspace_dir: str,
        uses_server: Callable[[str], bool] = lambda server: True,
    ) -> None:
        """Start the session-scope servers ``uses_server`` names, in the session's workspace."""
        self._used[session_id] = trio.current_time()  # its turn runs: not idle
        if session_id in self._sessions:
            return
        connections = self._sessions[session_id] = {
            name: McpConnection(name, server, self, session_id=session_id, cwd=workspace_dir)
            for name, server in self.config.mcp_servers.items()
            if server.scope == "session" and uses_server(name)
        }
        for connection in connections.values():
            connection.start_soon()

    def close_session(self, session_id: str) -> None:
        """Stop the session's servers (its processes stopped by their tasks, shielded)."""
        self._used.pop(session_id, None)
        for connection in self._sessions.pop(session_id, {}).values():
            connection.stop()

    async def _stop_idle_sessions(self, idle_s: float) -> None:
        """Stop the servers of a session unused for ``idle_s`` (``[sessions] idle_unload_s``).

        Unused: no call of it in flight on them, and its tools not asked for
        (each model call and each tool call asks). Its next turn starts them
        again (:meth:`open_session`), so a session that is only being read
        keeps no process.
        """
        while True:
            await trio.sleep(max(idle_s / 4, 0.05))
            now = trio.current_time()
            for session_id, used in list(self._used.items()):
                busy = any(c.busy(session_id) for c in self._sessions.get(session_id, {}).values())
                if busy:
                    self._used[session_id] = now
                elif now - used >= idle_s:
                    event(
                        log, logging.INFO, "mcp_session_idle",
                        f"session {session_id}: its MCP servers stop after {idle_s:g} s unused",
                        session_id=session_id,
                    )  # fmt: skip
                    self.close_session(session_id)

    def tools(
        self, session_id: str | None = None, uses_server: Callable[[str], bool] | None = None
    ) -> list[McpTool]:
        """The MCP tools a session sees now; down servers past their backoff are started again."""
        out: list[McpTool] = []
        connections: Iterable[McpConnection] = self._node.values()
        if session_id is not None:
            connections = [*connections, *self._sessions.get(session_id, {}).values()]
        for connection in connections:
            if uses_server is not None and not uses_server(connection.name):
                continue
            connection.start_soon()
            out += connection.tools.values()
        return out

    def session_tools(
        self, builtin: ToolRegistry, session_id: str, agent: AgentProfile | None = None
    ) -> SessionTools:
        """The session's tool set: the built-in tools and its MCP tools, its agent's only."""
        uses = None if agent is None else agent.uses_server
        allows = agent.allows if agent is not None else (lambda name: True)
        return McpSessionTools(
            builtin, lambda: self.tools(session_id, uses), allows, self, session_id
        )

    def down_server_of(self, tool: str, session_id: str) -> McpConnection | None:
        """The connection of ``mcp__<server>__<tool>``'s server if it is down, else None."""
        prefix, _, rest = tool.partition("__")
        server, _, remote = rest.partition("__")
        if prefix != "mcp" or not remote:
            return None
        connection = self.connection(server, session_id)
        return None if connection is None or connection.live else connection

    async def wait_ready(self, session_id: str | None = None) -> None:
        """Wait for the starts in progress (each bounded by its ``startup_timeout_s``)."""
        for connection in self._node.values():
            if connection.starting is not None:
                await connection.starting.wait()
        for connection in self._sessions.get(session_id or "", {}).values():
            if connection.starting is not None:
                await connection.starting.wait()


class McpSessionTools(SessionTools):
    """A session's tools, where a down server's tool fails ``error`` saying why.

    A server that never came up (a wrong command) has listed no tools, so a
    call of one of them would be ``unknown_tool``, which tells the model the
    tool does not exist; docs/protocol.md §11 says a down server's calls fail
    ``error``, the reason the server is down in the message.
    """

    def __init__(
        self,
        builtin: ToolRegistry,
        extra: Callable[[], Iterable[McpTool]],
        allows: Callable[[str], bool],
        servers: McpServers,
        session_id: str,
    ) -> None:
        super().__init__(builtin, extra, allows)
        self._servers = servers
        self._session_id = session_id

    def validate(self, name: str, raw_input: dict[str, Any]) -> tuple[Any, Any]:
        try:
            return super().validate(name, raw_input)
        except ToolError as exc:
            if exc.error_class == "unknown_tool" and self._allows(name):
                down = self._servers.down_server_of(name, self._session_id)
                if down is not None:
                    raise ToolError("error", down.unavailable()) from None
            raise


def _describe(exc: BaseException, startup_timeout_s: float) -> str:
    """One line for a failure, through the exception groups anyio and trio wrap it in."""
    leaves = _leaves(exc)
    for leaf in leaves:
        if isinstance(leaf, trio.TooSlowError):
            return f"no answer within startup_timeout_s ({startup_timeout_s:g} s)"
    for leaf in leaves:
        if not isinstance(leaf, trio.Cancelled):
            return f"{type(leaf).__name__}: {leaf}"
    return repr(exc)


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for sub in exc.exceptions for leaf in _leaves(sub)]
    return [exc]

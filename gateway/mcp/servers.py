"""MCP server connections, supervised (docs/protocol.md §11, docs/reference.md "MCP servers").

:class:`McpServers` is the node's: its ``mcp-servers`` task owns one
:class:`~gateway.mcp.connection.McpConnection` per ``scope = "node"`` server
(shared by every session) and, between :meth:`McpServers.open_session` and
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
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import trio

from gateway.agents import READ_RESOURCE, AgentProfile
from gateway.config import Config
from gateway.errors import ToolError
from gateway.logs import event
from gateway.metrics import Metrics
from gateway.tools.process import ToolProcesses
from gateway.tools.registry import SessionTools, ToolRegistry

if TYPE_CHECKING:
    from gateway.config import McpServerConfig
    from gateway.mcp.connection import McpConnection
    from gateway.mcp.resources import ReadResourceTool
    from gateway.mcp.tools import McpTool
    from gateway.protocol.shapes import ResourceTemplateInfo


log = logging.getLogger("gateway.mcp")


def _connection(
    name: str, server: McpServerConfig, owner: McpServers, **where: str
) -> McpConnection:
    """A connection (the ``mcp`` SDK imported at the first: :mod:`gateway.mcp.connection`)."""
    from gateway.mcp.connection import McpConnection

    return McpConnection(name, server, owner, **where)


class McpServers:
    """The node's MCP servers: the ``mcp-servers`` task and its connections (module docstring)."""

    def __init__(self, config: Config, processes: ToolProcesses, metrics: Metrics) -> None:
        self.config = config
        self.processes = processes
        self.metrics = metrics
        self.kill_grace_s = config.tools.kill_grace_s
        self.nursery: trio.Nursery | None = None
        self._node: dict[str, McpConnection] = {
            name: _connection(name, server, self)
            for name, server in config.mcp_servers.items()
            if server.scope == "node"
        }
        self._sessions: dict[str, dict[str, McpConnection]] = {}
        self._used: dict[str, float] = {}  # session -> when its tools were last asked for
        self._workspaces: dict[str, str] = {}  # session -> its workspace (gateway.mcp.roots)

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
        self._workspaces[session_id] = workspace_dir
        if session_id in self._sessions:
            return
        connections = self._sessions[session_id] = {
            name: _connection(name, server, self, session_id=session_id, cwd=workspace_dir)
            for name, server in self.config.mcp_servers.items()
            if server.scope == "session" and uses_server(name)
        }
        for connection in connections.values():
            connection.start_soon()

    def workspace_of(self, session_id: str) -> str:
        """A session's workspace directory, while its servers run ("" otherwise)."""
        return self._workspaces.get(session_id, "")

    def close_session(self, session_id: str) -> None:
        """Stop the session's servers (its processes stopped by their tasks, shielded)."""
        self._used.pop(session_id, None)
        self._workspaces.pop(session_id, None)
        for connection in self._sessions.pop(session_id, {}).values():
            connection.stop()

    async def _stop_idle_sessions(self, idle_s: float) -> None:
        """Stop the servers of a session unused for ``idle_s`` (``[sessions] idle_unload_s``).

        Unused: no call of it in flight on them nor on the node's servers (whose
        ``roots/list`` during its call is its workspace), and its tools not asked for
        (each model call and each tool call asks). Its next turn starts them
        again (:meth:`open_session`), so a session that is only being read
        keeps no process.
        """
        while True:
            await trio.sleep(max(idle_s / 4, 0.05))
            now = trio.current_time()
            for session_id, used in list(self._used.items()):
                # Its calls on the node's servers too: their roots are its workspace.
                mine = [*self._sessions.get(session_id, {}).values(), *self._node.values()]
                busy = any(c.busy(session_id) for c in mine)
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
    ) -> list[McpTool | ReadResourceTool]:
        """The MCP tools a session sees now; down servers past their backoff are started again.

        With them, ``mcp_read_resource`` when one of its servers has resources
        (gateway.mcp.resources).
        """
        out: list[McpTool | ReadResourceTool] = []
        readers: dict[str, McpConnection] = {}
        for connection in self._of(session_id, uses_server):
            connection.start_soon()
            out += connection.tools.values()
            if connection.resources:
                readers[connection.name] = connection
        if readers:
            from gateway.mcp.resources import ReadResourceTool

            out.append(ReadResourceTool(dict(readers)))
        return out

    def _of(
        self, session_id: str | None, uses_server: Callable[[str], bool] | None
    ) -> list[McpConnection]:
        connections = list(self._node.values())
        if session_id is not None:
            connections += self._sessions.get(session_id, {}).values()
        return [c for c in connections if uses_server is None or uses_server(c.name)]

    def resource_templates(
        self, session_id: str | None = None, uses_server: Callable[[str], bool] | None = None
    ) -> list[ResourceTemplateInfo]:
        """The resource templates of the servers an agent uses, as they last listed them."""
        return [t for c in self._of(session_id, uses_server) for t in c.resource_templates]

    def session_tools(
        self, builtin: ToolRegistry, session_id: str, agent: AgentProfile | None = None
    ) -> SessionTools:
        """The session's tool set: the built-in tools and its MCP tools, its agent's only."""
        uses = None if agent is None else agent.uses_server
        allows = agent.allows if agent is not None else (lambda name: True)
        if agent is not None:  # offered with its servers, whatever its tools' patterns
            allows = _or_read_resource(agent.allows)
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


def _or_read_resource(allows: Callable[[str], bool]) -> Callable[[str], bool]:
    return lambda name: name == READ_RESOURCE or allows(name)


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
        extra: Callable[[], Iterable[McpTool | ReadResourceTool]],
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

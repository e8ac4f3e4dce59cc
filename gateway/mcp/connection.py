"""One supervised connection to one MCP server (docs/protocol.md §11): the ``mcp`` SDK's side.

:class:`McpConnection` is what :class:`~gateway.mcp.servers.McpServers` owns
per server (its module docstring: transports, restarts, backoff, calls). This
module holds everything that imports the ``mcp`` SDK, whose types take about
a second to import: a daemon with no ``[mcp_servers]`` never imports it, and a
config error is told before it would be.
"""

from __future__ import annotations

import logging
import math
import os
import subprocess
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager, suppress
from typing import Any, Protocol

import httpx2
import mcp_types as types
import pydantic
import trio
from mcp.client._transport import TransportStreams
from mcp.client.session import ClientSession
from mcp.shared.exceptions import MCPError

from gateway.config import McpServerConfig
from gateway.errors import ToolError
from gateway.logs import event
from gateway.mcp.inbound import guarded, streamable_http
from gateway.mcp.progress import ProgressPacer
from gateway.mcp.questions import Questions
from gateway.mcp.resources import list_templates, map_resource
from gateway.mcp.roots import GatewayClientSession, Roots
from gateway.mcp.sampling import Samplings
from gateway.mcp.server_log import ServerLog, ask_level, escaped
from gateway.mcp.stdio import stdio_streams
from gateway.mcp.tools import MAX_TOOLS, McpTool, adapt_tools, map_result
from gateway.metrics import Metrics
from gateway.protocol.shapes import ResourceTemplateInfo
from gateway.tools.process import ToolProcesses
from gateway.tools.registry import ToolContext, ToolOutput

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


class Owner(Protocol):
    """What a connection uses of its owner (:class:`~gateway.mcp.servers.McpServers`)."""

    nursery: trio.Nursery | None  # where a connection's task runs (None: not running)
    processes: ToolProcesses
    kill_grace_s: float
    metrics: Metrics

    def workspace_of(self, session_id: str) -> str:
        """A session's workspace directory ("" when unknown: gateway.mcp.roots)."""
        ...


class ConnectionLost(Exception):
    """The server went away (its process exited, its transport broke)."""


class McpConnection:
    """One supervised connection to one MCP server (module docstring)."""

    def __init__(
        self,
        name: str,
        config: McpServerConfig,
        owner: Owner,
        *,
        session_id: str | None = None,
        cwd: str = "",
    ) -> None:
        self.name = name
        self.config = config
        self.session_id = session_id  # a session-scope server's session
        self.cwd = cwd or config.cwd or os.getcwd()
        self.tools: dict[str, McpTool] = {}  # the last list it gave, by gateway name
        self.resources = False  # its initialize declared resources (gateway.mcp.resources)
        self.resource_templates: list[ResourceTemplateInfo] = []
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
        self._samplings = Samplings(name, self._calls)  # its sampling requests during calls
        own = self.cwd if session_id is not None else ""
        self._roots = Roots(own, self._calls, owner.workspace_of)  # gateway.mcp.roots
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
                    capabilities = session.server_capabilities
                    self.resources = capabilities is not None and capabilities.resources is not None
                    self._session = session
                    self._failures = 0
                    came_up = True
                    starting.set()
                    if self._nursery is not None:  # not held at its start (_resources_and_logs)
                        self._nursery.start_soon(
                            _resources_and_logs, self, session, name=f"mcp-asks {self.name}"
                        )
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
                    guarded(await stack.enter_async_context(streamable_http(self.config.url, http)))
                )
            session = GatewayClientSession(
                *streams,
                elicitation_callback=self._questions.ask,
                list_roots_callback=self._roots,
                logging_callback=ServerLog(self.name, self.session_id),
                message_handler=self._on_message,
                # Advertised on every connection, refused per request (gateway.mcp.sampling).
                sampling_callback=self._samplings.sample,
                sampling_capabilities=types.SamplingCapability(),
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
                said = escaped(chunk.decode(errors="replace").rstrip())  # its text, one line
                log.debug("mcp server %s: %s", self.name, said)
        except (trio.ClosedResourceError, trio.BrokenResourceError, OSError):
            pass

    def _lost_reason(self) -> str:
        tail = (
            self._stderr.decode(errors="replace").strip().splitlines()[-1:] if self._stderr else []
        )
        said = f" (stderr: {escaped(tail[0])})" if tail else ""
        return f"the connection was lost{said}"

    def _failed(self, exc: BaseException, came_up: bool) -> None:
        error = _describe(exc, self.config.startup_timeout_s)
        if isinstance(exc, ConnectionLost) or not self._stderr:
            pass
        else:
            tail = self._stderr.decode(errors="replace").strip().splitlines()[-1:]
            if tail:
                error += f" (stderr: {escaped(tail[0])})"
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
        if isinstance(notification, types.ElicitCompleteNotification):
            self._questions.completed(notification.params.elicitation_id)  # gateway.mcp.questions
            return
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

    async def call(
        self, tool: str, arguments: dict[str, Any], ctx: ToolContext, *, again: bool = True
    ) -> ToolOutput:
        """Call one tool (module docstring).

        A call failed ``-32042`` (URL elicitation required) whose URLs the user
        accepts is made ``again``, once (gateway.mcp.questions, ``required``).

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
        pacer = ProgressPacer(ctx.progress) if ctx.progress is not None else None  # its progress
        try:
            with trio.move_on_after(timeout) as scope:
                result = await session.send_request(
                    request, types.CallToolResult, progress_callback=pacer
                )
        except MCPError as exc:
            if exc.code == types.CONNECTION_CLOSED:
                if self._dead is not None:
                    self._dead.set()
                raise ToolError(
                    "error", f"MCP server {self.name!r} went away during the call ({exc.message})"
                ) from None
            required = again and exc.code == types.URL_ELICITATION_REQUIRED
            if required and await self._questions.required(ctx, exc.data):
                return await self.call(tool, arguments, ctx, again=False)
            raise ToolError("error", f"MCP server {self.name!r}: {exc.message}") from None
        except pydantic.ValidationError as exc:
            raise ToolError(
                "error", f"MCP server {self.name!r} answered with a malformed result: {exc}"
            ) from None
        finally:
            if pacer is not None:
                pacer.end()
            del self._calls[token]
            if not any(c.session_id == ctx.session_id for c in self._calls.values()):
                await self._samplings.end(ctx.session_id)
                await self._questions.end(ctx.session_id)
        if scope.cancelled_caught:
            raise _no_answer(self.name, f"{tool} did not answer", timeout)
        return map_result(self.name, tool, result)

    async def read_resource(self, uri: str, ctx: ToolContext) -> ToolOutput:
        """Read one of its resources (``mcp_read_resource``, gateway.mcp.resources), as a call is.

        Raises:
            ToolError: ``error`` (the server refused, failed or is down) or ``timeout``.
        """
        session = await self.ensure()
        token = object()
        self._calls[token] = ctx  # a roots/list meanwhile is the reader's session's
        try:
            with trio.fail_after(self.config.tool_timeout_s):
                result = await session.read_resource(uri)
        except trio.TooSlowError:
            raise _no_answer(self.name, "no answer", self.config.tool_timeout_s) from None
        except (MCPError, pydantic.ValidationError, RuntimeError) as exc:
            said = exc.message if isinstance(exc, MCPError) else str(exc)[:1000]
            raise ToolError("error", f"MCP server {self.name!r}: {said}") from None
        finally:
            del self._calls[token]
        return map_resource(result)


async def _resources_and_logs(connection: McpConnection, session: ClientSession) -> None:
    """A connection's resource templates; the log level its server is asked for
    (gateway.mcp.resources, gateway.mcp.server_log).

    Asked once it is up, beside its calls: a server slow to answer them
    (5 s each at most) held its start, and failed it under a shorter
    ``startup_timeout_s``. Either failing is logged, never its connection's end.
    """
    capabilities = session.server_capabilities
    try:
        if connection.resources:
            connection.resource_templates = await list_templates(connection.name, session)
        if capabilities is not None and capabilities.logging is not None:
            await ask_level(session, log.getEffectiveLevel())
    except Exception as exc:
        event(
            log, logging.INFO, "mcp_list_failed",
            f"MCP server {connection.name}: asking for its templates or log level failed:"
            f" {exc!r}",
            server=connection.name, error=repr(exc),
        )  # fmt: skip


def _no_answer(server: str, what: str, timeout: float) -> ToolError:
    """A call or a read that took over ``tool_timeout_s``."""
    message = f"MCP server {server!r}: {what} within {timeout:g} s (tool_timeout_s)"
    return ToolError("timeout", message)


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

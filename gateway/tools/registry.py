"""The tool registry and dispatcher.

A tool is a name, a description, an input JSON schema (what the model is
shown), a ``parse`` that checks what the model sends against it, and an async
``run``. A built-in tool (:class:`FunctionTool`) derives both the schema and
the parse from one input type (a ``msgspec.Struct``), so the two can never
disagree; an MCP server's tool (gateway.mcp.tools) carries the server's schema
and checks input against it with ``jsonschema`` (docs/protocol.md §11).

The tools a session sees (:class:`SessionTools`) are the node's built-in
registry plus the tools of the MCP servers it may use, composed per session and
filtered by its agent's tool list; each tool says where it comes from
(:meth:`SessionTools.source_of`: ``builtin`` or ``mcp:<server>``).

The dispatcher turns every way a tool call can go wrong into a
:class:`~gateway.errors.ToolError` with the ``tool.failed.error_class`` of
docs/protocol.md §5: an unknown name is ``unknown_tool``, input failing its
schema is ``invalid_input``, a tool raising anything else is ``error``. The turn
goes on either way: the model sees the error as an ``is_error`` tool result.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import msgspec
import trio

from gateway.errors import ToolError
from gateway.protocol.events import Payload
from gateway.protocol.shapes import Message
from gateway.providers.base import ToolSpec
from gateway.tools.sampling import Sampled, SamplingRequest

log = logging.getLogger("gateway.tools")


class ToolOutput(msgspec.Struct):
    """What a tool returns: text for the model and, optionally, structured data for clients.

    ``files``: the images and audio a tool returned, as (media type, bytes);
    the session keeps each as a file and puts its reference in the tool's result
    (docs/protocol.md §2 "Files", gateway.session.tool_round).
    """

    content: str
    structured: Any = None
    files: list[tuple[str, bytes]] = []


class WorkerTurn(Protocol):
    """A worker session's turn, as the tool that started it sees it."""

    @property
    def done(self) -> trio.Event: ...

    @property
    def outcome(self) -> str | None: ...

    @property
    def final_text(self) -> str: ...

    @property
    def cancel_reason(self) -> str | None: ...

    @property
    def cost_usd(self) -> float:
        """What the turn spent, its own workers' included (set when it ends)."""
        ...

    def request_cancel(self, reason: str) -> bool: ...


class Worker(Protocol):
    """A worker session (docs/protocol.md §5, ``parent_session_id``)."""

    @property
    def id(self) -> str: ...

    def submit_turn(self, user_message: Message) -> WorkerTurn: ...


class ToolSession(Protocol):
    """What a tool may do with the session that runs it (the ``delegate`` tool's needs)."""

    @property
    def id(self) -> str: ...

    @property
    def cancel_grace_s(self) -> float:
        """How long a cancelled worker's turn may take to close (``shutdown_grace_s``)."""
        ...

    def emit(self, payloads: list[Payload], turn_id: str | None) -> object:
        """Emit events in the session's stream."""
        ...

    async def spawn_worker(self, tool_use_id: str) -> Worker:
        """Create and start a worker session of this one."""
        ...

    def book_worker_cost(self, turn_id: str, cost_usd: float) -> None:
        """Add a worker turn's cost to this session's turn ``turn_id`` (docs/protocol.md §5)."""
        ...

    async def elicit(
        self, ctx: ToolContext, message: str, requested_schema: dict[str, Any]
    ) -> tuple[str, dict[str, Any] | None]:
        """Ask the session's user a question for a running tool (elicitation, docs/protocol.md §11).

        A ``permission.requested`` of ``kind: "elicitation"``, waited on within
        ``approval_timeout_s``. Returns the decision (``allow``, ``deny``,
        ``timeout`` or ``cancelled``) and, with ``allow``, the user's content
        (already checked against ``requested_schema``).
        """
        ...

    async def elicit_url(
        self, ctx: ToolContext, message: str, url: str, completed: trio.Event | None = None
    ) -> str:
        """Ask the session's user to visit ``url`` for a running tool (docs/protocol.md §11).

        A ``permission.requested`` of ``kind: "elicitation_url"``; returns the
        decision (``allow``, ``deny``, ``timeout`` or ``cancelled``);
        ``completed`` set meanwhile (the server said it is done) is ``allow``.
        """
        ...

    async def sample(self, ctx: ToolContext, request: SamplingRequest) -> Sampled:
        """Serve an MCP server's sampling request with the session's model (docs/protocol.md §11).

        Raises:
            ToolError: refused (the agent's ``mcp_sampling``, the user, the
                turn's limits) or failed; its message is what the server is told.
        """
        ...


@dataclass(slots=True)
class ToolContext:
    """What a running tool may know of its session."""

    session_id: str
    turn_id: str
    tool_use_id: str
    # The session's workspace as recorded (gateway.tools.workspace): ``<tenant>/<name>``
    # under ``[sessions] workspace_root``, or an allowed absolute directory. A tool
    # opens it at use through the daemon's ``Workspaces``, never as a plain path.
    workspace_path: str
    kill_grace_s: float = 5.0
    session: ToolSession | None = None  # for tools that act on their session (delegate)
    tool_name: str = ""  # the name the model called (an elicitation's permission names it)
    # Tells the session's clients how far the tool is (``tool.progress``, docs/protocol.md §5):
    # ``progress(progress, total, message)``; None where no client is told (a test's context).
    progress: Callable[[float, float | None, str | None], None] | None = None


In = TypeVar("In", bound=msgspec.Struct)
In_contra = TypeVar("In_contra", bound=msgspec.Struct, contravariant=True)


class Tool(Protocol[In_contra]):
    @property
    def name(self) -> str: ...

    @property
    def description(self) -> str: ...

    @property
    def input_schema(self) -> dict[str, Any]:
        """The JSON schema of the input, as the model is shown it (an object schema)."""
        ...

    def parse(self, raw_input: dict[str, Any]) -> Any:
        """The arguments ``run`` takes, from what the model sent.

        Raises:
            ToolError: ``invalid_input``, naming the problem.
        """
        ...

    async def run(self, args: In_contra, ctx: ToolContext) -> ToolOutput: ...


@dataclass(frozen=True, slots=True)
class FunctionTool(Generic[In]):
    """A tool made of a function: the usual way to declare one."""

    name: str
    description: str
    input_type: type[In]
    fn: Callable[[In, ToolContext], Awaitable[ToolOutput]]

    @property
    def input_schema(self) -> dict[str, Any]:
        return _schema(self.input_type)

    def parse(self, raw_input: dict[str, Any]) -> In:
        try:
            return msgspec.convert(raw_input, self.input_type)
        except msgspec.ValidationError as exc:
            raise ToolError("invalid_input", f"invalid input for {self.name!r}: {exc}") from None

    async def run(self, args: In, ctx: ToolContext) -> ToolOutput:
        return await self.fn(args, ctx)


class ToolRegistry:
    """The enabled tools of a gateway, by name."""

    def __init__(self, tools: Iterable[Tool[Any]] = ()) -> None:
        self._tools: dict[str, Tool[Any]] = {}
        for tool in tools:
            self.add(tool)

    def add(self, tool: Tool[Any]) -> None:
        if tool.name in self._tools:
            raise ValueError(f"tool {tool.name!r} registered twice")
        self._tools[tool.name] = tool

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def names(self) -> list[str]:
        return list(self._tools)

    def get(self, name: str) -> Tool[Any] | None:
        return self._tools.get(name)

    def tools(self) -> list[Tool[Any]]:
        return list(self._tools.values())

    def specs(self) -> list[ToolSpec]:
        """The tool definitions sent to the model."""
        return _specs(self._tools.values())

    def validate(self, name: str, raw_input: dict[str, Any]) -> tuple[Tool[Any], Any]:
        """Look a call up and check its input, before anything runs.

        Raises:
            ToolError: ``unknown_tool`` or ``invalid_input``, naming the problem.
        """
        return _validate(self._tools.get(name), name, raw_input, self._tools)

    async def execute(self, name: str, raw_input: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        """Validate and run one call.

        Raises:
            ToolError: with the error class of docs/protocol.md §5.
            trio.Cancelled: passes through untouched (cancellation is the turn's business).
        """
        return await _execute(*self.validate(name, raw_input), ctx)


class SessionTools:
    """The tools one session sees: the built-in registry, then extra tools (MCP), filtered.

    ``extra`` is asked at every use (an MCP server's list may change at any
    time: ``notifications/tools/list_changed``); ``allows`` is the session's
    agent's tool list (gateway.agents.AgentProfile.allows). A name both built
    in and extra is the built-in tool's (an MCP tool's ``mcp__`` prefix makes
    that impossible in practice). Same API as :class:`ToolRegistry`, so the
    agent loop takes either.
    """

    def __init__(
        self,
        builtin: ToolRegistry,
        extra: Callable[[], Iterable[Tool[Any]]] = lambda: (),
        allows: Callable[[str], bool] = lambda name: True,
    ) -> None:
        self.builtin = builtin
        self._extra = extra
        self._allows = allows

    def _all(self) -> dict[str, Tool[Any]]:
        tools: dict[str, Tool[Any]] = {}
        for tool in (*self.builtin.tools(), *self._extra()):
            if tool.name not in tools and self._allows(tool.name):
                tools[tool.name] = tool
        return tools

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self._all()

    def names(self) -> list[str]:
        return list(self._all())

    def get(self, name: str) -> Tool[Any] | None:
        return self._all().get(name)

    def source_of(self, name: str) -> str | None:
        """``builtin``, ``mcp:<server>``, or None for a tool this session does not have."""
        tool = self._all().get(name)
        return None if tool is None else str(getattr(tool, "source", "builtin"))

    def specs(self) -> list[ToolSpec]:
        return _specs(self._all().values())

    def validate(self, name: str, raw_input: dict[str, Any]) -> tuple[Tool[Any], Any]:
        tools = self._all()
        return _validate(tools.get(name), name, raw_input, tools)

    async def execute(self, name: str, raw_input: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        return await _execute(*self.validate(name, raw_input), ctx)


def _specs(tools: Iterable[Tool[Any]]) -> list[ToolSpec]:
    return [ToolSpec(t.name, t.description, t.input_schema) for t in tools]


def _validate(
    tool: Tool[Any] | None, name: str, raw_input: dict[str, Any], known: Iterable[str]
) -> tuple[Tool[Any], Any]:
    if tool is None:
        names = ", ".join(known) or "none"
        raise ToolError("unknown_tool", f"unknown tool {name!r}; enabled tools: {names}")
    return tool, tool.parse(raw_input)


async def _execute(tool: Tool[Any], args: Any, ctx: ToolContext) -> ToolOutput:
    name = tool.name
    try:
        return await tool.run(args, ctx)
    except ToolError:
        raise
    except Exception as exc:  # a tool's own failure is a result, not a crash
        # The traceback, for debugging; the failure's one line is the agent's tool_failed.
        log.debug(
            "tool %s raised %r", name, exc, exc_info=exc,
            extra={
                "event": "tool_raised",
                "fields": {"tool": name, "session_id": ctx.session_id, "turn_id": ctx.turn_id},
            },
        )  # fmt: skip
        raise ToolError("error", f"{type(exc).__name__}: {exc}") from exc


def _schema(input_type: type[msgspec.Struct]) -> dict[str, Any]:
    """The JSON schema of a tool's input, inlined (the model sees no ``$ref``)."""
    schema = msgspec.json.schema(input_type)
    defs = schema.get("$defs", {})
    ref = schema.get("$ref", "")
    body: dict[str, Any] = dict(defs.get(ref.rsplit("/", 1)[-1], schema))
    body.pop("title", None)
    return body

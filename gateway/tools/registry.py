"""The tool registry and dispatcher.

A tool is a name, a description, an input type (a ``msgspec.Struct``) and an
async ``run``. The input type gives both the JSON schema the model is shown and
the validation of what the model sends, so the two can never disagree.

The dispatcher turns every way a tool call can go wrong into a
:class:`~gateway.errors.ToolError` with the ``tool.failed.error_class`` of
PROTOCOL section 5: an unknown name is ``unknown_tool``, input failing its
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

log = logging.getLogger("gateway.tools")


class ToolOutput(msgspec.Struct):
    """What a tool returns: text for the model and, optionally, structured data for clients."""

    content: str
    structured: Any = None


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
    """A worker session (PROTOCOL section 5, ``parent_session_id``)."""

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
        """Add a worker turn's cost to this session's turn ``turn_id`` (PROTOCOL section 5)."""
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


In = TypeVar("In", bound=msgspec.Struct)
In_contra = TypeVar("In_contra", bound=msgspec.Struct, contravariant=True)


class Tool(Protocol[In_contra]):
    @property
    def name(self) -> str: ...

    @property
    def description(self) -> str: ...

    @property
    def input_type(self) -> type[msgspec.Struct]: ...

    async def run(self, args: In_contra, ctx: ToolContext) -> ToolOutput: ...


@dataclass(frozen=True, slots=True)
class FunctionTool(Generic[In]):
    """A tool made of a function: the usual way to declare one."""

    name: str
    description: str
    input_type: type[In]
    fn: Callable[[In, ToolContext], Awaitable[ToolOutput]]

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

    def tools(self) -> list[Tool[Any]]:
        return list(self._tools.values())

    def specs(self) -> list[ToolSpec]:
        """The tool definitions sent to the model, their schemas derived from the input types."""
        return [
            ToolSpec(t.name, t.description, _schema(t.input_type)) for t in self._tools.values()
        ]

    def validate(self, name: str, raw_input: dict[str, Any]) -> tuple[Tool[Any], msgspec.Struct]:
        """Look a call up and check its input, before anything runs.

        Raises:
            ToolError: ``unknown_tool`` or ``invalid_input``, naming the problem.
        """
        tool = self._tools.get(name)
        if tool is None:
            known = ", ".join(self._tools) or "none"
            raise ToolError("unknown_tool", f"unknown tool {name!r}; enabled tools: {known}")
        try:
            args = msgspec.convert(raw_input, tool.input_type)
        except msgspec.ValidationError as exc:
            raise ToolError("invalid_input", f"invalid input for {name!r}: {exc}") from None
        return tool, args

    async def execute(self, name: str, raw_input: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        """Validate and run one call.

        Raises:
            ToolError: with the error class of PROTOCOL section 5.
            trio.Cancelled: passes through untouched (cancellation is the turn's business).
        """
        tool, args = self.validate(name, raw_input)
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

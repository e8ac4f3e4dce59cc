"""The agent loop's contracts: with its session, its node, and a runtime that runs its turns.

A module below both the loop (:mod:`gateway.session.agent`) and the runtimes
(:mod:`gateway.runtimes`), so that neither imports the other: the loop works
through a narrow view of its session (:class:`TurnHost`) and of its node
(:class:`AgentServices`); a runtime other than the gateway's own (``runtime =
"claude-code"``, docs/protocol.md §11) is a :class:`Runtime` the loop hands its
turns to, and sees the loop as a :class:`RuntimeHost`: its emission, its call
in flight, its tool endings.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol

import trio

from gateway.agents import AgentProfile, Agents
from gateway.config import Config
from gateway.metrics import Metrics
from gateway.protocol.events import Payload, StreamEvent
from gateway.protocol.shapes import Message, StopReason, ToolUseBlock, Usage
from gateway.providers.factory import Providers
from gateway.providers.model_proxy import ModelProxy
from gateway.session.busy import Pulse
from gateway.session.call import Call, CallStream, Completion
from gateway.session.files import Files
from gateway.session.hub import Emitted
from gateway.session.permissions import Permissions
from gateway.session.turn import Turn, TurnState
from gateway.store.base import SessionRecord
from gateway.tools.process import ToolProcesses
from gateway.tools.process_slots import ProcessSlots
from gateway.tools.registry import SessionTools, ToolSession
from gateway.tools.workspace import Workspaces


class AgentServices(Protocol):
    """What the agent loop uses of its node: config, agents, providers, tools, pricing, pace."""

    config: Config
    agents: Agents
    providers: Providers
    metrics: Metrics
    processes: ToolProcesses  # the daemon's tool processes (a claude-code agent's CLI)
    process_slots: ProcessSlots  # a claude-code agent's max_processes on this node
    workspaces: Workspaces  # where a session's workspace is on this host
    model_proxy: ModelProxy  # a claude-code agent's CLI's door to the model API
    files: Files  # the sessions' files, read into a model request (docs/protocol.md §2)

    def session_tools(self, session: TurnHost) -> SessionTools:
        """The tools the session's agent sees now (docs/protocol.md §11)."""
        ...

    async def tools_ready(self, session: TurnHost) -> None:
        """Wait for the session's MCP servers still starting (bounded)."""
        ...

    def pricing(self, model: str) -> Callable[[Usage], float | None]:
        """``cost_usd`` of a usage on ``model``."""
        ...

    def runtime_of(self, agent: AgentProfile) -> RuntimeFactory | None:
        """What makes ``agent``'s runtime (gateway.runtimes.factory); ``None``: the loop's."""
        ...

    def notify(self) -> None:
        """A turn ended (shutdown waits for that)."""
        ...

    async def wait_durable(self) -> None:
        """Return once everything emitted so far is committed."""
        ...

    async def delete_session(self, session: Any) -> None:
        """Delete a session (a Claude Code sub-agent's worker that never ran)."""
        ...


class TurnHost(ToolSession, Protocol):
    """The agent loop's narrow view of its session: it emits, records messages and the record."""

    record: SessionRecord
    steered: Pulse  # fired when a steer for the running turn is kept (a runtime's wake)

    messages: list[Message]  # the conversation (docs/protocol.md §2 "Edit and regenerate")
    rewound: list[Message]  # its rewound messages (gateway.session.rewind)

    @property
    def permissions(self) -> Permissions: ...

    @property
    def calls(self) -> CallStream: ...

    @property
    def depth(self) -> int:
        """0 for a root session, 1 for its workers, and so on (``max_delegate_depth``)."""
        ...

    def emit(self, payloads: Iterable[Payload | StreamEvent], turn_id: str | None) -> list[Emitted]:
        """Emit a batch of events in the session's stream."""
        ...

    def add_message(self, message: Message, completion: Completion | None = None) -> None:
        """Append or replace a message of the conversation."""
        ...

    def save_record(self) -> None:
        """Store the session record (turn count, cost, the turn in flight)."""
        ...

    def next_turn(self) -> None:
        """A turn ended: the next waiting one starts (docs/protocol.md §2 "A busy session")."""
        ...

    def take_steers(self, turn: Turn) -> list[Message]:
        """The messages steered into the running turn join it (§2 "A busy session"): those
        taken, announced with ``turn.steered``."""
        ...

    def end_turn(self, turn: Turn) -> None:
        """Release the turn lock."""
        ...

    def failed(self, component: str, exc: BaseException, turn_id: str | None = None) -> None:
        """Log and count a failure caught at the session's boundary."""
        ...


class WorkerHost(TurnHost, Protocol):
    """A worker session whose turn a runtime runs itself (a Claude Code sub-agent's)."""

    turn: Turn | None  # the turn lock: cancel and snapshot see the turn set here


class Runtime(Protocol):
    """What the loop needs of a runtime that runs its turns (docs/protocol.md §11)."""

    @property
    def client(self) -> object | None:
        """The runtime's process client while one runs (``None``: no process)."""
        ...

    async def run_turn(self, turn: Turn, state: TurnState) -> StopReason:
        """Run one turn; the loop emits its ending."""
        ...

    async def compact(self) -> None:
        """``POST .../compact``: the runtime compacts its own context."""
        ...


class RuntimeHost(Protocol):
    """The agent loop as a runtime sees it: its session, node, call and tool endings."""

    session: TurnHost
    node: AgentServices
    runtime: Runtime | None

    def __init__(self, session: TurnHost, node: AgentServices) -> None:
        """A loop of the same kind for another session (a sub-agent's worker)."""
        ...

    @property
    def agent(self) -> AgentProfile: ...

    async def run_turn(self, turn: Turn) -> None: ...

    def open_call(self, turn: Turn, state: TurnState) -> Call:
        """``llm.call_started`` and the call its stream is translated into."""
        ...

    def call_failed(self, turn: Turn, state: TurnState, call: Call) -> None:
        """``llm.call_failed`` for ``call``."""
        ...

    def tool_failed(
        self,
        turn: Turn,
        state: TurnState,
        block: ToolUseBlock,
        error_class: str,
        message: str,
        duration_ms: int | None = None,
    ) -> None:
        """``tool.failed``, with its result recorded in the conversation."""
        ...

    def _tool_result(
        self,
        turn: Turn,
        state: TurnState,
        block: ToolUseBlock,
        content: str,
        *,
        is_error: bool,
        structured: Any = None,
    ) -> None:
        """Record a tool's result in the conversation."""
        ...


RuntimeFactory = Callable[[RuntimeHost, trio.Nursery, ToolProcesses], Runtime]
"""Makes a loop's runtime: of the loop, in the nursery its process task runs in, with the
daemon's tool processes."""

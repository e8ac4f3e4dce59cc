"""What a Claude Code session's parts (approvals, sub-agents) need of the runtime that owns them.

:class:`~gateway.runtimes.claude_code.runtime.ClaudeCode` makes its
:class:`~gateway.runtimes.claude_code.permissions.Approvals` and
:class:`~gateway.runtimes.claude_code.subagents.SubAgents` and hands each
itself; they see it through :class:`Owner`, so neither imports the runtime
(no import cycle, the type checker's included).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import trio
from claude_agent_sdk import PermissionResultAllow, PermissionResultDeny, ToolPermissionContext

if TYPE_CHECKING:
    from gateway.agents import AgentProfile
    from gateway.session.loop_api import AgentServices, RuntimeHost, TurnHost, WorkerHost
    from gateway.session.turn import Turn, TurnState


class Asking(Protocol):
    """A runtime's approvals, as a sub-agent's request is handed to them."""

    @property
    def announced(self) -> dict[str, trio.Event]:
        """The tool uses whose ``tool.called`` was emitted, by id (set once it was)."""
        ...

    async def can_use_tool(
        self, name: str, input: dict[str, Any], context: ToolPermissionContext
    ) -> PermissionResultAllow | PermissionResultDeny: ...

    def refused(self, tool_use_id: str) -> None: ...

    def end(self, turn: Turn) -> None:
        """Cancel ``turn``'s open requests (the CLI went away asking)."""
        ...


class Worker(Protocol):
    """A sub-agent's worker, as the parent's approvals find it."""

    @property
    def send(self) -> trio.MemorySendChannel[Any]: ...

    @property
    def runtime(self) -> Owner: ...


class Workers(Protocol):
    """A runtime's sub-agents, as its approvals look one up."""

    async def wait_for(self, agent_id: str, wait_s: float) -> Worker | None: ...

    def runtimes(self) -> list[Owner]: ...


class Steers(Protocol):
    """A runtime's steering (:mod:`~gateway.runtimes.claude_code.steering`), as its approvals
    wait for a decision."""

    async def wait(self, done: trio.Event, wait_s: float) -> None: ...


class Owner(Protocol):
    """The runtime of one session (a worker's too), as its parts use it."""

    current: tuple[Turn, TurnState] | None
    background: bool  # a worker's: its sub-agent runs in the background

    @property
    def loop(self) -> RuntimeHost: ...

    @property
    def session(self) -> TurnHost: ...

    @property
    def node(self) -> AgentServices: ...

    @property
    def feed(self) -> trio.MemoryReceiveChannel[Any] | None: ...

    @property
    def agent(self) -> AgentProfile: ...

    @property
    def approvals(self) -> Asking: ...

    @property
    def subagents(self) -> Workers: ...

    @property
    def steering(self) -> Steers: ...

    def for_worker(self, worker: WorkerHost, feed: trio.MemoryReceiveChannel[Any]) -> Owner: ...

    def start_worker_turn(self, runtime: Owner, turn: Turn) -> None: ...

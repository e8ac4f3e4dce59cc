"""Claude Code's ``can_use_tool``, as the session's permission requests (docs/protocol.md §5).

``can_use_tool`` opens a request in the session's
:class:`~gateway.session.permissions.Permissions`, answered by the
permissions route; ``[tools] approval_timeout_s`` denies. It approves a tool
the agent's patterns allow and ``require_approval`` does not match, denies
one they do not allow, and asks the user for the rest (Claude Code itself
approves read-only commands). A use a rule of ``require_approval`` matches
(``Bash(rm:*)``, Claude Code's ``ask`` rule: :func:`.options.ask_rules`) asks
too. An agent without ``tools`` (Claude Code's default set) asks the user
whenever Claude Code's ``permission_mode`` asks.

- The CLI may ask before the message that holds the tool use has ended: the
  request waits for the tool's ``tool.called`` (:meth:`Approvals.announce`),
  so a client never sees a request for a tool it was not told of.
- A sub-agent's approvals are its worker's requests, in the worker's stream,
  answered from the parent (:mod:`gateway.runtimes.claude_code.subagents`).
- A tool denied through the route fails ``permission_denied``, as does one
  the workspace's boundary refused (:meth:`Approvals.refused`, never asked);
  a turn that ends early resolves its open requests ``cancelled``
  (:meth:`Approvals.end`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import trio
from claude_agent_sdk import PermissionResultAllow, PermissionResultDeny, ToolPermissionContext

from gateway.ids import now_ms
from gateway.protocol.claude_code_tools import rule_tool
from gateway.protocol.events import PermissionRequested, PermissionResolved
from gateway.protocol.shapes import ToolUseBlock
from gateway.runtimes.claude_code.options import ask_rules
from gateway.runtimes.claude_code.subagents import Flush
from gateway.session.permissions import PermissionRequest
from gateway.session.turn import Turn

if TYPE_CHECKING:
    from gateway.runtimes.claude_code.owner import Owner

Answer = PermissionResultAllow | PermissionResultDeny


class Approvals:
    """The tool uses of the turn in flight: announced, approved, denied (module docstring)."""

    def __init__(self, runtime: Owner) -> None:
        self._runtime = runtime
        self.open: list[PermissionRequest] = []
        self.announced: dict[str, trio.Event] = {}  # by tool use id: its tool.called is out
        self.denied: set[str] = set()
        self.started: dict[str, float] = {}  # by tool use id: when it was approved or announced

    def announce(self, tool_uses: Sequence[ToolUseBlock]) -> None:
        """The tool uses' ``tool.called`` is out: their requests may open now."""
        now = trio.current_time()
        for block in tool_uses:
            self.started[block.id] = now
            self.announced.setdefault(block.id, trio.Event()).set()

    def refused(self, tool_use_id: str) -> None:
        """The workspace's boundary refused a tool use (its ``PreToolUse`` hook,
        :mod:`~gateway.runtimes.claude_code.boundary`): it fails ``permission_denied``,
        in whichever stream shows it (a sub-agent's is its worker's)."""
        self.denied.add(tool_use_id)
        for sub in self._runtime.subagents.runtimes():
            sub.approvals.refused(tool_use_id)

    def reset(self) -> None:
        """The turn ended."""
        self.announced.clear()
        self.denied.clear()
        self.started.clear()

    async def can_use_tool(
        self, name: str, input: dict[str, Any], context: ToolPermissionContext
    ) -> Answer:
        """Claude Code asks: a permission request answered through the route (module docstring)."""
        runtime = self._runtime
        current = runtime.current
        if current is None:
            return PermissionResultDeny(message="no turn is running", interrupt=True)
        turn = current[0]
        tool_use_id = context.tool_use_id or ""
        agent = runtime.agent
        # Claude Code's default tools: its permission_mode asked, so the user is asked;
        # so is a tool an ask rule of require_approval names (it matched: ask_rules).
        asks = agent.needs_approval(name) or any(rule_tool(p) == name for p in ask_rules(agent))
        if not agent.default_tools and not asks:  # a glob: ours
            if agent.allows(name):
                return PermissionResultAllow()
            self.denied.add(tool_use_id)
            return PermissionResultDeny(message=f"{name} is not one of the agent's tools")
        timeout = runtime.node.config.tools.approval_timeout_s
        if context.agent_id is not None and runtime.feed is None:  # a sub-agent asks
            sub = await runtime.subagents.wait_for(context.agent_id, timeout)
            if sub is not None:  # its worker's request (docs/protocol.md §5): in its stream
                with contextlib.suppress(trio.ClosedResourceError):
                    sub.send.send_nowait(Flush(tool_use_id))
                return await sub.runtime.approvals.can_use_tool(name, input, context)
        if context.agent_id is None or runtime.feed is not None:  # announced first: tool.called
            with trio.move_on_after(timeout):
                await self.announced.setdefault(tool_use_id, trio.Event()).wait()
        if not turn.in_flight or runtime.current is not current:
            return PermissionResultDeny(message="the turn ended", interrupt=True)
        return await self._ask(turn, tool_use_id, name, input, timeout)

    async def _ask(
        self, turn: Turn, tool_use_id: str, name: str, input: dict[str, Any], wait_s: float
    ) -> Answer:
        """The request, in the session's stream, until decided or ``wait_s``."""
        s = self._runtime.session
        expires_at = now_ms() + round(wait_s * 1000)
        request = s.permissions.open(tool_use_id, name, input, expires_at)
        self.open.append(request)
        s.emit(
            [PermissionRequested(request.perm_id, tool_use_id, name, input, expires_at)], turn.id
        )
        # Cancelled here (the CLI went away: the SDK cancels its callbacks), the
        # request stays in ``open`` and the turn's end resolves it (:meth:`end`). A
        # steer that comes meanwhile is handed to the CLI at once (it waits for this).
        await self._runtime.steering.wait(request.decided, wait_s)
        if request.closed:  # the turn's end resolved it already
            return PermissionResultDeny(message="cancelled", interrupt=True)
        self.open.remove(request)
        request.closed = True
        request.decision = request.decision or "timeout"
        s.emit([PermissionResolved(request.perm_id, request.decision)], turn.id)  # type: ignore[arg-type]
        if request.decision == "allow":
            if turn.phase == "seam":
                turn.enter("tools")
            self.started[tool_use_id] = trio.current_time()
            return PermissionResultAllow()
        self.denied.add(tool_use_id)
        verb = "was denied" if request.decision == "deny" else "timed out"
        return PermissionResultDeny(message=f"permission for {name} {verb}")

    def end(self, turn: Turn) -> None:
        """A turn that ends early resolves its open requests ``cancelled`` (docs/protocol.md §5)."""
        for request in list(self.open):
            request.closed = True
            request.decision = request.decision or "cancelled"
            resolved = PermissionResolved(request.perm_id, request.decision)  # type: ignore[arg-type]
            self._runtime.session.emit([resolved], turn.id)
            request.decided.set()
        self.open.clear()

"""``runtime = "claude-code"``: a session run by Claude Code, through the Claude Agent SDK.

PROTOCOL section 11 maps what the SDK says onto the events every client
already reads; this module is that mapping. The stream is the same contract,
event for event, as the gateway's own agent loop (:mod:`gateway.session.agent`),
whose turn lifecycle, cancel sequences and endings it reuses:

==============================================  =========================================
Claude Agent SDK                                events
==============================================  =========================================
the partial stream events of an assistant       ``llm.call_started``, then the
message (``StreamEvent.event``: the Messages    translator's ``message.start``, blocks,
API's raw stream events)                        ``message.complete``; ``llm.call_completed``
a ``tool_use`` block, its ``tool_result`` in    ``tool.called`` (with the call's end),
the next user message                           ``tool.completed`` or ``tool.failed``
``can_use_tool``                                ``permission.requested`` (``tool``),
                                                ``permission.resolved``
the result message                              ``turn.completed`` (usage; the cost is
                                                the CLI's ``total_cost_usd`` for the turn)
an error of the API or of the CLI               ``llm.call_failed`` (its class)
a cancel (``interrupt()``)                      the sequences of PROTOCOL section 8
==============================================  =========================================

**The stream events go through the gateway's translator.** Each
``StreamEvent.event`` is converted field for field into a
:mod:`raw event <gateway.providers.raw>` (as the Anthropic provider converts
the SDK's) and fed to the session's :class:`~gateway.session.call.CallStream`,
so ids, block lifecycle, snapshots, replay and the seam are the native ones.
The message id is the API's own. The text, thinking and tool blocks of the
SDK's ``AssistantMessage`` repeat what the stream said and are not used.

**One process per session.** The session's CLI is started at its first turn,
as the task ``claude-code <session id>`` in a nursery of the session's
``agent-loop`` task (it ends with the session), and serves every later turn.
It is a tool process (:mod:`gateway.runtimes.transport`): its own process
group, registered with the daemon's watchdog, a minimal environment. Its
``HOME`` and ``CLAUDE_CONFIG_DIR`` are ``.claude-code/<session id>`` beside
``[sessions] workspace_root`` (its transcripts live there), never the
operator's ``~/.claude``. The CLI is stopped once the session has had no turn
for the agent's ``idle_process_s`` (the task ``claude-code-idle <session id>``).
The Claude Code session id is derived from the gateway session's
(:func:`claude_session_id`), so whenever a CLI starts again (after an idle
stop, a crash, a restart of the daemon) it resumes the transcript it finds in
the state directory (``resume``), and the conversation goes on.

**Options.** ``cwd`` is the session's workspace; the agent's ``system`` is
appended to Claude Code's own prompt; ``tools`` lists the tools Claude Code
may use (their plain names become its ``tools``), those not matched by
``require_approval`` its ``allowed_tools`` (approved without asking); the
others ask ``can_use_tool`` (Claude Code itself approves read-only
commands); ``permission_mode`` is passed as is (``bypassPermissions`` is the
operator's choice only); the model is the part after ``anthropic:``; a
thinking budget turns thinking on.

**Permissions.** ``can_use_tool`` opens a request in the session's
:class:`~gateway.session.permissions.Permissions`, answered by the
permissions route; ``[tools] approval_timeout_s`` denies. The CLI may ask
before the message that holds the tool use has ended: the request waits for
the tool's ``tool.called``, so a client never sees a request for a tool it
was not told of.

**Cancellation.** A cancel cancels the turn's scope as for the native runtime;
on the way out this module resolves the open permission requests
(``cancelled``) and sends ``interrupt()``, shielded and bounded
(:data:`INTERRUPT_TIMEOUT_S`); then the agent loop emits the sequence of
the turn's phase (PROTOCOL section 8). The interrupted query's remaining
messages and its result are read and dropped before the next query.

Where the contract is silent:

- The turn's phase: ``llm`` from the query until a message ends, ``seam``
  from a message with tool uses until a permission is granted or a result
  comes back, ``tools`` then, ``llm`` again at the next message.
- A tool denied through the permissions route fails ``permission_denied``; a
  tool result Claude Code marks as an error fails ``error``.
- A query that fails before its stream starts (the API refused it, the CLI
  could not run) is one ``llm.call_started`` and ``llm.call_failed``: by the
  API's status (:func:`~gateway.providers.errors.status_class`), ``network``
  when the CLI exited, ``api_error`` otherwise. ``error_max_turns`` is
  ``max_rounds``.
- Messages of sub-agents (``parent_tool_use_id``) are not streamed yet; their
  ``Task`` tool use and result are.
"""

from __future__ import annotations

import dataclasses
import glob
import logging
import math
import os
import uuid
import warnings
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import msgspec
import trio
from claude_agent_sdk import (
    AssistantMessage,
    CanUseToolShadowedWarning,
    ClaudeAgentOptions,
    ClaudeSDKClient,
    PermissionResultAllow,
    PermissionResultDeny,
    ResultMessage,
    StreamEvent,
    SystemMessage,
    ToolPermissionContext,
    UserMessage,
)
from claude_agent_sdk import ToolResultBlock as SdkToolResult
from claude_agent_sdk._version import __version__ as SDK_VERSION
from claude_agent_sdk.types import McpHttpServerConfig, McpStdioServerConfig, SystemPromptPreset
from claude_agent_sdk.types import McpServerConfig as McpServerConfigSdk

from gateway.agents import AgentProfile
from gateway.config import McpServerConfig
from gateway.ids import new_call_id, now_ms
from gateway.logs import event
from gateway.protocol.events import (
    LlmCallCompleted,
    LlmCallFailed,
    LlmCallStarted,
    PermissionRequested,
    PermissionResolved,
    ToolCalled,
    ToolCompleted,
)
from gateway.protocol.shapes import StopReason, TextBlock, ToolUseBlock, Usage
from gateway.providers.errors import status_class
from gateway.providers.raw import RawEvent, RawMessageStart, RawMessageStop
from gateway.runtimes.transport import ToolProcessTransport
from gateway.session.call import Call, EndCall
from gateway.session.permissions import PermissionRequest
from gateway.session.turn import Turn
from gateway.tools.process import ToolProcesses
from gateway.translate import Translator, max_blocks

if TYPE_CHECKING:
    from gateway.session.agent import AgentLoop, TurnState

log = logging.getLogger("gateway.claude_code")

# ``allowed_tools`` are the tools approved without asking (not in ``require_approval``):
# that they never reach ``can_use_tool`` is the point, not a mistake to warn of.
warnings.filterwarnings("ignore", category=CanUseToolShadowedWarning)

INTERRUPT_TIMEOUT_S = 0.5
"""How long a cancel waits for the CLI to take its ``interrupt`` (shielded)."""

DRAIN_TIMEOUT_S = 10.0
"""How long the next turn waits for an interrupted query's result before restarting the CLI."""

QUIET_ENV = {
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "DISABLE_TELEMETRY": "1",
    "DISABLE_AUTOUPDATER": "1",
    "DISABLE_ERROR_REPORTING": "1",
}
"""What keeps the CLI from calling anything but the model API."""

_MODEL_PREFIX = "anthropic:"
_NAMESPACE = uuid.UUID("5b0c6a8e-3f1d-4a57-9c2e-7d4b1e0f9a63")  # of claude_session_id
_STOP_REASONS = {"end_turn", "max_tokens", "stop_sequence", "tool_use"}


def state_dir(workspace_root: str, session_id: str) -> str:
    """The CLI's ``HOME`` and ``CLAUDE_CONFIG_DIR`` of a session (module docstring)."""
    return os.path.join(os.path.dirname(workspace_root), ".claude-code", session_id)


def cli_environment(
    agent: AgentProfile,
    home: str,
    env: Mapping[str, str] | None = None,
    max_retries: int | None = None,
) -> dict[str, str]:
    """The variables the CLI gets beyond the tool environment (PROTOCOL section 15).

    ``[model] max_retries`` is the CLI's ``CLAUDE_CODE_MAX_RETRIES`` (its own
    retries of a failed API call), unless the agent's ``env`` sets it. The
    agent's ``env`` then; the gateway's own win: the provider key, the
    endpoint, the state directory and the switches of :data:`QUIET_ENV`.
    """
    source = os.environ if env is None else env
    out = {} if max_retries is None else {"CLAUDE_CODE_MAX_RETRIES": str(max_retries)}
    out.update(agent.env)
    out.update(QUIET_ENV)
    out.update(
        {
            "HOME": home,
            "CLAUDE_CONFIG_DIR": os.path.join(home, ".claude"),
            "ANTHROPIC_API_KEY": source.get("ANTHROPIC_API_KEY", ""),
            "CLAUDE_CODE_ENTRYPOINT": "sdk-py",
            "CLAUDE_AGENT_SDK_VERSION": SDK_VERSION,
            "CLAUDE_CODE_SDK_READS_SESSION_STATE": "1",
        }
    )
    if agent.base_url:
        out["ANTHROPIC_BASE_URL"] = agent.base_url
    return out


def mcp_servers(
    agent: AgentProfile, servers: Mapping[str, McpServerConfig], daemon_cwd: str
) -> dict[str, McpServerConfigSdk]:
    """The ``[mcp_servers.*]`` the agent's ``tools`` reach, as the CLI's ``mcp_servers``.

    Claude Code starts and talks to them itself (its tools are then
    ``mcp__<server>__<tool>``, as the native runtime names them). A stdio
    server runs in its ``cwd`` (the daemon's when none is set), as the native
    runtime runs it: Claude Code has no such key, so the command goes through
    ``/bin/sh -c 'cd "$0" && exec "$@"'``. Each CLI runs its own servers
    (``scope`` is always ``session``); ``startup_timeout_s`` and
    ``tool_timeout_s`` are Claude Code's own (``MCP_TIMEOUT``,
    ``MCP_TOOL_TIMEOUT`` in the agent's ``env``).
    """
    out: dict[str, McpServerConfigSdk] = {}
    for name, server in servers.items():
        if not agent.uses_server(name):
            continue
        if server.url:
            out[name] = McpHttpServerConfig(
                type="http", url=server.url, headers=dict(server.headers)
            )
        else:
            cwd = server.cwd or daemon_cwd
            out[name] = McpStdioServerConfig(
                type="stdio",
                command="/bin/sh",
                args=["-c", 'cd "$0" && exec "$@"', cwd, *server.command],
                env=dict(server.env),
            )
    return out


def claude_session_id(session_id: str) -> str:
    """The Claude Code session id of a gateway session: a UUID derived from its id.

    Derived, not stored: every start of the session's CLI (after an idle stop,
    a crash, a restart of the daemon) finds the same transcript by it.
    """
    return str(uuid.uuid5(_NAMESPACE, session_id))


def has_transcript(home: str, claude_id: str) -> bool:
    """Whether the CLI wrote a transcript of ``claude_id`` under ``home`` (blocking)."""
    projects = os.path.join(home, ".claude", "projects")
    return bool(glob.glob(os.path.join(glob.escape(projects), "*", f"{claude_id}.jsonl")))


class _ProcessGone(Exception):
    """The CLI's stream ended while a turn waited for it."""


class ClaudeCode:
    """One session's Claude Code process, and the turns it runs (module docstring).

    Args:
        loop: the session's agent loop (its emission, endings and cancel sequences).
        nursery: where the process task runs (the agent loop's own, inside the session's).
        processes: the daemon's tool processes.
    """

    def __init__(self, loop: AgentLoop, nursery: trio.Nursery, processes: ToolProcesses) -> None:
        self.loop = loop
        self.s = loop.s
        self.node = loop.node
        self._nursery = nursery
        self._processes = processes
        self.client: ClaudeSDKClient | None = None
        self.transport: ToolProcessTransport | None = None
        self._inbox: trio.MemoryReceiveChannel[Any] | None = None
        self._scope: trio.CancelScope | None = None  # the process task's
        self._stopped = trio.Event()  # set when the process task (the current one) ends
        self._stopped.set()  # none runs yet
        self._owed = 0  # results of queries whose turn stopped listening
        self._cost_seen = 0.0  # the CLI's total_cost_usd at its last result
        self._current: tuple[Turn, TurnState] | None = None
        self._active_at = trio.current_time()  # the last turn's start or end (idle_process_s)
        self._quiet = trio.Event()  # set when the turn in flight ends
        self._announced: dict[str, trio.Event] = {}
        self._open: list[PermissionRequest] = []
        self._denied: set[str] = set()
        self._tool_started: dict[str, float] = {}

    @property
    def agent(self) -> AgentProfile:
        return self.loop.agent

    # --- the process -------------------------------------------------------------------

    def options(self, workspace: str, resume: bool = False) -> ClaudeAgentOptions:
        """The SDK's options for this session's CLI (module docstring).

        ``resume``: the Claude Code session of this gateway session has a
        transcript already, which the CLI continues.
        """
        agent = self.agent
        claude_id = claude_session_id(self.s.id)
        plain = [t for t in agent.tools if not any(c in t for c in "*?[") and "__" not in t]
        prompt = SystemPromptPreset(type="preset", preset="claude_code")
        if agent.system:
            prompt["append"] = agent.system
        budget = agent.thinking_budget_tokens
        return ClaudeAgentOptions(
            include_partial_messages=True,
            cwd=workspace,
            model=agent.model.removeprefix(_MODEL_PREFIX),
            system_prompt=prompt,
            tools=plain,
            allowed_tools=[_cli_rule(t) for t in agent.tools if not agent.needs_approval(t)],
            permission_mode=agent.permission_mode,  # type: ignore[arg-type]
            can_use_tool=self._can_use_tool,
            resume=claude_id if resume else None,
            session_id=None if resume else claude_id,
            setting_sources=[],
            mcp_servers=mcp_servers(agent, self.node.config.mcp_servers, os.getcwd()),
            thinking={"type": "enabled", "budget_tokens": budget} if budget else None,
        )

    async def _start(self) -> None:
        """Start the session's CLI if it is not running, in a process slot of its agent.

        The turn's POST held the slot already (:mod:`gateway.runtimes.slots`);
        a turn whose process was stopped since (idle, or to make room) waits
        here for a slot, within the turn.
        """
        if self.client is None:
            await self._stopped.wait()  # a process still stopping holds its slot until it ends
            agent, slots = self.agent, self.node.process_slots
            await slots.acquire(agent.name, agent.max_processes, self.s.id, math.inf)
            try:
                await self._nursery.start(self._serve, name=f"claude-code {self.s.id}")
            except BaseException:
                if self.client is None:
                    slots.release(agent.name, self.s.id)
                raise

    def idle(self) -> bool:
        """Whether no turn of the session is in flight or queued (its slot may be taken)."""
        return self._current is None and getattr(self.s, "turn", None) is None

    def idle_since(self) -> float:
        return self._active_at

    async def _serve(self, *, task_status: trio.TaskStatus[None]) -> None:
        """The process task: start the CLI, pass on what it says, stop it (shielded) at the end."""
        s = self.s
        workspace = await trio.to_thread.run_sync(
            self.node.workspaces.host_path, s.record.workspace_path
        )
        home = state_dir(self.node.workspaces.root, s.id)
        await trio.to_thread.run_sync(lambda: os.makedirs(home, mode=0o700, exist_ok=True))
        resume = await trio.to_thread.run_sync(has_transcript, home, claude_session_id(s.id))
        options = self.options(workspace, resume)
        transport = ToolProcessTransport(
            dataclasses.replace(options, permission_prompt_tool_name="stdio"),
            self._processes,
            workspace,
            cli_environment(self.agent, home, max_retries=self.node.config.model.max_retries),
            grace_s=self.node.config.tools.kill_grace_s,
        )
        client = ClaudeSDKClient(options, transport=transport)
        send, receive = trio.open_memory_channel[Any](math.inf)
        stopped = self._stopped = trio.Event()
        with trio.CancelScope() as scope, send:
            try:
                await client.connect()
                self.client, self.transport, self._inbox, self._scope = (
                    client, transport, receive, scope
                )  # fmt: skip
                self._owed = 0
                self.node.process_slots.attach(self.agent.name, s.id, self)
                task_status.started()
                event(
                    log, logging.INFO, "claude_code_started",
                    f"session {s.id}: Claude Code started (pid {transport.pid})",
                    session_id=s.id, pid=transport.pid, resume=resume,
                )  # fmt: skip
                try:
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(self._idle, scope, name=f"claude-code-idle {s.id}")
                        async for message in client.receive_messages():
                            send.send_nowait(message)
                        nursery.cancel_scope.cancel()
                except Exception as exc:  # the CLI's stream broke: the turn sees it end
                    event(
                        log, logging.WARNING, "claude_code_exited",
                        f"session {s.id}: Claude Code's stream ended: {exc}",
                        session_id=s.id, error=str(exc),
                    )  # fmt: skip
            finally:
                if self.client is client:
                    self.client = self.transport = self._inbox = self._scope = None
                with trio.CancelScope(shield=True):
                    await client.disconnect()
                self.node.process_slots.release(self.agent.name, s.id)
                stopped.set()

    async def _idle(self, scope: trio.CancelScope) -> None:
        """Stop the CLI once no turn has run for the agent's ``idle_process_s``.

        Its next turn starts another, which resumes the conversation from the
        transcript in the session's state directory.
        """
        idle = self.agent.idle_process_s
        while True:
            if self._current is not None:
                await self._quiet.wait()
            await trio.sleep_until(self._active_at + idle)
            if self._current is None and trio.current_time() >= self._active_at + idle:
                event(
                    log, logging.INFO, "claude_code_idle",
                    f"session {self.s.id}: Claude Code stopped after {idle:g} s idle",
                    session_id=self.s.id, idle_s=idle,
                )  # fmt: skip
                scope.cancel()
                return

    def stop(self) -> None:
        """Stop the session's CLI (the process task ends; its group is stopped)."""
        if self._scope is not None:
            self._scope.cancel()

    async def _settle_previous(self) -> None:
        """Read and drop what an interrupted query still said, up to its result."""
        inbox = self._inbox
        if not self._owed or inbox is None:
            return
        with trio.move_on_after(DRAIN_TIMEOUT_S):
            while self._owed:
                try:
                    message = await inbox.receive()
                except trio.EndOfChannel:
                    break
                if isinstance(message, ResultMessage):
                    self._owed -= 1
                    self._cost_seen = message.total_cost_usd or self._cost_seen
        if self._owed:  # no result came: a CLI that does not answer is started again
            self._owed = 0
            stopped = self._stopped
            self.stop()
            await stopped.wait()

    # --- a turn ------------------------------------------------------------------------

    async def run_turn(self, turn: Turn, state: TurnState) -> StopReason:
        """Run one turn through Claude Code; the agent loop emits its ending."""
        self._current = (turn, state)
        self._active_at, self._quiet = trio.current_time(), trio.Event()
        try:
            await self._settle_previous()
            turn.enter("llm")
            try:
                await self._start()
                assert self.client is not None
                prompt = "".join(
                    b.text for b in turn.user_message.content if isinstance(b, TextBlock)
                )
                self._owed += 1
                await self.client.query(prompt)
                return await self._follow(turn, state)
            except _ProcessGone:
                return self._failed(turn, state, "network", "the Claude Code process exited")
            except Exception as exc:  # the SDK or the CLI failed: the call's failure
                if isinstance(exc, AssertionError):
                    raise
                message = f"Claude Code failed: {type(exc).__name__}: {exc}"
                return self._failed(turn, state, "api_error", message)
        finally:
            self._current = None
            self._active_at = trio.current_time()
            self._quiet.set()
            if turn.in_flight:  # cancelled, or broken: close the requests, stop the query
                self._end_permissions(turn)
                await self._interrupt()
            self._announced.clear()
            self._denied.clear()
            self._tool_started.clear()

    async def _interrupt(self) -> None:
        client = self.client
        if client is None or not self._owed:
            return
        with trio.CancelScope(shield=True), trio.move_on_after(INTERRUPT_TIMEOUT_S):
            try:
                await client.interrupt()
            except Exception as exc:
                event(
                    log, logging.WARNING, "claude_code_interrupt_failed",
                    f"session {self.s.id}: the interrupt failed: {exc}",
                    session_id=self.s.id, error=str(exc),
                )  # fmt: skip

    async def _follow(self, turn: Turn, state: TurnState) -> StopReason:
        """Map what Claude Code says until the query's result (module docstring)."""
        inbox = self._inbox
        assert inbox is not None
        while True:
            try:
                message = await inbox.receive()
            except trio.EndOfChannel:
                raise _ProcessGone from None
            if isinstance(message, StreamEvent):
                if message.parent_tool_use_id is None:
                    await self._stream_event(turn, state, message.event)
            elif isinstance(message, UserMessage):
                if message.parent_tool_use_id is None:
                    self._tool_results(turn, state, message)
            elif isinstance(message, SystemMessage):
                pass  # init, status, thinking_tokens: nothing for the clients (yet)
            elif isinstance(message, ResultMessage):
                self._owed -= 1
                return self._result(turn, state, message)
            elif isinstance(message, AssistantMessage):
                pass  # what the stream said already

    async def _stream_event(self, turn: Turn, state: TurnState, data: dict[str, Any]) -> None:
        s = self.s
        try:
            raw = msgspec.convert(data, RawEvent)
        except msgspec.ValidationError as exc:
            if state.call is not None and not state.call.done.is_set():
                message = f"unsupported {data.get('type')} event from Claude Code: {exc}"
                s.calls.settle(EndCall("api_error", message))
            return
        if isinstance(raw, RawMessageStart):
            if raw.message.model and not raw.message.model.startswith(_MODEL_PREFIX):
                raw.message.model = _MODEL_PREFIX + raw.message.model
            self._start_call(turn, state)
        call = state.call
        if call is None or call.done.is_set():
            return
        await s.calls.feed(raw)
        if isinstance(raw, RawMessageStop):
            self._end_call(turn, state, call)

    def _start_call(self, turn: Turn, state: TurnState) -> None:
        """A new LLM call of the turn: ``llm.call_started``, a translator, the call in flight."""
        s = self.s
        if turn.phase != "llm":
            turn.enter("llm")
        state.rounds += 1
        state.results_message = None  # the next tool results are a new message
        model = s.record.active_model
        state.call_id = new_call_id()
        s.emit([LlmCallStarted(state.call_id, model)], turn.id)
        call = Call(
            turn.id,
            Translator(
                session_id=s.id,
                turn_id=turn.id,
                model=model,
                created_at=now_ms(),
                pricing=self.node.pricing(model),
                max_blocks=max_blocks(self.node.config.stream.snapshot_max_bytes),
            ),
        )
        s.calls.start(call)
        state.call = call

    def _end_call(self, turn: Turn, state: TurnState, call: Call) -> None:
        """The message ended: ``llm.call_completed``, then its tool uses' ``tool.called``."""
        s = self.s
        s.calls.settle(EndCall())
        state.usage += call.translator.usage
        message = call.translator.message
        stop_reason = call.translator.stop_reason
        if call.error_class is not None or message is None or stop_reason is None:
            return  # the result closes the turn with the failure
        s.emit(
            [LlmCallCompleted(state.call_id, message.id, stop_reason, message.usage or Usage())],
            turn.id,
        )
        turn.enter("seam")
        tool_uses = [b for b in message.content if isinstance(b, ToolUseBlock)]
        if not tool_uses:
            return
        s.emit([ToolCalled(b.id, b.name, b.input) for b in tool_uses], turn.id)
        state.pending_tools += tool_uses
        state.tool_uses += len(tool_uses)
        now = trio.current_time()
        for block in tool_uses:
            self._tool_started[block.id] = now
            self._announced.setdefault(block.id, trio.Event()).set()

    def _tool_results(self, turn: Turn, state: TurnState, message: UserMessage) -> None:
        """A user message with tool results: each pending tool completes or fails."""
        if isinstance(message.content, str):
            return
        pending = {b.id: b for b in state.pending_tools}
        for result in message.content:
            if not isinstance(result, SdkToolResult):
                continue
            block = pending.get(result.tool_use_id)
            if block is None:
                continue
            if turn.phase == "seam":
                turn.enter("tools")
            text = _result_text(result.content)
            started = self._tool_started.get(block.id, trio.current_time())
            ms = round((trio.current_time() - started) * 1000)
            if result.is_error:
                denied = block.id in self._denied
                error_class = "permission_denied" if denied else "error"
                self.loop.tool_failed(turn, state, block, error_class, text, ms)
            else:
                self.loop._tool_result(turn, state, block, text, is_error=False)
                self.s.emit([ToolCompleted(block.id, block.name, text, ms)], turn.id)

    def _result(self, turn: Turn, state: TurnState, result: ResultMessage) -> StopReason:
        """The query's result: how the turn ends (the agent loop emits ``turn.completed``)."""
        total = result.total_cost_usd
        if total is not None:
            cost, self._cost_seen = max(0.0, total - self._cost_seen), total
            state.usage.cost_usd = cost
        if result.subtype == "error_max_turns":
            return self._close_pending(turn, state, "max_rounds")
        if result.is_error:
            status = result.api_error_status
            error_class = status_class(status) if status else "api_error"
            detail = "; ".join(result.errors or []) or result.result or result.subtype
            return self._failed(turn, state, error_class, f"Claude Code: {detail}")
        call = state.call
        stop = call.translator.stop_reason if call is not None else None
        reason = result.stop_reason if result.stop_reason in _STOP_REASONS else stop
        return self._close_pending(turn, state, reason or "end_turn")  # type: ignore[arg-type]

    def _close_pending(self, turn: Turn, state: TurnState, reason: StopReason) -> StopReason:
        for block in list(state.pending_tools):  # Claude Code gave no result for it
            self.loop.tool_failed(turn, state, block, "error", "Claude Code gave no result")
        return reason

    def _failed(self, turn: Turn, state: TurnState, error_class: str, message: str) -> StopReason:
        """A failed call: the one streaming is closed, else one is started and failed."""
        s = self.s
        call = state.call
        if call is not None and not call.done.is_set():
            s.calls.settle(EndCall(error_class, message))
            self.loop.call_failed(turn, state, call)
        else:
            state.call = None
            state.call_id = new_call_id()
            s.emit(
                [
                    LlmCallStarted(state.call_id, s.record.active_model),
                    LlmCallFailed(state.call_id, error_class, message),  # type: ignore[arg-type]
                ],
                turn.id,
            )
        state.call_failed_emitted = True
        self._end_permissions(turn)  # the CLI went away asking: cancelled, before the tool fails
        self.node.metrics.provider_errors.labels(error_class).inc()
        event(
            log, logging.WARNING, "provider_error",
            f"turn {turn.id}: Claude Code's call failed: {error_class}: {message}",
            session_id=s.id, turn_id=turn.id, code=error_class, error=message,
            model=s.record.active_model,
        )  # fmt: skip
        self._close_pending(turn, state, "error")
        return "error"

    # --- permissions -------------------------------------------------------------------

    async def _can_use_tool(
        self, name: str, input: dict[str, Any], context: ToolPermissionContext
    ) -> PermissionResultAllow | PermissionResultDeny:
        """Claude Code asks: a permission request answered through the route (module docstring)."""
        current = self._current
        if current is None:
            return PermissionResultDeny(message="no turn is running", interrupt=True)
        turn, _state = current
        s = self.s
        tool_use_id = context.tool_use_id or ""
        agent = self.agent
        if not agent.needs_approval(name):  # a glob of tools Claude Code cannot read: ours
            if agent.allows(name):
                return PermissionResultAllow()
            self._denied.add(tool_use_id)
            return PermissionResultDeny(message=f"{name} is not one of the agent's tools")
        timeout = self.node.config.tools.approval_timeout_s
        if context.agent_id is None:  # a sub-agent's tools are not announced (yet)
            with trio.move_on_after(timeout):
                await self._announced.setdefault(tool_use_id, trio.Event()).wait()
        if not turn.in_flight or self._current is not current:
            return PermissionResultDeny(message="the turn ended", interrupt=True)
        expires_at = now_ms() + round(timeout * 1000)
        request = s.permissions.open(tool_use_id, name, input, expires_at)
        self._open.append(request)
        s.emit(
            [PermissionRequested(request.perm_id, tool_use_id, name, input, expires_at)], turn.id
        )
        # Cancelled here (the CLI went away: the SDK cancels its callbacks), the
        # request stays in ``_open`` and the turn's end resolves it (_end_permissions).
        with trio.move_on_after(timeout):
            await request.decided.wait()
        if request.closed:  # the turn's end resolved it already
            return PermissionResultDeny(message="cancelled", interrupt=True)
        self._open.remove(request)
        request.closed = True
        request.decision = request.decision or "timeout"
        s.emit([PermissionResolved(request.perm_id, request.decision)], turn.id)  # type: ignore[arg-type]
        if request.decision == "allow":
            if turn.phase == "seam":
                turn.enter("tools")
            self._tool_started[tool_use_id] = trio.current_time()
            return PermissionResultAllow()
        self._denied.add(tool_use_id)
        verb = "was denied" if request.decision == "deny" else "timed out"
        return PermissionResultDeny(message=f"permission for {name} {verb}")

    def _end_permissions(self, turn: Turn) -> None:
        """A turn that ends early resolves its open requests ``cancelled`` (PROTOCOL section 5)."""
        for request in list(self._open):
            request.closed = True
            request.decision = request.decision or "cancelled"
            self.s.emit([PermissionResolved(request.perm_id, request.decision)], turn.id)  # type: ignore[arg-type]
            request.decided.set()
        self._open.clear()


def _cli_rule(pattern: str) -> str:
    """A pattern of ``tools`` as a rule of Claude Code's ``allowed_tools``.

    ``mcp__<server>__*`` is Claude Code's ``mcp__<server>`` (every tool of the
    server); another glob is passed as is, and a tool it should match but
    Claude Code does not is decided by ``can_use_tool`` against the agent's
    own patterns (approved unless ``require_approval`` matches it).
    """
    if pattern.startswith("mcp__") and pattern.endswith("__*"):
        server = pattern[5:-3]
        if not any(c in server for c in "*?[") and "__" not in server:
            return f"mcp__{server}"
    return pattern


def _result_text(content: str | list[dict[str, Any]] | None) -> str:
    """A tool result's content as text (its text parts, joined)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))

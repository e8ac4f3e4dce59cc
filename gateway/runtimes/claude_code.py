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
a sub-agent (``TaskStartedMessage``, then       a worker session (``parent_session_id``):
messages with ``parent_tool_use_id``)           ``delegate.started``, its turn in its own
                                                stream, ``delegate.completed``/``failed``
``compact_boundary``                            ``context.compacting``, ``context.compacted``
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

**Processes at once.** The agent's ``max_processes`` bounds its CLIs on this
node (:mod:`gateway.runtimes.slots`): a turn holds a slot before its POST
answers; an idle CLI is stopped to make room; after ``SLOT_WAIT_S`` the POST
is 503 ``over_capacity``. A CLI that dies mid-turn closes the turn as a
network failure (``llm.call_failed`` ``network``, an open permission
request resolved ``cancelled``, ``turn.completed`` ``error``); the next turn
starts another, which resumes (the cut turn's prompt is in the resumed
transcript only if the killed CLI had written it; its partial answer never).

**Options.** ``cwd`` is the session's workspace; the agent's ``system`` is
appended to Claude Code's own prompt; ``tools`` lists the tools Claude Code
may use (their plain names become its ``tools``), those not matched by
``require_approval`` its ``allowed_tools`` (approved without asking;
``mcp__<server>__*`` as Claude Code's ``mcp__<server>``); the others ask
``can_use_tool``, which approves a tool the agent's patterns allow and
``require_approval`` does not match, denies one they do not allow, and asks
the user for the rest (Claude Code itself approves read-only commands);
the ``[mcp_servers.*]`` the agent's ``tools`` reach are its ``mcp_servers``
(:func:`mcp_servers`); ``permission_mode`` is passed as is
(``bypassPermissions`` is the operator's choice only); the model is the part
after ``anthropic:``; a thinking budget turns thinking on; ``[model]
max_retries`` is its ``CLAUDE_CODE_MAX_RETRIES`` (Claude Code also sends a
refused call, a 400, twice more with fewer beta headers, on its own).

**Sub-agents.** Claude Code runs a sub-agent for an ``Agent`` (``Task``) tool
use, and streams only the main thread: a sub-agent's messages come whole.
Once the parent's ``tool.called`` is out, the sub-agent gets a worker
session (``spawn_worker``: the limits of PROTOCOL section 15) and
``delegate.started``; its turn runs on an agent loop of the worker whose
runtime is fed the sub-agent's messages by the parent's (no process of its
own), each replayed as raw stream events through the worker's translator
(:meth:`ClaudeCode._assistant`). Its approvals are the worker's permission
requests, answered from the parent (PROTOCOL section 5). A foreground
sub-agent's turn ends with its ``Agent`` tool's result, its report replayed
as the worker's last message, then ``delegate.completed`` (or ``failed``) and
the parent's ``tool.completed``. A background one (Claude Code's default:
the tool returns at once, ``tool.completed``) ends with its task
(``task_notification``/``task_updated``), its last message its own; one still
running when the parent's turn ends fails (``delegate.failed`` ``error``).
A cancel of the parent cancels the worker's turn first (``delegate.failed``
``cancelled_by_user``). The worker's ``cost_usd`` is its
calls' priced usage; the parent's turn cost is Claude Code's total, which
includes the sub-agent's, so it is not booked again (``workers_cost_usd`` 0).

**Compaction.** Claude Code compacts its own context; its
``compact_boundary`` is ``context.compacting`` then ``context.compacted``
(:meth:`ClaudeCode._compacted`). ``POST .../compact`` sends its ``/compact``
between turns (:meth:`ClaudeCode.compact`).

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

- Claude Code may run a tool, and give its result, before the message that
  holds it has ended: the result is kept until the tool's ``tool.called``.
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
- ``compact_boundary`` comes once Claude Code is done: both events come
  together, with its ``pre_tokens`` (and ``post_tokens``, 0 when it gives
  none); ``method`` is ``summary``; the summary is in Claude Code's transcript,
  not the session's messages, so both message ids are null.
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import json
import logging
import math
import os
import uuid
import warnings
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal, cast

import msgspec
import trio
from claude_agent_sdk import (
    TERMINAL_TASK_STATUSES,
    AssistantMessage,
    CanUseToolShadowedWarning,
    ClaudeAgentOptions,
    ClaudeSDKClient,
    PermissionResultAllow,
    PermissionResultDeny,
    ResultMessage,
    StreamEvent,
    SystemMessage,
    TaskNotificationMessage,
    TaskStartedMessage,
    TaskUpdatedMessage,
    ToolPermissionContext,
    UserMessage,
)
from claude_agent_sdk import TextBlock as SdkText
from claude_agent_sdk import ThinkingBlock as SdkThinking
from claude_agent_sdk import ToolResultBlock as SdkToolResult
from claude_agent_sdk import ToolUseBlock as SdkToolUse
from claude_agent_sdk._version import __version__ as SDK_VERSION
from claude_agent_sdk.types import McpHttpServerConfig, McpStdioServerConfig, SystemPromptPreset
from claude_agent_sdk.types import McpServerConfig as McpServerConfigSdk

from gateway.agents import AgentProfile
from gateway.config import McpServerConfig
from gateway.errors import ToolError
from gateway.ids import new_call_id, new_message_id, new_turn_id, now_ms
from gateway.logs import event
from gateway.protocol.events import (
    ContextCompacted,
    ContextCompacting,
    DelegateCompleted,
    DelegateFailed,
    DelegateStarted,
    LlmCallCompleted,
    LlmCallFailed,
    LlmCallStarted,
    PermissionRequested,
    PermissionResolved,
    ToolCalled,
    ToolCompleted,
)
from gateway.protocol.shapes import Message, StopReason, TextBlock, ToolUseBlock, Usage
from gateway.providers.errors import status_class
from gateway.providers.raw import RawEvent, RawMessageStart, RawMessageStop
from gateway.runtimes.transport import ToolProcessTransport
from gateway.session.call import Call, EndCall
from gateway.session.permissions import PermissionRequest
from gateway.session.turn import Turn
from gateway.tools.process import ToolProcesses

if TYPE_CHECKING:
    from gateway.session.loop_api import RuntimeHost, WorkerHost
    from gateway.session.turn import TurnState

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
    """The CLI's ``HOME`` and ``CLAUDE_CONFIG_DIR`` of a session (module docstring).

    Under the workspace root (``.claude-code`` is no tenant's name: tenants are
    ``local`` and key ids), so the one directory an operator shares between
    nodes carries both the workspaces and the CLI's transcripts.
    """
    return os.path.join(os.path.abspath(workspace_root), ".claude-code", session_id)


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


_Feed = tuple[trio.MemorySendChannel[Any], trio.MemoryReceiveChannel[Any]]


@dataclasses.dataclass
class _SubAgentDone:
    """Into a worker's feed: the parent's ``Agent`` tool has its result; the worker's turn ends."""

    is_error: bool
    text: str


@dataclasses.dataclass
class _Flush:
    """Into a worker's feed: ``can_use_tool`` asks of ``tool_use_id``; end its message."""

    tool_use_id: str


@dataclasses.dataclass
class _Synth:
    """A sub-agent's message being replayed as a stream (:meth:`ClaudeCode._assistant`)."""

    id: str
    index: int = 0
    output_tokens: int = 0
    tool_ids: set[str] = dataclasses.field(default_factory=set)


@dataclasses.dataclass
class _Sub:
    """A sub-agent of the turn in flight: its worker session, turn, feed and mirror runtime."""

    tool_use_id: str
    worker: WorkerHost
    turn: Turn
    send: trio.MemorySendChannel[Any]
    runtime: ClaudeCode
    background: bool  # its Agent tool returned at once; it ends with its task


class ClaudeCode:
    """One session's Claude Code process, and the turns it runs (module docstring).

    Args:
        loop: the session's agent loop (its emission, endings and cancel sequences).
        nursery: where the process task runs (the agent loop's own, inside the session's).
        processes: the daemon's tool processes.
    """

    def __init__(
        self,
        loop: RuntimeHost,
        nursery: trio.Nursery,
        processes: ToolProcesses,
        feed: trio.MemoryReceiveChannel[Any] | None = None,
    ) -> None:
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
        self._early_results: dict[str, SdkToolResult] = {}  # before their tool.called
        # A worker session's runtime reads its sub-agent's messages from ``feed`` (no CLI).
        self._feed = feed
        if feed is not None:
            self._inbox = feed
        self._subs: dict[str, _Sub] = {}  # by the parent's Agent tool use id
        self._sub_pending: list[TaskStartedMessage] = []  # until their tool.called
        self._sub_feeds: dict[
            str, tuple[trio.MemorySendChannel[Any], trio.MemoryReceiveChannel[Any]]
        ] = {}
        self._subs_changed = trio.Event()
        self._sub_tasks: dict[str, _Sub] = {}  # by Claude Code's task id (can_use_tool's agent_id)
        self._synth: _Synth | None = None
        self._synth_ids: set[str] = set()
        self._last_text = ""  # of the sub-agent's messages (:meth:`_report`)
        self._compacting = False  # a POST .../compact runs (:meth:`compact`)
        self._background = False  # a worker's: its sub-agent runs in the background

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
        """Whether no turn (or compaction) of the session is in flight or queued."""
        if self._current is not None or self._compacting:
            return False
        return getattr(self.s, "turn", None) is None

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
            if self._current is not None or self._compacting:
                await self._quiet.wait()
                continue
            deadline = self._active_at + idle
            if trio.current_time() < deadline:
                await trio.sleep_until(deadline)
                continue
            if not self.idle():  # a turn accepted, not started yet: it will be waited for
                await trio.sleep(idle)
                continue
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
                if self._feed is None:
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
                await self._end_subs(turn)
                await self._interrupt()
            self._announced.clear()
            self._denied.clear()
            self._tool_started.clear()
            self._early_results.clear()
            if self.client is None and self._feed is None:  # the POST's slot, never used
                self.node.process_slots.release(self.agent.name, self.s.id)

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
            if self._feed is not None:  # a worker's: its sub-agent's messages
                if isinstance(message, AssistantMessage):
                    await self._assistant(turn, state, message)
                elif isinstance(message, UserMessage):
                    await self._flush(turn, state)
                    self._tool_results(turn, state, message)
                elif isinstance(message, _Flush):
                    if self._synth is not None and message.tool_use_id in self._synth.tool_ids:
                        await self._flush(turn, state)
                elif isinstance(message, _SubAgentDone):
                    await self._flush(turn, state)
                    if message.is_error:
                        return self._failed(turn, state, "api_error", message.text)
                    if not self._background:
                        await self._report(turn, state, _report_text(message.text))
                    return self._close_pending(turn, state, "end_turn")
                continue
            if isinstance(message, StreamEvent):
                if message.parent_tool_use_id is None:
                    await self._stream_event(turn, state, message.event)
            elif isinstance(message, UserMessage):
                if message.parent_tool_use_id is None:
                    await self._subs_done(turn, message)
                    self._tool_results(turn, state, message)
                else:
                    self._forward(message.parent_tool_use_id, message)
            elif isinstance(message, (TaskNotificationMessage, TaskUpdatedMessage)):
                await self._task_ended(turn, message)
            elif isinstance(message, SystemMessage) and message.subtype == "compact_boundary":
                self._compacted(turn.id, message)
            elif isinstance(message, TaskStartedMessage) and message.tool_use_id:
                # Claude Code may start the tool before its message ends: the worker
                # appears once the parent's tool.called is out (:meth:`_start_subs`).
                self._sub_feeds.setdefault(message.tool_use_id, trio.open_memory_channel(math.inf))
                self._sub_pending.append(message)
            elif isinstance(message, SystemMessage):
                pass  # init, status, thinking_tokens: nothing for the clients (yet)
            elif isinstance(message, ResultMessage):
                self._owed -= 1
                return self._result(turn, state, message)
            elif isinstance(message, AssistantMessage) and message.parent_tool_use_id:
                self._forward(message.parent_tool_use_id, message)  # a sub-agent's, whole
            # (the main thread's AssistantMessage: what its stream said already)
            if self._sub_pending:
                await self._start_subs(turn)
            if self._early_results:  # results that came before their tool.called (and workers)
                pending = {b.id: b for b in state.pending_tools}
                for tool_use_id in [i for i in self._early_results if i in pending]:
                    early = self._early_results.pop(tool_use_id)
                    self._tool_result(turn, state, pending[tool_use_id], early)

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
        if turn.phase != "llm":
            turn.enter("llm")
        state.rounds += 1
        state.results_message = None  # the next tool results are a new message
        self.loop.open_call(turn, state)

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
            if block is None:  # Claude Code ran it before its message ended: kept till then
                self._early_results[result.tool_use_id] = result
                continue
            self._tool_result(turn, state, block, result)

    def _tool_result(
        self, turn: Turn, state: TurnState, block: ToolUseBlock, result: SdkToolResult
    ) -> None:
        """One pending tool's result: ``tool.completed`` or ``tool.failed``."""
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

    # --- compaction (PROTOCOL section 12) ------------------------------------------------

    def _compacted(self, turn_id: str | None, message: SystemMessage) -> None:
        """Claude Code compacted its context: ``context.compacting`` then ``context.compacted``.

        Claude Code says so once it is done (``compact_boundary``), so both
        events come together. Its ``compact_metadata`` gives the trigger
        (``auto`` or ``manual``) and ``pre_tokens``; ``post_tokens`` is its own
        when it gives one, else 0 (not known). The summary is in Claude Code's
        transcript, not a message of the session's: ``summary_message_id`` and
        ``first_kept_message_id`` are null, and the session's messages stay as
        they are (a client's view does not change).
        """
        meta = message.data.get("compact_metadata") or {}
        trigger: Literal["auto", "manual"] = "manual" if meta.get("trigger") == "manual" else "auto"
        pre = _int(meta.get("pre_tokens"))
        post = _int(meta.get("post_tokens"))
        self.s.emit(
            [
                ContextCompacting(trigger, pre),
                ContextCompacted(trigger, "summary", pre, post, None, None),
            ],
            turn_id,
        )

    async def compact(self) -> None:
        """``POST .../compact``: Claude Code's own ``/compact``, between turns.

        The CLI is started if it is not running (in a slot of its agent); the
        command's result is read like a turn's, within the agent's
        ``turn_timeout_s``, its cost booked to the session. A CLI that does not
        answer in time is stopped (the next turn resumes).
        """
        self._compacting, self._quiet = True, trio.Event()
        self._active_at = trio.current_time()
        try:
            await self._settle_previous()
            await self._start()
            assert self.client is not None and self._inbox is not None
            inbox = self._inbox
            self._owed += 1
            await self.client.query("/compact")
            with trio.move_on_after(self.agent.turn_timeout_s) as timer:
                while True:
                    try:
                        message = await inbox.receive()
                    except trio.EndOfChannel:
                        break
                    if isinstance(message, SystemMessage):
                        if message.subtype == "compact_boundary":
                            self._compacted(None, message)
                    elif isinstance(message, ResultMessage):
                        self._owed -= 1
                        total = message.total_cost_usd
                        if total is not None and total > self._cost_seen:
                            self.s.record.cost_so_far_usd += total - self._cost_seen
                            self.s.save_record()
                            self._cost_seen = total
                        break
            if timer.cancelled_caught:
                self.stop()
        finally:
            self._compacting = False
            self._active_at = trio.current_time()
            self._quiet.set()

    # --- sub-agents (PROTOCOL section 5: worker sessions) -----------------------------------

    async def _start_subs(self, turn: Turn) -> None:
        """Start the workers of the sub-agents whose ``Agent`` tool use was announced."""
        pending, self._sub_pending = self._sub_pending, []
        for message in pending:
            announced = self._announced.get(message.tool_use_id or "")
            if announced is not None and announced.is_set():
                await self._sub_started(turn, message)
            else:
                self._sub_pending.append(message)

    async def _sub_started(self, turn: Turn, message: TaskStartedMessage) -> None:
        """Claude Code started a sub-agent for an ``Agent`` tool use: a worker session.

        The worker is a session of this one (``spawn_worker``: the limits of
        PROTOCOL section 15, its own stream); its turn is run here, by an
        agent loop of the worker whose runtime reads the sub-agent's messages
        from a feed this runtime fills (no process of its own). A sub-agent the
        limits refuse runs all the same, unseen: its ``Agent`` tool's result is
        the parent's as ever.
        """
        tool_use_id = message.tool_use_id
        if tool_use_id is None or tool_use_id in self._subs:
            return
        try:
            worker = cast("WorkerHost", await self.s.spawn_worker(tool_use_id))
        except ToolError as exc:
            self._sub_feeds.pop(tool_use_id, None)
            event(
                log, logging.WARNING, "claude_code_subagent_unseen",
                f"session {self.s.id}: a sub-agent runs without a worker session: {exc}",
                session_id=self.s.id, tool_use_id=tool_use_id, error=str(exc),
            )  # fmt: skip
            return
        prompt = str(message.data.get("prompt") or message.description)
        task = Message(
            new_message_id(), worker.id, new_turn_id(), "user", [TextBlock(prompt)], "complete",
            now_ms(),
        )  # fmt: skip
        send, receive = self._sub_feeds.pop(tool_use_id)
        # The parent's loop class (gateway.session.agent imports this module: no cycle).
        loop = type(self.loop)(worker, self.node)
        runtime = ClaudeCode(loop, self._nursery, self._processes, feed=receive)
        loop.runtime = runtime
        runtime._background = bool(message.data.get("is_backgrounded"))
        worker_turn = Turn(task.turn_id or new_turn_id(), task)
        worker.turn = worker_turn  # the worker's turn lock: cancel and snapshot see it
        sub = _Sub(tool_use_id, worker, worker_turn, send, runtime, runtime._background)
        self._subs[tool_use_id] = self._sub_tasks[message.task_id] = sub
        self._subs_changed.set()
        self._subs_changed = trio.Event()
        self.s.emit([DelegateStarted(tool_use_id, worker.id, prompt)], turn.id)
        self._nursery.start_soon(
            loop.run_turn, worker_turn, name=f"claude-code-subagent {worker.id}"
        )

    def _sub_for(self, agent_id: str) -> _Sub | None:
        """The worker of the sub-agent ``agent_id`` (the only one, when the id is unknown)."""
        sub = self._sub_tasks.get(agent_id)
        if sub is None and len(self._subs) == 1:
            [sub] = self._subs.values()
        return sub

    def _forward(self, tool_use_id: str, message: Any) -> None:
        sub = self._subs.get(tool_use_id)
        feed = sub.send if sub is not None else self._sub_feeds.get(tool_use_id, (None,))[0]
        if feed is not None:  # a worker's, or one about to start (buffered)
            with contextlib.suppress(trio.ClosedResourceError):
                feed.send_nowait(message)

    async def _subs_done(self, turn: Turn, message: UserMessage) -> None:
        """Results of ``Agent`` tools: their workers' turns end, then ``delegate.*``."""
        if isinstance(message.content, str):
            return
        for result in message.content:
            if not isinstance(result, SdkToolResult):
                continue
            sub = self._subs.get(result.tool_use_id)
            if sub is not None and not sub.background:  # a background one: _task_ended
                del self._subs[result.tool_use_id]
                done = _SubAgentDone(bool(result.is_error), _result_text(result.content))
                sub.send.send_nowait(done)
                sub.send.close()
                await self._sub_ended(turn, sub, cancelled=False)

    async def _task_ended(
        self, turn: Turn, message: TaskNotificationMessage | TaskUpdatedMessage
    ) -> None:
        """A background sub-agent's task ended: its worker's turn ends, then ``delegate.*``.

        (A foreground one ends with its ``Agent`` tool's result: :meth:`_subs_done`.)
        """
        if isinstance(message, TaskUpdatedMessage):
            status = message.status or str(message.patch.get("status") or "")
        else:
            status = message.status
        sub = self._sub_tasks.get(message.task_id)
        if status not in TERMINAL_TASK_STATUSES or sub is None or not sub.background:
            return
        if self._subs.pop(sub.tool_use_id, None) is None:
            return  # ended already
        failed = status != "completed"
        sub.send.send_nowait(_SubAgentDone(failed, f"the sub-agent's task {status}"))
        sub.send.close()
        await self._sub_ended(turn, sub, cancelled=False)

    async def _end_subs(self, turn: Turn) -> None:
        """The turn ends early: each open worker's turn is cancelled (or, when the CLI
        went away, fails), in its stream, before the parent's ``delegate.failed``."""
        subs, self._subs = list(self._subs.values()), {}
        self._sub_pending.clear()
        self._sub_feeds.clear()
        cancelled = turn.cancel_scope.cancel_called
        with trio.CancelScope(shield=True):
            for sub in subs:
                if cancelled:
                    sub.turn.request_cancel("parent_cancelled")
                sub.send.close()
                await self._sub_ended(turn, sub, cancelled=cancelled)

    async def _sub_ended(self, turn: Turn, sub: _Sub, cancelled: bool) -> None:
        self._sub_tasks = {k: v for k, v in self._sub_tasks.items() if v is not sub}
        with trio.move_on_after(self.s.cancel_grace_s):
            await sub.turn.done.wait()
        worker_id, tool_use_id = sub.worker.id, sub.tool_use_id
        if cancelled:
            failed = DelegateFailed(
                tool_use_id, worker_id, "cancelled_by_user", "the parent turn was cancelled"
            )
            self.s.emit([failed], turn.id)
        elif sub.turn.outcome in ("end_turn", "max_tokens", "stop_sequence"):
            done = DelegateCompleted(tool_use_id, worker_id, sub.turn.final_text)
            self.s.emit([done], turn.id)
        else:
            mode: Literal["timeout", "error"] = (
                "timeout" if sub.turn.cancel_reason == "timeout" else "error"
            )
            message = f"the worker's turn ended with {sub.turn.outcome}"
            self.s.emit([DelegateFailed(tool_use_id, worker_id, mode, message)], turn.id)

    async def _assistant(self, turn: Turn, state: TurnState, message: AssistantMessage) -> None:
        """A sub-agent's message, whole (Claude Code streams only the main thread's).

        Replayed as the raw stream events it would have had, through the
        translator, so the worker's stream is the native one. Claude Code
        gives a message block by block (one ``AssistantMessage`` each, the
        same id): the message ends at the next message, a tool result, the
        sub-agent's end, or once ``can_use_tool`` asks of one of its tools
        (a later block of it is then a message of its own, its id suffixed).
        """
        mid = message.message_id or new_message_id()
        if self._synth is not None and self._synth.id != mid.partition("~")[0]:
            await self._flush(turn, state)
        synth = self._synth
        if synth is None:
            real, n = mid, 1
            while mid in self._synth_ids:
                n += 1
                mid = f"{real}~{n}"
            self._synth_ids.add(mid)
            synth = self._synth = _Synth(real)
            usage = dict(message.usage or {})
            body = {"id": mid, "model": message.model, "usage": {**usage, "output_tokens": 0}}
            start = {"type": "message_start", "message": body}
            await self._stream_event(turn, state, start)
        synth.output_tokens = int((message.usage or {}).get("output_tokens") or 0)
        asked = False
        for block in message.content:
            events = _block_events(synth.index, block)
            if not events:
                continue
            for data in events:
                await self._stream_event(turn, state, data)
            synth.index += 1
            if isinstance(block, SdkText):
                self._last_text = block.text
            if isinstance(block, SdkToolUse):
                synth.tool_ids.add(block.id)
                asked = asked or block.id in self._announced
        if asked:
            await self._flush(turn, state)

    async def _report(self, turn: Turn, state: TurnState, text: str) -> None:
        """The sub-agent's final report, as the worker's last message.

        Claude Code does not give a sub-agent's last message as a message: its
        text is the ``Agent`` tool's result (the report). Replayed here, once
        (not if the sub-agent's last message said exactly that).
        """
        if not text or text == self._last_text:
            return
        usage = {"input_tokens": 0, "output_tokens": 0}
        model = self.s.record.active_model.removeprefix(_MODEL_PREFIX)
        body = {"id": new_message_id(), "model": model, "usage": usage}
        await self._stream_event(turn, state, {"type": "message_start", "message": body})
        for data in _block_events(0, SdkText(text)):
            await self._stream_event(turn, state, data)
        delta = {"stop_reason": "end_turn", "stop_sequence": None}
        end = {"type": "message_delta", "delta": delta, "usage": {"output_tokens": 0}}
        await self._stream_event(turn, state, end)
        await self._stream_event(turn, state, {"type": "message_stop"})

    async def _flush(self, turn: Turn, state: TurnState) -> None:
        """End the sub-agent's message being replayed (:meth:`_assistant`)."""
        synth, self._synth = self._synth, None
        if synth is None:
            return
        reason = "tool_use" if synth.tool_ids else "end_turn"
        delta = {"stop_reason": reason, "stop_sequence": None}
        usage = {"output_tokens": synth.output_tokens}
        await self._stream_event(
            turn, state, {"type": "message_delta", "delta": delta, "usage": usage}
        )
        await self._stream_event(turn, state, {"type": "message_stop"})

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
        if context.agent_id is not None and self._feed is None:  # a sub-agent asks
            sub = self._sub_for(context.agent_id)
            with trio.move_on_after(self.node.config.tools.approval_timeout_s):
                while sub is None and (self._sub_pending or self._sub_feeds):
                    await self._subs_changed.wait()  # its worker starts with its tool.called
                    sub = self._sub_for(context.agent_id)
            if sub is not None:  # its worker's request (PROTOCOL section 5): in its stream
                with contextlib.suppress(trio.ClosedResourceError):
                    sub.send.send_nowait(_Flush(tool_use_id))
                return await sub.runtime._can_use_tool(name, input, context)
        timeout = self.node.config.tools.approval_timeout_s
        if context.agent_id is None or self._feed is not None:  # announced first: tool.called
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


def _int(value: Any) -> int:
    """A token count Claude Code gave (a number, or its text), 0 when none."""
    try:
        return max(0, int(value))
    except (TypeError, ValueError):
        return 0


_REPORT_START = "The report follows:\n"
_REPORT_END = "\nagentId: "


def _report_text(result: str) -> str:
    """The sub-agent's report in its ``Agent`` tool result (the whole result if not found).

    Claude Code frames it: a notice ending ``The report follows:``, the report
    with every line indented two spaces, then ``agentId:`` and its usage.
    """
    start = result.find(_REPORT_START)
    if start < 0:
        return result.strip()
    start += len(_REPORT_START)
    end = result.find(_REPORT_END, start)
    body = result[start : end if end >= 0 else len(result)]
    return "\n".join(line.removeprefix("  ") for line in body.split("\n")).strip()


def _block_events(index: int, block: Any) -> list[dict[str, Any]]:
    """The raw stream events of one content block of a whole message (none: not streamed)."""
    if isinstance(block, SdkText):
        start: dict[str, Any] = {"type": "text", "text": ""}
        deltas = [{"type": "text_delta", "text": block.text}]
    elif isinstance(block, SdkThinking):
        start = {"type": "thinking", "thinking": ""}
        deltas = [{"type": "thinking_delta", "thinking": block.thinking}]
        if block.signature:
            deltas.append({"type": "signature_delta", "signature": block.signature})
    elif isinstance(block, SdkToolUse):
        start = {"type": "tool_use", "id": block.id, "name": block.name, "input": {}}
        deltas = [{"type": "input_json_delta", "partial_json": json.dumps(block.input)}]
    else:
        return []
    return [
        {"type": "content_block_start", "index": index, "content_block": start},
        *({"type": "content_block_delta", "index": index, "delta": d} for d in deltas),
        {"type": "content_block_stop", "index": index},
    ]


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

"""A session's Claude Code CLI process: started in a slot, stopped when idle, resumed.

docs/protocol.md §11, "Processes":

- **One process per session.** The session's CLI is started at its first
  turn, as the task ``claude-code <session id>`` in a nursery of the
  session's ``agent-loop`` task (it ends with the session), and serves every
  later turn. It is a tool process (:mod:`gateway.runtimes.transport`): its
  own process group, registered with the daemon's watchdog, a minimal
  environment (:mod:`gateway.runtimes.claude_code.options`).
- **Idle stop.** The CLI is stopped once the session has had no turn for the
  agent's ``idle_process_s`` (the task ``claude-code-idle <session id>``);
  the next start resumes the transcript in the session's state directory.
- **Processes at once.** The agent's ``max_processes`` bounds its CLIs on
  this node (:mod:`gateway.tools.process_slots`): a turn holds a slot before its
  POST answers; this process is the slot's holder, stopped to make room when
  idle.
- **Queries.** The CLI is busy from a query until it says its session state
  is ``idle``: after the query's result and after the queries it starts on
  its own (a background sub-agent's task notification wakes the main thread
  for one more answer). Whoever reads the inbox tells the process what it
  took (:meth:`CliProcess.took`). A cancelled turn stops listening, so the
  next one first reads and drops what the CLI still says until it is idle
  (:meth:`CliProcess.settle_previous`), within :data:`DRAIN_TIMEOUT_S`. A
  CLI that reports no state (older than the SDK's) owes one result per
  query.
- **Rewinds** (docs/protocol.md §2 "Edit and regenerate"). Each prompt is sent
  named after its gateway message (:func:`~gateway.runtimes.claude_code.rewind.prompt_uuid`);
  a turn that rewinds to a message stops the running CLI and starts the next
  one with ``resume_session_at`` the transcript entry before that message's
  prompt (:mod:`gateway.runtimes.claude_code.rewind`), so the model is sent
  the conversation before it, then the turn's prompt. Later starts resume
  plainly: the CLI goes on from its latest entry, on the new branch.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

import trio
from claude_agent_sdk import (
    AssistantMessage,
    ClaudeSDKClient,
    ResultMessage,
    StreamEvent,
    SystemMessage,
)
from claude_agent_sdk.types import (
    CanUseTool,
    HookCallback,
    HookEvent,
    HookMatcher,
    SandboxSettings,
)

from gateway.agents import AgentProfile
from gateway.config import config_file
from gateway.environment import daemon_env
from gateway.logs import event
from gateway.protocol.shapes import TextBlock
from gateway.runtimes.claude_code.boundary import (
    denied_reads,
    path_hook,
    sandbox_missing,
    sandbox_settings,
)
from gateway.runtimes.claude_code.forking import fork_of
from gateway.runtimes.claude_code.options import cli_environment, cli_options
from gateway.runtimes.claude_code.paths import (
    claude_session_id,
    has_transcript,
    own_state,
    private_dir,
    remove_tmp,
    state_dir,
    tmp_dir,
    tmp_root,
    write_mcp_config,
)
from gateway.runtimes.claude_code.rewind import prompt_uuid, rewind_state
from gateway.runtimes.transport import ToolProcessTransport
from gateway.session.turn import Turn
from gateway.tools.process import ToolProcesses

if TYPE_CHECKING:
    from gateway.session.loop_api import RuntimeHost

log = logging.getLogger("gateway.claude_code")

INTERRUPT_TIMEOUT_S = 0.5
"""How long a cancel waits for the CLI to take its ``interrupt`` (shielded)."""

DRAIN_TIMEOUT_S = 10.0
"""How long the next turn waits for an interrupted CLI to be idle before restarting it."""


def _make_dirs(home: str, created_at: int, tmp: str) -> None:
    """The CLI's state directory, and its temporary one in a private root. Blocking.

    Raises:
        UnsafeDirectory: the temporary root, or the CLI's directory in it, is not
            the daemon's own.
    """
    own_state(home, created_at)
    private_dir(tmp_root())
    private_dir(tmp)


def session_state(message: Any) -> str | None:
    """The state a ``session_state_changed`` frame reports (None: another message)."""
    if isinstance(message, SystemMessage) and message.subtype == "session_state_changed":
        return str(message.data.get("state") or "")
    return None


class CliProcess:
    """The CLI of one session, and the slot it holds (module docstring).

    Args:
        loop: the session's agent loop (its session, node and agent).
        nursery: where the process task runs (the agent loop's own, inside the session's).
        processes: the daemon's tool processes.
        can_use_tool: the CLI's ``can_use_tool`` (the session's approvals).
        pre_tool_use: the CLI's ``PreToolUse`` hook of every tool use
            (:mod:`gateway.runtimes.claude_code.hooks`: the turn's limits).
        on_refused: told the id of a tool use the workspace's boundary refused.
        pre_compact: the CLI's ``PreCompact`` hook (Claude Code starts compacting).
        post_tool_use: the CLI's ``PostToolUse`` and ``PostToolUseFailure`` hook (a tool
            ran: :mod:`gateway.runtimes.claude_code.steering`).
    """

    def __init__(
        self,
        loop: RuntimeHost,
        nursery: trio.Nursery,
        processes: ToolProcesses,
        can_use_tool: CanUseTool,
        pre_tool_use: HookCallback | None = None,
        on_refused: Callable[[str], None] = lambda tool_use_id: None,
        pre_compact: HookCallback | None = None,
        post_tool_use: HookCallback | None = None,
    ) -> None:
        self._loop = loop
        self._pre_tool_use = pre_tool_use
        self._pre_compact = pre_compact
        self._post_tool_use = post_tool_use
        self._on_refused = on_refused
        self.session = loop.session
        self.node = loop.node
        self._nursery = nursery
        self._processes = processes
        self._can_use_tool = can_use_tool
        self.client: ClaudeSDKClient | None = None
        self.transport: ToolProcessTransport | None = None
        self.inbox: trio.MemoryReceiveChannel[Any] | None = None
        self._scope: trio.CancelScope | None = None  # the process task's
        self._stopped = trio.Event()  # set when the process task (the current one) ends
        self._stopped.set()  # none runs yet
        self.owed = 0  # results of the queries sent (a CLI that reports no state)
        self.reports_state = False  # the CLI sends session_state_changed frames
        self.settled = True  # the inbox's reader took the CLI's last "idle" (or result)
        self.answering = False  # a query is under way whose result was not taken yet
        self.cost_seen = 0.0  # the CLI's total_cost_usd at its last result
        self._busy = False  # a turn or a compaction is in flight
        self._active_at = trio.current_time()  # the last turn's start or end (idle_process_s)
        self._quiet = trio.Event()  # set when the turn in flight ends
        self.resume_at: str | None = None  # the next start's resume_session_at (a rewind)

    @property
    def agent(self) -> AgentProfile:
        return self._loop.agent

    # --- activity (the slot's holder) ---------------------------------------------------

    def begin(self) -> None:
        """A turn or compaction starts: the process is not idle until :meth:`end`."""
        self._busy, self._active_at, self._quiet = True, trio.current_time(), trio.Event()

    def end(self) -> None:
        self._busy, self._active_at = False, trio.current_time()
        self._quiet.set()

    def idle(self) -> bool:
        """Whether no turn (or compaction) of the session is in flight or queued."""
        if self._busy:
            return False
        return getattr(self.session, "turn", None) is None

    def idle_since(self) -> float:
        return self._active_at

    def stop(self) -> None:
        """Stop the session's CLI (the process task ends; its group is stopped)."""
        if self._scope is not None:
            self._scope.cancel()

    # --- the process task ----------------------------------------------------------------

    async def start(self, turn: Turn | None = None) -> None:
        """Start the session's CLI if it is not running, in a process slot of its agent.

        The turn's POST held the slot already (:mod:`gateway.tools.process_slots`);
        a turn whose process was stopped since (idle, or to make room) waits
        here for a slot, within the turn. A ``turn`` that rewinds first stops
        the CLI and says where the next one resumes (:meth:`_rewind`).
        """
        if turn is not None and turn.rewind_to is not None:
            await self._rewind(turn.rewind_to)
        if self.client is None:
            await self._stopped.wait()  # a process still stopping holds its slot until it ends
            agent, slots = self.agent, self.node.process_slots
            await slots.acquire(agent.name, agent.max_processes, self.session.id, math.inf)
            try:
                await self._nursery.start(self._serve, name=f"claude-code {self.session.id}")
            except BaseException:
                if self.client is None:
                    slots.release(agent.name, self.session.id)
                raise

    async def _rewind(self, message_id: str) -> None:
        """Where the CLI resumes for a turn that rewinds to ``message_id`` (module docstring).

        The running CLI is stopped first: what it wrote of its transcript is
        then all on disk, and the next start takes ``resume_session_at``.
        """
        s = self.session
        target = next((m for m in s.rewound if m.id == message_id), None)
        text = "".join(b.text for b in target.content if isinstance(b, TextBlock)) if target else ""
        if self.client is not None:
            stopped = self._stopped
            self.stop()
            await stopped.wait()
        home, claude_id = state_dir(self.node.workspaces.root, s.id), claude_session_id(s.id)
        point = await trio.to_thread.run_sync(rewind_state, home, claude_id, message_id, text)
        self.resume_at = point.at if point is not None else None
        event(
            log, logging.INFO, "claude_code_rewound",
            f"session {s.id}: Claude Code resumes "
            + (f"at {point.at}" if point is not None else "as its state directory says"),
            session_id=s.id, message_id=message_id, resume_at=self.resume_at,
        )  # fmt: skip

    async def _client(self) -> tuple[ClaudeSDKClient, ToolProcessTransport, bool, str]:
        """The SDK client of a new CLI, over a tool process; whether it resumes a transcript;
        its credential at the model API door (revoked when it ends)."""
        s, node, agent = self.session, self.node, self.agent
        workspace = await trio.to_thread.run_sync(
            node.workspaces.host_path, s.record.workspace_path
        )
        home = state_dir(node.workspaces.root, s.id)
        tmp = tmp_dir(s.id)
        await trio.to_thread.run_sync(_make_dirs, home, s.record.created_at, tmp)
        resume = await trio.to_thread.run_sync(has_transcript, home, claude_session_id(s.id))
        # A fork's first CLI: the conversation it was forked from, at the fork point.
        fork = None if resume else await trio.to_thread.run_sync(fork_of, home)
        sandbox = None
        if agent.sandbox:
            sandbox = await trio.to_thread.run_sync(self._sandbox, workspace, home, tmp)
        options = cli_options(
            agent, s.id, workspace, node.config.mcp_servers, self._can_use_tool, resume,
            hooks=self._hooks(workspace),
            sandbox=sandbox,
            fork=fork,
            resume_at=self.resume_at if resume else None,
        )  # fmt: skip
        if isinstance(servers := options.mcp_servers, dict) and servers:
            # In a private file, never on the command line: ps shows their tokens to every user.
            mcp = await trio.to_thread.run_sync(write_mcp_config, s.id, servers)
            options = dataclasses.replace(options, mcp_servers=mcp)
        door = await node.model_proxy.ensure_running()
        key = daemon_env().get("ANTHROPIC_API_KEY", "")  # taken out of os.environ at start
        credential = node.model_proxy.issue(s.id, agent.base_url, key)
        transport = ToolProcessTransport(
            dataclasses.replace(options, permission_prompt_tool_name="stdio"),
            self._processes,
            workspace,
            cli_environment(agent, home, tmp, credential, door, node.config.model.max_retries),
            grace_s=node.config.tools.kill_grace_s,
        )
        resumes = resume or fork is not None
        return ClaudeSDKClient(options, transport=transport), transport, resumes, credential

    def _hooks(self, workspace: str) -> dict[HookEvent, list[HookMatcher]]:
        """The ``PreToolUse`` hooks (the workspace's paths, then the turn's steers and limits),
        the ``PostToolUse``/``PostToolUseFailure`` one (its steers) and the ``PreCompact`` one."""
        tool_hooks = [path_hook(workspace, self._on_refused)]
        if self._pre_tool_use is not None:
            tool_hooks.append(HookMatcher(hooks=[self._pre_tool_use]))
        hooks: dict[HookEvent, list[HookMatcher]] = {"PreToolUse": tool_hooks}
        if self._post_tool_use is not None:
            for name in ("PostToolUse", "PostToolUseFailure"):
                hooks[name] = [HookMatcher(hooks=[self._post_tool_use])]
        if self._pre_compact is not None:
            hooks["PreCompact"] = [HookMatcher(hooks=[self._pre_compact])]
        return hooks

    def _sandbox(self, workspace: str, home: str, tmp: str) -> SandboxSettings:
        """The sandbox of the session's Bash (:mod:`~gateway.runtimes.claude_code.boundary`).

        Blocking (it resolves paths). Programs the sandbox needs that are
        missing are logged: every ``Bash`` then fails (closed, not open).
        """
        config = self.node.config
        missing = sandbox_missing()
        if missing:
            event(
                log, logging.ERROR, "claude_code_sandbox_unavailable",
                f"session {self.session.id}: Claude Code's sandbox needs {' and '.join(missing)}"
                " (Debian: apt-get install bubblewrap socat); every Bash will fail",
                session_id=self.session.id, missing=missing,
            )  # fmt: skip
        store = config.store.path if config.store.backend == "sqlite" else None
        denied = denied_reads(
            self.node.workspaces.root,
            self.node.workspaces.allowed,
            store,
            [config_file(config), config.auth.api_keys_file],
        )
        return sandbox_settings(workspace, [home, tmp], [*denied, tmp_root()])

    async def _serve(self, *, task_status: trio.TaskStatus[None]) -> None:
        """The process task: start the CLI, pass on what it says, stop it (shielded) at the end."""
        s = self.session
        client, transport, resume, credential = await self._client()
        send, receive = trio.open_memory_channel[Any](math.inf)
        stopped = self._stopped = trio.Event()
        with trio.CancelScope() as scope, send:
            try:
                await client.connect()
                self.resume_at = None  # resumed there: later starts resume plainly
                self.client, self.transport, self.inbox, self._scope = (
                    client, transport, receive, scope
                )  # fmt: skip
                self.owed, self.settled, self.answering = 0, True, False
                self.node.process_slots.attach(self.agent.name, s.id, self)
                task_status.started()
                event(
                    log, logging.INFO, "claude_code_started",
                    f"session {s.id}: Claude Code started (pid {transport.pid})",
                    session_id=s.id, pid=transport.pid, resume=resume,
                )  # fmt: skip
                await self._pass_on(client, send, scope)
            finally:
                if self.client is client:
                    self.client = self.transport = self.inbox = self._scope = None
                with trio.CancelScope(shield=True):
                    await client.disconnect()
                self.node.model_proxy.revoke(credential)  # its CLI has ended
                with trio.CancelScope(shield=True):
                    await trio.to_thread.run_sync(remove_tmp, s.id)  # and its MCP config
                self.node.process_slots.release(self.agent.name, s.id)
                stopped.set()

    async def _pass_on(
        self, client: ClaudeSDKClient, send: trio.MemorySendChannel[Any], scope: trio.CancelScope
    ) -> None:
        """What the CLI says, into the inbox, until its stream ends or it is stopped."""
        s = self.session
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._stop_when_idle, scope, name=f"claude-code-idle {s.id}")
                async for message in client.receive_messages():
                    if not self.reports_state and session_state(message) is not None:
                        self.reports_state = True  # before its reader sees the frame
                    send.send_nowait(message)
                nursery.cancel_scope.cancel()
        except Exception as exc:  # the CLI's stream broke: the turn sees it end
            event(
                log, logging.WARNING, "claude_code_exited",
                f"session {s.id}: Claude Code's stream ended: {exc}",
                session_id=s.id, error=str(exc),
            )  # fmt: skip

    async def _stop_when_idle(self, scope: trio.CancelScope) -> None:
        """Stop the CLI once no turn has run for the agent's ``idle_process_s``.

        Its next turn starts another, which resumes the conversation from the
        transcript in the session's state directory.
        """
        idle = self.agent.idle_process_s
        while True:
            if self._busy:
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
                f"session {self.session.id}: Claude Code stopped after {idle:g} s idle",
                session_id=self.session.id, idle_s=idle,
            )  # fmt: skip
            scope.cancel()
            return

    # --- queries -------------------------------------------------------------------------

    async def query(
        self, prompt: str | list[dict[str, Any]], message_id: str | None = None
    ) -> None:
        """Send a query (a turn's prompt, or a command): the CLI is busy until idle.

        ``prompt``: text, or content blocks (a turn's images and documents,
        :func:`~gateway.runtimes.claude_code.steering.prompt_of`).
        ``message_id``: the gateway message the prompt is; its transcript entry is
        named after it (:func:`~gateway.runtimes.claude_code.rewind.prompt_uuid`).
        """
        assert self.client is not None
        self.owed += 1
        self.settled, self.answering = False, True
        if message_id is None and isinstance(prompt, str):
            await self.client.query(prompt)
            return
        named: dict[str, Any] = {
            "type": "user",
            "message": {"role": "user", "content": prompt},
            "parent_tool_use_id": None,
        }
        if message_id is not None:
            named["uuid"] = prompt_uuid(message_id)

        async def one() -> AsyncIterator[dict[str, Any]]:
            yield named

        await self.client.query(one())

    @property
    def done(self) -> bool:
        """Whether the CLI owes nothing more: idle, and the last query's result taken."""
        return self.settled and not self.answering

    def took(self, message: Any) -> None:
        """The inbox's reader took ``message``: what it says of the CLI being :attr:`done`.

        ``idle`` settles it, ``running`` unsettles it; a query's start (its
        ``init``, the main thread's stream: one the CLI started on its own)
        opens an answer, its result closes it (the CLI may say ``idle`` just
        before the result). A CLI that reports no state is settled by the
        result of its last query.
        """
        state = session_state(message)
        if state == "idle":
            self.owed, self.settled = 0, True
        elif state == "running":
            self.settled = False
        elif isinstance(message, ResultMessage):
            self.owed, self.answering = max(0, self.owed - 1), False
            if not self.reports_state and not self.owed:
                self.settled = True
        elif _starts_an_answer(message):
            self.answering = True

    def book_cost(self, total: float | None) -> None:
        """The cost of a query of no turn (the CLI's running total grew): the session's."""
        if total is not None and total > self.cost_seen:
            self.session.record.cost_so_far_usd += total - self.cost_seen
            self.session.save_record()
            self.cost_seen = total

    async def settle_previous(self) -> None:
        """Read and drop what the CLI still says until it is idle (an interrupted turn's,
        or a query it started on its own between turns)."""
        inbox = self.inbox
        if inbox is None:
            return
        own = self.done  # past an idle, a query is the CLI's own: its cost is the session's
        with trio.move_on_after(DRAIN_TIMEOUT_S):
            while True:
                try:
                    message = await inbox.receive() if not self.done else inbox.receive_nowait()
                except (trio.WouldBlock, trio.EndOfChannel):
                    break
                self.took(message)
                if isinstance(message, ResultMessage):
                    if own:
                        self.book_cost(message.total_cost_usd)
                    else:  # the interrupted turn's: its calls were priced with it
                        self.cost_seen = message.total_cost_usd or self.cost_seen
                own = own or self.done
        if not self.done:  # not idle in time: a CLI that does not answer is started again
            self.owed, self.settled, self.answering = 0, True, False
            stopped = self._stopped
            self.stop()
            await stopped.wait()

    async def interrupt(self) -> None:
        """Stop the query in flight (and its background tasks): ``interrupt()``, shielded,
        within :data:`INTERRUPT_TIMEOUT_S`."""
        client = self.client
        if client is None or self.done:
            return
        with trio.CancelScope(shield=True), trio.move_on_after(INTERRUPT_TIMEOUT_S):
            try:
                await client.interrupt()
            except Exception as exc:
                event(
                    log, logging.WARNING, "claude_code_interrupt_failed",
                    f"session {self.session.id}: the interrupt failed: {exc}",
                    session_id=self.session.id, error=str(exc),
                )  # fmt: skip


def _starts_an_answer(message: Any) -> bool:
    """A query's start, or its main thread streaming (not a sub-agent's message)."""
    if isinstance(message, SystemMessage):
        return message.subtype == "init"
    if isinstance(message, StreamEvent | AssistantMessage):
        return message.parent_tool_use_id is None
    return False

"""A model round's tool uses: the tool batch, its limits, its approvals, each tool's ending.

A call that stops with ``tool_use`` hands its tool blocks to :meth:`ToolRound.run`,
whose tools run concurrently in the batch's nursery. The turn stays at the
seam until the first tool enters execution; a tool waiting for permission has
not (docs/protocol.md §8). A tool that raises anything is a ``tool.failed``
(``error``); a cancel fails each running tool (``cancelled``) from its own
task, an open permission request resolved ``cancelled`` first.

A turn runs at most ``[limits] max_tool_uses_per_turn`` tool uses (PROTOCOL
section 15), counting every ``tool_use`` block the model asked for in the
turn, across its rounds: those beyond are announced (``tool.called``) and fail
at once with ``tool.failed`` (``limit``) without running, all in one step, and
the turn goes on to the next model round, which sees the errors and can answer.
A worker's turn is a turn of its own, with its own count.

Every ending of a tool records its result in the conversation in the step
that announces it (:func:`record_result`, :func:`fail_tool`): the next
request, and a snapshot, see a result for every tool use.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import trio

from gateway import media, telemetry
from gateway.agents import AgentProfile
from gateway.errors import ApiError, Refused, ToolError
from gateway.ids import new_message_id, now_ms
from gateway.logs import event
from gateway.protocol.events import (
    PermissionRequested,
    PermissionResolved,
    ToolCalled,
    ToolCompleted,
    ToolFailed,
    ToolProgress,
)
from gateway.protocol.shapes import (
    FileBlock,
    Message,
    ToolProgressInfo,
    ToolResultBlock,
    ToolUseBlock,
)
from gateway.session.files import block_of
from gateway.session.loop_api import AgentServices, TurnHost
from gateway.session.permissions import PermissionRequest
from gateway.session.turn import Turn, TurnState
from gateway.tools.registry import SessionTools, ToolContext, ToolOutput

log = logging.getLogger("gateway.agent")


class ToolRound:
    """Runs the tool uses of a session's model rounds (module docstring)."""

    def __init__(self, session: TurnHost, node: AgentServices) -> None:
        self.session = session
        self.node = node

    @property
    def agent(self) -> AgentProfile:
        return self.node.agents[self.session.record.agent]

    @property
    def tools(self) -> SessionTools:
        """The session's tools now: built-in and MCP, its agent's (asked at every use)."""
        return self.node.session_tools(self.session)

    async def run(self, turn: Turn, state: TurnState, tool_uses: list[ToolUseBlock]) -> None:
        """The tool batch: every call of the message concurrently, in the batch's nursery."""
        s = self.session
        s.emit([ToolCalled(b.id, b.name, b.input) for b in tool_uses], turn.id)
        limit = self.node.config.limits.max_tool_uses_per_turn
        allowed = tool_uses
        if limit:
            room = max(0, limit - state.tool_uses)
            allowed, refused = tool_uses[:room], tool_uses[room:]
            if refused:
                self._refuse(turn, state, refused, limit)
        state.tool_uses += len(tool_uses)
        async with trio.open_nursery() as nursery:
            for block in allowed:
                nursery.start_soon(
                    self._run_tool, turn, state, block, name=f"tool {block.name} {block.id}"
                )
        state.results_message = None

    def last_round(self, turn: Turn, state: TurnState, blocks: list[ToolUseBlock]) -> None:
        """The model asked for tools in the turn's last round (``max_rounds``): none runs.

        No model round would see their results, so running them would do
        what nobody reads. Each is announced and fails (``limit``) in one step,
        as :meth:`_refuse` does; the conversation keeps a result for every
        tool use, so the session's next turn is a valid request.
        """
        self.session.emit([ToolCalled(b.id, b.name, b.input) for b in blocks], turn.id)
        state.tool_uses += len(blocks)
        message = f"not run: the turn reached its max_rounds ({self.agent.max_rounds}) model calls"
        self._fail_unrun(turn, state, blocks, message)

    def _refuse(self, turn: Turn, state: TurnState, blocks: list[ToolUseBlock], limit: int) -> None:
        """Fail tool uses past ``max_tool_uses_per_turn`` without running them (``limit``).

        One step for all of them: one rewrite of the results message, one batch
        of ``tool.failed``, one log line (a model asking for a thousand tools
        costs three writes, not a thousand).
        """
        message = (
            f"not run: this turn asked for more than its max_tool_uses_per_turn ({limit}) tool uses"
        )
        self._fail_unrun(turn, state, blocks, message)

    def _fail_unrun(
        self, turn: Turn, state: TurnState, blocks: list[ToolUseBlock], message: str
    ) -> None:
        """Fail tool uses that never ran (``limit``): one results rewrite, one batch, one line."""
        s = self.session
        refused = {b.id for b in blocks}
        state.pending_tools = [b for b in state.pending_tools if b.id not in refused]
        results = _results_message(s, turn, state)
        results.content += [ToolResultBlock(b.id, message, True) for b in blocks]
        s.add_message(results)
        s.emit([ToolFailed(b.id, b.name, "limit", message, 0) for b in blocks], turn.id)
        event(
            log, logging.WARNING, "tool_limit",
            f"turn {turn.id}: {len(blocks)} tool uses failed without running: {message}",
            session_id=s.id, turn_id=turn.id, code="limit", count=len(blocks),
        )  # fmt: skip

    async def _run_tool(self, turn: Turn, state: TurnState, block: ToolUseBlock) -> None:
        s = self.session
        ctx = ToolContext(
            session_id=s.id,
            turn_id=turn.id,
            tool_use_id=block.id,
            workspace_path=s.record.workspace_path,
            kill_grace_s=self.node.config.tools.kill_grace_s,
            session=s,
            tool_name=block.name,
            progress=progress_of(s, turn, state, block.id),
        )
        started = trio.current_time()
        tools = self.tools
        tool_label = block.name if block.name in tools else "unknown"

        def elapsed_ms(outcome: str = "failed") -> int:
            seconds = trio.current_time() - started
            self.node.metrics.tool_duration.labels(tool_label, outcome).observe(seconds)
            return round(seconds * 1000)

        telemetry.tool_started(s.id, turn.id, block.id, block.name)
        try:
            tools.validate(block.name, block.input)
            if self.agent.needs_approval(block.name, block.input):
                await self._permission(turn, block)
            if turn.phase == "seam":
                turn.enter("tools")
            output = await tools.execute(block.name, block.input, ctx)
            content, files = await self._files(output)
        except ToolError as exc:
            fail_tool(s, turn, state, block, exc.error_class, exc.message, elapsed_ms())
            telemetry.tool_ended(block.id, exc.error_class, exc.message)
        except Exception as exc:  # a tool's bug fails that tool only
            s.failed("tool", exc, turn.id)
            message = f"the tool failed: {type(exc).__name__}: {exc}"
            fail_tool(s, turn, state, block, "error", message, elapsed_ms())
            telemetry.tool_ended(block.id, "error", message)
        except trio.Cancelled:
            telemetry.tool_ended(block.id, "cancelled", "cancelled")
            fail_tool(s, turn, state, block, "cancelled", "cancelled", elapsed_ms("cancelled"))
            raise
        else:
            structured = output.structured
            record_result(
                s, turn, state, block, content, is_error=False, structured=structured, files=files
            )
            ms = elapsed_ms("completed")
            completed = ToolCompleted(block.id, block.name, content, ms, structured)
            if files:
                completed.files = files
            s.emit([completed], turn.id)
            telemetry.tool_ended(block.id)

    async def _files(self, output: ToolOutput) -> tuple[str, list[FileBlock]]:
        """A tool's files kept with the session: the result's text, a line per file, and
        their blocks (docs/protocol.md §2 "Files").

        An image is checked as an upload is (one of the image types; a PNG
        first without its ancillary chunks of a wrong CRC, as libpng reads it:
        :func:`gateway.media.png_repaired`); audio
        (``audio/...``) is kept unchecked. One refused (not an image, too large,
        past a limit, the store down) is a line of the text naming why, never a
        failed tool.
        """
        s = self.session
        lines: list[str] = []
        blocks: list[FileBlock] = []
        for media_type, data in output.files:
            kind = "audio" if media_type.startswith("audio/") else "image"
            try:
                if kind == "image" and media_type not in media.IMAGE_TYPES:
                    raise ApiError(415, "unsupported_media_type", "not an image type it takes")
                if media_type == "image/png":  # read as libpng reads it
                    data = await trio.to_thread.run_sync(media.png_repaired, data)
                rec = await self.node.files.upload(
                    s.id, s.record.owner, media_type, data, checked=kind == "image"
                )
            except (ApiError, Refused) as exc:
                shown = f"{kind}: {media_type[:100]}, {len(data)} bytes"
                lines.append(f"[{shown}, not kept: {exc}]")
                continue
            blocks.append(block_of(rec))
            lines.append(f"[{kind}: {rec.media_type}, {rec.size} bytes: {rec.file_id}]")
        content = "\n".join([output.content, *lines] if output.content else lines)
        return content, blocks

    async def _permission(self, turn: Turn, block: ToolUseBlock) -> None:
        """Wait for ``allow`` (docs/protocol.md §5 ``permission.*``).

        Raises:
            ToolError: ``permission_denied`` on ``deny`` or after ``approval_timeout_s``.
        """
        s = self.session
        timeout = self.node.config.tools.approval_timeout_s
        expires_at = now_ms() + round(timeout * 1000)
        request = s.permissions.open(block.id, block.name, block.input, expires_at)
        s.emit(
            [PermissionRequested(request.perm_id, block.id, block.name, block.input, expires_at)],
            turn.id,
        )
        try:
            with trio.move_on_after(timeout):
                await request.decided.wait()
        except trio.Cancelled:
            _resolved_by_cancel(s, turn, request)
            raise
        finally:
            request.closed = True
        if request.decision is None:
            request.decision = "timeout"
        s.emit([PermissionResolved(request.perm_id, request.decision)], turn.id)  # type: ignore[arg-type]
        if request.decision == "allow":
            return
        verb = "was denied" if request.decision == "deny" else "timed out"
        raise ToolError("permission_denied", f"permission for {block.name} {verb}")


def fail_tool(
    s: TurnHost,
    turn: Turn,
    state: TurnState,
    block: ToolUseBlock,
    error_class: str,
    message: str,
    duration_ms: int | None = None,
) -> None:
    """``tool.failed``, its result recorded in the conversation in the same step."""
    record_result(s, turn, state, block, message, is_error=True)
    s.emit(
        [ToolFailed(block.id, block.name, error_class, message, duration_ms)],  # type: ignore[arg-type]
        turn.id,
    )
    broke = error_class in ("error", "timeout")  # not a cancel, a refusal or a model's slip
    event(
        log, logging.WARNING if broke else logging.INFO, "tool_failed",
        f"tool {block.name} ({block.id}) failed: {error_class}: {message}",
        session_id=s.id, turn_id=turn.id, tool=block.name, tool_use_id=block.id,
        code=error_class, duration_ms=duration_ms,
    )  # fmt: skip


def progress_of(
    s: TurnHost, turn: Turn, state: TurnState, tool_use_id: str
) -> Callable[[float, float | None, str | None], None]:
    """What a running tool calls to tell how far it is: a ``tool.progress``, kept for the
    snapshot until the tool ends (docs/protocol.md §5, §6); nothing once it has ended."""

    def progress(value: float, total: float | None, message: str | None) -> None:
        if not any(b.id == tool_use_id for b in state.pending_tools) or turn.phase == "done":
            return
        info = ToolProgressInfo(tool_use_id, value, total, message)
        turn.progress[tool_use_id] = info
        s.emit([ToolProgress(tool_use_id, value, total, message)], turn.id)

    return progress


def record_result(
    s: TurnHost,
    turn: Turn,
    state: TurnState,
    block: ToolUseBlock,
    content: str,
    *,
    is_error: bool,
    structured: Any = None,
    files: list[FileBlock] | None = None,
) -> None:
    """Record a tool's result in the conversation, in the step that announces it.

    A structured result is kept in the block (``structured_content``), so a
    snapshot shows what ``tool.completed`` showed (docs/protocol.md §6); so are
    the tool's files (``files``, docs/protocol.md §2 "Files").
    """
    state.pending_tools = [b for b in state.pending_tools if b.id != block.id]
    turn.progress.pop(block.id, None)  # a snapshot shows a running tool's only
    results = _results_message(s, turn, state)
    result = ToolResultBlock(block.id, content, is_error)
    if structured is not None:
        result.structured_content = structured
    if files:
        result.files = files
    results.content.append(result)
    s.add_message(results)


def _results_message(s: TurnHost, turn: Turn, state: TurnState) -> Message:
    """The round's tool results message (one user message for all its results)."""
    if state.results_message is None:
        state.results_message = Message(
            new_message_id(), s.id, turn.id, "user", [], "complete", now_ms()
        )
    return state.results_message


def _resolved_by_cancel(s: TurnHost, turn: Turn, request: PermissionRequest) -> None:
    """A cancel ends a request still waiting: ``permission.resolved`` ``cancelled``.

    docs/protocol.md §5: every request is resolved, and one a cancel ended says
    so, in the step of its tool's ``tool.failed (cancelled)`` that follows
    (nothing awaits between the two). One decided just as the cancel landed
    keeps its decision: its tool never ran, and its ``tool.failed`` says why.
    """
    request.closed = True
    request.decision = request.decision or "cancelled"
    s.emit([PermissionResolved(request.perm_id, request.decision)], turn.id)  # type: ignore[arg-type]

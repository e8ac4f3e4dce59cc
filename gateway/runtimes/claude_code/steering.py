"""A steer of a ``claude-code`` turn, handed to Claude Code where it folds it in.

docs/protocol.md §2 "A busy session", and §11, "A busy session":

Claude Code takes a user message that reaches its streaming input while a
query runs: it shows it to the model at its next step, within the result of
the tool in flight ("The user sent a new message while you were working"),
else as one more query right after the running one, before it says it is
idle. So the turn's end (its last result once the CLI is idle) covers it,
whichever of the two Claude Code does; a message written once the CLI has
gone idle would be a query of its own that no turn reads. Reading the CLI's
stream never says where the CLI is now (what it wrote may wait in the pipe),
so a steer is handed over only where Claude Code waits for the gateway, in
the middle of its query, and reads the steer before the gateway's answer:

- in the ``PreToolUse`` hook of one of the main thread's tools (about to
  run), and in its ``PostToolUse`` or ``PostToolUseFailure`` hook (it ran:
  its result goes to the next model call);
- while the CLI waits for a permission decision (``can_use_tool``): the
  session's :class:`~gateway.session.busy.Pulse` wakes the wait when a steer
  comes.

There the steers are taken (:func:`gateway.session.busy.take_steers`:
``turn.steered``, the user messages join the turn, the record drops them, one
step), after the tool's ``tool.called`` and what was emitted before is durable,
then written to the CLI as user messages (``query()``, the session's id), in
order. A steer that finds no such moment before the turn ends (it came during
the last model call, or the turn was cancelled) becomes a queued turn
(:func:`gateway.session.busy.start_next`): never both. A sub-agent's tools
(their ``agent_id``) are not the main thread's steps, and a CLI that reports
no session state (nothing says when it is idle) is never handed one.
"""

from __future__ import annotations

import base64
import contextlib
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

import trio
from claude_agent_sdk import CLIConnectionError
from claude_agent_sdk.types import HookContext, HookInput, HookJSONOutput

from gateway.protocol.shapes import DocumentBlock, ImageBlock, Message, TextBlock
from gateway.providers import attachments
from gateway.providers.history import within_budget
from gateway.runtimes.claude_code.owner import Owner
from gateway.runtimes.claude_code.process import CliProcess
from gateway.session import busy
from gateway.session.files import file_ids

if TYPE_CHECKING:
    from gateway.session.turn import Turn

ANNOUNCE_WAIT_S = 5.0
"""How long a hook waits for its tool's ``tool.called`` before it hands a steer over."""


Prompt = str | list[dict[str, Any]]
"""A user message as Claude Code's streaming input takes it: text, or content blocks."""


def prompt_of(message: Message, files: Mapping[str, tuple[str, bytes]] | None = None) -> Prompt:
    """What Claude Code is sent of a user message (docs/protocol.md §11, the
    ``claude-code`` runtime): its text; with images or documents, the Messages
    API's content blocks, each file's bytes base64 (``files``: by file id, from
    :meth:`gateway.session.files.Files.read`). A file no longer stored (its
    session deleted meanwhile) reads as it does to any model
    (:func:`gateway.providers.attachments.missing`). A text that starts with ``/`` is
    sent after a space (:func:`not_a_command`).
    """
    if not any(isinstance(b, ImageBlock | DocumentBlock) for b in message.content):
        return not_a_command("".join(b.text for b in message.content if isinstance(b, TextBlock)))
    blocks: list[dict[str, Any]] = []
    for b in message.content:
        if isinstance(b, TextBlock) and b.text:
            blocks.append({"type": "text", "text": not_a_command(b.text)})
        elif isinstance(b, ImageBlock | DocumentBlock):
            found = (files or {}).get(b.file_id)
            if found is None:
                blocks.append({"type": "text", "text": attachments.missing(b.file_id)})
            else:
                blocks.append(_file_block(b, *found))
    return blocks


def not_a_command(text: str) -> str:
    """A client's text as Claude Code takes it as text (docs/protocol.md §11, "Commands").

    Claude Code runs a user message whose text (a block's, in a message of
    blocks) starts with ``/`` as one of its own commands (``/model``, ``/fast``,
    ``/clear``, its skills...): that would change what the operator configured,
    or end the turn with no model call. One space before it, which Claude Code
    does not strip, makes it text; the model sees that space. The gateway's own
    ``/compact`` is not a user message (:mod:`.compaction`).
    """
    return " " + text if text.startswith("/") else text


def _file_block(block: ImageBlock | DocumentBlock, media_type: str, data: bytes) -> dict[str, Any]:
    """An image or document as the Messages API takes it (a text document as text)."""
    if isinstance(block, DocumentBlock) and media_type.startswith("text/"):
        text = attachments.document_text(data)
        return {
            "type": "document",
            "source": {"type": "text", "media_type": "text/plain", "data": text},
        }
    source = {"type": "base64", "media_type": media_type, "data": base64.b64encode(data).decode()}
    return {"type": "image" if isinstance(block, ImageBlock) else "document", "source": source}


async def prompt(runtime: Owner, message: Message) -> Prompt:
    """:func:`prompt_of` ``message``, its files read from the session's (at most what one
    request carries: gateway.providers.history.within_budget)."""
    [message] = within_budget([message])
    ids = file_ids(message.content)
    files = await runtime.node.files.read(runtime.session.id, ids) if ids else {}
    return prompt_of(message, files)


class Steered(Owner, Protocol):
    """The runtime whose turns take steers (:class:`~.runtime.ClaudeCode`)."""

    @property
    def process(self) -> CliProcess: ...


class Steering:
    """The steers of a session's running turn, handed to its CLI (module docstring)."""

    def __init__(self, runtime: Steered) -> None:
        self._runtime = runtime

    async def before_tool(self, hook_input: dict[str, Any], tool_use_id: str) -> str | None:
        """A check of the ``PreToolUse`` hook (:mod:`.hooks`): it refuses nothing."""
        await self.hand_over(hook_input.get("agent_id"), tool_use_id)
        return None

    async def after_tool(
        self, input: HookInput, tool_use_id: str | None, context: HookContext
    ) -> HookJSONOutput:
        """The ``PostToolUse`` and ``PostToolUseFailure`` hook."""
        data: dict[str, Any] = dict(input)
        await self.hand_over(data.get("agent_id"), tool_use_id or str(data.get("tool_use_id")))
        return {}

    async def wait(self, done: trio.Event, wait_s: float) -> None:
        """Wait for ``done`` (a permission's decision) up to ``wait_s``: Claude Code waits for
        it too, so a steer that comes meanwhile is handed over at once."""
        pulse = self._runtime.session.steered
        with trio.move_on_after(wait_s):
            while not done.is_set():
                woken = pulse.event  # before looking: a steer from now on sets it
                await self.hand_over()
                await _first(done.wait, woken.wait)

    async def hand_over(self, agent_id: object = None, tool_use_id: str = "") -> None:
        """Hand the steers waiting for the running turn to Claude Code, which waits for the
        gateway now (module docstring); nothing if none waits or the turn cannot take them."""
        rt = self._runtime
        current = rt.current
        if agent_id or current is None or not self._takes(current[0]):
            return
        turn = current[0]
        if tool_use_id:  # its tool.called first: the steer follows it in the stream
            with trio.move_on_after(ANNOUNCE_WAIT_S):
                await rt.approvals.announced.setdefault(tool_use_id, trio.Event()).wait()
        await rt.node.wait_durable()  # as the native loop: what came before is committed
        if rt.current is not current or not self._takes(turn):
            return
        messages = rt.session.take_steers(turn)
        with contextlib.suppress(CLIConnectionError):  # the CLI went: the turn sees it end
            for message in messages:
                await rt.process.query(await prompt(rt, message), message.id)

    def _takes(self, turn: Turn) -> bool:
        """Whether ``turn`` can take a steer now, and one waits for it."""
        rt, process = self._runtime, self._runtime.process
        return (
            rt.feed is None
            and turn.in_flight
            and not turn.cancelling
            and process.client is not None
            and process.reports_state
            and busy.steering(rt.session.record, turn)
        )


async def _first(*waits: Callable[[], Awaitable[object]]) -> None:
    """Return once the first of ``waits`` returns (the others are cancelled)."""
    async with trio.open_nursery() as nursery:

        async def one(wait: Callable[[], Awaitable[object]]) -> None:
            await wait()
            nursery.cancel_scope.cancel()

        for wait in waits:
            nursery.start_soon(one, wait)

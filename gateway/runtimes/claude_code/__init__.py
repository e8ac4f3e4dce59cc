"""``runtime = "claude-code"``: a session run by Claude Code, through the Claude Agent SDK.

docs/protocol.md §11 maps what the SDK says onto the events every client
already reads; this package is that mapping. The stream is the same contract,
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
a cancel (``interrupt()``)                      the sequences of docs/protocol.md §8
a sub-agent (``TaskStartedMessage``, then       a worker session (``parent_session_id``):
messages with ``parent_tool_use_id``)           ``delegate.started``, its turn in its own
                                                stream, ``delegate.completed``/``failed``
``PreCompact`` (the hook); ``compact_boundary``  ``context.compacting``; the ``context``
and the summary after it                        message, ``context.compacted``
==============================================  =========================================

Where each part lives:

- :mod:`~gateway.runtimes.claude_code.runtime`: :class:`ClaudeCode`, a
  session's turns (the stream through the translator, tools, the result,
  cancellation, ``/compact``), what the agent loop calls;
- :mod:`~gateway.runtimes.claude_code.messages`: the sans-IO mapping (whole
  messages replayed as stream events, compaction, the result);
- :mod:`~gateway.runtimes.claude_code.options`: the SDK's options, the CLI's
  environment and state directory, the Claude Code session id;
- :mod:`~gateway.runtimes.claude_code.process`: the CLI process, its slot,
  idle stop and resume;
- :mod:`~gateway.runtimes.claude_code.rewind`: a rewound turn's resume point
  (``resume_session_at``; docs/protocol.md §2 "Edit and regenerate");
- :mod:`~gateway.runtimes.claude_code.endings`: how a turn's calls end, each
  before the turn (a broken or unfinished call fails);
- :mod:`~gateway.runtimes.claude_code.permissions`: ``can_use_tool`` as
  permission requests;
- :mod:`~gateway.runtimes.claude_code.subagents`: sub-agents as worker
  sessions;
- :mod:`~gateway.runtimes.claude_code.steering`: a steer of the running turn
  (``if_busy: "steer"``), written to the CLI's streaming input where it waits
  for the gateway (a tool's hooks, a permission);
- :mod:`~gateway.protocol.claude_code_tools`: Claude Code's tool names (the
  config checks an agent's ``tools`` against them, without the SDK);
- :mod:`~gateway.runtimes.claude_code.limits` and
  :mod:`~gateway.runtimes.claude_code.hooks`: the ``[limits]`` of a turn,
  counted in the ``PreToolUse`` hook;
- :mod:`gateway.runtimes.transport` (the CLI as a tool process) and
  :mod:`gateway.tools.process_slots` (``max_processes``), which need no extra.

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
- Compaction: ``context.compacting`` when Claude Code starts (its
  ``PreCompact`` hook; ``pre_tokens`` the gateway's estimate), then at
  ``compact_boundary`` and the summary after it a ``context`` message as the
  native loop's, ``context.compacted`` naming it (Claude Code's counts;
  ``first_kept_message_id`` null: the summary stands for every message);
  one Claude Code reports failed closes with no message.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gateway.runtimes.claude_code.runtime import ClaudeCode

__all__ = ["ClaudeCode"]


def __getattr__(name: str) -> Any:
    """``ClaudeCode``, imported on first use: :mod:`.tools` is read without the SDK."""
    if name == "ClaudeCode":
        from gateway.runtimes.claude_code.runtime import ClaudeCode

        return ClaudeCode
    raise AttributeError(name)

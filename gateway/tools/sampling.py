"""What an MCP server's sampling request asks of a session, and what it gets back.

docs/protocol.md §11 ("MCP tools", sampling): the MCP client
(gateway.mcp.sampling) turns a ``sampling/createMessage`` into a
:class:`SamplingRequest` and hands it to the calling session
(:meth:`gateway.tools.registry.ToolSession.sample`), which asks its user,
calls its agent's model and answers a :class:`Sampled`. Plain data, so that
neither side imports the other (nor the ``mcp`` SDK).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class SamplingRequest:
    """A server's request for a completion, as the session serves it.

    ``messages`` are ``(role, text)`` pairs (``user`` or ``assistant``), in
    order; ``max_tokens`` is the server's (the session caps it).
    """

    server: str
    messages: tuple[tuple[str, str], ...]
    max_tokens: int
    system_prompt: str | None = None
    temperature: float | None = None
    stop_sequences: tuple[str, ...] = field(default_factory=tuple)


@dataclass(frozen=True, slots=True)
class Sampled:
    """The model's answer: its text, the model that wrote it, why it stopped."""

    text: str
    model: str
    stop_reason: str  # MCP's: "endTurn", "maxTokens", "stopSequence"

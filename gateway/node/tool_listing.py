"""An agent's tools as ``GET /agents`` and a session's summary list them (docs/protocol.md §6).

A ``claude-code`` agent's: Claude Code's (``source: "claude-code"``,
:func:`gateway.protocol.claude_code_tools.listing`), then its MCP tools; any
other agent's: the built-in and MCP tools its session sees.
"""

from __future__ import annotations

from gateway.agents import AgentProfile
from gateway.protocol import claude_code_tools as claude_code_tools
from gateway.protocol.shapes import ToolInfo
from gateway.tools.registry import SessionTools


def tool_infos(profile: AgentProfile, tools: SessionTools) -> list[ToolInfo]:
    """The listing of ``profile``'s tools, ``tools`` the ones its session sees now."""
    if profile.runtime == "claude-code":
        own = claude_code_tools.listing(
            profile.tools, profile.default_tools, profile.permission_mode,
            profile.needs_approval,
        )  # fmt: skip
        return [ToolInfo(name, "", {}, asks, "claude-code") for name, asks in own] + [
            ToolInfo(spec.name, spec.description, spec.input_schema,
                     profile.needs_approval(spec.name), source)
            for spec in tools.specs()
            if (source := tools.source_of(spec.name) or "").startswith("mcp:")
        ]  # fmt: skip
    return [
        ToolInfo(spec.name, spec.description, spec.input_schema,
                 profile.needs_approval(spec.name), tools.source_of(spec.name) or "builtin")
        for spec in tools.specs()
    ]  # fmt: skip

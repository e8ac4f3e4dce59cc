"""An MCP server's ``roots/list``: the session's workspace (docs/protocol.md §11 "MCP tools").

The client declares the ``roots`` capability with ``listChanged: false``: a
session's workspace never changes, so the gateway never sends
``notifications/roots/list_changed``. A ``roots/list`` is answered with one
root, the workspace's directory as a ``file://`` URI:

- a ``scope = "session"`` server's connection is its session's alone: its
  root is that session's workspace (where it runs), whenever it asks;
- a ``scope = "node"`` server is shared by every session: it is answered the
  workspace of the session whose calls are in flight on it. When none is, or
  calls of several sessions are (MCP's stdio ties no request to the call it
  serves, as with elicitations: gateway.mcp.questions), the answer is an
  empty list, never another session's workspace.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mcp_types as types
from mcp.client.session import ClientRequestContext, ClientSession

from gateway.tools.registry import ToolContext


class GatewayClientSession(ClientSession):
    """The SDK's client session, declaring ``roots`` without ``listChanged`` (module docstring)."""

    def _build_capabilities(self, version: str) -> types.ClientCapabilities:
        capabilities = super()._build_capabilities(version)
        if capabilities.roots is not None:
            capabilities.roots = types.RootsCapability(list_changed=False)
        return capabilities


def root(directory: str) -> types.Root:
    return types.Root(uri=Path(os.path.abspath(directory)).as_uri(), name="workspace")  # type: ignore[arg-type]


class Roots:
    """One connection's ``list_roots_callback`` (module docstring).

    Args:
        own: the session-scope connection's workspace directory; "" for a node server.
        calls: the connection's calls in flight (the caller's context each).
        workspace_of: a session's workspace directory ("" when unknown).
    """

    def __init__(
        self, own: str, calls: dict[object, ToolContext], workspace_of: Callable[[str], str]
    ) -> None:
        self._own = own
        self._calls = calls
        self._workspace_of = workspace_of

    def directories(self) -> list[str]:
        """The directories a ``roots/list`` is answered now."""
        if self._own:
            return [self._own]
        sessions = {ctx.session_id for ctx in self._calls.values()}
        if len(sessions) != 1:
            return []
        directory = self._workspace_of(next(iter(sessions)))
        return [directory] if directory else []

    async def __call__(self, context: ClientRequestContext | Any) -> types.ListRootsResult:
        return types.ListRootsResult(roots=[root(d) for d in self.directories()])

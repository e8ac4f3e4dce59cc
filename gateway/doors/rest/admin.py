"""What an operator and a client ask of the gateway itself, not of a session.

The probes (``/healthz``, ``/readyz``), the Prometheus metrics, the API
document (``/openapi.json``) and the agents a session may run (PROTOCOL
sections 2 and 11).
"""

from __future__ import annotations

import msgspec

from gateway.agents import AgentProfile
from gateway.doors.context import DoorContext
from gateway.errors import ApiError, unavailable
from gateway.http.openapi import build_document
from gateway.http.server import Request, Response, json_response
from gateway.metrics import CONTENT_TYPE
from gateway.protocol.http import AgentList, AgentListing, Health, Ready
from gateway.protocol.shapes import ResourceTemplateInfo


class Admin:
    """The handlers of the gateway itself: probes, metrics, the API document, the agents.

    Args:
        ctx: the doors' context (gateway.doors.context).
    """

    def __init__(self, ctx: DoorContext) -> None:
        self.ctx = ctx
        self.documents: dict[bool, bytes] = {}  # the API document (with or without auth)

    async def healthz(self, req: Request) -> Response:
        """``GET /healthz``: the process answers (never asks for a key)."""
        return json_response(200, Health())

    async def readyz(self, req: Request) -> Response:
        """Readiness (docs/operating.md): 503 ``draining`` once shutdown began.

        And 503 ``store_unavailable`` whenever commits fail (docs/protocol.md
        §15: a full disk, Redis away, the store's file deleted or replaced),
        until one lands again: the gateway would answer a write with 503 then.
        """
        if self.ctx.node.shutting_down:
            raise ApiError(
                503, "draining", "the gateway is shutting down; send new work to another node"
            )
        failure = self.ctx.node.store.failure
        if failure is not None:
            raise unavailable(failure)
        return json_response(200, Ready())

    async def metrics(self, req: Request) -> Response:
        """``GET /metrics``: the Prometheus text exposition (gateway.metrics)."""
        return Response(200, self.ctx.node.metrics.render(), content_type=CONTENT_TYPE)

    async def openapi(self, req: Request) -> Response:
        """``GET /openapi.json``: the OpenAPI 3.1 document of the routes (docs/protocol.md §2).

        Built from the routes and the Structs on first use, then cached;
        the ``bearer`` scheme is in it while API keys are configured.
        """
        auth = self.ctx.keys.enabled  # keys can come and go with the keys file (SIGHUP)
        document = self.documents.get(auth)
        if document is None:
            document = self.documents[auth] = build_document(
                self.ctx.documented, auth=auth, server_url=self.ctx.config.server.public_url
            )
        return Response(200, document)

    async def list_agents(self, req: Request) -> Response:
        """``GET /agents`` (docs/protocol.md sections 2, 11): what a session may pick."""
        self.ctx.authenticate(req)
        agents = self.ctx.node.agents
        mcp = self.ctx.node.mcp

        def templates(profile: AgentProfile) -> list[ResourceTemplateInfo] | msgspec.UnsetType:
            """Its node-scope MCP servers' resource templates (docs/protocol.md §11)."""
            assert mcp is not None
            return mcp.resource_templates(None, profile.uses_server) or msgspec.UNSET

        listing = [
            AgentListing(
                profile.name,
                profile.runtime,
                profile.model,
                profile.name == agents.default,
                self.ctx.node.tool_infos(profile.name),
                templates(profile) if mcp is not None else msgspec.UNSET,
            )
            for profile in agents.profiles()
        ]
        return json_response(200, AgentList(listing))

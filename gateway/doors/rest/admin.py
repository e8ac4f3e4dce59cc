"""What an operator and a client ask of the gateway itself, not of a session.

The probes (``/healthz``, ``/readyz``), the Prometheus metrics, the API
document (``/openapi.json``) and the agents a session may run (PROTOCOL
sections 2 and 11).
"""

from __future__ import annotations

from gateway.errors import ApiError, unavailable
from gateway.http.openapi import build_document
from gateway.http.router import Api
from gateway.http.server import Request, Response, json_response
from gateway.metrics import CONTENT_TYPE
from gateway.protocol.http import AgentList, AgentListing, Health, Ready


async def healthz(api: Api, req: Request) -> Response:
    """``GET /healthz``: the process answers (never asks for a key)."""
    return json_response(200, Health())


async def readyz(api: Api, req: Request) -> Response:
    """Readiness (docs/operating.md): 503 ``draining`` once shutdown began.

    And 503 ``store_unavailable`` whenever commits fail (docs/protocol.md
    §15: a full disk, Redis away, the store's file deleted or replaced),
    until one lands again: the gateway would answer a write with 503 then.
    """
    if api.node.shutting_down:
        raise ApiError(
            503, "draining", "the gateway is shutting down; send new work to another node"
        )
    failure = api.node.store.failure
    if failure is not None:
        raise unavailable(failure)
    return json_response(200, Ready())


async def metrics(api: Api, req: Request) -> Response:
    """``GET /metrics``: the Prometheus text exposition (gateway.metrics)."""
    return Response(200, api.node.metrics.render(), content_type=CONTENT_TYPE)


async def openapi(api: Api, req: Request) -> Response:
    """``GET /openapi.json``: the OpenAPI 3.1 document of the route table (docs/protocol.md §2).

    Built from the route table and the Structs on first use, then cached;
    the ``bearer`` scheme is in it while API keys are configured.
    """
    auth = api.keys.enabled  # keys can come and go with the keys file (SIGHUP)
    document = api.documents.get(auth)
    if document is None:
        document = api.documents[auth] = build_document(
            api.documented, auth=auth, server_url=api.config.server.public_url
        )
    return Response(200, document)


async def list_agents(api: Api, req: Request) -> Response:
    """``GET /agents`` (docs/protocol.md sections 2, 11): what a session may pick."""
    api._authenticate(req)
    agents = api.node.agents
    listing = [
        AgentListing(
            profile.name,
            profile.runtime,
            profile.model,
            profile.name == agents.default,
            api.node.tool_infos(profile.name),
        )
        for profile in agents.profiles()
    ]
    return json_response(200, AgentList(listing))

"""The agent card at ``GET /.well-known/agent-card.json`` (docs/doors/a2a.md "The card").

One card for the gateway: one skill per agent of the config (the skill's id
is the agent's name: a message names it to start a context of that agent),
the JSON-RPC interface (A2A 1.0), the key scheme where keys are configured
(``Authorization: Bearer``), streaming on, push notifications where the operator
allows URLs (``[a2a] push_url_prefixes``).
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import Any

from gateway.http.server import Request

RPC_PATH = "/a2a"
"""Where the JSON-RPC requests go (the card's interface URL)."""

PROTOCOL_VERSION = "1.0"

INPUT_MODES = ["text/plain", "application/json", "image/*", "application/pdf"]
OUTPUT_MODES = ["text/plain"]


def _version() -> str:
    try:
        return version("gateway")
    except PackageNotFoundError:  # pragma: no cover - run from a checkout without install
        return "0"


def base_url(req: Request, public_url: str) -> str:
    """What the card's URLs begin with: ``[server] public_url``, else the request's own."""
    if public_url:
        return public_url.rstrip("/")
    return f"{req.scheme}://{req.headers.get('host', 'localhost')}"


def agent_card(
    base: str, agents: list[tuple[str, str, str]], default: str, keyed: bool, push: bool = False
) -> dict[str, Any]:
    """The card (module docstring). ``agents``: each agent's name, runtime and model."""
    skills = [
        {
            "id": name,
            "name": name,
            "description": f"The gateway's agent {name!r} ({runtime}, {model})"
            + (", the default" if name == default else ""),
            "tags": ["agent", runtime],
        }
        for name, runtime, model in agents
    ]
    card: dict[str, Any] = {
        "name": "gateway",
        "description": "A streaming gateway for LLM agent sessions: a context is a session, "
        "a task one turn of it. A message's metadata may name the agent (`agent` or `skill`).",
        "supportedInterfaces": [
            {"url": base + RPC_PATH, "protocolBinding": "JSONRPC", "protocolVersion": "1.0"}
        ],
        "version": _version(),
        "capabilities": {"streaming": True, "pushNotifications": push},
        "defaultInputModes": INPUT_MODES,
        "defaultOutputModes": OUTPUT_MODES,
        "skills": skills,
    }
    if keyed:
        card["securitySchemes"] = {
            "bearer": {
                "httpAuthSecurityScheme": {
                    "scheme": "Bearer",
                    "description": "The gateway's API key: Authorization: Bearer KEY",
                }
            }
        }
        card["securityRequirements"] = [{"schemes": {"bearer": {"list": []}}}]
    return card

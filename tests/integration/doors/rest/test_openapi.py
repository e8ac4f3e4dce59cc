"""``GET /openapi.json``: the OpenAPI 3.1 document of docs/protocol.md §2.

The document is checked here for what it says; tests/system/doors/rest/test_api_property.py checks
that the running gateway does what it says. Here: it is valid OpenAPI 3.1
(``openapi-spec-validator``); every route of the table and every route of the
contract is in it and routes back to the same handler; its schemas are msgspec's
own, of the Structs the handlers decode and answer with; every error code the
gateway's source can raise is listed under its status; the ``bearer`` scheme is
there exactly when keys are configured; it is built once; and the router holds
requests to the query parameters the document lists (an unknown one is 422).
"""

from __future__ import annotations

import ast
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio
from openapi_spec_validator import validate

import gateway
from gateway.doors.agui.shapes import CancelRun, RunCancelling
from gateway.doors.aisdk.routes import ChatStopped
from gateway.doors.rest import admin
from gateway.doors.rest import door as route_table
from gateway.http.server import ErrorBody
from tests.conftest import Harness, make_config, running_gateway

GATEWAY_SOURCE = Path(gateway.__file__).parent

# docs/protocol.md §2's table, plus the stream handshake and /readyz.
CONTRACT = {
    ("get", "/agents"),  # docs/protocol.md §11
    ("post", "/sessions"),
    ("get", "/sessions"),
    ("get", "/sessions/{session_id}"),
    ("delete", "/sessions/{session_id}"),  # docs/protocol.md §13
    ("get", "/sessions/{session_id}/messages"),
    ("post", "/sessions/{session_id}/files"),  # docs/protocol.md §2 "Files"
    ("get", "/sessions/{session_id}/files/{file_id}"),
    ("get", "/sessions/{session_id}/messages/{message_id}"),  # docs/protocol.md §15
    ("post", "/sessions/{session_id}/turns"),
    ("post", "/sessions/{session_id}/turns/{turn_id}/cancel"),
    ("post", "/sessions/{session_id}/permissions/{perm_id}"),
    ("post", "/sessions/{session_id}/compact"),  # docs/protocol.md §12
    ("post", "/sessions/{session_id}/feedback"),
    ("post", "/sessions/{session_id}/fork"),  # docs/protocol.md §2, "Forks"
    ("get", "/sessions/{session_id}/stream"),
    ("get", "/sessions/{session_id}/events"),  # docs/doors/sse.md: the stream as SSE
    ("get", "/healthz"),
    ("get", "/readyz"),
    ("get", "/metrics"),
    ("get", "/openapi.json"),
    ("post", "/agui"),  # AG-UI (docs/doors/agui.md): an SSE answer
    ("post", "/agui/{session_id}/cancel"),
    ("get", "/agui/{session_id}/runs/{run_id}/stream"),  # re-attach: an SSE answer
    ("post", "/ai-sdk/chat"),  # the AI SDK (docs/doors/aisdk.md): an SSE answer
    ("get", "/ai-sdk/chat/{chat_id}/stream"),  # its resume: an SSE answer, or 204
    ("post", "/ai-sdk/chat/{chat_id}/stop"),
    ("get", "/ai-sdk/ws"),  # WebSocketChatTransport's frames
    ("get", "/.well-known/agent-card.json"),  # A2A (docs/doors/a2a.md): the agent card
    ("post", "/a2a"),  # its JSON-RPC
}
# Each operation's body and answer Structs (docs/protocol.md §2).
STRUCTS = {
    ("get", "/agents"): (None, route_table.AgentList),
    ("post", "/sessions"): (route_table.CreateSession, route_table.SessionCreated),
    ("get", "/sessions"): (None, route_table.SessionList),
    ("get", "/sessions/{session_id}"): (None, route_table.SessionAttach),
    ("get", "/sessions/{session_id}/messages"): (None, route_table.MessagePage),
    ("get", "/sessions/{session_id}/messages/{message_id}"): (None, route_table.Message),
    ("post", "/sessions/{session_id}/turns"): (route_table.SubmitTurn, route_table.TurnAccepted),
    ("post", "/sessions/{session_id}/turns/{turn_id}/cancel"): (
        route_table.CancelTurn,
        route_table.CancelAccepted,
    ),
    ("post", "/sessions/{session_id}/permissions/{perm_id}"): (
        route_table.PermissionDecision,
        route_table.Accepted,
    ),
    ("post", "/sessions/{session_id}/compact"): (route_table.Compact, route_table.Accepted),
    ("post", "/sessions/{session_id}/feedback"): (route_table.Feedback, route_table.Accepted),
    ("post", "/sessions/{session_id}/fork"): (route_table.ForkSession, route_table.ForkCreated),
    ("get", "/healthz"): (None, route_table.Health),
    ("post", "/agui/{session_id}/cancel"): (CancelRun, RunCancelling),
    ("post", "/ai-sdk/chat/{chat_id}/stop"): (None, ChatStopped),
}
KEY = "openapi-key"


@asynccontextmanager
async def gateway_with(tmp_path: Path, **overrides: Any) -> AsyncIterator[Harness]:
    with trio.fail_after(30):
        async with running_gateway(make_config(tmp_path, **overrides)) as harness:
            yield harness


async def fetch(gw: Harness, key: str | None = None) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    r = await gw.http.get("/openapi.json", headers=headers)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/json"
    document: dict[str, Any] = r.json()
    return document


def operations(document: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {
        (method, path): op
        for path, item in document["paths"].items()
        for method, op in item.items()
    }


def codes_of(response: dict[str, Any]) -> list[str]:
    """The error codes an error response of the document lists."""
    narrowed = response["content"]["application/json"]["schema"]["allOf"][1]
    listed: list[str] = narrowed["properties"]["error"]["properties"]["code"]["enum"]
    return listed


@pytest.mark.slow  # over a second on two cores (measured with --durations)
@pytest.mark.parametrize("keys", [[], [KEY]], ids=["no-keys", "keys"])
async def test_the_document_is_valid_openapi_3_1(tmp_path: Path, keys: list[str]) -> None:
    async with gateway_with(tmp_path, **{"auth.api_keys": keys}) as gw:
        document = await fetch(gw, KEY if keys else None)
    assert document["openapi"] == "3.1.0"
    validate(document)  # raises on any violation of the OpenAPI 3.1 schema


async def test_every_route_is_in_it_and_routes_back_to_its_handler(gw: Harness) -> None:
    document = await fetch(gw)
    ops = operations(document)
    assert set(ops) == CONTRACT
    api = gw.gateway.router
    for (method, path), op in ops.items():
        # The documented path, ids filled in, reaches the handler named by operationId.
        concrete = re.sub(r"\{[a-z_]+\}", "id_1", path)
        matches = [
            methods[method.upper()]
            for pattern, methods, _ in api.routes
            if pattern.match(concrete) and method.upper() in methods
        ]
        assert [h.__name__ for h in matches] == [op["operationId"]], path
        # Every path id is a documented parameter, and nothing else is a path parameter.
        in_path = {p["name"] for p in op.get("parameters", []) if p["in"] == "path"}
        assert in_path == set(re.findall(r"\{([a-z_]+)\}", path))
    ids = [op["operationId"] for op in ops.values()]
    assert len(ids) == len(set(ids))


async def test_links_lead_from_an_answer_to_the_routes_of_the_ids_in_it(gw: Harness) -> None:
    """OpenAPI links (what a client or schemathesis's stateful phase follows) are sound."""
    document = await fetch(gw)
    ops = operations(document)
    by_id = {op["operationId"]: path for (_, path), op in ops.items()}
    followed: set[tuple[str, str]] = set()
    for (_, path), op in ops.items():
        for response in op["responses"].values():
            for name, link in response.get("links", {}).items():
                target_path = by_id[link["operationId"]]
                assert name == link["operationId"]
                in_path = set(re.findall(r"\{([a-z_]+)\}", target_path))
                params = link["parameters"]
                assert in_path <= set(params), (path, name)
                for param, expression in params.items():
                    source = expression.rpartition("/")[2].rpartition(".")[2]
                    schema = response["content"]["application/json"]["schema"]["$ref"]
                    fields = document["components"]["schemas"][schema.rpartition("/")[2]]
                    if expression.startswith("$response.body#/"):
                        assert source in fields["properties"], (path, name, expression)
                    else:
                        assert expression == f"$request.path.{param}" and param in path
                followed.add((op["operationId"], link["operationId"]))
    assert {
        ("create_session", "submit_turn"),
        ("create_session", "feedback"),
        ("get_session", "stream"),
        ("submit_turn", "cancel_turn"),
    } <= followed
    stream_link = ops["get", "/sessions/{session_id}"]["responses"]["200"]["links"]["stream"]
    assert stream_link["parameters"]["attach"] == "$response.body#/attach_token"


async def test_the_schemas_are_msgspecs_own_of_the_handlers_structs(gw: Harness) -> None:
    document = await fetch(gw)
    ops = operations(document)
    structs = [s for pair in STRUCTS.values() for s in pair if s is not None] + [ErrorBody]
    _, expected = msgspec.json.schema_components(
        structs, ref_template="#/components/schemas/{name}"
    )
    for name, schema in expected.items():
        assert document["components"]["schemas"][name] == schema, name
    for key, (body, answer) in STRUCTS.items():
        op = ops[key]
        if body is None:
            assert "requestBody" not in op, key
        else:
            content = op["requestBody"]["content"]["application/json"]
            assert content["schema"] == {"$ref": f"#/components/schemas/{body.__name__}"}
        success = next(v for k, v in op["responses"].items() if k.startswith("2"))
        schema = success["content"]["application/json"]["schema"]
        assert schema == {"$ref": f"#/components/schemas/{answer.__name__}"}, key
    # An empty body is accepted where the Struct has every default, and only there.
    assert ops["post", "/sessions"]["requestBody"]["required"] is False
    assert ops["post", "/sessions/{session_id}/turns"]["requestBody"]["required"] is True
    assert ops["post", "/sessions/{session_id}/fork"]["requestBody"]["required"] is False
    metrics = ops["get", "/metrics"]["responses"]["200"]["content"]
    assert list(metrics) == ["text/plain"]


def raised_errors() -> set[tuple[int, str]]:
    """Every literal (status, code) of an ``ApiError`` or ``error_response`` in the package,
    and every refusal by the status the server's table gives it (gateway.http.refusals)."""
    from gateway.http.refusals import STATUS

    found: set[tuple[int, str]] = {(status, code) for code, status in STATUS.items()}
    for path in GATEWAY_SOURCE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call) or len(node.args) < 2:
                continue
            name = getattr(node.func, "id", getattr(node.func, "attr", ""))
            status, code = node.args[0], node.args[1]
            if (
                name in ("ApiError", "error_response")
                and isinstance(status, ast.Constant)
                and isinstance(code, ast.Constant)
            ):
                found.add((status.value, code.value))
    return found


async def test_every_error_code_the_gateway_raises_is_listed_under_its_status(
    tmp_path: Path,
) -> None:
    async with gateway_with(tmp_path, **{"auth.api_keys": [KEY]}) as gw:
        document = await fetch(gw, KEY)
    listed: set[tuple[int, str]] = set()
    for op in operations(document).values():
        for status, response in op["responses"].items():
            if int(status) >= 400:
                listed |= {(int(status), code) for code in codes_of(response)}
    raised = raised_errors()
    assert len(raised) > 25  # the scan finds them
    # 405 is per path, not per operation (the document's description says so);
    # a 500 is the one answer that must never happen.
    unlisted = raised - listed - {(405, "method_not_allowed"), (500, "internal_error")}
    assert not unlisted, f"raised but not in the document: {sorted(unlisted)}"
    assert (
        "405" in document["info"]["description"]
        or "`method_not_allowed`" in (document["info"]["description"])
    )


async def test_bearer_is_in_it_exactly_when_keys_are_configured(tmp_path: Path) -> None:
    async with gateway_with(tmp_path, **{"store.path": str(tmp_path / "open.db")}) as gw:
        open_document = await fetch(gw)
    assert "security" not in open_document
    assert "securitySchemes" not in open_document["components"]
    for op in operations(open_document).values():
        assert "401" not in op["responses"] and "security" not in op

    async with gateway_with(tmp_path, **{"auth.api_keys": [KEY]}) as gw:
        r = await gw.http.get("/openapi.json")
        assert r.status_code == 401  # the document needs the key like the other routes
        document = await fetch(gw, KEY)
    assert document["components"]["securitySchemes"] == {
        "bearer": {
            "type": "http",
            "scheme": "bearer",
            "description": document["components"]["securitySchemes"]["bearer"]["description"],
        }
    }
    assert document["security"] == [{"bearer": []}]
    ops = operations(document)
    assert ops["get", "/healthz"]["security"] == []
    assert ops["get", "/readyz"]["security"] == []
    assert ops["get", "/sessions/{session_id}/stream"]["security"] == [{}, {"bearer": []}]
    for key, op in ops.items():
        if key not in {("get", "/healthz"), ("get", "/readyz")}:
            assert codes_of(op["responses"]["401"]) == ["unauthorized"], key
            assert "forbidden" in codes_of(op["responses"]["403"]), key


async def test_it_is_built_once(gw: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    build = admin.build_document
    built: list[bytes] = []

    def counting(*args: Any, **kw: Any) -> bytes:
        built.append(build(*args, **kw))
        return built[-1]

    monkeypatch.setattr(admin, "build_document", counting)
    first = await gw.http.get("/openapi.json")
    second = await gw.http.get("/openapi.json")
    assert first.content == second.content and len(built) == 1


async def test_the_public_url_is_its_server(tmp_path: Path) -> None:
    async with gateway_with(tmp_path, **{"server.public_url": "https://gw.example.com/"}) as gw:
        document = await fetch(gw)
    assert document["servers"] == [{"url": "https://gw.example.com"}]


async def test_a_query_parameter_the_document_does_not_list_is_422(gw: Harness) -> None:
    """The router holds requests to the document: ``?limt=5`` is not silently ignored."""
    sid = await gw.create_session()
    cases = [
        ("GET", "/sessions?limt=5", "'limt' (this route takes: limit, before)"),
        ("GET", f"/sessions/{sid}/messages?limit=5&since=x", "'since'"),
        ("GET", "/healthz?verbose=1", "'verbose' (this route takes: none)"),
        ("HEAD", "/sessions?x=1", None),
        ("POST", f"/sessions/{sid}/turns?wait=1", "'wait'"),
        ("GET", f"/sessions/{sid}/stream?attach=atk_x&token=y", "'token'"),
    ]
    for method, url, named in cases:
        r = await gw.http.request(method, url, json={"content": "hi"} if method == "POST" else None)
        assert r.status_code == 422, (url, r.text)
        if named is not None:
            assert r.json()["error"]["code"] == "invalid_query"
            assert named in r.json()["error"]["message"], r.text
    # The listed ones still work, and the turn above was not started.
    r = await gw.http.get("/sessions?limit=5")
    assert r.status_code == 200
    assert (await gw.http.get(f"/sessions/{sid}/messages")).json()["messages"] == []


async def test_the_messages_route_documents_include_rewound(gw: Harness) -> None:
    """docs/protocol.md §2 "Edit and regenerate": the query, the flag, the turn's refusals."""
    document = await fetch(gw)
    ops = operations(document)
    listing = ops["get", "/sessions/{session_id}/messages"]
    query = {p["name"]: p for p in listing["parameters"] if p["in"] == "query"}
    assert list(query) == ["limit", "before", "include_rewound"]
    assert query["include_rewound"]["schema"] == {
        "type": "string",
        "enum": ["true", "false"],
        "default": "false",
    }
    listed = document["components"]["schemas"]["ListedMessage"]
    assert listed["properties"]["rewound"] == {"type": "boolean", "default": False}
    page = document["components"]["schemas"]["MessagePage"]
    assert page["properties"]["messages"]["items"] == {"$ref": "#/components/schemas/ListedMessage"}
    turns = ops["post", "/sessions/{session_id}/turns"]["responses"]
    assert "message_not_found" in codes_of(turns["404"])
    assert {"message_rewound", "not_a_user_message"} <= set(codes_of(turns["409"]))
    assert "invalid_body" in codes_of(turns["422"])
    sid = await gw.create_session()
    r = await gw.http.get(f"/sessions/{sid}/messages?include_rewound=true")
    assert (r.status_code, r.json()) == (200, {"messages": [], "has_more": False})
    r = await gw.http.get(f"/sessions/{sid}/messages?include_rewound=1")
    assert (r.status_code, r.json()["error"]["code"]) == (400, "invalid_query")

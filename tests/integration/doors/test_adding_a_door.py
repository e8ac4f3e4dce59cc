"""Adding a door: one class ``Door`` and one entry of gateway.app.DOORS (docs/architecture.md).

The door of the walk-through in docs/architecture.md ("Adding a door"),
registered beside the others: routed behind the same boundary and key, its
session seen as the caller may see it, counted under its route's name in
``gateway_http_requests``, and documented in ``GET /openapi.json``.
"""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
import trio

from gateway import app
from gateway.doors.context import DoorContext
from gateway.http.openapi import Operation
from gateway.http.router import route
from gateway.http.server import Request, Response, json_response
from tests.conftest import make_config, running_gateway

KEY = "door-test-key"
OTHER = "another-key"


class MessageCount(msgspec.Struct):
    count: int


COUNT = Operation("How many messages a session holds", MessageCount)


class Door:
    def __init__(self, ctx: DoorContext) -> None:
        self.ctx = ctx
        self.routes = (route("/count/{session_id}", "count", GET=(self.count, COUNT)),)

    async def count(self, req: Request, session_id: str) -> Response:
        session = await self.ctx.session(session_id, self.ctx.authenticate(req))
        messages = await self.ctx.node.messages_of(session)
        return json_response(200, MessageCount(len(messages)))


async def test_a_door_is_one_class_and_one_entry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(app, "DOORS", (*app.DOORS, Door))
    config = make_config(tmp_path, **{"auth.api_keys": [KEY, OTHER]})
    with trio.fail_after(60):
        async with running_gateway(config) as gw:
            mine = {"authorization": f"Bearer {KEY}"}
            created = await gw.http.post("/sessions", json={}, headers=mine)
            sid = created.json()["session_id"]
            answer = await gw.http.get(f"/count/{sid}", headers=mine)
            assert (answer.status_code, answer.json()) == (200, {"count": 0})
            unauthorized = await gw.http.get(f"/count/{sid}")
            assert unauthorized.status_code == 401
            theirs = await gw.http.get(
                f"/count/{sid}", headers={"authorization": f"Bearer {OTHER}"}
            )
            assert theirs.status_code == 404
            assert theirs.json()["error"]["code"] == "session_not_found"
            document = (await gw.http.get("/openapi.json", headers=mine)).json()
            metrics = (await gw.http.get("/metrics", headers=mine)).text
    assert document["paths"]["/count/{session_id}"]["get"]["operationId"] == "count"
    assert list(document["paths"])[-1] == "/count/{session_id}"  # after the doors before it
    assert 'gateway_http_requests_total{route="count",status="200"} 1.0' in metrics

"""A property test of the whole HTTP API, drawn from its own document (docs/protocol.md §2).

schemathesis reads ``GET /openapi.json`` from a real ``gateway serve`` process and,
for every operation in it, draws requests from the document: valid ones
(positive mode), and invalid ones (negative mode: wrong types, missing or unknown
fields, values out of range, no credentials). Each answer must hold:

- no 5xx, whatever the input (``not_a_server_error``; docs/protocol.md §2);
- its status is one the document lists for the operation (``status_code_conformance``);
- its content type and body are what the document says for that status, the
  error codes included (``content_type_conformance``, ``response_schema_conformance``);
- an invalid request is refused with a 4xx (``negative_data_rejection``);
- an operation that needs the API key refuses a request without it (``ignored_auth``).

Ids drawn at random only ever meet 404s, so three times in four (where that part
of the request is not the invalid one) a path id, a ``before``, a feedback's
``message_id`` or an attach token is a real one: sessions that are idle, running a
turn, or waiting on a permission, their turns and messages, and a fresh attach
token. The deep routes are then exercised (the test checks they were): 202s,
409s, body validation behind an existing session, a 426 for a handshake without
its upgrade headers.

The run is short in the suite: ``GATEWAY_API_EXAMPLES`` examples (default 18) per
operation and mode, about 12 s, the same inputs on every run (derandomized, so a
failure in CI replays as is). A longer one by hand draws new inputs each time::

    GATEWAY_API_EXAMPLES=1000 .venv/bin/python -m pytest \
        tests/system/doors/rest/test_api_property.py

The daemon's log must hold no error and no traceback at the end, and it must still
shut down gracefully (exit 0).
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import requests
import schemathesis
import trio
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    ignored_auth,
    negative_data_rejection,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)
from schemathesis.core.parameters import ParameterLocation

from tests.conftest import Client, open_ws
from tests.torture_support import Daemon

# slow: property-based fuzzing of the whole API (schemathesis)
pytestmark = pytest.mark.slow

EXAMPLES = int(os.environ.get("GATEWAY_API_EXAMPLES", "18"))
# The suite's short run draws the same inputs every time (a failure in CI replays as is);
# a run with GATEWAY_API_EXAMPLES set draws new ones each time.
DERANDOMIZE = "GATEWAY_API_EXAMPLES" not in os.environ
KEY = "property-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    negative_data_rejection,
    ignored_auth,
]
BLANK_CHECKS = [check for check in CHECKS if check is not negative_data_rejection]
FRESH_TOKEN = "fresh"  # stands for an attach token issued just before the request
# A turn that stays in flight: its one tool waits for a permission (require_approval), then sleeps.
WAITING = {"script": {"rounds": [[{"tool_use": {"name": "sleep", "input": {"seconds": 3600}}}]]}}

CONFIG = f"""
[store]
path = "gateway.db"
[auth]
api_keys = ["{KEY}"]
[tools]
require_approval = ["sleep"]
"""


class Pools:
    """Real ids to draw from: each session's own turns, permissions and messages."""

    def __init__(self) -> None:
        self.sessions: list[dict[str, list[str]]] = []

    def add_session(self, session_id: str) -> dict[str, list[str]]:
        ids: dict[str, list[str]] = {
            "session_id": [session_id],
            "turn_id": [],
            "perm_id": [],
            "message_id": [],
        }
        self.sessions.append(ids)
        return ids

    def every(self, name: str) -> list[str]:
        return [value for ids in self.sessions for value in ids[name]]


async def real_ids(base: str) -> Pools:
    """Three sessions: one idle after a turn, two in a turn waiting on a permission.

    The third one's turn id is not in the pools: its turn is never cancelled, so
    its permission is still waiting when the permission route's turn comes.
    """
    pools = Pools()
    async with httpx.AsyncClient(base_url=base, headers=AUTH) as http:
        for n, script in enumerate(("hello there", WAITING, WAITING)):
            r = await http.post("/sessions", json={})
            assert r.status_code == 201, r.text
            sid = r.json()["session_id"]
            ids = pools.add_session(sid)
            url = (await http.get(f"/sessions/{sid}")).json()["ws_url"]
            async with open_ws(url) as ws:
                client = Client(ws, sid)
                await client.subscribe()
                content = script if isinstance(script, str) else json.dumps(script)
                r = await http.post(f"/sessions/{sid}/turns", json={"content": content})
                assert r.status_code == 202, r.text
                if n < 2:
                    ids["turn_id"].append(r.json()["turn_id"])
                if isinstance(script, str):
                    await client.until_turn_ends()
                else:
                    events = await client.until(lambda e: e.type == "permission.requested")
                    ids["perm_id"].append(events[-1].payload.perm_id)
            page = (await http.get(f"/sessions/{sid}/messages")).json()
            ids["message_id"] += [message["id"] for message in page["messages"]]
            assert ids["message_id"], page
    return pools


def run_schemathesis(base: str, pools: Pools) -> dict[str, dict[int, int]]:
    """Every operation of the served document, both modes; the statuses seen, by operation."""
    schema = schemathesis.openapi.from_url(f"{base}/openapi.json", headers=AUTH, timeout=10)
    seen: dict[str, dict[int, int]] = {}
    http = requests.Session()

    def fresh_token(session_id: str) -> str:
        r = http.get(f"{base}/sessions/{session_id}", headers=AUTH, timeout=10)
        return str(r.json()["attach_token"]) if r.status_code == 200 else "atk_gone"

    def often(draw: Callable[[Any], Any]) -> bool:
        """Three times in four: a random id only ever meets a 404."""
        return bool(draw(st.integers(0, 3)) != 3)  # 0, where Hypothesis starts, is "yes"

    def real(ids: dict[str, list[str]], name: str, draw: Callable[[Any], Any]) -> str:
        """Mostly the drawn session's own id of that kind, now and then another session's."""
        own = ids[name]
        value: str = draw(st.sampled_from(own if own and often(draw) else pools.every(name)))
        return value

    def with_real_ids(case: Any, draw: Callable[[Any], Any]) -> None:
        """Put real ids where the case is valid (never into the part made invalid)."""
        meta = case.meta
        # A session that has an id of each kind the case takes, where there is one.
        kinds = [*case.path_parameters, *(["message_id"] if isinstance(case.body, dict) else [])]
        fits = [ids for ids in pools.sessions if all(ids.get(k) for k in kinds if k in ids)]
        ids = draw(st.sampled_from(fits or pools.sessions))
        if not meta.is_negative_at(ParameterLocation.PATH) and often(draw):
            for name in case.path_parameters:
                if name in ids:  # an AG-UI run id has no pool: a drawn one meets a 404
                    case.path_parameters[name] = real(ids, name, draw)
        query = case.query
        if query and not meta.is_negative_at(ParameterLocation.QUERY) and often(draw):
            if "attach" in query:
                query["attach"] = FRESH_TOKEN
            if "before" in query:
                kind = "message_id" if case.path.endswith("/messages") else "session_id"
                query["before"] = real(ids, kind, draw)
        body = case.body
        if isinstance(body, dict) and body.get("if_busy") == "interrupt":
            # It would cancel the pools' waiting turns before the cancel route meets them
            # (tests/integration/session/test_busy.py exercises it).
            body["if_busy"] = "queue"
        if (
            isinstance(body, dict)
            and "message_id" in body
            and not meta.is_negative_at(ParameterLocation.BODY)
            and often(draw)
        ):
            body["message_id"] = real(ids, "message_id", draw)
        if query and query.get("attach") == FRESH_TOKEN:
            query["attach"] = fresh_token(case.path_parameters["session_id"])

    def exercise(operation: Any, mode: GenerationMode, statuses: dict[int, int]) -> None:
        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            database=None,
            derandomize=DERANDOMIZE,
            phases=[Phase.explicit, Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        @given(case=operation.as_strategy(generation_mode=mode), data=st.data())
        def check(case: Any, data: st.DataObject) -> None:
            with_real_ids(case, data.draw)
            response = case.call(base_url=base, session=http, headers=AUTH, timeout=10)
            statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
            # docs/protocol.md §2: a blank body is an empty one where the body is optional
            # (its defaults), not the invalid JSON a negative case means it to be.
            blank = isinstance(case.body, str | bytes) and not case.body.strip()
            optional = not operation.body or not any(b.is_required for b in operation.body)
            checks = BLANK_CHECKS if blank and optional else CHECKS
            case.validate_response(response, checks=checks)

        check()

    # DELETE last: it deletes the real sessions every other operation is drawn against.
    # GET .../events with a real token is a stream that never ends (docs/protocol.md
    # §14): its refusals and frames are tests/integration/doors/sse/test_sse_stream.py's.
    operations = sorted(
        (
            op
            for op in (result.ok() for result in schema.get_all_operations())
            if op.label != "GET /sessions/{session_id}/events"
        ),
        key=lambda op: op.method.upper() == "DELETE",
    )
    with http:  # its sockets closed here, not at some later test's garbage collection
        for operation in operations:
            statuses = seen.setdefault(operation.label, {})
            exercise(operation, GenerationMode.POSITIVE, statuses)
            parts = [operation.path_parameters, operation.query, operation.body]
            if any(parts) or any(True for _ in operation.security.iter_parameters()):
                exercise(operation, GenerationMode.NEGATIVE, statuses)  # else nothing is invalid
    return seen


async def test_every_answer_matches_the_document(tmp_path: Path) -> None:
    config = tmp_path / "gateway.toml"
    config.write_text(CONFIG)
    daemon = await Daemon.start(tmp_path, config, 0)
    try:
        with trio.fail_after(30):
            pools = await real_ids(daemon.base)
        seen = await trio.to_thread.run_sync(run_schemathesis, daemon.base, pools)
    finally:
        if daemon.proc.returncode is None:
            daemon.proc.send_signal(signal.SIGTERM)
        with trio.fail_after(30):
            code = await daemon.proc.wait()
        if daemon.proc.stdout is not None:
            await daemon.proc.stdout.aclose()
    report = "\n".join(f"{label}: {dict(sorted(s.items()))}" for label, s in seen.items())
    print(report)
    assert code == 0, daemon.log.read_text()
    assert not daemon.trouble(), "\n".join(daemon.trouble())
    # The deep routes were reached, not only their 404s.
    reached = {label: set(s) for label, s in seen.items()}
    session = "/sessions/{session_id}"
    assert 202 in reached[f"POST {session}/turns"], report
    assert 204 in reached[f"DELETE {session}"], report
    assert {202, 409} <= reached[f"POST {session}/turns/{{turn_id}}/cancel"], report
    assert {202, 409} & reached[f"POST {session}/permissions/{{perm_id}}"], report
    assert 202 in reached[f"POST {session}/feedback"], report
    assert {400, 422} & reached[f"POST {session}/feedback"], report  # behind a real session
    assert 200 in reached[f"GET {session}/messages"], report
    assert 426 in reached[f"GET {session}/stream"], report  # a real token, no upgrade

"""``GET /metrics`` after real traffic: every family, its type, sane values, the naming rules.

One real gateway (127.0.0.1, port 0) goes through what each family measures:
a tool turn (a known tool and a made-up one), a provider error, a replay, a
turn held at a permission (turns in flight, connections by state), a client
that stops reading (slow-client close, queue depth) and clients closing. Then
``/metrics`` is parsed with ``prometheus_client``'s own parser and:

- every family the gateway declares is there with its type (and no other
  ``gateway_*`` family: a new one needs this test and docs/operating.md "Metrics");
- the values say what happened (a turn duration observed per turn, the tool
  label is the tool's name, the close has its code, ...);
- the names follow Prometheus' conventions: counters' samples end in
  ``_total`` (or ``_created``), histograms carry their unit, label names are
  from a bounded set and no label value is a session, turn or client id.

docs/operating.md's "Metrics" section lists every family (checked here too).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample
from trio_websocket import ConnectionClosed

from gateway.logs import client_label
from gateway.metrics import FastHistogram, close_code_label
from tests.conftest import Harness, make_config, open_ws, running_gateway
from tests.paths import ROOT

OPERATING = ROOT / "docs" / "operating.md"

FAMILIES = {
    "gateway_events_emitted": "counter",
    "gateway_event_frames_sent": "counter",
    "gateway_ws_connections": "gauge",
    "gateway_ws_connections_by_state": "gauge",
    "gateway_streams_open": "gauge",
    "gateway_ws_closed": "counter",
    "gateway_slow_client_closes": "counter",
    "gateway_http_requests": "counter",
    "gateway_idempotent_replays": "counter",
    "gateway_sessions_live": "gauge",
    "gateway_sessions_unloaded": "counter",
    "gateway_turns": "counter",
    "gateway_turns_in_flight": "gauge",
    "gateway_turn_duration_seconds": "histogram",
    "gateway_time_to_first_token_seconds": "histogram",
    "gateway_tool_duration_seconds": "histogram",
    "gateway_provider_errors": "counter",
    "gateway_unknown_events": "counter",
    "gateway_replay_events": "counter",
    "gateway_replay_size_events": "histogram",
    "gateway_replay_duration_seconds": "histogram",
    "gateway_outbound_queue_depth_events": "histogram",
    "gateway_session_failures": "counter",
    "gateway_store_write_failures": "counter",
    "gateway_mcp_server_failures": "counter",
    "gateway_store_flush_duration_seconds": "histogram",
    "gateway_store_flush_rows": "histogram",
    "gateway_tasks": "gauge",
    "gateway_log_lines_dropped": "counter",
    "gateway_gc_pause_seconds": "histogram",
    "gateway_gc_frozen_objects": "gauge",
    "gateway_webhook_deliveries": "counter",
    "gateway_webhook_failures": "counter",
    "gateway_webhook_dropped": "counter",
    "gateway_webhook_outbox": "gauge",
}
UNITS = ("_seconds", "_events", "_rows", "_bytes")
LABELS = {"type", "reason", "code", "route", "status", "outcome", "state", "component"}
LABELS |= {"tool", "error_class", "le", "webhook", "door", "generation"}

WATCHED = [  # what the watcher subscribes to: no deltas, so it is never the slow one
    "turn.started",
    "turn.completed",
    "turn.cancelled",
    "tool.completed",
    "tool.failed",
    "llm.call_failed",
    "permission.requested",
    "bus.handler_warning",
]
TOOLS_TURN = {
    "script": {
        "rounds": [
            [
                {"thinking": "Let me check."},
                {"text": "Running both."},
                {"tool_use": {"name": "sleep", "input": {"seconds": 0.01}}},
                {"tool_use": {"name": "no_such_tool", "input": {}}},
            ],
            [{"text": "Done."}],
        ]
    }
}
FAILING_TURN = {
    "script": {
        "rounds": [[{"text": "one two three four"}]],
        "fail": {"round": 0, "after_deltas": 1, "error_class": "overloaded"},
    }
}
APPROVAL_TURN = {
    "script": {"rounds": [[{"tool_use": {"name": "read_file", "input": {"path": "x"}}}]]}
}
FLOOD = {"script": {"rounds": [[{"lorem": 3000}]]}}


def parse(text: str) -> dict[str, Any]:
    return {f.name: f for f in text_string_to_metric_families(text)}


def samples(family: Any, suffix: str = "", **labels: str) -> list[Sample]:
    return [
        s
        for s in family.samples
        if s.name == family.name + suffix and all(s.labels.get(k) == v for k, v in labels.items())
    ]


def value(family: Any, suffix: str = "", **labels: str) -> float:
    found = samples(family, suffix, **labels)
    assert found, (family.name + suffix, labels, family.samples)
    return sum(s.value for s in found)


async def until_no_connections(gw: Harness) -> None:
    while gw.node.connections:
        await gw.node.changed()


async def test_every_family_after_real_traffic(tmp_path: Path) -> None:
    config = make_config(
        tmp_path,
        **{
            "stream.queue_max_events": 20,
            "server.send_buffer_bytes": 4096,
            "tools.require_approval": ["read_file"],
        },
    )
    with trio.fail_after(60):
        async with running_gateway(config) as gw:
            sid = await gw.create_session()
            async with gw.client(sid) as watcher:
                await watcher.subscribe(filter={"event_types": WATCHED})

                # A tool turn: a known tool and a made-up one.
                await gw.submit(sid, TOOLS_TURN)
                tools = await watcher.until_turn_ends()
                assert tools[-1].payload.stop_reason == "end_turn"
                assert {e.payload.tool_name for e in tools if e.type.startswith("tool.")} == {
                    "sleep",
                    "no_such_tool",
                }

                # A provider error.
                await gw.submit(sid, FAILING_TURN)
                failed = await watcher.until_turn_ends()
                assert failed[-1].payload.stop_reason == "error"

                # A replay from the first turn's start.
                async with gw.client(sid) as late:
                    ack = await late.subscribe(since=watcher.events[0].id)
                    assert ack.replay_event_count > 0

                # A turn held at a permission; one client attached, not subscribed.
                url = await gw.ws_url(sid)
                async with open_ws(url):
                    await trio.testing.wait_all_tasks_blocked()  # the server side took it in
                    await gw.submit(sid, APPROVAL_TURN)
                    asked = await watcher.until(lambda e: e.type == "permission.requested")
                    held = parse((await gw.http.get("/metrics")).text)
                    perm_id = asked[-1].payload.perm_id
                    r = await gw.http.post(
                        f"/sessions/{sid}/permissions/{perm_id}", json={"decision": "deny"}
                    )
                    assert r.status_code == 202
                    await watcher.until_turn_ends()
                assert value(held["gateway_turns_in_flight"]) == 1
                by_state = held["gateway_ws_connections_by_state"]
                assert value(by_state, state="live") == 1  # the watcher
                assert value(by_state, state="subscribing") == 1
                assert value(by_state, state="closing") == 0

                # A client that stops reading: closed with 1008.
                async with open_ws(await gw.ws_url(sid), message_queue_size=1) as slow:
                    await slow.send_message(
                        json.dumps({"type": "subscribe", "filter": "preset:full"})
                    )
                    await gw.submit(sid, FLOOD)
                    # Both, in either order: with a slow disk the turn's events
                    # go out in one batch after its commit, and the warning of
                    # the client that batch overflowed comes after turn.completed.
                    seen: set[str] = set()
                    while not {"bus.handler_warning", "turn.completed"} <= seen:
                        seen |= {e.type for e in await watcher.until(lambda e: True)}
                    with pytest.raises(ConnectionClosed) as closed:
                        while True:
                            await slow.get_message()
                    assert closed.value.reason.code == 1008
            await until_no_connections(gw)
            scraped = (await gw.http.get("/metrics")).text
            ids = {sid, *(e.turn_id for e in watcher.events if e.turn_id)}

    families = parse(scraped)
    gateway_families = {
        n: f.type
        for n, f in families.items()
        # prometheus_client writes each counter's and histogram's creation time
        # as a gauge family of its own (``<name>_created``) in the text format.
        if n.startswith("gateway_") and not (n.endswith("_created") and n[:-8] in families)
    }
    assert gateway_families == FAMILIES

    f = families
    turns = f["gateway_turn_duration_seconds"]
    assert value(turns, "_count", outcome="end_turn") == 3  # tools, approval (denied), flood
    assert value(turns, "_count", outcome="error") == 1
    assert value(turns, "_sum") > 0
    assert value(f["gateway_turns"], "_total", outcome="end_turn") == 3
    assert value(f["gateway_turns"], "_total", outcome="error") == 1
    # Each call's first text or thinking delta: tools (2 calls), failing, flood.
    assert value(f["gateway_time_to_first_token_seconds"], "_count") >= 4
    tool = f["gateway_tool_duration_seconds"]
    assert value(tool, "_count", tool="sleep", outcome="completed") == 1
    assert value(tool, "_sum", tool="sleep", outcome="completed") >= 0.01
    assert value(tool, "_count", tool="unknown", outcome="failed") == 1  # never the model's name
    assert value(tool, "_count", tool="read_file", outcome="failed") == 1  # denied
    assert value(f["gateway_provider_errors"], "_total", error_class="overloaded") == 1
    replay = f["gateway_replay_size_events"]
    assert value(replay, "_count") == 1
    assert value(replay, "_sum") == value(f["gateway_replay_events"], "_total") > 0
    assert value(f["gateway_replay_duration_seconds"], "_count") == 1
    depth = f["gateway_outbound_queue_depth_events"]
    assert value(depth, "_count") >= 1
    assert value(depth, "_bucket", le="+Inf") == value(depth, "_count")
    assert value(f["gateway_slow_client_closes"], "_total") == 1
    closes = f["gateway_ws_closed"]
    assert value(closes, "_total", reason="client_too_slow", code="1008") == 1
    assert value(closes, "_total", reason="client_closed", code="1000") == 3  # watcher, late, idle
    assert value(closes, "_total") == 4
    assert value(f["gateway_ws_connections"]) == 0
    assert value(f["gateway_ws_connections_by_state"]) == 0
    assert value(f["gateway_turns_in_flight"]) == 0
    assert value(f["gateway_sessions_live"]) == 1
    flush = f["gateway_store_flush_duration_seconds"]
    assert value(flush, "_count") >= 1 and value(flush, "_sum") > 0
    rows = f["gateway_store_flush_rows"]
    assert value(rows, "_count") == value(flush, "_count")
    assert value(rows, "_sum") >= value(rows, "_count")
    assert value(f["gateway_events_emitted"], "_total", type="turn.completed") == 4
    assert value(f["gateway_event_frames_sent"], "_total") > 0
    assert value(f["gateway_http_requests"], "_total", route="turns", status="202") == 4
    assert samples(f["gateway_session_failures"], "_total") == []  # nothing failed
    assert value(f["gateway_store_write_failures"], "_total") == 0
    assert value(f["gateway_tasks"]) > 0

    for family in gateway_families:
        fam = families[family]
        if fam.type == "counter":
            assert all(s.name.endswith(("_total", "_created")) for s in fam.samples), family
        elif fam.type == "histogram":
            assert family.endswith(UNITS), f"{family}: a histogram names its unit"
        for s in fam.samples:
            assert set(s.labels) <= LABELS, (family, s.labels)
            for label in s.labels.values():
                assert label not in ids and not re.match(r"(sess|turn|ws|evt|msg)[_-]", label), (
                    family,
                    s.labels,
                )

    guide = OPERATING.read_text()
    section = guide[guide.index("\n## Metrics") :]
    section = section[: section.index("\n## ", 1)]
    for family in FAMILIES:
        assert f"`{family}" in section, f"docs/operating.md's Metrics does not list {family}"


def test_fast_histogram_matches_prometheus_buckets() -> None:
    """The hot path's histogram counts ``le`` buckets as prometheus_client does."""
    h = FastHistogram("x_events", "doc", (1, 2, 5))
    for v in (0, 1, 1.5, 2, 3, 5, 6, 100):
        h.observe(v)
    family = h.family()
    got = {s.labels["le"]: s.value for s in family.samples if s.name == "x_events_bucket"}
    assert got == {"1.0": 2, "2.0": 4, "5.0": 6, "+Inf": 8}
    assert [s.value for s in family.samples if s.name == "x_events_count"] == [8]
    assert [s.value for s in family.samples if s.name == "x_events_sum"] == [118.5]
    with pytest.raises(ValueError, match="strictly increasing"):
        FastHistogram("y", "doc", (2, 1))


def test_close_code_labels_are_bounded() -> None:
    """A client picks any close code (4000-4999 are free): the label set stays small."""
    assert close_code_label(1008) == "1008"
    assert close_code_label(4321) == "other"
    assert close_code_label(None) == "none"
    assert client_label("ws-1", "10.0.0.7:5100") == "ws-1 10.0.0.7:5100"
    assert client_label("ws-1") == "ws-1"


async def test_metrics_need_the_key_but_readiness_does_not(tmp_path: Path) -> None:
    config = make_config(tmp_path, **{"auth.api_keys": ["k-1"]})
    with trio.fail_after(30):
        async with running_gateway(config) as gw:
            assert (await gw.http.get("/metrics")).status_code == 401
            r = await gw.http.get("/metrics", headers={"Authorization": "Bearer k-1"})
            assert r.status_code == 200
            assert "gateway_turn_duration_seconds" in parse(r.text)

"""Traces on a live gateway (docs/operating.md "Traces"): spans, parents and GenAI attributes.

The SDK's in-memory exporter stands in for OTLP; the end-to-end export is
tests/system/operating/test_telemetry_otlp.py.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio

from gateway import telemetry
from gateway.config import TelemetryConfig
from gateway.errors import ConfigError
from tests.conftest import Harness, make_config, running_gateway
from tests.fresh_interpreter import modules_after_a_turn
from tests.integration.doors.agui.test_agui_http import run_input

pytest.importorskip("opentelemetry.sdk", reason="the otel extra: pip install 'gateway[otel]'")

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter,
)
from opentelemetry.trace import StatusCode


@pytest.fixture
async def gw(tmp_path: Path) -> AsyncIterator[Harness]:
    with trio.fail_after(60):
        async with running_gateway(make_config(tmp_path)) as harness:
            yield harness


def named(spans: tuple[ReadableSpan, ...], prefix: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name.startswith(prefix)]


def parent_of(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


async def run_turn(gw: Harness, sid: str, content: Any) -> None:
    async with gw.client(sid) as c:
        await c.subscribe()
        await gw.submit(sid, content)
        await c.until_turn_ends()


TOOL_ROUND = {
    "script": {
        "rounds": [
            [{"text": "Sleeping."}, {"tool_use": {"name": "sleep", "input": {"seconds": 0}}}],
            [{"text": "Done."}],
        ]
    }
}


async def test_a_tool_round_gives_the_turn_its_chat_and_tool_spans(
    exporter: InMemorySpanExporter, gw: Harness
) -> None:
    sid = await gw.create_session()
    await run_turn(gw, sid, TOOL_ROUND)
    spans = exporter.get_finished_spans()
    [turn] = named(spans, "invoke_agent ")
    chats = named(spans, "chat ")
    [tool] = named(spans, "execute_tool ")
    assert turn.name == "invoke_agent default" and turn.parent is None
    assert len(chats) == 2 and [c.name for c in chats] == ["chat echo"] * 2
    turn_id = turn.context.span_id
    assert {parent_of(c) for c in chats} == {turn_id} and parent_of(tool) == turn_id
    assert {s.context.trace_id for s in spans} == {turn.context.trace_id}
    a = turn.attributes or {}
    assert a["gen_ai.operation.name"] == "invoke_agent"
    assert a["gen_ai.agent.name"] == "default"
    assert a["gen_ai.conversation.id"] == sid
    assert a["gen_ai.provider.name"] == a["gen_ai.system"] == "scripted"
    assert a["gen_ai.response.finish_reasons"] == ("end_turn",)
    assert turn.status.status_code != StatusCode.ERROR
    first, second = sorted(chats, key=lambda s: s.start_time or 0)
    c = first.attributes or {}
    assert c["gen_ai.operation.name"] == "chat"
    assert c["gen_ai.request.model"] == "echo" and c["gen_ai.response.model"] == "echo"
    assert c["gen_ai.response.finish_reasons"] == ("tool_use",)
    assert (second.attributes or {})["gen_ai.response.finish_reasons"] == ("end_turn",)
    for key in ("gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens"):
        assert isinstance(c[key], int) and a[key] >= c[key]
    t = tool.attributes or {}
    assert tool.name == "execute_tool sleep"
    assert t["gen_ai.operation.name"] == "execute_tool" and t["gen_ai.tool.name"] == "sleep"
    assert str(t["gen_ai.tool.call.id"]).startswith("toolu_") or t["gen_ai.tool.call.id"]
    # the tool ran between the two calls, all inside the turn
    assert first.end_time <= tool.start_time and tool.end_time <= second.start_time  # type: ignore[operator]
    assert turn.start_time <= first.start_time and second.end_time <= turn.end_time  # type: ignore[operator]
    assert not telemetry.current().turns and not telemetry.current().tools  # type: ignore[union-attr]


async def test_a_cancelled_turn_s_span_has_error_status(
    exporter: InMemorySpanExporter, gw: Harness
) -> None:
    sid = await gw.create_session()
    script = {"script": {"rounds": [[{"tool_use": {"name": "sleep", "input": {"seconds": 30}}}]]}}
    async with gw.client(sid) as c:
        await c.subscribe()
        turn_id = await gw.submit(sid, script)
        await c.until(lambda e: e.type == "tool.called")
        await trio.sleep(0.05)
        r = await gw.http.post(f"/sessions/{sid}/turns/{turn_id}/cancel", json={"reason": "stop"})
        assert r.status_code == 202, r.text
        await c.until_turn_ends()
    spans = exporter.get_finished_spans()
    [turn] = named(spans, "invoke_agent ")
    [tool] = named(spans, "execute_tool ")
    assert turn.status.status_code == StatusCode.ERROR and turn.status.description == "stop"
    assert (turn.attributes or {})["error.type"] == "cancelled"
    assert tool.status.status_code == StatusCode.ERROR
    assert (tool.attributes or {})["error.type"] == "cancelled"


async def test_a_cancel_during_the_stream_ends_the_chat_span_in_error(
    exporter: InMemorySpanExporter, gw: Harness
) -> None:
    sid = await gw.create_session()
    script = {"script": {"delay_ms": 50, "rounds": [[{"lorem": 200}]]}}
    async with gw.client(sid) as c:
        await c.subscribe()
        turn_id = await gw.submit(sid, script)
        await c.until(lambda e: e.type == "text.delta")
        await gw.http.post(f"/sessions/{sid}/turns/{turn_id}/cancel", json={"reason": "user"})
        await c.until_turn_ends()
    spans = exporter.get_finished_spans()
    [chat] = named(spans, "chat ")
    [turn] = named(spans, "invoke_agent ")
    assert parent_of(chat) == turn.context.span_id
    assert chat.status.status_code == StatusCode.ERROR
    assert (chat.attributes or {})["error.type"] == "cancelled"


async def test_a_worker_s_turn_is_under_its_parent_s_tool_span(
    exporter: InMemorySpanExporter, gw: Harness
) -> None:
    sid = await gw.create_session()
    script = {
        "script": {
            "rounds": [
                [{"tool_use": {"name": "delegate", "input": {"task": "hello worker"}}}],
                [{"text": "The worker answered."}],
            ]
        }
    }
    await run_turn(gw, sid, script)
    spans = exporter.get_finished_spans()
    turns = named(spans, "invoke_agent ")
    [tool] = named(spans, "execute_tool ")
    assert tool.name == "execute_tool delegate"
    [parent] = [t for t in turns if (t.attributes or {})["gen_ai.conversation.id"] == sid]
    [worker] = [t for t in turns if t is not parent]
    assert parent.parent is None and parent_of(tool) == parent.context.span_id
    assert parent_of(worker) == tool.context.span_id
    [worker_chat] = [c for c in named(spans, "chat ") if parent_of(c) == worker.context.span_id]
    assert worker_chat.context.trace_id == parent.context.trace_id
    assert (worker.attributes or {})["gen_ai.conversation.id"] != sid


TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{CLIENT_SPAN}-01"


async def post_turn(gw: Harness, sid: str, content: Any, headers: dict[str, str]) -> None:
    """A turn posted with ``headers``, run to its end."""
    async with gw.client(sid) as c:
        await c.subscribe()
        r = await gw.http.post(
            f"/sessions/{sid}/turns", json={"content": json.dumps(content)}, headers=headers
        )
        assert r.status_code == 202, r.text
        await c.until_turn_ends()


async def test_a_traceparent_header_is_the_parent_of_the_turn_and_its_worker(
    exporter: InMemorySpanExporter, gw: Harness
) -> None:
    """W3C trace context on ``POST .../turns``: the whole turn, its worker's too, joins it."""
    sid = await gw.create_session()
    script = {
        "script": {
            "rounds": [
                [{"tool_use": {"name": "delegate", "input": {"task": "hello worker"}}}],
                [{"text": "The worker answered."}],
            ]
        }
    }
    headers = {"traceparent": TRACEPARENT, "tracestate": "vendor=opaque"}
    await post_turn(gw, sid, script, headers)
    spans = exporter.get_finished_spans()
    assert {f"{s.context.trace_id:032x}" for s in spans} == {TRACE_ID}
    turns = named(spans, "invoke_agent ")
    [parent] = [t for t in turns if (t.attributes or {})["gen_ai.conversation.id"] == sid]
    [worker] = [t for t in turns if t is not parent]
    [tool] = named(spans, "execute_tool ")
    assert parent.parent is not None and parent.parent.is_remote
    assert f"{parent.parent.span_id:016x}" == CLIENT_SPAN
    assert parent.parent.trace_state.get("vendor") == "opaque"
    assert parent_of(tool) == parent.context.span_id
    assert parent_of(worker) == tool.context.span_id  # its parent's tool span, not the client's
    assert len(named(spans, "chat ")) == 3
    # the next turn, without the header, is a trace of its own
    exporter.clear()
    await post_turn(gw, sid, {"script": {"rounds": [[{"text": "again"}]]}}, {})
    [turn] = named(exporter.get_finished_spans(), "invoke_agent ")
    assert turn.parent is None and f"{turn.context.trace_id:032x}" != TRACE_ID


async def test_an_agui_run_joins_the_trace_of_its_post(
    exporter: InMemorySpanExporter, gw: Harness
) -> None:
    body = run_input("thread-traced", {"script": {"rounds": [[{"text": "Hello."}]]}})
    headers = {"traceparent": TRACEPARENT}
    r = await gw.http.post("/agui", json=body, headers=headers)  # the SSE, to the run's end
    assert r.status_code == 200 and '"RUN_FINISHED"' in r.text, r.text
    [turn] = named(exporter.get_finished_spans(), "invoke_agent ")
    assert turn.parent is not None and f"{turn.parent.span_id:016x}" == CLIENT_SPAN
    assert f"{turn.context.trace_id:032x}" == TRACE_ID


@pytest.mark.parametrize(
    "traceparent",
    [
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",  # an invalid trace id
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",  # no flags
        "garbage",
    ],
)
async def test_a_malformed_traceparent_is_ignored(
    exporter: InMemorySpanExporter, gw: Harness, traceparent: str
) -> None:
    sid = await gw.create_session()
    await post_turn(gw, sid, "hello", {"traceparent": traceparent})
    [turn] = named(exporter.get_finished_spans(), "invoke_agent ")
    assert turn.parent is None


async def test_a_cancel_or_a_decision_carries_no_context_and_makes_no_span(
    exporter: InMemorySpanExporter, gw: Harness
) -> None:
    """Only a turn opens spans: a cancel with its own traceparent leaves the turn's trace alone."""
    sid = await gw.create_session()
    script = {"script": {"rounds": [[{"tool_use": {"name": "sleep", "input": {"seconds": 30}}}]]}}
    async with gw.client(sid) as c:
        await c.subscribe()
        r = await gw.http.post(
            f"/sessions/{sid}/turns",
            json={"content": json.dumps(script)},
            headers={"traceparent": TRACEPARENT},
        )
        assert r.status_code == 202, r.text
        await c.until(lambda e: e.type == "tool.called")
        other = "00-11111111111111111111111111111111-2222222222222222-01"
        url = f"/sessions/{sid}/turns/{r.json()['turn_id']}/cancel"
        r = await gw.http.post(url, json={}, headers={"traceparent": other})
        assert r.status_code == 202, r.text
        await c.until_turn_ends()
    spans = exporter.get_finished_spans()
    assert {f"{s.context.trace_id:032x}" for s in spans} == {TRACE_ID}


async def test_disabled_no_tracing_and_no_spans(gw: Harness) -> None:
    assert telemetry.current() is None
    sid = await gw.create_session()
    await run_turn(gw, sid, TOOL_ROUND)
    assert telemetry.current() is None
    with telemetry.incoming({"traceparent": TRACEPARENT}):
        assert telemetry.carried() == {}  # nothing travels with the turn
    await post_turn(gw, sid, "hello", {"traceparent": TRACEPARENT})
    assert telemetry.current() is None


def test_the_request_s_context_is_carried_only_while_its_handler_runs(
    exporter: InMemorySpanExporter,
) -> None:
    assert telemetry.carried() == {}
    with telemetry.incoming({"traceparent": TRACEPARENT, "tracestate": "a=1", "other": "x"}):
        assert telemetry.carried() == {"traceparent": TRACEPARENT, "tracestate": "a=1"}
        with telemetry.incoming({"content-type": "application/json"}):
            assert telemetry.carried() == {"traceparent": TRACEPARENT, "tracestate": "a=1"}
    assert telemetry.carried() == {}
    with telemetry.incoming({"traceparent": "garbage"}):
        assert telemetry.carried() == {}


def test_nothing_exported_unless_configured() -> None:
    off = TelemetryConfig()
    assert telemetry.settings(off, {}) is None
    assert telemetry.settings(off, {"OTEL_SERVICE_NAME": "x"}) is None
    assert (
        telemetry.settings(TelemetryConfig(traces="none"), {"OTEL_TRACES_EXPORTER": "otlp"}) is None
    )
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318/"}
    assert telemetry.settings(off, {**env, "OTEL_TRACES_EXPORTER": "none"}) is None
    assert telemetry.settings(off, {**env, "OTEL_SDK_DISABLED": "true"}) is None
    chosen = telemetry.settings(off, env)
    assert chosen is not None and chosen.endpoint == "http://collector:4318/v1/traces"
    assert chosen.service_name == "gateway"
    # [telemetry] keys win over OTEL_*
    keyed = TelemetryConfig(traces="otlp", endpoint="http://a:1/v1/traces", service_name="gw")
    chosen = telemetry.settings(keyed, {**env, "OTEL_SERVICE_NAME": "other"})
    assert chosen is not None and (chosen.endpoint, chosen.service_name) == (
        "http://a:1/v1/traces",
        "gw",
    )
    chosen = telemetry.settings(TelemetryConfig(traces="otlp"), {})
    assert chosen is not None and chosen.endpoint == "http://localhost:4318/v1/traces"


@pytest.mark.slow
def test_disabled_imports_nothing_of_opentelemetry(tmp_path: Path) -> None:
    """A daemon with traces off never imports OpenTelemetry's SDK or exporter (a fresh interpreter).

    The API alone may be there: the mcp SDK imports it for its own use.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    ours = ("opentelemetry.sdk", "opentelemetry.exporter")
    assert modules_after_a_turn(tmp_path, ours, env) == []


def test_traces_without_the_extra_are_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    real = telemetry.importlib.util.find_spec

    def missing(name: str, *args: Any) -> Any:
        return None if name.startswith("opentelemetry") else real(name, *args)

    monkeypatch.setattr(telemetry.importlib.util, "find_spec", missing)
    with pytest.raises(ConfigError, match=r"gateway\[otel\]"):
        telemetry.settings(TelemetryConfig(traces="otlp"), {})
    assert telemetry.settings(TelemetryConfig(), {}) is None  # off: the extra is not needed

"""A sampling call in the daemon's traces and metrics (docs/operating.md "Traces", "Metrics").

An MCP server's sampling request is an LLM call of the turn (docs/protocol.md
§11): its ``chat`` span is a child of the ``execute_tool`` span of the tool
whose server asked, with ``gateway.llm.purpose = "sampling"``, and a failed one
counts in ``gateway_provider_errors_total`` as a turn's own call does.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio

from tests.conftest import running_gateway

pytest.importorskip("opentelemetry.sdk", reason="the otel extra: pip install 'gateway[otel]'")

# After the skip: the mcp SDK imports OpenTelemetry's API, which an install without the
# extra has (the SDK's own dependency) but tests/unit/test_extras.py hides with the rest.
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from tests.integration.mcp.test_mcp_sampling import DONE, answers_of, call, config_of, run, script


@pytest.mark.slow  # a server process
async def test_a_sampling_call_is_a_chat_span_under_its_tool_and_its_failure_is_counted(
    tmp_path: Path, exporter: InMemorySpanExporter
) -> None:
    config = config_of(tmp_path, **{"agents.yes": {"mcp_sampling": "allow"}})
    with trio.fail_after(60):
        async with running_gateway(config) as gw:
            sid = await gw.create_session(agent="yes")
            # Two samplings at once from one tool: two spans, each ended, none lost.
            events = await run(gw, sid, script([call("sample", text="hi", n=2)], DONE))
            assert [a["content"]["text"] for a in answers_of(events)] == ["You said: hi"] * 2

            spans = exporter.get_finished_spans()
            [tool] = [s for s in spans if s.name.startswith("execute_tool mcp__hb__sample")]
            chats = [s for s in spans if s.name.startswith("chat ")]
            sampled = [s for s in chats if s.attributes.get("gateway.llm.purpose") == "sampling"]
            assert len(chats) == 4 and len(sampled) == 2  # the turn's two calls, two samplings
            for span in sampled:
                assert span.parent is not None and span.parent.span_id == tool.context.span_id
                assert span.attributes["gen_ai.usage.output_tokens"] > 0
                assert span.attributes["gen_ai.response.finish_reasons"] == ("end_turn",)
                assert span.status.status_code is not StatusCode.ERROR
            turn_calls = [s for s in chats if s not in sampled]
            [turn] = [s for s in spans if s.name.startswith("invoke_agent")]
            assert all(s.parent is not None and s.parent.span_id == turn.context.span_id
                       for s in turn_calls)  # fmt: skip

            # A sampling the model refuses: an error span, and the provider error counted.
            before = await errors_counted(gw, "invalid_request")
            exporter.clear()
            bad = json.dumps({"script": {"rounds": "not rounds"}})
            events = await run(gw, sid, script([call("sample", text=bad)], DONE))
            [error] = answers_of(events)
            assert "invalid_request" in error["message"]
            [failed] = [s for s in exporter.get_finished_spans() if s.name.startswith("chat ")
                        and s.attributes.get("gateway.llm.purpose") == "sampling"]  # fmt: skip
            assert failed.status.status_code is StatusCode.ERROR
            assert failed.attributes["error.type"] == "invalid_request"
            assert await errors_counted(gw, "invalid_request") == before + 1


async def errors_counted(gw: object, error_class: str) -> float:
    """``gateway_provider_errors_total{error_class=...}`` as ``/metrics`` says it."""
    r = await gw.http.get("/metrics")  # type: ignore[attr-defined]
    assert r.status_code == 200, r.text
    label = f'gateway_provider_errors_total{{error_class="{error_class}"}} '
    for line in r.text.splitlines():
        if line.startswith(label):
            return float(line.split()[-1])
    return 0.0
